"""OpenAI's Responses API (POST /v1/responses) on the chat machinery of memra.serve.api.

A request is translated into a chat request (`chat_request`): `input` (a string, or message
items with text parts, `function_call` and `function_call_output` items) and `instructions`
become messages; `tools` (function tools), `tool_choice`, `text.format` (json_object,
json_schema), `max_output_tokens`, `temperature`, `top_p` map onto their chat fields, and
memra's sampling extras (`top_k`, `min_p`, `seed`, penalties, `stop`, `cache_salt`) pass
through. It then runs exactly as a chat completion would (the same tokens) and the reply is
laid out as output items (`output_items`: a reasoning item for a think block, the message,
one `function_call` item per call) in a `response` object (`response_object`); streamed,
`EventStream` turns the chat deltas into the Responses events (response.created,
output_item.added, output_text.delta, function_call_arguments.delta, …, response.completed),
each with its sequence number. This server keeps no responses: `previous_response_id` and
`store: true` retrieval are not offered (the whole conversation goes in `input`), nor are tools
other than functions or non-text input parts (each a 400 naming its field). `include:
["message.output_text.logprobs"]` (or `top_logprobs`) asks for the chat log-probs of the output
text's tokens."""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

# memra's sampling fields a Responses request may carry (as chat's extras), passed through as they are
PASS = ("top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
        "stop_token_ids", "min_tokens", "cache_salt", "user", "ignore_eos", "logit_bias", "reasoning_format")


# the include value that asks for the output text's token log-probs (with top_logprobs alternatives)
LOGPROBS = "message.output_text.logprobs"


class RequestError(ValueError):
    """A Responses request this server cannot take: the message and the field it names."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # memra's sampling extras (PASS) ride along

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: Optional[bool] = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    previous_response_id: Optional[str] = None
    include: Optional[list[str]] = None
    top_logprobs: Optional[int] = None
    metadata: Optional[dict[str, Any]] = None


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content, where: str) -> str:
    """A message's or a tool output's text: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of text parts", "input")
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise RequestError(f"{where}: content part of type {kind!r} is not supported (text only)", "input")
        out.append(str(p.get("text") or ""))
    return "".join(out)


def _messages(body: ResponsesBody) -> list[dict]:
    msgs: list[dict] = []
    if body.instructions:
        msgs.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return msgs + [{"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}.role must be user, system, developer or assistant, got {role!r}",
                                   "input")
            if item.get("content") is None or item.get("content") == []:
                raise RequestError(f"{where} ({role}) must have content (a string or at least one part)", "input")
            msgs.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id") or _new_id("call"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if not isinstance(call["function"]["name"], str):
                raise RequestError(f"{where}: a function_call needs its name", "input")
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            if out is None or not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}: a function_call_output needs its call_id and output", "input")
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": out if isinstance(out, str) else _text(out, where)})
        elif kind == "reasoning":
            continue  # an earlier turn's thought: templates drop it from the history anyway
        else:
            raise RequestError(f"{where}: input items of type {kind!r} are not supported (message, "
                               f"function_call, function_call_output)", "input")
    return msgs


