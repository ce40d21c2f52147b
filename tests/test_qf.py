"""kernels/qf.cu and memra.gpu.ops.qf (MEMRA_DECODE=qf): the host contract, to_qf's activation layout (replayed),
the weight staging of qf_gemm (replayed), the planner's generated-row launches, the engine on the emulator, and the
family's kernel-check on the emulator (its checks against the launch contracts, its canaries caught)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.errors import MemraError
from memra.gpu import cuda
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import qf as QF

ROOT = Path(__file__).resolve().parents[1]


# -- the host contract ----------------------------------------------------------------------------

def test_the_chain_count_is_the_shapes_alone():
    """The chain count (the arithmetic) by the weight's shape: gate+up 2 / 1, others 4 / 2 / 1 by K's superblocks;
    every row count and configuration of a shape carries it, and a configuration naming another is refused."""
    assert [QF.chains(4096, k, False) for k in (14336, 4096, 1536, 256)] == [4, 4, 2, 1]
    assert QF.chains(14336, 4096, True) == 2 and QF.chains(512, 768, True) == 1
    for nb in (1, 8, 9, 64, 512):
        assert QF.launch_config(nb, 4096, 14336, False)["QF_CHAINS"] == 4
    with pytest.raises(MemraError, match="QF_CHAINS=8 is not the weight's chain count 4"):
        QF.launch_config(64, 4096, 14336, False, {"QF_CHAINS": 8})


def test_the_kernel_by_the_row_count_and_the_built_in_configurations():
    """qf_mv up to 8 rows, qf_gemm above (or where a configuration names its tunables); session 55's best at 64 rows:
    8 warps x 4 n8 tiles, the weights through shared memory, the chains split across blocks up to 64 rows but a
    gate+up's; the grids and workspaces of the contract."""
    gu = QF.launch_config(64, 14336, 4096, True)
    assert gu == {"QF_WARPS": 4, "QF_CHAINS": 2, "QF_GWARPS": 8, "QF_NT": 4, "QF_STAGES": 2, "QF_KSPLIT": 0,
                  "QF_WSMEM": 1}
    assert QF.launch_shape(gu, 14336, 64, True)[:3] == ("qf_gemm_glu", (224, 2, 1), (256, 1, 1))
    assert QF.smem_bytes(gu) == 2 * 32 * 640 + 2 * 8 * 16 * 176 + 4 * 4 * 32 * 8 * 4   # + the parked chain sums
    dn = QF.launch_config(64, 4096, 14336, False)
    assert (dn["QF_GWARPS"], dn["QF_NT"], dn["QF_KSPLIT"]) == (8, 4, 1)
    assert QF.launch_shape(dn, 4096, 64, False) == ("qf_gemm", (32, 2, 4), (256, 1, 1), QF.smem_bytes(dn),
                                                    4 * 64 * 4096, 64)
    assert QF.workspace(4096, 14336, 65, False) == (0, 0)              # past KSPLIT_ROWS: the chains in a warp
    one = QF.launch_config(1, 4096, 14336, False)
    assert one == {"QF_WARPS": 4, "QF_CHAINS": 4, "QF_AHEAD": 1}
    assert QF.launch_shape(one, 4096, 1, False)[:4] == ("qf_mv", (256, 1, 1), (128, 1, 1), 0)
    assert QF.launch_shape(QF.launch_config(8, 4096, 4096, False, {"QF_NT": 1}), 4096, 8, False)[0] == "qf_gemm"
    assert [QF.launch_config(n, 4096, 4096, False)["QF_NT"] for n in (9, 17, 33, 512)] == [2, 4, 4, 4]
    with pytest.raises(MemraError, match="qf_mv takes at most 8 rows"):
        QF.launch_shape(one, 4096, 9, False)


@pytest.mark.parametrize("t, N, K, glu, needle", [
    (13, 4096, 4096, False, "no qf kernel for Q5_K"), (12, 4096, 640, False, "K = 640 not a positive multiple of 256"),
    (12, 40, 4096, False, "N = 40 not a positive multiple of 16"), (12, 12, 4096, True, "N = 12 not a positive multiple of 8")])
def test_check_shape_refuses_what_the_kernel_cannot_run(t, N, K, glu, needle):
    with pytest.raises(MemraError, match=needle):
        QF.check_shape(t, N, K, 1, glu)
    assert not QF.supports(t, N, K, glu)
    assert QF.supports(12, 4096, 14336, False) and QF.supports(12, 14336, 4096, True) and QF.supports(12, 8, 256, True)
    assert QF.supports(14, 4096, 14336, False) and QF.supports(14, 1024, 4096, False)


