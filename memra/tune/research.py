"""Analysis over receipts: summaries, A/B comparisons, Parquet export, charts.

Everything takes receipts files (or folders of them, or a DataFrame already read with
memra.tune.receipts.read_receipts) and returns pandas DataFrames; the CLI renders them with rich.
A folder holds receipts of several kinds (tune, bench, ...; memra.tune.receipts.KINDS):
`summarize_all` and `compare` work kind by kind, each with its kind's groups, figure and
direction (µs: lower is better; t/s: higher), and `plot` draws the kinds it has a chart for.
Plots need matplotlib, an optional extra (`pip install 'memra[plot]'`), imported only here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from memra.errors import MemraError
from memra.tune.receipts import KINDS, read_receipts

DEFAULT_BY = ("kernel", "shape_key", "batch", "variant")
COMPARE_ON = ("kernel", "variant", "config_key", "shape_key", "batch")


def _frame(src):
    import pandas as pd

    if isinstance(src, pd.DataFrame):
        return src
    if isinstance(src, (str, os.PathLike)):
        src = [src]
    return read_receipts(list(src))


def _check_cols(df, cols: Iterable[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        known = sorted(c for c in df.columns if not c.startswith("_"))
        raise MemraError(f"no receipt column {', '.join(map(repr, missing))} "
                         f"(columns: {', '.join(known)})")


def summarize(receipts, by: Sequence[str] = DEFAULT_BY):
    """Per group: receipts, ok / failed counts, distinct configs, the fastest ok median,
    the median of ok medians, best GB/s and % of peak, and the fastest configuration."""
    import pandas as pd

    df = _frame(receipts)
    if "kind" in df.columns:
        df = df[df["kind"] == "tune"]
    by = list(by)
    _check_cols(df, by)
    df = df.assign(ok=df["ok"].astype(bool))
    rows = []
    for keys, g in df.groupby(by, sort=True, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        ok = g[g["ok"]]
        best = ok.loc[ok["median_us"].astype(float).idxmin()] if len(ok) else None
        rows.append({
            **dict(zip(by, keys)),
            "n": len(g), "ok": len(ok), "failed": len(g) - len(ok),
            "configs": g.groupby(["variant", "config_key"]).ngroups,
            "best_us": float(best["median_us"]) if best is not None else None,
            "median_us": float(ok["median_us"].astype(float).median()) if len(ok) else None,
            "best_gbps": _max(ok["gbps"]), "best_pct_peak": _max(ok["pct_peak"]),
            "best": f"{best['variant']} [{best['config_key']}]" if best is not None else None,
        })
    return pd.DataFrame(rows, columns=by + ["n", "ok", "failed", "configs", "best_us",
                                            "median_us", "best_gbps", "best_pct_peak", "best"])


def _max(s):
    s = s.dropna()
    return float(s.astype(float).max()) if len(s) else None


def _kind(name: str):
    return next(k for k in KINDS.values() if k.name == name)


def summarize_generic(df, kind_name: str, by: Sequence[str] | None = None):
    """Per group of one kind's receipts: n, the median and the best of its figure, the best
    row's label (a configuration, a commit), and the newest time."""
    import pandas as pd

    k = _kind(kind_name)
    by = list(by or k.by)
    _check_cols(df, by)
    for c in by:  # integer keys made float by another kind's missing values print as integers
        v = df[c].dropna()
        if df[c].dtype.kind == "f" and len(v) and (v == v.round()).all():
            df = df.assign(**{c: df[c].astype("Int64")})
    rows = []
    for keys, g in df.groupby(by, sort=True, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        row = {**dict(zip(by, keys)), "n": len(g)}
        if k.value and k.value in g.columns:
            ok = g[g["ok"].fillna(False).astype(bool)] if "ok" in g.columns and g["ok"].notna().any() else g
            v = pd.to_numeric(ok[k.value], errors="coerce").dropna()
            row["failed"] = len(g) - len(ok)
            row[f"median {k.value}"] = float(v.median()) if len(v) else None
            i = (v.idxmin() if k.better == "min" else v.idxmax()) if len(v) else None
            row[f"best {k.value}"] = float(v[i]) if i is not None else None
            row["best"] = str(ok.loc[i, k.label]) if i is not None and k.label in ok.columns else None
        elif k.label and k.label in g.columns:
            row["last"] = str(g[k.label].iloc[-1])
        if k.time and k.time in g.columns:
            t = g[k.time].dropna().astype(str)
            row["newest"] = t.max() if len(t) else None
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_all(receipts, by: Sequence[str] | None = None) -> dict:
    """{kind name: its summary} for every kind in the receipts: tuning receipts as
    `summarize`, every other kind by its KINDS entry's groups and figure. `by` replaces the
    groups of every kind that has those columns (an error when none has)."""
    df = _frame(receipts)
    out = {}
    names = sorted(set(df["kind"].dropna())) if "kind" in df.columns else []
    if by:
        usable = [n for n in names if all(c in df[df["kind"] == n].dropna(axis=1, how="all").columns
                                          for c in by)]
        if not usable:
            _check_cols(df.dropna(axis=1, how="all"), by)
        names = usable
    for name in names:
        part = df[df["kind"] == name]
        if name == "tune":  # its schema's columns, present even when empty
            out[name] = summarize(part, by=by or DEFAULT_BY)
            continue
        part = part.dropna(axis=1, how="all")
        out[name] = summarize_generic(part, name, by)
    return out


def compare(a, b, on: Sequence[str] | None = None):
    """Receipts measured in both A and B, kind by kind, side by side: `a` and `b` (the
    figure's median over repeated measurements) and speedup (> 1: B is better: faster for
    µs, more for t/s). Tuning receipts keep their columns us_a, us_b, gbps_a, gbps_b.
    `.attrs` holds how many groups only one side has (only_a, only_b) and `by_kind`."""
    import pandas as pd

    da, db = _frame(a), _frame(b)
    parts, only_a, only_b, by_kind = [], 0, 0, {}
    kinds = sorted(set(da["kind"].dropna()) & set(db["kind"].dropna())) if "kind" in da.columns else []
    if not kinds and on:
        _check_cols(da, on)
    for name in kinds:
        k = _kind(name)
        pa, pb = da[da["kind"] == name], db[db["kind"] == name]
        if name != "tune":  # other kinds: only the columns they carry
            pa, pb = pa.dropna(axis=1, how="all"), pb.dropna(axis=1, how="all")
        cols = list(on or k.on)
        if not cols or not k.value:
            continue
        if on and not all(c in pa.columns and c in pb.columns for c in cols):
            continue
        for d in (pa, pb):
            _check_cols(d, cols)
        c = _compare_tune(pa, pb, cols) if name == "tune" else _compare_generic(pa, pb, cols, k)
        c.insert(0, "kind", name)
        only_a += c.attrs["only_a"]
        only_b += c.attrs["only_b"]
        by_kind[name] = {"matched": len(c), "only_a": c.attrs["only_a"], "only_b": c.attrs["only_b"]}
        parts.append(c)
    if on and not parts:
        _check_cols(da, on)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["kind", "speedup"])
    out.attrs.update(only_a=only_a, only_b=only_b, by_kind=by_kind)
    return out


