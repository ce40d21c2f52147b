"""The prompt tile (memra.gpu.ops.gemm_tile) as a tuned family: its tune hook (memra/tune/measure.py's
contract) on the CPU emulator, the campaign jobs a hybrid plan's prompt step yields for it, the
launch set's table cases, and the committed campaign.

Oracles: the emulator runs gemm_tile.cu's launch contract and computes every output as the chain
(memra.gpu.chain), so a check must pass; it must fail when the kernel writes nothing (the poison
shows) and when one value is one ulp off (inside the float64 tolerance: only the bit comparison
sees it), in the rows checked against the host chain and in those checked against the built-in
configuration's launch. The tile's shapes of the 8B model are written out by hand from its tensor
types (which weights have >= MIN_ROW_TILES output tiles).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu, ModuleLog, check_tune_hook, drop_launches
from memra.errors import MemraError
from memra.gpu.ops import gemm_tile as GT
from memra.tune import campaign as C
from memra.tune import launches as LS
from memra.tune.receipts import shape_key

ROTATE = 1 << 20
CAMPAIGNS = Path(__file__).resolve().parent.parent / "tune" / "campaigns"

CASES = [  # kernel, config, shape: each type plain and glu, built-in and other tiles, partial column tiles
    ("gemm_tile", {}, {"type": "Q4_0", "rows": 256, "cols": 256, "batch": 16}),   # rows past the host chain's 128
    ("gemm_tile_glu", {"GT_WM": 1, "GT_WN": 4, "GT_STAGES": 3},
     {"type": "Q4_0", "rows": 128, "cols": 256, "batch": 9}),
    ("gemm_tile", {"GT_WN": 2, "GT_MINB": 2}, {"type": "Q8_0", "rows": 128, "cols": 256, "batch": 70}),
    ("gemm_tile_glu", {}, {"type": "Q8_0", "rows": 256, "cols": 256, "batch": 33}),
    ("gemm_tile", {"GT_STAGES": 3}, {"type": "Q4_K", "rows": 128, "cols": 512, "batch": 130}),
    ("gemm_tile_glu", {"GT_WM": 4, "GT_WN": 2, "GT_STAGES": 2},
     {"type": "Q4_K", "rows": 256, "cols": 256, "batch": 64}),
    ("gemm_tile", {}, {"type": "Q6_K", "rows": 128, "cols": 512, "batch": 16}),
    ("gemm_tile_glu", {"GT_WM": 1}, {"type": "Q6_K", "rows": 128, "cols": 512, "batch": 100}),
]


def _case(kernel, config, shape, g=None, seed=0):
    g = g or FakeGpu(1 << 26)
    return g, GT.tune_case(g, kernel, "chain", dict(config), dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("kernel,config,shape", CASES, ids=[f"{c[0]}-{c[2]['type']}-b{c[2]['batch']}" for c in CASES])
def test_tile_hook_checks_rotates_and_launches(kernel, config, shape):
    check_tune_hook(*_case(kernel, config, shape), "chain bit for bit", ROTATE)


def test_tile_check_fails_when_the_kernel_writes_nothing(monkeypatch):
    kernel, config, shape = CASES[1]
    drop_launches(monkeypatch, "gemm_tile")
    _, case = _case(kernel, config, shape, seed=3)
    ok, _, detail = case.check()
    assert not ok, detail


@pytest.mark.parametrize("where,what", [
    (5, "1 of 2048 values differ from the chain's bits, 0 of 2048 from the built-in configuration's"),
    (200, "0 of 2048 values differ from the chain's bits, 1 of 2048 from the built-in configuration's")])
def test_tile_check_fails_one_ulp_off(monkeypatch, where, what):
    """A value one ulp off is within the float64 tolerance: the bits must catch it, in the first
    128 output rows (the host chain) and beyond them (the built-in configuration's launch)."""
    kernel, config, shape = CASES[0]
    real = GT.gemm_tile

    def off_by_one_ulp(g, w, y, **kw):
        real(g, w, y, **kw)
        a = y.numpy().copy()
        a.view(np.uint32).ravel()[where] ^= 1
        y.upload(a)

    _, case = _case(kernel, {"GT_WN": 4}, shape, seed=4)
    assert case.check()[0]
    monkeypatch.setattr(GT, "gemm_tile", off_by_one_ulp)
    ok, err, detail = case.check()
    assert not ok and err <= 1e-5 and what in detail, detail


BAD = [
    ("gemm_tile", {"GT_WN": 1}, "Q4_K"),                                  # GT_WN >= 2
    ("gemm_tile", {"GT_STAGES": 1}, "Q4_K"),
    ("gemm_tile", {"GT_PF": 2}, "Q6_K"),                                  # Q6_K prefetches at most 1
    ("gemm_tile", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3}, "Q8_0"),      # over the shared memory limit
    ("gemm_tile", {"GT_WM": 4}, "Q4_K"),                                  # 256-row tiles: N = 128 is not a multiple
    ("gemm_tile", {"GM_WK": 2}, "Q4_K"),                                  # not this family's tunable
    ("gemm_tile_glu", {"GT_WM ": 2}, "Q4_K"),                             # a typo must not measure the default
]


