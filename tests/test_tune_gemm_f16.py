"""The f16 prompt GEMM (memra.gpu.ops.gemm_f16) as a tuned family: its tune hooks (memra/tune/measure.py's
contract) on the CPU emulator, the campaign jobs a hybrid plan's prompt step yields for it, and the
committed campaign.

Oracles: the emulator runs the launch contract of both kernels (gemm_f16_wg.cu for WG_*, gemm_f16.cu
for GF_*) and computes every output from the f16-rounded operands in float64, rounded once, the same
for every configuration, so a check must pass; it must fail when the kernel writes nothing (the
poison shows), when one value is one ulp off (inside the float64 tolerance: only the comparison with
the built-in configuration's bits sees it), when a configuration's bits differ from the built-in's,
and when its reference is planted wrong. The 8B's shapes are written out by hand from its tensor
types (gemm_f16 supports every layer weight of the four benchmark models).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu, ModuleLog, check_tune_hook, drop_launches
from memra.errors import MemraError
from memra.gpu.ops import gemm_f16 as GF
from memra.gpu.ops import gemm_tile as GT
from memra.tune import campaign as C
from memra.tune.receipts import shape_key

ROTATE = 1 << 20
CAMPAIGNS = Path(__file__).resolve().parent.parent / "tune" / "campaigns"
BITS = "the built-in configuration's bits"
WG_FULL = {"WG_BN": 128, "WG_MT": 1, "WG_STAGES": 4, "WG_INFLIGHT": 1, "WG_PREFETCH": 1}   # WG, every key spelled
WIDE_FULL = {**WG_FULL, "WG_BN": 256, "WG_INFLIGHT": 0}                                     # WG_WIDE

CASES = [  # kernel, config, shape: plain and glu, both kernels, every WG_* tunable, partial column tiles
    ("gemm_f16", {}, {"type": "Q4_0", "rows": 256, "cols": 256, "batch": 16}),   # rows past the float64 product's 128
    ("gemm_f16_glu", {"WG_BN": 256, "WG_INFLIGHT": 0}, {"type": "Q4_0", "rows": 256, "cols": 256, "batch": 9}),
    ("gemm_f16", {"WG_BN": 64, "WG_STAGES": 6}, {"type": "Q8_0", "rows": 128, "cols": 256, "batch": 70}),
    ("gemm_f16_glu", {}, {"type": "Q8_0", "rows": 512, "cols": 128, "batch": 33}),
    ("gemm_f16", {"WG_MT": 2, "WG_PREFETCH": 0}, {"type": "Q4_K", "rows": 256, "cols": 512, "batch": 130}),
    ("gemm_f16_glu", GF.MMA, {"type": "Q4_K", "rows": 256, "cols": 256, "batch": 64}),
    ("gemm_f16", {**GF.WIDE, "GF_OVERLAP": 1}, {"type": "Q6_K", "rows": 256, "cols": 256, "batch": 16}),
    ("gemm_f16_glu", {"WG_STAGES": 3, "WG_INFLIGHT": 0}, {"type": "Q6_K", "rows": 256, "cols": 256, "batch": 100}),
    ("gemm_f16", {"WG_BN": 256, "WG_MT": 2, "WG_STAGES": 3}, {"type": "IQ4_XS", "rows": 256, "cols": 256, "batch": 5}),
]


def _case(kernel, config, shape, g=None, seed=0):
    g = g or FakeGpu(1 << 26)
    return g, GF.tune_case(g, kernel, "f16", dict(config), dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("kernel,config,shape", CASES, ids=[f"{c[0]}-{c[2]['type']}-b{c[2]['batch']}" for c in CASES])
def test_f16_hook_checks_rotates_and_launches(kernel, config, shape):
    check_tune_hook(*_case(kernel, config, shape), BITS, ROTATE)


def test_f16_hook_counts_what_a_launch_reads_and_writes():
    """bytes: the weight, nb f16 activation rows of K and nb f32 outputs of N (N = rows / 2 for glu)."""
    _, case = _case(*CASES[3])
    w = case.ws[0].nbytes
    assert w > 0 and case.bytes == w + 33 * (2 * 128 + 4 * 256)


def test_f16_check_fails_when_the_kernel_writes_nothing(monkeypatch):
    kernel, config, shape = CASES[1]
    drop_launches(monkeypatch, "gemm_f16")
    _, case = _case(kernel, config, shape, seed=3)
    ok, _, detail = case.check()
    assert not ok and "not finite" in detail, detail


@pytest.mark.parametrize("where", [5, 16 * 256 - 1])   # in the first 128 output rows, and past them
def test_f16_check_fails_one_ulp_off(monkeypatch, where):
    """A value one ulp off is within the float64 tolerance: the built-in configuration's bits must
    catch it, in the rows the float64 product covers and beyond them."""
    kernel, _, shape = CASES[0]
    real = GF.gemm_f16

    def off_by_one_ulp(g, w, y, **kw):
        real(g, w, y, **kw)
        a = y.numpy().copy()
        a.view(np.uint32).ravel()[where] ^= 1
        y.upload(a)

    _, case = _case(kernel, {"WG_BN": 256}, shape, seed=4)
    assert case.check()[0]
    monkeypatch.setattr(GF, "gemm_f16", off_by_one_ulp)
    ok, err, detail = case.check()
    assert not ok and err <= 1e-5 and f"1 of {16 * 256} values differ from {BITS}" in detail, detail


def test_f16_check_fails_when_a_configuration_changes_the_bits(monkeypatch):
    """The outputs must not depend on the configuration: a kernel whose WG_BN 256 launches round one
    value otherwise fails that configuration's check (the built-in, WG_BN 128 at 256 rows, and
    WG_MT 2 pass on the same inputs)."""
    real = GF.gemm_f16

    def bn256_differs(g, w, y, *, config=None, **kw):
        real(g, w, y, config=config, **kw)
        if (config or {}).get("WG_BN") == 256:
            a = y.numpy().copy()
            a.view(np.uint32).ravel()[7] ^= 1
            y.upload(a)

    monkeypatch.setattr(GF, "gemm_f16", bn256_differs)
    kernel, _, shape = CASES[0]
    g = FakeGpu(1 << 26)
    for config, ok in (({}, True), ({"WG_MT": 2}, True), ({"WG_BN": 256}, False), (WIDE_FULL, False)):
        got, _, detail = _case(kernel, config, shape, g=g, seed=5)[1].check()
        assert got == ok, (config, detail)


@pytest.mark.parametrize("plant", ["bits", "ref"])
def test_f16_check_fails_on_a_planted_wrong_reference(plant):
    """One reference bit flipped (the built-in configuration's, past the float64 rows), or the float64
    product 1 % off: the job's correct outputs no longer pass."""
    _, case = _case(*CASES[0], seed=6)
    assert case.check()[0]
    if plant == "bits":
        case.bits = case.bits.copy()
        case.bits[3, 200] ^= 1
        needle = f"1 of {16 * 256} values differ from {BITS}"
    else:
        case.ref = case.ref * 1.01
        needle = "err="
    ok, _, detail = case.check()
    assert not ok and needle in detail, detail


BAD = [  # config, the words of the refusal
    ({"WG_BN": 96}, "WG_BN 64, 128 or 256"),
    ({"WG_MT": 3}, "WG_MT 1 or 2"),
    ({"WG_STAGES": 2}, "WG_STAGES >= 2 + WG_INFLIGHT"),                    # WG_INFLIGHT 1 (the default)
    ({"WG_INFLIGHT": 2}, "WG_INFLIGHT and WG_PREFETCH 0 or 1"),
    ({"WG_BN": 256, "WG_STAGES": 5}, "shared memory 246864 > 232448"),
    ({"WG_MT": 2}, "N = 128 not a positive multiple of 256"),            # 256-row tiles on a 128-row weight
    ({"GF_TN": 3}, "GF_TN even"),
    ({"GF_WM": 8, "GF_WN": 8}, "at most 1024 threads"),
    ({"GF_WM": 2, "WG_BN": 128}, "mixes GF_* (gemm_f16.cu) and WG_* (gemm_f16_wg.cu)"),
    ({"GT_WM": 2}, "unknown tunables ['GT_WM']"),                        # not this family's tunable
    ({"WG_BN ": 128}, "unknown tunables ['WG_BN ']"),                    # a typo must not measure the default
    ({"WG_SETMAXNREG": 1}, "unknown tunables ['WG_SETMAXNREG']"),        # a kernel define the family does not tune
]


@pytest.mark.parametrize("config,needle", BAD, ids=[str(b[0]) for b in BAD])
def test_f16_hook_refuses_bad_configurations_by_name_before_any_compile(config, needle):
    shape = {"type": "Q4_K", "rows": 128, "cols": 512, "batch": 16}
    GF.tune_modules("gemm_f16", "f16", {}, shape)  # the shape itself is fine
    g = ModuleLog()
    with pytest.raises(MemraError, match=re.escape(needle)):
        _case("gemm_f16", config, shape, g=g)
    assert g.loaded == set() and g.launches == 0
    with pytest.raises(MemraError, match=re.escape(needle)):  # never compiled either (precompile skips it)
        GF.tune_modules("gemm_f16", "f16", config, shape)
    assert not GF.is_builtin("gemm_f16", "f16", config, shape)


SHAPE = {"type": "Q4_K", "rows": 128, "cols": 256, "batch": 16}
REFUSED = [  # kernel, variant, shape, the words of the refusal
    ("gemm_f16", "chain", SHAPE, "unknown kernel/variant gemm_f16/chain"),
    ("gemm_tile", "f16", SHAPE, "unknown kernel/variant gemm_tile/f16"),
    ("gemm", "f16", SHAPE, "unknown kernel/variant gemm/f16"),
    ("gemm_f16", "f16", {**SHAPE, "type": "F16"}, "no f16 kernel for F16 weights"),
    ("gemm_f16", "f16", {**SHAPE, "type": "BF16"}, "no f16 kernel for BF16 weights"),
    ("gemm_f16", "f16", {**SHAPE, "type": "Q2_K"}, "unknown weight type 'Q2_K'"),   # no kernel of the family has it
    ("gemm_f16", "f16", {**SHAPE, "type": "Q9_9"}, "unknown weight type 'Q9_9'"),
    ("gemm_f16_glu", "f16", {**SHAPE, "rows": 257}, "an even row count, got 257"),
    ("gemm_f16", "f16", {**SHAPE, "rows": 96}, "N = 96 not a positive multiple of 128"),    # no partial row tile
    ("gemm_f16_glu", "f16", {**SHAPE, "rows": 192}, "N = 96 not a positive multiple of 64"),
    ("gemm_f16", "f16", {**SHAPE, "cols": 384}, "K = 384 not a positive multiple of 256"),   # whole super-blocks
    ("gemm_f16", "f16", {**SHAPE, "type": "Q4_0", "cols": 160}, "K = 160 not a positive multiple of 128"),
]


@pytest.mark.parametrize("kernel,variant,shape,needle", REFUSED, ids=[r[3] for r in REFUSED])
def test_f16_hook_refuses_unknown_kernels_variants_types_and_shapes(kernel, variant, shape, needle):
    g, rng = ModuleLog(1 << 20), np.random.default_rng(0)
    with pytest.raises(MemraError, match=re.escape(needle)):
        GF.tune_case(g, kernel, variant, {}, shape, rng, ROTATE)
    assert g.loaded == set()
    with pytest.raises(MemraError, match=re.escape(needle)):
        GF.tune_modules(kernel, variant, {}, shape)


def test_f16_bad_configuration_is_a_failed_receipt(tmp_path):
    """Through the campaign runner and the real gpu_measure (on the emulator): a refused
    configuration becomes a failed, untimed receipt; the others are checked and timed; the
    receipts' source hash covers both kernel files."""
    from memra.gpu.compile import source_hash
    from memra.tune.measure import gpu_measure, is_builtin
    from memra.tune.receipts import iter_receipts, shape_batch
    from memra.tune.tables import combined_hash

    g = FakeGpu(1 << 26)
    g.info.l2_bytes = 1 << 19
    g.time_ms = lambda fn, reps=50, warmup=5: [fn() or 0.05 for _ in range(reps)]
    spec = {"name": "t", "batches": [16], "reps": 3, "kernels": [{
        "name": "gemm_f16", "src": "gemm_f16.cu+gemm_f16_wg.cu", "variants": ["f16"],
        "shapes": [{"type": "Q8_0", "rows": 256, "cols": 256}],
        "configs": [WG_FULL, {"WG_BN": 256, "WG_STAGES": 5}, GF.MMA]}]}
    out = tmp_path / "r.jsonl"
    counts = C.run_campaign(C.expand_campaign(spec), gpu_measure(g, seed=0), out,
                            context={"device": "emulated", "cc": (9, 0), "sms": 132, "nvrtc": "12.8"})
    assert counts == {"measured": 2, "failed": 1, "skipped": 0}
    rows = [r for _, r in iter_receipts(out)]
    bad = [r for r in rows if not r["ok"]]
    assert len(bad) == 1 and bad[0]["config"]["WG_STAGES"] == 5 and "shared memory" in bad[0]["error"]
    assert all(r["median_us"] for r in rows if r["ok"])
    assert {r["src_hash"] for r in rows} == {combined_hash([source_hash("gemm_f16.cu"),
                                                           source_hash("gemm_f16_wg.cu")])}
    # freeze's --min-gain baseline: the receipt of the built-in configuration (WG: 256 rows)
    assert [is_builtin({**r, "batch": shape_batch(r["shape"])}) for r in rows] == [True, False, False]


@pytest.mark.parametrize("kernel,config,shape,file", [
    (*CASES[0], "gemm_f16_wg.cu"), (*CASES[4], "gemm_f16_wg.cu"), (*CASES[5], "gemm_f16.cu"),
    ("gemm_f16", {}, {"type": "Q4_0", "rows": 6144, "cols": 128, "batch": 3}, "gemm_f16_wg.cu"),   # WG_WIDE
])
def test_f16_tune_modules_are_what_the_job_loads(kernel, config, shape, file):
    g = ModuleLog()
    _, case = _case(kernel, config, shape, g=g)
    g.loaded.clear()  # the reference's module (the built-in configuration's) is not the job's
    case.launch(case.sets - 1)
    declared = GF.tune_modules(kernel, "f16", config, shape)
    assert [f for f, _ in declared] == [file]
    assert g.loaded == {(f, tuple(sorted((k, str(v)) for k, v in d.items()))) for f, d in declared}


def test_f16_is_builtin_follows_the_weight_rows():
    """The built-in is WG_BN 256 with WG_INFLIGHT 0 from WG_WIDE_ROWS weight rows (2N for glu), WG_BN
    128 below, at every batch; spelled with every key or only the differing ones; never MMA, never
    another value of one key."""
    for t in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
        for k, rows, wide in (("gemm_f16", 4096, False), ("gemm_f16", 6144, True), ("gemm_f16", 1024, False),
                              ("gemm_f16_glu", 4096, False), ("gemm_f16_glu", 6144, True),
                              ("gemm_f16_glu", 28672, True)):
            for b in (1, 16, 64, 128, 512):
                s = {"type": t, "rows": rows, "cols": 4096, "batch": b}
                assert GF.is_builtin(k, "f16", {}, s)
                assert GF.is_builtin(k, "f16", WIDE_FULL, s) == wide
                assert GF.is_builtin(k, "f16", GF.WG_WIDE, s) == wide
                assert GF.is_builtin(k, "f16", WG_FULL, s) == (not wide)
                assert GF.is_builtin(k, "f16", GF.WG, s) == (not wide)
                assert not GF.is_builtin(k, "f16", GF.MMA, s)
                assert not GF.is_builtin(k, "f16", {**(WIDE_FULL if wide else WG_FULL), "WG_PREFETCH": 0}, s)
                assert not GF.is_builtin(k, "f16", {"WG_STAGES": 6 if not wide else 3}, s)
    assert not GF.is_builtin("gemm_f16", "f16", {}, {"type": "Q2_K", "rows": 4096, "cols": 4096, "batch": 512})
    assert not GF.is_builtin("gemm_f16", "chain", {}, {"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": 512})


def test_a_campaign_naming_another_variant_is_refused():
    from memra.tune.measure import check_variants

    spec = {"name": "t", "batches": [512], "kernels": [{
        "name": "gemm_f16", "src": "gemm_f16.cu+gemm_f16_wg.cu", "variants": ["chain"],
        "shapes": [{"type": "Q4_K", "rows": 4096, "cols": 4096}]}]}
    with pytest.raises(MemraError, match="kernel gemm_f16 has no variant 'chain' \\(its variants: f16\\)"):
        check_variants(C.expand_campaign(spec))
    spec["kernels"][0]["variants"] = ["f16"]
    check_variants(C.expand_campaign(spec))


# ---------------------------------------------------------------- campaign jobs

Q4KM = "synth:llama3-8b:Q4_K_M"
MODELS = ("llama3-8b:Q4_K_M", "llama3-8b:Q4_0", "llama3-8b:Q8_0", "llama-1b:Q4_0")
Q4KM_F16 = {("qkv", "gemm_f16", "cols=4096,rows=6144,type=Q4_K"),
            ("qkv", "gemm_f16", "cols=4096,rows=5120,type=Q4_K"),
            ("qkv", "gemm_f16", "cols=4096,rows=1024,type=Q6_K"),
            ("attn_output", "gemm_f16", "cols=4096,rows=4096,type=Q4_K"),
            ("down", "gemm_f16", "cols=14336,rows=4096,type=Q4_K"),
            ("down", "gemm_f16", "cols=14336,rows=4096,type=Q6_K"),
            ("gate_up", "gemm_f16_glu", "cols=4096,rows=28672,type=Q4_K")}


def _prompt(got, prefix):
    return {(op, k, shape_key(s)) for op, k, s in got if k.startswith(prefix)}


def test_plan_shapes_lists_the_f16_launches_of_the_prompt_step(monkeypatch):
    """The 8B Q4_K_M under MEMRA_PROMPT_GEMM=f16 (the default): the hybrid plan's prompt step runs every
    layer weight on gemm_f16 (its layers' QKV fused in Q4_K, or Q+K with a Q6_K V of 1024 rows, split),
    the Q4_K and Q6_K down projections, gate+up as gemm_f16_glu, and nothing on the tile, at any prompt
    step; MEMRA_PROMPT_GEMM=tile lists no gemm_f16 launch."""
    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    m = C.model_info(Q4KM)
    for rows in (3, 64, 128, 512):
        got = C.plan_shapes(m, rows)
        assert _prompt(got, "gemm_f16") == Q4KM_F16 and not _prompt(got, "gemm_tile")
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    got = C.plan_shapes(m, 512)
    assert not _prompt(got, "gemm_f16") and _prompt(got, "gemm_tile")


def test_plan_shapes_keep_the_tile_launches_on_weights_gemm_f16_does_not_take(monkeypatch):
    """A weight gemm_f16 does not support keeps the tile under the default: plan_shapes lists those
    gemm_tile launches beside the gemm_f16 ones (here gemm_f16 made to refuse Q6_K: the Q6_K down
    projection goes back to the tile; the 1,024-row Q6_K V has too few output tiles for it)."""
    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    m = C.model_info(Q4KM)
    monkeypatch.setattr(GF, "supports", lambda t, N, K, glu: t != 14)   # every Q6_K weight off gemm_f16
    got = C.plan_shapes(m, 512)
    assert _prompt(got, "gemm_tile") == {("down", "gemm_tile", "cols=14336,rows=4096,type=Q6_K")}
    assert _prompt(got, "gemm_f16") == {x for x in Q4KM_F16 if "Q6_K" not in x[2]}


def test_plan_shapes_leave_the_other_kernels_unchanged(monkeypatch):
    """What plan_shapes lists for every other kernel, and so the h200-gemm campaign's jobs, are those of
    a plan whose prompt rows take neither gemm_f16 nor the tile (no weight either supports)."""
    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    models = [C.model_info(f"synth:{m}") for m in ("llama3-8b:Q4_K_M", "llama-1b:Q4_0")]
    spec = C.load_campaign(CAMPAIGNS / "h200-gemm.toml")
    rows = (1, 16, 64, 65, 128, 512)
    now = {(m.name, r): C.plan_shapes(m, r) for m in models for r in rows}
    jobs = C.expand_campaign(spec, models)
    monkeypatch.setattr(GF, "supports", lambda *a, **k: False)
    monkeypatch.setattr(GT, "supports", lambda *a, **k: False)
    for (name, r), got in now.items():
        m = next(x for x in models if x.name == name)
        assert [x for x in got if not x[1].startswith("gemm_f16")] == C.plan_shapes(m, r)
        assert len(got) > len(C.plan_shapes(m, r))
    assert C.expand_campaign(spec, models) == jobs
    assert not C.expand_campaign(C.load_campaign(CAMPAIGNS / "h200-gemm-f16.toml"), models)


def test_h200_gemm_f16_campaign_is_what_its_header_says(monkeypatch):
    """The committed campaign over the four benchmark models (no GPU): the job and module counts its
    header states, the 8B Q4_K_M's shapes as the plan's prompt step runs them, every (shape, batch)
    with exactly one built-in configuration among its candidates (freeze's --min-gain baseline),
    nothing refused, gemm_f16.cu's MMA at every batch, never the head; none under MEMRA_PROMPT_GEMM=tile."""
    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    path = CAMPAIGNS / "h200-gemm-f16.toml"
    spec = C.load_campaign(path)
    models = [C.model_info(f"synth:{m}") for m in MODELS]
    jobs = C.expand_campaign(spec, models)
    text = path.read_text()
    assert len(jobs) == int(re.search(r"# Cost: (\d+) jobs", text).group(1)) and len({j.key() for j in jobs}) == len(jobs)
    modules, pairs = set(), {}
    for j in jobs:
        assert j.src == "gemm_f16.cu+gemm_f16_wg.cu" and j.variant == "f16"
        for f, d in GF.tune_modules(j.kernel, j.variant, j.config, j.shape):   # nothing refused
            modules.add((f, tuple(sorted(d.items()))))
        k = (j.kernel, shape_key(j.shape), j.shape["batch"])
        pairs[k] = pairs.get(k, 0) + GF.is_builtin(j.kernel, j.variant, j.config, j.shape)
    assert set(pairs.values()) == {1}
    assert len(modules) == int(re.search(r"(\d+) modules", text).group(1))
    q4km = {(j.kernel, shape_key(j.shape)) for j in jobs if any(o.startswith(Q4KM + ":") for o in j.ops)}
    assert q4km == {(k, s) for _, k, s in Q4KM_F16}
    for k in ("gemm_f16", "gemm_f16_glu"):
        assert {b for kk, _, b in pairs if kk == k} == {64, 128, 512}
        assert {j.shape["batch"] for j in jobs if j.kernel == k and j.config == GF.MMA} == {64, 128, 512}
    assert not any("rows=128256" in s for _, s, _ in pairs)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    assert C.expand_campaign(spec, models) == []


def test_campaign_dry_run_lists_f16_jobs(monkeypatch):
    from test_research import memra

    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)   # the subprocess's environment
    r = memra("tune", "run", "h200-gemm-f16", "-m", "synth:llama-1b:Q4_0", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("gemm_f16")]
    # the 1B's QKV (3,072 rows), attention output, down and gate+up: 9 configurations at 512 rows, 4 at 128 and 64
    assert len(lines) == 4 * (9 + 4 + 4)
    assert "gemm_f16_glu\tf16" in r.stdout and "cols=2048,rows=16384,type=Q4_0" in r.stdout
    assert "cols=2048,rows=3072,type=Q4_0" in r.stdout