@pytest.mark.parametrize("config, needle", [({"QF_NT": 3}, "QF_NT 1, 2, 4 or 8"), ({"QF_STAGES": 5}, "QF_STAGES 2..4"),
                                            ({"QF_WARPS": 2}, "QF_WARPS a multiple of QF_CHAINS"),
                                            ({"QF_AHEAD": 4}, "QF_AHEAD 1..3"), ({"QF_BOGUS": 1}, "unknown tunable"),
                                            ({"QF_NT": 8, "QF_GWARPS": 16, "QF_STAGES": 4}, "shared memory")])
def test_check_config_refuses_what_the_kernel_asserts(config, needle):
    with pytest.raises(MemraError, match=needle):
        QF.check_config(QF.launch_config(64, 4096, 4096, False, config))


def test_the_launchers_check_their_operands():
    g = FakeGpu(1 << 24)
    w = MV.upload_weight(g, MV.random_weight(12, 64, 1024, np.random.default_rng(0)), 12)
    xh, xs2, y = g.empty(64 * 1024, np.uint16), g.empty(64 * 64, np.float32), g.empty(64 * 64, np.float32)
    with pytest.raises(MemraError, match="splits its chains across blocks: ws float32"):
        QF.qf(g, w, y, xh=xh, xs2=xs2, nb=64)
    with pytest.raises(MemraError, match="xh must be uint16"):
        QF.qf(g, w, y, xh=y, xs2=xs2, nb=1)
    with pytest.raises(MemraError, match="the glu entry takes no residual"):
        QF.qf(g, w, g.empty(64 * 32, np.float32), xh=xh, xs2=xs2, nb=1, glu="silu", residual=y)
    with pytest.raises(MemraError, match="K = 100 must be a positive multiple of 256"):
        QF.to_qf(g, y, xh, xs2, 1, 100)


def test_compile_variants_cover_both_kernels_both_types_the_configurations_and_the_canaries():
    v = QF.compile_variants()
    assert all(f == "qf.cu" for f, _ in v) and len({tuple(sorted(d.items())) for _, d in v}) == len(v)
    canaries = sorted(d.get("MEMRA_CANARY", 0) for _, d in v)
    assert canaries.count(1) == 2 and canaries.count(2) == 1 and canaries.count(3) == 1   # 1: Q4_K's and Q6_K's
    for t in QF.TYPES:
        of_t = [d for _, d in v if d.get("QF_TYPE", 12) == t and "QF_CHAINS" in d]
        assert any(QF.is_gemm(d) and d["QF_WSMEM"] for d in of_t) and any(not QF.is_gemm(d) for d in of_t)
    assert any(QF.is_gemm(d) and d.get("QF_KSPLIT") and d["QF_CHAINS"] > 1 for _, d in v)
    assert any(not QF.is_gemm(d) and d.get("QF_CHAINS", 1) > 1 for _, d in v if "QF_CHAINS" in d)
    assert any(d.get("QF_CHAINS") == 2 for _, d in v) and any(d.get("QF_AHEAD") == 3 for _, d in v)


# -- the activation and weight layouts, replayed ----------------------------------------------------

