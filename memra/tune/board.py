"""`memra research board`: the performance tables of docs/PERFORMANCE.md and README.md,
generated from the committed `memra bench` receipts (every kind "bench" line under research/).

A board sits between two markers in a Markdown file, and only what lies between them is
rewritten (the prose around it is the author's):

    <!-- board: newest -->            the newest run of every model and cell
    <!-- board: commit=5c74cb8 -->    the runs at one commit (a session's board, kept as it was)
    <!-- board: newest cells=tg128 short -->   README's sample: tg cells, fewer columns
    ...generated table...
    <!-- /board -->

For each device, model and cell (pp512, tg128, depth cells) a row shows memra's median t/s
(with its sample standard deviation and N), % of the measured copy bandwidth (tg cells),
llama.cpp's median from the same run and the ratio, and the run's date, device, commit and
tag. A run is one `memra bench` invocation: its receipts share a file, commit, tag, device
and model; runs made with a rollback seam set (their receipts' `seams`), a KV cache type other
than f16 (`cache_type_k` / `cache_type_v`: a runtime choice, not the default engine) or a
tuning table given as an experiment's file (`table` "file:..." outside tune/defaults/) or a working tree labelled as
an experiment's (`git_sha` "<sha>+<label>", the label not "dirty") are left out. The run chosen for a cell is the newest one that has both arms (`--vs llama.cpp`);
when no run has the llama.cpp arm, the newest memra run is shown and the table says so:
ratios are only taken within a run (research/benchmarks.md). `check` reports the boards that
differ from what the receipts give (CI runs `memra research board --check`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from memra.errors import MemraError
from memra.paths import read_text

MARK = re.compile(r"(<!-- board: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /board -->)", re.S)
NO_ARM = "not in the run"


@dataclass(frozen=True)
class Spec:
    select: str = "newest"      # "newest" or "commit=SHA"
    cells: tuple[str, ...] = ()  # only these tests (e.g. tg128); () every cell
    short: bool = False          # README's sample columns


def parse_spec(text: str) -> Spec:
    select, cells, short = "newest", (), False
    for word in text.split():
        if word == "newest" or word.startswith("commit="):
            select = word
        elif word.startswith("cells="):
            cells = tuple(c for c in word[6:].split(",") if c)
        elif word == "short":
            short = True
        else:
            raise MemraError(f"board marker: unknown word {word!r} (newest, commit=SHA, cells=a,b, short)")
    return Spec(select, cells, short)


def load_bench(research: Path):
    """Every bench receipt under `research` (a DataFrame), with `run` and `when` columns."""
    from memra.tune.receipts import read_receipts

    df = read_receipts([research], kinds=("bench",))
    if df.empty:
        raise MemraError(f"no bench receipts under {research}")
    df = df.dropna(axis=1, how="all").copy()
    if "tag" not in df.columns:
        df["tag"] = None
    df["run"] = [f"{f}|{s}|{t}|{d}|{m}" for f, s, t, d, m in
                 zip(df["file"], df["git_sha"], df["tag"].fillna(""), df["device"], df["model"])]
    df["when"] = df.groupby("run")["date"].transform("max")
    return df


def _model_order(df) -> list[str]:
    size = df.groupby("model")["model_size"].max() if "model_size" in df.columns else None
    models = sorted(set(df["model"]))
    return sorted(models, key=lambda m: (-(size[m] if size is not None and size[m] == size[m] else 0), m))


def _cell_order(test: str) -> tuple:
    m = re.match(r"(pp|tg)(\d+)(?: @ d(\d+))?", test)
    if not m:
        return (2, 0, 0, test)
    return (int(m.group(3) or 0), 0 if m.group(1) == "tg" else 1, int(m.group(2)), test)


def rows(df, spec: Spec) -> list[dict]:
    """One row per device, model and cell, as the spec selects."""
    if spec.select.startswith("commit="):
        sha = spec.select[7:]
        df = df[df["git_sha"].astype(str).str.startswith(sha)]
        if df.empty:
            raise MemraError(f"board: no bench receipts at commit {sha}")
    out = []
    for device in sorted(set(df["device"])):
        dd = df[df["device"] == device]
        for model in _model_order(dd):
            dm = dd[dd["model"] == model]
            for test in sorted(set(dm["test"]), key=_cell_order):
                if spec.cells and test not in spec.cells:
                    continue
                dt = dm[dm["test"] == test]
                mem = dt[dt["engine"] == "memra"]
                if "seams" in mem.columns:  # a rollback seam set: not the default engine
                    mem = mem[[_default_seams(v) for v in mem["seams"]]]
                for c in ("cache_type_k", "cache_type_v"):  # a quantized KV cache: not the default either
                    if c in mem.columns:
                        mem = mem[[not isinstance(v, str) or v == "f16" for v in mem[c]]]
                if "table" in mem.columns:  # a table given as an experiment's file: not the default
                    mem = mem[[not _experiment_table(v) for v in mem["table"]]]
                # a working tree labelled as an experiment's (MEMRA_GIT_SHA=<sha>+<label>, e.g. a table not yet
                # landed applied for the run): not a commit's engine either
                if len(mem):
                    mem = mem[~mem["git_sha"].map(_experiment_tree).astype(bool)]
                if mem.empty:
                    continue
                lc_runs = set(dt.loc[dt["engine"] == "llama.cpp", "run"])
                both = mem[mem["run"].isin(lc_runs)]
                pick = (both if len(both) else mem).sort_values(["when", "date", "line"]).iloc[-1]
                run = dt[dt["run"] == pick["run"]]
                lc = run[run["engine"] == "llama.cpp"]
                lc = lc.sort_values(["date", "line"]).iloc[-1] if len(lc) else None
                out.append({"device": device, "model": model, "test": test, "memra": pick, "llama": lc})
    return out


def _default_seams(seams) -> bool:
    """Whether a receipt's `seams` (the flags its run moved off the defaults of its day) name
    today's default engine: none set, or each at today's default (a run made with
    MEMRA_ATTN=hybrid before hybrid became the default is a run of the default engine now)."""
    from memra.tune.bench import ENGINE_PATHS, SEAMS

    if not isinstance(seams, dict):
        return True
    defaults = {**SEAMS, **ENGINE_PATHS}
    return all(defaults.get(k) and str(v).strip().lower() == defaults[k] for k, v in seams.items())


def _experiment_table(table) -> bool:
    """Whether a receipt's tuning table is a file other than a device's committed default
    (`--tune-table FILE` for an A/B): such runs measure an experiment, not the default engine."""
    return isinstance(table, str) and table.startswith("file:") and "tune/defaults/" not in table


def _experiment_tree(sha) -> bool:
    """Whether a receipt's commit names a working tree labelled as an experiment's (`<sha>+<label>`, the
    label not `dirty`): a device run of changes not landed (a held-back table, a kernel under test)."""
    label = str(sha).partition("+")[2]
    return bool(label) and label != "dirty"


def _num(v, nd: int = 1) -> str:
    return "—" if v is None or v != v else f"{float(v):.{nd}f}"


def table(df, spec: Spec) -> str:
    rs = rows(df, spec)
    if not rs:
        raise MemraError(f"board: no cells for {spec}")
    lines = []
    if spec.short:
        lines += ["| model | test | memra t/s | llama.cpp t/s | ratio | device | date |",
                  "|---|---|---|---|---|---|---|"]
    else:
        lines += ["| model | test | memra t/s (median ± sd, N) | % of copy bw | llama.cpp t/s (median, N) "
                  "| ratio | date | device | commit | tag |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
    missing = 0
    for r in rs:
        m, lc = r["memra"], r["llama"]
        n = len(m["samples_ts"])
        ratio = "—" if lc is None else f"{float(m['median_ts']) / float(lc['median_ts']):.2f}x"
        missing += lc is None
        date = str(m["when"])[:10]
        if spec.short:
            lines.append(f"| {r['model']} | {r['test']} | {_num(m['median_ts'])} | "
                         f"{NO_ARM if lc is None else _num(lc['median_ts'])} | {ratio} | {r['device']} | {date} |")
            continue
        lcs = NO_ARM if lc is None else f"{_num(lc['median_ts'])} ({len(lc['samples_ts'])})"
        pct = m.get("pct_bw")
        sha = str(m["git_sha"])
        commit = sha[:7] + (" (dirty)" if sha.endswith("+dirty") else "")
        tag = m.get("tag")
        lines.append(f"| {r['model']} | {r['test']} | {_num(m['median_ts'])} ± {_num(m['stddev_ts'])} ({n}) | "
                     f"{_num(pct)} | {lcs} | {ratio} | {date} | {r['device']} | {commit} | "
                     f"{tag if isinstance(tag, str) and tag else '—'} |")
    if missing:
        lines.append("")
        lines.append(f"llama.cpp: {missing} of {len(rs)} cells have no run with both arms (`memra bench "
                     f"--vs llama.cpp`); their ratio is left out rather than taken across sessions.")
    return "\n".join(lines) + "\n"


def render(text: str, df) -> str:
    """`text` with every board between markers regenerated."""
    def sub(m: re.Match) -> str:
        return m.group(1) + table(df, parse_spec(m.group("spec"))) + m.group(4)

    return MARK.sub(sub, text)


def boards(files: list[Path], research: Path) -> list[tuple[Path, str, str]]:
    """(file, its text, the text with regenerated boards) for each file holding a board."""
    texts = []
    for f in files:  # a bad file fails before the receipts are read
        text = read_text(f)
        if not MARK.search(text):
            raise MemraError(f"{f}: no board markers (<!-- board: newest --> … <!-- /board -->)")
        texts.append((f, text))
    df = load_bench(research)
    return [(f, text, render(text, df)) for f, text in texts]
