"""`memra bench` and `memra kernel-check` on the CPU.

The bench's timed paths run on the GPU engine driven through the kernel emulator
(tests/gpu_emulator.py), so cell bookkeeping, depth, receipts and the tokens the timed
decode produces are checked here; the figures themselves come from the H200. Oracles:
hand-computed statistics, byte counts summed by hand from the GGUF's tensor sizes (read
with the `gguf` package), the CPU reference's greedy tokens, and llama-bench's JSONL
format (a stand-in script that prints what llama-bench prints)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gpu_emulator import FakeGpu, install
from memra.tune import bench as B
from memra.gpu.engine import GPUEngine
from memra.errors import MemraError
from memra.model.gguf import open_gguf
from memra.cpu.reference import ReferenceModel

ROOT = Path(__file__).resolve().parent.parent
BW = 4.0e12  # the emulated device's "measured" copy bandwidth, bytes/s


class BenchGpu(FakeGpu):
    """The emulator with the device facts and the bandwidth memra bench records."""

    def __init__(self):
        super().__init__(1 << 28)
        self.info = SimpleNamespace(name="Emulated H200", cc=(9, 0), arch="sm_90a", sm_count=132,
                                    driver_version=13000)

    def copy_bandwidth(self, refresh=False):
        return BW


def memra(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("MEMRA_LOG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True, cwd=ROOT,
                          env=e, timeout=600)


def has_gpu():
    from memra.gpu.cuda import has_gpu as h

    return h()


# -- statistics and cells -------------------------------------------------------------------

def test_stats_against_hand_computed_values():
    s = B.stats([100.0, 110.0, 90.0, 130.0, 70.0])
    assert s["avg_ts"] == pytest.approx(100.0)
    assert s["median_ts"] == pytest.approx(100.0)
    # sample standard deviation: squares 0, 100, 100, 900, 900 over n - 1 = 4
    assert s["stddev_ts"] == pytest.approx(math.sqrt(500.0))
    assert s["samples_ts"] == [100.0, 110.0, 90.0, 130.0, 70.0]
    s = B.stats([1.0, 2.0, 3.0, 10.0])  # even count: median between the middle two
    assert (s["avg_ts"], s["median_ts"]) == (pytest.approx(4.0), pytest.approx(2.5))
    assert s["stddev_ts"] == pytest.approx(math.sqrt((9 + 4 + 1 + 36) / 3))
    assert B.stats([42.0])["stddev_ts"] == 0.0  # llama-bench: 0 for a single sample


def test_cells_follow_llama_bench():
    p = B.parse_counts(["512,1024", "0"], "-p", [512])
    n = B.parse_counts("128", "-n", [128])
    d = B.parse_counts(["0,4096"], "-d", [0])
    cells = B.make_cells(p, n, d)
    assert [c.test for c in cells] == ["pp512", "pp1024", "tg128", "pp512 @ d4096", "pp1024 @ d4096",
                                       "tg128 @ d4096"]
    assert B.parse_counts(None, "-d", [0]) == [0]
    assert [c.test for c in B.make_cells([0], [64], [0])] == ["tg64"]  # -p 0 skips pp
    with pytest.raises(MemraError, match="nothing to measure"):
        B.make_cells([0], [0], [0])
    with pytest.raises(MemraError, match="-n takes token counts"):
        B.parse_counts("12x", "-n", [128])
    with pytest.raises(MemraError, match=">= 0"):
        B.parse_counts("-5", "-p", [512])


# -- bytes per token --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _file_bytes(path):
    """(weight bytes a decode step reads, K/V width) summed from the file's tensor sizes as
    the gguf package reads them: every tensor but the input embedding table (and the rope
    factors, folded into the engine's own table at load), one embedding row, and the table
    again when the output projection is tied to it."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    n_vocab = int(emb.shape[1])  # gguf order: (n_embd, n_vocab)
    n = sum(v for k, v in sizes.items() if k not in ("token_embd.weight", "rope_freqs.weight"))
    n += sizes["token_embd.weight"] // n_vocab
    if "output.weight" not in sizes:
        n += sizes["token_embd.weight"]
    kv_dim = int(next(t for t in r.tensors if t.name == "blk.0.attn_k.weight").shape[1])
    return n, kv_dim, sum(sizes.values())


def _hand_bytes(path, depth, windows):
    """The weights plus f16 K and V for each key each layer reads (depth + 1, at most its window)."""
    n, kv_dim, _ = _file_bytes(path)
    keys = sum(min(depth + 1, w) if w else depth + 1 for w in windows)
    return n + keys * kv_dim * 2 * 2


@pytest.fixture(scope="module")
def llama_engine(tiny_models):
    path = tiny_models("llama", "Q4_K_M")
    return path, GPUEngine(path, n_ctx=64, gpu=BenchGpu())


@pytest.mark.slow
def test_bytes_per_token_hand_count_llama(llama_engine):
    path, e = llama_engine
    for depth in (0, 7, 40):
        assert e.bytes_per_token(depth) == _hand_bytes(path, depth, [0] * 4)


@pytest.mark.slow
def test_bytes_per_token_hand_count_gemma3(tiny_models):
    """Tied output, Q/K norms, post-norms and a 16-token window on five of every six layers
    (layer 5 of the seven is global, as in gemma3's pattern)."""
    path = tiny_models("gemma3", "Q4_K_M")
    e = GPUEngine(path, n_ctx=64, gpu=BenchGpu())
    windows = [16, 16, 16, 16, 16, 0, 16]
    for depth in (0, 5, 40):
        assert e.bytes_per_token(depth) == _hand_bytes(path, depth, windows)
    assert e.bytes_per_token(40) - e.bytes_per_token(30) == 10 * e.cfg.kv_dim * 4  # only the global layer grows


# -- the timed paths on the emulated engine ---------------------------------------------------

def test_timed_decode_produces_the_reference_greedy_tokens(llama_engine):
    """The timed tg path is a real greedy decode: from a cache filled to depth 9, its tokens
    equal the CPU reference's greedy continuation of the same 10 tokens."""
    path, e = llama_engine
    fill_ids = [1, 17, 2398, 11, 905, 33, 4020, 8, 64]
    first = 1200
    B.fill(e, fill_ids)
    _, toks = B.time_decode(e, len(fill_ids), first, 6)
    m = ReferenceModel(open_gguf(path), numerics=e.path)  # the oracle of the engine's matvec path
    cache = m.new_cache(32)
    logits = m.forward(fill_ids + [first], cache)
    ref = []
    for _ in range(6):
        ref.append(int(np.argmax(logits)))
        logits = m.forward([ref[-1]], cache)
    assert toks == ref
    assert e.pos[0] == len(fill_ids) + 6
    # rewound and replayed: the same tokens again (the depth is what the cell sees)
    _, again = B.time_decode(e, len(fill_ids), first, 6)
    assert again == toks


def test_timed_decode_replays_decode_runs_chunks(tiny_models, monkeypatch):
    """The timed tg path takes the graphs decode_run (memra run, memra serve) takes: a chunk of steps a graph, at its
    own split count and attention kind. With the attention switch at 24 keys a 40-step run from depth 4 crosses it
    (chunks short, both, long); the timed steps give decode_run's tokens from the same start, on those graphs."""
    from memra.gpu.runner import DECODE_CHUNK, Sampling

    monkeypatch.setenv("MEMRA_ATT_SWITCH", "24")
    e = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=64, gpu=BenchGpu())
    B.fill(e, [1, 17, 2398, 11])
    chunks = e.decode_chunks(4, 4, 40, DECODE_CHUNK)
    assert [(m, kd) for m, _, kd in chunks] == [(16, "short"), (16, "both"), (8, "long")]
    _, toks = B.time_decode(e, 4, 1200, 40)
    kinds = {k[-1] for k in e._graphs if isinstance(k[0], int)}
    assert kinds >= {"short", "both", "long"}
    e.rewind(e.seqs[0], 4)
    ran = [t[0] for t in e.decode_run([e.seqs[0]], [1200], 40, [Sampling(0.0)])]
    assert toks == ran
    # MEMRA_GRAPH_STEPS=8: the same steps, eight a graph launch
    monkeypatch.setenv("MEMRA_GRAPH_STEPS", "8")
    e8 = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=64, gpu=BenchGpu())
    B.fill(e8, [1, 17, 2398, 11])
    assert B.time_decode(e8, 4, 1200, 40)[1] == toks
    assert {k[-1] for k in e8._graphs if k[0] == "steps"} == {8}


