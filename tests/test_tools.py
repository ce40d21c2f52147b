"""OpenAI tool calling (memra.text.tools) through `memra serve --device cpu` with the official
`openai` client: tools rendered into the prompt (the template's own, or the documented
fallback), calls parsed out of the reply (Hermes, Llama-3 JSON, generic JSON), forced calls
(tool_choice "required" / a named function) under a grammar, streaming tool_call deltas and
`role: "tool"` follow-ups.

Oracles: jsonschema validates every forced call's arguments against the declared
parameters; the openai client's own parsing (blocking and its streaming accumulation) reads
the responses; rendered prompts are checked for the texts the fallback documents. The model
is a tiny synthetic llama with SmolLM2's vocabulary and template (which has no tools)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from memra.serve.api import ServeConfig, Server
from memra.text.chat import render_chat
from memra.text.tools import (ToolError, check_tools, may_start_call, parse_tool_calls, style_of, tool_messages)

ALIAS = "tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
NAMES = set(PARAMS)
MSGS = [{"role": "user", "content": "What is the weather in Oslo?"}]


# -- parsing ------------------------------------------------------------------------------------

def test_parse_hermes_blocks_with_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n'
            '</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    calls, content = parse_tool_calls(text, NAMES)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert content == "Let me check."
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize("text,want", [
    ('<|python_tag|>{"name": "add", "parameters": {"a": 3, "b": 4}}', [("add", {"a": 3, "b": 4})]),
    ('{"name": "add", "parameters": {"a": 3, "b": 4}}; {"name": "get_weather", "parameters": {"city": "Rome", '
     '"unit": "f"}}', [("add", {"a": 3, "b": 4}), ("get_weather", {"city": "Rome", "unit": "f"})]),
    ('{"name": "add", "arguments": {"a": 1, "b": 1}}', [("add", {"a": 1, "b": 1})]),
    ('{"tool_calls": [{"name": "add", "arguments": {"a": 5, "b": 6}}]}', [("add", {"a": 5, "b": 6})]),
    ('[{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 2}"}]', [("add", {"a": 2, "b": 2})]),
])
def test_parse_llama3_and_generic_json(text, want):
    calls, content = parse_tool_calls(text, NAMES)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == want


@pytest.mark.parametrize("text", ['{"name": "rm_rf", "arguments": {}}', 'Just text.', '{"answer": 42}',
                                  '<tool_call>not json</tool_call>'])
def test_no_call_is_plain_content(text):
    assert parse_tool_calls(text, NAMES) == ([], text)


def test_streaming_holds_what_may_be_a_call():
    assert may_start_call("Sure, <tool") == len("Sure, ")
    assert may_start_call("Sure, <tool_call>{") == len("Sure, ")
    assert may_start_call('  {"name"') == 2
    assert may_start_call("Plain words") == len("Plain words")


@pytest.mark.parametrize("tools,choice,needle", [
    ([{"type": "function"}], None, "tools[0]"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, "name"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "nope"),
    ([], "required", "no tools"),
    (TOOLS, "sometimes", "tool_choice"),
])
def test_bad_tools_are_named(tools, choice, needle):
    with pytest.raises(ToolError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        check_tools(tools, choice)


# -- rendering ----------------------------------------------------------------------------------

HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n"
    "</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

FOLLOW_UP = MSGS + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C and snow"}]


def test_template_with_tools_gets_them():
    md = {"tokenizer.chat_template": HERMES_TEMPLATE, "general.architecture": "qwen2"}
    msgs, tools = tool_messages(md, FOLLOW_UP, TOOLS)
    assert tools == TOOLS
    text = render_chat(md, msgs, tools=tools)
    assert '"name": "get_weather"' in text and '"description": "Add two numbers"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}' in text
    assert "<tool_response>\n-3 C and snow\n</tool_response>" in text
    assert style_of(md) == "hermes"


def test_fallback_for_a_template_without_tools():
    md = {"tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                                     "assistant\n{% endif %}", "general.architecture": "llama"}
    msgs, tools = tool_messages(md, [{"role": "system", "content": "Be brief."}] + FOLLOW_UP, TOOLS)
    assert tools is None
    text = render_chat(md, msgs)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou may call one or more functions")
    assert json.dumps(TOOLS[1], ensure_ascii=False) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}' \
           '\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n-3 C and snow\n</tool_response><|im_end|>" in text


# -- the server -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny_models):
    s = Server(ServeConfig(model=str(tiny_models("llama")), alias=ALIAS, device="cpu", port=0, ctx_size=1024,
                           parallel=4))
    s.start_in_thread()
    yield s
    s.stop()


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _check_calls(calls, only=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert only is None or c.function.name == only
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_are_valid_tool_calls(server, choice):
    for seed in range(2):
        r = client(server).chat.completions.create(model=ALIAS, messages=MSGS, tools=TOOLS, tool_choice=choice,
                                                   parallel_tool_calls=False, max_tokens=120, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        _check_calls(ch.message.tool_calls, None if choice == "required" else "add")
        assert len(ch.message.tool_calls) == 1


def stream_calls(stream):
    """A streamed chat completion's tool-call deltas put together: ({index: {id, name,
    arguments}}, finish_reason, content)."""
    calls, finish, content = {}, None, ""
    for ch in stream:
        for c in ch.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = d.id or slot["id"]
                if d.function is not None:
                    slot["name"] += d.function.name or ""
                    slot["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    return calls, finish, content


def test_streamed_tool_call_deltas(server):
    # one tool: a shorter prompt (the CPU engine computes it a position at a time), shared
    # with the auto tests below through the prefix cache
    stream = client(server).chat.completions.create(
        model=ALIAS, messages=MSGS, tools=TOOLS[1:], tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False, max_tokens=120, seed=3, stream=True)
    calls, finish, content = stream_calls(stream)
    assert finish == "tool_calls" and content == ""
    assert list(calls) == [0] and calls[0]["name"] == "add" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), ADD)


GBNF_CALL = ('root ::= "Checking.\\n<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\": {\\"a\\": " [1-9] '
             '", \\"b\\": 2}}\\n</tool_call>"')


@pytest.mark.parametrize("stream", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_auto_parses_a_call_the_model_writes(server, stream):
    """tool_choice auto: the reply is parsed for calls; a grammar makes this model write one."""
    kw = dict(model=ALIAS, messages=MSGS, tools=TOOLS[1:], max_tokens=60, seed=4, extra_body={"grammar": GBNF_CALL})
    c = client(server)
    if not stream:
        ch = c.chat.completions.create(**kw).choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content == "Checking."
        _check_calls(ch.message.tool_calls, "add")
        return
    content, args, finish = "", "", None
    for chunk in c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                args += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and content.strip() == "Checking."
    assert json.loads(args)["b"] == 2


GBNF_TWO = ('root ::= "<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\": {\\"a\\": 1, \\"b\\": " [1-9] '
            '"}}\\n</tool_call>\\n<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\": {\\"a\\": 2, \\"b\\": 3}}'
            '\\n</tool_call>"')


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(server, stream):
    """tool_choice auto with parallel_tool_calls false: a reply that writes two calls (a grammar
    makes this model write them) answers with its first one only; by default with both."""
    c = client(server)
    for parallel in (None, False):
        kw = dict(model=ALIAS, messages=MSGS, tools=TOOLS[1:], max_tokens=120, seed=4,
                  extra_body={"grammar": GBNF_TWO})
        if parallel is not None:
            kw["parallel_tool_calls"] = parallel
        if stream:
            calls, finish, content = stream_calls(c.chat.completions.create(stream=True, **kw))
            got = [json.loads(calls[i]["arguments"]) for i in sorted(calls)]
        else:
            ch = c.chat.completions.create(**kw).choices[0]
            finish, content = ch.finish_reason, ch.message.content or ""
            got = [json.loads(t.function.arguments) for t in ch.message.tool_calls]
        assert finish == "tool_calls" and content.strip() == ""
        assert [g["a"] for g in got] == ([1, 2] if parallel is None else [1])
        assert got[-1]["b"] == 3 or parallel is False


def test_parse_keeps_one_call_when_not_parallel():
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}</tool_call>')
    assert [c["function"]["name"] for c in parse_tool_calls(text, NAMES)[0]] == ["add", "get_weather"]
    calls, content = parse_tool_calls(text, NAMES, parallel=False)
    assert [c["function"]["name"] for c in calls] == ["add"] and content is None


@pytest.mark.slow
def test_tool_follow_up_and_none(server):
    c = client(server)
    r = c.chat.completions.create(model=ALIAS, messages=MSGS, tools=TOOLS, parallel_tool_calls=False,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                  max_tokens=120, seed=5)
    m = r.choices[0].message
    follow = MSGS + [m.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "42"}]
    r2 = c.chat.completions.create(model=ALIAS, messages=follow, tools=TOOLS, max_tokens=8, seed=5,
                                   extra_body={"regex": "The answer is [0-9]+\\."})
    assert r2.choices[0].message.content.startswith("The answer is")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
    r3 = c.chat.completions.create(model=ALIAS, messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert r3.choices[0].message.tool_calls is None and r3.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kw,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tool_requests_are_400(server, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model=ALIAS, messages=MSGS, tools=TOOLS, max_tokens=4, **kw)
    assert e.value.body["param"] == param, e.value.body
