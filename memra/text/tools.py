"""OpenAI tool calling: tools into the prompt, the model's calls out of its text, and the
grammar that forces a call (tool_choice "required" or a named function).

    messages = tool_messages(md, messages, tools)    # the template's own tools, or the fallback
    calls, content = parse_tool_calls(text)          # [{"id", "type": "function", "function": {...}}]
    grammar = tool_lark(tools, choice, parallel, style)   # llguidance Lark with %json arguments

Rendering. A chat template that mentions `tools` gets them as its `tools` variable, and
assistant `tool_calls` / `role: "tool"` messages as they are (Hugging Face's convention,
which Qwen's, Hermes' and Llama-3.1's templates read). Any other template (SmolLM2's, or a
model without one) gets memra's documented fallback, as llama-server has one:

- a system message (joined after an existing one) listing the tools' JSON definitions
  inside <tools></tools> and asking for calls as `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>` blocks (the Hermes form);
- an assistant message's tool_calls appended to its content in that form;
- a `role: "tool"` message sent as a user turn `<tool_response>{content}</tool_response>`.

Parsing, in order: Hermes `<tool_call>{json}</tool_call>` blocks (text around them is the
message content); Llama-3's JSON call `{"name": ..., "parameters": {...}}` (after an optional
<|python_tag|>), and a generic JSON form (`{"name", "arguments"}`, a list of them, or
`{"tool_calls": [...]}`) when the whole reply is that JSON. Only names of declared tools
count as calls. Arguments come back as JSON text, as OpenAI sends them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence

from memra.errors import MemraError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

FALLBACK_SYSTEM = (
    "You may call one or more functions to assist with the user query. The functions' "
    "signatures are listed within <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, reply with a JSON object holding its name and arguments within "
    "<tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


class ToolError(MemraError):
    """A malformed tools list, tool_choice or tool message (the server answers 400)."""


def check_tools(tools: Sequence, tool_choice=None) -> dict[str, dict]:
    """The declared functions by name; ToolError for a malformed tools list or choice."""
    out: dict[str, dict] = {}
    for i, t in enumerate(tools or []):
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or \
                not isinstance(t.get("function"), Mapping):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -, got {name!r}")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        if name in out:
            raise ToolError(f"tools: the function {name!r} is declared twice")
        out[name] = {"name": name, "description": f.get("description", ""), "parameters": dict(params)}
    if tool_choice is not None:
        forced_name(tool_choice, out)
    return out


def forced_name(tool_choice, functions: Mapping) -> str | None:
    """The function a tool_choice names ({"type": "function", "function": {"name"}}), else None."""
    if tool_choice in (None, "auto", "none", "required"):
        if tool_choice == "required" and not functions:
            raise ToolError("tool_choice is 'required' but no tools are given")
        return None
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice.get("function"),
                                                                             Mapping) else None
        if name is None:
            raise ToolError("tool_choice must be auto, none, required or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}")
        if name not in functions:
            raise ToolError(f"tool_choice names the function {name!r}, which is not among the tools")
        return name
    raise ToolError(f"tool_choice must be auto, none, required or a named function, got {tool_choice!r}")


def template_has_tools(template: str | None) -> bool:
    return bool(template) and re.search(r"\btools\b", template) is not None


def style_of(md: Mapping) -> str:
    """How the model writes calls: "llama3" for Llama-3.1-style templates (JSON with
    "parameters"), else "hermes" (<tool_call> blocks, memra's fallback too)."""
    t = md.get("tokenizer.chat_template") or ""
    if template_has_tools(t) and "<|start_header_id|>" in t and "parameters" in t and CALL_OPEN not in t:
        return "llama3"
    return "hermes"


def _call_text(call: Mapping) -> str:
    f = call.get("function", call)
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return f"{CALL_OPEN}\n{json.dumps({'name': f.get('name'), 'arguments': args}, ensure_ascii=False)}\n{CALL_CLOSE}"


def tool_messages(md: Mapping, messages: Sequence[Mapping], tools: Sequence[Mapping] | None
                  ) -> tuple[list[dict], list | None]:
    """(messages, tools) to render: unchanged with the tools for a template that reads
    them; else the fallback's messages (tool definitions in a system message, calls and
    results as text) and no tools."""
    msgs = [dict(m) for m in messages]
    if template_has_tools(md.get("tokenizer.chat_template")):
        for m in msgs:  # templates read arguments as objects (Hugging Face's convention)
            for c in m.get("tool_calls") or []:
                f = c.get("function") if isinstance(c, Mapping) else None
                if isinstance(f, dict) and isinstance(f.get("arguments"), str):
                    try:
                        f["arguments"] = json.loads(f["arguments"])
                    except json.JSONDecodeError:
                        pass
        return msgs, (list(tools) if tools else None)
    out = []
    for m in msgs:
        role = m.get("role")
        if role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"})
        elif role == "assistant" and m.get("tool_calls"):
            text = _text(m.get("content"))
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (text + "\n" if text else "") + calls})
        else:
            out.append({"role": role, "content": _text(m.get("content"))})
    if tools:
        defs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        sys_text = FALLBACK_SYSTEM.format(tools=defs)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + sys_text}
        else:
            out.insert(0, {"role": "system", "content": sys_text})
    return out, None


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))