def test_the_producer_puts_each_fragment_where_a_lane_loads_it():
    """to_qf's host replay (the contract kernel-check holds the kernel to): lane (gid, tig)'s 16 bytes at element 8 tig
    of a 32-element sub-block are its two k16 steps' B fragments (e0 e2 | e1 e3 | e4 e6 | e5 e7); its 16 bytes at float
    16 sb + 4 tig of a row's sums are (hi, hi, lo, lo) of sub-blocks tig and tig + 4 (the tf32 mma's b0 / b1), hi a
    tf32 value and hi + lo within 2^-21 of the f32 sum in to_qf's order (and the reference's S2 exactly); canary 3's
    order gives other sums."""
    rng = np.random.default_rng(1)
    nb, K = 3, 512
    x = (rng.standard_normal((nb, K)) * 3).astype(np.float32)
    xq, xs2, xh, s2ref = QF.producer(x)
    f = np.float32

    def s2_of(b, sub):   # each 8 in increasing k, then (s0 + s1) + (s2 + s3)
        q = []
        for t in range(4):
            acc = f(0)
            for v in xh[b, 32 * sub + 8 * t:32 * sub + 8 * t + 8]:
                acc = f(acc + f(v))
            q.append(acc)
        return f(f(q[0] + q[1]) + f(q[2] + q[3]))
    for b in range(nb):
        for sub in range(K // 32):
            for tig in range(4):
                got = xq[b, 32 * sub + 8 * tig:32 * sub + 8 * tig + 8]
                e = xh[b, 32 * sub + 8 * tig:32 * sub + 8 * tig + 8]
                assert (got == e[[0, 2, 1, 3, 4, 6, 5, 7]].view(np.uint16)).all()
        for sb in range(K // 256):
            for tig in range(4):
                hi0, hi4, lo0, lo4 = xs2[b, 16 * sb + 4 * tig:16 * sb + 4 * tig + 4]
                for v_hi, v_lo, sub in ((hi0, lo0, 8 * sb + tig), (hi4, lo4, 8 * sb + tig + 4)):
                    assert (np.float32(v_hi).view(np.uint32) & 0x1FFF) == 0
                    want = float(s2_of(b, sub))
                    assert abs(float(v_hi) + float(v_lo) - want) <= abs(want) * 2 ** -21
                    assert float(v_hi) + float(v_lo) == s2ref[b, sub]
    x[0, 96:128] = QF.plant()   # kernel-check's planted sub-block: S2 0 in to_qf's order, 2^-9 in canary 3's
    sums = [QF.producer(x, canary=c)[3][0, 3] for c in (0, 3)]
    assert sums == [0.0, 2.0 ** -9]


def test_the_reference_is_the_dequantized_product():
    """reference (kernel-check's float64 oracle) = the float64 product of memra.model.quants' dequantized Q4_K rows
    and the f16 activations, to f16-rounding of S2 (hi + lo: ~2^-22 of a sub-block's sum)."""
    rng = np.random.default_rng(3)
    raw = MV.random_weight(12, 16, 512, rng)
    x = (rng.standard_normal((2, 512)) * 2).astype(np.float32)
    _, _, x16, s2 = QF.producer(x)
    got = QF.reference(raw, x16, s2)
    want = x16.astype(np.float64) @ MV.dequant_rows(raw, 12).astype(np.float64).T
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_the_weight_staging_puts_each_byte_where_the_lane_reads_it():
    """qf_gemm's QF_WSMEM staging, replayed: stage_w's copies (lane k of 16 x 9: row q's 16-byte chunk c < 8 at q
    QF_WROW + 16 c, its meta at 16 QF_WROW + 16 q; row q < 8 the row of ra = n0 + q, else of rb: glu N + n0 + q - 8,
    plain n0 + q) against the step's reads (w[0][j] at gid QF_WROW + 32 j + 8 tig, w[1][j] at (gid + 8) QF_WROW + ..,
    the meta at 16 QF_WROW + 16 gid / 16 (gid + 8)): every lane gets its own rows' bytes; a slipped row map is
    caught."""
    wrow = _geometry()[12][1]
    rng = np.random.default_rng(2)

    def replay(N, nsb, glu, tile, sb, row_of):
        bulk = rng.integers(0, 256, ((2 * N if glu else N), nsb * 128), dtype=np.uint8)
        meta = rng.integers(0, 256, ((2 * N if glu else N), nsb * 16), dtype=np.uint8)
        n0 = tile * (8 if glu else 16)
        smem = np.zeros(16 * (wrow + 16), np.uint8)
        for k in range(16 * 9):
            q, c = divmod(k, 9)
            row = row_of(q, n0, N, glu)
            data = bulk[row, sb * 128 + 16 * c:sb * 128 + 16 * c + 16] if c < 8 else meta[row, 16 * sb:16 * sb + 16]
            o = q * wrow + 16 * c if c < 8 else 16 * wrow + 16 * q
            smem[o:o + 16] = data
        bad = 0
        for gid in range(8):
            ra, rb = n0 + gid, (N + n0 + gid) if glu else n0 + gid + 8
            for tig in range(4):
                for j in range(4):
                    for r, row in ((0, ra), (1, rb)):
                        o = (gid + 8 * r) * wrow + 32 * j + 8 * tig
                        bad += int((smem[o:o + 8] != bulk[row, sb * 128 + 32 * j + 8 * tig:][:8]).any())
            for r, row in ((0, ra), (1, rb)):
                o = 16 * wrow + 16 * (gid + 8 * r)
                bad += int((smem[o:o + 16] != meta[row, 16 * sb:16 * sb + 16]).any())
        return bad

    def kernel_rows(q, n0, N, glu):
        return n0 + q if q < 8 else ((N + n0 + q - 8) if glu else n0 + q)

    for glu in (False, True):
        assert replay(32, 3, glu, 1, 2, kernel_rows) == 0
        assert replay(32, 3, glu, 1, 2, lambda q, n0, N, g_: n0 + q) > 0 if glu else True
    assert replay(32, 3, False, 1, 2, lambda q, n0, N, g_: n0 + (q + 1) % 16) > 0


def _geometry() -> dict:
    """kernels/qf.cu's QF_XROW / QF_WROW / QF_MROW a QF_TYPE, which memra.gpu.ops.qf.GEOM must mirror."""
    src = (ROOT / "kernels" / "qf.cu").read_text()
    geo = {}
    for t, body in re.findall(r"#(?:el)?if QF_TYPE == (\d+)\n((?:#define .*\n)+)", src):
        geo[int(t)] = tuple(int(re.search(rf"#define QF_{k} (\d+)", body).group(1)) for k in ("XROW", "WROW", "MROW"))
    assert geo == QF.GEOM
    return geo


def _q6_lane(words: dict, o: int, tig: int, s: int) -> tuple[list[int], int, int]:
    """A lane's decode of Q6_K sub-block s, as qf6_superblock does it: from its 4-byte words (ql at 64 h + l0 and 64 h
    + 32 + l0, qh at 128 + 32 h + l0, l0 = 16 j + 4 tig) the four values q - 32 of elements 4 tig + 0, 1, 2, 3, and
    from the meta window (5 words, the 18 bytes at o) the sub-block's int8 scale and d's bits."""
    h, qd, j = s // 8, (s % 8) // 2, s % 2
    ql, qh = words[(h, j, qd & 1)], words[(h, j, 2)]
    v = ((ql >> (4 * (qd >> 1))) & 0x0F0F0F0F) | (((qh >> (2 * qd)) & 0x03030303) << 4)
    m = words["m"]
    sw = [((m[k] | (m[k + 1] << 32)) >> 16) & 0xFFFFFFFF if o else m[k] for k in range(4)]
    sc = (sw[s >> 2] >> (8 * (s & 3))) & 0xFF
    d = (m[4] >> 16) if o else (m[4] & 0xFFFF)
    return [((v >> (8 * i)) & 0xFF) - 32 for i in range(4)], sc - 256 if sc >= 128 else sc, d


def test_q6k_lanes_decode_the_gguf_values_from_global_and_from_the_staging():
    """Q6_K, replayed on the host: a lane's words (from the planes in global memory as QfTile.load reads them, and
    from qf_gemm's staging: stage_w's 12 16-byte bulk pieces of a row at q QF_WROW + 16 c and its 5-word meta window
    at 16 QF_WROW + QF_MROW q, read back at the lane's offsets) decode to memra.model.quants' values: q - 32 of
    elements 16 s + 4 tig + i, the sub-block's scale, d. Rows of an odd superblock count put the windows at both
    offsets; reading every window at offset 0 is caught."""
    from memra.model import quants as Q

    _, wrow, mrow = _geometry()[14]
    rng = np.random.default_rng(5)
    rows, nsb = 16, 3
    raw = MV.random_weight(14, rows, 256 * nsb, rng)
    bulk, meta = MV.pack_planes(raw, 14)
    q = Q._q6_k(raw.reshape(rows * nsb, 210))[0]
    q = q.reshape(rows, nsb, 256)
    sc = raw.reshape(rows, nsb, 210)[:, :, 192:208].view(np.int8)
    dbits = raw.reshape(rows, nsb, 210)[:, :, 208:210].copy().view("<u2")[..., 0]
    flat = meta.reshape(-1)
    w32 = lambda b, o: int.from_bytes(bytes(b[o:o + 4]), "little")  # noqa: E731

    def words_of(src_bulk, src_win):
        out = {"m": [w32(src_win, 4 * c) for c in range(5)]}
        for h in range(2):
            for j in range(2):
                l0 = 16 * j + 4 * tig
                out[(h, j, 0)], out[(h, j, 1)] = w32(src_bulk, 64 * h + l0), w32(src_bulk, 64 * h + 32 + l0)
                out[(h, j, 2)] = w32(src_bulk, 128 + 32 * h + l0)
        return out

    def bad_lanes(staged: bool, offset=None):
        bad = 0
        for r in range(rows):
            for sb in range(nsb):
                u = r * nsb + sb
                win = flat[(18 * u) & ~3:((18 * u) & ~3) + 20]
                src_b = bulk[r, 192 * sb:192 * sb + 192]
                if staged:   # one warp's stage: this row as its q = r
                    smem = np.zeros(16 * (wrow + mrow), np.uint8)
                    for c in range(12):
                        smem[r * wrow + 16 * c:r * wrow + 16 * c + 16] = src_b[16 * c:16 * c + 16]
                    for c in range(5):
                        smem[16 * wrow + mrow * r + 4 * c:16 * wrow + mrow * r + 4 * c + 4] = win[4 * c:4 * c + 4]
                    src_b, win = smem[r * wrow:r * wrow + 192], smem[16 * wrow + mrow * r:16 * wrow + mrow * r + 20]
                o = 2 * (u & 1) if offset is None else offset
                for s in range(16):
                    vals, scale, d = _q6_lane(words_of(src_b, win), o, tig, s)
                    bad += vals != list(q[r, sb, 16 * s + 4 * tig:16 * s + 4 * tig + 4]) or scale != sc[r, sb, s] \
                        or d != dbits[r, sb]
        return bad

    for tig in range(4):
        assert bad_lanes(False) == 0 and bad_lanes(True) == 0
    assert bad_lanes(False, offset=0) > 0


# -- the planner -----------------------------------------------------------------------------------

def _spec(model="synth:llama3-8b:Q4_K_M"):
    from memra.tune import launches as LS

    (spec,), missing = LS.model_specs((model,))
    assert not missing
    return spec


def _plans(spec, monkeypatch):
    from memra.gpu.plan import Planner

    monkeypatch.delenv("MEMRA_DECODE", raising=False)
    return Planner(spec, hybrid=True), Planner(spec, hybrid=True, decode="qf")


@pytest.mark.parametrize("model", ["synth:llama3-8b:Q4_K_M", "synth:tiny-llama:Q4_K_M"])
def test_generated_rows_convert_each_source_once_then_run_qf(model, monkeypatch):
    """Every Q4_K and Q6_K layer weight (half the 8B Q4_K_M's v and downs are Q6_K) takes qf in decode steps and
    steps of generated rows (to_qf of its source first; q/k/v weights or gate and up reading h share it); no
    quantize of ao, or of ff before a qf down; prompt steps and the head: the default plan's launches."""
    q8, qf = _plans(_spec(model), monkeypatch)
    assert not q8.qf_keys and qf.decode == "qf" and qf.use_tile
    layer = {w.key: w for w in qf.weights() if w.key != "output"}
    assert qf.qf_keys == {k for k, w in layer.items() if w.type in ("Q4_K", "Q6_K")} and qf.qf_keys
    assert any(layer[k].type == "Q6_K" for k in qf.qf_keys) or model.startswith("synth:tiny")
    for rows in (1, 8, 64):
        for steps in (qf.step(rows, decode=True, sampler="greedy"), qf.step(rows, decode=False, kinds="g")):
            assert sum(L.op == "qf" for L in steps) == len(qf.qf_keys)
            for i, L in enumerate(steps):
                if L.op != "qf":
                    continue
                j = i - 1
                while steps[j].op == "qf":
                    assert steps[j].args["src"] == L.args["src"] and steps[j].args["dst"] != L.args["src"]
                    j -= 1
                assert steps[j].op == "to_qf" and steps[j].args["src"] == L.args["src"], (L.name, steps[j].name)
                assert steps[j].args["K"] == int(L.shape["cols"]) and steps[j].rows == L.rows == rows
                assert L.kernel == ("qf_glu" if L.args["glu"] else "qf") and L.variant == "qf"
            for il in range(qf.cfg.n_layer):
                lw = qf.layer_weights(il)
                names = [L.name for L in steps if L.layer == il]
                assert (f"blk.{il}.ffn_q8" in names) == (lw["down"].key not in qf.qf_keys)
                assert f"blk.{il}.attn_q8" not in names
        tail = lambda s: s[max(i for i, L in enumerate(s) if L.layer == qf.cfg.n_layer - 1) + 1:]  # noqa: E731
        assert tail(qf.step(rows, decode=True, sampler="greedy")) == tail(q8.step(rows, decode=True, sampler="greedy"))
        assert qf.step(rows, decode=False, kinds="p") == q8.step(rows, decode=False, kinds="p")
    assert qf.qf_workspace([1, 8]) == (0, 0) and qf.qf_workspace([64])[0] > 0


def test_the_head_on_qf_is_opt_in_and_needs_no_split_workspace(monkeypatch):
    """MEMRA_QF_HEAD=1 puts the head (the 8B's 128,256 x 4,096 Q6_K) on qf too: its rows (a decode step's, the eager
    head's gathered ones) take to_qf then qf, no q8 twin of them is made, its 64-row qf_gemm does not split its
    chains across blocks (KSPLIT_N: a 131 MB workspace), so the plan's workspace is the layers' alone; by default the
    head keeps mv_q8's order."""
    from memra.gpu.modules import plan_launches
    from memra.tune import launches as LS

    spec = _spec()
    _, qf = _plans(spec, monkeypatch)
    without = LS.launch_set([spec])
    assert "output" not in {w.key for w in qf.weights() if w.key in qf.qf_keys} and qf.head_q8
    monkeypatch.setenv("MEMRA_QF_HEAD", "1")
    head = type(qf)(spec, hybrid=True, decode="qf")
    out = head._weights["output"][0]
    assert out.key in head.qf_keys and out.type == "Q6_K" and not head.head_q8
    assert head.qf_keys - {out.key} == qf.qf_keys
    for k in (1, 8, 9, 64):
        Ls = head.head(k, "greedy", src="hsel")
        assert [L.op for L in Ls] == ["to_qf", "qf", "argmax"] and Ls[0].args["src"] == "hsel"
        assert QF.launch_config(k, out.rows, out.cols, False).get("QF_KSPLIT", 0) == 0
    assert not any(L.name == "head_q8" for L in plan_launches(head, True))
    assert head.qf_workspace([1, 8, 16, 64, 128]) == qf.qf_workspace([1, 8, 16, 64, 128])
    step = head.step(64, decode=True, sampler="greedy")
    last = max(i for i, L in enumerate(step) if L.layer == spec.cfg.n_layer - 1)
    assert [L.op for L in step[last + 1:]][-3:] == ["to_qf", "qf", "argmax"]
    # kernel-check's launch set follows the environment: run with MEMRA_QF_HEAD=1 it adds the head's qf cases
    added = {k: c for k, c in LS.launch_set([spec]).items() if k not in without}
    assert added and all(c["family"] == "qf" and c["params"]["N"] == out.rows for c in added.values())


def test_the_flag_needs_hybrid_on_the_q8_path_and_a_bad_value_is_refused(monkeypatch, tiny_models):
    from memra.gpu.plan import Planner
    from memra.gpu.runner import Runner

    spec = _spec("synth:tiny-llama:Q4_K_M")
    monkeypatch.setenv("MEMRA_DECODE", "qf")
    assert Planner(spec, hybrid=True).qf_keys                         # read from the environment
    for kw in ({}, {"fa": True}, {"hybrid": True, "tile": False}, {"hybrid": True, "path": "f32"}):
        p = Planner(spec, **kw)
        assert not p.qf_keys and not any(L.op in ("qf", "to_qf") for L in p.step(8, decode=True)), kw
    monkeypatch.setenv("MEMRA_DECODE", "f16")
    with pytest.raises(MemraError, match="MEMRA_DECODE must be q8 or qf, got 'f16'"):
        Planner(spec, hybrid=True)
    with pytest.raises(MemraError, match="MEMRA_DECODE must be"):
        Runner(tiny_models("llama", "Q4_K_M"), gpu=FakeGpu(1 << 28), max_len=64, max_seqs=2)
    with pytest.raises(MemraError, match="decode must be q8 or qf"):
        Planner(spec, hybrid=True, decode="f16")


# -- the engine and kernel-check on the emulator ------------------------------------------------------

@pytest.mark.parametrize("t", QF.TYPES)
def test_a_gate_up_launch_case_whose_plain_oracle_takes_other_chains_checks(t):
    """A gate+up launch case at K = 4096 (two chains; the same rows as a plain weight would take four): its plain
    oracle runs in the glu kernel's chains, so the case checks instead of refusing its own chain count (kernel-check
    failed so on the device in session 56, the tiny models' gate+up weights having no such K)."""
    g = FakeGpu(1 << 27)
    cfg = QF.launch_config(16, 64, 4096, True, None, t)
    case = {"file": QF.KERNEL_FILE, "entry": "qf_gemm_glu", "defines": cfg, "bucket": 16, "tag": "K4096",
            "params": {"type": t, "N": 64, "K": 4096, "nb": 16, "glu": "silu", "res": False}}
    o = QF.check_launch(g, np.random.default_rng(7), case)
    assert o.ok, o.detail


def test_the_engine_with_qf_gives_the_references_tokens_batch_invariant(tiny_models, monkeypatch):
    """MEMRA_DECODE=qf on the emulated GPU (tests/gpu_emulator.py's models of to_qf and qf): the runner allocates the
    qf buffers, decode steps launch to_qf and both kernels (qf_mv alone, qf_gemm beside 9 others), a row's tokens are
    the same alone and in the batch, graph replay = eager launches, and the greedy tokens are the CPU reference's;
    the generated rows' bits differ from mv_q8's order's (another arithmetic)."""
    from test_runner_emulated import PROMPT, _reference_greedy, _runner

    from memra.gpu.runner import Row
    from memra.tune.invariance import batch_invariance, graph_vs_eager

    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_DECODE", "q8")
    default = _runner(path, attn="hybrid")
    assert default.xqf is None
    monkeypatch.setenv("MEMRA_DECODE", "qf")
    r = _runner(path, attn="hybrid")
    assert r.xqf is not None and r.xs2.size == r.xqf.size // 16
    launched = []
    real = r.g.launch
    r.g.launch = lambda k, *a, **kw: (launched.append(k.name), real(k, *a, **kw))[1]
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    assert {"to_qf", "qf_mv", "qf_mv_glu", "qf_gemm", "qf_gemm_glu"} <= set(launched)
    assert graph_vs_eager(_runner(path, attn="hybrid"), PROMPT, buckets=(1, 2, 4, 16))["identical"]

    def decoded(e):
        s = e.open()
        e.step([Row(s, PROMPT)])
        return np.stack([e.step([Row(s, [t], logits="last")])[0].logits for t in (5, 9, 300)]).view(np.uint32)

    assert not np.array_equal(decoded(_runner(path, attn="hybrid")), decoded(default))


def test_the_engine_with_the_head_on_qf_stays_batch_invariant(tiny_models, monkeypatch):
    """MEMRA_QF_HEAD=1 on the emulated GPU: the head's rows (the prompt's last in an eager step, generated rows in
    decode steps, 10 beside each other) run to_qf and qf, a row's tokens alone = among 9 others, graph replay =
    eager, the greedy tokens are the CPU reference's, and the logits differ from the q8 head's."""
    from test_runner_emulated import PROMPT, _reference_greedy, _runner

    from memra.gpu.runner import Row
    from memra.tune.invariance import batch_invariance, graph_vs_eager

    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_DECODE", "qf")
    body = _runner(path, attn="hybrid")
    monkeypatch.setenv("MEMRA_QF_HEAD", "1")
    r = _runner(path, attn="hybrid")
    assert "output" in r.plan.qf_keys
    shapes = []
    real = QF.qf
    monkeypatch.setattr(QF, "qf", lambda g, w, y, **kw: (shapes.append((w.rows, kw["nb"])), real(g, w, y, **kw))[1])
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    V = r.cfg.n_vocab
    assert {(V, 1), (V, 10)} <= set(shapes)   # the eager head alone and beside 9; decode steps' buckets beside
    assert graph_vs_eager(_runner(path, attn="hybrid"), PROMPT, buckets=(1, 2, 16))["identical"]

    def logits(e):
        s = e.open()
        return e.step([Row(s, PROMPT, logits="last")])[0].logits.view(np.uint32)

    assert not np.array_equal(logits(_runner(path, attn="hybrid")), logits(body))


def test_kernel_check_of_the_family_on_the_emulator(monkeypatch):
    """`memra kernel-check --only qf` on the emulator: its checks and the launch cases of the tiny model's plans pass
    (the references agree with the launch contracts; every grid passes the emulator's geometry check) and its four
    canaries (Q4_K's and Q6_K's dropped products, the reversed chain fold, to_qf's sum order) are caught."""
    from test_launch_set import _emulated_kernel_check

    from memra.tune import kernelcheck as KC

    report = {}
    lines = _emulated_kernel_check(monkeypatch, heap=3 << 29, only="qf", report=report)
    assert KC.all_green(lines), [ln for ln in lines if not ln.startswith("PASS")][:5]
    assert sum(" canary " in ln and "caught" in ln for ln in lines) == 4
    fam = report["families"]["qf"]
    assert fam["launch_cases"] > 0 and fam["checks"] > 15
    assert fam["files"] == ["act.cu", "qf.cu"]   # act_mul: the glu check's other side


def test_the_launch_set_holds_what_the_engine_loads(tiny_models, monkeypatch):
    """With MEMRA_DECODE=qf the launch set kernel-check builds (its hybrid plan with decode qf, whatever the
    environment) holds every module the emulated runner loads, and one case of each qf module passes its
    check_launch on the emulator."""
    from test_launch_set import PROMPT, _modules, _one_per_module, _recorded

    from memra.gpu.plan import ModelSpec
    from memra.gpu.runner import Row, Runner, Sampling
    from memra.model.gguf import open_gguf
    from memra.tune import launches as LS

    path = tiny_models("llama", "Q4_K_M")
    spec = ModelSpec.from_gguf(open_gguf(path), "llama")
    monkeypatch.delenv("MEMRA_DECODE", raising=False)
    monkeypatch.setenv("MEMRA_ATTN", "hybrid")
    cases = LS.launch_set([spec])
    mine = {k: c for k, c in cases.items() if c["family"] == "qf"}
    assert {c["entry"] for c in mine.values()} == {"to_qf", "qf_mv", "qf_mv_glu", "qf_gemm", "qf_gemm_glu"}
    monkeypatch.setenv("MEMRA_DECODE", "qf")
    g = FakeGpu(1 << 28)
    seen = _recorded(g)
    r = Runner(path, gpu=g, max_len=64, max_seqs=12)
    seqs = [r.open() for _ in range(10)]
    for s in seqs:
        r.step([Row(s, PROMPT[:4])])
    r.step([Row(seqs[0], [7], sample=Sampling(0.0))])
    r.step([Row(s, [7], sample=Sampling(0.0)) for s in seqs])
    assert {m[1] for m in seen} >= {"to_qf", "qf_mv", "qf_gemm"}
    missing = seen - _modules(LS.launch_set([spec], [r.tune_table]))
    assert not missing, sorted(missing)[:5]
    g, rng = FakeGpu(1 << 30), np.random.default_rng(0)
    for c in _one_per_module(mine):
        o = QF.check_launch(g, rng, c)
        assert o.ok, (c["entry"], c["defines"], o.name, o.detail)


# -- on the GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("arch, head", [("llama", "0"), ("gemma3", "0"), ("llama", "1")])
def test_on_the_gpu_a_row_alone_equals_among_63_and_graphs_equal_eager(arch, head, tiny_models, monkeypatch):
    """MEMRA_DECODE=qf on the device (the tiny synthetic Q4_K_M models: every llama weight in qf, gemma3's downs;
    with MEMRA_QF_HEAD=1 llama's Q6_K head too): a sequence's greedy tokens and logits are bit-identical alone and
    among 63 co-runners (qf_mv alone, qf_gemm in the batch: issue 11's isolation in this arithmetic), and a captured
    decode step replays its eager launches at every graph bucket."""
    from test_launch_set import PROMPT

    from memra.gpu.runner import Runner
    from memra.tune.invariance import batch_invariance, graph_vs_eager

    monkeypatch.setenv("MEMRA_DECODE", "qf")
    monkeypatch.setenv("MEMRA_QF_HEAD", head)
    monkeypatch.delenv("MEMRA_ATTN", raising=False)
    tok = ROOT / ".synthtok" / "smollm2-tokenizer.gguf"   # the device's (experiments/h200_common.sh), else the alias
    r = Runner(tiny_models(arch, "Q4_K_M", tokenizer_from=str(tok) if tok.is_file() else "smollm2-135m"),
               max_len=256, max_seqs=64)
    assert r.plan.qf_keys and ("output" in r.plan.qf_keys) == (head == "1"), arch
    res = batch_invariance(r, PROMPT, n_steps=24, co=63)
    assert res["identical"], f"{arch}: {res}"
    res = graph_vs_eager(r, PROMPT)
    assert res["identical"], f"{arch}: {res}"


def test_the_gates_match_with_qf_and_bite_on_a_batch_dependent_qf(tiny_models, monkeypatch):
    """`memra run`'s gate on the emulated engine with MEMRA_DECODE=qf: MATCH (generated rows batched = decoded one at a
    time, in qf's arithmetic); a qf whose outputs depend on the batch (a launch of several rows missing its last row's
    products) turns it red."""
    from test_gates import PROMPT

    from memra.gpu import gate as G
    from memra.gpu.engine import GPUEngine

    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_DECODE", "qf")
    path = tiny_models("llama", "Q4_K_M")
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid")
    assert eng.plan.qf_keys
    x, _ = G.cross_check(eng, PROMPT)
    assert x.verdict == "MATCH", x.line()
    real = QF.qf

    def short(g, w, y, *, nb, **kw):  # a launch's last row left out when it has several
        real(g, w, y, nb=nb - 1 if nb > 1 else nb, **kw)

    monkeypatch.setattr(QF, "qf", short)
    x, _ = G.cross_check(GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid"), PROMPT)
    assert x.verdict == "MISMATCH" and G.failed(x), x.line()
