"""kernels/gemm_f16.cu and its family module (memra.gpu.ops.gemm_f16) on the CPU: the host contract
(shapes, types and configurations it refuses, the launch geometry), NVRTC compiles of every type it
supports, and the kernel's index math replayed lane by lane (experiments/gemm_f16/index_check.py,
tied to the kernel's source lines)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.errors import MemraError
from memra.gpu.ops import gemm_f16 as GF
from memra.gpu.ops import matvec as MV

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "kernels" / "gemm_f16.cu"
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, IQ4_XS = 2, 3, 8, 12, 14, 23


# -- the host contract ------------------------------------------------------------------------

def test_the_built_in_configurations_by_the_weight():
    """gemm_f16_wg.cu's by the weight's rows (WG_BN 128 below 6,144 rows, 256 from there), never by
    the row count; gemm_f16.cu's for a GF_* configuration."""
    c = GF.default_config(Q4_K, rows=4096)
    assert c == {"WG_BN": 128} and GF.kernel_file(c) == "gemm_f16_wg.cu"
    assert GF.tile(c) == (128, 128, 384) and GF.smem_bytes(c) == 4 * 256 * 128 + 1024 + 64
    wide = GF.default_config(Q4_K, rows=6144)
    assert wide == {"WG_BN": 256, "WG_INFLIGHT": 0} and GF.default_config(Q4_K, rows=28672) == wide
    assert GF.tile(wide) == (128, 256, 384) and GF.smem_bytes(wide) == 4 * 384 * 128 + 1024 + 64
    assert GF.tile(GF.launch_config(Q4_K, 512, {"WG_MT": 2}, 4096)) == (256, 128, 384)
    for rows in (256, 4096, 28672):   # the row count never enters
        assert GF.default_config(Q4_K, 1, rows) == GF.default_config(Q4_K, 512, rows)
    mma = GF.launch_config(Q4_K, 512, GF.MMA, 28672)
    assert mma == {"GF_WM": 2, "GF_WN": 4, "GF_TM": 4, "GF_TN": 4} and GF.kernel_file(mma) == "gemm_f16.cu"
    assert GF.tile(mma) == (128, 128, 256) and GF.smem_bytes(mma) == 2 * 256 * 272
    wide_mma = GF.launch_config(Q4_K, 512, GF.WIDE)
    assert GF.tile(wide_mma) == (256, 128, 256) and GF.smem_bytes(wide_mma) == 2 * 384 * 272
    # a launch's tunables other than GF_* / WG_* are not the family's
    assert GF.launch_config(Q4_K, 16, {"GT_WM": 4, "GF_TN": 2}) == {**GF.MMA, "GF_TN": 2}
    assert GF.launch_config(Q4_K, 16, {"GT_WM": 4}, 4096) == {"WG_BN": 128}


_SMEM_WG, _SMEM_WG_WIDE = 4 * 256 * 128 + 1088, 4 * 384 * 128 + 1088


@pytest.mark.parametrize("t,glu,N,K,nb,config,want", [
    (Q4_K, False, 4096, 4096, 512, None, ((4, 32, 1), (384, 1, 1), _SMEM_WG)),
    (Q4_K, True, 14336, 4096, 130, None, ((1, 224, 1), (384, 1, 1), _SMEM_WG_WIDE)),  # glu: 64 outputs a block
    (Q4_K, False, 6144, 4096, 513, None, ((3, 48, 1), (384, 1, 1), _SMEM_WG_WIDE)),
    (Q6_K, False, 4096, 14336, 1, None, ((1, 32, 1), (384, 1, 1), _SMEM_WG)),
    (Q4_0, False, 128, 128, 129, None, ((2, 1, 1), (384, 1, 1), _SMEM_WG)),
    (Q4_K, True, 14336, 4096, 130, {"GF_TN": 4}, ((2, 224, 1), (256, 1, 1), 139264)),
    (Q4_0, False, 128, 128, 129, GF.MMA, ((2, 1, 1), (256, 1, 1), 139264)),
])
def test_launch_shape(t, glu, N, K, nb, config, want):
    GF.check_shape(t, config, N, K, nb, glu)
    assert GF.launch_shape(t, config, N, nb, glu) == want


@pytest.mark.parametrize("t,N,K,nb,glu,needle", [
    (Q4_K, 4000, 4096, 4, False, "N = 4000 not a positive multiple of 128"),
    (Q4_K, 96, 4096, 4, True, "N = 96 not a positive multiple of 64"),
    (Q4_K, 4096, 4224, 4, False, "K = 4224 not a positive multiple of 256"),   # 128-aligned, not whole super-blocks
    (Q4_0, 4096, 4160, 4, False, "K = 4160 not a positive multiple of 128"),   # whole Q4_0 blocks, not a stage
    (Q8_0, 4096, 4096, 0, False, "nb = 0 < 1"),
    (Q4_0, 2 ** 30, 4096, 1, False, "int32 arguments overflow"),
])
def test_check_shape_refuses_what_the_kernel_cannot_run(t, N, K, nb, glu, needle):
    with pytest.raises(MemraError, match=re.escape(needle)):
        GF.check_shape(t, None, N, K, nb, glu)


