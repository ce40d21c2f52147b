"""`memra bench` and `memra kernel-check` (registered on memra.cli.common.app). Data on stdout,
the gate line, the results table and logs on stderr, as everywhere in the CLI."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from memra.cli.common import _fail, app, command, err, log
from memra.errors import CudaError, MemraError


def _csv(values: Optional[list[str]]) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


# -- kernel-check -------------------------------------------------------------------------------

@app.command("kernel-check")
@command
def kernel_check(
    only: Annotated[Optional[str], typer.Option("--only", help="Only these kernel families "
                                                "(comma-separated: matvec, embed, norm, rope, attention, act, "
                                                "sample).")] = None,
    compile_only: Annotated[bool, typer.Option("--compile-only", help="Compile every kernel and variant "
                                               "with NVRTC for sm_90a, sm_120a and sm_89; needs no GPU.")] = False,
    arch: Annotated[Optional[list[str]], typer.Option("--arch", help="With --compile-only: only these "
                                                      "targets (e.g. sm_90a; comma-separated or "
                                                      "repeated).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs (default: "
                                                "fresh each run; the one used is printed).")] = None,
) -> None:
    """Check every kernel and variant against its CPU reference; ends ALL GREEN or exits 1."""
    from memra.tune.kernelcheck import all_green, run_kernel_check

    archs = _csv(arch) or None
    if archs and not compile_only:
        raise MemraError("--arch applies to --compile-only (on a GPU the kernels are built for its own arch)")
    for a in archs or []:
        if not re.fullmatch(r"sm_\d{2,3}[a-z]?", a):
            raise MemraError(f"--arch {a!r} is not an NVRTC target such as sm_90a, sm_120a or sm_89")
    lines = []
    for line in run_kernel_check(only=only, compile_only=compile_only, seed=seed, archs=archs):
        print(line, flush=True)
        lines.append(line)
    if not all_green(lines):
        raise typer.Exit(1)


# -- bench --------------------------------------------------------------------------------------

def _open_table(which: str, info):
    """(table, label) for --table: auto (exact device → same cc → built-in), builtin, or a file."""
    from memra.tune.tables import resolve_table

    table, source = resolve_table(which, info.name, info.cc, sms=info.sm_count)
    return table, ("builtin" if source == "builtin" else f"{source}:{table['path']}")


def _engine(path: Path, n_ctx: int, table: dict, label: str):
    """The GPU engine on `path`, running the tuning table `table` (already resolved, so the
    receipts' label names exactly what ran)."""
    from memra.gpu.engine import GPUEngine

    return GPUEngine(path, n_ctx=n_ctx, tune_table=table), label


def _ratio_key(r: dict) -> tuple:
    return r["n_prompt"], r["n_gen"], r["n_depth"]


def _print_table(rows: list[dict]) -> None:
    llama = {_ratio_key(r): r for r in rows if r["engine"] == "llama.cpp"}
    cols = ["engine", "model", "test", "t/s median", "± sd", "mean", "GB/s", "% bw"] + (["× llama.cpp"] if llama else [])
    t = Table(header_style="bold", box=None, pad_edge=False)
    for c in cols:
        t.add_column(c, justify="left" if c in ("engine", "model", "test") else "right", no_wrap=True)
    for r in rows:
        other = llama.get(_ratio_key(r)) if r["engine"] == "memra" else None
        cells = [r["engine"], r["model"], r["test"], f"{r['median_ts']:.2f}", f"{r['stddev_ts']:.2f}",
                 f"{r['avg_ts']:.2f}", "-" if r["gbps"] is None else f"{r['gbps']:.0f}",
                 "-" if r["pct_bw"] is None else f"{r['pct_bw']:.1f}"]
        if llama:
            cells.append(f"{r['median_ts'] / other['median_ts']:.2f}" if other else "")
        t.add_row(*cells)
    # captured output (a device run's log) is not cut at rich's 80-column default
    (err if err.is_terminal else Console(stderr=True, highlight=False, width=200)).print(t)


@app.command()
@command
def bench(
    model: Annotated[str, typer.Argument(help="GGUF path, alias (smollm2-135m, gemma3-270m) or a "
                                         "synthetic model synth:SHAPE:QUANT (e.g. synth:llama3-8b:Q4_K_M).")],
    n_prompt: Annotated[Optional[list[str]], typer.Option("-p", "--n-prompt", help="Prompt sizes of the pp "
                                                          "cells (comma list or repeated; 0: none).")] = None,
    n_gen: Annotated[Optional[list[str]], typer.Option("-n", "--n-gen", help="Decode steps of the tg cells "
                                                       "(comma list or repeated; 0: none).")] = None,
    n_depth: Annotated[Optional[list[str]], typer.Option("-d", "--n-depth", help="Tokens already in the KV "
                                                         "cache when a cell is timed (comma list).")] = None,
    reps: Annotated[int, typer.Option("-r", "--repetitions", help="Timed repetitions per cell (after one "
                                      "untimed warm-up).")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print each receipt line on stdout too.")] = False,
    table: Annotated[str, typer.Option("--tune-table", "--table", help="Tuning table: auto (this device's, "
                                       "else its compute capability's, else built-in), builtin, or a table "
                                       "file; run a pair (tuned, builtin) to measure the table's gain.")] = "auto",
    out: Annotated[Optional[Path], typer.Option("--out", help="Receipts file (appended). Default: "
                                                "research/bench-<device>-<date>.jsonl.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Free text stored in every receipt.")] = None,
    vs: Annotated[Optional[str], typer.Option("--vs", help="llama.cpp: run llama-bench on the same file "
                                              "after each memra cell.")] = None,
    llama_bench: Annotated[Optional[Path], typer.Option("--llama-bench", help="The llama-bench binary "
                                                        "(with --vs llama.cpp).")] = None,
    synth_tokenizer: Annotated[str, typer.Option("--synth-tokenizer", help="Alias or GGUF whose tokenizer "
                                                 "a synth: model copies (when it is first made).")] = "smollm2-135m",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random token ids.")] = 0,
) -> None:
    """llama-bench's pp/tg/depth cells on the GPU engine, with GB/s and a receipt per cell."""
    from memra.tune import bench as B
    from memra.gpu import cuda

    cells = B.make_cells(B.parse_counts(n_prompt, "-p", [512]), B.parse_counts(n_gen, "-n", [128]),
                         B.parse_counts(n_depth, "-d", [0]))
    if reps < 1:
        raise MemraError(f"-r must be at least 1, got {reps}")
    if vs is not None:
        if vs.lower() not in ("llama.cpp", "llamacpp", "llama-cpp"):
            raise MemraError(f"--vs knows llama.cpp only, got {vs!r}")
        if llama_bench is None or not llama_bench.is_file():
            raise MemraError(f"--vs llama.cpp needs --llama-bench PATH of the llama-bench binary"
                             f"{'' if llama_bench is None else f' ({llama_bench}: no such file)'}")
    elif llama_bench is not None:
        raise MemraError("--llama-bench is used with --vs llama.cpp")
    if not cuda.has_gpu():
        raise CudaError("memra bench needs an NVIDIA GPU and its driver; none was found on this machine")

    name, path = B.resolve_model(model, synth_tokenizer)
    g = cuda.gpu()
    bw = g.copy_bandwidth()
    tbl, label = _open_table(table, g.info)
    n_ctx = max(c.n_depth + c.n_tokens for c in cells)
    from memra.gpu.engine import argmax_gate
    from memra.text.tokenizer import Tokenizer

    engine, label = _engine(path, max(n_ctx, 64), tbl, label)
    gate_ids = Tokenizer.from_gguf(engine.gguf).encode(B.GATE_PROMPT, add_special=True, parse_special=True)
    gate = argmax_gate(engine, gate_ids)
    print(gate.line(), file=sys.stderr, flush=True)
    common = B.common_fields(name, path, engine, label, tag)
    out = out or B.default_out(g.info.name)
    log.info("%s (%s): %d cells x %d reps, receipts to %s", name, path, len(cells), reps, out)

    def emit(row: dict) -> None:
        if as_json:
            print(json.dumps(row, sort_keys=True), flush=True)

    rows = B.run(engine, common=common, cells=cells, reps=reps, bw_bytes_s=bw, gate=gate.verdict, out=out,
                 gguf=path, llama_bench=str(llama_bench) if vs else None, seed=seed, on_receipt=emit)
    _print_table(rows)
    print(f"{len(rows)} receipts appended to {out} · {common['device']} · copy bandwidth {bw / 1e9:.0f} GB/s "
          f"· matvec {common['matvec_path']} · table {label} · git {common['git_sha']}", file=sys.stderr, flush=True)
    if gate.verdict == "MISMATCH":
        _fail("argmax gate MISMATCH: prefill and decode disagree, the figures above are void "
              "(their receipts say gate MISMATCH)")
