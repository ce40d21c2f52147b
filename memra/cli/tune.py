"""`memra tune run|freeze|show` and `memra research summarize|compare|plot` (mounted on
memra.cli.common.app at the end of this module). Data on stdout, progress and logs on
stderr, as everywhere in the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from memra.cli.common import app, command, err, log, out
from memra.errors import MemraError
from memra.paths import campaigns_dir, project_root, tune_receipts_dir

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
                           help="Analysis over tuning receipts (pandas).")


def _campaign_path(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".toml" or p.exists():
        return p
    cand = campaigns_dir() / f"{name}.toml"
    if not cand.exists():
        known = sorted(f.stem for f in (campaigns_dir()).glob("*.toml"))
        raise MemraError(f"no campaign {name!r} (campaigns: {', '.join(known) or 'none'})")
    return cand


def _csv(values: Optional[list[str]]) -> Optional[list[str]]:
    if not values:
        return None
    return [v for item in values for v in item.split(",") if v]


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
                        "research/tune/<campaign>-<device>.jsonl).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the jobs and exit (no GPU needed).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs.")] = None,
    precompile_jobs: Annotated[bool, typer.Option("--precompile/--no-precompile", help="Compile the "
                               "campaign's modules in parallel processes before timing.")] = True,
) -> None:
    """Measure every job of a campaign on this GPU and append receipts."""
    from memra.tune.campaign import expand_campaign, load_campaign, model_info, run_campaign
    from memra.tune.receipts import config_key, shape_key
    from memra.tune.tables import device_slug

    spec = load_campaign(_campaign_path(campaign))
    models = [model_info(m) for m in (model or [])]
    jobs = expand_campaign(spec, models, kernels=_csv(kernels))
    if dry_run:
        for j in jobs:
            print(f"{j.kernel}\t{j.variant}\t{config_key(j.config) or '-'}\t{shape_key(j.shape)}\t"
                  f"b{j.shape['batch']}\t{','.join(j.ops) or '-'}")
        err.print(f"[dim]{len(jobs)} jobs[/dim]")
        return

    from memra.gpu import cuda
    from memra.tune.measure import device_context, gpu_measure, precompile, require_hooks

    if not cuda.has_gpu():
        raise MemraError("memra tune run needs an NVIDIA GPU (use --dry-run to list the jobs)")
    require_hooks(jobs)
    g = cuda.gpu()
    ctx = device_context(g)
    path = out_path or tune_receipts_dir() / f"{spec['name']}-{device_slug(ctx['device'])}.jsonl"
    log.info("tune: %d jobs of %s on %s → %s", len(jobs), spec["name"], ctx["device"], path)
    if precompile_jobs:
        import time

        t0 = time.perf_counter()
        n, bad = precompile(jobs, g.info.arch)
        log.info("tune: %d modules compiled in %.1f s (%d failed: their jobs record why)", n,
                 time.perf_counter() - t0, bad)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task(spec["name"], total=len(jobs), last="")

        def progress(i, n, job, receipt):
            if receipt is None:
                last = "skipped"
            elif receipt["ok"]:
                last = f"{job.kernel} {receipt['median_us']:.2f} µs" + (
                    f" {receipt['gbps']:.0f} GB/s" if receipt["gbps"] else "")
            else:
                last = f"{job.kernel} failed"
            bar.update(task, completed=i, last=last)

        counts = run_campaign(jobs, gpu_measure(g, reps=reps, seed=seed), path, context=ctx,
                              resume=resume, progress=progress)
    err.print(f"{counts['measured']} measured, {counts['failed']} failed, {counts['skipped']} "
              f"skipped → {path}")


@tune_app.command("freeze")
@command
def tune_freeze(
    receipts: Annotated[Optional[list[Path]], typer.Argument(help="Receipts files or folders "
                        "(default: research/tune/).")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="Freeze this device only "
                      "(default: every device in the receipts).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out-dir", help="Where tables go (default: "
                       "tune/defaults/).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tables as JSON.")] = False,
    min_gain: Annotated[float, typer.Option("--min-gain", help="Keep a family's built-in "
                        "configuration unless the fastest one beats it by this fraction (families "
                        "whose module says which configuration is built in: matvec).")] = 0.03,
) -> None:
    """Pick the winners of the receipts into tune/defaults/<device>.json."""
    from memra.tune.receipts import read_receipts
    from memra.tune.measure import is_builtin
    from memra.tune.tables import _current_hash, tables_dir
    from memra.tune.freeze import freeze, summarize_table, write_table

    df = read_receipts(receipts or [tune_receipts_dir()])
    if df.empty:
        raise MemraError("no receipts to freeze")
    hashes = {src: _current_hash(src) for src in sorted(set(df["src"]))}
    devices = [device] if device else sorted(set(df["device"]))
    tables = []
    for d in devices:
        table = freeze(df, d, current_hashes=hashes, root=project_root(), builtin=is_builtin, min_gain=min_gain)
        path = write_table(table, out_dir or tables_dir())
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


@tune_app.command("show")
@command
def tune_show(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: gpu, source, tables, stale.")] = False,
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Tables folder (default: "
                         "tune/defaults/).")] = None,
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


@research_app.command("summarize")
@command
def research_summarize(
    files: Annotated[list[Path], typer.Argument(help="Receipts files or folders.")],
    by: Annotated[Optional[list[str]], typer.Option("--by", help="Group columns, comma-separated "
                  "(default kernel,shape_key,batch,variant; config.NAME and shape.NAME work).")] = None,
    parquet: Annotated[Optional[Path], typer.Option("--parquet", help="Also write the receipts "
                       "themselves to this Parquet file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records.")] = False,
) -> None:
    """Per group: counts, failures, fastest and median time, best GB/s, best configuration."""
    from memra.tune.receipts import read_receipts
    from memra.tune.research import DEFAULT_BY, summarize

    df = read_receipts(files)
    s = summarize(df, by=_csv(by) or DEFAULT_BY)
    _write_parquet(df, parquet)
    if as_json:
        _print_json(_frame_json(s))
    else:
        _print_frame(s, title=f"{len(df)} receipts")


@research_app.command("compare")
@command
def research_compare(
    a: Annotated[Path, typer.Argument(help="Receipts A (file or folder).")],
    b: Annotated[Path, typer.Argument(help="Receipts B (file or folder).")],
    on: Annotated[Optional[list[str]], typer.Option("--on", help="Match columns, comma-separated "
                  "(default kernel,variant,config_key,shape_key,batch).")] = None,
    parquet: Annotated[Optional[Path], typer.Option("--parquet", help="Write the comparison to Parquet.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records.")] = False,
) -> None:
    """Configurations measured in both A and B: times side by side, speedup = A / B."""
    from memra.tune.research import COMPARE_ON, compare

    c = compare([a], [b], on=_csv(on) or COMPARE_ON)
    _write_parquet(c, parquet)
    if as_json:
        _print_json({"rows": _frame_json(c), "only_a": c.attrs["only_a"], "only_b": c.attrs["only_b"]})
        return
    _print_frame(c, title=f"A = {a}, B = {b} (speedup > 1: B faster)")
    if len(c):
        geo = float(math.exp(sum(math.log(x) for x in c["speedup"]) / len(c)))
        err.print(f"{len(c)} matched, geometric-mean speedup {geo:.3f}; only in A: "
                  f"{c.attrs['only_a']}, only in B: {c.attrs['only_b']}")


@research_app.command("plot")
@command
def research_plot(
    files: Annotated[list[Path], typer.Argument(help="Receipts files or folders.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the PNGs.")] = Path("research/plots"),
    kernel: Annotated[Optional[str], typer.Option("--kernel", help="Only this kernel.")] = None,
) -> None:
    """PNG charts of sweeps: GB/s per configuration, per kernel and shape (needs matplotlib)."""
    from memra.tune.receipts import read_receipts
    from memra.tune.research import plot

    for p in plot(read_receipts(files), out_dir, kernel=kernel):
        print(p)


app.add_typer(tune_app, name="tune"), app.add_typer(research_app, name="research")