@pytest.mark.parametrize("t", [0, 1, 30, 10, 11])   # F32, F16, BF16, Q2_K, Q3_K
def test_types_without_the_kernel_are_refused_by_name(t):
    assert not GF.supports(t, 4096, 4096, False)
    with pytest.raises(MemraError, match="no f16 kernel for .* weights"):
        GF.check_shape(t, None, 4096, 4096, 1, False)


def test_every_quantized_type_of_qtypes_is_supported():
    quantized = {t for t in MV.TYPES if t not in MV.FLOAT_TYPES}
    assert set(GF.TYPES) == quantized
    for t in GF.TYPES:
        assert GF.supports(t, 4096, 4096, False) and GF.supports(t, 14336, 4096, True), MV.TYPES[t][0]


def test_supports_is_a_function_of_the_weight():
    """By shape: N a multiple of the output tile (128, glu 64), K of the type's step; no row count
    enters (the prompt rows' bits must not depend on the chunk)."""
    assert GF.supports(Q4_K, 128, 256, False) and GF.supports(Q4_K, 64, 256, True)
    assert not GF.supports(Q4_K, 64, 256, False) and not GF.supports(Q4_K, 32, 256, True)
    assert not GF.supports(Q4_K, 4096, 128, False) and GF.supports(Q4_0, 4096, 128, False)
    assert not GF.supports(Q6_K, 4096, 4000, False)


@pytest.mark.parametrize("config,needle", [
    ({"GF_TN": 3}, "GF_TN even"),
    ({"GF_TM": 8, "GF_WM": 4}, "shared memory 348160 > 232448"),
    ({"GF_WM": 8, "GF_WN": 8}, "at most 1024 threads"),
    ({"GF_OVERLAP": 2}, "GF_OVERLAP 0 or 1"),
    ({"GF_OVL0": 8}, "GF_OVL0 in 0..7"),
    ({"GF_FOO": 1}, "unknown tunable GF_FOO"),
    ({"WG_BN": 96}, "WG_BN 64, 128 or 256"),
    ({"WG_MT": 3}, "WG_MT 1 or 2"),
    ({"WG_INFLIGHT": 2}, "WG_INFLIGHT and WG_PREFETCH 0 or 1"),
    ({"WG_STAGES": 2}, "WG_STAGES >= 2 + WG_INFLIGHT"),
    ({"WG_STAGES": 6, "WG_BN": 256}, "shared memory 296032 > 232448"),
    ({"WG_FOO": 1}, "unknown tunable WG_FOO"),
])
def test_check_config_refuses_what_the_kernel_asserts(config, needle):
    with pytest.raises(MemraError, match=re.escape(needle)):
        GF.check_config(Q4_K, config)


def test_the_launchers_check_their_operands():
    g = FakeGpu(1 << 24)
    w = MV.upload_weight(g, MV.random_weight(Q4_K, 256, 256, np.random.default_rng(0)), Q4_K)
    xh, y = g.empty((4, 256), np.uint16), g.empty((4, 256), np.float32)
    with pytest.raises(MemraError, match="xh must be uint16"):
        GF.gemm_f16(g, w, y, xh=g.empty((4, 256), np.int8), nb=4)
    with pytest.raises(MemraError, match="y .and residual. must be f32 with >= 8x256"):
        GF.gemm_f16(g, w, y, xh=g.empty((8, 256), np.uint16), nb=8)
    with pytest.raises(MemraError, match="glu entry takes no residual"):
        GF.gemm_f16(g, w, y, xh=xh, nb=4, glu="silu", residual=y)
    with pytest.raises(MemraError, match="glu must be None"):
        GF.gemm_f16(g, w, y, xh=xh, nb=4, glu="relu")
    with pytest.raises(MemraError, match="to_f16: x must be f32"):
        GF.to_f16(g, y, g.empty(16, np.float32), 16)
    assert g.launches == 0


# -- the kernel compiled --------------------------------------------------------------------

def test_every_type_compiles_with_nvrtc_at_the_built_in_configurations():
    """The module of each type at gemm_f16.cu's tile (and the one without MV_TYPE, to_f16 alone) and at
    gemm_f16_wg.cu's two built-in configurations for sm_90a (the wgmma kernel with -default-device,
    memra.gpu.compile.FILE_OPTIONS); the wgmma module also builds (as a trap) for the other archs; a
    type qtypes.cuh lacks is refused by the kernel itself."""
    import memra.gpu.compile as mc
    from memra.errors import CompileError

    for defines in [{}] + [{"MV_TYPE": t, **GF.MMA} for t in GF.TYPES]:
        assert mc.compile_cubin(GF.KERNEL_FILE, "sm_90a", defines)[:4] == b"\x7fELF", defines
    for t in GF.TYPES:
        for c in (GF.WG, GF.WG_WIDE):
            assert mc.compile_cubin(GF.WG_FILE, "sm_90a", {"MV_TYPE": t, **c})[:4] == b"\x7fELF", (t, c)
    assert "-default-device" in mc.options_for("sm_90a", {}, mc.FILE_OPTIONS[GF.WG_FILE])
    for arch in ("sm_89", "sm_120a"):
        assert mc.compile_cubin(GF.WG_FILE, arch, {"MV_TYPE": Q4_K, **GF.WG})[:4] == b"\x7fELF", arch
    with pytest.raises(CompileError, match="MV_TYPE must be a quantized type"):
        mc.compile_cubin(GF.KERNEL_FILE, "sm_90a", {"MV_TYPE": 10})


