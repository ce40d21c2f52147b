"""The GPU engine takes its launch configurations from the tuning table (issue 4, start-up):
changing a table entry changes what the engine launches, and nothing else.

The engine runs on the CPU emulator (tests/gpu_emulator.py), which records every launch's
kernel, module defines, grid and block. The oracle for "what should launch" is the table
entry itself laid over the launcher's built-in default (memra.gpu.ops.matvec.default_config),
and the grid/block the kernel's launch contract derives from it (kernels/matvec.cu:
block = 32 * MV_NWARPS, grid = ceil(N / (MV_ROWS * MV_NWARPS / MV_KSPLIT))). Tokens must
equal those of the built-in table: a configuration changes speed, never results.
"""

from __future__ import annotations

import json
import logging

import pytest

from gpu_emulator import FakeGpu, install
from memra.tune import tables as T
from memra.gpu.compile import source_hash
from memra.gpu.engine import GPUEngine
from memra.gpu.plan import prefill_bucket
from memra.model.gguf import open_gguf
from memra.gpu.ops import matvec as MV

PROMPT = [1, 17, 2398, 11, 905, 33]
N_GEN = 6


class RecordingGpu(FakeGpu):
    """FakeGpu that keeps (kernel, defines, grid, block) of every launch issued."""

    def __init__(self):
        super().__init__(1 << 28)
        self.issued = []

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self.issued.append((kernel.name, dict(kernel.defines), tuple(grid), tuple(block)))
        super().launch(kernel, grid, block, args, shmem=shmem, pdl=pdl)


def _entry(src, variant, config):
    return {"variant": variant, "config": config, "src": src, "src_hash": source_hash(src),
            "median_us": 1.0}


def _table(entries, device="emulated"):
    return {"format": T.TABLE_FORMAT, "device": device, "cc": "9.0", "sms": 132,
            "batch_buckets": list(T.BATCH_BUCKETS), "entries": entries}


def _write(tmp_path, table, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(table))
    return p


@pytest.fixture(scope="module")
def model(tiny_models):
    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    wo = g.tensor("blk.0.attn_output.weight")
    # the attention output projection: rows = n_embd, cols = n_head * head_dim
    shape = {"type": wo.type_name, "rows": wo.shape[0], "cols": wo.shape[1]}
    n_vocab = g.tensor("token_embd.weight").shape[0]
    n_ff = g.tensor("blk.0.ffn_down.weight").shape[1]
    return path, shape, n_vocab, n_ff


def _run(path, table, attn="decode"):
    # decode attention for prompt rows too: the entries' reach into prefill is what is checked
    gpu = RecordingGpu()
    eng = GPUEngine(path, n_ctx=32, gpu=gpu, tune_table=table, attn=attn)
    toks = eng.generate_greedy(PROMPT, N_GEN)
    return eng, gpu, toks