def _ok(d):
    if "ok" in d.columns and d["ok"].notna().any():
        return d[d["ok"].fillna(False).astype(bool)].copy()
    return d.copy()


def _compare_tune(da, db, on):
    def agg(d):
        ok = _ok(d)
        ok["median_us"] = ok["median_us"].astype(float)
        ok["gbps"] = ok["gbps"].astype(float)
        return ok.groupby(on, sort=True).agg(us=("median_us", "median"), gbps=("gbps", "median"),
                                              n=("median_us", "size"))

    ga, gb = agg(da), agg(db)
    m = ga.merge(gb, left_index=True, right_index=True, suffixes=("_a", "_b")).reset_index()
    m["speedup"] = m["us_a"] / m["us_b"]
    out = m[on + ["us_a", "us_b", "speedup", "gbps_a", "gbps_b", "n_a", "n_b"]]
    out.attrs["only_a"] = int(len(ga.index.difference(gb.index)))
    out.attrs["only_b"] = int(len(gb.index.difference(ga.index)))
    return out


def _compare_generic(da, db, on, k):
    import pandas as pd

    def agg(d):
        ok = _ok(d)
        ok[k.value] = pd.to_numeric(ok[k.value], errors="coerce")
        return ok.dropna(subset=[k.value]).groupby(on, sort=True).agg(v=(k.value, "median"),
                                                                      n=(k.value, "size"))

    ga, gb = agg(da), agg(db)
    m = ga.merge(gb, left_index=True, right_index=True, suffixes=("_a", "_b")).reset_index()
    m["speedup"] = m["v_a"] / m["v_b"] if k.better == "min" else m["v_b"] / m["v_a"]
    out = m.rename(columns={"v_a": f"{k.value}_a", "v_b": f"{k.value}_b"})
    out = out[on + [f"{k.value}_a", f"{k.value}_b", "speedup", "n_a", "n_b"]]
    out.attrs["only_a"] = int(len(ga.index.difference(gb.index)))
    out.attrs["only_b"] = int(len(gb.index.difference(ga.index)))
    return out


def to_parquet(df, path: str | os.PathLike) -> Path:
    """Write receipts (or a summary) to Parquet. The nested config/shape dicts are dropped
    (their flattened config.* / shape.* columns and *_key texts carry the same facts), and
    a column mixing value types (e.g. a tunable that is a number in one kernel and a word in
    another) is written as text."""
    import pandas as pd

    path = Path(path)
    out = df.drop(columns=[c for c in ("config", "shape", "ops") if c in df.columns]).copy()
    for c in out.columns:
        if out[c].dtype == object:
            kinds = {type(v) for v in out[c].dropna()}
            if len(kinds) > 1 or kinds - {str, int, float, bool}:
                out[c] = out[c].map(lambda v: None if v is None or (isinstance(v, float) and pd.isna(v))
                                    else str(v))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out.to_parquet(path, index=False)
    except OSError as e:  # a folder, a file as the parent, no permission
        raise MemraError(f"{path}: cannot write Parquet ({e.strerror or e})") from None
    return path