def test_off_sm90a_the_built_in_runs_on_mma_sync_and_a_wgmma_configuration_is_refused():
    from gpu_emulator import ModuleLog

    g = ModuleLog(1 << 24)
    g.info.arch = "sm_89"
    w = MV.upload_weight(g, MV.random_weight(Q4_K, 256, 256, np.random.default_rng(0)), Q4_K)
    xh, y = g.empty((4, 256), np.uint16), g.empty((4, 256), np.float32)
    with pytest.raises(MemraError, match="the wgmma kernel .gemm_f16_wg.cu. needs sm_90a, this GPU is sm_89"):
        GF.gemm_f16(g, w, y, xh=xh, nb=4, config=GF.WG_WIDE)
    GF.gemm_f16(g, w, y, xh=xh, nb=4)
    assert g.loaded == {("gemm_f16.cu", tuple(sorted((k, str(v)) for k, v in {"MV_TYPE": Q4_K, **GF.MMA}.items())))}


def test_compile_variants_cover_every_type_the_configurations_and_the_canaries():
    v = GF.compile_variants()
    assert {f for f, _ in v} == {GF.KERNEL_FILE, GF.WG_FILE}
    for f, d in v:   # each file its own tunables
        assert not any(k.startswith("WG_" if f == GF.KERNEL_FILE else "GF_") for k in d), (f, d)
    for kf in (GF.KERNEL_FILE, GF.WG_FILE):
        assert {d.get("MV_TYPE") for f, d in v if f == kf} >= set(GF.TYPES)
        assert 1 in {d.get("MEMRA_CANARY") for f, d in v if f == kf}
    assert {d.get("MEMRA_CANARY") for _, d in v} == {None, 1, 2}
    assert any(d.get("GF_TM") == 8 for _, d in v) and any(d.get("WG_BN") == 256 for _, d in v)


# -- the index math, replayed -----------------------------------------------------------------

