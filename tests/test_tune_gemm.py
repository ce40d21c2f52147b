"""The tensor-core GEMM as a tuned family (issue 10): its tune hook (memra/tune/measure.py's
contract) on the CPU emulator, the campaign jobs the launch plan yields for it, and the
prefill chunk's own table bucket.

Oracles: the emulator runs gemm.cu's launch contract (grid, block, dynamic shared memory
from the kernel header's formula) and computes each row as the matvec does, so a check must
pass; it must fail when the kernel writes nothing (the poison shows) and when one value is
one ulp off the matvec's bits (inside the float64 tolerance: only the bit comparison sees
it). The shapes a campaign must yield are written out by hand from the model's config (which
weights the plan fuses, which rows go through the GEMM: GEMM_MIN_ROWS = 16 on the q8 path).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu, ModuleLog, check_tune_hook, drop_launches
from memra.errors import MemraError
from memra.gpu.ops import gemm as G
from memra.model.config import ModelConfig
from memra.tune import campaign as C
from memra.tune import tables as T
from memra.tune.receipts import shape_key

ROTATE = 1 << 20

CASES = [  # kernel, config, shape
    ("gemm", {"GM_WM": 1, "GM_WN": 1, "GM_TM": 1, "GM_TN": 2, "GM_WK": 8, "GM_STAGES": 3},
     {"type": "Q6_K", "rows": 96, "cols": 512, "batch": 16}),          # 16-row tiles, partial last tile
    ("gemm_glu", {"GM_WM": 1, "GM_WN": 2, "GM_WK": 4}, {"type": "Q4_K", "rows": 256, "cols": 512, "batch": 32}),
    ("gemm", {"GM_STAGES": 4}, {"type": "Q4_0", "rows": 200, "cols": 256, "batch": 64}),
    ("gemm", {}, {"type": "Q8_0", "rows": 130, "cols": 256, "batch": 128}),  # the built-in big tile
]


def _case(kernel, config, shape, g=None, seed=0):
    g = g or FakeGpu(1 << 26)
    return g, G.tune_case(g, kernel, "q8", dict(config), dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("kernel,config,shape", CASES, ids=[f"{c[0]}-b{c[2]['batch']}" for c in CASES])
def test_gemm_hook_checks_rotates_and_launches(kernel, config, shape):
    check_tune_hook(*_case(kernel, config, shape), "matvec bit for bit", ROTATE)


def test_gemm_check_fails_when_the_kernel_writes_nothing(monkeypatch):
    kernel, config, shape = CASES[1]
    drop_launches(monkeypatch, "gemm_q8")
    _, case = _case(kernel, config, shape, seed=3)
    ok, _, detail = case.check()
    assert not ok, detail


def test_gemm_check_fails_one_ulp_off_the_matvec(monkeypatch):
    """A value one ulp off is within the float64 reference's tolerance: the bits must catch it."""
    kernel, config, shape = CASES[0]
    real = G.gemm

    def off_by_one_ulp(g, w, y, **kw):
        real(g, w, y, **kw)
        a = y.numpy().copy()
        a.view(np.uint32).ravel()[5] ^= 1
        y.upload(a)

    _, case = _case(kernel, config, shape, seed=4)
    assert case.check()[0]
    monkeypatch.setattr(G, "gemm", off_by_one_ulp)
    ok, err, detail = case.check()
    assert not ok and err <= 1e-5 and "1 of" in detail and "matvec's bits" in detail, detail


BAD = [
    ("gemm", {"GM_WK": 3}),                                   # not a power of two
    ("gemm", {"GM_STAGES": 1}),
    ("gemm_glu", {"GM_TM": 1}),                               # glu needs gate and up tiles
    ("gemm", {"GM_WM": 4, "GM_WN": 4, "GM_WK": 4}),           # 2048 threads
    ("gemm", {"GM_LREG": 6}),
    ("gemm", {"MV_NWARPS": 4}),                               # not this family's tunable
    ("gemm", {"GM_WK ": 2}),                                  # a typo must not measure the default
]


@pytest.mark.parametrize("kernel,config", BAD)
def test_gemm_hook_refuses_bad_configurations(kernel, config):
    shape = {"type": "Q4_K", "rows": 256, "cols": 512, "batch": 16}
    with pytest.raises(MemraError):
        _case(kernel, config, shape)
    with pytest.raises(MemraError):  # never compiled either (precompile skips what the hook refuses)
        G.tune_modules(kernel, "q8", config, shape)


