"""`memra serve` (the OpenAI-compatible server) and `memra bench serve` (its load generator),
registered on memra.cli.common.app. Every flag of `memra serve` can also be set through the
MEMRA_* variable its help names.

`memra bench` stays the command it is (llama-bench's cells); this module turns it into a
group whose default is that command, so `memra bench MODEL …` works as before and `memra
bench serve …` is the server benchmark.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from memra.cli.common import CacheTypeK, CacheTypeV, pick_device, app, check_cache_types, command, err, log
from memra.errors import MemraError

_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "kib": 2 ** 10, "m": 10 ** 6, "mb": 10 ** 6, "mib": 2 ** 20,
          "g": 10 ** 9, "gb": 10 ** 9, "gib": 2 ** 30, "t": 10 ** 12, "tb": 10 ** 12, "tib": 2 ** 40}


def parse_bytes(text: str | None) -> int | None:
    """'8GiB', '512MiB', '2e9', '1000000' -> bytes."""
    if text is None or str(text).strip() == "":
        return None
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise MemraError(f"--kv-memory takes bytes such as 8GiB, 512MiB or 2e9, got {text!r}")
    try:
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    except ValueError:
        raise MemraError(f"--kv-memory takes bytes such as 8GiB, 512MiB or 2e9, got {text!r}") from None
    if n < 1:
        raise MemraError(f"--kv-memory must be positive, got {text!r}")
    return int(n)


@app.command()
@command
def serve(
    model: Annotated[Optional[str], typer.Argument(envvar="MEMRA_MODEL", show_default=False,
                                                   help="GGUF path or alias (default: smollm2-135m). "
                                                        "[env MEMRA_MODEL]")] = None,
    host: Annotated[str, typer.Option("--host", envvar="MEMRA_HOST", help="Address to listen on; anything but "
                                      "loopback needs --api-key. [env MEMRA_HOST]")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="MEMRA_PORT", help="TCP port (0: any free one). "
                                      "[env MEMRA_PORT]")] = 8080,
    alias: Annotated[Optional[str], typer.Option("--alias", envvar="MEMRA_ALIAS", help="The model name clients "
                                                 "use (default: MODEL as given). [env MEMRA_ALIAS]")] = None,
    api_key: Annotated[Optional[list[str]], typer.Option("--api-key", envvar="MEMRA_API_KEY", help="A bearer key "
                                                         "clients must send (repeatable; the variable takes "
                                                         "keys separated by spaces). [env MEMRA_API_KEY]")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option("--api-key-file", envvar="MEMRA_API_KEY_FILE",
                                                         help="A file of keys, one a line (# comments). "
                                                              "[env MEMRA_API_KEY_FILE]")] = None,
    device: Annotated[Optional[str], typer.Option("--device", envvar="MEMRA_DEVICE", help="gpu or cpu (default: "
                                                  "gpu when there is one). [env MEMRA_DEVICE]")] = None,
    ctx_size: Annotated[Optional[int], typer.Option("--ctx-size", "-c", envvar="MEMRA_CTX_SIZE",
                                                    help="Positions per sequence: prompt + generated tokens "
                                                         "(default: the model's training context, at most "
                                                         "4096). [env MEMRA_CTX_SIZE]")] = None,
    parallel: Annotated[Optional[int], typer.Option("--parallel", "-np", envvar="MEMRA_PARALLEL",
                                                    help="Sequences running at once (default gpu 64, cpu 4). "
                                                         "[env MEMRA_PARALLEL]")] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", envvar="MEMRA_MAX_QUEUE", help="Requests that may "
                                           "wait for admission; more get 429 with Retry-After. "
                                           "[env MEMRA_MAX_QUEUE]")] = 256,
    kv_memory: Annotated[Optional[str], typer.Option("--kv-memory", envvar="MEMRA_KV_MEMORY", help="Bytes of KV "
                                                     "cache (e.g. 16GiB; default: --parallel x --ctx-size "
                                                     "positions, on the GPU at most 90 % of free memory). "
                                                     "[env MEMRA_KV_MEMORY]")] = None,
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    max_batched_tokens: Annotated[Optional[int], typer.Option("--max-num-batched-tokens",
                                                              envvar="MEMRA_MAX_NUM_BATCHED_TOKENS",
                                                              help="Token budget of one scheduler step: decode "
                                                                   "rows plus prefill chunks (default gpu "
                                                                   "2048, cpu 64). "
                                                                   "[env MEMRA_MAX_NUM_BATCHED_TOKENS]")] = None,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", envvar="MEMRA_DRAIN_TIMEOUT",
                                                 help="Seconds running requests get to finish after SIGTERM. "
                                                      "[env MEMRA_DRAIN_TIMEOUT]")] = 30.0,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", envvar="MEMRA_THREADS",
                                                   help="CPU threads of the cpu engine (default: all cores). "
                                                        "[env MEMRA_THREADS]")] = None,
    spec: Annotated[Optional[str], typer.Option("--spec", envvar="MEMRA_SPEC", help="Speculative decoding "
                                                "while few requests decode (the same tokens): lookup[:N1-N2], "
                                                "trim[:L] or draft:PATH. [env MEMRA_SPEC]")] = None,
    spec_k: Annotated[Optional[str], typer.Option("--spec-k", envvar="MEMRA_SPEC_K", show_default=False,
                                                  help="Draft length with --spec: 1..32 or auto. [default: "
                                                       "auto] [env MEMRA_SPEC_K]")] = None,
    spec_max_batch: Annotated[Optional[int], typer.Option("--spec-max-batch", envvar="MEMRA_SPEC_MAX_BATCH",
                                                          show_default=False,
                                                          help="Speculate while at most this many requests "
                                                               "decode; more take plain batched decode rows. "
                                                               "[default: 1] [env MEMRA_SPEC_MAX_BATCH]")] = None,
) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health,
    /readyz, /metrics, /tokenize, /detokenize) with continuous batching and a prefix cache."""
    from memra.serve.api import ServeConfig, Server
    from memra.serve.auth import load_keys

    device = pick_device(device)
    check_cache_types(device, cache_type_k, cache_type_v)
    if device == "gpu":
        from memra.gpu import cuda

        if not cuda.has_gpu():
            raise MemraError("--device gpu: no NVIDIA GPU (or driver) found on this machine; use --device cpu")
    if threads is not None:
        if threads < 1:
            raise MemraError(f"-t/--threads must be at least 1, got {threads}")
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    keys = load_keys([k for item in api_key or [] for k in item.split()], api_key_file)
    if not drain_timeout >= 0:  # nan too
        raise MemraError(f"--drain-timeout must be >= 0, got {drain_timeout}")
    if spec is not None:  # a bad --spec fails before any model is read
        from memra.spec.decode import parse_k
        from memra.spec.drafters import parse_spec

        parse_spec(spec)
        parse_k(spec_k)
    else:  # were silently ignored
        for flag, v in (("--spec-k", spec_k), ("--spec-max-batch", spec_max_batch)):
            if v is not None:
                raise MemraError(f"{flag} tunes speculative decoding: it needs --spec")
    spec_k = "auto" if spec_k is None else spec_k
    spec_max_batch = 1 if spec_max_batch is None else spec_max_batch
    cfg = ServeConfig(model=model, host=host, port=port, alias=alias, api_keys=keys, device=device,
                      ctx_size=ctx_size, parallel=parallel, max_queue=max_queue, kv_memory=parse_bytes(kv_memory),
                      max_batched_tokens=max_batched_tokens, drain_timeout=drain_timeout, spec=spec,
                      spec_k=spec_k, spec_max_batch=spec_max_batch, cache_type_k=cache_type_k,
                      cache_type_v=cache_type_v)
    server = Server(cfg)
    print(f"memra serve: {server.state.alias} on {device} at {server.url} (loading; /readyz turns 200 when "
          f"ready)", file=sys.stderr, flush=True)

    def ready(st) -> None:
        kv = st.engine.kv
        types = "" if (kv.cache_type_k, kv.cache_type_v) == ("f16", "f16") else \
            f" (K {kv.cache_type_k}, V {kv.cache_type_v})"
        print(f"memra serve: ready at {server.url}: context {st.ctx}, {st.parallel} sequences, KV cache "
              f"{kv.alloc.n_blocks} blocks of {kv.block} tokens{types}, keys {'on' if st.keys.enabled else 'off'}",
              file=sys.stderr, flush=True)

    server.state.on_ready = ready
    rc = server.run()
    if rc:
        raise typer.Exit(rc)