def _index_check():
    spec = importlib.util.spec_from_file_location("gemm_f16_index_check",
                                                  ROOT / "experiments" / "gemm_f16" / "index_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# the kernel's lines whose formulas the replay copies: an edit to one of them must come with the
# replay's (and this list's)
_TIED = [
    "const int n = n0 + 8 * (r >> 4) + (r & 7);",
    "return (r & 8) ? N + n : n;",
    "ur[p] = i >> 1;",
    "uu[p] = i & 1;",
    "const int c = T::goff(u, g, K / 64) - BK * s;   // 0..127, a multiple of 16",
    "const int c = tid + p * NT, r = c >> 4, col = 8 * (c & 15);",
    "ldsm_x4(a[tm], smem_u32(wt + (16 * tm + (lane & 15)) * LDS + 16 * kk + 8 * (lane >> 4)));",
    "ldsm_x4(r, smem_u32(xt + (8 * tn + (lane & 7) + 8 * (lane >> 4)) * LDS + 16 * kk +",
    "8 * ((lane >> 3) & 1)));",
    "b[tn][0] = r[0]; b[tn][1] = r[1]; b[tn + 1][0] = r[2]; b[tn + 1][1] = r[3];",
    "const int m = m0 + wn * 8 * GF_TN + 8 * tn + 2 * tig;",
    "const int n = n0 + 8 * (wm * GF_TM + tm) + gid;",
    "const int n = n0 + 16 * (wm * GF_TM + tm) + gid;",
    "const int mm = m + (e & 1), nn = n + 8 * (e >> 1);",
    "const float gv = d[e], uv = d[2 + e];",
    "const int m0 = blockIdx.x * BN;",
    "const int n0 = blockIdx.y * (GLU ? BM / 2 : BM);",
]


def test_the_replayed_formulas_are_the_kernels():
    src = KERNEL.read_text()
    missing = [line for line in _TIED if line not in src]
    assert not missing, missing


def _goff_kinds():
    """Each type's goff in qtypes.cuh: 'plain' (64 u + 16 g) or 'q6k' (Q6_K's interleave)."""
    text = (ROOT / "kernels" / "qtypes.cuh").read_text()
    out = {}
    for m in re.finditer(r"struct T(\w+) \{(.*?)\n\};", text, re.S):
        body = m.group(2)
        g = body[body.index("goff"):body.index("moff")]
        if "return 64 * u + 16 * g;" in g:
            out[m.group(1)] = "plain"
        elif "return 256 * (u >> 2) + 128 * (j >> 1) + 32 * g + 16 * (j & 1);" in g:
            out[m.group(1)] = "q6k"
    return out


def test_every_types_goff_is_one_the_replay_knows():
    kinds = _goff_kinds()
    for t in GF.TYPES:
        name = MV.TYPES[t][0]
        assert kinds.get(name) == ("q6k" if name == "Q6_K" else "plain"), (name, kinds.get(name))


@pytest.mark.parametrize("cfg", [dict(WM=2, WN=4, TM=4, TN=4), dict(WM=2, WN=4, TM=8, TN=4),
                                 dict(WM=4, WN=2, TM=4, TN=4)])
def test_every_output_sums_each_k_once(cfg):
    """store_w / load_x placement, ldmatrix per lane, the mma operand layouts of the PTX ISA and the
    epilogue's (m, n): every output of a 2-stage tile with a partial last row block sums
    W[n, k] x[m, k] over each k once, glu's gate and up rows in one thread; Q4_K glu, Q6_K (its
    interleaved unit offsets: the replay's goff is the kernel's, test above) and Q4_0."""
    ic = _index_check()
    for tname, glu in (("Q4_K", True), ("Q6_K", False), ("Q4_0", False)):
        N = 2 * (16 * cfg["TM"] * cfg["WM"])
        errs = ic.check(tname, cfg, glu, N=N, K=256, nb=150, n_block=1, m_block=1)
        assert not errs, (tname, glu, errs[:5])


def test_the_replay_catches_a_planted_slip(monkeypatch):
    """glu's row interleave with the gate and up halves swapped: the replay says so."""
    ic = _index_check()

    def wrow(r, n0, N, glu):
        if not glu:
            return n0 + r
        n = n0 + 8 * (r >> 4) + (r & 7)
        return n if r & 8 else N + n

    monkeypatch.setattr(ic, "wrow", wrow)
    errs = ic.check("Q4_K", dict(WM=2, WN=4, TM=4, TN=4), True, N=256, K=256, nb=150, n_block=1, m_block=1)
    assert errs and "weight row" in errs[0]


# -- the planner under MEMRA_PROMPT_GEMM --------------------------------------------------------

def _spec(model="synth:tiny-llama:Q4_K_M", **types):
    from dataclasses import replace

    from memra.tune import launches as LS

    (spec,), missing = LS.model_specs((model,))
    assert not missing
    return replace(spec, types={**spec.types, **types}) if types else spec


def _plans(spec, monkeypatch, **kw):
    from memra.gpu.plan import Planner

    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    return Planner(spec, hybrid=True, prompt_gemm="tile", **kw), Planner(spec, hybrid=True, **kw)   # f16: the default


def _sources_converted(launches) -> None:
    """Each gemm_f16 reads the f16 buffer as the closest to_f16 before it left it: that launch
    converted its source, and only gemm_f16 launches reading (not writing) that source ran between."""
    for i, L in enumerate(launches):
        if L.op != "gemm_f16":
            continue
        j = i - 1
        while launches[j].op == "gemm_f16":
            assert launches[j].args["src"] == L.args["src"] and launches[j].args["dst"] != L.args["src"], L.name
            j -= 1
        assert launches[j].op == "to_f16" and launches[j].args["src"] == L.args["src"], (L.name, launches[j].name)
        assert launches[j].args["K"] == int(L.shape["cols"]) and launches[j].rows == L.rows


@pytest.mark.parametrize("model", ["synth:tiny-llama:Q4_K_M", "synth:tiny-gemma3:Q4_K_M", "synth:llama3-8b:Q4_K_M"])
def test_prompt_steps_convert_each_source_once_then_run_gemm_f16(model, monkeypatch):
    """Every layer weight gemm_f16 supports takes it after the conversion of its source (tiny Gemma-3's
    "more bits" layers split q+k (320 rows: not a multiple of 128) from v (64): those keep the default
    plan's launches, here mv_q8's order as the tile has too few output tiles for them)."""
    tile, f16 = _plans(_spec(model), monkeypatch)
    assert tile.prompt_gemm == "tile" and not tile.f16_keys
    layer_weights = {w.key for w in f16.weights() if w.key != "output"}
    apart = {"blk.2.qkv0", "blk.2.qkv1", "blk.5.qkv0", "blk.5.qkv1", "blk.6.qkv0", "blk.6.qkv1"} \
        if "gemma3" in model else set()
    assert f16.f16_keys == layer_weights - apart and f16.use_tile
    assert f16.tile_keys == {k for k in tile.tile_keys if k in apart}
    for rows in (1, 17, 512):
        steps = f16.step(rows, decode=False, kinds="p", sampler="greedy")
        _sources_converted(steps)
        ops = [L.op for L in steps]
        assert ops.count("gemm_f16") == len(f16.f16_keys)
        default = {(L.name, L.args.get("weight")): L for L in tile.step(rows, decode=False, kinds="p")}
        for L in steps:
            if L.args.get("weight") in apart:
                assert L == default[(L.name, L.args["weight"])]
        # one conversion a source a layer (h for q/k/v, ao, h again after the FFN norm, ff), whatever the
        # q/k/v split (the 8B Q4_K_M: Q4_K q+k and Q6_K v, two weights, one conversion)
        per_layer = [[L.args["src"] for L in steps if L.op == "to_f16" and L.layer == il]
                     for il in range(f16.cfg.n_layer)]
        assert all(srcs == (["h"] if f"blk.{il}.qkv0" not in apart else []) + ["ao", "h", "ff"]
                   for il, srcs in enumerate(per_layer)), per_layer
        # the q8 twins of ao and ff have no reader left: their quantize launches go
        assert not [L for L in steps if L.op == "quantize"]
        assert [L for L in tile.step(rows, decode=False, kinds="p") if L.op == "quantize"]
        # the head keeps mv_q8's order: the launches after the last layer are the default plan's
        tail = lambda s: s[max(i for i, L in enumerate(s) if L.layer == f16.cfg.n_layer - 1) + 1:]  # noqa: E731
        assert tail(steps) == tail(tile.step(rows, decode=False, kinds="p", sampler="greedy"))
    # decode steps, steps of generated rows and the head: the default plan's launches
    for rows in (1, 8, 64):
        assert f16.step(rows, decode=True, sampler="greedy") == tile.step(rows, decode=True, sampler="greedy")
        assert f16.step(rows, decode=False, kinds="g") == tile.step(rows, decode=False, kinds="g")
        assert f16.head(rows, "sample") == tile.head(rows, "sample")
    with pytest.raises(MemraError, match="one row kind"):
        f16.step(4, decode=False, kinds="pg")


def test_gate_and_up_apart_share_one_conversion(monkeypatch):
    """Gate and up of different types are two weights (and an act_mul launch): both read h after one
    to_f16; a weight gemm_f16 does not take (an F16 attention output) keeps the default plan's launch
    and its q8 twin's quantize."""
    spec = _spec(**{f"blk.{il}.ffn_up.weight": "Q5_0" for il in range(4)},
                 **{f"blk.{il}.attn_output.weight": "F16" for il in range(4)})
    tile, f16 = _plans(spec, monkeypatch)
    assert "blk.0.gate" in f16.f16_keys and "blk.0.up" in f16.f16_keys and "blk.0.attn_output" not in f16.f16_keys
    steps = f16.step(64, decode=False, kinds="p")
    _sources_converted(steps)
    names = [L.name for L in steps if L.layer == 0]
    i = names.index("blk.0.gate_f16")
    assert names[i:i + 4] == ["blk.0.gate_f16", "blk.0.gate", "blk.0.up", "blk.0.act_mul"]
    assert "blk.0.up_f16" not in names
    want = [L for L in tile.step(64, decode=False, kinds="p") if L.name in ("blk.0.attn_q8", "blk.0.attn_output")]
    assert [L for L in steps if L.name in ("blk.0.attn_q8", "blk.0.attn_output")] == want
    assert want[0].op == "quantize" and {L.op for L in want[1:]} == {"matvec"}   # F16 on the q8 path: row by row


def test_a_weight_gemm_f16_does_not_support_keeps_its_path_and_its_twin(monkeypatch):
    """A down projection of K = 320 (Q4_0: whole blocks, not whole 128-element stages) keeps the
    default plan's launches, and with them the quantize of ff that feeds it; gate+up (320 outputs)
    takes gemm_f16."""
    from dataclasses import replace

    spec = _spec(**{f"blk.{il}.ffn_down.weight": "Q4_0" for il in range(4)})
    spec = replace(spec, cfg=replace(spec.cfg, n_ff=320))
    assert not GF.supports(2, 256, 320, False) and GF.supports(12, 320, 256, True)
    tile, f16 = _plans(spec, monkeypatch)
    kinds = {k.split(".", 2)[-1] for k in f16.f16_keys}
    assert "down" not in kinds and {"attn_output", "gate_up"} <= kinds
    steps = f16.step(64, decode=False, kinds="p")
    _sources_converted(steps)
    default = [L for L in tile.step(64, decode=False, kinds="p") if L.name in ("blk.0.ffn_q8", "blk.0.down")]
    assert [L for L in steps if L.name in ("blk.0.ffn_q8", "blk.0.down")] == default
    assert [L.op for L in default] == ["quantize", "gemm"]


def test_the_flag_needs_hybrid_prompt_rows_on_the_q8_path(monkeypatch):
    from memra.gpu.plan import Planner

    spec = _spec()
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    assert not Planner(spec, hybrid=True).f16_keys                   # read from the environment
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "f16")
    assert Planner(spec, hybrid=True).f16_keys
    for kw in ({}, {"fa": True}, {"hybrid": True, "tile": False}, {"hybrid": True, "path": "f32"}):
        p = Planner(spec, **kw)
        assert not p.f16_keys and not any(L.op in ("gemm_f16", "to_f16") for L in p.step(64, decode=False)), kw


