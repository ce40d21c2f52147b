"""Analysis over receipts (summaries, comparisons, Parquet, plots) and the `memra tune` /
`memra research` commands run as a user runs them, on synthetic receipts whose answers
are known by construction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from memra.tune import research as R
from memra.errors import MemraError
from memra.tune.receipts import append_receipts, make_receipt, read_receipts

ROOT = Path(__file__).resolve().parent.parent
H200 = dict(device="NVIDIA H200", cc="9.0", sms=132, nvrtc="13.0")
QK = {"type": "Q4_K", "rows": 4096, "cols": 4096}
Q8 = {"type": "Q8_0", "rows": 576, "cols": 576}


def rec(us, nwarps, *, shape=QK, batch=1, variant="dp4a", ok=True, src="matvec.cu", src_hash="h"):
    t = dict(median_us=us, p20_us=us, p80_us=us, reps=10, bytes=int(us * 1000)) if ok else {}
    return make_receipt(kernel="matvec", variant=variant, config={"NWARPS": nwarps},
                        shape={**shape, "batch": batch}, src=src, src_hash=src_hash, ok=ok,
                        error=None if ok else "max_err 1.0 > 1e-3", peak_gbps=4000.0, **H200, **t)


@pytest.fixture
def files(tmp_path):
    a = tmp_path / "a.jsonl"
    append_receipts(a, [rec(10.0, 2), rec(8.0, 4), rec(9.0, 4, variant="fma"),
                        rec(None, 8, ok=False), rec(4.0, 2, shape=Q8), rec(5.0, 4, shape=Q8)])
    b = tmp_path / "b.jsonl"
    # B: NWARPS=2 twice as fast, NWARPS=4 unchanged, a config A never ran
    append_receipts(b, [rec(5.0, 2), rec(8.0, 4), rec(7.0, 16), rec(2.0, 2, shape=Q8)])
    return a, b


def test_summarize(files):
    s = R.summarize([files[0]], by=["shape_key", "variant"])
    row = s[(s.shape_key == "cols=4096,rows=4096,type=Q4_K") & (s.variant == "dp4a")].iloc[0]
    assert (row.n, row.ok, row.failed, row.configs) == (3, 2, 1, 3)
    assert row.best_us == 8.0 and row.median_us == 9.0 and row.best == "dp4a [NWARPS=4]"
    # bytes = us * 1000 → every ok receipt moves 1000 bytes per µs = 1 GB/s, 0.025 % of 4000
    assert row.best_gbps == pytest.approx(1.0) and row.best_pct_peak == pytest.approx(0.025)
    assert len(s) == 3  # Q4_K dp4a, Q4_K fma, Q8_0 dp4a
    by_cfg = R.summarize([files[0]], by=["config.NWARPS"])
    assert list(by_cfg["config.NWARPS"]) == [2, 4, 8] and list(by_cfg["n"]) == [2, 3, 1]
    with pytest.raises(MemraError, match="no receipt column 'nope'"):
        R.summarize([files[0]], by=["nope"])


def test_compare(files):
    c = R.compare([files[0]], [files[1]])
    got = {(r.shape_key[-4:], r.variant, r.config_key): r.speedup for r in c.itertuples()}
    assert got == {("Q4_K", "dp4a", "NWARPS=2"): 2.0, ("Q4_K", "dp4a", "NWARPS=4"): 1.0,
                   ("Q8_0", "dp4a", "NWARPS=2"): 2.0}
    # only in A: fma NWARPS=4 and Q8 NWARPS=4 (the failed NWARPS=8 is not a measurement);
    # only in B: NWARPS=16
    assert (c.attrs["only_a"], c.attrs["only_b"]) == (2, 1)


def test_parquet_round_trip(files, tmp_path):
    df = read_receipts(list(files))
    p = R.to_parquet(df, tmp_path / "out" / "r.parquet")
    back = pd.read_parquet(p)
    assert len(back) == len(df) == 10
    assert "config" not in back.columns and list(back["config.NWARPS"]) == list(df["config.NWARPS"])
    assert back["ok"].tolist() == df["ok"].tolist()
    assert back["median_us"].isna().sum() == 1


def test_plot_writes_one_png_per_shape(files, tmp_path):
    pytest.importorskip("matplotlib", reason="plots are the optional 'plot' extra")
    paths = R.plot([files[0]], tmp_path / "plots")
    assert len(paths) == 2  # two shapes
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    with pytest.raises(MemraError, match="no receipts for kernel 'attention'"):
        R.plot([files[0]], tmp_path / "plots", kernel="attention")


def test_plot_without_matplotlib_says_how_to_get_it(files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(MemraError, match=r"pip install 'memra\[plot\]'"):
        R.plot([files[0]], tmp_path / "plots")


# ---------------------------------------------------------------- the commands


def memra(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")  # behave as on a machine without a GPU
    env.pop("MEMRA_LOG", None)
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.mark.slow
def test_cli_freeze_then_show(tmp_path):
    from memra.gpu.compile import source_hash

    # receipts measured on today's norm.cu (current) and on an older version (ignored)
    now = source_hash("norm.cu")
    f = tmp_path / "r.jsonl"
    kw = dict(src="norm.cu", shape={"n": 4096})
    append_receipts(f, [rec(3.0, 8, src_hash=now, **kw), rec(2.0, 4, src_hash=now, **kw),
                        rec(1.0, 2, src_hash="0ld", **kw)])
    d = tmp_path / "defaults"
    r = memra("tune", "freeze", str(f), "--out-dir", str(d), "--json")
    assert r.returncode == 0, r.stderr
    (table,) = json.loads(r.stdout)
    e = table["entries"]["matvec"]["n=4096"]["1"]
    assert e["config"] == {"NWARPS": 4} and e["margin"] == pytest.approx(0.5)
    assert (d / "nvidia-h200.json").is_file()

    r = memra("tune", "show", "--json", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["gpu"] is None and doc["stale"] == []
    assert [t["device"] for t in doc["tables"]] == ["NVIDIA H200"]

    # the table now claims an older norm.cu: show lists the entry as stale
    table["entries"]["matvec"]["n=4096"]["1"]["src_hash"] = "0ld"
    (d / "nvidia-h200.json").write_text(json.dumps(table))
    doc = json.loads(memra("tune", "show", "--json", "--dir", str(d)).stdout)
    assert [(s["kernel"], s["table_hash"], s["current_hash"]) for s in doc["stale"]] == [
        ("matvec", "0ld", now)]


@pytest.mark.slow
def test_cli_research_summarize_and_compare(files, tmp_path):
    a, b = files
    r = memra("research", "summarize", str(a), "--by", "variant", "--json",
              "--parquet", str(tmp_path / "a.parquet"))
    assert r.returncode == 0, r.stderr
    rows = {x["variant"]: x for x in json.loads(r.stdout)}
    assert rows["dp4a"]["n"] == 5 and rows["dp4a"]["best_us"] == 4.0 and rows["fma"]["n"] == 1
    assert len(pd.read_parquet(tmp_path / "a.parquet")) == 6
    r = memra("research", "compare", str(a), str(b), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(x["speedup"] for x in doc["rows"]) == [1.0, 2.0, 2.0]
    r = memra("research", "compare", str(a), str(b))  # the rich table and the geometric mean
    assert r.returncode == 0 and "geometric-mean speedup 1.587" in r.stderr


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": 1}\n')
    r = memra("research", "summarize", str(bad))
    assert r.returncode == 1 and r.stderr.startswith("memra: error: ") and "bad.jsonl:1" in r.stderr
    assert "Traceback" not in r.stderr
    r = memra("tune", "run", "no-such-campaign", "--dry-run")
    assert r.returncode == 1 and "no campaign 'no-such-campaign'" in r.stderr


def test_cli_dry_run_lists_model_jobs():
    r = memra("tune", "run", "decode", "--model", "smollm2-135m", "--kernels", "embed", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines and all(x.split("\t")[0] == "embed" for x in lines)
    assert any("\tn=576,type=Q8_0\t" in x for x in lines)  # SmolLM2's n_embd, Q8_0 token table


@pytest.mark.slow
def test_cli_tune_campaign_form():
    """`memra tune CAMPAIGN …` (the issue's form) is `memra tune run CAMPAIGN …`."""
    args = ["decode", "--model", "smollm2-135m", "--kernels", "embed", "--dry-run"]
    short, long = memra("tune", *args), memra("tune", "run", *args)
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout and short.stdout.strip()
    assert memra("tune", "show", "--json").returncode == 0  # subcommands still resolve