def test_run_writes_one_receipt_per_cell(llama_engine, tmp_path, monkeypatch):
    path, e = llama_engine
    monkeypatch.setenv("MEMRA_GIT_SHA", "abc123+dirty")
    cells = B.make_cells([8], [4], [0, 6])
    common = B.common_fields("tiny", path, e, "builtin", "t1")
    out = tmp_path / "r.jsonl"
    seen = []
    rows = B.run(e, common=common, cells=cells, reps=3, bw_bytes_s=BW, gate="MATCH", out=out, on_receipt=seen.append)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines == rows == seen
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(8, 0, 0), (0, 4, 0), (8, 0, 6), (0, 4, 6)]
    size = _file_bytes(path)[2]
    for r in rows:
        assert r["engine"] == "memra" and r["kind"] == "bench" and r["model"] == "tiny"
        assert r["model_size"] == size and r["model_file"] == path.name
        assert (r["device"], r["cc"], r["sms"], r["driver"]) == ("Emulated H200", "9.0", 132, "13.0")
        assert r["git_sha"] == "abc123+dirty" and r["table"] == "builtin" and r["tag"] == "t1"
        assert r["gate"] == "MATCH" and r["matvec_path"] in ("f32", "q8") and r["bw_gbps"] == 4000.0
        assert len(r["samples_ts"]) == 3 and all(v > 0 for v in r["samples_ts"])
        s = B.stats(r["samples_ts"])
        assert r["avg_ts"] == pytest.approx(s["avg_ts"], abs=2e-3)
        assert r["median_ts"] == pytest.approx(s["median_ts"], abs=2e-3)
        assert r["date"].endswith("Z") and r["nvrtc"]
        if r["n_gen"]:
            d = r["n_depth"]
            # the cell's steps read the cache at depths d .. d+3
            hand = sum(_hand_bytes(path, d + k, [0] * 4) for k in range(4)) / 4
            assert r["bytes_per_token"] == round(hand)
            assert r["gbps"] == pytest.approx(r["median_ts"] * hand / 1e9, rel=1e-3, abs=0.06)
            assert r["pct_bw"] == pytest.approx(100 * r["gbps"] / 4000.0, abs=0.06)
        else:
            assert r["gbps"] is None and r["pct_bw"] is None and r["bytes_per_token"] is None
    assert e.pos[0] == 6 + 4  # the last cell: tg4 on a cache of depth 6


