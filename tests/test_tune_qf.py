"""qf (memra.gpu.ops.qf, MEMRA_DECODE=qf) as a tuned family: its tune hooks (memra/tune/measure.py's contract) on the
CPU emulator, the campaign jobs a qf plan's decode step yields, the committed campaign, a table entry's way into the
plan and into kernel-check's launch set.

Oracles: the emulator runs qf's launch contract and computes every output from the same operands in float64, the same
for every configuration, so a check must pass; it must fail when the kernel writes nothing (the poison shows), when one
value is one ulp off (inside the float64 tolerance: only the built-in configuration's bits see it), when a
configuration's bits differ from the built-in's, and when its reference is planted wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu, ModuleLog, check_tune_hook, drop_launches
from memra.errors import MemraError
from memra.gpu.ops import qf as QF
from memra.tune import campaign as C
from memra.tune.receipts import shape_key

ROTATE = 1 << 20
CAMPAIGNS = Path(__file__).resolve().parent.parent / "tune" / "campaigns"
BITS = "the built-in configuration's bits"
Q8B = "synth:llama3-8b:Q4_K_M"

CASES = [  # kernel, config, shape: qf_mv and qf_gemm, plain and glu, both types, 1..4 chains, split and walked
    ("qf", {}, {"type": "Q4_K", "rows": 192, "cols": 1024, "batch": 1}),                 # past the reference's 128 rows
    ("qf", {"QF_WARPS": 8}, {"type": "Q6_K", "rows": 64, "cols": 512, "batch": 5}),
    ("qf_glu", {}, {"type": "Q4_K", "rows": 128, "cols": 512, "batch": 16}),
    ("qf", {"QF_GWARPS": 4, "QF_NT": 4, "QF_STAGES": 3, "QF_KSPLIT": 1, "QF_WSMEM": 1},
     {"type": "Q6_K", "rows": 64, "cols": 1024, "batch": 33}),
    ("qf", {"QF_NT": 8, "QF_KSPLIT": 0}, {"type": "Q4_K", "rows": 32, "cols": 2048, "batch": 64}),
    # qf_gemm at one row (session 58's candidates at 1-8 rows: one n8 tile, deep stages, the chains split)
    ("qf", {"QF_GWARPS": 4, "QF_NT": 1, "QF_STAGES": 4, "QF_KSPLIT": 1, "QF_WSMEM": 1},
     {"type": "Q6_K", "rows": 64, "cols": 1024, "batch": 1}),
    ("qf_glu", {"QF_GWARPS": 8, "QF_NT": 1, "QF_STAGES": 3, "QF_KSPLIT": 0, "QF_WSMEM": 1},
     {"type": "Q4_K", "rows": 128, "cols": 512, "batch": 3}),
]


def _case(kernel, config, shape, g=None, seed=0):
    g = g or FakeGpu(1 << 26)
    return g, QF.tune_case(g, kernel, "qf", dict(config), dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("kernel,config,shape", CASES, ids=[f"{c[0]}-{c[2]['type']}-b{c[2]['batch']}" for c in CASES])
def test_qf_hook_checks_rotates_and_launches(kernel, config, shape):
    check_tune_hook(*_case(kernel, config, shape), BITS, ROTATE)


def test_qf_hook_counts_what_a_launch_reads_and_writes():
    """bytes: the weight, nb f16 activation rows of K (Q4_K: and their sums, K / 16 floats a row), nb f32 outputs of
    N (rows / 2 for glu)."""
    _, case = _case(*CASES[2])
    assert case.bytes == case.ws[0].nbytes + 16 * (2 * 512 + 512 // 4 + 4 * 64)
    _, case = _case(*CASES[1])
    assert case.bytes == case.ws[0].nbytes + 5 * (2 * 512 + 4 * 64)


def test_qf_check_fails_when_the_kernel_writes_nothing(monkeypatch):
    drop_launches(monkeypatch, "qf_")
    _, case = _case(*CASES[2], seed=3)
    ok, _, detail = case.check()
    assert not ok and "not finite" in detail, detail


@pytest.mark.parametrize("where", [5, 16 * 192 - 1])   # in the first 128 output rows, and past them
def test_qf_check_fails_one_ulp_off(monkeypatch, where):
    kernel, _, shape = CASES[0]
    shape = {**shape, "batch": 16}
    real = QF.qf

    def off_by_one_ulp(g, w, y, **kw):
        real(g, w, y, **kw)
        a = y.numpy().copy()
        a.view(np.uint32).ravel()[where] ^= 1
        y.upload(a)

    _, case = _case(kernel, {"QF_NT": 1}, shape, seed=4)
    assert case.check()[0]
    monkeypatch.setattr(QF, "qf", off_by_one_ulp)
    ok, err, detail = case.check()
    assert not ok and err <= 1e-5 and f"1 of {16 * 192} values differ from {BITS}" in detail, detail


def test_qf_check_fails_when_a_configuration_changes_the_bits(monkeypatch):
    """A kernel whose QF_NT 1 launches round one value otherwise fails that configuration's check; the built-in and
    QF_GWARPS 4 pass on the same inputs."""
    real = QF.qf

    def nt1_differs(g, w, y, *, config=None, **kw):
        real(g, w, y, config=config, **kw)
        if (config or {}).get("QF_NT") == 1:
            a = y.numpy().copy()
            a.view(np.uint32).ravel()[7] ^= 1
            y.upload(a)

    monkeypatch.setattr(QF, "qf", nt1_differs)
    kernel, _, shape = CASES[2]
    g = FakeGpu(1 << 26)
    for config, ok in (({}, True), ({"QF_GWARPS": 4}, True), ({"QF_NT": 1}, False)):
        got, _, detail = _case(kernel, config, shape, g=g, seed=5)[1].check()
        assert got == ok, (config, detail)


@pytest.mark.parametrize("plant", ["bits", "ref"])
def test_qf_check_fails_on_a_planted_wrong_reference(plant):
    _, case = _case(*CASES[0], seed=6)
    assert case.check()[0]
    if plant == "bits":
        case.bits = case.bits.copy()
        case.bits[0, 150] ^= 1   # past the float64 reference's rows
        needle = f"1 of {192} values differ from {BITS}"
    else:
        case.ref = case.ref * 1.01
        needle = "err="
    ok, _, detail = case.check()
    assert not ok and needle in detail, detail


SHAPE = {"type": "Q4_K", "rows": 128, "cols": 1024, "batch": 16}
REFUSED = [  # kernel, variant, config, shape, the words of the refusal
    ("qf", "q8", {}, SHAPE, "unknown kernel/variant qf/q8"),
    ("gemm", "qf", {}, SHAPE, "unknown kernel/variant gemm/qf"),
    ("qf", "qf", {"QF_CHAINS": 1}, SHAPE, "QF_CHAINS=1 is not the weight's chain count 4"),   # the arithmetic
    ("qf", "qf", {"QF_TYPE": 14}, SHAPE, "QF_TYPE=14 is not the weight's type 12"),
    ("qf", "qf", {"GM_TM": 2}, SHAPE, "unknown tunables ['GM_TM']"),
    ("qf", "qf", {"QF_NT ": 2}, SHAPE, "unknown tunables ['QF_NT ']"),    # a typo must not measure the default
    ("qf", "qf", {"QF_NT": 3}, SHAPE, "QF_NT 1, 2, 4 or 8"),
    ("qf", "qf", {"QF_WARPS": 6}, SHAPE, "QF_WARPS a multiple of QF_CHAINS"),
    ("qf", "qf", {"QF_NT": 8, "QF_GWARPS": 16, "QF_STAGES": 4}, SHAPE, "shared memory"),
    ("qf", "qf", {}, {**SHAPE, "type": "Q4_0"}, "no qf kernel for Q4_0 weights"),
    ("qf_glu", "qf", {}, {**SHAPE, "rows": 130}, "N = 65 not a positive multiple of 8"),
    ("qf_glu", "qf", {}, {**SHAPE, "rows": 129}, "an even row count, got 129"),
    ("qf", "qf", {}, {**SHAPE, "cols": 300}, "K = 300 not a positive multiple of 256"),
]


@pytest.mark.parametrize("kernel,variant,config,shape,needle", REFUSED, ids=[r[4] for r in REFUSED])
def test_qf_hook_refuses_by_name_before_any_compile(kernel, variant, config, shape, needle):
    g, rng = ModuleLog(1 << 20), np.random.default_rng(0)
    with pytest.raises(MemraError, match=re.escape(needle)):
        QF.tune_case(g, kernel, variant, config, shape, rng, ROTATE)
    assert g.loaded == set() and g.launches == 0
    with pytest.raises(MemraError, match=re.escape(needle)):   # never compiled either (precompile skips it)
        QF.tune_modules(kernel, variant, config, shape)
    assert not QF.is_builtin(kernel, variant, config, shape)


def test_is_builtin_is_the_launchers_default_at_the_jobs_rows():
    s16, s1 = SHAPE, {**SHAPE, "batch": 1}
    assert QF.is_builtin("qf", "qf", {}, s16) and QF.is_builtin("qf", "qf", {}, s1)
    full = QF.launch_config(16, 128, 1024, False)
    assert QF.is_builtin("qf", "qf", {k: v for k, v in full.items() if k != "QF_WARPS"}, s16)
    assert QF.is_builtin("qf", "qf", {"QF_WARPS": 4}, s1) and not QF.is_builtin("qf", "qf", {"QF_WARPS": 8}, s1)
    assert not QF.is_builtin("qf", "qf", {"QF_NT": 4}, s16) and not QF.is_builtin("qf", "qf", {"QF_KSPLIT": 0}, s16)
    assert QF.tune_modules("qf", "qf", {}, s16) == [(QF.KERNEL_FILE, full)]


def test_plan_shapes_lists_the_qf_launches_of_the_generated_rows(monkeypatch):
    """The 8B Q4_K_M: a qf plan's decode step (and a step of generated rows past 64) runs every layer weight through
    qf — QKV fused in Q4_K or Q+K with a Q6_K V, attention output, both down types, gate+up as qf_glu — the head only
    with MEMRA_QF_HEAD=1."""
    monkeypatch.delenv("MEMRA_QF_HEAD", raising=False)
    m = C.model_info(Q8B)
    want = {("qkv", "qf", "cols=4096,rows=6144,type=Q4_K"), ("qkv", "qf", "cols=4096,rows=5120,type=Q4_K"),
            ("qkv", "qf", "cols=4096,rows=1024,type=Q6_K"), ("attn_output", "qf", "cols=4096,rows=4096,type=Q4_K"),
            ("down", "qf", "cols=14336,rows=4096,type=Q4_K"), ("down", "qf", "cols=14336,rows=4096,type=Q6_K"),
            ("gate_up", "qf_glu", "cols=4096,rows=28672,type=Q4_K")}
    qf = lambda got: {(op, k, shape_key(s)) for op, k, s in got if k.startswith("qf")}  # noqa: E731
    for rows in (1, 8, 9, 64, 128):
        assert qf(C.plan_shapes(m, rows)) == want, rows
    m1 = C.model_info("synth:llama-1b:Q4_0")
    assert not qf(C.plan_shapes(m1, 64))   # no Q4_K / Q6_K layer weight
    monkeypatch.setenv("MEMRA_QF_HEAD", "1")
    assert qf(C.plan_shapes(m, 64)) == want | {("output", "qf", "cols=4096,rows=128256,type=Q6_K")}
    assert qf(C.plan_shapes(m1, 64)) == {("output", "qf", "cols=2048,rows=128256,type=Q6_K")}   # its Q6_K head


def test_h200_qf_campaign_is_what_its_header_says(monkeypatch):
    """The committed campaign on the 8B Q4_K_M (no GPU): the job and module counts its header states (and with
    MEMRA_QF_HEAD=1), exactly one built-in configuration at every (shape, batch) (freeze's --min-gain baseline),
    nothing refused, qf_mv's and one-tile qf_gemm's candidates at 1-8 rows and qf_gemm's above, never a chain count
    of its own."""
    from memra.tune.measure import check_variants, require_hooks

    monkeypatch.delenv("MEMRA_QF_HEAD", raising=False)
    path = CAMPAIGNS / "h200-qf.toml"
    spec = C.load_campaign(path)
    text = path.read_text()
    cost = re.search(r"# Cost: (\d+) jobs .*?, (\d+) with MEMRA_QF_HEAD=1 .*?(\d+) modules", text, re.S)
    m = C.model_info(Q8B)
    jobs = C.expand_campaign(spec, [m])
    require_hooks(jobs)
    check_variants(jobs)
    assert len(jobs) == int(cost.group(1)) and len({j.key() for j in jobs}) == len(jobs)
    builtin, modules = {}, set()
    for j in jobs:
        assert "QF_CHAINS" not in j.config
        (f, d), = QF.tune_modules(j.kernel, j.variant, dict(j.config), dict(j.shape))   # refused: raises
        modules.add((f, tuple(sorted(d.items()))))
        # qf_gemm above MV_ROWS rows; at 1-8 rows qf_mv, or qf_gemm with one n8 tile where the job names its tunables
        assert QF.is_gemm(d) == (j.shape["batch"] > QF.MV_ROWS or QF.is_gemm(j.config)), j.label()
        assert j.shape["batch"] > QF.MV_ROWS or not QF.is_gemm(d) or d["QF_NT"] == 1, j.label()
        key = (j.kernel, shape_key(j.shape), j.shape["batch"])
        builtin[key] = builtin.get(key, 0) + QF.is_builtin(j.kernel, j.variant, dict(j.config), dict(j.shape))
    assert set(builtin.values()) == {1} and len(builtin) == 7 * 7
    assert len(modules) == int(cost.group(3))
    monkeypatch.setenv("MEMRA_QF_HEAD", "1")
    assert len(C.expand_campaign(spec, [m])) == int(cost.group(2))


@pytest.mark.parametrize("bucket,cfg,used,unused,ws", [
    # qf_gemm at bucket 64, for 33-64 rows (not at 16)
    (64, {"QF_GWARPS": 4, "QF_NT": 8, "QF_STAGES": 3, "QF_KSPLIT": 1, "QF_WSMEM": 1}, (64, 40), (16,), None),
    # session 58's one-row candidates: qf_gemm at bucket 1 (one n8 tile, the chains split), not at 2 (qf_mv), and
    # the plan's workspace holds its split chains (4 chains x 1 row x 4,096 outputs, a counter a 4-warp block)
    (1, {"QF_GWARPS": 4, "QF_NT": 1, "QF_STAGES": 4, "QF_KSPLIT": 1, "QF_WSMEM": 1}, (1,), (2,), (4 * 4096, 64)),
], ids=["bucket64", "bucket1"])
def test_a_qf_table_entry_reaches_the_plan_and_kernel_checks_launch_set(monkeypatch, bucket, cfg, used, unused, ws):
    """A frozen qf entry (the 8B's Q6_K down) is the planner's configuration for that weight at its bucket's row
    counts (not at the others), kernel-check's launch set runs it as qf_gemm (table_cases) and unexecuted_entries
    finds it executed (another configuration's case does not execute it)."""
    from memra.gpu.plan import Planner
    from memra.tune import launches as LS

    monkeypatch.delenv("MEMRA_QF_HEAD", raising=False)
    skey = "cols=14336,rows=4096,type=Q6_K"
    table = {"device": "test", "entries": {"qf": {skey: {str(bucket): {"variant": "qf", "config": cfg}}}}}
    (spec,), _ = LS.model_specs((Q8B,))
    plan = Planner(spec, table, hybrid=True, decode="qf")
    down = [w for w in plan.weights() if w.type == "Q6_K" and w.cols == 14336][0]
    for rows, want in [(r, cfg) for r in used] + [(r, None) for r in unused]:
        got = [L.config for L in plan.step(rows, decode=True, sampler="greedy") if L.op == "qf"
               and L.args["weight"] == down.key]
        assert got and all(c == want for c in got), rows
    if ws is not None:   # the built-in configurations at this bucket split no chains
        assert plan.qf_workspace([bucket]) == ws
        assert Planner(spec, {"device": "test", "entries": {}}, hybrid=True, decode="qf").qf_workspace([bucket]) == (0, 0)
    cases = [c for _, L, ctx, _ in LS.table_cases(table) for c in LS.family_module("qf").launch_cases(L, ctx)]
    assert [(c["entry"], c["bucket"]) for c in cases] == [("qf_gemm", bucket)]
    assert all(cases[0]["defines"][k] == v for k, v in cfg.items()) and cases[0]["defines"]["QF_TYPE"] == 14
    assert LS.unexecuted_entries(table, cases) == []
    assert LS.unexecuted_entries(table, [{**cases[0], "defines": {**cases[0]["defines"], "QF_NT": 4}}])


def test_campaign_measures_refuses_and_freezes_a_qf_entry(tmp_path):
    """Through the campaign runner and the real gpu_measure (on the emulator, its launches captured into a graph:
    the split chains' counters must come back to zero after each launch for a replay to pass): a refused
    configuration is a failed, untimed receipt, the others are checked and timed, and freeze makes the fastest a
    table entry of kernel qf the planner reads (the built-in marked as such)."""
    from memra.tune.freeze import freeze
    from memra.tune.measure import gpu_measure, is_builtin
    from memra.tune.receipts import iter_receipts, read_receipts, shape_batch

    g = FakeGpu(1 << 27)
    g.info.l2_bytes = 1 << 19
    speed = {None: 0.05}
    g.time_ms = lambda fn, reps=50, warmup=5: [fn() or speed[None] for _ in range(reps)]
    shape = {"type": "Q4_K", "rows": 64, "cols": 1024}
    split = {"QF_GWARPS": 4, "QF_NT": 2, "QF_STAGES": 2, "QF_KSPLIT": 1, "QF_WSMEM": 1}
    spec = {"name": "t", "batches": [16], "reps": 3, "kernels": [{
        "name": "qf", "variants": ["qf"], "shapes": [shape],
        "configs": [{"QF_NT": 2}, split, {"QF_NT": 8, "QF_GWARPS": 16, "QF_STAGES": 4}]}]}
    out = tmp_path / "r.jsonl"
    measure = gpu_measure(g, seed=0)
    jobs = C.expand_campaign(spec)
    counts = {"measured": 0, "failed": 0, "skipped": 0}
    for j, us in zip(jobs, (0.05, 0.03, 0.05)):   # the split one fastest
        speed[None] = us
        for k, v in C.run_campaign([j], measure, out, context={"device": "emulated", "cc": (9, 0), "sms": 132,
                                                              "nvrtc": "13.0"}).items():
            counts[k] += v
    assert counts == {"measured": 2, "failed": 1, "skipped": 0}
    rows = [r for _, r in iter_receipts(out)]
    bad = [r for r in rows if not r["ok"]]
    assert len(bad) == 1 and "shared memory" in bad[0]["error"]
    assert [is_builtin({**r, "batch": shape_batch(r["shape"])}) for r in rows] == [True, False, False]
    table = freeze(read_receipts(out), "emulated", builtin=is_builtin)
    (entry,) = table["entries"]["qf"][shape_key(shape)].values()
    assert entry["variant"] == "qf" and entry["config"] == split