@pytest.mark.parametrize("value", ["fp16", "F16", "on", "1"])
def test_a_bad_flag_value_is_refused_by_name(value, monkeypatch, tiny_models):
    from memra.gpu.plan import Planner
    from memra.gpu.runner import Runner

    monkeypatch.setenv("MEMRA_PROMPT_GEMM", value)
    with pytest.raises(MemraError, match=f"MEMRA_PROMPT_GEMM must be tile or f16, got '{value}'"):
        Planner(_spec(), hybrid=True)
    with pytest.raises(MemraError, match="MEMRA_PROMPT_GEMM must be"):
        Runner(tiny_models("llama", "Q4_K_M"), gpu=FakeGpu(1 << 28), max_len=64, max_seqs=2)
    with pytest.raises(MemraError, match="prompt_gemm must be tile or f16"):
        Planner(_spec(), hybrid=True, prompt_gemm=value)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "")      # empty: the default
    assert Planner(_spec(), hybrid=True).prompt_gemm == "f16"


# -- the engine on the emulator ---------------------------------------------------------------

def test_the_engine_with_gemm_f16_gives_the_references_tokens(tiny_models, monkeypatch):
    """MEMRA_PROMPT_GEMM=f16 on the emulated GPU (tests/gpu_emulator.py's models of to_f16 and
    gemm_f16): the runner allocates the f16 buffer, prompt steps launch both kernels, rows are
    batch- and chunk-invariant, graph replay = eager launches, and the greedy tokens are the CPU
    reference's; the prompt rows' bits differ from the tile's (another arithmetic), generated rows
    fed beside a prompt keep decode's."""
    from test_runner_emulated import PROMPT, _reference_greedy, _runner

    from memra.gpu.runner import Row
    from memra.tune.invariance import batch_invariance, graph_vs_eager

    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    default = _runner(path, attn="hybrid")
    assert default.xh is None
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "f16")
    r = _runner(path, attn="hybrid")
    assert r.xh is not None and r.xh.size == r.rows * max(r.cfg.n_embd, r.cfg.q_dim, r.cfg.n_ff)
    launched = []
    real = r.g.launch
    r.g.launch = lambda k, *a, **kw: (launched.append(k.name), real(k, *a, **kw))[1]
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    assert {"to_f16", "gemm_f16", "gemm_f16_glu"} <= set(launched)
    assert graph_vs_eager(_runner(path, attn="hybrid"), PROMPT, buckets=(1, 2, 4))["identical"]

    def prompt_logits(e, chunks):
        s = e.open()
        return np.concatenate([e.step([Row(s, PROMPT[i:i + chunks], logits="all", gen=False)])[0].logits
                               for i in range(0, len(PROMPT), chunks)]).view(np.uint32)

    whole = prompt_logits(r, len(PROMPT))
    for chunks in (1, 3):
        assert np.array_equal(prompt_logits(_runner(path, attn="hybrid"), chunks), whole), chunks
    assert not np.array_equal(prompt_logits(default, len(PROMPT)), whole)

    # a generated run beside another sequence's prompt (one step call, two kinds: the runner splits it)
    # keeps the bits of the same tokens decoded one step at a time
    nxt = [5, 9, 300]

    def after_prompt(e, mixed):
        s = e.open()
        e.step([Row(s, PROMPT)])
        if not mixed:
            return np.stack([e.step([Row(s, [t], logits="last")])[0].logits for t in nxt])
        return e.step([Row(s, nxt, logits="all", gen=True), Row(e.open(), PROMPT[::-1], logits="last")])[0].logits

    dec = after_prompt(_runner(path, attn="hybrid"), False)
    assert np.array_equal(after_prompt(_runner(path, attn="hybrid"), True).view(np.uint32), dec.view(np.uint32))