FAKE_LLAMA_BENCH = r'''#!{python}
import json, sys
a = sys.argv[1:]
open({log!r}, "a").write(json.dumps(a) + "\n")
v = dict(zip(a[::2], a[1::2]))
p, n, d, r = int(v["-p"]), int(v["-n"]), int(v["-d"]), int(v["-r"])
ns = [1000000 * (i + 1) for i in range(r)]
ts = [1e9 * (p + n) / x for x in ns]
print("ggml_cuda_init: found 1 CUDA devices", file=sys.stderr)
print('{{"build_commit": "b10605x", "build_number": 10605, "gpu_info": "NVIDIA H200", "model_filename": "%s", '
      '"model_size": 1, "n_prompt": %d, "n_gen": %d, "n_depth": %d, "avg_ts": %f, "stddev_ts": 0.0, '
      '"samples_ns": [ %s ],"samples_ts": [ %s ]}}' % (v["-m"], p, n, d, sum(ts) / r,
      ", ".join(map(str, ns)), ", ".join(map(str, ts))))
'''


def test_vs_llama_cpp_interleaves_and_writes_both_arms(llama_engine, tmp_path):
    path, e = llama_engine
    log = tmp_path / "argv.jsonl"
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    cells = B.make_cells([8], [4], [0])
    common = B.common_fields("tiny", path, e, "builtin", None)
    rows = B.run(e, common=common, cells=cells, reps=2, bw_bytes_s=BW, gate="MATCH", out=tmp_path / "r.jsonl",
                 gguf=path, llama_bench=str(exe))
    assert [(r["engine"], r["test"]) for r in rows] == [("memra", "pp8"), ("llama.cpp", "pp8"),
                                                        ("memra", "tg4"), ("llama.cpp", "tg4")]
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert calls == [["-m", str(path), "-ngl", "99", "-fa", "1", "-p", "8", "-n", "0", "-d", "0", "-r", "2",
                      "-o", "jsonl"],
                     ["-m", str(path), "-ngl", "99", "-fa", "1", "-p", "0", "-n", "4", "-d", "0", "-r", "2",
                      "-o", "jsonl"]]
    lc = rows[3]
    # samples 1 ms and 2 ms for 4 tokens: 4000 and 2000 t/s
    assert lc["samples_ts"] == [4000.0, 2000.0] and lc["avg_ts"] == 3000.0 and lc["median_ts"] == 3000.0
    assert lc["stddev_ts"] == pytest.approx(math.sqrt(2e6), abs=1e-3)
    assert lc["llama_build"] == "b10605x (10605)" and lc["gate"] is None and lc["table"] is None
    assert lc["bytes_per_token"] == rows[2]["bytes_per_token"]  # the same file, the same bytes
    assert lc["gbps"] == pytest.approx(3000.0 * lc["bytes_per_token"] / 1e9, abs=0.06)


