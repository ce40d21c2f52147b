"""`memra tune run|freeze|show` and `memra research summarize|compare|plot` (mounted on
memra.cli.common.app at the end of this module). Data on stdout, progress and logs on
stderr, as everywhere in the CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from memra.cli.common import app, command, csv_option, err, log, out
from memra.errors import MemraError
from memra.paths import campaigns_dir, freeze_inputs, home_tables_dir, plots_dir, project_root, tune_out_dir

class _RunByDefault(TyperGroup):
    """`memra tune CAMPAIGN [options]` is `memra tune run CAMPAIGN [options]`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


tune_app = typer.Typer(cls=_RunByDefault, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False,
                       help="Kernel tuning: campaigns → receipts → per-device default tables "
                            "(`memra tune CAMPAIGN …` runs one).")
research_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                           help="Analysis over receipts of every kind (pandas), and the generated "
                                "performance board.")


def _campaign_path(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".toml" or p.exists():
        return p
    cand = campaigns_dir() / f"{name}.toml"
    if not cand.exists():
        known = sorted(f.stem for f in (campaigns_dir()).glob("*.toml"))
        raise MemraError(f"no campaign {name!r} (campaigns: {', '.join(known) or 'none'})")
    return cand


def _fmt(v, nd=2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _print_frame(df, title: str | None = None) -> None:
    t = Table(title=title, show_lines=False, header_style="bold")
    for c in df.columns:
        t.add_column(str(c), overflow="fold")
    for row in df.itertuples(index=False):
        t.add_row(*(_fmt(v) for v in row))
    out.print(t)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=_json_default, allow_nan=False))


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialize {type(o).__name__}")


def _frame_json(df) -> list[dict]:
    return json.loads(df.to_json(orient="records"))


# ---------------------------------------------------------------- tune


@tune_app.command("run")
@command
def tune_run(
    campaign: Annotated[str, typer.Argument(help="Campaign name (tune/campaigns/NAME.toml) or path.")],
    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help="Take shapes from this "
                     "model (alias or GGUF path); repeatable.")] = None,
    kernels: Annotated[Optional[list[str]], typer.Option("--kernels", "-k", help="Only these kernels "
                       "(comma-separated or repeated).")] = None,
    reps: Annotated[int, typer.Option("--reps", help="Timed graph replays per configuration (a "
                                      "campaign's own reps win).")] = 100,
    resume: Annotated[bool, typer.Option("--resume", help="Skip jobs already measured here for "
                                         "this device and kernel source.")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Receipts file (default: "
                        "$MEMRA_HOME/receipts/tune/<campaign>-<device>.jsonl).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the jobs and exit (no GPU needed).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs.")] = None,
    precompile_jobs: Annotated[bool, typer.Option("--precompile/--no-precompile", help="Compile the "
                               "campaign's modules in parallel processes before timing.")] = True,
    pdl: Annotated[bool, typer.Option("--pdl", help="Time every launch as a programmatic dependent launch, "
                   "as the engine launches (receipts say timing: pdl; freeze keeps the two timings apart; "
                   "default file <campaign>-pdl-<device>.jsonl).")] = False,
) -> None:
    """Measure every job of a campaign on this GPU and append receipts."""
    from memra.tune.campaign import expand_campaign, load_campaign, model_info
    from memra.tune.receipts import config_key, shape_key

    from memra.tune.measure import check_variants

    if reps < 1:
        raise MemraError(f"--reps must be at least 1, got {reps}")
    spec = load_campaign(_campaign_path(campaign))
    models = [model_info(m) for m in (model or [])]
    jobs = expand_campaign(spec, models, kernels=csv_option(kernels, "--kernels", "kernel names"))
    check_variants(jobs)
    if dry_run:
        for j in jobs:
            print(f"{j.kernel}\t{j.variant}\t{config_key(j.config) or '-'}\t{shape_key(j.shape)}\t"
                  f"b{j.shape['batch']}\t{','.join(j.ops) or '-'}")
        err.print(f"[dim]{len(jobs)} jobs[/dim]")
        return

    _measure_jobs(jobs, spec["name"], reps=reps, resume=resume, out_path=out_path, seed=seed,
                  precompile_jobs=precompile_jobs, pdl=pdl)


