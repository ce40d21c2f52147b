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

from memra.cli.common import (CacheTypeK, CacheTypeV, _fail, app, check_cache_types, command, csv_option, err,
                              log)
from memra.errors import CudaError, MemraError


# -- kernel-check -------------------------------------------------------------------------------

@app.command("kernel-check")
@command
def kernel_check(
    only: Annotated[Optional[str], typer.Option("--only", help="Only these kernel families "
                                                "(comma-separated: matvec, embed, norm, rope, attention, act, "
                                                "sample, gemm, mask, mvt); no receipt is written.")] = None,
    compile_only: Annotated[bool, typer.Option("--compile-only", help="Compile every kernel module the checks "
                                               "and the engine's launch set load, with NVRTC for sm_90a, sm_120a "
                                               "and sm_89; needs no GPU.")] = False,
    arch: Annotated[Optional[list[str]], typer.Option("--arch", help="With --compile-only: only these "
                                                      "targets (e.g. sm_90a; comma-separated or "
                                                      "repeated).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs (default: "
                                                "fresh each run; the one used is printed).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Where a complete GPU run writes its receipt: a "
                                                "folder (<device>.json inside) or a .json file. Default: "
                                                "$MEMRA_HOME/receipts/kernel-check/; the committed ones live in "
                                                "research/kernel-check/.")] = None,
    show_status: Annotated[bool, typer.Option("--status", help="Say whether the committed receipt of --device "
                                              "(research/kernel-check/<device>.json) covers the kernel sources and "
                                              "the launch set at HEAD; exit 1 when it does not. Needs no GPU.")] = False,
    device: Annotated[str, typer.Option("--device", help="With --status: the device (name or slug) whose "
                                        "receipt to check.")] = "nvidia-h200",
    as_json: Annotated[bool, typer.Option("--json", help="With --status: print one JSON object.")] = False,
    export_specs: Annotated[Optional[Path], typer.Option("--export-specs", help="Write the launch set's models' specs "
                                                         "(config and tensor types: all it reads of a model) to "
                                                         "this JSON file and exit, for MEMRA_MODEL_SPECS on a "
                                                         "machine without the model files.")] = None,
    add_to: Annotated[Optional[Path], typer.Option("--add-to", help="A green receipt of this device (e.g. "
                                                   "research/kernel-check/nvidia-h200.json): check only the launch "
                                                   "cases it lacks (its own checks and canaries stand) and write a "
                                                   "receipt covering both, marked incremental. Where kernel sources "
                                                   "changed since it, the families whose recorded kernel files "
                                                   "reach a changed one run whole.")] = None,
) -> None:
    """Check every kernel module the engine can launch against its CPU reference, with canaries;
    ends ALL GREEN or exits 1. A complete run on a GPU writes a receipt (source hashes, launch set)."""
    from memra.tune.kernelcheck import all_green, make_receipt, receipt_path, run_kernel_check, status, write_receipt

    if export_specs is not None:
        from memra.tune.launches import export_specs as export

        print(f"{', '.join(export(export_specs))} -> {export_specs}", flush=True)
        return
    if show_status:
        if compile_only or only or arch:
            raise MemraError("--status takes no --only, --compile-only or --arch")
        st = status(device, out)
        if as_json:
            print(json.dumps(st, sort_keys=True), flush=True)
        else:
            where = f" ({st['receipt']}, run on {st.get('ran_on')})" if st["receipt"] else ""
            print(f"{st['device']}: {'current' if st['current'] else 'NOT current'} — {st['reason']}{where}",
                  flush=True)
            if st["unexecuted"]:
                u = st["unexecuted"]
                print(f"warning: {len(u)} entries of the {st['device']} table no launch case runs with their "
                      f"tunables (a launcher drops one, or no plan reaches the shape): {'; '.join(u[:3])}"
                      f"{'; ...' if len(u) > 3 else ''}", flush=True)
        if not st["current"]:
            raise typer.Exit(1)
        return
    if as_json:
        raise MemraError("--json applies to --status")
    base = None
    if add_to is not None:
        if only or compile_only:
            raise MemraError("--add-to checks every family's new cases: no --only or --compile-only")
        try:
            base = json.loads(Path(add_to).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise MemraError(f"--add-to {add_to}: not a readable receipt ({e})") from None
    archs = csv_option(arch, "--arch", "targets")
    if archs and not compile_only:
        raise MemraError("--arch applies to --compile-only (on a GPU the kernels are built for its own arch)")
    for a in archs or []:
        if not re.fullmatch(r"sm_\d{2,3}[a-z]?", a):
            raise MemraError(f"--arch {a!r} is not an NVRTC target such as sm_90a, sm_120a or sm_89")
    lines, report = [], {}
    for line in run_kernel_check(only=only, compile_only=compile_only, seed=seed, archs=archs, report=report,
                                 base=base):
        print(line, flush=True)
        lines.append(line)
    if report.get("complete"):
        receipt = make_receipt(report)
        path = write_receipt(receipt, receipt_path(receipt["slug"], out))
        print(f"receipt: {path}", file=sys.stderr, flush=True)
    elif out is not None and not compile_only:
        log.warning("--only: a partial run writes no receipt")
    if not all_green(lines):
        raise typer.Exit(1)


# -- warmup -------------------------------------------------------------------------------------

@app.command()
@command
def warmup(
    model: Annotated[Optional[str], typer.Argument(help="GGUF path or alias: compile what this model "
                                                   "needs (default: every family's variants).")] = None,
    arch: Annotated[Optional[list[str]], typer.Option("--arch", help="Targets (e.g. sm_90a; comma-separated "
                                                      "or repeated). Default: this GPU's, else sm_90a.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line per module.")] = False,
) -> None:
    """Compile the kernel modules a model needs into the cubin cache (no GPU needed), so the
    first GPU run starts without waiting for NVRTC."""
    import time

    from memra.cli.common import _open
    from memra.paths import cubin_dir
    from memra.tune.warmup import model_modules, warmup as run_warmup

    archs = csv_option(arch, "--arch", "targets") or []
    for a in archs:
        if not re.fullmatch(r"sm_\d{2,3}[a-z]?", a):
            raise MemraError(f"--arch {a!r} is not an NVRTC target such as sm_90a, sm_120a or sm_89")
    if not archs:
        from memra.gpu import cuda

        archs = [cuda.gpu().info.arch] if cuda.has_gpu() else ["sm_90a"]
    g = None
    if model is not None:
        _, _, g = _open(model)
    mods = model_modules(g)
    t0 = time.perf_counter()
    if err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("compiling kernels"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=err, transient=True)
        task = bar.add_task("compile", total=len(mods) * len(archs))
        progress = lambda done, total: bar.update(task, completed=done)  # noqa: E731
    else:
        bar, progress = None, lambda done, total: None
    rows = []
    with bar if bar is not None else _nothing():
        for r in run_warmup(mods, archs, progress=progress):
            rows.append(r)
            if as_json:
                print(json.dumps({k: v for k, v in r.items()}, sort_keys=True), flush=True)
    bad = [r for r in rows if r["error"]]
    for r in bad:
        print(f"FAIL  {r['family']} {r['arch']} {r['file']} {r['defines']}\n{r['error']}", file=sys.stderr)
    made = sum(not r["cached"] for r in rows) - len(bad)
    msg = (f"{len(rows)} modules ({', '.join(archs)}): {made} compiled, {sum(r['cached'] for r in rows)} "
           f"already cached, {len(bad)} failed · {time.perf_counter() - t0:.1f} s → {cubin_dir()}")
    print(msg, file=sys.stderr, flush=True)
    if bad:
        raise typer.Exit(1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- bench --------------------------------------------------------------------------------------

def _open_table(which: str | None, info):
    """(table, label) for --table: auto (exact device → same cc → built-in), builtin, or a file; None:
    $MEMRA_TUNE_TABLE, else auto (resolve_table)."""
    from memra.tune.tables import resolve_table

    table, source = resolve_table(which, info.name, info.cc, sms=info.sm_count)
    return table, ("builtin" if source == "builtin" else f"{source}:{table['path']}")


def _engine(path: Path, n_ctx: int, table: dict, label: str, batch: int = 1, **kv):
    """The GPU engine on `path` with `batch` sequences of n_ctx positions, running the
    tuning table `table` (already resolved, so the receipts' label names exactly what ran)."""
    from memra.gpu.engine import GPUEngine

    return GPUEngine(path, n_ctx=n_ctx, batch=batch, tune_table=table, **kv), label


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
    table: Annotated[Optional[str], typer.Option("--tune-table", "--table", help="Tuning table: auto (this "
                                                 "device's, else its compute capability's, else built-in), builtin, "
                                                 "or a table file; run a pair (tuned, builtin) to measure the "
                                                 "table's gain. Default: $MEMRA_TUNE_TABLE, else auto.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Receipts file (appended). Default: "
                                                "$MEMRA_HOME/receipts/bench-<device>-<date>.jsonl.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Free text stored in every receipt.")] = None,
    vs: Annotated[Optional[str], typer.Option("--vs", help="llama.cpp: run llama-bench on the same file "
                                              "after each memra cell.")] = None,
    llama_bench: Annotated[Optional[Path], typer.Option("--llama-bench", help="The llama-bench binary "
                                                        "(with --vs llama.cpp).")] = None,
    parallel: Annotated[Optional[list[str]], typer.Option("-np", "--parallel", help="tg cells: sequences "
                                                          "decoded together, each n tokens (comma list; "
                                                          "aggregate tokens/s).")] = None,
    synth_tokenizer: Annotated[str, typer.Option("--synth-tokenizer", help="Alias or GGUF whose tokenizer "
                                                 "a synth: model copies (when it is first made).")] = "smollm2-135m",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random token ids.")] = 0,
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
) -> None:
    """llama-bench's pp/tg/depth cells on the GPU engine, with GB/s and a receipt per cell."""
    from memra.tune import bench as B
    from memra.gpu import cuda

    nps = B.parse_counts(parallel, "-np", [1])
    from memra.gpu.plan import MAX_ROWS

    if not nps or min(nps) < 1 or max(nps) > MAX_ROWS:
        raise MemraError(f"-np takes counts of parallel sequences in 1..{MAX_ROWS}, got {nps}")
    if vs is not None and max(nps) > 1:
        raise MemraError("--vs llama.cpp compares single-sequence cells: leave -np out")
    cells = B.make_cells(B.parse_counts(n_prompt, "-p", [512]), B.parse_counts(n_gen, "-n", [128]),
                         B.parse_counts(n_depth, "-d", [0]), nps)
    if reps < 1:
        raise MemraError(f"-r must be at least 1, got {reps}")
    check_cache_types("gpu", cache_type_k, cache_type_v)
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
    from memra.gpu import gate as GATE
    from memra.text.tokenizer import Tokenizer

    engine, label = _engine(path, max(n_ctx, 64), tbl, label, max(nps), cache_type_k=cache_type_k,
                            cache_type_v=cache_type_v)
    gate_ids = Tokenizer.from_gguf(engine.gguf).encode(B.GATE_PROMPT, add_special=True, parse_special=True)
    gates = GATE.run_gates(engine, gate_ids)
    for g_res in gates:
        print(g_res.line(), file=sys.stderr, flush=True)
    if GATE.failed(*gates):  # a wrong engine's speed means nothing: no cell is timed
        _fail("exactness gate MISMATCH: the GPU engine is wrong on this model, so no cell was timed")
    common = B.common_fields(name, path, engine, label, tag)
    common.update(cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    out = out or B.default_out(g.info.name)
    log.info("%s (%s): %d cells x %d reps, receipts to %s", name, path, len(cells), reps, out)

    def emit(row: dict) -> None:
        if as_json:
            print(json.dumps(row, sort_keys=True), flush=True)

    rows = B.run(engine, common=common, cells=cells, reps=reps, bw_bytes_s=bw, gate=gates[0].verdict, out=out,
                 gguf=path, llama_bench=str(llama_bench) if vs else None, seed=seed, on_receipt=emit)
    _print_table(rows)
    print(f"{len(rows)} receipts appended to {out} · {common['device']} · copy bandwidth {bw / 1e9:.0f} GB/s "
          f"· matvec {common['matvec_path']} · table {label} · git {common['git_sha']}", file=sys.stderr, flush=True)


# -- profile ------------------------------------------------------------------------------------

@app.command()
@command
def profile(
    model: Annotated[str, typer.Argument(help="GGUF path, alias or synth:SHAPE:QUANT (as memra bench).")],
    depth: Annotated[int, typer.Option("--depth", "-d", help="Tokens already cached per sequence.")] = 64,
    rows: Annotated[int, typer.Option("--rows", "-np", help="Sequences decoded together (1..64), or "
                                      "with --prefill the chunk's token rows (1..512).")] = 1,
    prefill: Annotated[bool, typer.Option("--prefill", help="Profile one prefill chunk of --rows tokens of "
                                          "one sequence after --depth tokens instead of a decode step.")] = False,
    reps: Annotated[int, typer.Option("--reps", help="Copies of each launch per timed graph.")] = 20,
    by_launch: Annotated[bool, typer.Option("--by-launch", help="One line per plan launch instead of "
                                            "per kernel and shape.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the breakdown as JSON on stdout.")] = False,
    table: Annotated[Optional[str], typer.Option("--tune-table", "--table", help="Tuning table: auto, builtin, "
                                                 "or a table file. Default: $MEMRA_TUNE_TABLE, else auto.")] = None,
    synth_tokenizer: Annotated[str, typer.Option("--synth-tokenizer", help="Alias or GGUF whose tokenizer "
                                                 "a synth: model copies.")] = "smollm2-135m",
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
) -> None:
    """Per-kernel µs, GB/s and (matrix launches) TOPS of one decode step (or one prefill chunk), launch by launch of the launch plan."""
    from memra.gpu import cuda
    from memra.gpu.runner import Runner
    from memra.tune import bench as B
    from memra.tune.profile import by_kernel, int8_peak_tops, profile as run_profile

    if not cuda.has_gpu():
        raise CudaError("memra profile needs an NVIDIA GPU and its driver; none was found on this machine")
    if reps < 1:
        raise MemraError(f"--reps must be at least 1, got {reps}")
    check_cache_types("gpu", cache_type_k, cache_type_v)
    name, path = B.resolve_model(model, synth_tokenizer)
    g = cuda.gpu()
    tbl, label = _open_table(table, g.info)
    kv = dict(cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    if prefill:
        r = Runner(path, max_len=depth + rows + 32, max_seqs=1, kv_tokens=depth + rows + 48, tune_table=tbl, **kv)
    else:
        r = Runner(path, max_len=max(64, depth + 32), max_seqs=rows, kv_tokens=rows * (depth + 48), tune_table=tbl,
                   **kv)
    doc = run_profile(r, rows=rows, depth=depth, reps=reps, prefill=prefill)
    peak = int8_peak_tops(g.info.name)
    doc.update(model=name, table=label, device=g.info.name, **kv, bw_gbps=round(g.copy_bandwidth() / 1e9, 1),
               int8_peak_tops=peak, summary=by_kernel(doc["launches"]))
    if as_json:
        print(json.dumps(doc, sort_keys=True), flush=True)
    t = Table(header_style="bold", box=None, pad_edge=False)
    items = doc["launches"] if by_launch else doc["summary"]
    cols = (["launch", "kernel", "shape", "rows", "µs", "GB/s", "TOPS"] if by_launch else
            ["op", "kernel", "shape", "config", "rows", "count", "µs each", "total µs", "% step", "GB/s", "TOPS"])
    for c in cols:
        t.add_column(c, justify="left" if c in ("launch", "op", "kernel", "shape", "config") else "right",
                     no_wrap=True)
    for it in items:
        shape = ",".join(f"{k}={v}" for k, v in sorted(it["shape"].items()))
        gbs = "-" if it["gb_s"] is None else f"{it['gb_s']:.0f}"
        tops = "-" if not it.get("tops") else f"{it['tops']:.1f}" + (f" ({100 * it['tops'] / peak:.1f} %)" if peak else "")
        if by_launch:
            t.add_row(it["name"], it["kernel"], shape, str(it["rows"]), f"{it['us']:.2f}", gbs, tops)
        else:
            cfg = ",".join(f"{k}={v}" for k, v in sorted(it["config"].items())) or "built-in"
            t.add_row(it["group"], it["kernel"], shape, cfg, str(it["rows"]), str(it["count"]),
                      f"{it['us_each']:.2f}", f"{it['total_us']:.1f}",
                      f"{100 * it['total_us'] / doc['sum_us']:.1f}", gbs, tops)
    (err if err.is_terminal else Console(stderr=True, highlight=False, width=200)).print(t)
    what = f"a prefill chunk of {rows} row(s) (bucket {doc['bucket']})" if prefill else f"{rows} row(s)"
    eager = f", {doc['eager_us']:.1f} µs launched eagerly" if doc.get("eager_us") is not None else ""
    print(f"{name}: {what} at depth {depth}: step {doc['step_us']:.1f} µs measured{eager} "
          f"({doc['tok_s']:.1f} tok/s), {doc['sum_us']:.1f} µs summed over {len(doc['launches'])} plan launches "
          f"· table {label} · {doc['device']}"
          + (f" · TOPS: 2 x weight rows x K x rows per µs, % of the {peak:.0f} dense int8 peak" if peak else ""),
          file=sys.stderr, flush=True)
