"""The OpenAI-compatible HTTP surface of `memra serve` (FastAPI on uvicorn).

    cfg = ServeConfig(model="smollm2-135m", device="cpu", port=8080)
    server = Server(cfg); server.run()         # the CLI: blocks, drains on SIGTERM, exits 0
    server.start_in_thread(); ...; server.stop()   # tests: a real uvicorn on a loopback port

Routes: POST /v1/chat/completions, /v1/completions (blocking, or SSE with `data: {chunk}` lines
ending in `data: [DONE]`; `stream_options.include_usage` adds a last chunk with empty
`choices` and the usage), GET /v1/models, GET /health (200 serving, 503 loading), GET /readyz
(503 loading or draining), GET /metrics (Prometheus text; needs a key when keys are set),
POST /tokenize and /detokenize (llama-server's). Chat replies have a <think> block split into
`reasoning_content` unless `reasoning_format` is "none" (memra.text.reasoning).

Every request is validated once: pydantic for shapes and types (unknown fields ignored), then
memra.sampling.check_request for ranges and the context, the same validation `memra run`
uses. Errors are OpenAI's object {"error": {"message", "type", "param", "code"}}: 400 a bad
parameter or a context too long, 401 a missing or wrong key, 404 an unknown model or route,
429 + Retry-After when --max-queue requests already wait, 503 + Retry-After while loading or
draining. Nothing malformed reaches the engine thread (memra.serve.scheduler), which owns the
runner.

Lifecycle: uvicorn listens at once and the engine loads on a thread (kernels compiled and the
decode graphs captured on the GPU) while /health answers 503. On SIGTERM (or Ctrl-C) the
server drains: /readyz and new requests answer 503, running requests finish within
--drain-timeout (then they are cancelled), and the process exits 0. A second signal exits
at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memra import __version__
from memra.errors import ContextOverflowError, MemraError
from memra.sampling import MAX_TOP_LOGPROBS, SamplingParams, check_request
from memra.session import prompt_ids
from memra.text.grammar import GrammarError, compile_constraint
from memra.text.reasoning import FORMATS as REASONING_FORMATS, ReasoningStream, prompt_opens_think, split_reasoning
from memra.text.tools import (ToolError, check_tools, forced_name, may_start_call, parse_tool_calls, style_of,
                              tool_lark, tool_messages)
from memra.serve.auth import Keys, check_bind
from memra.serve.metrics import CONTENT_TYPE, Metrics
from memra.serve.responses import EventStream, RequestError, ResponsesBody, chat_request, dumps, output_items, \
    response_object, usage_of
from memra.serve.scheduler import GenRequest, NeverFits, QueueFull, Scheduler, open_engine

log = logging.getLogger("memra.serve")

# request field -> SamplingParams field, so check_request's messages name what the client sent
FIELD_NAMES = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
               "seed": "seed", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
               "frequency_penalty": "frequency_penalty", "max_tokens": "max_tokens", "stop": "stop",
               "repeat_last_n": "repeat_last_n", "logit_bias": "logit_bias", "stop_ids": "stop_token_ids",
               "min_tokens": "min_tokens",
               "n_ctx": "--ctx-size"}


@dataclass
class ServeConfig:
    model: str | None = None        # path or alias (None: memra's default model)
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None        # the name clients use (default: the model argument)
    api_keys: list[str] = field(default_factory=list)
    device: str = "cpu"
    ctx_size: int | None = None     # positions per sequence (default: min(training context, 4096))
    parallel: int | None = None     # sequences at once (default gpu 64, cpu 4)
    max_queue: int = 256
    kv_memory: int | None = None    # bytes of KV cache (default: parallel x ctx positions)
    cache_type_k: str = "f16"       # the KV cache's types: f16, or q8_0 (the cpu device only)
    cache_type_v: str = "f16"
    max_batched_tokens: int | None = None  # tokens a step (default gpu 2048, cpu 64)
    drain_timeout: float = 30.0
    prefix_cache: bool = True
    spec: str | None = None         # speculative decoding's drafter (memra.spec), None: off
    spec_k: str = "auto"
    spec_max_batch: int = 1         # speculate while at most this many requests decode


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=headers)


# -- request bodies (pydantic: shapes and types; unknown fields are ignored) ----------------------

class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class ContentPart(_Body):
    type: str
    text: Optional[str] = None


class Message(_Body):
    role: str
    content: Union[str, list[ContentPart], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None   # an assistant's earlier calls
    tool_call_id: Optional[str] = None                  # role "tool": the call it answers
    name: Optional[str] = None


class _GenBody(_Body):
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None  # vLLM's: tokens that end the reply (not part of its text)
    min_tokens: Optional[int] = None  # vLLM's: no end of the reply (EOS, stop ids, stop strings) before it
    n: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    cache_salt: Optional[str] = None
    user: Optional[str] = None
    ignore_eos: Optional[bool] = False
    # constrained output (memra.text.grammar): OpenAI's response_format, llama-server's
    # grammar (GBNF) and json_schema, and a regex
    response_format: Optional[dict[str, Any]] = None
    grammar: Optional[str] = None
    json_schema: Optional[Any] = None
    regex: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None  # token id (a string, as JSON keys are) -> bias
    # OpenAI fields this server does not implement: refused when they would change the reply
    best_of: Optional[int] = None


class ChatBody(_GenBody):
    messages: list[Message]
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    # the <think> split (memra.text.reasoning): auto / deepseek (the default) or none
    reasoning_format: Optional[str] = None


class CompletionBody(_GenBody):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = None
    echo: Optional[bool] = False
    suffix: Optional[str] = None


class TokenizeBody(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(_Body):
    tokens: list[int]


# -- the server's state ----------------------------------------------------------------------------

class State:
    def __init__(self, cfg: ServeConfig):
        from memra.model.aliases import DEFAULT_MODEL, resolve
        from memra.model.config import read_config
        from memra.model.gguf import open_gguf
        from memra.text.tokenizer import Tokenizer

        self.cfg = cfg
        self.keys = Keys(cfg.api_keys)
        check_bind(cfg.host, self.keys)
        if cfg.device not in ("cpu", "gpu"):
            raise MemraError(f"--device must be cpu or gpu, got {cfg.device!r}")
        name = cfg.model or DEFAULT_MODEL
        self.path = Path(resolve(name))
        self.gguf = open_gguf(self.path)
        self.mcfg = read_config(self.gguf)
        self.tok = Tokenizer.from_gguf(self.gguf)
        self.alias = cfg.alias or name
        self.names = {self.alias, name, self.path.name, self.path.stem}
        # None is the default; 0 is a value, refused below (not the default in disguise)
        self.ctx = int(min(self.mcfg.n_ctx_train, 4096) if cfg.ctx_size is None else cfg.ctx_size)
        for w in check_request(SamplingParams(), n_ctx=self.ctx, n_ctx_train=self.mcfg.n_ctx_train,
                               names={"n_ctx": "--ctx-size"}):
            log.warning("%s", w)
        self.parallel = int((64 if cfg.device == "gpu" else 4) if cfg.parallel is None else cfg.parallel)
        if self.parallel < 1:
            raise MemraError(f"--parallel must be at least 1, got {self.parallel}")
        self.budget = int((2048 if cfg.device == "gpu" else 64) if cfg.max_batched_tokens is None
                          else cfg.max_batched_tokens)
        if self.budget < 1:  # before the engine loads (the scheduler says the same)
            raise MemraError(f"--max-num-batched-tokens must be at least 1, got {self.budget}")
        if cfg.max_queue < 0:
            raise MemraError(f"--max-queue must be >= 0, got {cfg.max_queue}")
        if cfg.device == "cpu":  # the KV cache asked for must fit, before the server listens
            from memra.serve.cpu_engine import check_memory, pool_blocks

            kv = dict(cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v)
            check_memory(self.mcfg, self.ctx, self.parallel,
                         pool_blocks(self.mcfg, self.ctx, self.parallel, kv_memory=cfg.kv_memory, **kv), **kv,
                         hint=(f"lower --kv-memory or --ctx-size ({self.ctx})" if cfg.kv_memory is not None
                               else f"lower --parallel ({self.parallel}) or --ctx-size ({self.ctx})"))
        self.metrics = Metrics(self.alias)
        self.phase = "loading"  # loading -> ready -> draining; "failed" if the engine did not load
        self.error: str | None = None
        self.sched: Scheduler | None = None
        self.engine = None
        self.created = int(time.time())
        self.fingerprint = f"memra-{__version__}-{cfg.device}"
        self.device_name = "cpu"
        self.on_ready = None  # called with the state once the engine is ready (the CLI's line)
        self.constraints: dict[tuple, object] = {}  # compiled constraints, by (kind, spec)
        self.constraints_lock = threading.Lock()      # compiled in worker threads (asyncio.to_thread)

    def load(self) -> None:
        """Open the engine and its scheduler on this thread, which becomes the engine thread
        (run_engine): the runner's CUDA context is current where it was opened."""
        t0 = time.perf_counter()
        try:
            self.engine = open_engine(self.gguf, self.mcfg, self.cfg.device, ctx=self.ctx, parallel=self.parallel,
                                      kv_memory=self.cfg.kv_memory, cache_type_k=self.cfg.cache_type_k,
                                      cache_type_v=self.cfg.cache_type_v)
            if self.cfg.device == "gpu":
                self.device_name = self.engine.g.info.name
            spec = None
            if self.cfg.spec:
                from memra.spec.decode import SpecServing

                spec = SpecServing.open(self.cfg.spec, self.cfg.spec_k, self.cfg.spec_max_batch, gguf=self.gguf,
                                        cfg=self.mcfg, device=self.cfg.device, n_ctx=self.ctx)
            self.sched = Scheduler(self.engine, self.tok, max_queue=self.cfg.max_queue,
                                   max_batched_tokens=self.budget, metrics=self.metrics,
                                   prefix_cache=self.cfg.prefix_cache, spec=spec)
        except Exception as e:
            self.phase, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("the engine failed to load: %s", self.error)
            raise
        kv = self.engine.kv
        log.info("ready in %.1f s: %s on %s, context %d, %d sequences, KV %d blocks of %d tokens",
                 time.perf_counter() - t0, self.alias, self.cfg.device, self.ctx, self.parallel,
                 kv.alloc.n_blocks, kv.block)

    def run_engine(self) -> None:
        """load(), then serve: the engine loop on this thread until the scheduler stops."""
        self.load()
        if self.phase == "loading":
            self.phase = "ready"
        if self.on_ready is not None:
            self.on_ready(self)
        self.sched.run()

    # -- checks every generation request passes ------------------------------------------------
    def require_serving(self) -> None:
        if self.phase == "loading":
            raise APIError(503, "the model is loading", "service_unavailable", code="model_loading", retry_after=5)
        if self.phase == "draining":
            raise APIError(503, "the server is shutting down", "service_unavailable", code="draining",
                           retry_after=30)
        if self.phase == "failed":
            raise APIError(503, f"the engine failed to load: {self.error}", "service_unavailable",
                           code="engine_failed")

    def check_model(self, model: str | None) -> None:
        if model and model not in self.names:
            raise APIError(404, f"the model {model!r} does not exist (this server serves {self.alias!r})",
                           "invalid_request_error", "model", "model_not_found")