def _mv_launches(gpu, ggml_type, N, K):
    """Decode-time (one row) matvec launches of the weight with N output rows of K."""
    out = []
    for name, d, grid, block in gpu.issued:
        if name.startswith("mv_") and d["MV_TYPE"] == ggml_type and d["MV_B"] == 1:
            cfg = {k: v for k, v in d.items() if k not in ("MV_TYPE", "MV_B")}
            if grid[0] == -(-N // MV.rows_per_block(cfg)):
                out.append((name, d, grid, block))
    return out


@pytest.fixture(scope="module")
def builtin(model):
    path = model[0]
    return _run(path, "builtin")


def test_changing_a_table_entry_changes_the_launch(model, builtin, tmp_path):
    path, shape, n_vocab, n_ff = model
    t = MV.type_id(shape["type"])
    N, K = shape["rows"], shape["cols"]
    default = MV.default_config(t, "q8", N, K, 1)
    assert default["MV_NWARPS"] != 2
    _, gpu0, toks0 = builtin
    base = _mv_launches(gpu0, t, N, K)
    assert base and all(d["MV_NWARPS"] == default["MV_NWARPS"] for _, d, _, _ in base)

    entries = {
        "matvec": {T.shape_key(shape): {"1": _entry("matvec.cu", "q8", {"MV_NWARPS": 2})}},
        "argmax": {T.shape_key({"n": n_vocab}): {"1": _entry("sample.cu", "default", {"SAMPLE_THREADS": 256})}},
        # the activations quantized before the down projection (n_ff wide)
        "quantize_q8": {T.shape_key({"n": n_ff}): {"1": _entry("q8.cu", "default", {"Q8_WARPS": 4})}},
    }
    eng, gpu, toks = _run(path, str(_write(tmp_path, _table(entries))))
    assert eng.tune_source == "file"
    want = {**default, "MV_NWARPS": 2}
    tuned = [(n, d, gr, bl) for n, d, gr, bl in gpu.issued if n.startswith("mv_") and d["MV_B"] == 1
             and d["MV_TYPE"] == t and {k: d[k] for k in want} == want]
    assert tuned, "no matvec launch with the table's MV_NWARPS=2"
    for _, d, grid, block in tuned:
        assert block == (64,)  # 32 * MV_NWARPS
        assert grid == (-(-N // (want["MV_ROWS"] * 2 // want["MV_KSPLIT"])),)
    # the other shapes (and the prefill chunks: another batch bucket) keep their defaults
    n_mv0 = sum(1 for n, *_ in gpu0.issued if n.startswith("mv_"))
    n_mv = sum(1 for n, *_ in gpu.issued if n.startswith("mv_"))
    assert n_mv == n_mv0
    changed = sum(1 for a, b in zip(gpu0.issued, gpu.issued) if a != b)
    argmax = [b for n, d, _, b in gpu.issued if n.startswith("argmax")]
    q8 = [(d, gr, b) for n, d, gr, b in gpu.issued if n == "quantize_q8" and d["Q8_WARPS"] == 4]
    assert argmax and all(b == (256,) for b in argmax)
    assert q8 and all(b == (128,) for _, _, b in q8)
    assert changed == len(tuned) + len(argmax) + len(q8)
    assert toks == toks0


def test_env_var_and_auto_pick_the_table(model, builtin, tmp_path, monkeypatch):
    path, shape = model[:2]
    t = MV.type_id(shape["type"])
    entries = {"matvec": {T.shape_key(shape): {"1": _entry("matvec.cu", "q8", {"MV_NWARPS": 8, "MV_ROWS": 1})}}}
    # MEMRA_TUNE_TABLE names a file
    monkeypatch.setenv("MEMRA_TUNE_TABLE", str(_write(tmp_path, _table(entries))))
    _, gpu, toks = _run(path, None)
    assert any(n.startswith("mv_") and d["MV_NWARPS"] == 8 and d["MV_ROWS"] == 1 and d["MV_TYPE"] == t
               for n, d, _, _ in gpu.issued)
    assert toks == builtin[2]
    # "auto": the table of this device's name in tune/defaults
    monkeypatch.delenv("MEMRA_TUNE_TABLE")
    d = tmp_path / "defaults"
    d.mkdir()
    _write(d, _table(entries), "emulated.json")
    monkeypatch.setattr(T, "tables_dir", lambda: d)
    eng = GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 27))
    assert eng.tune_source == "exact"
    assert eng.plan.tuned("matvec", shape, 1, "q8") == {"MV_NWARPS": 8, "MV_ROWS": 1}
    # batch 8 is another bucket: no entry, built-in default
    assert eng.plan.tuned("matvec", shape, 8, "q8") is None


def test_entries_the_engine_must_not_use(model, builtin, tmp_path, caplog):
    path, shape = model[:2]
    ffn = {"n": 512}
    entries = {
        # the f32 family's winner: this engine runs the q8 path (another numerics contract)
        "matvec": {T.shape_key(shape): {"1": _entry("matvec.cu", "f32", {"MV_NWARPS": 2})},
                   # split-K: a row's summation order would depend on the batch
                   T.shape_key({**shape, "rows": shape["rows"] * 3}): {
                       "1": _entry("matvec.cu", "q8", {"MV_NWARPS": 8, "MV_KSPLIT": 2})}},
        "act_mul": {T.shape_key(ffn): {"1": _entry("act.cu", "default", {"ACT_THREADS": 512})}},
    }
    caplog.set_level(logging.INFO, logger="memra")
    eng = GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 27), tune_table=_table(entries))
    assert eng.plan.tuned("matvec", shape, 1, "q8") is None
    assert "not this engine's q8" in caplog.text
    assert eng.plan.tuned("matvec", {**shape, "rows": shape["rows"] * 3}, 1, "q8") is None
    assert "MV_KSPLIT=2 is not used" in caplog.text
    assert eng.plan.tuned("act_mul", ffn, 1) == {"ACT_THREADS": 512}