def test_the_launch_set_under_the_flag_holds_what_the_engine_loads(tiny_models, monkeypatch):
    """With MEMRA_PROMPT_GEMM=f16 the launch set kernel-check builds holds every module the emulated
    runner loads (to_f16's without MV_TYPE, gemm_f16's per type), and one case of each module passes
    its check_launch on the emulator; without the flag set the launch set holds them too (its hybrid plan
    with MEMRA_PROMPT_GEMM=f16), as it holds every seam's."""
    from test_launch_set import PROMPT, _modules, _one_per_module, _recorded

    from memra.gpu.plan import ModelSpec
    from memra.gpu.runner import Row, Runner, Sampling
    from memra.model.gguf import open_gguf
    from memra.tune import launches as LS

    path = tiny_models("llama", "Q4_K_M")
    spec = ModelSpec.from_gguf(open_gguf(path), "llama")
    monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
    assert {c["entry"] for c in LS.launch_set([spec]).values() if c["family"] == "gemm_f16"} == \
        {"to_f16", "gemm_f16", "gemm_f16_glu"}
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "f16")
    g = FakeGpu(1 << 28)
    seen = _recorded(g)
    r = Runner(path, gpu=g, max_len=64, max_seqs=4)
    seqs = [r.open() for _ in range(2)]
    r.step([Row(seqs[0], PROMPT * 2, sample=Sampling(0.0))])
    r.step([Row(seqs[1], PROMPT[:3], logits="last")])
    r.step([Row(s, [7], sample=Sampling(0.0)) for s in seqs])
    assert {m[1] for m in seen} >= {"to_f16", "gemm_f16", "gemm_f16_glu"}
    cases = LS.launch_set([spec], [r.tune_table])
    missing = seen - _modules(cases)
    assert not missing, sorted(missing)[:5]
    mine = {k: c for k, c in cases.items() if c["family"] == "gemm_f16"}
    assert {c["entry"] for c in mine.values()} == {"to_f16", "gemm_f16", "gemm_f16_glu"}
    g, rng = FakeGpu(1 << 30), np.random.default_rng(0)
    for c in _one_per_module(mine):
        o = GF.check_launch(g, rng, c)
        assert o.ok, (c["entry"], c["defines"], o.name, o.detail)