def test_gemm_hook_refuses_unknown_kernels_variants_and_types():
    g, rng = FakeGpu(1 << 20), np.random.default_rng(0)
    shape = {"type": "Q4_K", "rows": 64, "cols": 256, "batch": 16}
    for kernel, variant, s in (("gemm", "f32", shape), ("matvec", "q8", shape),
                               ("gemm", "q8", {**shape, "type": "F16"}),
                               ("gemm_glu", "q8", {**shape, "rows": 65})):
        with pytest.raises(MemraError):
            G.tune_case(g, kernel, variant, {}, s, rng, ROTATE)


def test_gemm_bad_configuration_is_a_failed_receipt(tmp_path):
    """Through the campaign runner and the real gpu_measure (on the emulator): a refused
    configuration becomes a failed, untimed receipt; the others are checked and timed."""
    from memra.tune.measure import gpu_measure
    from memra.tune.receipts import read_receipts

    g = FakeGpu(1 << 26)
    g.info.l2_bytes = 1 << 19
    g.time_ms = lambda fn, reps=50, warmup=5: [fn() or 0.05 for _ in range(reps)]
    spec = {"name": "t", "batches": [16], "reps": 3, "kernels": [{
        "name": "gemm", "src": "gemm.cu", "variants": ["q8"],
        "shapes": [{"type": "Q4_0", "rows": 96, "cols": 256}],
        "configs": [{"GM_WK": 8}, {"GM_WK": 4}, {"GM_WK": 3}]}]}
    out = tmp_path / "r.jsonl"
    counts = C.run_campaign(C.expand_campaign(spec), gpu_measure(g, seed=0), out,
                            context={"device": "emulated", "cc": (9, 0), "sms": 132, "nvrtc": "12.8"})
    assert counts == {"measured": 2, "failed": 1, "skipped": 0}
    df = read_receipts(out)
    bad = df[df["config.GM_WK"] == 3].iloc[0]
    assert not bad["ok"] and "bad configuration" in bad["error"] and np.isnan(bad["median_us"])
    assert df[df["ok"]]["median_us"].notna().all()


@pytest.mark.parametrize("kernel,config,shape", CASES[:2])
def test_gemm_tune_modules_are_what_the_job_loads(kernel, config, shape):
    g = ModuleLog()
    _, case = _case(kernel, config, shape, g=g)
    g.loaded.clear()  # the matvec oracle's modules are not the job's
    case.launch(case.sets - 1)
    declared = {(f, tuple(sorted((k, str(v)) for k, v in d.items())))
                for f, d in G.tune_modules(kernel, "q8", config, shape)}
    assert g.loaded == declared


def test_gemm_is_builtin_follows_the_batch_default():
    s16, s64, s128 = ({"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": b} for b in (16, 64, 128))
    assert G.is_builtin("gemm", "q8", {}, s16)
    assert G.is_builtin("gemm", "q8", {"GM_WM": 1, "GM_WN": 1, "GM_TN": 2, "GM_WK": 8}, s16)  # CONFIGS at 16
    assert not G.is_builtin("gemm", "q8", {"GM_WK": 4}, s16)
    assert G.is_builtin("gemm_glu", "q8", {"GM_WM": 1, "GM_WN": 1, "GM_TN": 4, "GM_WK": 4}, s64)
    assert not G.is_builtin("gemm", "q8", {"GM_WM": 1, "GM_WK": 4}, s128)
    assert G.is_builtin("gemm", "q8", {"GM_WM": 2, "GM_WN": 1, "GM_TN": 4, "GM_WK": 2, "GM_STAGES": 3}, s128)


# ---------------------------------------------------------------- campaign jobs


def llama_like() -> C.ModelSpec:
    """n_embd 256, q_dim 256, kv_dim 64, n_ff 512, vocab 1000; layer 1's V is Q6_K (so its QKV
    splits into Q+K (320 rows) and V (64 rows)), the head Q6_K, the token table F16."""
    cfg = ModelConfig(arch="llama", n_vocab=1000, n_ctx_train=4096, n_embd=256, n_layer=2,
                      n_head=8, n_head_kv=2, head_dim=32, head_dim_v=32, n_ff=512, norm_eps=1e-5,
                      rope_base=1e4, rope_dim=32, rope_neox=False)
    t = {"output.weight": "Q6_K", "token_embd.weight": "F16"}
    for i in range(2):
        for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            t[f"blk.{i}.{n}.weight"] = "Q4_K"
    t["blk.1.attn_v.weight"] = "Q6_K"
    return C.ModelSpec("tiny", cfg, t)