def test_llama_bench_failure_is_a_clear_error(tmp_path):
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(MemraError, match=r"llama-bench failed on tg4 \(exit 3\): error: failed to load model"):
        B.run_llama_bench(str(exe), tmp_path / "m.gguf", B.Cell(0, 4, 0), 1)
    with pytest.raises(MemraError, match="no JSON line for pp8"):
        B.parse_llama_bench('{"n_prompt": 0, "n_gen": 4, "n_depth": 0, "samples_ts": [1]}\n', B.Cell(8, 0, 0))


# -- the command ------------------------------------------------------------------------------

@pytest.fixture
def emulated_cli(monkeypatch, tiny_models):
    """`memra bench` in-process on the emulated engine (the GPU and its engine patched in)."""
    from typer.testing import CliRunner

    from memra.cli import app

    install(monkeypatch, BenchGpu())
    monkeypatch.setenv("MEMRA_GIT_SHA", "feedbeef")
    return CliRunner(), app, tiny_models("llama", "Q4_K_M")


@pytest.mark.slow
def test_cli_bench_emulated(emulated_cli, tmp_path):
    runner, app, path = emulated_cli
    out = tmp_path / "bench.jsonl"
    r = runner.invoke(app, ["bench", str(path), "-p", "8", "-n", "4", "-d", "0,5", "-r", "2", "--json",
                            "--table", "builtin", "--out", str(out), "--tag", "ci"])
    assert r.exit_code == 0, r.output
    printed = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert printed == written and len(written) == 4
    assert {x["gate"] for x in written} == {"MATCH"}
    assert [x["test"] for x in written] == ["pp8", "tg4", "pp8 @ d5", "tg4 @ d5"]
    assert all(x["git_sha"] == "feedbeef" and x["tag"] == "ci" and x["table"] == "builtin" for x in written)


def test_cli_bench_without_out_writes_into_memra_home_not_the_checkout(emulated_cli, tmp_path, monkeypatch):
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def tree():
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "research", "tune"],
                              cwd=root, capture_output=True, text=True, check=True).stdout

    runner, app, path = emulated_cli
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))
    monkeypatch.chdir(root)  # a user in a fresh clone, no --out
    before = tree()
    r = runner.invoke(app, ["bench", str(path), "-p", "0", "-n", "4", "-r", "1", "--table", "builtin"])
    assert r.exit_code == 0, r.output
    assert tree() == before
    (written,) = (tmp_path / "receipts").glob("bench-*.jsonl")
    assert [json.loads(x)["test"] for x in written.read_text().splitlines()] == ["tg4"]


