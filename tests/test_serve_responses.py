"""OpenAI's Responses API on `memra serve --device cpu`, through the official `openai` client.

Oracles: the CPU reference's greedy reply (the chat template rendered here), and the server's
chat completions for the same conversation (themselves checked against the reference in
tests/test_serve.py): a Responses request is the chat request it stands for, so its tokens are
that request's."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from chat_ref import ChatRef
from memra.serve.api import ServeConfig, Server

MODEL = "smollm2-135m"
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


@pytest.fixture(scope="module")
def server():
    s = Server(ServeConfig(model=MODEL, device="cpu", port=0, ctx_size=512, parallel=4, max_queue=64))
    s.start_in_thread()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def greedy_text(messages, n):
    return ChatRef(MODEL).reply(messages, n)


def test_a_text_response_is_the_reference_reply(client):
    want, n_in = greedy_text([{"role": "user", "content": "Name a colour."}], 8)
    r = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text == want and [o.type for o in r.output] == ["message"]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == n_in and r.usage.output_tokens == 8 and r.usage.total_tokens == n_in + 8


def test_instructions_and_items_are_the_chat_request(client):
    """instructions + message items (text parts, an assistant turn) give the chat completion's reply to the
    same conversation; a reply that ends by itself is `completed`."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
             {"role": "user", "content": "Now say bye."}]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Now say bye."}]
    r = client.responses.create(model=MODEL, instructions="Be brief.", input=items, max_output_tokens=120,
                                temperature=0)
    c = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=120, temperature=0)
    assert r.output_text == c.choices[0].message.content and c.choices[0].finish_reason == "stop"
    assert r.status == "completed" and r.incomplete_details is None
    assert r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens


def test_streamed_events_build_the_blocking_response(client):
    """The stream's events are numbered in order, their text deltas make the blocking reply, and the client's
    stream helper assembles the same final response."""
    kw = dict(model=MODEL, input="Say hi.", max_output_tokens=120, temperature=0)
    blocking = client.responses.create(**kw)
    assert blocking.status == "completed"
    evs = list(client.responses.create(**kw, stream=True))
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert evs[0].type == "response.created" and evs[-1].type == "response.completed"
    assert "".join(e.delta for e in evs if e.type == "response.output_text.delta") == blocking.output_text
    with client.responses.stream(**kw) as st:
        for _ in st:
            pass
        final = st.get_final_response()
    assert final.output_text == blocking.output_text and final.usage.output_tokens == blocking.usage.output_tokens


def test_function_calls_are_the_chat_tool_calls(client):
    """tool_choice required: function_call items with the chat completion's calls, blocking and streamed; a
    second turn with the call and its output as items is the chat request with tool_calls and a tool message."""
    q = "What is the weather in Paris?"
    kw = dict(model=MODEL, input=q, tools=TOOLS, tool_choice="required", max_output_tokens=120, temperature=0)
    r = client.responses.create(**kw)
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], tools=CHAT_TOOLS,
                                       tool_choice="required", max_tokens=120, temperature=0)
    calls = c.choices[0].message.tool_calls
    assert calls and [o.type for o in r.output] == ["function_call"] * len(calls)
    assert [(o.name, o.arguments) for o in r.output] == [(t.function.name, t.function.arguments) for t in calls]
    with client.responses.stream(**kw) as st:
        kinds = [e.type for e in st]
        final = st.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [(o.name, o.arguments) for o in final.output] == [(o.name, o.arguments) for o in r.output]
    # the call's result comes back as an item
    call = r.output[0]
    items = [{"role": "user", "content": q}, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}]
    r2 = client.responses.create(model=MODEL, input=items, tools=TOOLS, tool_choice="none", max_output_tokens=40,
                                 temperature=0)
    msgs = [{"role": "user", "content": q},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C."}]
    c2 = client.chat.completions.create(model=MODEL, messages=msgs, tools=CHAT_TOOLS, tool_choice="none",
                                        max_tokens=40, temperature=0)
    assert r2.output_text == c2.choices[0].message.content


def test_output_text_logprobs_are_the_chat_logprobs(client):
    """include message.output_text.logprobs with top_logprobs: the output text's token log-probs and alternatives
    are the chat completion's for the same conversation, blocking and streamed (the deltas' entries in order)."""
    kw = dict(model=MODEL, max_output_tokens=6, temperature=0, include=["message.output_text.logprobs"],
              top_logprobs=2)
    r = client.responses.create(input="Name a colour.", **kw)
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    want = [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs]) for x in c.choices[0].logprobs.content]
    got = r.output[0].content[0].logprobs
    assert len(want) == 6 and [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs]) for x in got] == want
    evs = list(client.responses.create(input="Name a colour.", stream=True, **kw))
    streamed = [x for e in evs if e.type == "response.output_text.delta" for x in e.logprobs]
    assert [(x.token, x.logprob) for x in streamed] == [(w[0], w[1]) for w in want]
    done = next(e for e in evs if e.type == "response.output_text.done")
    assert [(x.token, x.logprob) for x in done.logprobs] == [(w[0], w[1]) for w in want]


