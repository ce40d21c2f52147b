"""Chat templates: the real SmolLM2 template, built-in turn formats, HF environment, sandbox.

Expected strings are written out by hand from each format's documentation."""

import datetime
import json

import pytest

from memra.model import aliases
from memra.text.chat import chat_tokens, render_chat, render_template
from memra.errors import TemplateError
from memra.model.gguf import open_gguf

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def smol():
    with open_gguf(aliases.resolve("smollm2-135m")) as g:
        yield g


@pytest.fixture(scope="module")
def gemma():
    with open_gguf(aliases.resolve("gemma3-270m")) as g:
        yield g


def test_smollm2_template_default_system_and_generation_prompt(smol):
    got = render_chat(smol, [{"role": "user", "content": "Hi"}])
    assert got == SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_smollm2_template_multi_turn_with_own_system(smol):
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks"}]
    got = render_chat(smol, msgs, add_generation_prompt=False)
    assert got == ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n")


def test_gemma3_270m_has_no_template_and_uses_gemma_turns(gemma):
    assert "tokenizer.chat_template" not in gemma.metadata
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": " 2+2? "},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks"}]
    assert render_chat(gemma, msgs) == (
        "<start_of_turn>user\nBe terse.\n\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n4<end_of_turn>\n"
        "<start_of_turn>user\nThanks<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert render_chat(gemma, msgs[1:2], add_generation_prompt=False) == \
        "<start_of_turn>user\n2+2?<end_of_turn>\n"


def test_gemma_special_token_strings_reach_a_template(gemma):
    got = render_chat(gemma, [], template="{{ bos_token }}|{{ eos_token }}|{{ pad_token }}")
    assert got == "<bos>|<eos>|<pad>"
    assert render_chat(gemma, [], template="{{ bos_token }}", bos_token="B") == "B"


def test_builtin_llama3_and_chatml_formats():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    llama3 = {"general.architecture": "llama",
              "tokenizer.ggml.tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]}
    assert render_chat(llama3, msgs) == (
        "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    qwen = {"general.architecture": "qwen3", "tokenizer.ggml.tokens": ["a", "b"]}
    assert render_chat(qwen, msgs) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_no_template_and_no_known_format_is_an_error():
    with pytest.raises(TemplateError, match="no chat template"):
        render_chat({"general.architecture": "llama", "tokenizer.ggml.tokens": ["a"]},
                    [{"role": "user", "content": "x"}])


def test_builtin_format_refuses_tools(gemma):
    with pytest.raises(TemplateError, match="tools"):
        render_chat(gemma, [{"role": "user", "content": "x"}], tools=[{"type": "function"}])


def test_content_parts_are_joined_as_text(gemma):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat(gemma, msgs) == "<start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model\n"


def test_raise_exception_becomes_template_error():
    t = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    assert render_template(t, [{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(TemplateError, match="first must be user"):
        render_template(t, [{"role": "assistant", "content": ""}])


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__['json'].dumps }}",
    "{{ ''.__class__.__base__ }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_sandbox_blocks_internals_and_mutation(template):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(TemplateError, match="sandbox"):
        render_template(template, msgs)
    assert msgs == [{"role": "user", "content": "x"}]


def test_hf_environment_whitespace_and_trailing_newline():
    # trim_blocks drops the newline after a tag, lstrip_blocks the indentation before it,
    # and (jinja's default, kept by transformers) one trailing newline of the template goes
    t = "A\n  {% if true %}\nB\n  {% endif %}\nC\n"
    assert render_template(t, []) == "A\nB\nC"


def test_hf_environment_filters_and_globals():
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]
    loops = "{% for m in messages %}{% if loop.index == 2 %}{% continue %}{% endif %}{{ m.content }}{% endfor %}"
    assert render_template(loops, msgs) == "ac"
    breaks = "{% for m in messages %}{% if loop.index == 2 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}"
    assert render_template(breaks, msgs) == "a"
    tools = [{"name": "f", "description": "<é & 🤖>"}]
    assert render_template("{{ tools | tojson }}", [], tools=tools) == json.dumps(tools, ensure_ascii=False)
    assert render_template("{{ tools[0] | tojson(indent=2) }}", [], tools=tools) == \
        '{\n  "name": "f",\n  "description": "<é & 🤖>"\n}'
    assert render_template("{{ strftime_now('%Y') }}", []) == str(datetime.datetime.now().year)
    assert render_template("{% generation %}[{{ messages[0].content }}]{% endgeneration %}", msgs) == "[a]"
    ns = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    assert render_template(ns, msgs) == "3"
    assert render_template("{{ add_generation_prompt }}", [], add_generation_prompt=False) == "False"


def test_template_syntax_and_runtime_errors():
    with pytest.raises(TemplateError, match="does not parse.*line 2"):
        render_template("ok\n{% if x %}", [])
    with pytest.raises(TemplateError, match="failed"):
        render_template("{{ messages[0].content }}", [])


class _FakeTokenizer:
    def __init__(self, add_bos):
        self.add_bos, self.bos_id, self.seen = add_bos, 2, None

    def piece(self, i):
        return "<bos>"

    def encode(self, text, add_special=True, parse_special=True):
        self.seen = (text, add_special, parse_special)
        return []


def test_chat_tokens_never_doubles_bos():
    t = _FakeTokenizer(add_bos=True)
    chat_tokens(t, "<bos><start_of_turn>user\n")
    assert t.seen == ("<start_of_turn>user\n", True, True)
    t = _FakeTokenizer(add_bos=False)
    chat_tokens(t, "<bos>x")
    assert t.seen == ("<bos>x", True, True)