# -- memra bench serve -------------------------------------------------------------------------------

class _BenchGroup(TyperGroup):
    """`memra bench serve …` is the server benchmark; anything else is `memra bench`'s own
    command (llama-bench's cells), as before."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["cells", *args]
        return super().parse_args(ctx, args)


def _regroup_bench() -> None:
    """Move the registered `memra bench` command under a group with `serve` beside it."""
    found = [c for c in app.registered_commands if (c.name or c.callback.__name__) == "bench"]
    if not found:
        return
    info = found[0]
    app.registered_commands.remove(info)
    group = typer.Typer(cls=_BenchGroup, add_completion=False, pretty_exceptions_enable=False,
                        help=(info.callback.__doc__ or "").strip().split("\n")[0] +
                        " `memra bench serve` loads an OpenAI-compatible server.")
    group.command("cells", hidden=True, help=info.callback.__doc__)(info.callback)
    group.command("serve")(bench_serve)
    app.add_typer(group, name="bench")


@command
def bench_serve(
    target: Annotated[Optional[str], typer.Argument(help="A loopback server URL (http://127.0.0.1:8080), or a "
                                                    "model (GGUF path, alias, synth:SHAPE:QUANT) that `memra "
                                                    "serve` is started on for the run (default: "
                                                    "smollm2-135m).")] = None,
    vs: Annotated[Optional[str], typer.Option("--vs", help="Another OpenAI-compatible server on loopback "
                                              "(e.g. llama-server), driven alternately in the same run.")] = None,
    concurrency: Annotated[Optional[list[str]], typer.Option("-c", "--concurrency", help="Requests in flight "
                                                             "(comma list).")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests per cell (default: 2 x the "
                                                    "concurrency, at least 16).")] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length in tokens (each "
                                               "request its own text).")] = 100,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens generated per request "
                                            "(ignore_eos).")] = 128,
    rounds: Annotated[int, typer.Option("--rounds", help="Repetitions of each cell, A/B interleaved.")] = 1,
    device: Annotated[Optional[str], typer.Option("--device", help="With a MODEL: the device `memra serve` "
                                                  "uses (default: gpu when there is one).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Receipts file (appended). Default: "
                                                "$MEMRA_HOME/receipts/serve-bench-<date>.jsonl.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Free text stored in every receipt.")] = None,
    synth_tokenizer: Annotated[str, typer.Option("--synth-tokenizer", help="Alias or GGUF whose tokenizer a "
                                                 "synth: model copies.")] = "smollm2-135m",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take.")] = 600.0,
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
) -> None:
    """Streamed completions at each concurrency against memra (and --vs another server):
    output tok/s, requests/s, TTFT, TPOT and ITL p50/p95/p99 (vllm bench serve's
    definitions), one receipt per server and cell."""
    from memra.serve import bench as SB

    cs = []
    for v in (v.strip() for item in concurrency or ["1,8,32,64"] for v in item.split(",")):
        if v and not re.fullmatch(r"[0-9]+", v):
            raise MemraError(f"-c takes request counts >= 1 (e.g. 1,8,32), got {v!r}")
        cs += [int(v)] if v else []
    if not cs or min(cs) < 1:
        raise MemraError(f"-c takes request counts >= 1, got {cs}")
    if rounds < 1 or prompt_tokens < 1 or max_tokens < 1:
        raise MemraError("--rounds, --prompt-tokens and --max-tokens must be at least 1")
    if requests is not None and requests < 1:  # 0 used to mean the default, -1 failed on an empty cell
        raise MemraError(f"--requests must be at least 1, got {requests}")
    if not 0 < timeout < float("inf"):  # nan too
        raise MemraError(f"--timeout must be a positive number of seconds, got {timeout}")
    device = pick_device(device)
    model_path = None
    if not (target and target.split(":", 1)[0] in ("http", "https")):
        check_cache_types(device, cache_type_k, cache_type_v)  # the server started here takes them
        from memra.tune.bench import resolve_model

        target, model_path = resolve_model(target or "smollm2-135m", synth_tokenizer)
    rows = SB.run_bench(target, model_path=model_path, vs=vs, concurrency=cs, requests=requests, prompt_tokens=prompt_tokens,
                        max_tokens=max_tokens, rounds=rounds, device=device, out=out, tag=tag,
                        cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                        timeout=timeout, log=lambda s: print(s, file=sys.stderr,
                                                                                               flush=True))
    SB.print_table(rows, err)
    log.info("%d receipts", len(rows))


_regroup_bench()