@pytest.mark.parametrize("kernel,config,t", BAD)
def test_tile_hook_refuses_bad_configurations(kernel, config, t):
    shape = {"type": t, "rows": 128 * (2 if kernel.endswith("_glu") else 1), "cols": 512, "batch": 16}
    GT.tune_modules(kernel, "chain", {}, shape)  # the shape itself is fine
    with pytest.raises(MemraError):
        _case(kernel, config, shape)
    with pytest.raises(MemraError):  # never compiled either (precompile skips what the hook refuses)
        GT.tune_modules(kernel, "chain", config, shape)


def test_tile_hook_refuses_unknown_kernels_variants_and_types():
    g, rng = FakeGpu(1 << 20), np.random.default_rng(0)
    shape = {"type": "Q4_K", "rows": 128, "cols": 256, "batch": 16}
    for kernel, variant, s in (("gemm_tile", "q8", shape), ("gemm", "chain", shape), ("gemm_tile", "chain",
                               {**shape, "type": "Q5_K"}), ("gemm_tile", "chain", {**shape, "type": "F16"}),
                               ("gemm_tile", "chain", {**shape, "type": "Q9_9"}),
                               ("gemm_tile_glu", "chain", {**shape, "rows": 129}),
                               ("gemm_tile", "chain", {**shape, "rows": 96}),            # no partial row tile
                               ("gemm_tile", "chain", {**shape, "cols": 288})):          # K a multiple of 256
        with pytest.raises(MemraError):
            GT.tune_case(g, kernel, variant, {}, s, rng, ROTATE)
        with pytest.raises(MemraError):
            GT.tune_modules(kernel, variant, {}, s)


def test_tile_bad_configuration_is_a_failed_receipt(tmp_path):
    """Through the campaign runner and the real gpu_measure (on the emulator): a refused
    configuration becomes a failed, untimed receipt; the others are checked and timed."""
    from memra.tune.measure import gpu_measure, is_builtin
    from memra.tune.receipts import iter_receipts, shape_batch

    g = FakeGpu(1 << 26)
    g.info.l2_bytes = 1 << 19
    g.time_ms = lambda fn, reps=50, warmup=5: [fn() or 0.05 for _ in range(reps)]
    spec = {"name": "t", "batches": [16], "reps": 3, "kernels": [{
        "name": "gemm_tile", "src": "gemm_tile.cu", "variants": ["chain"],
        "shapes": [{"type": "Q8_0", "rows": 128, "cols": 256}],
        "configs": [{"GT_WN": 2, "GT_STAGES": 3}, {"GT_WN": 4, "GT_STAGES": 2}, {"GT_WN": 4, "GT_STAGES": 3}]}]}
    out = tmp_path / "r.jsonl"
    counts = C.run_campaign(C.expand_campaign(spec), gpu_measure(g, seed=0), out,
                            context={"device": "emulated", "cc": (9, 0), "sms": 132, "nvrtc": "12.8"})
    assert counts == {"measured": 2, "failed": 1, "skipped": 0}
    rows = [r for _, r in iter_receipts(out)]
    bad = [r for r in rows if not r["ok"]]
    assert len(bad) == 1 and bad[0]["config"]["GT_STAGES"] == 3 and "shared memory" in bad[0]["error"]
    assert all(r["median_us"] for r in rows if r["ok"])
    # freeze's --min-gain baseline: the receipt of the built-in configuration (the 16-row default)
    assert [is_builtin({**r, "batch": shape_batch(r["shape"])}) for r in rows] == [True, False, False]


@pytest.mark.parametrize("kernel,config,shape", [CASES[0], CASES[5]])
def test_tile_tune_modules_are_what_the_job_loads(kernel, config, shape):
    g = ModuleLog()
    _, case = _case(kernel, config, shape, g=g)
    g.loaded.clear()  # the reference's modules (quantize, act_mul, the built-in tile) are not the job's
    case.launch(case.sets - 1)
    declared = {(f, tuple(sorted((k, str(v)) for k, v in d.items())))
                for f, d in GT.tune_modules(kernel, "chain", config, shape)}
    assert g.loaded == declared


