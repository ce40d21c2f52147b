"""The skinny tensor-core matvec (kernels/mvt.cu, memra/gpu/ops/mvt.py) in the engine, on the CPU:
the plan picks it at 2..15 rows on the q8 path (1 row: mv_q8, 16 and more: the GEMM, MEMRA_MVT=0
or the f32 path: mv_q8 chunks), the launcher keeps mvt.cu's launch contract (the emulator's
geometry check), its checks pass on the emulator, its tune hooks refuse what the kernel cannot
run, and the emulated runner's tokens and logits are the same with and without it. Its bits
against mv_q8 are the device's business (memra kernel-check: mvt's checks and canary)."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu
from memra.errors import CudaError, MemraError
from memra.gpu.ops import gemm as GEMM
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import mvt as MVT
from memra.gpu.plan import Planner
from memra.gpu.q8 import Q8_SCALE
from memra.gpu.runner import Row, Runner, Sampling
from memra.tune.campaign import model_info

MATVEC_OPS = ("matvec", "gemm", "mvt")


def _mv_launches(plan, rows, decode=True):
    return [L for L in plan.step(rows, decode=decode) if L.op in MATVEC_OPS]


@pytest.mark.parametrize("model", ["synth:llama3-8b:Q4_K_M", "synth:tiny-gemma3:Q4_K_M", "synth:tiny-qwen2:Q8_0"])
def test_plan_picks_mvt_from_3_to_15_rows(model):
    plan = Planner(model_info(model))
    assert MVT.MVT_MIN_ROWS == 3
    for rows in range(1, 18):
        for decode in (True, False):
            ls = _mv_launches(plan, rows, decode)
            ops = {L.op for L in ls}
            if rows < MVT.MVT_MIN_ROWS:
                assert ops == {"matvec"}
            elif rows < GEMM.GEMM_MIN_ROWS:
                assert ops == {"mvt"}, (rows, ops)
                assert all(L.rows == rows and L.args["row0"] == 0 for L in ls)
                assert {L.kernel for L in ls} <= {"mvt", "mvt_glu"}
                assert all(L.kernel == ("mvt_glu" if L.args["glu"] else "mvt") for L in ls)
            else:
                assert ops == {"gemm"}, (rows, ops)


def test_mvt_rollback_and_f32_path_run_the_matvec():
    spec = model_info("synth:tiny-llama:Q4_K_M")
    for plan in (Planner(spec, mvt=False), Planner(spec, path="f32")):
        for rows in range(2, 16):
            ls = _mv_launches(plan, rows)
            assert {L.op for L in ls} == {"matvec"}
            assert max(L.rows for L in ls) <= 8
    # MEMRA_GEMM=0 alone: mvt below 16 rows, 8-row matvec chunks from there
    plan = Planner(spec, gemm=False)
    assert {L.op for L in _mv_launches(plan, 12)} == {"mvt"}
    assert {L.op for L in _mv_launches(plan, 16)} == {"matvec"}


def test_mvt_takes_the_tables_mvt_entries():
    """A table entry for kernel mvt at the launch's batch bucket reaches the launch's config
    (and the module launch_cases builds); entries of other buckets do not."""
    from memra.tune import tables as TABLES

    spec = model_info("synth:tiny-llama:Q4_K_M")
    plan = Planner(spec)
    L = next(L for L in _mv_launches(plan, 4) if L.kernel == "mvt")
    from memra.tune.receipts import shape_key

    key = shape_key(L.shape)
    entry = {"variant": "q8", "config": {"MVT_WK": 4, "MVT_MINB": 4}, "src": "mvt.cu", "src_hash": "x"}
    table = {"device": "test", "entries": {"mvt": {key: {str(TABLES.batch_bucket(4)): entry}}}}
    plan = Planner(spec, table)
    L4 = next(L for L in _mv_launches(plan, 4) if L.kernel == "mvt" and shape_key(L.shape) == key)
    assert L4.config == {"MVT_WK": 4, "MVT_MINB": 4}
    c, = MVT.launch_cases(L4, None)
    assert c["defines"]["MVT_WK"] == 4 and c["defines"]["MVT_MINB"] == 4 and c["defines"]["MVT_TN"] == 1
    L12 = next(L for L in _mv_launches(plan, 12) if L.kernel == "mvt" and shape_key(L.shape) == key)
    assert L12.config is None


def _mvt_run(g, t=12, nb=5, glu=None, N=203, K=512, config=None):
    rng = np.random.default_rng(1)
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    w = MV.upload_weight(g, raw, t)
    x = rng.standard_normal((nb, K)).astype(np.float32)
    xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
    y = g.empty((nb, N), np.float32)
    y.poison()
    MVT.mvt(g, w, y, xq=xq, xs=xs, nb=nb, glu=glu, config=config)
    ym = g.empty((nb, N), np.float32)
    MV.matvec(g, w, ym, xq=xq, xs=xs, nb=nb, glu=glu)
    return y.numpy(), ym.numpy()


L1 = {"MVT_LAYOUT": 1}  # mvt.cu's shared-memory stages (variant 6)


@pytest.mark.parametrize("nb,glu,config", [(2, None, None), (8, "silu", None), (9, None, None), (15, "gelu", None),
                                           (13, None, {"MVT_WM": 4, "MVT_WK": 1, "MVT_TN": 2}),
                                           (3, "silu", {"MVT_WM": 2, "MVT_WK": 4}),
                                           (5, None, L1), (12, "silu", {**L1, "MVT_TN": 1}),
                                           (15, None, {**L1, "MVT_WK": 16, "MVT_TN": 2, "MVT_MINB": 1, "MVT_STAGES": 4}),
                                           (7, "gelu", {**L1, "MVT_WK": 4, "MVT_WM": 2, "MVT_UPW": 2, "MVT_STAGES": 2}),
                                           (8, "silu", {"MVT_SB": 1}), (3, None, {"MVT_SB": 1, "MVT_KPERM": 0}),
                                           (12, "gelu", {"MVT_SB": 1, "MVT_TN": 2, "MVT_MINB": 1})])
def test_mvt_geometry_passes_as_launched(nb, glu, config):
    got, ref = _mvt_run(FakeGpu(1 << 24), nb=nb, glu=glu, config=config)
    assert np.all(np.isfinite(got)) and np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_tail_dropping_mvt_grid_is_caught(monkeypatch):
    real = MVT.launch_shape

    def floor_rows(t, cfg, N, nb, glu):
        (gx, gy), block, smem = real(t, cfg, N, nb, glu)
        return (N // (16 * cfg["MVT_WM"]), gy), block, smem

    monkeypatch.setattr(MVT, "launch_shape", floor_rows)
    with pytest.raises(CudaError, match=r"mvt_q8 grid .* 11 of 203 elements of y's rows .* written by no block"):
        _mvt_run(FakeGpu(1 << 24))

    def one_tile_of_columns(t, cfg, N, nb, glu):
        (gx, gy), block, smem = real(t, cfg, N, nb, glu)
        return (gx, 1), block, smem

    monkeypatch.setattr(MVT, "launch_shape", one_tile_of_columns)
    with pytest.raises(CudaError, match="batch columns .* written by no block"):
        _mvt_run(FakeGpu(1 << 24), nb=12, config={"MVT_TN": 1})


def test_mvt_block_follows_the_module(monkeypatch):
    real = MVT.launch_shape
    monkeypatch.setattr(MVT, "launch_shape", lambda t, cfg, N, nb, glu: (real(t, cfg, N, nb, glu)[0], (256,), 0))
    with pytest.raises(CudaError, match=r"the block must be \(128,\)"):
        _mvt_run(FakeGpu(1 << 24), config={"MVT_WK": 4})


def test_mvt_layout1_shared_memory_follows_the_module(monkeypatch):
    """Layout 1's dynamic shared memory is mvt.cu's stage formula (smem_bytes; the kernel asserts
    the launcher's value at compile time, MVT_EXPECT_SMEM); the emulator refuses another size."""
    cfg = MVT.launch_config(8, {**L1, "MVT_UPW": 2})
    assert cfg["MVT_LAYOUT"] == 1 and cfg["MVT_STAGES"] == 3 and not {"MVT_PREFETCH", "MVT_KPERM"} & set(cfg)
    # Q4_K, TN 1, WK 8, UPW 2: 16 units a stage of 16 rows (512 + 16 bulk, 80 meta bytes) and 8
    # columns (1024 + 16 activation, 256 scale bytes)
    assert MVT.smem_bytes(12, cfg) == 3 * (16 * 528 + 16 * 80 + 8 * 1040 + 8 * 256) > 48 * 1024
    assert MVT.launch_shape(12, cfg, 203, 8, False)[2] == MVT.smem_bytes(12, cfg)
    assert MVT._defines(12, cfg)["MVT_EXPECT_SMEM"] == MVT.smem_bytes(12, cfg)
    assert "MVT_EXPECT_SMEM" not in MVT._defines(12, MVT.default_config(8))
    real = MVT.launch_shape
    monkeypatch.setattr(MVT, "launch_shape", lambda t, c, N, nb, glu: real(t, c, N, nb, glu)[:2] + (0,))
    with pytest.raises(CudaError, match="dynamic shared memory, the kernel addresses"):
        _mvt_run(FakeGpu(1 << 24), nb=8, config=cfg)


def test_mvt_layout_keeps_only_its_tunables():
    """launch_config drops the other layout's tunables: layout 0's modules keep the defines they
    always had (an explicit MVT_LAYOUT 0 is the built-in), layout 1's carry MVT_UPW / MVT_STAGES."""
    for nb in (4, 12):
        assert MVT.launch_config(nb, {"MVT_LAYOUT": 0, "MVT_UPW": 2, "MVT_STAGES": 4}) == MVT.default_config(nb)
        c = MVT.launch_config(nb, {"MVT_LAYOUT": 1, "MVT_WK": 4})
        assert c == {"MVT_LAYOUT": 1, "MVT_UPW": 1, "MVT_STAGES": 3, "MVT_TN": 1 if nb <= 8 else 2, "MVT_WK": 4,
                     "MVT_WM": 1, "MVT_MINB": 2}
    shape = {"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": 8}
    assert MVT.is_builtin("mvt", "q8", {"MVT_LAYOUT": 0}, shape)
    assert not MVT.is_builtin("mvt", "q8", L1, shape)


def test_mvt_checks_run_on_the_emulator():
    g = FakeGpu(1 << 28)
    outs = list(MVT.checks(g, np.random.default_rng(0)))
    assert len(outs) >= 9 * 7 and all(o.ok for o in outs), [o for o in outs if not o.ok][:3]
    assert len(list(MVT.compile_variants())) == 9 * 7 + 2 * 3 + 3
    layouts = [d.get("MVT_LAYOUT", 0) for _, d in MVT.compile_variants()]
    assert layouts.count(1) == 9 * 3 + 1  # layout 1: three check configurations a type and a canary
    sb = [d for _, d in MVT.compile_variants() if d.get("MVT_SB")]
    assert sorted(d["MV_TYPE"] for d in sb) == [12] * 4 + [13] * 3  # variant 7: Q4_K / Q5_K, Q4_K's canary
    assert sum("MEMRA_CANARY" in d for _, d in MVT.compile_variants()) == 3
    # per type 5 built-in + 5 check-configuration + 1 layout-1 case, the 8B shapes' 4, variant 7's 4 a
    # K-quant type and 2 at the 8B gate+up's K
    assert len(outs) == 9 * 11 + 4 + 2 * 4 + 2


def test_mvt_sb_is_a_k_quant_layout0_tunable():
    """MVT_SB (variant 7) is read by layout 0 for Q4_K / Q5_K only: 0 is the built-in (left out of
    the launch configuration), layout 1 drops it, and the other types' modules are the ones
    without it (mvt.cu ignores it there) so a campaign's SB jobs reuse them."""
    shape = {"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": 8}
    assert MVT.launch_config(8, {"MVT_SB": 0}) == MVT.default_config(8)
    assert MVT.is_builtin("mvt", "q8", {"MVT_SB": 0}, shape)
    assert not MVT.is_builtin("mvt", "q8", {"MVT_SB": 1}, shape)
    assert "MVT_SB" not in MVT.launch_config(8, {**L1, "MVT_SB": 1})
    sb = {"MVT_SB": 1}
    (_, d12), = MVT.tune_modules("mvt", "q8", sb, shape)
    (_, d13), = MVT.tune_modules("mvt", "q8", sb, {**shape, "type": "Q5_K"})
    (_, d14), = MVT.tune_modules("mvt", "q8", sb, {**shape, "type": "Q6_K"})
    (_, d14b), = MVT.tune_modules("mvt", "q8", {}, {**shape, "type": "Q6_K"})
    assert d12["MVT_SB"] == 1 and d13["MVT_SB"] == 1 and d14 == d14b
    # the other types take any WK with it (ignored)
    MVT.tune_modules("mvt", "q8", {"MVT_SB": 1, "MVT_WK": 4}, {**shape, "type": "Q8_0"})


def test_mvt_tune_hooks_refuse_what_the_kernel_cannot_run():
    shape = {"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": 8}
    assert MVT.is_builtin("mvt", "q8", {}, shape)
    assert MVT.is_builtin("mvt", "q8", {"MVT_TN": 1}, shape)
    assert not MVT.is_builtin("mvt", "q8", {"MVT_TN": 2}, shape)
    assert MVT.is_builtin("mvt", "q8", {"MVT_TN": 2}, {**shape, "batch": 12})  # the two-tile bucket
    (f, d), = MVT.tune_modules("mvt_glu", "q8", {"MVT_WK": 16, "MVT_MINB": 1}, {**shape, "rows": 8192})
    assert f == "mvt.cu" and d["MV_TYPE"] == 12 and d["MVT_WK"] == 16
    for kernel, variant, cfg, sh, msg in (
            ("mvt", "f32", {}, shape, "unknown kernel/variant"),
            ("mvt", "q8", {"GM_WK": 8}, shape, "unknown tunables"),
            ("mvt", "q8", {"MVT_WK": 3}, shape, "bad configuration"),
            ("mvt", "q8", {"MVT_WK": 16, "MVT_WM": 4}, shape, "bad configuration"),  # 2048 threads
            ("mvt", "q8", {"MVT_WK": 16, "MVT_WM": 2, "MVT_MINB": 3}, shape, "bad configuration"),  # 3 x 1024 an SM
            ("mvt", "q8", {"MVT_LAYOUT": 2}, shape, "bad configuration"),
            ("mvt", "q8", {**L1, "MVT_WK": 2}, shape, "bad configuration"),  # layout 1: WK 4, 8, 16
            ("mvt", "q8", {**L1, "MVT_UPW": 3}, shape, "bad configuration"),
            ("mvt", "q8", {**L1, "MVT_STAGES": 1}, shape, "bad configuration"),
            ("mvt", "q8", {**L1, "MVT_WK": 16, "MVT_UPW": 4, "MVT_MINB": 1}, shape, "shared memory"),  # > 227 KiB
            ("mvt", "q8", {"MVT_SB": 2}, shape, "bad configuration"),
            ("mvt", "q8", {"MVT_SB": 1, "MVT_WK": 4}, shape, "MVT_WK 8"),  # warp k owns slots 4k .. 4k + 3
            ("mvt", "q8", {"MVT_SB": 1, "MVT_TN": 2, "MVT_WM": 2}, shape, "MVT_TN x MVT_WM"),
            ("mvt", "q8", {}, {**shape, "type": "F16"}, "no tensor-core kernel"),
            ("mvt_glu", "q8", {}, {**shape, "rows": 4095}, "even row count")):
        with pytest.raises(MemraError, match=msg):
            MVT.tune_modules(kernel, variant, cfg, sh)


class _Files(FakeGpu):
    def __init__(self, heap):
        super().__init__(heap)
        self.files = set()

    def module(self, kernel_file, defines=None):
        self.files.add(kernel_file)
        return super().module(kernel_file, defines)


def _generate(path, mvt: bool):
    """5 sequences: a prefill step of 5 short prompts (15 rows: mvt), 6 greedy decode steps
    (the 8-row graph), then a 3-token verification-like step of one sequence (eager, 3 rows)."""
    g = _Files(1 << 28)
    r = Runner(path, gpu=g, max_len=64, max_seqs=8, mvt=mvt)
    seqs = [r.open() for _ in range(5)]
    prompts = [[1, 17 + i, 2398] for i in range(5)]
    out = r.step([Row(s, p, sample=Sampling(0.0)) for s, p in zip(seqs, prompts)])
    toks = [[o.token] for o in out]
    for _ in range(6):
        out = r.step([Row(s, [t[-1]], sample=Sampling(0.0), logits="last") for s, t in zip(seqs, toks)])
        for t, o in zip(toks, out):
            t.append(o.token)
    last = out[0].logits.copy()
    ver = r.step([Row(seqs[1], [5, 6, 7], logits="all")])[0].logits.copy()
    return toks, last, ver, g.files


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("qwen2", "Q8_0"), ("gemma3", "Q4_K_M")])
def test_emulated_runner_tokens_unchanged_by_mvt(tiny_models, arch, quant):
    path = tiny_models(arch, quant)
    a_toks, a_last, a_ver, a_files = _generate(path, mvt=True)
    b_toks, b_last, b_ver, b_files = _generate(path, mvt=False)
    assert "mvt.cu" in a_files and "mvt.cu" not in b_files
    assert a_toks == b_toks
    assert np.array_equal(a_last.view(np.uint32), b_last.view(np.uint32))
    assert np.array_equal(a_ver.view(np.uint32), b_ver.view(np.uint32))