GEMM_SPEC = {"name": "g", "batches": [8, 16, 64, 128], "kernels": [
    {"name": "gemm", "variants": ["q8"], "ops": ["qkv", "attn_output", "down", "output"], "src": "gemm.cu",
     "configs": [{"GM_WK": 8}, {"GM_WK": 4}]},
    {"name": "gemm_glu", "variants": ["q8"], "ops": ["gate_up"], "src": "gemm.cu"}]}


def test_gemm_jobs_are_the_plans_gemm_launches_per_batch():
    jobs = C.expand_campaign(GEMM_SPEC, [llama_like()])
    got = {(j.kernel, shape_key(j.shape), j.shape["batch"]) for j in jobs}
    mats = ["cols=256,rows=384,type=Q4_K",     # layer 0: fused Q+K+V (256 + 2 * 64)
            "cols=256,rows=320,type=Q4_K",     # layer 1: Q+K ...
            "cols=256,rows=64,type=Q6_K",      # ... and its Q6_K V alone
            "cols=256,rows=256,type=Q4_K",     # attention output
            "cols=512,rows=256,type=Q4_K"]     # down
    head = "cols=256,rows=1000,type=Q6_K"      # decode steps only: a prefill chunk has no head
    want = {("gemm", s, b) for s in mats for b in (16, 64, 128)} | {("gemm", head, b) for b in (16, 64)}
    want |= {("gemm_glu", "cols=256,rows=1024,type=Q4_K", b) for b in (16, 64, 128)}
    assert got == want  # nothing at 8 rows: the plan runs the matvec there
    assert len(jobs) == 2 * len([w for w in want if w[0] == "gemm"]) + 3
    assert all(j.src == "gemm.cu" for j in jobs)
    v = next(j for j in jobs if j.shape["rows"] == 64)
    assert v.ops == ("tiny:qkv",)


def test_gemm_jobs_follow_the_plans_gemm_switch(monkeypatch):
    """The jobs come from the plan, not a copy of its rule: with the plan's GEMM threshold
    moved to 64 rows, batch 16 has no GEMM jobs."""
    monkeypatch.setattr(G, "GEMM_MIN_ROWS", 64)
    jobs = C.expand_campaign(GEMM_SPEC, [llama_like()])
    assert {j.shape["batch"] for j in jobs} == {64, 128}


def test_gemm_batches_beyond_a_prefill_chunk_are_refused():
    spec = {**GEMM_SPEC, "batches": [1024]}
    with pytest.raises(C.CampaignError, match="1..512 rows"):
        C.expand_campaign(spec, [llama_like()])


def test_listed_configs_join_the_grid_once():
    assert C.configs({"A": [1, 2]}, [{"A": 2}, {"A": 3, "B": 1}]) == [{"A": 1}, {"A": 2}, {"A": 3, "B": 1}]
    assert C.configs({}, [{"A": 3}]) == [{"A": 3}]
    assert C.configs({}) == [{}]
    for bad in ([{}], [1], {"A": 1}, [{"batches": [16]}], [{"A": 1, "batches": [0]}], [{"A": 1, "batches": 16}]):
        with pytest.raises(C.CampaignError, match="'configs'"):
            C.check_campaign({"kernels": [{"name": "m", "variants": ["v"], "ops": ["qkv"], "configs": bad}]})


def test_listed_configs_run_at_their_batches_only():
    spec = {"name": "x", "batches": [1, 4], "kernels": [{
        "name": "matvec", "variants": ["q8"], "shapes": [{"type": "Q4_K", "rows": 64, "cols": 256}],
        "configs": [{"MV_ROWS": 1}, {"MV_ROWS": 2, "batches": [4]}]}]}
    got = [(j.shape["batch"], j.config) for j in C.expand_campaign(spec)]
    assert got == [(1, {"MV_ROWS": 1}), (4, {"MV_ROWS": 1}), (4, {"MV_ROWS": 2})]
    spec["batches"] = [1]  # a config at no batch of the entry: no job
    assert [j.config for j in C.expand_campaign(spec)] == [{"MV_ROWS": 1}]