def _measure_jobs(jobs, name: str, *, reps: int, resume: bool, out_path, seed, precompile_jobs: bool,
                  family_job=None, src_hash=None, pdl: bool = False) -> None:
    """Time `jobs` on this GPU, appending one receipt each (memra tune run / dispatch).
    family_job(job): the job a family's hooks time for it (a dispatch job: its path's);
    pdl: every launch a programmatic dependent one (memra.tune.measure), receipts timing "pdl"."""
    from memra.gpu import cuda
    from memra.tune.campaign import run_campaign
    from memra.tune.measure import device_context, gpu_measure, precompile, require_hooks
    from memra.tune.tables import device_slug

    if not cuda.has_gpu():
        raise MemraError(f"memra tune {'run' if family_job is None else 'dispatch'} needs an NVIDIA GPU "
                         f"(use --dry-run to list the jobs)")
    family_job = family_job or (lambda j: j)
    timed = [family_job(j) for j in jobs]
    require_hooks(timed)
    g = cuda.gpu()
    ctx = device_context(g)
    if pdl:
        ctx["timing"] = "pdl"
    path = out_path or tune_out_dir() / f"{name}{'-pdl' if pdl else ''}-{device_slug(ctx['device'])}.jsonl"
    log.info("tune: %d jobs of %s on %s → %s", len(jobs), name, ctx["device"], path)
    if precompile_jobs:
        import time

        t0 = time.perf_counter()
        n, bad = precompile(timed, g.info.arch)
        log.info("tune: %d modules compiled in %.1f s (%d failed: their jobs record why)", n,
                 time.perf_counter() - t0, bad)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeRemainingColumn())
    measure = gpu_measure(g, reps=reps, seed=seed, pdl=pdl)
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task(name, total=len(jobs), last="")

        def progress(i, n, job, receipt):
            if receipt is None:
                last = "skipped"
            elif receipt["ok"]:
                last = f"{job.kernel} {job.variant} {receipt['median_us']:.2f} µs" + (
                    f" {receipt['gbps']:.0f} GB/s" if receipt["gbps"] else "")
            else:
                last = f"{job.kernel} failed"
            bar.update(task, completed=i, last=last)

        counts = run_campaign(jobs, lambda j: measure(family_job(j)), path, context=ctx, resume=resume,
                              progress=progress, src_hash=src_hash)
    err.print(f"{counts['measured']} measured, {counts['failed']} failed, {counts['skipped']} "
              f"skipped → {path}")


@tune_app.command("dispatch")
@command
def tune_dispatch(
    model: Annotated[list[str], typer.Option("--model", "-m", help="Take the matvec shapes of this "
                     "model (alias, GGUF path or synth:SHAPE:QUANT); repeatable.")],
    rows: Annotated[str, typer.Option("--rows", help="Row counts (comma list): the table's buckets.")] =
        "1,2,4,8,16,32,64,128",
    ops: Annotated[Optional[str], typer.Option("--ops", help="Only these ops (comma list: qkv, "
                   "attn_output, gate_up, down, output).")] = None,
    reps: Annotated[int, typer.Option("--reps", help="Timed graph replays per job.")] = 50,
    resume: Annotated[bool, typer.Option("--resume", help="Skip jobs already measured here for "
                                         "this device and these kernel sources.")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Receipts file (default: "
                        "$MEMRA_HOME/receipts/tune/dispatch-<device>.jsonl).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the jobs and exit (no GPU needed).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs.")] = None,
) -> None:
    """Time the q8 matvec's three bit-identical paths (mv_q8, mvt, GEMM) per shape and row
    count, each with the device table's configuration; `memra tune freeze` then stores the
    fastest per shape and bucket, which the planner follows (memra.tune.dispatch)."""
    from memra.tune import dispatch as DISPATCH
    from memra.tune.receipts import config_key, shape_key
    from memra.tune.tables import _current_hash

    table = None
    if not dry_run:
        from memra.gpu import cuda
        from memra.tune.tables import load_table

        if cuda.has_gpu():
            g = cuda.gpu()
            table, _ = load_table(g.info.name, g.info.cc, sms=g.info.sm_count)
    try:
        row_counts = [int(x) for x in rows.split(",") if x.strip()]
    except ValueError:
        raise MemraError(f"--rows takes row counts (a comma list, e.g. 1,2,4,8), got {rows!r}") from None
    if not row_counts:
        raise MemraError("--rows: no row counts given")
    jobs = DISPATCH.jobs(model, table, row_counts, csv_option([ops] if ops is not None else None, "--ops", "op names"))
    if dry_run:
        for j in jobs:
            print(f"{j.kernel}\t{j.variant}\t{config_key(j.config) or '-'}\t{shape_key(j.shape)}\t"
                  f"b{j.shape['batch']}\t{','.join(j.ops)}")
        err.print(f"[dim]{len(jobs)} jobs[/dim]")
        return
    _measure_jobs(jobs, "dispatch", reps=reps, resume=resume, out_path=out_path, seed=seed,
                  precompile_jobs=True, family_job=DISPATCH.path_job, src_hash=_current_hash)


