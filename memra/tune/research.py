"""Analysis over tuning receipts: summaries, A/B comparisons, Parquet export, sweep charts.

Everything takes receipts files (or folders of them, or a DataFrame already read with
memra.tune.receipts.read_receipts) and returns pandas DataFrames; the CLI renders them with rich.
Plots need matplotlib, an optional extra (`pip install 'memra[plot]'`), imported only here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from memra.errors import MemraError
from memra.tune.receipts import read_receipts

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
    by = list(by)
    _check_cols(df, by)
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


def compare(a, b, on: Sequence[str] = COMPARE_ON):
    """Configurations measured ok in both A and B, side by side: us_a, us_b and
    speedup = us_a / us_b (> 1: B is faster). Repeated measurements count by their median.
    `.attrs` holds how many configurations only one side has."""
    import pandas as pd

    on = list(on)
    da, db = _frame(a), _frame(b)
    for d in (da, db):
        _check_cols(d, on)

    def agg(d):
        ok = d[d["ok"]].copy()
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
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_parquet(path, index=False)
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


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", s).strip("_")[:120] or "shape"


def plot(receipts, out_dir: str | os.PathLike, *, kernel: str | None = None) -> list[Path]:
    """One PNG per (device, kernel, shape): GB/s of every configuration measured (x axis),
    one series per batch bucket, the fastest of each batch starred, failed configurations
    marked with a red x on the axis. Falls back to µs when receipts carry no byte counts."""
    df = _frame(receipts)
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
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{_slug(kern)}__{_slug(skey)}__{_slug(device)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