def test_tile_is_builtin_follows_the_batch_default():
    small, big = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_MINB": 1}, {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}
    for t in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
        s = {b: {"type": t, "rows": 4096, "cols": 4096, "batch": b} for b in (1, 16, 64, 65, 128, 512)}
        for k in ("gemm_tile", "gemm_tile_glu"):
            assert all(GT.is_builtin(k, "chain", {}, s[b]) for b in s)
            assert [GT.is_builtin(k, "chain", small, s[b]) for b in s] == [True] * 3 + [False] * 3   # SMALL_ROWS = 64
            assert [GT.is_builtin(k, "chain", big, s[b]) for b in s] == [False] * 3 + [True] * 3
    # GT_PF is the type's own: Q6_K's is 1, the others' 2
    assert GT.is_builtin("gemm_tile", "chain", {"GT_PF": 1}, {"type": "Q6_K", "rows": 4096, "cols": 4096, "batch": 512})
    assert not GT.is_builtin("gemm_tile", "chain", {"GT_PF": 1}, {"type": "Q4_K", "rows": 4096, "cols": 4096,
                                                                  "batch": 512})


# ---------------------------------------------------------------- campaign jobs

Q4KM = "synth:llama3-8b:Q4_K_M"


def _tile_prompt(monkeypatch):
    """MEMRA_PROMPT_GEMM=tile: the prompt rows' matmuls on the tile (under the default, f16, every
    weight below runs on gemm_f16 and the tile has no launches: tests/test_tune_gemm_f16.py)."""
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")


def test_plan_shapes_lists_the_tile_launches_of_the_prompt_step(monkeypatch):
    """The 8B Q4_K_M at 512 rows under MEMRA_PROMPT_GEMM=tile: the hybrid plan's prompt step runs every
    weight with >= 16 output tiles of 128 rows through the tile (its layers' QKV fused in Q4_K, or Q+K
    with a Q6_K V of 1024 rows, which stays off the tile), the Q4_K and Q6_K down projections, gate+up
    as gemm_tile_glu; under the default (f16) none."""
    assert not [k for _, k, _ in C.plan_shapes(C.model_info(Q4KM), 512) if k.startswith("gemm_tile")]
    _tile_prompt(monkeypatch)
    got = {(op, k, shape_key(s)) for op, k, s in C.plan_shapes(C.model_info(Q4KM), 512) if k.startswith("gemm_tile")}
    assert got == {("qkv", "gemm_tile", "cols=4096,rows=6144,type=Q4_K"),
                   ("qkv", "gemm_tile", "cols=4096,rows=5120,type=Q4_K"),
                   ("attn_output", "gemm_tile", "cols=4096,rows=4096,type=Q4_K"),
                   ("down", "gemm_tile", "cols=14336,rows=4096,type=Q4_K"),
                   ("down", "gemm_tile", "cols=14336,rows=4096,type=Q6_K"),
                   ("gate_up", "gemm_tile_glu", "cols=4096,rows=28672,type=Q4_K")}
    assert {k for _, k, _ in C.plan_shapes(C.model_info(Q4KM), 3) if k.startswith("gemm_tile")} == \
        {"gemm_tile", "gemm_tile_glu"}   # any prompt step, also one a decode step's size


def _without_tile(monkeypatch):
    monkeypatch.setattr(GT, "supports", lambda *a, **k: False)


def test_plan_shapes_leave_the_other_kernels_unchanged(monkeypatch):
    """What plan_shapes lists for every other kernel, and so the h200-gemm campaign's jobs, are
    those of a plan without the tile (no weight it supports: it adds nothing; MEMRA_PROMPT_GEMM=tile)."""
    _tile_prompt(monkeypatch)
    models = [C.model_info(f"synth:{m}") for m in ("llama3-8b:Q4_K_M", "llama-1b:Q4_0")]
    spec = C.load_campaign(CAMPAIGNS / "h200-gemm.toml")
    rows = (1, 8, 16, 64, 65, 128, 512)
    now = {(m.name, r): C.plan_shapes(m, r) for m in models for r in rows}
    jobs = C.expand_campaign(spec, models)
    _without_tile(monkeypatch)
    for (name, r), got in now.items():
        m = next(x for x in models if x.name == name)
        assert [x for x in got if not x[1].startswith("gemm_tile")] == C.plan_shapes(m, r)
        assert len(got) > len(C.plan_shapes(m, r))
    assert C.expand_campaign(spec, models) == jobs
    assert not C.expand_campaign(C.load_campaign(CAMPAIGNS / "h200-gemm-tile.toml"), models)


def test_a_model_without_the_tile_has_no_tile_jobs():
    from test_tune_gemm import llama_like  # 256-row weights: fewer than MIN_ROW_TILES tiles

    spec = C.load_campaign(CAMPAIGNS / "h200-gemm-tile.toml")
    assert C.expand_campaign(spec, [llama_like()]) == []