@tune_app.command("freeze")
@command
def tune_freeze(
    receipts: Annotated[Optional[list[Path]], typer.Argument(help="Receipts files or folders "
                        "(default: the checkout's research/tune/ and $MEMRA_HOME/receipts/tune/).")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="Freeze this device only "
                      "(default: every device in the receipts, each standing on the receipts of the others of its "
                      "compute capability and SM count for what it has none of its own for, as --stand-in).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out-dir", help="Where tables go (default: "
                       "$MEMRA_HOME/tables, which the engine reads before the shipped tune/defaults/; "
                       "name tune/defaults to update the source tree).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON.")] = False,
    min_gain: Annotated[float, typer.Option("--min-gain", help="Keep a family's built-in "
                        "configuration unless the fastest one beats it by this fraction (families "
                        "whose module says which configuration is built in: matvec, gemm).")] = 0.03,
    pdl: Annotated[bool, typer.Option("--pdl", help="Where a kernel, shape and batch have receipts timed "
                   "with PDL (memra tune run --pdl), freeze those instead of the plain ones (the two are "
                   "never compared); the plain ones elsewhere.")] = False,
    pdl_match: Annotated[Optional[str], typer.Option("--pdl-match", help="With --pdl: take the PDL-timed "
                         "receipts only for the entries this regular expression names, whole-matched "
                         "against 'KERNEL SHAPE_KEY' (e.g. 'matvec cols=2048,rows=2048,type=Q4_0').")] = None,
    stand_in: Annotated[Optional[list[str]], typer.Option("--stand-in", help="With --device: also take this "
                        "device's receipts (a part of the same compute capability and SM count, e.g. an H100 "
                        "for the H200) for the kernels, shapes and batches the device has none of its own "
                        "for; such entries say measured_on and take its engine choices. Repeatable.")] = None,
) -> None:
    """Pick the winners of the receipts into <device>.json ($MEMRA_HOME/tables unless --out-dir)."""
    from memra.tune import carry as CARRY
    from memra.tune import dispatch as DISPATCH
    from memra.tune.measure import is_builtin, reached
    from memra.tune.tables import _current_hash
    from memra.tune.freeze import apply_engine_choices, freeze, select_timing, summarize_table, write_table

    if not 0 <= min_gain < math.inf:  # nan too: every comparison with it is false
        raise MemraError(f"--min-gain must be a fraction >= 0 (e.g. 0.03), got {min_gain}")
    sources = receipts or freeze_inputs()
    if not sources:
        raise MemraError("no receipts to freeze (give receipts files, or run `memra tune` first)")
    # receipts measured on a kernel source whose modules a later source compiles to the same code count as measured
    # on the later one (memra tune carry); ec: the entries the engine's own A/B chose (experiments/engine_tune), laid
    # over the frozen ones
    df, ec = CARRY.read_current(sources)
    choices = ec.to_dict("records") if len(ec) else []
    if pdl_match is not None and not pdl:
        raise MemraError("--pdl-match needs --pdl")
    if stand_in and not device:
        raise MemraError("--stand-in needs --device (the device the stand-in's receipts count for)")
    try:
        df = select_timing(df, pdl, pdl_match) if len(df) else df
    except re.error as e:
        raise MemraError(f"--pdl-match {pdl_match!r}: not a regular expression ({e})") from None
    if df.empty:
        raise MemraError(f"no {'PDL-timed ' if pdl else ''}receipts to freeze")
    hashes = {src: _current_hash(src) for src in sorted(set(df["src"]))}
    devices = [device] if device else sorted(set(df["device"]))
    # without --device, each device stands on its peers' receipts (the others of its compute capability and SM
    # count) for what it lacks: a table made from a partial campaign would otherwise lose the peer's entries
    part = {d: (str(g["cc"].iloc[0]), int(g["sms"].iloc[0])) for d, g in df.groupby("device")}
    tables = []
    for d in devices:
        peers = stand_in or ([] if device else [o for o in devices if o != d and part[o] == part[d]])
        kw = dict(current_hashes=hashes, root=project_root(), builtin=is_builtin, min_gain=min_gain,
                  entry_src=DISPATCH.entry_src(_current_hash), stand_ins=peers)
        table = freeze(df, d, keep=reached, **kw)
        notes = apply_engine_choices(table, choices, _current_hash, project_root(), stand_ins=peers)
        # a dispatch choice measured with a path configuration the table has replaced since (a later
        # campaign, or an engine choice laid over the path's entry): no choice
        keep, left_out = DISPATCH.launched_keep(df[df["device"].isin([d, *peers])], table, reached)
        if left_out:
            table = freeze(df, d, keep=keep, **kw)
            apply_engine_choices(table, choices, _current_hash, project_root(), stand_ins=peers)   # the same notes
            err.print(f"{d}: {len(left_out)} dispatch choices left to the rule, their paths' configurations "
                      f"changed since they were timed (re-time them: memra tune dispatch --resume): "
                      + "; ".join(f"{k} {shape} rows {b}" for k, shape, b in left_out), markup=False)
        for note in notes:
            err.print(f"{d}: {note}", markup=False)
        path = write_table(table, out_dir or home_tables_dir())
        tables.append(table)
        n = sum(len(b) for s in table["entries"].values() for b in s.values())
        err.print(f"{d}: {n} entries → {path}")
        if not as_json:
            import pandas as pd

            rows = summarize_table(table)
            if rows:
                _print_frame(pd.DataFrame(rows), title=d)
    if as_json:
        _print_json(tables)