# ---------------------------------------------------------------- the launch set


def test_table_entries_of_gemm_f16_are_kernel_checked():
    """A device table's gemm_f16 entry is a launch-set case (kernel-check runs every tuned
    configuration) on the module the entry's tunables select over the weight's built-in; an entry of
    another variant is not gemm_f16's; the case's check runs on the emulator against the reference."""
    from memra.tune import launches as LS

    s = "cols=512,rows=256,type=Q4_K"
    table = {"device": "d", "entries": {
        "gemm_f16": {s: {"16": {"variant": "f16", "config": {"WG_BN": 64, "WG_STAGES": 6}},
                         "512": {"variant": "f16", "config": GF.MMA}}},
        "gemm_f16_glu": {s: {"64": {"variant": "f16", "config": {"WG_MT": 2}},
                             "128": {"variant": "chain", "config": {}}}}}}
    got = list(LS.table_cases(table))
    assert [(f, L.op, L.kernel, L.rows, L.args["glu"]) for f, L, _, _ in got] == \
        [("gemm_f16", "gemm_f16", "gemm_f16", 16, None), ("gemm_f16", "gemm_f16", "gemm_f16", 512, None),
         ("gemm_f16", "gemm_f16", "gemm_f16_glu", 64, "silu")]
    cases = [c for f, L, ctx, _ in got for c in GF.launch_cases(L, ctx)]
    assert cases[0]["file"] == "gemm_f16_wg.cu" and cases[0]["defines"] == {"MV_TYPE": 12, "WG_BN": 64, "WG_STAGES": 6}
    assert cases[1]["file"] == "gemm_f16.cu" and cases[2]["defines"]["WG_MT"] == 2
    g, rng = FakeGpu(1 << 26), np.random.default_rng(0)
    for c in cases:
        o = GF.check_launch(g, rng, c)
        assert o.ok, o.detail