def test_lookups_happen_at_capture_not_per_token(model, monkeypatch):
    path = model[0]
    calls = []
    real = T.lookup
    monkeypatch.setattr(T, "lookup", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 27), tune_table="builtin")
    eng.generate_greedy(PROMPT, 4)
    n = len(calls)
    assert n > 0
    eng.generate_greedy(PROMPT, 20)  # more tokens, the same graph: no new lookups
    assert len(calls) == n


def test_startup_logs_which_table(model, caplog, tmp_path):
    path = model[0]
    caplog.set_level(logging.INFO, logger="memra.tuning")
    GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 27), tune_table="builtin")
    assert "built-in launcher defaults" in caplog.text
    stale = _table({"embed": {T.shape_key({"type": "Q4_K", "n": 256}): {
        "1": {**_entry("embed.cu", "default", {"EMBED_THREADS": 128}), "src_hash": "0" * 16}}}})
    caplog.clear()
    GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 27), tune_table=str(_write(tmp_path, stale)))
    assert any(r.levelno == logging.WARNING and "changed since" in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # ~8 s (two emulated bench arms): the default run stays under 5 minutes
def test_bench_pair_tuned_vs_builtin_records_the_table(model, tmp_path, monkeypatch):
    """`memra bench --tune-table FILE` then `--tune-table builtin` in one session: each
    receipt names the table that ran (source and path) and the device; the tuned run
    launched the entry's configuration, the builtin run did not."""
    from typer.testing import CliRunner

    from memra.cli import app

    path, shape = model[:2]
    t = MV.type_id(shape["type"])
    table = _write(tmp_path, _table({"matvec": {T.shape_key(shape): {
        "1": _entry("matvec.cu", "q8", {"MV_NWARPS": 2})}}}, device="NVIDIA H200"), "nvidia-h200.json")
    g = RecordingGpu()
    g.info = type(g.info)(name="NVIDIA H200")
    install(monkeypatch, g)
    out = tmp_path / "bench.jsonl"
    runner = CliRunner()
    launched = {}
    for which in (str(table), "builtin"):
        g.issued.clear()
        r = runner.invoke(app, ["bench", str(path), "-p", "0", "-n", "4", "-r", "1", "--tune-table", which,
                                "--out", str(out)])
        assert r.exit_code == 0, r.output
        launched[which] = any(n.startswith("mv_") and d["MV_TYPE"] == t and d["MV_NWARPS"] == 2
                              for n, d, _, _ in g.issued)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["table"] for r in rows] == [f"file:{table}", "builtin"]
    assert all(r["device"] == "NVIDIA H200" and r["test"] == "tg4" for r in rows)
    assert launched == {str(table): True, "builtin": False}


def _heads(path):
    from memra.model.config import read_config

    c = read_config(open_gguf(path))
    return c, {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}


