"""The reasoning split (memra.text.reasoning): a reply's <think>...</think> block goes to
`message.reasoning_content`, the rest to `content`; `reasoning_format: "none"` keeps it all in
the content. Through `memra serve --device cpu` with the official `openai` client.

Oracles: an independent regular-expression split of the raw reply (the same request, same
seed, with reasoning_format none: the server's tokens do not depend on the format), and the
openai client's parsing of blocking and streamed responses. A grammar (regex) makes the tiny
random model write a think block. The splitter's streaming is checked against its
whole-text split and the regex oracle under every cut of the text into pieces."""

from __future__ import annotations

import random
import re

import openai
import pytest

from memra.serve.api import ServeConfig, Server
from memra.text.reasoning import ReasoningStream, prompt_opens_think, split_reasoning

ALIAS = "tiny"
MSGS = [{"role": "user", "content": "What is two plus two?"}]
THINK_RE = r"<think>[a-z ]{3,12}</think>\n?The answer is [0-9]\."


def oracle(text: str, opened: bool = False) -> tuple[str | None, str]:
    """The rule, written independently: (reasoning or None, content)."""
    if not opened:
        m = re.match(r"\s*<think>(.*)\Z", text, re.S)
        if m is None:
            return None, text
        text = m.group(1)
    m = re.match(r"(.*?)</think>\s*(.*)\Z", text, re.S)
    return (m.group(1), m.group(2)) if m else (text, "")


# -- the splitter --------------------------------------------------------------------------------

CASES = [
    ("<think>I add.</think>\n\nFour.", False, ("I add.", "Four.")),
    ("  \n<think>a</think>b", False, ("a", "b")),
    ("<think></think>x", False, ("", "x")),
    ("<think>never closed", False, ("never closed", "")),
    ("<think>cut in the tag </thi", False, ("cut in the tag </thi", "")),
    ("Four. <think>late</think>", False, (None, "Four. <think>late</think>")),
    ("  plain", False, (None, "  plain")),
    ("<thin", False, (None, "<thin")),
    ("", False, (None, "")),
    ("<think>a</think>b</think>c <think>d", False, ("a", "b</think>c <think>d")),
    ("thought</think>  answer", True, ("thought", "answer")),
    ("still thinking", True, ("still thinking", "")),
    ("<think>x</think>y", True, ("<think>x", "y")),
    ("</think>", True, ("", "")),
]


@pytest.mark.parametrize("text,opened,want", CASES)
def test_split(text, opened, want):
    assert split_reasoning(text, opened) == want
    assert oracle(text, opened) == want


def _streamed(pieces, opened):
    rs = ReasoningStream(opened)
    r = c = ""
    for p in pieces:
        a, b = rs.push(p)
        r, c = r + a, c + b
    a, b = rs.flush()
    return (r + a if rs.found else None), c + b


@pytest.mark.parametrize("text,opened,want", CASES)
def test_stream_every_cut(text, opened, want):
    """Tags split across pieces: one character at a time, every two-piece cut, random cuts."""
    assert _streamed(list(text), opened) == want
    for i in range(len(text) + 1):
        assert _streamed([text[:i], text[i:]], opened) == want, i
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert "".join(pieces) == text
        assert _streamed(pieces, opened) == want, pieces


def test_stream_releases_early_and_holds_only_tags():
    rs = ReasoningStream()
    assert rs.push(" <th") == ("", "")         # may still become <think>
    assert rs.push("ink>I a") == ("I a", "")   # inside: reasoning flows
    assert rs.push("dd </th") == ("dd ", "")   # a possible </think> is held
    assert rs.push("ink>\n") == ("", "")       # whitespace after the block is dropped
    assert rs.push("Fo") == ("", "Fo")
    assert rs.push("ur <think>") == ("", "ur <think>")  # after the block, tags are content
    assert rs.flush() == ("", "")
    rs = ReasoningStream()
    assert rs.push("Hi") == ("", "Hi")         # no block: content at once


def test_prompt_opens_think():
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_think("<|im_start|>assistant\n")
    assert not prompt_opens_think(None)


# -- the server -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny_models):
    s = Server(ServeConfig(model=str(tiny_models("llama")), alias=ALIAS, device="cpu", port=0, ctx_size=512,
                           parallel=2))
    s.start_in_thread()
    yield s
    s.stop()


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _ask(s, regex, fmt=None, stream=False, **kw):
    extra = {"regex": regex}
    if fmt is not None:
        extra["reasoning_format"] = fmt
    kw = {"max_tokens": 40, "seed": 1, **kw}
    return client(s).chat.completions.create(model=ALIAS, messages=MSGS, extra_body=extra, stream=stream, **kw)


def _gather(stream):
    reasoning = content = ""
    finish = usage = None
    n_reasoning = 0
    for ch in stream:
        usage = ch.usage or usage
        for c in ch.choices:
            r = getattr(c.delta, "reasoning_content", None)
            if r:
                n_reasoning += 1
            reasoning += r or ""
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish, usage, n_reasoning


@pytest.fixture(scope="module")
def think_raw(server):
    """The reply to THINK_RE with reasoning_format none: tags in the content."""
    raw = _ask(server, THINK_RE, "none")
    m = raw.choices[0].message
    assert m.content.startswith("<think>") and "</think>" in m.content
    assert getattr(m, "reasoning_content", None) is None
    assert raw.choices[0].finish_reason == "stop"
    return raw