def _import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MemraError("plots need matplotlib, an optional extra: pip install 'memra[plot]' "
                         "(or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, ax, path: Path, legend_size: int) -> Path:
    """A chart's grid, legend and layout, written as a PNG and closed."""
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", s).strip("_")[:120] or "shape"


def plot(receipts, out_dir: str | os.PathLike, *, kernel: str | None = None) -> list[Path]:
    """PNG charts of every kind that has one: tuning sweeps (`plot_tune`) and bench runs
    (`plot_bench`). Returns the files written."""
    df = _frame(receipts)
    if df.empty:
        raise MemraError("no receipts to plot")
    kinds = set(df["kind"].dropna()) if "kind" in df.columns else {"tune"}
    if kernel is not None or kinds <= {"tune"}:
        return plot_tune(df, out_dir, kernel=kernel)
    plottable = kinds & {"tune", "bench"}
    if not plottable:
        raise MemraError(f"no chart for receipts of kind {', '.join(sorted(kinds))} (charts: tune, bench)")
    paths = []
    if "tune" in plottable:
        paths += plot_tune(df[df["kind"] == "tune"].dropna(axis=1, how="all"), out_dir)
    if "bench" in plottable:
        paths += plot_bench(df[df["kind"] == "bench"].dropna(axis=1, how="all"), out_dir)
    return paths


def plot_bench(receipts, out_dir: str | os.PathLike) -> list[Path]:
    """One PNG per (device, test): the median t/s of each model and engine over the runs'
    dates (one point per receipt), so a board's history reads left to right."""
    df = _frame(receipts)
    df = df[df["kind"] == "bench"] if "kind" in df.columns else df
    if df.empty:
        raise MemraError("no bench receipts to plot")
    plt = _import_pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (device, test), g in df.groupby(["device", "test"], sort=True):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        when = sorted(set(g["date"].str[:16]))  # one x position per minute a receipt was written
        x_of = {w: i for i, w in enumerate(when)}
        for (model, engine), gm in g.groupby(["model", "engine"], sort=True):
            gm = gm.sort_values("date")
            ax.plot([x_of[w] for w in gm["date"].str[:16]], gm["median_ts"].astype(float), marker="o",
                    linestyle="-" if engine == "memra" else "--", label=f"{model} ({engine})")
        ax.set_xticks(range(len(when)))
        ax.set_xticklabels(when)
        ax.set_ylabel("t/s (median)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{test} · {device}", fontsize=9)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        paths.append(_save(plt, fig, ax, out_dir / f"bench__{_slug(test)}__{_slug(device)}.png", 6))
    return paths


def plot_tune(receipts, out_dir: str | os.PathLike, *, kernel: str | None = None) -> list[Path]:
    """One PNG per (device, kernel, shape): GB/s of every configuration measured (x axis),
    one series per batch bucket, the fastest of each batch starred, failed configurations
    marked with a red x on the axis. Falls back to µs when receipts carry no byte counts."""
    df = _frame(receipts)
    if "kind" in df.columns:
        df = df[df["kind"] == "tune"]
    df = df.assign(ok=df["ok"].astype(bool))
    if kernel is not None:
        df = df[df["kernel"] == kernel]
        if df.empty:
            raise MemraError(f"no receipts for kernel {kernel!r}")
    if df.empty:
        raise MemraError("no receipts to plot")
    plt = _import_pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (device, kern, skey), g in df.groupby(["device", "kernel", "shape_key"], sort=True):
        g = g.assign(label=g["variant"] + " " + g["config_key"].where(g["config_key"] != "", "default"))
        labels = sorted(set(g["label"]))
        x_of = {lab: i for i, lab in enumerate(labels)}
        use_gbps = g.loc[g["ok"], "gbps"].notna().any()
        metric, unit = ("gbps", "GB/s") if use_gbps else ("median_us", "µs")
        fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(labels) + 2), 4.5))
        for batch, gb in g.groupby("batch", sort=True):
            ok = gb[gb["ok"]].groupby("label")[metric].median()
            xs = [x_of[lab] for lab in ok.index]
            line, = ax.plot(xs, ok.values, marker="o", linestyle="-", label=f"batch {batch}")
            if len(ok):
                best = ok.idxmax() if use_gbps else ok.idxmin()
                ax.plot([x_of[best]], [ok[best]], marker="*", markersize=14, color=line.get_color())
            bad = sorted(set(gb.loc[~gb["ok"], "label"]) - set(ok.index))
            if bad:
                ax.plot([x_of[lab] for lab in bad], [0] * len(bad), "x", color="red", markersize=8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{kern} · {skey}\n{device}", fontsize=9)
        paths.append(_save(plt, fig, ax, out_dir / f"{_slug(kern)}__{_slug(skey)}__{_slug(device)}.png", 7))
    return paths