def _param_of(message: str) -> str | None:
    first = message.split(" ", 1)[0].strip(":,")
    return first if first in set(FIELD_NAMES.values()) | {"messages", "prompt", "n", "logprobs",
                                                          "top_logprobs"} else None


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def _limit_name(body: _GenBody) -> str:
    """The field the request's token limit came from (chat: max_completion_tokens wins)."""
    return "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias, whose keys are token ids written as JSON strings, keyed by int
    (the ranges are check_request's)."""
    out = {}
    for k, v in (bias or {}).items():
        if not re.fullmatch(r"[0-9]+", k):
            raise _bad(f"logit_bias: the key {k!r} is not a token id (a non-negative integer)", "logit_bias")
        if len(k.lstrip("0")) > 18:  # beyond any vocabulary (and int() refuses strings of over 4300 digits)
            raise _bad(f"logit_bias: the key {k[:24]}... ({len(k)} digits) is outside the vocabulary", "logit_bias")
        out[int(k)] = v
    return out


# the Responses API's names of the chat fields a 400 may name (memra.serve.responses maps them)
RESPONSES_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                    "response_format": "text"}

# choices a request may ask for (prompts x n): the largest decode batch the GPU engine captures
MAX_CHOICES = 64


@dataclass
class _Choice:
    """One choice of a response: its index (prompt i, sample j: i n + j), j, its generation and
    the events read before the response began (memra serve's _start)."""
    index: int
    j: int
    req: GenRequest
    early: list = field(default_factory=list)
    echo: bool = False    # completions' echo: the reply begins with the prompt's text (and log-probs)
    one_call: bool = False  # parallel_tool_calls false: the reply's first tool call only


