"""Structured output and tools through `memra serve --device gpu` on a real GPU (issue 13's
acceptance on the H200): the openai client against a real uvicorn, the masks applied on the
device (kernels/mask.cu in the decode graph, the fill overlapped), forced tokens fast-forwarded
(the default). The CPU twins are tests/test_structured.py and tests/test_tools.py, whose
schemas and tools these reuse.

- every json_schema output (nesting, enums, arrays, required fields, patterns), blocking and
  streamed, parses and validates against its schema (jsonschema is the oracle);
- tool calls (tool_choice required / a named function) come back as valid `tool_calls`,
  blocking and streamed as deltas, and a `role: "tool"` follow-up continues the conversation."""

from __future__ import annotations

import json
import os

import jsonschema
import openai
import pytest

from memra.gpu import cuda
from test_structured import SCHEMAS
from test_tools import ADD, MSGS, TOOLS, _check_calls, stream_calls

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]

MODEL = os.environ.get("MEMRA_SERVE_TEST_MODEL", "smollm2-135m")


@pytest.fixture(scope="module")
def server():
    from memra.serve.api import ServeConfig, Server

    s = Server(ServeConfig(model=MODEL, device="gpu", port=0, ctx_size=1024, parallel=16, max_queue=64))
    s.start_in_thread()
    yield s
    s.stop()


def _client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=600)


ASK = [{"role": "user", "content": "Describe an order as JSON."}]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_parse_and_validate(server, name):
    schema = SCHEMAS[name]
    for seed in range(3):
        r = _client(server).chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=300, seed=seed, temperature=0.8,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        ch = r.choices[0]
        assert ch.finish_reason == "stop", (name, seed, ch)
        jsonschema.validate(json.loads(ch.message.content), schema)


def test_streamed_json_schema_output_parses(server):
    schema = SCHEMAS["nested"]
    text, finish = "", None
    for chunk in _client(server).chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=300, seed=7, stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "nested", "schema": schema}}):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_are_valid_tool_calls(server, choice):
    for seed in range(2):
        r = _client(server).chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice=choice,
                                                    parallel_tool_calls=False, max_tokens=120, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        _check_calls(ch.message.tool_calls, None if choice == "required" else "add")


def test_streamed_tool_call_deltas(server):
    stream = _client(server).chat.completions.create(
        model=MODEL, messages=MSGS, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False, max_tokens=120, seed=3, stream=True)
    calls, finish, content = stream_calls(stream)
    assert finish == "tool_calls" and content == ""
    assert list(calls) == [0] and calls[0]["name"] == "add" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), ADD)


def test_tool_follow_up(server):
    c = _client(server)
    r = c.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, parallel_tool_calls=False,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                  max_tokens=120, seed=5)
    m = r.choices[0].message
    _check_calls(m.tool_calls, "get_weather")
    follow = MSGS + [m.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "12 degrees, rain"}]
    r2 = c.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=16, seed=5,
                                   extra_body={"regex": "It is [0-9]+ degrees\\."})
    assert r2.choices[0].message.content.startswith("It is ")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
