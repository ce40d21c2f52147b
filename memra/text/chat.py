"""Chat prompts: a GGUF's `tokenizer.chat_template` rendered as Hugging Face renders it.

Templates come from model files, so they are untrusted code: they run in jinja2's
`ImmutableSandboxedEnvironment` (no access to Python internals, no mutation of the messages).
The environment matches `transformers`' `apply_chat_template`: trim_blocks and lstrip_blocks,
the loopcontrols extension, a `tojson` that keeps non-ASCII text, the globals
`raise_exception` and `strftime_now`, the `{% generation %}` block, and the variables
`messages`, `tools`, `documents`, `add_generation_prompt` and the special-token strings.

A GGUF without a template (Gemma-3-270M ships none) gets its architecture's documented turn
format instead: gemma's `<start_of_turn>` turns, Llama-3's header format, or ChatML.
Rendered text never needs a BOS of its own: `chat_tokens` drops a leading BOS string that
the tokenizer is about to add anyway (as llama.cpp does), so it is never doubled.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from memra.errors import TemplateError

log = logging.getLogger("memra.chat")


# -- the Hugging Face environment -------------------------------------------------------------

def _raise_exception(message):
    raise TemplateError(f"chat template: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters (<, >, &, ') — wrong inside a prompt
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: transformers uses it to mark assistant text for
    training masks; for inference the body is rendered unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


# the longest string or list a template may make by repetition (`'x' * n`): a prompt is far
# shorter; a corrupt or hostile template must not allocate gigabytes
MAX_REPEAT = 1 << 20


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja's immutable sandbox with `*` repetition bounded (MAX_REPEAT items)."""

    intercepted_binops = frozenset({"*"})

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT:
                    raise jinja2.exceptions.SecurityError(
                        f"repeating a {type(seq).__name__} of length {len(seq)} {n} times makes more "
                        f"than {MAX_REPEAT} items")
        return super().call_binop(context, operator, left, right)


# the most template lines one render may run: a prompt's template runs 5-100 a message, so a
# conversation within any context runs far fewer; a template looping ~10^10 times (nested
# range loops) is stopped instead of holding the thread for hours
MAX_STEPS = 1_000_000