def test_kernel_check_of_the_family_on_the_emulator(monkeypatch):
    """`memra kernel-check --only gemm_f16` with the flag set, on the emulator: its checks and launch
    cases pass (the references agree with the launch contracts; every grid passes the emulator's
    geometry check) and both canaries are caught — the checks' strength against the kernel's own
    deliberate errors, as modelled."""
    from test_launch_set import GEMM_F16_HEAP, _emulated_kernel_check

    from memra.tune import kernelcheck as KC

    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "f16")
    report = {}
    lines = _emulated_kernel_check(monkeypatch, heap=GEMM_F16_HEAP, only="gemm_f16", report=report)
    assert KC.all_green(lines), [ln for ln in lines if not ln.startswith("PASS")][:5]
    assert sum(" canary " in ln and "caught" in ln for ln in lines) == 3
    fam = report["families"]["gemm_f16"]
    assert fam["launch_cases"] > 0 and fam["checks"] > 60
    assert {"gemm_f16.cu", "gemm_f16_wg.cu"} <= set(fam["files"])


def test_a_run_with_the_flag_records_it(monkeypatch):
    """memra bench / tune receipts carry MEMRA_PROMPT_GEMM in `seams` when it is not the default (f16)
    (the boards leave such runs off)."""
    from memra.tune import bench as TB

    for k in (*TB.SEAMS, *TB.ENGINE_PATHS):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "f16")
    assert TB.seams() == {}
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    assert TB.seams() == {"MEMRA_PROMPT_GEMM": "tile"}


# -- the wgmma kernel's index maps and ring, replayed (experiments/gemm_f16/wg/layout_check.py) ----------

# kernels/gemm_f16_wg.cu's lines the replay copies: an edit to one of them must come with the replay's
_TIED_WG = [
    "return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |",
    "return (r >> 3) * 1024 + (r & 7) * 128 + ((j ^ (r & 7)) << 4);",
    "const int col = T::goff(2 * par + h, g, K / 64) - 128 * par;",
    "const uint32_t wt = (col & 64) ? wb : wa;",
    "const int j = (col & 63) >> 3;",
    "xoff[q] = (uint32_t)((m < nb ? m : 0) * K + 8 * jx) * 2u;",
    "const uint32_t dst = xt + sw128(r0, jx);",
    "cp16_zfill(dst + 2048 * q, xs + xoff[q], m0 + r0 + 16 * q < nb);",
    "if (ia >= S) mbar_wait(bars + 8 * (S + sa), ((ia / S) - 1) & 1);",
    "mbar_wait(bars + 8 * s, (i / S) & 1);",
    "const uint64_t db = sw128_desc(xt + 32 * kk);",
    "wgmma_tile(acc[mt], sw128_desc(wt + (WG_MT * c + mt) * 8192 + 32 * kk), db);",
    "if (lane == 0) mbar_arrive(bars + 8 * (S + (i - WG_INFLIGHT) % S));",
    "const int r0 = 64 * (WG_MT * c + mt) + 16 * warp;",
    "const int m = m0 + 8 * j + 2 * tig;",
    "const int n = n0 + (r0 >> 1) + gid;",
    "const int n = n0 + r0 + gid;",
    "const int mm = m + (e & 1), nn = n + 8 * (e >> 1);",
]