def test_norm_rope_attention_entries_apply_to_prefill_and_decode(model, builtin, tmp_path, caplog):
    """rmsnorm NORM_THREADS, rope_norm_kv ROPE_WARPS and attn_decode hpb/ATT_TILE from the
    table's batch-1 bucket are launched at every row count (the 6-token prefill and the
    one-row decode steps): NORM_THREADS and ATT_* set the reduction order, which prefill and
    decode must share. Expected launches follow the kernels' launch contracts (norm.cu:
    NORM_MAXV = ceil(n / 4 / T), T * NORM_MAXV * 4 == n splits the row over NORM_MAXV blocks;
    rope.cu: ceil(heads / ROPE_WARPS) blocks of 32 * ROPE_WARPS; attention.cu: n_head / hpb
    head blocks, splits = default_splits of that count)."""
    from memra.gpu.ops.attention import default_splits, splits_for

    path = model[0]
    c, heads = _heads(path)
    E = c.n_embd
    assert c.n_gqa % 2 == 0 and c.n_gqa >= 2 and (E // 4) % 32 == 0
    T_norm = E // 8  # two float4s a thread, exactly tiling the row: a 2-block split
    entries = {
        "rmsnorm": {T.shape_key({"n": E}): {"1": _entry("norm.cu", "default", {"NORM_THREADS": T_norm})}},
        "rope_norm_kv": {T.shape_key(heads): {"1": _entry("rope.cu", "default", {"ROPE_WARPS": 2})}},
        # two context lengths: the shortest one's entry is taken
        "attn_decode": {T.shape_key({**heads, "ctx": 64}): {"1": _entry("attention.cu", "default",
                                                                         {"ATT_TILE": 32, "hpb": 2})},
                        T.shape_key({**heads, "ctx": 4096}): {"1": _entry("attention.cu", "default",
                                                                           {"ATT_TILE": 128, "hpb": 1})}},
    }
    caplog.set_level(logging.INFO, logger="memra.plan")
    eng, gpu, toks = _run(path, _table(entries))
    assert "tuning: rmsnorm" in caplog.text and "tuning: attn_decode" in caplog.text
    assert toks == builtin[2]
    rows_seen = {"rmsnorm": set(), "rope_norm_kv": set(), "attn_decode": set()}
    for name, d, grid, block in gpu.issued:
        if name == "rmsnorm":
            assert (d["NORM_THREADS"], d["NORM_MAXV"], grid[1], block) == (T_norm, 2, 2, (T_norm,))
            rows_seen[name].add(grid[0])
        elif name == "rope_norm_kv":
            assert (d["ROPE_WARPS"], grid[0], block) == (2, -(-(c.n_head + 2 * c.n_head_kv) // 2), (64,))
            rows_seen[name].add(grid[1])
        elif name in ("attn_decode", "attn_decode_rope"):
            # decode launches the plan's split count; the prompt's chunk only its deepest row's
            # (splits_for: the same layout of every row)
            S = default_splits(c.n_head // 2, gpu.info.sm_count)
            splits = S if name == "attn_decode_rope" else splits_for(len(PROMPT), S, c.head_dim, {"ATT_TILE": 32})
            assert (d["N_GQA"], d["ATT_TILE"], grid[0], grid[1]) == (2, 32, c.n_head // 2, splits)
            rows_seen["attn_decode"].add(grid[2])
            if name == "attn_decode_rope":  # decode: RoPE runs inside the attention launch
                rows_seen["rope_norm_kv"].add(grid[2])
    # prefill (the prompt's rows) and decode (one row) alike
    # the prompt's chunk runs at its prefill bucket's row count (8 for 6 tokens, padded)
    assert all(s >= {1, prefill_bucket(len(PROMPT))} for s in rows_seen.values()), rows_seen
    assert eng.plan.n_splits == default_splits(c.n_head // 2, gpu.info.sm_count)
    # the built-in run launched other configurations
    base = {(n, d.get("NORM_THREADS"), d.get("ROPE_WARPS"), d.get("N_GQA")) for n, d, _, _ in builtin[1].issued
            if n in rows_seen}
    assert ("rmsnorm", T_norm, None, None) not in base and ("attn_decode", None, None, 2) not in base


def test_add_rmsnorm_entry_applies_to_prefill_and_decode(tiny_models):
    """gemma3's post-norms run add_rmsnorm: its NORM_THREADS entry is launched at every row count."""
    path = tiny_models("gemma3", "Q4_K_M")
    c, _ = _heads(path)
    E = c.n_embd
    _, gpu0, toks0 = _run(path, "builtin")
    default = {d["NORM_THREADS"] for n, d, _, _ in gpu0.issued if n == "add_rmsnorm"}
    T_norm = 32 if default != {32} else 64
    entries = {"add_rmsnorm": {T.shape_key({"n": E}): {"1": _entry("norm.cu", "default", {"NORM_THREADS": T_norm})}}}
    _, gpu, toks = _run(path, _table(entries))
    adds = [(d["NORM_THREADS"], grid[0], block) for n, d, grid, block in gpu.issued if n == "add_rmsnorm"]
    assert adds and all(t == T_norm and b == (T_norm,) for t, _, b in adds)
    assert {r for _, r, _ in adds} >= {1, prefill_bucket(len(PROMPT))}
    assert toks == toks0


def test_norm_and_attention_entries_the_engine_refuses(model, caplog):
    path = model[0]
    c, heads = _heads(path)
    entries = {
        "rmsnorm": {T.shape_key({"n": c.n_embd}): {"1": _entry("norm.cu", "default", {"NORM_THREADS": 100})}},
        "attn_decode": {T.shape_key({**heads, "ctx": 64}): {"1": _entry("attention.cu", "default",
                                                                         {"hpb": c.n_gqa + 1})}},
    }
    caplog.set_level(logging.INFO, logger="memra.plan")
    eng = GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 27), tune_table=_table(entries))
    assert eng.plan.norm_cfg["rmsnorm"] is None and eng.plan.att_cfg is None
    assert "NORM_THREADS must be a multiple of 32" in caplog.text and "does not divide" in caplog.text