def test_memra_mvt_env_is_the_rollback_seam(tiny_models, monkeypatch):
    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.setenv("MEMRA_MVT", "0")
    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=32, max_seqs=4)
    assert not r.plan.use_mvt
    monkeypatch.setenv("MEMRA_MVT", "1")
    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=32, max_seqs=4)
    assert r.plan.use_mvt and any(L.op == "mvt" for L in r.plan.step(4, decode=True))


def test_emulator_models_mvt_geometry_from_its_defines():
    """check_geometry reads MVT_TN / MVT_WK / MVT_WM from the module, not from the launcher."""
    g = FakeGpu(1 << 24)
    k = g.module("mvt.cu", {"MV_TYPE": 12, "MVT_TN": 1, "MVT_WK": 8, "MVT_WM": 1}).kernel("mvt_q8")
    v = [0] * 6 + [203, 512, 9, 0]
    EMU.check_geometry(k, (13, 2), (256,), 0, v)
    with pytest.raises(CudaError, match="batch columns"):
        EMU.check_geometry(k, (13, 1), (256,), 0, v)
    with pytest.raises(CudaError, match="dynamic shared memory"):
        EMU.check_geometry(k, (13, 2), (256,), 16, v)


# -- the tune hook on the emulator (memra/tune/measure.py's contract, as tests/test_tune_gemm.py)