@tune_app.command("carry")
@command
def tune_carry(
    rev: Annotated[str, typer.Option("--from", help="The commit whose kernels/ the receipts were measured on "
                   "(their src_hash); every file changed since is checked.")],
    receipts: Annotated[Optional[list[Path]], typer.Argument(help="Receipts files or folders (default: the "
                        "checkout's research/tune/ and $MEMRA_HOME/receipts/tune/).")] = None,
    device: Annotated[str, typer.Option("--device", help="The device whose receipts to carry.")] = "NVIDIA H200",
    out: Annotated[Optional[Path], typer.Option("--out", help="Where the carry records go (default: "
                   "research/tune/carry-<device>.jsonl, which freeze reads).")] = None,
) -> None:
    """Carry tuning receipts across a kernel source change that leaves every module they measured compiling
    to the same code (memra.tune.carry); then `memra tune freeze` reads them as current. Needs no GPU."""
    import tempfile

    from memra.gpu.cuda import arch_for
    from memra.tune import carry as CARRY
    from memra.tune.receipts import normalize_cc
    from memra.tune.tables import device_slug, read_table, tables_dir

    sources = receipts or freeze_inputs()
    # receipts already carried count at the hash they were carried to (as freeze reads them), so a second edit
    # carries them on (read raw, a receipt measured two source edits ago was never found at --from's hash)
    df, ec = CARRY.read_current(sources) if sources else (None, None)
    if df is None or df.empty or device not in set(df["device"]):
        raise MemraError(f"no tuning receipts of {device!r} to carry")
    arch = arch_for(tuple(int(v) for v in normalize_cc(df[df["device"] == device]["cc"].iloc[0]).split(".")))
    path = tables_dir() / f"{device_slug(device)}.json"
    table = read_table(path) if path.is_file() else None
    with tempfile.TemporaryDirectory() as tmp:
        old_root = CARRY.tree_at(rev, Path(tmp), project_root())
        records = CARRY.plan(df, table, device, old_root, arch=arch, log=lambda m: err.print(m, markup=False),
                             choices=ec)
    if not records:
        err.print("nothing carried", markup=False)
        return
    dest = out or project_root() / "research" / "tune" / f"carry-{device_slug(device)}.jsonl"
    CARRY.write(records, dest)
    err.print(f"{len(records)} carry records -> {dest}; now `memra tune freeze` (see docs)", markup=False)