def test_h200_gemm_campaign_is_what_its_header_says():
    """The committed campaign over the four benchmark models: the job count its header
    states, every (shape, batch) with the built-in configuration among its candidates (the
    baseline freeze's --min-gain needs), no configuration the launcher refuses, the 1024-row
    Q6_K V projection of Q4_K_M at every batch, and the glu and prefill-chunk jobs."""
    path = Path(__file__).resolve().parent.parent / "tune" / "campaigns" / "h200-gemm.toml"
    spec = C.load_campaign(path)
    models = [C.model_info(f"synth:{m}") for m in ("llama3-8b:Q4_K_M", "llama3-8b:Q4_0", "llama3-8b:Q8_0",
                                                   "llama-1b:Q4_0")]
    jobs = C.expand_campaign(spec, models)
    stated = int(re.search(r"# Cost: (\d+) jobs", path.read_text()).group(1))
    assert len(jobs) == stated and len({j.key() for j in jobs}) == len(jobs)
    pairs: dict[tuple, int] = {}
    for j in jobs:
        G.tune_modules(j.kernel, j.variant, j.config, j.shape)  # refuses nothing
        k = (j.kernel, shape_key(j.shape), j.shape["batch"])
        pairs[k] = pairs.get(k, 0) + G.is_builtin(j.kernel, j.variant, j.config, j.shape)
    assert set(pairs.values()) == {1}
    assert {b for _, _, b in pairs} == {16, 32, 64, 128, 512}
    v = "cols=4096,rows=1024,type=Q6_K"
    assert {b for k, s, b in pairs if s == v and k == "gemm"} == {16, 32, 64, 128, 512}
    assert {b for k, _, b in pairs if k == "gemm_glu"} == {16, 32, 64, 128, 512}
    assert not any("rows=128256" in s for _, s, b in pairs if b >= 128)
    # jobs run shape by shape (one random weight and float64 dequantization per shape)
    order = [(j.kernel, shape_key(j.shape)) for j in jobs]
    assert len([1 for a, b in zip(order, order[1:]) if a != b]) == len(set(order)) - 1


# ---------------------------------------------------------------- the prefill chunk's bucket


def test_prefill_chunk_has_its_own_table_bucket():
    """A prefill step of 65..128 rows takes a GEMM entry frozen at 128 rows, a whole chunk
    (129..PREFILL_CHUNK rows) the one frozen at 512, or the 128-row one when the shape has
    none at 512 (a table frozen before that bucket: what the engine ran then); a 64-row
    decode step the one frozen at 64."""
    from memra.gpu.plan import MAX_ROWS, PREFILL_CHUNK, Planner

    assert T.BATCH_BUCKETS[-3:] == (MAX_ROWS, 128, PREFILL_CHUNK)
    assert [T.batch_bucket(b) for b in (33, 64, 65, 100, 128, 129, 500, PREFILL_CHUNK)] == \
        [64, 64, 128, 128, 128, 512, 512, 512]
    m = llama_like()
    s = "cols=512,rows=256,type=Q4_K"
    table = {"batch_buckets": list(T.BATCH_BUCKETS), "entries": {"gemm": {s: {
        "64": {"variant": "q8", "config": {"GM_WK": 4}}, "128": {"variant": "q8", "config": {"GM_STAGES": 4}}}}}}
    p = Planner(m, table)
    down = {rows: [L for L in (p.step(rows, decode=False)) if L.op == "gemm" and shape_key(L.shape) == s]
            for rows in (64, 100, 128, PREFILL_CHUNK)}
    assert [L.config for L in down[64]] == [{"GM_WK": 4}] * 2
    assert [L.config for L in down[100]] == [{"GM_STAGES": 4}] * 2
    assert [L.config for L in down[128]] == [{"GM_STAGES": 4}] * 2
    assert [L.config for L in down[PREFILL_CHUNK]] == [{"GM_STAGES": 4}] * 2   # no 512 entry: the 128's
    table["entries"]["gemm"][s]["512"] = {"variant": "q8", "config": {"GM_WK": 1}}
    p = Planner(m, table)
    assert [[L.config for L in p.step(rows, decode=False) if L.op == "gemm" and shape_key(L.shape) == s]
            for rows in (100, 200, PREFILL_CHUNK)] == [[{"GM_STAGES": 4}] * 2] + [[{"GM_WK": 1}] * 2] * 2
    # decode buckets do not borrow: 32 rows has no entry, so the built-in runs
    assert [L.config for L in p.step(32, decode=True) if L.op == "gemm" and shape_key(L.shape) == s] == [None] * 2