def test_a_json_schema_format(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Name a colour as JSON.", max_output_tokens=60, temperature=0,
                                text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.parametrize("body, param", [
    ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"role": "wizard", "content": "Hi"}]}, "input"),
    ({"input": [{"role": "user"}]}, "input"),
    ({"input": [{"role": "user", "content": []}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"input": "Hi", "text": {"format": {"type": "grammar"}}}, "text"),
    ({"input": "Hi", "text": {"format": "json_object"}}, "text"),  # a format that is no object
    ({"input": "Hi", "text": {"format": ["json_object"]}}, "text"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "Hi", "top_logprobs": 21}, "top_logprobs"),
    # memra's extras passed through to the chat request, of the wrong type: named as sent, not as input
    ({"input": "Hi", "top_k": "many"}, "top_k"),
    ({"input": "Hi", "stop": 5}, "stop"),
    ({"input": "Hi", "stop_token_ids": "2"}, "stop_token_ids"),
    ({"input": "Hi", "stop_token_ids": ["two"]}, "stop_token_ids"),
    ({"input": "Hi", "logit_bias": [1, 2]}, "logit_bias"),
    ({"input": "Hi", "seed": "x"}, "seed"),
])
def test_what_this_server_does_not_take_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/responses", json=body, trust_env=False, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_a_lone_surrogate_the_response_echoes_is_no_500(server):
    """JSON's \\ud800 is a lone surrogate, a str UTF-8 cannot encode. In instructions, metadata or a tool's
    description, fields the response object echoes, it comes back as the same escape, blocking and streamed, and
    the reply is the chat completion's for the same messages."""
    url, hdr = server.url, {"Content-Type": "application/json"}
    body = (b'{"model": "%s", "input": "Say hi.", "instructions": "Be brief \\ud800", "max_output_tokens": 3, '
            b'"temperature": 0, "metadata": {"k": "v\\ud800"}, "tools": [{"type": "function", "name": "f", '
            b'"description": "\\ud800"}], "tool_choice": "none"' % MODEL.encode())
    r = httpx.post(url + "/v1/responses", content=body + b"}", headers=hdr, trust_env=False, timeout=120)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["instructions"] == "Be brief \ud800" and doc["metadata"] == {"k": "v\ud800"}
    assert doc["tools"][0]["description"] == "\ud800"
    chat = httpx.post(url + "/v1/chat/completions", headers=hdr, trust_env=False, timeout=120, content=(
        b'{"model": "%s", "messages": [{"role": "system", "content": "Be brief \\ud800"}, {"role": "user", '
        b'"content": "Say hi."}], "max_tokens": 3, "temperature": 0}' % MODEL.encode()))
    assert doc["output"][0]["content"][0]["text"] == chat.json()["choices"][0]["message"]["content"]
    r = httpx.post(url + "/v1/responses", content=body + b', "stream": true}', headers=hdr, trust_env=False,
                   timeout=120)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response." + doc["status"]
    assert events[-1]["response"]["metadata"] == {"k": "v\ud800"}
    assert events[-1]["response"]["output"] == [dict(doc["output"][0], id=events[-1]["response"]["output"][0]["id"])]