def test_cli_bench_near_tie_times_the_cells_and_receipts_record_it(emulated_cli, tmp_path, monkeypatch):
    """A NEAR-TIE cross-check (any verdict but MISMATCH) passes: the cells are timed and
    every receipt records the verdict."""
    import memra.gpu.gate as G

    runner, app, path = emulated_cli
    real = G.run_gates

    def near_tie(engine, ids, reference="auto", n=G.TF_POSITIONS):
        x, t = real(engine, ids, reference, n)
        return dataclasses.replace(x, verdict="NEAR-TIE", first_diff=4), t

    monkeypatch.setattr(G, "run_gates", near_tie)
    out = tmp_path / "bench.jsonl"
    r = runner.invoke(app, ["bench", str(path), "-p", "0", "-n", "4", "-r", "1", "--table", "builtin",
                            "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert "NEAR-TIE" in r.output and "MISMATCH" not in r.output
    assert [json.loads(x)["gate"] for x in out.read_text().splitlines()] == ["NEAR-TIE"]


@pytest.mark.parametrize("which", ["cross_check", "teacher_forced"])
def test_cli_bench_mismatch_times_nothing(emulated_cli, tmp_path, monkeypatch, which):
    """Either gate's MISMATCH ends the run before any cell: exit 1, no figure, no receipt."""
    import memra.gpu.gate as G

    runner, app, path = emulated_cli
    real = G.run_gates

    def broken(engine, ids, reference="auto", n=G.TF_POSITIONS):
        x, t = real(engine, ids, reference, n)
        if which == "cross_check":
            x = dataclasses.replace(x, verdict="MISMATCH", first_diff=3, n_diff=1, max_abs_diff=0.5)
        else:
            t = dataclasses.replace(t, verdict="MISMATCH", first_over=2, n_over=1)
        return x, t

    monkeypatch.setattr(G, "run_gates", broken)
    out = tmp_path / "bench.jsonl"
    r = runner.invoke(app, ["bench", str(path), "-p", "8", "-n", "4", "-r", "1", "--table", "builtin",
                            "--out", str(out), "--json"])
    assert r.exit_code == 1
    assert "MISMATCH" in r.output and "memra: error: exactness gate MISMATCH" in r.output
    assert "t/s" not in r.output and "tok/s" not in r.output and not r.stdout.strip()
    assert not out.exists()


@pytest.mark.skipif(has_gpu(), reason="checks the message on a machine without a GPU")
def test_cli_bench_without_gpu_is_one_error_line():
    r = memra("bench", "smollm2-135m")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip("\n").split("\n")
    assert lines == ["memra: error: memra bench needs an NVIDIA GPU and its driver; none was found on this machine"]
    assert r.stdout == ""


@pytest.mark.slow
def test_cli_bench_rejects_bad_arguments():
    for args, needle in ((["-n", "abc"], "-n takes token counts"), (["-p", "0", "-n", "0"], "nothing to measure"),
                         (["--vs", "vllm"], "--vs knows llama.cpp only"),
                         (["--vs", "llama.cpp"], "needs --llama-bench PATH"), (["-r", "0"], "-r must be at least 1")):
        r = memra("bench", "smollm2-135m", *args)
        assert r.returncode == 1 and r.stderr.startswith("memra: error: ") and needle in r.stderr, (args, r.stderr)


# -- synthetic models -------------------------------------------------------------------------

def test_synth_spelling_makes_the_model_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))
    name, path = B.resolve_model("synth:tiny-qwen2:Q8_0")
    assert name == "synthetic tiny-qwen2 Q8_0"
    assert path.parent == tmp_path / "synth" and path.is_file()
    g = open_gguf(path)
    assert g.arch == "qwen2" and g.metadata["general.name"].endswith("Q8_0")
    mtime = path.stat().st_mtime_ns
    assert B.resolve_model("synth:tiny-qwen2:Q8_0") == (name, path)
    assert path.stat().st_mtime_ns == mtime  # cached, not rewritten
    assert list((tmp_path / "synth").iterdir()) == [path]  # no temporary left behind
    for bad, needle in (("synth:llama3-8b", "synth:SHAPE:QUANT"), ("synth:nosuch:Q4_0", "unknown shape"),
                        ("synth:llama3-8b:Q9_9", "unknown quant mix"), ("synth:tiny:Q4_0", "architecture")):
        with pytest.raises(MemraError, match=needle):
            B.resolve_model(bad)


@pytest.mark.slow
def test_model_facts_quant_mix(tiny_models):
    from gguf import GGUFReader

    path = tiny_models("llama", "Q4_K_M")
    f = B.model_facts(open_gguf(path))
    by = {}
    for t in GGUFReader(str(path)).tensors:
        by[t.tensor_type.name] = by.get(t.tensor_type.name, 0) + int(t.n_bytes)
    total = sum(by.values())
    assert f["model_size"] == total
    shown = dict(x.split(":") for x in f["quant_mix"].split())
    assert shown == {k: f"{100 * v / total:.0f}%" for k, v in by.items() if 200 * v >= total}


# -- kernel-check -----------------------------------------------------------------------------

@pytest.mark.slow
def test_kernel_check_compile_only_names_the_three_archs(tmp_path):
    r = memra("kernel-check", "--compile-only", "--only", "act", env={"MEMRA_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("ALL GREEN")
    compiled = [l for l in lines if l.startswith("PASS  act compile")]
    for arch in ("sm_90a", "sm_120a", "sm_89"):
        assert any(f" compile {arch} " in l for l in compiled), arch
    r = memra("kernel-check", "--compile-only", "--only", "act", "--arch", "sm_89", env={"MEMRA_HOME": str(tmp_path)})
    assert r.returncode == 0 and all(" sm_89 " in l for l in r.stdout.splitlines() if " compile " in l)


def test_kernel_check_red_paths(tmp_path):
    r = memra("kernel-check", "--compile-only", "--only", "nosuch", env={"MEMRA_HOME": str(tmp_path)})
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith("FAILED: unknown kernel family")
    r = memra("kernel-check", "--arch", "sm_90a")
    assert r.returncode == 1 and "--arch applies to --compile-only" in r.stderr
    r = memra("kernel-check", "--compile-only", "--arch", "hopper")
    assert r.returncode == 1 and "not an NVRTC target" in r.stderr


@pytest.mark.skipif(has_gpu(), reason="checks the message on a machine without a GPU")
def test_kernel_check_without_gpu_fails():
    r = memra("kernel-check", "--only", "act")
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith("FAILED: no CUDA GPU")
