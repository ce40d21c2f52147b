"""The kernel families' tune hooks (memra/tune/measure.py's contract) on the CPU emulator.

Each hook's check compares one launch on poisoned outputs with the family's numpy
reference; here the emulator runs the launch contract, so a check must pass, and must FAIL
when the kernel writes nothing (the emulated kernel replaced by a no-op): the poison has to
show. Copies must cover the rotation footprint, every copy must launch, a bad tunable must
be refused with a MemraError (recorded as a failed receipt), and the modules a matvec job
declares for precompilation must be exactly those its launches load.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu, ModuleLog
from memra.tune.campaign import Job
from memra.errors import MemraError
from memra.tune.measure import family_module, precompile

ROTATE = 1 << 20  # 1 MB stands in for 2 x L2

CASES = [  # src, kernel, config, shape, emulated kernel names a no-op must break
    ("act.cu", "act_mul", {"ACT_THREADS": 128}, {"n": 1536, "batch": 2}, ["act_mul"]),
    ("embed.cu", "embed", {"EMBED_THREADS": 512}, {"type": "Q4_K", "n": 512, "batch": 1}, ["embed_q4_k"]),
    ("embed.cu", "embed", {"EMBED_THREADS": 64}, {"type": "Q8_0", "n": 576, "batch": 4}, ["embed_q8_0"]),
    ("sample.cu", "argmax", {"SAMPLE_THREADS": 256}, {"n": 49152, "batch": 1}, ["argmax_final"]),
    ("q8.cu", "quantize_q8", {"Q8_WARPS": 4}, {"n": 2048, "batch": 3}, ["quantize_q8"]),
    ("norm.cu", "rmsnorm", {"NORM_THREADS": 256}, {"n": 4096, "batch": 1}, ["rmsnorm"]),  # split row
    ("norm.cu", "rmsnorm", {"NORM_THREADS": 128}, {"n": 576, "batch": 2}, ["rmsnorm"]),
    ("norm.cu", "add_rmsnorm", {"NORM_THREADS": 512}, {"n": 640, "batch": 3}, ["add_rmsnorm"]),
    ("rope.cu", "rope_norm_kv", {"ROPE_WARPS": 2}, {"n_head": 9, "n_head_kv": 3, "head_dim": 64, "batch": 1},
     ["rope_norm_kv"]),
    ("rope.cu", "rope_norm_kv", {"ROPE_WARPS": 8}, {"n_head": 8, "n_head_kv": 2, "head_dim": 128, "batch": 4},
     ["rope_norm_kv"]),
    ("attention.cu", "attn_decode", {"ATT_WARPS": 4, "ATT_TILE": 32, "hpb": 3},
     {"n_head": 9, "n_head_kv": 3, "head_dim": 64, "ctx": 64, "batch": 1}, ["attn_decode_rope"]),
    ("attention.cu", "attn_decode", {"ATT_WARPS": 8, "ATT_TILE": 64, "ATT_MIN_CHUNK": 32, "hpb": 2},
     {"n_head": 8, "n_head_kv": 2, "head_dim": 128, "ctx": 300, "batch": 2}, ["attn_decode_rope"]),
]


def _case(src, kernel, config, shape, seed=0):
    g = FakeGpu(1 << 26)
    hook = family_module(src).tune_case
    return g, hook(g, kernel, "default", config, dict(shape), np.random.default_rng(seed), ROTATE)


@pytest.mark.parametrize("src,kernel,config,shape,names", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_hook_checks_times_and_rotates(src, kernel, config, shape, names, monkeypatch):
    g, case = _case(src, kernel, config, shape)
    ok, err, detail = case.check()
    assert ok and err is not None and err <= 1e-5, detail
    assert case.bytes > 0
    if kernel != "embed":  # embed rotates over a table larger than ROTATE instead
        assert case.sets * case.bytes >= ROTATE * 0.5
    for i in range(case.sets):
        case.launch(i)
    # a kernel that writes nothing must fail the check (outputs are poisoned first)
    for n in names:
        monkeypatch.setitem(EMU._KERNELS, n, lambda *a: None)
    g2, case2 = _case(src, kernel, config, shape, seed=1)
    ok, _, detail = case2.check()
    assert not ok, f"{kernel}: a kernel that writes nothing passed its check ({detail})"


@pytest.mark.parametrize("src,kernel,config", [
    ("act.cu", "act_mul", {"ACT_THREADS": 100}),
    ("embed.cu", "embed", {"EMBED_THREADS": 2048}),
    ("sample.cu", "argmax", {"SAMPLE_THREADS": 32}),  # fewer threads than partial blocks
    ("q8.cu", "quantize_q8", {"Q8_WARPS": 64}),
])
def test_hook_refuses_bad_tunables(src, kernel, config):
    shape = {"type": "Q4_K", "n": 512, "batch": 1} if kernel == "embed" else {"n": 1024, "batch": 1}
    with pytest.raises(MemraError):
        g, case = _case(src, kernel, config, shape)
        case.check()


def test_hooks_refuse_unknown_kernels_and_variants():
    g = FakeGpu(1 << 20)
    rng = np.random.default_rng(0)
    for src, kernel in (("act.cu", "act_mul"), ("embed.cu", "embed"), ("sample.cu", "argmax"),
                        ("q8.cu", "quantize_q8"), ("norm.cu", "rmsnorm"), ("norm.cu", "add_rmsnorm"),
                        ("rope.cu", "rope_norm_kv"), ("attention.cu", "attn_decode")):
        with pytest.raises(MemraError, match="unknown kernel/variant"):
            family_module(src).tune_case(g, kernel, "fast", {}, {"n": 64, "type": "Q4_K"}, rng, ROTATE)
        with pytest.raises(MemraError, match="unknown kernel/variant"):
            family_module(src).tune_case(g, "nosuch", "default", {}, {"n": 64, "type": "Q4_K"}, rng, ROTATE)


HEADS = {"n_head": 8, "n_head_kv": 2, "head_dim": 128, "batch": 1}


@pytest.mark.parametrize("src,kernel,config,shape", [
    ("norm.cu", "rmsnorm", {"NORM_THREADS": 100}, {"n": 1024, "batch": 1}),   # not a multiple of 32
    ("norm.cu", "rmsnorm", {"NORM_THREADS": 64}, {"n": 4096, "batch": 1}),    # 16 float4s a thread > 8
    ("norm.cu", "add_rmsnorm", {"NORM_THREADS": 2048}, {"n": 1024, "batch": 1}),
    ("rope.cu", "rope_norm_kv", {"ROPE_WARPS": 64}, HEADS),
    ("attention.cu", "attn_decode", {"hpb": 3}, {**HEADS, "ctx": 64}),        # 3 does not divide 4
    ("attention.cu", "attn_decode", {"ATT_WARPS": 0}, {**HEADS, "ctx": 64}),
    ("attention.cu", "attn_decode", {"ATT_WARPS": 1}, {**HEADS, "head_dim": 512, "ctx": 64}),  # > 8 * 32 values
    ("norm.cu", "rmsnorm", {"NORM_PDL_TRIGGER": 3}, {"n": 576, "batch": 1}),  # 0, 1 or 2
    ("norm.cu", "add_rmsnorm", {"NORM_PDL_TRIGGER": "2"}, {"n": 640, "batch": 1}),
    ("q8.cu", "quantize_q8", {"Q8_PDL_TRIGGER": -1}, {"n": 1536, "batch": 1}),
])
def test_new_hooks_refuse_bad_tunables(src, kernel, config, shape):
    with pytest.raises(MemraError):
        g, case = _case(src, kernel, config, shape)
        case.check()


@pytest.mark.parametrize("n,split,threads,want", [
    # (threads, NORM_MAXV, blocks per row) by the rule in kernels/norm.cu's launch contract
    (4096, True, None, (256, 4, 4)),     # built-in: n/1024 blocks of 256
    (576, True, None, (160, 1, 1)),
    (4096, True, 512, (512, 2, 2)),      # 512 * 2 * 4 == 4096: split over 2 blocks
    (4096, True, 1024, (1024, 1, 1)),
    (6000, True, 256, (256, 6, 1)),      # 256 * 6 * 4 != 6000: one block per row
    (4096, False, 256, (256, 4, 1)),     # add_rmsnorm never splits
    (640, True, 32, (32, 5, 5)),
])
def test_norm_launch_config(n, split, threads, want):
    from memra.gpu.ops.norm import launch_config

    assert launch_config(n, split, {"NORM_THREADS": threads} if threads else None) == want


def test_hooks_launch_the_tuned_configuration():
    """The launch each hook times is the configuration asked for (defines, grid, block)."""
    g = ModuleLog()
    rng = np.random.default_rng(0)
    launched = []
    real = g.launch
    g.launch = lambda k, grid, block, args, **kw: launched.append((k.name, k.defines, tuple(grid), tuple(block))) \
        or real(k, grid, block, args, **kw)
    family_module("norm.cu").tune_case(g, "rmsnorm", "default", {"NORM_THREADS": 512}, {"n": 4096, "batch": 3},
                                       rng, ROTATE).launch(0)
    family_module("rope.cu").tune_case(g, "rope_norm_kv", "default", {"ROPE_WARPS": 2},
                                       {"n_head": 9, "n_head_kv": 3, "head_dim": 64, "batch": 2}, rng, ROTATE).launch(0)
    family_module("attention.cu").tune_case(g, "attn_decode", "default", {"ATT_TILE": 32, "hpb": 3},
                                            {"n_head": 9, "n_head_kv": 3, "head_dim": 64, "ctx": 64, "batch": 1},
                                            rng, ROTATE).launch(0)
    (n1, d1, g1, b1), (n2, d2, g2, b2), (n3, d3, g3, b3) = launched
    assert (n1, d1["NORM_THREADS"], d1["NORM_MAXV"], g1, b1) == ("rmsnorm", 512, 2, (3, 2), (512,))
    assert (n2, d2["ROPE_WARPS"], g2, b2) == ("rope_norm_kv", 2, (8, 2), (64,))  # ceil(15 heads / 2)
    from memra.gpu.ops.attention import default_splits

    # 9 heads / 3 per block = 3 blocks; splits as the engine picks them for 3 blocks
    assert (n3, d3["N_GQA"], d3["ATT_TILE"], g3[0], g3[1]) == ("attn_decode_rope", 3, 32, 3, default_splits(3, 132))


def test_pdl_trigger_tunables_reach_the_launch():
    """NORM_PDL_TRIGGER / Q8_PDL_TRIGGER in a configuration (a table entry's, an engine choice's) are defines of the
    module the engine launches and the launch set names (session 47's first landing dropped both: the A/B measured
    the built-in trigger); without them the module is the one it always was."""
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops import norm as N
    from memra.gpu.plan import Launch

    g = ModuleLog()
    launched = []
    real = g.launch
    g.launch = lambda k, grid, block, args, **kw: launched.append((k.name, dict(k.defines))) or real(k, grid, block,
                                                                                                      args, **kw)
    rng = np.random.default_rng(0)
    for cfg in ({"NORM_THREADS": 256, "NORM_PDL_TRIGGER": 2}, {"NORM_THREADS": 256}):
        for kernel in ("rmsnorm", "add_rmsnorm"):
            N.tune_case(g, kernel, "default", cfg, {"n": 576, "batch": 1}, rng, ROTATE).launch(0)
    for cfg in ({"Q8_WARPS": 8, "Q8_PDL_TRIGGER": 2}, {"Q8_WARPS": 8}, {"Q8_PDL_TRIGGER": 0}):
        family_module("q8.cu").tune_case(g, "quantize_q8", "default", cfg, {"n": 1536, "batch": 1}, rng,
                                         ROTATE).launch(0)
    assert [d.get("NORM_PDL_TRIGGER", d.get("Q8_PDL_TRIGGER")) for _, d in launched] == [2, 2, None, None, 2, None, 0]
    assert launched[5][1] == {"Q8_WARPS": 8}
    L = Launch(name="ffn_q8", op="quantize", kernel="quantize_q8", variant="default", shape={"n": 1536}, rows=1,
               config={"Q8_WARPS": 8, "Q8_PDL_TRIGGER": 2}, args={})
    assert MV.launch_cases(L, None)[0]["defines"] == {"Q8_WARPS": 8, "Q8_PDL_TRIGGER": 2}


def test_attention_tune_case_takes_a_plans_split_count():
    """A config's `splits` (the table entry's, measured at depth) launches the grid the runner would: the plan's
    count trimmed to the context (splits_for), not default_splits; a bad one is refused."""
    from memra.errors import MemraError
    from memra.gpu.ops.attention import splits_for

    g = ModuleLog()
    launched = []
    real = g.launch
    g.launch = lambda k, grid, block, args, **kw: launched.append(tuple(grid)) or real(k, grid, block, args, **kw)
    shape = {"n_head": 9, "n_head_kv": 3, "head_dim": 64, "batch": 1}
    for ctx, splits in ((4096, 16), (4096, 64), (1024, 16), (64, 16)):
        family_module("attention.cu").tune_case(g, "attn_decode", "default", {"ATT_TILE": 64, "hpb": 1, "splits": splits},
                                                {**shape, "ctx": ctx}, np.random.default_rng(0), ROTATE).launch(0)
        assert launched[-1][1] == splits_for(ctx, splits, 64, {"ATT_TILE": 64})
    assert [y for _, y, _ in launched] == [16, 32, 8, 1]
    for bad in (0, 257, "16"):
        with pytest.raises(MemraError, match="splits must be an integer"):
            family_module("attention.cu").tune_case(g, "attn_decode", "default", {"splits": bad}, {**shape, "ctx": 64},
                                                    np.random.default_rng(0), ROTATE)


@pytest.mark.parametrize("kernel,variant,config,shape", [
    ("matvec", "q8", {"MV_NWARPS": 8, "MV_ROWS": 1}, {"type": "Q4_K", "rows": 96, "cols": 512, "batch": 1}),
    ("matvec_glu", "q8", {"MV_UNROLL": 2}, {"type": "Q6_K", "rows": 128, "cols": 256, "batch": 3}),
    ("matvec", "f32", {"MV_NWARPS": 2}, {"type": "Q4_0", "rows": 64, "cols": 256, "batch": 1}),
])
def test_matvec_tune_modules_are_what_the_job_loads(kernel, variant, config, shape):
    from memra.gpu.ops import matvec as MV

    g = ModuleLog()
    case = MV.tune_case(g, kernel, variant, config, dict(shape), np.random.default_rng(0), ROTATE)
    ok, err, detail = case.check()
    assert ok, detail
    case.launch(case.sets - 1)
    declared = {(f, tuple(sorted((k, str(v)) for k, v in d.items())))
                for f, d in MV.tune_modules(kernel, variant, config, shape)}
    assert g.loaded <= declared and any(f == MV.KERNEL_FILE for f, _ in g.loaded)
    assert {f for f, _ in declared if f == MV.KERNEL_FILE} and len(
        [d for d in declared if d[0] == MV.KERNEL_FILE]) == 1


@pytest.mark.parametrize("kernel,config,n", [("rmsnorm", {"NORM_THREADS": 256}, 576), ("rmsnorm", {}, 4096),
                                              ("rmsnorm", {"NORM_THREADS": 256, "NORM_PDL_TRIGGER": 2}, 576),
                                              ("rmsnorm", {"NORM_THREADS": 128}, 4096), ("add_rmsnorm", {}, 640)])
def test_norm_tune_modules_are_what_the_job_loads(kernel, config, n):
    """norm's hook names the one module its tune job launches: `memra tune carry` compiles exactly these from two
    trees to carry norm.cu receipts across an edit that leaves their code the same."""
    from memra.gpu.ops import norm as N

    g = ModuleLog()
    case = N.tune_case(g, kernel, "default", config, {"n": n, "batch": 2}, np.random.default_rng(0), ROTATE)
    ok, err, detail = case.check()
    assert ok, detail
    case.launch(case.sets - 1)
    declared = {(f, tuple(sorted((k, str(v)) for k, v in d.items())))
                for f, d in N.tune_modules(kernel, "default", config, {"n": n, "batch": 2})}
    assert g.loaded == declared and len(declared) == 1


def test_precompile_builds_the_modules_and_counts_failures(monkeypatch):
    import memra.gpu.compile as CMP

    compiled = []

    def fake_many(work, workers=None):  # NVRTC itself is tested in test_compile.py
        for f, arch, d in work:
            compiled.append((f, arch, d))
            bad = f == "matvec.cu" and d["MV_NWARPS"] % d["MV_KSPLIT"]
            yield (f, arch, d), ("MV_KSPLIT must divide MV_NWARPS" if bad else None), 0.1

    monkeypatch.setattr(CMP, "compile_many", fake_many)
    shape = {"type": "Q4_K", "rows": 4096, "cols": 4096, "batch": 1}
    jobs = [Job("matvec", "q8", {"MV_NWARPS": w, "MV_KSPLIT": k}, shape, "matvec.cu")
            for w in (2, 4) for k in (1, 3)]
    jobs.append(Job("matvec", "q8", {"MV_NWARPS": 2, "MV_KSPLIT": 1}, {**shape, "batch": 2}, "matvec.cu"))
    jobs.append(Job("act_mul", "default", {"ACT_THREADS": 256}, {"n": 512, "batch": 1}, "act.cu"))  # no hook
    jobs.append(Job("matvec", "q8", {}, {"type": "Q6_K", "rows": 4096, "cols": 4096, "batch": 1}, "matvec.cu"))
    n, failed = precompile(jobs, "sm_90a", workers=1)
    mv = [d for f, _, d in compiled if f == "matvec.cu"]
    # 4 (nwarps x ksplit) at MV_B 1, one at MV_B 4 (batch 2), the Q6_K default; q8.cu once
    assert len(mv) == 6 and n == 7 and failed == 2
    assert sum(1 for f, _, _ in compiled if f == "q8.cu") == 1
    assert {d["MV_B"] for d in mv} == {1, 4}
    assert all(a == "sm_90a" for _, a, _ in compiled)