def test_the_wgmma_kernels_index_maps_and_ring_replayed():
    """The wgmma kernel's producer writes, descriptors, D fragment and epilogue against the PTX ISA's
    layouts, and its mbarrier ring as random interleavings (no deadlock, no slot overwritten while read),
    on the replay of the kernel's own lines (tied above)."""
    src = (ROOT / "kernels" / "gemm_f16_wg.cu").read_text()
    missing = [line for line in _TIED_WG if line not in src]
    assert not missing, missing
    spec = importlib.util.spec_from_file_location("gemm_f16_wg_layout_check",
                                                  ROOT / "experiments" / "gemm_f16" / "wg" / "layout_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main() == 0


def test_the_diagnostic_copy_of_the_wgmma_kernel_still_applies_and_builds(tmp_path):
    """experiments/gemm_f16/wg/diag.py's text edits find their lines in kernels/gemm_f16_wg.cu (an edit of
    the kernel that moves one fails here, before a device call), and each cut builds for sm_90a."""
    spec = importlib.util.spec_from_file_location("gemm_f16_wg_diag",
                                                  ROOT / "experiments" / "gemm_f16" / "wg" / "diag.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = mod.diag_source(tmp_path)
    text = src.read_text()
    assert text.count("#if WG_DIAG") == len(mod.EDITS)
    for d in (1, 2, 3):
        assert mod._compile((str(src), (Q4_K, {"WG_BN": 256, "WG_INFLIGHT": 0}, d)))[:4] == b"\x7fELF", d


def test_the_conversion_probe_applies_builds_and_its_trick_is_exact(tmp_path):
    """experiments/gemm_f16/wg/cvt.py's copy of the wgmma kernel (T::deq or kernels/deq_cvt.cuh's DeqCvt<T>, the
    landed producer, by WG_CVT) finds its line and builds both ways; and the trick deq_cvt.cuh rests on is exact for
    every byte and bias it uses: the f32 with bits 0x4B000000 | u, minus 2^23 + k, is u - k (what (float)(u - k)
    gives)."""
    spec = importlib.util.spec_from_file_location("gemm_f16_wg_cvt",
                                                  ROOT / "experiments" / "gemm_f16" / "wg" / "cvt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = mod.cvt_source(tmp_path)
    assert src.read_text().count("#if WG_CVT") == 1
    for c in (0, 1):
        assert mod._compile((str(src), (Q6_K, (("WG_BN", 128),), c)))[:4] == b"\x7fELF", c
    u = np.arange(256, dtype=np.uint32)
    magic = (np.uint32(0x4B000000) | u).view(np.float32)
    for k in (0, 8, 16, 32, 128):   # cvt_fma / cvt_fms, cvt_mul<8>, <16>, cvt_i8<32>, <128>
        bias = np.float32(8388608 + k)
        assert float(bias) == 8388608 + k
        got = magic - bias
        assert got.dtype == np.float32 and np.array_equal(got, (u.astype(np.int64) - k).astype(np.float32)), k
        assert not np.signbit(got[got == 0]).any()   # u = k gives +0, as the conversion does
    # signed bytes through the flip the header uses (Q8_0, IQ4_XS): q ^ 0x80 = q + 128
    q = np.arange(-128, 128, dtype=np.int64)
    flipped = (q.astype(np.uint8) ^ np.uint8(0x80)).astype(np.uint32)
    assert np.array_equal((np.uint32(0x4B000000) | flipped).view(np.float32) - np.float32(8388736),
                          q.astype(np.float32))


def test_the_conversion_probes_device_loop_runs_on_the_emulator(monkeypatch, tmp_path):
    """cvt.py's device half (both arms launched through diag.py's launcher, the engine's own launch beside them,
    the read-back and the receipt) runs on the emulator: an API drift breaks it here, not in a device call. The
    emulator models the kernel, not the two dequants, so its bits say nothing about deq_cvt.cuh (the device run
    and the CPU arithmetic test do)."""
    import concurrent.futures as CF
    import json
    import sys

    import gpu_emulator as EMU

    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "gemm_tile"))
    import tile as TL

    EMU.install(monkeypatch, FakeGpu(1 << 28))
    real = TL.prebuilt_module
    monkeypatch.setattr(TL, "prebuilt_module", lambda g, cache, k, f, d, cub, mock=False: real(
        g, cache, k, f, {a: b for a, b in d.items() if a != "WG_CVT"}, cub, mock=True))
    monkeypatch.setattr(TL, "time_us", lambda g, fns, reps: [fn() for fn in fns] and 1.0)
    monkeypatch.setattr(CF, "ProcessPoolExecutor", CF.ThreadPoolExecutor)
    spec = importlib.util.spec_from_file_location("gemm_f16_wg_cvt_dry",
                                                  ROOT / "experiments" / "gemm_f16" / "wg" / "cvt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "SHAPES", [("gate_up", Q4_K, 512, 512, True, [(64, {"WG_BN": 64})]),
                                        ("down", Q6_K, 256, 512, False, [(70, {"WG_BN": 128})])])
    monkeypatch.setattr(mod, "_compile", lambda job: b"\x7fELF")
    out = tmp_path / "cvt.jsonl"
    monkeypatch.setattr(sys, "argv", ["cvt.py", "--out", str(out), "--reps", "2"])
    assert mod.main() == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["type"], r["nb"], r["same_bits"]) for r in recs] == [("Q4_K", 64, True), ("Q6_K", 70, True)]