@tune_app.command("show")
@command
def tune_show(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: gpu, source, tables, stale.")] = False,
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Tables folder (default: "
                         "$MEMRA_HOME/tables, then the shipped tune/defaults/).")] = None,
) -> None:
    """The table this GPU would use (all tables without a GPU) and its stale entries."""
    from memra.gpu import cuda
    from memra.tune.freeze import show, summarize_table

    device = None
    if cuda.has_gpu():
        info = cuda.gpu().info
        device = {"name": info.name, "cc": "%d.%d" % tuple(info.cc), "sms": int(info.sm_count)}
    doc = show(device, directory=directory)
    if as_json:
        _print_json(doc)
        return
    import pandas as pd

    if device:
        err.print(f"{device['name']} (cc {device['cc']}, {device['sms']} SMs): {doc['source']} table")
    else:
        err.print("no GPU here: every table on disk")
    for t in doc["tables"]:
        rows = summarize_table(t)
        _print_frame(pd.DataFrame(rows) if rows else pd.DataFrame(columns=["kernel"]),
                     title=f"{t['device']} (cc {t['cc']}) · {t['path']}")
    if doc["stale"]:
        _print_frame(pd.DataFrame(doc["stale"]), title="stale: kernel source changed since measured")
    else:
        err.print("stale: none")


# ---------------------------------------------------------------- research


def _write_parquet(df, parquet: Optional[Path]) -> None:
    if parquet:
        from memra.tune.research import to_parquet

        err.print(f"wrote {to_parquet(df, parquet)}")


class _Skipped:
    """on_error for the research commands: a malformed line or a file that is no receipts
    file is reported on stderr (file:line: what is wrong) and skipped, never a crash."""

    def __init__(self):
        self.errors = []

    def __call__(self, e) -> None:
        self.errors.append(e)


def _read(files: list[Path]):
    from memra.tune.receipts import read_receipts

    skipped = _Skipped()
    df = read_receipts(files, on_error=skipped)
    if df.empty:
        more = f" (and {len(skipped.errors) - 1} more)" if len(skipped.errors) > 1 else ""
        raise MemraError(f"no receipts in {', '.join(map(str, files))}"
                         + (f": {skipped.errors[0]}{more}" if skipped.errors else ""))
    for e in skipped.errors:
        log.warning("skipped %s", e)
    if skipped.errors:
        err.print(f"{len(skipped.errors)} malformed line(s) or file(s) skipped, {len(df)} receipts read")
    return df


@research_app.command("summarize")
@command
def research_summarize(
    files: Annotated[list[Path], typer.Argument(help="Receipts files or folders (every kind: tune, "
                                                "bench, ...; e.g. research/).")],
    by: Annotated[Optional[list[str]], typer.Option("--by", help="Group columns, comma-separated "
                  "(default per kind: tune kernel,shape_key,batch,variant; bench device,model,test,engine; "
                  "config.NAME and shape.NAME work).")] = None,
    parquet: Annotated[Optional[Path], typer.Option("--parquet", help="Also write the receipts "
                       "themselves to this Parquet file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records (each with its kind).")] = False,
) -> None:
    """Per kind and group: counts, failures, the median and best figure, the best configuration or run."""
    from memra.tune.research import summarize_all

    df = _read(files)
    sums = summarize_all(df, by=csv_option(by, "--by", "columns"))
    _write_parquet(df, parquet)
    if as_json:
        _print_json([{"kind": k, **r} for k, s in sums.items() for r in _frame_json(s)])
        return
    counts = df["kind"].value_counts()
    for k, s in sums.items():
        _print_frame(s, title=f"{k}: {int(counts.get(k, 0))} receipts")