# -- parsing -----------------------------------------------------------------------------------

def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(name: str, args) -> dict:
    if not isinstance(args, str):
        args = json.dumps(args if args is not None else {}, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}


def _as_calls(obj, names) -> list[dict] | None:
    """Calls in a parsed JSON value (generic / Llama-3 forms), None when it is not calls."""
    if isinstance(obj, Mapping) and isinstance(obj.get("tool_calls"), list):
        obj = obj["tool_calls"]
    items = obj if isinstance(obj, list) else [obj]
    calls = []
    for it in items:
        if not isinstance(it, Mapping):
            return None
        f = it.get("function") if isinstance(it.get("function"), Mapping) else it
        name = f.get("name")
        args = f.get("arguments", f.get("parameters", {}))
        if name not in names or not isinstance(args, (Mapping, str)):
            return None
        calls.append(_call(name, args))
    return calls or None


def parse_tool_calls(text: str, names, parallel: bool = True) -> tuple[list[dict], str | None]:
    """(tool calls, remaining content or None) of a reply; ([], text) when it calls nothing.
    Not `parallel` (a request's parallel_tool_calls false): the first call only, the others'
    text dropped, as a reply that may call at most one function."""
    calls, content = _parse_calls(text, set(names))
    return (calls[:1], content) if not parallel else (calls, content)


def _parse_calls(text: str, names: set) -> tuple[list[dict], str | None]:
    if CALL_OPEN in text:
        calls, rest, pos = [], [], 0
        for m in re.finditer(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", text, re.S):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            got = _as_calls(obj, names)
            if got:
                calls += got
                rest.append(text[pos:m.start()])
                pos = m.end()
        if calls:
            rest.append(text[pos:])
            content = "".join(rest).strip()
            return calls, content or None
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
    if body[:1] in ("{", "["):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
            # several Llama-3 calls separated by ";" or new lines
            parts = [p for p in re.split(r"\s*;\s*|\n+", body) if p.strip()]
            if len(parts) > 1:
                try:
                    obj = [json.loads(p) for p in parts]
                except json.JSONDecodeError:
                    obj = None
        got = _as_calls(obj, names) if obj is not None else None
        if got:
            return got, None
    return [], text


def may_start_call(text: str) -> int:
    """Where a tool call may begin in streamed text (content before it can be sent), or
    len(text) when none can: a <tool_call> tag or its unfinished prefix at the end, or a
    reply whose first non-space character opens JSON."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[") or stripped.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(stripped) and stripped:
        return len(text) - len(stripped)
    i = text.find(CALL_OPEN)
    if i >= 0:
        return i
    for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_OPEN[:k]):
            return len(text) - k
    return len(text)


# -- forcing a call ------------------------------------------------------------------------------

def _strict(schema: Mapping) -> dict:
    return dict(schema) if schema else {"type": "object"}


def tool_lark(functions: Mapping[str, dict], name: str | None, parallel: bool, style: str) -> str:
    """llguidance Lark grammar of one call (or, parallel, one or more) to `name` or to any
    declared function, arguments valid under its parameters schema."""
    from memra.text.grammar import JSON_OPTIONS

    chosen = [functions[name]] if name else list(functions.values())
    key = "parameters" if style == "llama3" else "arguments"
    variants = [{"type": "object", "properties": {"name": {"const": f["name"]}, key: _strict(f["parameters"])},
                 "required": ["name", key], "additionalProperties": False} for f in chosen]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {**schema, "x-guidance": dict(JSON_OPTIONS)}
    js = json.dumps(schema, ensure_ascii=False)
    if style == "llama3":
        return f"start: %json {js}\n"
    rep = "call (\"\\n\" call)*" if parallel else "call"
    return f'start: {rep}\ncall: "{CALL_OPEN}\\n" %json {js} "\\n{CALL_CLOSE}"\n'