def _tools(body: ResponsesBody) -> tuple[list | None, Any]:
    tools = None
    if body.tools:
        tools = []
        for i, t in enumerate(body.tools):
            if t.get("type") != "function":
                raise RequestError(f"tools[{i}]: tools of type {t.get('type')!r} are not supported (function "
                                   f"tools only)", "tools")
            f = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            tools.append({"type": "function", "function": f})
    choice = body.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise RequestError("tool_choice must be auto, none, required or {\"type\": \"function\", \"name\"}",
                               "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, choice


def _format(body: ResponsesBody) -> dict | None:
    fmt = (body.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise RequestError(f"text.format must be an object with a type (text, json_object or json_schema), got "
                           f"{type(fmt).__name__}", "text")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        js = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": js}
    raise RequestError(f"text.format of type {fmt.get('type')!r} is not supported (text, json_object, "
                       f"json_schema)", "text")


def chat_request(body: ResponsesBody) -> dict:
    """The chat completion request (a ChatBody payload) a Responses request stands for."""
    if body.previous_response_id is not None:
        raise RequestError("previous_response_id: this server keeps no responses; send the whole conversation "
                           "as input", "previous_response_id")
    other = [x for x in body.include or [] if x != LOGPROBS]
    if other:
        raise RequestError(f"include {other!r} is not supported by this server (only {LOGPROBS!r})", "include")
    tools, choice = _tools(body)
    req: dict = {"model": body.model, "messages": _messages(body), "stream": bool(body.stream)}
    if LOGPROBS in (body.include or []) or body.top_logprobs is not None:  # the output text's token log-probs
        req.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    for k, v in (("max_completion_tokens", body.max_output_tokens), ("temperature", body.temperature),
                 ("top_p", body.top_p), ("tools", tools), ("tool_choice", choice),
                 ("parallel_tool_calls", body.parallel_tool_calls), ("response_format", _format(body))):
        if v is not None:
            req[k] = v
    extra = body.model_extra or {}
    req.update({k: extra[k] for k in PASS if k in extra})
    return req


def output_items(message: dict, logprobs: dict | None = None) -> list[dict]:
    """A chat reply (its message: content, reasoning_content, tool_calls; its choice's logprobs) as
    Responses output items (the token log-probs in the message's output_text part)."""
    items = []
    if message.get("reasoning_content"):
        items.append({"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "completed",
                      "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(_message_item(_new_id("msg"), message.get("content") or "", "completed",
                                   (logprobs or {}).get("content") or []))
    for c in calls:
        items.append(_call_item(_new_id("fc"), c["id"], c["function"]["name"], c["function"]["arguments"],
                                "completed"))
    return items


def _message_item(item_id: str, text: str | None, status: str, logprobs: list | None = None) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": logprobs or []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def dumps(doc) -> str:
    """doc as JSON text that encodes as UTF-8: a lone surrogate (JSON's \\ud800) a request carried in a field the
    response object echoes (instructions, metadata, tools, text) stays an escape there."""
    text = json.dumps(doc, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(doc)
    return text


def usage_of(u: dict) -> dict:
    """A chat usage object (memra.serve.api's) as the Responses usage."""
    return {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens_details": {"reasoning_tokens": 0}}


def response_object(rid: str, created: int, model: str, body: ResponsesBody, output: list, *,
                    finish: str | None, usage: dict | None, status: str | None = None) -> dict:
    """The `response` object: status completed (incomplete when the reply reached max_output_tokens)."""
    if status is None:
        status = "incomplete" if finish == "length" else "completed"
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "temperature": body.temperature, "top_p": body.top_p,
            "text": body.text or {"format": {"type": "text"}}, "metadata": body.metadata or {},
            "previous_response_id": None, "store": False, "usage": usage}


class EventStream:
    """The Responses events of one streamed reply, from the chat deltas memra.serve.api's stream
    of a choice yields: feed(delta) for each chunk's delta, then end(finish, usage) or fail(message);
    each returns the SSE text of the events it makes."""

    def __init__(self, rid: str, created: int, model: str, body: ResponsesBody):
        self.rid, self.created, self.model, self.body = rid, created, model, body
        self.seq = 0
        self.output: list[dict] = []   # the items so far (their final form once done)
        self.open: dict | None = None  # the item being streamed: {"kind", "index", "id", "text", "lps"}
        self.lp_wait: list = []        # token log-probs that came before the text they go with

    def _ev(self, kind: str, **fields) -> str:
        doc = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {dumps(doc)}\n\n"

    def _response(self, status: str, finish: str | None = None, usage: dict | None = None) -> dict:
        return response_object(self.rid, self.created, self.model, self.body, list(self.output), finish=finish,
                               usage=usage, status=status)

    def start(self) -> str:
        r = self._response("in_progress")
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    def _open(self, kind: str) -> str:
        out = self._close()
        i, item_id = len(self.output), _new_id({"reasoning": "rs", "message": "msg"}[kind])
        self.open = {"kind": kind, "index": i, "id": item_id, "text": "", "lps": []}
        if kind == "message":
            item = _message_item(item_id, None, "in_progress")
            self.output.append(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            return out + self._ev("response.output_item.added", output_index=i, item=item) + \
                self._ev("response.content_part.added", item_id=item_id, output_index=i, content_index=0, part=part)
        item = {"type": "reasoning", "id": item_id, "summary": [], "status": "in_progress", "content": []}
        self.output.append(item)
        return out + self._ev("response.output_item.added", output_index=i, item=item)

    def _close(self) -> str:
        o, self.open = self.open, None
        if o is None:
            return ""
        i, item_id, text = o["index"], o["id"], o["text"]
        if o["kind"] == "message":
            lps, self.lp_wait = o["lps"] + self.lp_wait, []
            item = _message_item(item_id, text, "completed", lps)
            self.output[i] = item
            return self._ev("response.output_text.done", item_id=item_id, output_index=i, content_index=0,
                            text=text, logprobs=lps) + \
                self._ev("response.content_part.done", item_id=item_id, output_index=i, content_index=0,
                         part=item["content"][0]) + \
                self._ev("response.output_item.done", output_index=i, item=item)
        item = {"type": "reasoning", "id": item_id, "summary": [], "status": "completed",
                "content": [{"type": "reasoning_text", "text": text}]}
        self.output[i] = item
        return self._ev("response.reasoning_text.done", item_id=item_id, output_index=i, content_index=0,
                        text=text) + self._ev("response.output_item.done", output_index=i, item=item)

    def feed(self, delta: dict, logprobs: dict | None = None) -> str:
        out = ""
        self.lp_wait += (logprobs or {}).get("content") or []
        for kind, key, event in (("reasoning", "reasoning_content", "response.reasoning_text.delta"),
                                 ("message", "content", "response.output_text.delta")):
            text = delta.get(key)
            if not text:
                continue
            if self.open is None or self.open["kind"] != kind:
                out += self._open(kind)
            self.open["text"] += text
            extra = {}
            if kind == "message":
                extra["logprobs"], self.lp_wait = self.lp_wait, []
                self.open["lps"] += extra["logprobs"]
            out += self._ev(event, item_id=self.open["id"], output_index=self.open["index"], content_index=0,
                            delta=text, **extra)
        for call in delta.get("tool_calls") or []:
            f = call.get("function", {})
            if "id" in call:  # a call begins: its name, then its arguments in the next delta
                out += self._close()
                i, item_id = len(self.output), _new_id("fc")
                self.output.append(_call_item(item_id, call["id"], f.get("name"), "", "in_progress"))
                out += self._ev("response.output_item.added", output_index=i, item=self.output[i])
            else:
                i = len(self.output) - 1
                item = {**self.output[i], "arguments": f.get("arguments", ""), "status": "completed"}
                self.output[i] = item
                out += self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                delta=item["arguments"])
                out += self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                name=item["name"], arguments=item["arguments"])
                out += self._ev("response.output_item.done", output_index=i, item=item)
        return out

    def end(self, finish: str | None, usage: dict) -> str:
        out = self._close()
        if not self.output:  # an empty reply is still a message
            out += self._open("message") + self._close()
        status = "incomplete" if finish == "length" else "completed"
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._ev(kind, response=self._response(status, finish, usage_of(usage)))

    def fail(self, message: str) -> str:
        r = self._response("failed")
        r["error"] = {"code": "server_error", "message": message}
        return self._ev("response.failed", response=r)