def test_h200_gemm_tile_campaign_is_what_its_header_says(monkeypatch):
    """The committed campaign over the four benchmark models under MEMRA_PROMPT_GEMM=tile (none
    under the default): the job count its header states, every (shape, batch) with exactly one
    built-in configuration among its candidates (freeze's --min-gain baseline), refused only the
    2 x 4 tile with 3 stages on Q8_0 / Q6_K (shared memory), every batch for plain and glu, never
    the head."""
    path = CAMPAIGNS / "h200-gemm-tile.toml"
    spec = C.load_campaign(path)
    models = [C.model_info(f"synth:{m}") for m in ("llama3-8b:Q4_K_M", "llama3-8b:Q4_0", "llama3-8b:Q8_0",
                                                   "llama-1b:Q4_0")]
    assert C.expand_campaign(spec, models) == []
    _tile_prompt(monkeypatch)
    jobs = C.expand_campaign(spec, models)
    text = path.read_text()
    stated = int(re.search(r"# Cost: (\d+) jobs", text).group(1))
    refused_stated = int(re.search(r"\((\d+) of them", text).group(1))
    assert len(jobs) == stated and len({j.key() for j in jobs}) == len(jobs)
    pairs: dict[tuple, int] = {}
    refused = []
    for j in jobs:
        assert j.src == "gemm_tile.cu" and j.variant == "chain"
        try:
            GT.tune_modules(j.kernel, j.variant, j.config, j.shape)
        except MemraError:
            refused.append(j)
        k = (j.kernel, shape_key(j.shape), j.shape["batch"])
        pairs[k] = pairs.get(k, 0) + GT.is_builtin(j.kernel, j.variant, j.config, j.shape)
    assert set(pairs.values()) == {1}
    assert len(refused) == refused_stated and {(j.shape["type"], j.config["GT_WN"], j.config["GT_STAGES"])
                                               for j in refused} <= {("Q8_0", 4, 3), ("Q6_K", 4, 3)}
    for k in ("gemm_tile", "gemm_tile_glu"):
        assert {b for kk, _, b in pairs if kk == k} == {16, 64, 128, 512}
    assert not any("rows=128256" in s for _, s, _ in pairs)
    order = [(j.kernel, shape_key(j.shape)) for j in jobs]
    assert len([1 for a, b in zip(order, order[1:]) if a != b]) == len(set(order)) - 1


def test_campaign_dry_run_lists_tile_jobs(monkeypatch):
    from test_research import memra

    _tile_prompt(monkeypatch)   # the subprocess's environment
    r = memra("tune", "run", "h200-gemm-tile", "-m", "synth:llama-1b:Q4_0", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("gemm_tile")]
    # the 1B's gate+up only (its 2,048- and 3,072-row weights have fewer than MIN_ROW_TILES tiles):
    # 4 batches x 6 configurations
    assert len(lines) == 1 * 4 * 6 and "gemm_tile_glu\tchain" in out and "cols=2048,rows=16384,type=Q4_0" in out
    assert "gemm_tile\tchain" not in out


# ---------------------------------------------------------------- the launch set


def test_table_entries_of_the_tile_are_kernel_checked():
    """A device table's gemm_tile entry is a launch-set case (kernel-check runs every tuned
    configuration) with the entry's tunables over the batch default; an entry of another variant
    is not the tile's; the case's check runs on the emulator against the chain."""
    s = "cols=512,rows=256,type=Q4_K"
    cfg = {"GT_WM": 1, "GT_WN": 4, "GT_STAGES": 3}
    table = {"device": "d", "entries": {"gemm_tile": {s: {"16": {"variant": "chain", "config": cfg}}},
                                        "gemm_tile_glu": {s: {"64": {"variant": "chain", "config": {"GT_MINB": 2}},
                                                              "128": {"variant": "q8", "config": {}}}}}}
    got = list(LS.table_cases(table))
    assert [(f, L.op, L.kernel, L.variant, L.rows, L.args["glu"]) for f, L, _, _ in got] == \
        [("gemm_tile", "gemm_tile", "gemm_tile", "chain", 16, None),
         ("gemm_tile", "gemm_tile", "gemm_tile_glu", "chain", 64, "silu")]
    cases = [c for f, L, ctx, _ in got for c in GT.launch_cases(L, ctx)]
    assert cases[0]["defines"] == {"MV_TYPE": 12, **GT.launch_config(12, 16, cfg)}
    assert cases[1]["entry"] == "gemm_tile_glu" and cases[1]["defines"]["GT_MINB"] == 2
    ls = LS.launch_set([], [table], families=["gemm_tile"])
    assert {c["entry"] for c in ls.values()} == {"gemm_tile", "gemm_tile_glu"}
    assert all(c["sources"][0].startswith("table d: gemm_tile") for c in ls.values())
    g, rng = FakeGpu(1 << 26), np.random.default_rng(0)
    for c in ls.values():
        o = GT.check_launch(g, rng, c)
        assert o.ok, o.detail