class _StepLimit:
    """A trace function counting the lines that template code runs (jinja compiles a template
    to Python code named `<template>`; other code runs untraced) and raising past MAX_STEPS."""

    def __init__(self, limit: int):
        self.left = limit

    def __call__(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.left -= 1
            if self.left < 0:
                raise TemplateError(f"chat template failed: it ran more than {MAX_STEPS:,} steps "
                                    "(a loop that does not end?)")
        return self._line


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not parse: {e.message} (line {e.lineno})") from None
    except RecursionError:
        raise TemplateError("chat template does not parse: nested too deeply") from None


def render_template(source: str, messages: Sequence[Mapping], *, add_generation_prompt: bool = True,
                    tools: Sequence[Mapping] | None = None, documents: Sequence[Mapping] | None = None,
                    **variables) -> str:
    """Render one jinja chat template (extra `variables` such as bos_token reach the template)."""
    if not isinstance(source, str):
        raise TemplateError(f"the chat template is {type(source).__name__} {str(source)[:40]!r}, not text")
    template = _compile(source)
    before = sys.gettrace()
    sys.settrace(_StepLimit(MAX_STEPS))
    try:
        return template.render(messages=list(messages), tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except TemplateError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"chat template blocked by the sandbox: {e}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {e}") from None
    except RecursionError:
        raise TemplateError("chat template failed: it recursed too deeply (a macro calling itself?)") from None
    except MemoryError:
        raise TemplateError("chat template failed: it ran out of memory") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as e:
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(before)


# -- metadata ---------------------------------------------------------------------------------

def _metadata(source) -> Mapping:
    md = getattr(source, "metadata", source)
    if not isinstance(md, Mapping):
        raise TypeError("render_chat needs a GGUFFile or its metadata mapping")
    return md


def _token_text(md: Mapping, key: str) -> str | None:
    tid = md.get(key)
    tokens = md.get("tokenizer.ggml.tokens")
    # an id that is no integer or past the vocabulary names no token (the tokenizer warns)
    if isinstance(tid, bool) or not isinstance(tid, int) or not isinstance(tokens, list) \
            or not 0 <= tid < len(tokens) or not isinstance(tokens[tid], str):
        return None
    return tokens[tid]


def special_tokens(source) -> dict[str, str]:
    """The special-token strings a template may reference (bos_token, eos_token, …)."""
    md = _metadata(source)
    out = {}
    for name in ("bos", "eos", "unknown", "padding"):
        text = _token_text(md, f"tokenizer.ggml.{name}_token_id")
        if text is not None:
            out[{"unknown": "unk", "padding": "pad"}.get(name, name) + "_token"] = text
    return out


# -- built-in turn formats for GGUFs without a template ---------------------------------------

def _text(content) -> str:
    """Message content as text: a string, None, or OpenAI-style parts [{'type': 'text', ...}]."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for p in content:
            if isinstance(p, Mapping) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            else:
                raise TemplateError(f"message content part {p!r} is not text; only text is supported")
        return "".join(parts)
    raise TemplateError(f"message content must be text, got {type(content).__name__}")


def _role_and_text(m) -> tuple[str, str]:
    if not isinstance(m, Mapping) or "role" not in m:
        raise TemplateError(f"a chat message must be a mapping with a 'role', got {m!r}")
    return str(m["role"]), _text(m.get("content"))


def _gemma(messages, add_generation_prompt: bool) -> str:
    # Gemma has no system role: the system text opens the first user turn, then a blank line.
    out, prefix = [], ""
    for i, m in enumerate(messages):
        role, text = _role_and_text(m)
        if role == "system":
            if i != 0:
                raise TemplateError("gemma turn format: a system message must come first")
            prefix = text.strip() + "\n\n"
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if prefix and role != "model":
            out.append(prefix)
            prefix = ""
        out.append(text.strip() + "<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _llama3(messages, add_generation_prompt: bool) -> str:
    out = []
    for m in messages:
        role, text = _role_and_text(m)
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text.strip()}<|eot_id|>")
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _chatml(messages, add_generation_prompt: bool) -> str:
    out = []
    for m in messages:
        role, text = _role_and_text(m)
        out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


BUILTIN_FORMATS = {"gemma": _gemma, "llama3": _llama3, "chatml": _chatml}


def builtin_format(source) -> str:
    """Which built-in turn format a template-less GGUF uses (its architecture, then its vocab)."""
    md = _metadata(source)
    arch = str(md.get("general.architecture", ""))
    vocab = md.get("tokenizer.ggml.tokens") or ()
    if arch.startswith("gemma"):
        return "gemma"
    if "<|start_header_id|>" in vocab:
        return "llama3"
    if arch in ("qwen2", "qwen3") or "<|im_start|>" in vocab:
        return "chatml"
    raise TemplateError(f"the model has no chat template and architecture {arch!r} has no known "
                        f"turn format; give a template or use a plain prompt")


# -- entry points -----------------------------------------------------------------------------

def render_chat(source, messages: Sequence[Mapping], add_generation_prompt: bool = True,
                tools: Sequence[Mapping] | None = None, *, bos_token: str | None = None,
                eos_token: str | None = None, template: str | None = None, **variables) -> str:
    """The prompt text for `messages` (a list of {'role', 'content'}).

    `source` is a GGUFFile or its metadata. `template` overrides the file's template;
    bos_token/eos_token override the strings taken from the vocabulary; further keyword
    `variables` reach the template (e.g. `enable_thinking=False`).
    """
    md = _metadata(source)
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise TemplateError("messages must be a list of {'role': ..., 'content': ...} mappings")
    source_text = template if template is not None else md.get("tokenizer.chat_template")
    if source_text is not None and not isinstance(source_text, str):
        where = "the chat template" if template is not None else "metadata tokenizer.chat_template"
        raise TemplateError(f"{where} is {type(source_text).__name__} {str(source_text)[:40]!r}, not text")
    if source_text:
        toks = special_tokens(md)
        if bos_token is not None:
            toks["bos_token"] = bos_token
        if eos_token is not None:
            toks["eos_token"] = eos_token
        toks.setdefault("bos_token", "")
        toks.setdefault("eos_token", "")
        return render_template(source_text, messages, add_generation_prompt=add_generation_prompt,
                               tools=tools, **toks, **variables)
    fmt = builtin_format(md)
    if tools:
        raise TemplateError(f"the model has no chat template; its built-in {fmt} turn format "
                            f"cannot describe tools")
    log.debug("no chat template in the model; using the built-in %s turn format", fmt)
    return BUILTIN_FORMATS[fmt](messages, add_generation_prompt)


def chat_tokens(tokenizer, text: str) -> list[int]:
    """Token ids of rendered chat text, special tokens parsed, BOS added once per metadata."""
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        bos = tokenizer.piece(tokenizer.bos_id)
        if bos and text.startswith(bos):
            text = text[len(bos):]
    return tokenizer.encode(text, add_special=True, parse_special=True)