ROTATE = 1 << 20
TUNE_CASES = [  # kernel, config, shape
    ("mvt", {}, {"type": "Q6_K", "rows": 96, "cols": 512, "batch": 8}),
    ("mvt_glu", {"MVT_WK": 4, "MVT_WM": 2}, {"type": "Q4_K", "rows": 256, "cols": 512, "batch": 12}),
    ("mvt", {"MVT_TN": 1, "MVT_WK": 16, "MVT_MINB": 1}, {"type": "Q8_0", "rows": 130, "cols": 256, "batch": 15}),
    ("mvt", {"MVT_LAYOUT": 1, "MVT_WK": 4, "MVT_MINB": 4}, {"type": "Q6_K", "rows": 96, "cols": 768, "batch": 4}),
    ("mvt_glu", {"MVT_LAYOUT": 1, "MVT_UPW": 2}, {"type": "Q4_0", "rows": 64, "cols": 512, "batch": 8}),
]


def _tune_case(kernel, config, shape, seed=0):
    g = FakeGpu(1 << 26)
    return g, MVT.tune_case(g, kernel, "q8", dict(config), dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("kernel,config,shape", TUNE_CASES, ids=[f"{c[0]}-b{c[2]['batch']}" for c in TUNE_CASES])
def test_mvt_hook_checks_rotates_and_launches(kernel, config, shape):
    g, case = _tune_case(kernel, config, shape)
    ok, err, detail = case.check()
    assert ok and err is not None and err <= 1e-5 and "matvec bit for bit" in detail, detail
    n = g.launches
    for i in range(case.sets):
        case.launch(i)  # the emulator checks each launch's grid and block against mvt.cu's contract
    assert g.launches == n + case.sets


def test_mvt_hook_check_fails_one_ulp_off_the_matvec(monkeypatch):
    real = MVT.mvt

    def off_by_one_ulp(g, w, y, **kw):
        real(g, w, y, **kw)
        a = y.numpy().copy()
        a.view(np.uint32).ravel()[5] ^= 1
        y.upload(a)

    _, case = _tune_case(*TUNE_CASES[0], seed=4)
    assert case.check()[0]
    monkeypatch.setattr(MVT, "mvt", off_by_one_ulp)
    ok, err, detail = case.check()
    assert not ok and "1 of" in detail and "matvec's bits" in detail, detail


def test_mvt_campaign_jobs_are_the_plans_mvt_launches():
    """A campaign of kernel mvt / mvt_glu takes its (shape, batch) pairs from the plan's steps:
    batches 3..15 only (1, 2 rows: the matvec, 16: the GEMM)."""
    from memra.tune import campaign as C

    spec = {"name": "m", "batches": [1, 2, 3, 8, 12, 16], "kernels": [
        {"name": "mvt", "variants": ["q8"], "ops": ["qkv", "attn_output", "down", "output"], "src": "mvt.cu"},
        {"name": "mvt_glu", "variants": ["q8"], "ops": ["gate_up"], "src": "mvt.cu"}]}
    jobs = C.expand_campaign(spec, [model_info("synth:tiny-llama:Q4_K_M")])
    assert jobs and {j.shape["batch"] for j in jobs} == {3, 8, 12}
    assert {j.kernel for j in jobs} == {"mvt", "mvt_glu"} and all(j.src == "mvt.cu" for j in jobs)