def test_blocking_split(server, think_raw):
    want = oracle(think_raw.choices[0].message.content)
    assert want[0] and want[1].startswith("The answer is")
    for fmt in (None, "deepseek"):
        r = _ask(server, THINK_RE, fmt)
        got = r.choices[0].message
        assert (got.reasoning_content, got.content) == want, fmt
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == think_raw.usage.completion_tokens


def test_streamed_split(server, think_raw):
    want = oracle(think_raw.choices[0].message.content)
    reasoning, content, finish, usage, n = _gather(_ask(server, THINK_RE, stream=True,
                                                        stream_options={"include_usage": True}))
    assert (reasoning, content) == want and finish == "stop"
    assert usage.completion_tokens == think_raw.usage.completion_tokens
    assert n > 1  # reasoning streamed as it came, not at the end


def test_unterminated_block_at_the_limit_is_reasoning(server):
    regex = r"<think>[a-z ]{30,60}</think>ok"
    raw = _ask(server, regex, "none", max_tokens=6)
    assert raw.choices[0].finish_reason == "length" and "</think>" not in raw.choices[0].message.content
    r = _ask(server, regex, max_tokens=6)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.reasoning_content == raw.choices[0].message.content[len("<think>"):]
    assert r.choices[0].message.content == ""


def test_no_block_is_unchanged(server):
    regex = r"The answer is [0-9]\."
    raw = _ask(server, regex, "none").choices[0].message
    r = _ask(server, regex, "auto").choices[0].message
    assert r.content == raw.content and r.content.startswith("The answer is")
    assert getattr(r, "reasoning_content", None) is None


def test_stop_strings_apply_to_the_whole_text(server, think_raw):
    """A stop string inside the thought ends the reply there: an unterminated block."""
    raw = think_raw.choices[0].message.content
    inner = oracle(raw)[0]
    stop = inner[1:3]
    r = _ask(server, THINK_RE, stop=[stop]).choices[0]
    assert r.finish_reason == "stop"
    assert r.message.reasoning_content == inner[:inner.find(stop)] and r.message.content == ""


THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_template_that_opens_the_block(server, monkeypatch):
    """A generation prompt ending with <think>: the reply is reasoning up to </think>."""
    monkeypatch.setitem(server.state.gguf.metadata, "tokenizer.chat_template", THINK_TEMPLATE)
    regex = r"[a-z ]{3,12}</think>\n?The answer is [0-9]\."
    raw = _ask(server, regex, "none").choices[0].message.content
    want = oracle(raw, opened=True)
    assert "</think>" in raw and want[1].startswith("The answer is")
    got = _ask(server, regex).choices[0].message
    assert (got.reasoning_content, got.content) == want
    assert _gather(_ask(server, regex, stream=True))[:2] == want
    # a JSON constraint is the whole reply: the block the prompt opened does not swallow it
    kw = {"response_format": {"type": "json_object"}, "max_tokens": 12, "seed": 2}
    raw = client(server).chat.completions.create(model=ALIAS, messages=MSGS, extra_body={"reasoning_format": "none"},
                                                 **kw).choices[0].message
    got = client(server).chat.completions.create(model=ALIAS, messages=MSGS, **kw).choices[0].message
    assert got.content == raw.content and got.content.startswith("{")
    assert getattr(got, "reasoning_content", None) is None


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
THINK_CALL = r'<think>[a-z ]{3,12}</think>\n<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9], "b": 2\}\}\n</tool_call>'


@pytest.mark.slow  # the fallback tools prompt takes seconds to prefill on the CPU
@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_after_the_block(server, stream):
    """Tool calls are parsed from the content after the think block (with reasoning_format
    none they are parsed from the whole reply, the block staying in the content)."""
    raw = _ask(server, THINK_CALL, "none", tools=TOOLS, max_tokens=60).choices[0].message
    thought, rest = oracle(raw.content)
    assert rest == "" and raw.tool_calls[0].function.name == "add"
    r = _ask(server, THINK_CALL, tools=TOOLS, max_tokens=60, stream=stream)
    if stream:
        args, finish, reasoning, content = "", None, "", ""
        for ch in r:
            for c in ch.choices:
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
                args += "".join(d.function.arguments or "" for d in c.delta.tool_calls or [])
                finish = c.finish_reason or finish
        assert (reasoning, content, finish) == (thought, "", "tool_calls")
        assert args == raw.tool_calls[0].function.arguments
        return
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.reasoning_content == thought
    assert ch.message.content is None
    assert ch.message.tool_calls[0].function.arguments == raw.tool_calls[0].function.arguments


def test_completions_are_unaffected(server):
    r = client(server).completions.create(model=ALIAS, prompt="Hi", max_tokens=20, seed=1,
                                          extra_body={"regex": THINK_RE})
    assert r.choices[0].text.startswith("<think>")


@pytest.mark.parametrize("fmt", ["deepseek-r1", "", "NONE"])
def test_bad_reasoning_format_is_400(server, fmt):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, THINK_RE, fmt, max_tokens=4)
    assert e.value.body["param"] == "reasoning_format" and "reasoning_format" in e.value.body["message"]