def _choice_params(p: SamplingParams, j: int) -> SamplingParams:
    """Choice j's sampling parameters: choice 0 keeps the request's seed (so n = 1 and the first of
    n choices sample the same tokens), choice j > 0 a seed derived from (seed, j); without a seed
    every choice draws its own at submission."""
    if j == 0 or p.seed is None:
        return p
    h = hashlib.blake2b(f"memra-choice\0{p.seed}\0{j}".encode(), digest_size=8).digest()
    return dataclasses.replace(p, seed=int.from_bytes(h, "little") >> 1)


def _params(body: _GenBody, max_tokens: int | None, ctx: int, n_prompt: int, n_vocab: int) -> SamplingParams:
    d = SamplingParams()
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    p = SamplingParams(
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_k=d.top_k if body.top_k is None else body.top_k,
        top_p=d.top_p if body.top_p is None else body.top_p,
        min_p=d.min_p if body.min_p is None else body.min_p,
        seed=body.seed,
        repeat_penalty=d.repeat_penalty if body.repetition_penalty is None else body.repetition_penalty,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        max_tokens=-1 if max_tokens is None else max_tokens,
        stop=stop,
        stop_ids=list(body.stop_token_ids or []),
        min_tokens=body.min_tokens or 0,
        logit_bias=_logit_bias(body.logit_bias))
    least = 0 if getattr(body, "echo", False) else 1  # echo with max_tokens 0: the prompt (and its log-probs) alone
    if max_tokens is not None and max_tokens < least:
        raise _bad(f"{_limit_name(body)} must be at least {least}, got {max_tokens}", _limit_name(body))
    if body.best_of is not None and body.best_of != 1:
        raise _bad(f"best_of must be 1: this server returns the choices it samples, unranked, got {body.best_of}",
                   "best_of")
    try:
        check_request(p, n_prompt=n_prompt, n_ctx=ctx, n_vocab=n_vocab, names=FIELD_NAMES)
    except ContextOverflowError as e:
        raise _bad(str(e), "messages" if isinstance(body, ChatBody) else "prompt", "context_length_exceeded")
    except MemraError as e:
        raise _bad(str(e), _param_of(str(e)))
    return p


def constraint_of(body: "_GenBody") -> tuple[str | None, Any, str | None]:
    """(kind, spec, the request field it came from) of a request's output constraint, or
    (None, None, None): at most one of response_format (json_object, json_schema), grammar,
    json_schema and regex."""
    found = []
    rf = body.response_format
    if rf is not None:
        t = rf.get("type", "text")
        if t == "json_object":
            found.append(("json_object", None, "response_format"))
        elif t == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise _bad("response_format: type json_schema needs a json_schema object with a 'schema'",
                           "response_format")
            schema = js.get("schema", js.get("schema_"))
            if schema is None:
                raise _bad("response_format.json_schema.schema is missing", "response_format")
            found.append(("json_schema", schema, "response_format"))
        elif t != "text":
            raise _bad(f"response_format type {t!r} is not supported (text, json_object or json_schema)",
                       "response_format")
    if body.grammar:
        found.append(("gbnf", body.grammar, "grammar"))
    if body.json_schema is not None:
        found.append(("json_schema", body.json_schema, "json_schema"))
    if body.regex:
        found.append(("regex", body.regex, "regex"))
    if len(found) > 1:
        raise _bad(f"give one output constraint, not {' and '.join(f[2] for f in found)}", found[1][2])
    return found[0] if found else (None, None, None)


ROLES = ("system", "developer", "user", "assistant", "tool")


def _check_message(i: int, m: Message) -> None:
    """A chat message's role and content as OpenAI's API takes them: a known role ("developer"
    is rendered as "system"), and content on every message but an assistant's that calls tools."""
    if m.role not in ROLES:
        raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}", f"messages[{i}].role")
    if m.content is None and not (m.role == "assistant" and m.tool_calls):
        what = "content or tool_calls" if m.role == "assistant" else "content"
        raise _bad(f"messages[{i}] ({m.role}) must have {what}", f"messages[{i}].content")
    if isinstance(m.content, list) and not m.content:
        raise _bad(f"messages[{i}].content is an empty list of parts (give at least one, or a string)",
                   f"messages[{i}].content")


def _content(m: Message) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = []
    for part in m.content:
        if part.type != "text":
            raise _bad(f"message content of type {part.type!r} is not supported (text only)", "messages")
        parts.append(part.text or "")
    return "".join(parts)


def _token_text(tok, i: int) -> tuple[str, list[int]]:
    b = tok.token_bytes(i)
    return b.decode("utf-8", errors="replace"), list(b)


# -- the app -------------------------------------------------------------------------------------