@research_app.command("compare")
@command
def research_compare(
    a: Annotated[Path, typer.Argument(help="Receipts A (file or folder).")],
    b: Annotated[Path, typer.Argument(help="Receipts B (file or folder).")],
    on: Annotated[Optional[list[str]], typer.Option("--on", help="Match columns, comma-separated "
                  "(default per kind: tune kernel,variant,config_key,shape_key,batch; bench "
                  "device,model,test,engine).")] = None,
    parquet: Annotated[Optional[Path], typer.Option("--parquet", help="Write the comparison to Parquet.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records.")] = False,
) -> None:
    """What A and B both measured, kind by kind: figures side by side, speedup > 1 when B is better."""
    from memra.tune.research import compare

    c = compare(_read([a]), _read([b]), on=csv_option(on, "--on", "columns"))
    _write_parquet(c, parquet)
    if as_json:
        _print_json({"rows": _frame_json(c), "only_a": c.attrs["only_a"], "only_b": c.attrs["only_b"],
                     "by_kind": c.attrs["by_kind"]})
        return
    if c.empty:
        err.print(f"nothing measured in both (only in A: {c.attrs['only_a']}, only in B: {c.attrs['only_b']})")
        return
    for kind, part in c.groupby("kind", sort=True):
        part = part.dropna(axis=1, how="all").drop(columns=["kind"])
        _print_frame(part, title=f"{kind}: A = {a}, B = {b} (speedup > 1: B better)")
        geo = float(math.exp(sum(math.log(x) for x in part["speedup"]) / len(part)))
        k = c.attrs["by_kind"][kind]
        err.print(f"{kind}: {len(part)} matched, geometric-mean speedup {geo:.3f}; only in A: "
                  f"{k['only_a']}, only in B: {k['only_b']}")


@research_app.command("plot")
@command
def research_plot(
    files: Annotated[list[Path], typer.Argument(help="Receipts files or folders.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for the PNGs (default: "
                                                    "$MEMRA_HOME/plots).")] = None,
    kernel: Annotated[Optional[str], typer.Option("--kernel", help="Only this kernel (tuning receipts).")] = None,
) -> None:
    """PNG charts: tuning sweeps (GB/s per configuration, per kernel and shape) and bench runs
    (t/s per model over time); needs matplotlib."""
    from memra.tune.research import plot

    for p in plot(_read(files), out_dir or plots_dir(), kernel=kernel):
        print(p)


@research_app.command("board")
@command
def research_board(
    files: Annotated[Optional[list[Path]], typer.Argument(help="Markdown files holding boards (default: "
                                                        "docs/PERFORMANCE.md and README.md).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Change nothing; exit 1 when a board differs "
                                        "from what the receipts give (CI runs this).")] = False,
    research: Annotated[Optional[Path], typer.Option("--research", help="Receipts folder (default: the "
                                                     "checkout's research/).")] = None,
) -> None:
    """Regenerate the performance tables between <!-- board: … --> markers from the committed
    bench receipts (memra and llama.cpp arms: medians, ratio, % of bandwidth, N, date, device, commit)."""
    import difflib

    from memra.paths import research_dir
    from memra.tune.board import boards

    root = project_root()
    files = files or [root / "docs" / "PERFORMANCE.md", root / "README.md"]
    stale = []
    for f, old, new in boards(files, research or research_dir()):
        if old == new:
            err.print(f"{f}: up to date")
            continue
        stale.append(f)
        if check:
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), str(f), "from the receipts",
                                        lineterm="", n=0)
            print("\n".join(list(diff)[:40]))
        else:
            f.write_text(new, encoding="utf-8")
            err.print(f"{f}: boards regenerated")
    if check and stale:
        raise MemraError(f"{', '.join(map(str, stale))}: the boards differ from the receipts "
                         f"(run `memra research board` and commit)")


app.add_typer(tune_app, name="tune"), app.add_typer(research_app, name="research")