def create_app(st: State) -> FastAPI:
    app = FastAPI(title="memra", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.memra = st
    tok = st.tok
    # the most bytes of text one token stands for (every vocabulary entry's UTF-8 length bounds it: byte-level
    # and byte-fallback entries spell a byte with more than one): a prompt of more than ctx x this many bytes cannot
    # fit, whatever its tokens, so it is refused before the (pure-Python) tokenizer spends seconds on it
    max_piece = max((len(t.encode("utf-8", "surrogatepass")) for t in tok.tokens), default=1)

    def _can_fit(texts, param: str) -> None:
        n = sum(len(t.strip().encode("utf-8", "surrogatepass")) for t in texts)
        if n > st.ctx * max_piece:
            raise _bad(f"the prompt's {n} bytes cannot fit the context of {st.ctx} tokens (a token holds at most "
                       f"{max_piece} bytes): shorten it or raise --ctx-size", param, "context_length_exceeded")

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        if st.keys.check(request.headers.get("authorization")) is None:  # the key before the body
            return _no_key().response()
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            msg, param = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(), None
        else:
            where = ".".join(loc) or "body"
            msg, param = f"{where}: {first.get('msg', 'invalid')}", (loc[0] if loc else None)
        return _bad(msg, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("internal error")
        return APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error").response()

    def _no_key() -> APIError:
        return APIError(401, "a valid API key is required: Authorization: Bearer KEY", "invalid_request_error",
                        code="invalid_api_key")

    async def tenant(request: Request) -> str:
        who = st.keys.check(request.headers.get("authorization"))
        if who is None:
            raise _no_key()
        return who

    # -- health, models, metrics -------------------------------------------------------------
    @app.get("/health")
    async def health():
        if st.phase in ("ready", "draining"):
            return {"status": "ok", "model": st.alias, "device": st.device_name, "phase": st.phase}
        return APIError(503, "the model is loading" if st.phase == "loading" else f"the engine failed: {st.error}",
                        "service_unavailable", code=st.phase, retry_after=5).response()

    @app.get("/readyz")
    async def readyz():
        if st.phase == "ready":
            return {"status": "ready"}
        return APIError(503, f"not ready: {st.phase}", "service_unavailable", code=st.phase,
                        retry_after=5).response()

    @app.get("/metrics")
    async def metrics(request: Request):
        if st.keys.enabled:
            await tenant(request)
        return PlainTextResponse(st.metrics.render(), media_type=CONTENT_TYPE)

    def _model_card() -> dict:
        return {"id": st.alias, "object": "model", "created": st.created, "owned_by": "memra", "max_model_len": st.ctx}

    @app.get("/v1/models")
    async def models(who: str = Depends(tenant)):
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, who: str = Depends(tenant)):
        st.check_model(model_id)
        return _model_card()

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody, who: str = Depends(tenant)):
        ids = await asyncio.to_thread(tok.encode, body.content, add_special=body.add_special,
                                      parse_special=body.parse_special)
        if body.with_pieces:
            return {"tokens": [{"id": i, "piece": _token_text(tok, i)[0]} for i in ids]}
        return {"tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody, who: str = Depends(tenant)):
        bad = [t for t in body.tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise _bad(f"token id {bad[0]} is outside the vocabulary [0, {tok.n_vocab})", "tokens")
        return {"content": tok.decode(body.tokens)}

    # -- generation ------------------------------------------------------------------------------
    def _submit(req: GenRequest, limit_name: str = "max_tokens") -> None:
        try:
            st.sched.submit(req)
        except QueueFull as e:
            raise APIError(429, str(e), "rate_limit_exceeded", code="queue_full", retry_after=1)
        except ContextOverflowError as e:  # the prompt fits (checked before): with max_tokens it does not
            raise _bad(str(e), limit_name, "context_length_exceeded")
        except NeverFits as e:
            raise _bad(str(e), limit_name, "context_length_exceeded")
        except MemraError as e:
            raise _bad(str(e))

    async def _next(req: GenRequest, request: Request):
        """The request's next event; cancels it when its client is gone (checked every 0.5 s,
        whether or not events arrive meanwhile: a blocking request sends nothing until the end)."""
        while True:
            now = time.monotonic()
            if not req.t_client:
                req.t_client = now
            elif now - req.t_client >= 0.5:
                req.t_client = now
                if await request.is_disconnected():
                    st.sched.cancel(req)
                    return None
            try:
                return await asyncio.wait_for(req.queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    def _usage(u: dict) -> dict:
        return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}

    def _chat_lp(token: int, lp) -> dict:
        s, b = _token_text(tok, token)
        return {"token": s, "logprob": lp[0], "bytes": b,
                "top_logprobs": [{"token": _token_text(tok, i)[0], "logprob": v, "bytes": _token_text(tok, i)[1]}
                                 for i, v in lp[1]]}

    def _counts(token: int, req: GenRequest) -> bool:
        """Whether a token's log-prob is reported: every token but the one that ended the reply (an
        end-of-generation token, unless ignore_eos, or one of stop_token_ids: neither is in the text)."""
        return token not in req.params.stop_ids and (req.ignore_eos or token not in tok.eog_ids)

    async def _constraint(body: _GenBody, functions: dict):
        """The request's output constraint (None: free text); a 400 naming the problem when
        its schema, grammar or regex does not compile. tool_choice "required" or a named
        function is a grammar of tool calls (memra.text.tools.tool_lark)."""
        kind, spec, param = constraint_of(body)
        if functions and (body.tool_choice == "required" or isinstance(body.tool_choice, dict)):
            if kind is not None:
                raise _bad(f"tool_choice {body.tool_choice!r} forces a tool call: give no {param} with it", param)
            kind, param = "lark", "tools"
            spec = tool_lark(functions, forced_name(body.tool_choice, functions),
                             body.parallel_tool_calls is not False, style_of(st.gguf.metadata))
        if kind is None:
            return None
        try:
            return await asyncio.to_thread(_compiled, kind, spec)
        except (GrammarError, UnicodeError) as e:  # UnicodeError: a lone surrogate (JSON's \ud800)
            raise _bad(f"{param}: {e}", param, "invalid_constraint")

    def _compiled(kind, spec):
        key = (kind, spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True))
        with st.constraints_lock:
            c = st.constraints.get(key)
        if c is None:
            c = compile_constraint(tok, kind, spec)   # outside the lock: compiles run side by side
            with st.constraints_lock:
                if len(st.constraints) >= 256:
                    st.constraints.pop(next(iter(st.constraints)))
                st.constraints[key] = c
        return c

    async def _generate(request: Request, body: _GenBody, chat: bool, who: str):
        ready = await _prepare(request, body, chat, who)
        if ready is None:
            return _gone()
        chs, functions, think = ready
        rid = ("chatcmpl-" if chat else "cmpl-") + chs[0].req.id
        model = body.model or st.alias
        created = int(time.time())
        head = {"id": rid, "created": created, "model": model, "system_fingerprint": st.fingerprint}
        if body.stream:
            usage_chunk = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(chs, request, chat, head, usage_chunk, functions, think),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _blocking(chs, request, chat, head, functions, think)

    async def _prepare(request: Request, body: _GenBody, chat: bool, who: str):
        """A request checked, tokenized and its choices started: (choices, the declared tools when the
        reply may call them, the think split), or None when the client went away meanwhile. APIError
        for what is wrong with it."""
        st.require_serving()
        st.check_model(body.model)
        functions: dict = {}  # the declared tools when the reply may call them
        think = None  # chat: None keeps a think block in the content, else whether the prompt opened one
        n_choices = 1 if body.n is None else body.n
        if not 1 <= n_choices <= MAX_CHOICES:
            raise _bad(f"n must be in [1, {MAX_CHOICES}], got {n_choices}", "n")
        if chat:
            if not body.messages:
                raise _bad("messages must hold at least one message", "messages")
            fmt = body.reasoning_format
            if fmt is not None and fmt not in REASONING_FORMATS:
                raise _bad(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {fmt!r}",
                           "reasoning_format")
            try:
                functions = check_tools(body.tools or [], body.tool_choice)
            except ToolError as e:
                raise _bad(str(e), "tool_choice" if "tool_choice" in str(e) else "tools")
            if body.tool_choice == "none":
                functions = {}
            msgs = []
            for i, m in enumerate(body.messages):
                _check_message(i, m)
                for c in m.tool_calls or []:
                    if not isinstance(c.get("function", {}), dict):
                        raise _bad("messages: a tool_calls entry's function must be an object "
                                   "{\"name\", \"arguments\"}", "messages")
                d = {"role": "system" if m.role == "developer" else m.role,
                     "content": None if m.content is None and m.tool_calls else _content(m)}
                for k in ("tool_calls", "tool_call_id", "name"):
                    if getattr(m, k) is not None:
                        d[k] = getattr(m, k)
                msgs.append(d)
            msgs, tools_arg = tool_messages(st.gguf.metadata, msgs, body.tools if functions else None)
            _can_fit([m["content"] for m in msgs if isinstance(m.get("content"), str)], "messages")
            try:   # the tokenizer off the event loop: a long prompt must not stall the other clients
                prompt, rendered = await asyncio.to_thread(prompt_ids, st.gguf, tok, messages=msgs, tools=tools_arg)
            except APIError:
                raise
            except MemraError as e:
                raise _bad(f"messages: {e}", "messages")
            prompts = [prompt]
            if fmt != "none":
                think = prompt_opens_think(rendered)
            max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
            if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
                raise _bad(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {body.top_logprobs}",
                           "top_logprobs")
            if body.top_logprobs and not body.logprobs:
                raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
            logprobs = (body.top_logprobs or 0) if body.logprobs else None
        else:
            if body.suffix:
                raise _bad("suffix (insertion) is not supported by this server", "suffix")
            p = body.prompt
            # a string, a list of strings, token ids, or a list of token-id lists: one prompt each
            many = p if isinstance(p, list) and p and not isinstance(p[0], int) else [p]
            if len(many) * n_choices > MAX_CHOICES:
                raise _bad(f"prompt: {len(many)} prompts x n = {n_choices} are {len(many) * n_choices} choices; "
                           f"a request may ask for at most {MAX_CHOICES}", "prompt")
            for x in many:  # each prompt of a list is its own sequence: each must fit the context alone
                if isinstance(x, str):
                    _can_fit([x], "prompt")
            prompts = []
            for x in many:
                if isinstance(x, str):
                    prompts.append((await asyncio.to_thread(prompt_ids, st.gguf, tok, prompt=x))[0])
                    continue
                bad = [t for t in x if not 0 <= t < tok.n_vocab]
                if bad:
                    raise _bad(f"prompt token id {bad[0]} is outside the vocabulary [0, {tok.n_vocab})", "prompt")
                prompts.append(list(x))
            max_tokens = body.max_tokens if body.max_tokens is not None else 16  # OpenAI's default
            if body.logprobs is not None and not 0 <= body.logprobs <= MAX_TOP_LOGPROBS:
                raise _bad(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {body.logprobs}", "logprobs")
            logprobs = body.logprobs
        if not all(prompts):
            raise _bad("the prompt is empty after tokenization: give some text", "messages" if chat else "prompt")
        # a biased id must be a token of the tokenizer and a row of the logits; the longest prompt must fit
        params = _params(body, max_tokens, st.ctx, max(map(len, prompts)), min(tok.n_vocab, st.mcfg.n_vocab))
        constraint = await _constraint(body, functions)
        if constraint is not None and params.min_tokens:
            raise _bad("min_tokens cannot be combined with an output constraint or a forced tool call (the "
                       "grammar decides where the reply ends)", "min_tokens")
        if think and (constraint_of(body)[0] in ("json_object", "json_schema") or
                      functions and (body.tool_choice == "required" or isinstance(body.tool_choice, dict))):
            think = False  # a JSON constraint or a forced call is the whole reply: no thought in it
        ns = f"{who}\0{body.cache_salt or ''}"
        echo = not chat and bool(body.echo)
        share = st.sched.pc is not None and n_choices > 1
        # echo with logprobs: the prompt's log-probs, computed by a prompt's first choice when the others share it
        plp = logprobs if echo else None
        chs = [_Choice(i * n_choices + j, j, GenRequest(
                   x, _choice_params(params, j), namespace=ns, logprobs=logprobs, ignore_eos=bool(body.ignore_eos),
                   constraint=constraint, prompt_logprobs=plp if j == 0 or not share else None), echo=echo,
                   one_call=chat and body.parallel_tool_calls is False)  # a chat field only
               for i, x in enumerate(prompts) for j in range(n_choices)]
        if not await _start(chs, request, _limit_name(body), share):
            return None
        return chs, functions, think

    async def _start(chs: list, request: Request, limit_name: str, share: bool) -> bool:
        """Submit a request's choices. Sharing (n > 1 and the prefix cache), a prompt's first choice
        goes first and the others once it has its first event (its prompt's full blocks are cached
        by then; with echo and logprobs that event is the prompt's log-probs, which the others
        take from it), so they compute only the prompt's last partial block. Any refusal (429, 400)
        cancels what was submitted. False: the client went away meanwhile (everything cancelled)."""
        firsts = [c for c in chs if c.j == 0] if share else chs
        done: list = []
        try:
            for c in firsts:
                _submit(c.req, limit_name)
                done.append(c)
            if share:
                for c in firsts:
                    ev = await _next(c.req, request)
                    if ev is None:
                        _cancel(done)
                        return False
                    c.early.append(ev)
                    if ev[0] == "prompt":  # the prompt's log-probs, for its other choices too
                        for o in chs:
                            if o.j and o.index - o.j == c.index:
                                o.early.append(ev)
                for c in chs:
                    if c.j:
                        _submit(c.req, limit_name)
                        done.append(c)
        except BaseException:
            _cancel(done)
            raise
        return True

    def _cancel(chs: list) -> None:
        for c in chs:
            if c.req.finish is None:
                st.sched.cancel(c.req)

    async def _next_of(c: "_Choice", request: Request):
        return c.early.pop(0) if c.early else await _next(c.req, request)

    def _gone() -> JSONResponse:
        return JSONResponse({"error": {"message": "client disconnected", "type": "aborted", "param": None,
                                       "code": None}}, status_code=499)

    def _total(chs: list, usages: list) -> dict:
        """The response's usage: each prompt once (its first choice's count and cache hits), every
        choice's completion tokens."""
        firsts = [u for c, u in zip(chs, usages) if c.j == 0]
        return _usage({"prompt_tokens": sum(u["prompt_tokens"] for u in firsts),
                       "cached_tokens": sum(u["cached_tokens"] for u in firsts),
                       "completion_tokens": sum(u["completion_tokens"] for u in usages)})

    async def _blocking(chs, request, chat, head, functions=None, think=None):
        tasks = [asyncio.ensure_future(_blocking_choice(c, request, chat, functions, think)) for c in chs]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            _cancel(chs)
            raise
        if any(r is None for r in results):
            _cancel(chs)
            return _gone()
        return {**head, "object": "chat.completion" if chat else "text_completion",
                "choices": [r[0] for r in results], "usage": _total(chs, [r[1] for r in results])}

    async def _blocking_choice(c, request, chat, functions=None, think=None):
        """(choice, usage) of one choice read to its end; None when the client went away."""
        req = c.req
        pieces, lps, offs = [], [], []
        plps = None  # the prompt's log-probs (echo with logprobs)
        try:
            while True:
                ev = await _next_of(c, request)
                if ev is None:
                    return None
                if ev[0] == "token":
                    _, token, text, released = ev
                    for t, v, o in released:
                        if _counts(t, req):
                            lps.append((t, v))
                            offs.append(o)
                    pieces.append(text)
                elif ev[0] == "prompt":
                    plps = ev[1]
                elif ev[0] == "error":
                    raise APIError(500, ev[1], "server_error")
                else:
                    _, finish, usage = ev
                    break
        finally:
            if req.finish is None:
                st.sched.cancel(req)
        text = "".join(pieces)
        if chat:
            reasoning = None
            if think is not None:  # tool calls are parsed from the content after the think block
                reasoning, text = split_reasoning(text, think)
            message = {"role": "assistant", "content": text, "refusal": None}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            calls, content = parse_tool_calls(text, functions, not c.one_call) if functions else ([], text)
            if calls:
                message.update(content=content, tool_calls=calls)
                finish = "tool_calls" if finish == "stop" else finish
            choice = {"index": c.index, "message": message,
                      "logprobs": None if req.logprobs is None else
                      {"content": [_chat_lp(t, lp) for t, lp in lps], "refusal": None},
                      "finish_reason": finish}
        else:
            lp = None if req.logprobs is None else _completion_lp(lps, offs)
            if c.echo:  # the prompt's text first, its tokens' log-probs before the reply's
                ptext, plp = _echo(req.prompt, plps)
                text = ptext + text
                if lp is not None:
                    lp = _completion_lp_join(plp, lp, len(ptext))
            choice = {"index": c.index, "text": text, "finish_reason": finish, "logprobs": lp}
        return choice, usage

    def _echo(prompt: list[int], plps) -> tuple[str, dict | None]:
        """A prompt's text (the ids detokenized as replies are) and, given its ("prompt", entries) log-probs,
        their completions logprobs object (the first token's log-prob is null, as is its top)."""
        dec = tok.stream(skip_special=True)
        text, offs = "", []
        for t in prompt:
            offs.append(len(text))
            text += dec.push(t)
        text += dec.flush()
        if plps is None:
            return text, None
        return text, _completion_lp(list(plps), offs)

    def _completion_lp_join(a: dict | None, b: dict, shift: int) -> dict:
        """Completions logprobs a (the prompt's) then b (the reply's, its offsets shifted past the prompt's text)."""
        b = {**b, "text_offset": [o + shift for o in b["text_offset"]]}
        return b if a is None else {k: a[k] + b[k] for k in b}

    def _delta(reasoning: str, content: str) -> dict:
        """A chat delta: reasoning_content while inside a think block, content after it."""
        if not reasoning:
            return {"content": content}
        return {"reasoning_content": reasoning, **({"content": content} if content else {})}

    def _completion_lp(lps, offs) -> dict:
        """Completions logprobs of (token, (logprob, top) or None) pairs."""
        return {"tokens": [_token_text(tok, t)[0] for t, _ in lps],
                "token_logprobs": [None if lp is None else lp[0] for _, lp in lps],
                "top_logprobs": [None if lp is None else {_token_text(tok, i)[0]: v for i, v in lp[1]} for _, lp in lps],
                "text_offset": list(offs)}

    async def _sse(chs, request, chat, head, usage_chunk, functions=None, think=None):
        obj = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if usage_chunk else {}

        def chunk(choice: dict | None, usage: dict | None = None) -> str:
            doc = {**head, "object": obj, "choices": [] if choice is None else [choice], **extra}
            if usage is not None:
                doc["usage"] = usage
            return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n"

        usages: dict = {}
        gens = [_sse_choice(c, request, chat, functions, think) for c in chs]
        merged = gens[0] if len(gens) == 1 else _merge(gens)
        try:
            async for item in merged:
                if item[0] == "chunk":
                    yield chunk(item[1])
                elif item[0] == "done":
                    usages[item[1]] = item[2]
                elif item[0] == "error":
                    err = {"error": {"message": item[1], "type": "server_error", "param": None, "code": None}}
                    yield f"data: {json.dumps(err)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                else:  # the client went away
                    return
            if usage_chunk:
                yield chunk(None, _total(chs, [usages[c.index] for c in chs]))
            yield "data: [DONE]\n\n"
        finally:
            await merged.aclose()
            _cancel(chs)

    async def _merge(gens):
        """The items of several async generators as they come (each generator's in its order)."""
        q: asyncio.Queue = asyncio.Queue()

        async def pump(g):
            try:
                async for item in g:
                    await q.put(item)
            except Exception as e:  # a choice's failure ends the response as an error
                await q.put(("error", f"{type(e).__name__}: {e}"))
            finally:
                await q.put(None)

        tasks = [asyncio.ensure_future(pump(g)) for g in gens]
        try:
            left = len(tasks)
            while left:
                item = await q.get()
                if item is None:
                    left -= 1
                else:
                    yield item
        finally:  # the pumps end (each choice's own finally cancels its generation if unfinished)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sse_choice(c, request, chat, functions=None, think=None):
        """One choice's stream: ("chunk", choice) items, then ("done", index, usage), ("error",
        message) or ("gone",) when the client went away."""
        req, idx = c.req, c.index
        full, sent = "", 0  # with tools: the content so far, and how much of it went out
        rs = ReasoningStream(think) if chat and think is not None else None  # the <think> split
        base = 0  # echo: the reply's text offsets begin after the prompt's text
        try:
            if chat:
                yield "chunk", {"index": idx, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}
            if c.echo and req.logprobs is None:  # the prompt's text at once (with logprobs: when they come)
                ptext, _ = _echo(req.prompt, None)
                base = len(ptext)
                yield "chunk", {"index": idx, "text": ptext, "logprobs": None, "finish_reason": None}
            while True:
                ev = await _next_of(c, request)
                if ev is None:
                    yield ("gone",)
                    return
                if ev[0] == "prompt":
                    ptext, plp = _echo(req.prompt, ev[1])
                    base = len(ptext)
                    yield "chunk", {"index": idx, "text": ptext, "logprobs": plp, "finish_reason": None}
                    continue
                if ev[0] == "token":
                    _, token, text, released = ev
                    group = [(t, v, o) for t, v, o in released if _counts(t, req)]
                    has_lp = bool(group)
                    if not text and not has_lp:
                        continue
                    reasoning = ""
                    if rs is not None:  # reasoning flows while inside the block; tags are held
                        reasoning, text = rs.push(text)
                    if chat and functions:
                        # content flows until a tool call may have begun; the rest waits for the end
                        full += text
                        end = may_start_call(full)
                        text, sent = full[sent:max(end, sent)], max(end, sent)
                    if not text and not reasoning and not has_lp:
                        continue
                    if chat:
                        yield "chunk", {"index": idx, "delta": _delta(reasoning, text),
                                        "logprobs": {"content": [_chat_lp(t, v) for t, v, _ in group],
                                                     "refusal": None} if has_lp else None,
                                        "finish_reason": None}
                    else:
                        yield "chunk", {"index": idx, "text": text, "finish_reason": None,
                                        "logprobs": _completion_lp([(t, v) for t, v, _ in group],
                                                                   [base + o for *_, o in group]) if has_lp else None}
                elif ev[0] == "error":
                    yield "error", ev[1]
                    return
                else:
                    _, finish, usage = ev
                    if rs is not None:
                        reasoning, rest = rs.flush()
                        if functions:
                            full, rest = full + rest, ""
                        if reasoning or rest:
                            yield "chunk", {"index": idx, "delta": _delta(reasoning, rest), "logprobs": None,
                                            "finish_reason": None}
                    if chat and functions:
                        calls, content = parse_tool_calls(full, functions, not c.one_call)
                        rest = full[sent:]
                        if calls:  # the content around the calls, less what went out before them
                            done, content = full[:sent].lstrip(), content or ""
                            rest = content[len(done):] if content.startswith(done.rstrip()) else ""
                        if rest:
                            yield "chunk", {"index": idx, "delta": {"content": rest}, "logprobs": None,
                                            "finish_reason": None}
                        for i, call in enumerate(calls):
                            f = call["function"]
                            yield "chunk", {"index": idx, "logprobs": None, "finish_reason": None, "delta": {
                                "tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                "function": {"name": f["name"], "arguments": ""}}]}}
                            yield "chunk", {"index": idx, "logprobs": None, "finish_reason": None, "delta": {
                                "tool_calls": [{"index": i, "function": {"arguments": f["arguments"]}}]}}
                        if calls and finish == "stop":
                            finish = "tool_calls"
                    if chat:
                        yield "chunk", {"index": idx, "delta": {}, "logprobs": None, "finish_reason": finish}
                    else:
                        yield "chunk", {"index": idx, "text": "", "logprobs": None, "finish_reason": finish}
                    yield "done", idx, usage
                    return
        finally:
            if req.finish is None:
                st.sched.cancel(req)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request, who: str = Depends(tenant)):
        return await _generate(request, body, True, who)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request, who: str = Depends(tenant)):
        return await _generate(request, body, False, who)

    @app.post("/v1/responses")
    async def responses(body: ResponsesBody, request: Request, who: str = Depends(tenant)):
        """OpenAI's Responses API, run as the chat completion it stands for (memra.serve.responses)."""
        try:
            chat_body = ChatBody(**chat_request(body))
            ready = await _prepare(request, chat_body, True, who)
        except RequestError as e:
            raise _bad(str(e), e.param)
        except ValidationError as e:  # a field passed through (top_k, stop, ...) of the wrong type names itself
            first = (e.errors() or [{}])[0]
            loc = [str(x) for x in first.get("loc", ())] or ["messages"]
            param = RESPONSES_PARAMS.get(loc[0], loc[0])
            where = param if loc[0] == "messages" else ".".join(loc)  # the messages are not input's items
            raise _bad(f"{where}: {first.get('msg', 'invalid')}", param)
        except APIError as e:  # named by the Responses field the chat field came from
            if e.param:
                e.param = RESPONSES_PARAMS.get(e.param.split("[")[0].split(".")[0], e.param)
            raise
        if ready is None:
            return _gone()
        chs, functions, think = ready
        c = chs[0]
        rid, created, model = "resp_" + c.req.id, int(time.time()), body.model or st.alias
        if body.stream:
            return StreamingResponse(_responses_sse(c, request, functions, think,
                                                    EventStream(rid, created, model, body)),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            got = await _blocking_choice(c, request, True, functions, think)
        finally:
            _cancel([c])
        if got is None:
            return _gone()
        choice, usage = got
        return Response(dumps(response_object(rid, created, model, body, output_items(choice["message"], choice["logprobs"]),
                                              finish=choice["finish_reason"], usage=usage_of(_total([c], [usage])))),
                        media_type="application/json")

    async def _responses_sse(c, request, functions, think, es: EventStream):
        finish = None
        gen = _sse_choice(c, request, True, functions, think)
        try:
            yield es.start()
            async for item in gen:
                if item[0] == "chunk":
                    finish = item[1].get("finish_reason") or finish
                    text = es.feed(item[1].get("delta") or {}, item[1].get("logprobs"))
                    if text:
                        yield text
                elif item[0] == "done":
                    yield es.end(finish, _total([c], [item[2]]))
                    return
                elif item[0] == "error":
                    yield es.fail(item[1])
                    return
                else:  # the client went away
                    return
        finally:
            await gen.aclose()
            _cancel([c])

    return app


# -- running it ----------------------------------------------------------------------------------

class Server:
    """The process: uvicorn serving the app, the engine loading on a thread, the drain."""

    def __init__(self, cfg: ServeConfig):
        import uvicorn

        self.cfg = cfg
        self.state = State(cfg)
        self.app = create_app(self.state)
        outer = self

        class _Uvicorn(uvicorn.Server):
            def handle_exit(self, sig, frame):  # SIGTERM / SIGINT: drain first, a second one: now
                outer._signal(sig)

            async def startup(self, sockets=None):
                await super().startup(sockets)
                outer._loop = asyncio.get_running_loop()
                outer._started.set()

        self._sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((cfg.host, cfg.port))
        except OverflowError:
            self._sock.close()
            raise MemraError(f"cannot listen on {cfg.host}:{cfg.port}: a port is 0..65535") from None
        except OSError as e:
            self._sock.close()
            raise MemraError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}") from None
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                lifespan="off")
        self.uv = _Uvicorn(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._signals = 0
        self._drain_task = None
        self.exit_code = 0

    @property
    def url(self) -> str:
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}"

    def _engine_main(self) -> None:
        try:
            self.state.run_engine()
        except Exception:
            self.exit_code = 1
            if self._loop is not None:
                self._loop.call_soon_threadsafe(setattr, self.uv, "should_exit", True)
            else:
                self.uv.should_exit = True

    def _signal(self, sig) -> None:
        self._signals += 1
        if self._signals > 1 or self._loop is None:
            self.uv.should_exit = True
            self.uv.force_exit = self._signals > 2
            return
        self._loop.call_soon_threadsafe(self.drain)

    def drain(self) -> None:
        """Stop taking requests, let the running ones finish (--drain-timeout), then exit."""
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        st = self.state
        if st.phase == "ready":
            st.phase = "draining"
        log.warning("draining: %d running, %d waiting; at most %.0f s", st.sched.n_running if st.sched else 0,
                    st.sched.n_waiting if st.sched else 0, self.cfg.drain_timeout)
        t_end = time.monotonic() + self.cfg.drain_timeout
        while st.sched is not None and not st.sched.idle and time.monotonic() < t_end:
            await asyncio.sleep(0.05)
        if st.sched is not None and not st.sched.idle:
            log.warning("drain timeout: cancelling what still runs")
            for r in list(st.sched.running) + list(st.sched.waiting):
                st.sched.cancel(r)
        await asyncio.sleep(0.2)  # the last chunks reach their clients
        self.uv.should_exit = True

    def _shutdown(self) -> None:
        if self.state.sched is not None:
            self.state.sched.stop()

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT has drained the server; the exit code."""
        self._engine = threading.Thread(target=self._engine_main, name="memra-engine", daemon=True)
        self._engine.start()
        try:
            self.uv.run(sockets=[self._sock])
        finally:
            self._shutdown()
        return self.exit_code

    def start_in_thread(self, load: bool = True, timeout: float = 600.0) -> "Server":
        """Serve from background threads (tests): uvicorn at once, then (load) the engine
        thread, waiting until it is ready."""
        self._thread = threading.Thread(target=lambda: self.uv.run(sockets=[self._sock]), name="memra-uvicorn",
                                        daemon=True)
        self._thread.start()
        self._started.wait(30)
        if load:
            self.start_engine(timeout)
        return self

    def start_engine(self, timeout: float = 600.0) -> None:
        self._engine = threading.Thread(target=self._engine_main, name="memra-engine", daemon=True)
        self._engine.start()
        t_end = time.monotonic() + timeout
        while self.state.phase == "loading" and time.monotonic() < t_end:
            time.sleep(0.02)
        if self.state.phase != "ready":
            raise MemraError(f"the server did not become ready: {self.state.phase} {self.state.error or ''}")

    def stop(self) -> None:
        self.uv.should_exit = True
        if getattr(self, "_thread", None) is not None:
            self._thread.join(30)
        self._shutdown()
        if getattr(self, "_engine", None) is not None:
            self._engine.join(30)
