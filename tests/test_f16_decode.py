"""experiments/f16_decode: the generated chained copy of kernels/gemm_f16_wg.cu still applies to the engine's kernel
(every anchor found once) and builds for sm_90a with kernels/ untouched; mv_f16.cu builds; mv_f16's index arithmetic,
replayed on the CPU, sums every output's k terms exactly once (and a slipped store index is caught); mv_qf.cu builds
and qf_probe.py's tile layout puts every byte where mv_qf's loads read it."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXP = ROOT / "experiments" / "f16_decode"


def _load(name: str, path: Path):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(path.parent))


def _compile(src: Path, defines: dict, default_device: bool = False) -> bytes:
    """experiments/gemm_tile/tile.py's compile_module (memra's NVRTC options for sm_90a, -I kernels/ and the file's
    folder), the cubin alone."""
    tile = _load("gemm_tile_tile", ROOT / "experiments" / "gemm_tile" / "tile.py")
    return tile.compile_module(defines, src, default_device=default_device)[0]


def test_the_chained_copy_applies_and_builds(tmp_path):
    before = {p.name: p.read_bytes() for p in (ROOT / "kernels").iterdir() if p.is_file()}
    wgc = _load("f16_decode_wgc", EXP / "wgc.py")
    dst = wgc.generate(tmp_path / "gemm_f16_wgc.cu")
    text = dst.read_text()
    assert "fold_chains" in text and "NSC" in text
    assert _compile(dst, {"MV_TYPE": 12, "WG_BN": 64}, default_device=True)
    assert _compile(dst, {"MV_TYPE": 14, "WG_BN": 64, "WGC_AHEAD": 1}, default_device=True)
    assert {p.name: p.read_bytes() for p in (ROOT / "kernels").iterdir() if p.is_file()} == before


def test_mv_f16_builds():
    assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": 14, "MF_WARPS": 8, "MF_CHAINS": 4, "MF_DEPTH": 2})
    assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": 2, "MF_H2": 1})
    for t in (12, 14):   # f16x2 K-quants with pre-rounded scales, activations in fragment order
        assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": t, "MF_H2": 2, "MF_XP": 1})
        assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": t, "MF_DF": 1, "MF_DEPTH": 2, "MF_PF": 8})
        assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": t, "MF_XP": 1, "MF_DEPTH": 2, "MF_MINB": 8})
        assert _compile(EXP / "mv_f16.cu", {"MV_TYPE": t, "MF_DF": 2, "MF_DEPTH": 2})


def test_mv_f16_index_replay():
    ic = _load("f16_decode_index_check", EXP / "index_check.py")
    for W, C in ((4, 1), (8, 4)):
        for tname, glu in (("Q4_K", True), ("Q6_K", False)):
            assert ic.check(tname, W, C, glu, N=32, K=256 * C, nb=3) == []
            assert ic.check(tname, W, C, glu, N=32, K=256 * C, nb=3, xp=True) == []   # MF_XP's x order
            assert ic.check(tname, W, C, glu, N=32, K=256 * C, nb=3, df=True) == []   # v4's fragments
            assert ic.check_df2(tname, C, glu, N=32, K=256 * C, nb=3) == []           # v7: weights as B
    # a slipped index must show: group 0 of every unit stored over group 1
    real = ic.goff
    try:
        ic.goff = lambda t, u, g: real(t, u, g) + (16 if g == 0 else 0)   # group 0 stored over group 1
        assert ic.check("Q4_0", 4, 1, False, N=16, K=256, nb=1) != []
        assert ic.check_df2("Q4_0", 1, False, N=16, K=256, nb=1) != []
    finally:
        ic.goff = real


def test_mv_qf_builds():
    """mv_qf.cu (session 53's integer-weight arithmetic): v8, v9, v11 with the tile layout and v12's prefetch."""
    src = EXP / "mv_qf.cu"
    assert _compile(src, {"MQ_WARPS": 4, "MQ_CHAINS": 1})
    assert _compile(src, {"MQ_WARPS": 4, "MQ_CHAINS": 4, "MQ_WA": 1, "MQ_SUBN": 1, "MQ_SHARE": 1})
    assert _compile(src, {"MQ_WARPS": 4, "MQ_CHAINS": 2, "MQ_WA": 1, "MQ_TL": 2, "MQ_PF": 2, "MQ_XV": 1})


def test_mv_qf_tile_layout_matches_the_kernels_addresses():
    """qf_probe.py's tile_layout / tile_meta (the host side of MQ_TL 1 / 2) put every byte where mv_qf.cu's loads
    look for it: lane (gid, tig) of tile t reads rows gid and gid + 8 (glu: output n0 + gid's gate and up rows) at
    t nsb 2048 + 512 tig + 16 gid + 128 r + sb 2048 + 256 (j >> 1) + 8 (j & 1) for pair j, and their meta at
    t nsb 256 + 16 gid + 128 r + 256 sb; a permuted row order is caught."""
    import numpy as np

    qp = _load("f16_decode_qf_probe", EXP / "qf_probe.py")
    rng = np.random.default_rng(0)

    def misplaced(tl, tm, bulk, meta, N, nsb, glu):
        bad = 0
        for tile in range((2 * N if glu else N) // 16):
            n0 = tile * (8 if glu else 16)
            for gid in range(8):
                rows = (n0 + gid, (N + n0 + gid) if glu else n0 + gid + 8)
                for tig in range(4):
                    for sb in range(nsb):
                        for r, row in enumerate(rows):
                            base = tile * nsb * 2048 + 512 * tig + 16 * gid + 128 * r + sb * 2048
                            for j in range(4):
                                o, w = base + 256 * (j >> 1) + 8 * (j & 1), sb * 128 + 32 * j + 8 * tig
                                bad += int((tl[o:o + 8] != bulk[row, w:w + 8]).any())
                            mo = tile * nsb * 256 + 16 * gid + 128 * r + 256 * sb
                            bad += int((tm[mo:mo + 16] != meta[row, 16 * sb:16 * sb + 16]).any())
        return bad

    for glu in (True, False):
        N, K = 32, 512
        rows, nsb = (2 * N if glu else N), K // 256
        bulk = rng.integers(0, 256, (rows, nsb * 128), dtype=np.uint8)
        meta = rng.integers(0, 256, (rows, nsb * 16), dtype=np.uint8)
        tl, tm = qp.tile_layout(bulk, N, K, glu), qp.tile_meta(meta, N, K, glu)
        assert misplaced(tl, tm, bulk, meta, N, nsb, glu) == 0
        assert misplaced(qp.tile_layout(bulk[::-1].copy(), N, K, glu), tm, bulk, meta, N, nsb, glu) > 0


def test_qf2_builds():
    """qf.cu (session 54's v14): the one-row kernel and the GEMM, chains parked and split across blocks (qf2_probe.py's
    modules)."""
    src = EXP / "qf.cu"
    assert _compile(src, {"QF_WARPS": 4, "QF_CHAINS": 1})
    assert _compile(src, {"QF_WARPS": 8, "QF_CHAINS": 8, "QF_NT": 4, "QF_STAGES": 3, "QF_KSPLIT": 1})


def test_qf2_producer_puts_each_fragment_where_a_lane_loads_it():
    """qf2_probe.py's producer (the activation contract of qf.cu's to_qf): lane (gid, tig)'s 16 bytes at element 8 tig of a
    32-element sub-block are its two k16 steps' B fragments (e0 e2 | e1 e3 | e4 e6 | e5 e7); its 16 bytes at float
    16 sb + 4 tig of a row's sums are (hi, hi, lo, lo) of sub-blocks tig and tig + 4 (the tf32 mma's b0 / b1), hi a
    tf32 value and hi + lo within 2^-21 of to_qf2's f32 sum (and the reference's S2 exactly)."""
    import numpy as np

    qp = _load("f16_decode_qf2_probe", EXP / "qf2_probe.py")
    rng = np.random.default_rng(1)
    nb, K = 3, 512
    x = (rng.standard_normal((nb, K)) * 3).astype(np.float32)
    xq, xs2, xh, s2ref = qp.producer(x)
    f = np.float32

    def s2_of(b, sub):   # to_qf2's order: each 8 in increasing k, then (s0 + s1) + (s2 + s3)
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
                assert (got.view(np.uint16) == e[[0, 2, 1, 3, 4, 6, 5, 7]].view(np.uint16)).all()
        for sb in range(K // 256):
            for tig in range(4):
                hi0, hi4, lo0, lo4 = xs2[b, 16 * sb + 4 * tig:16 * sb + 4 * tig + 4]
                for v_hi, v_lo, sub in ((hi0, lo0, 8 * sb + tig), (hi4, lo4, 8 * sb + tig + 4)):
                    assert (np.float32(v_hi).view(np.uint32) & 0x1FFF) == 0
                    want = float(s2_of(b, sub))
                    assert abs(float(v_hi) + float(v_lo) - want) <= abs(want) * 2 ** -21
                    assert float(v_hi) + float(v_lo) == s2ref[b, sub]


def test_qf_wsmem_stage_puts_each_weight_byte_where_the_lane_reads_it():
    """qf.cu's QF_WSMEM staging, replayed: stage_w's copies (lane k of 16 x 9: row q's 16-byte chunk c < 8 at q
    QF_WROW + 16 c, its meta at 16 QF_WROW + 16 q; row q < 8 the row of ra = n0 + q, else of rb: glu N + n0 + q - 8,
    plain n0 + q) against the step's reads (w[0][j] at gid QF_WROW + 32 j + 8 tig, w[1][j] at (gid + 8) QF_WROW + ..,
    the meta at 16 QF_WROW + 16 gid / 16 (gid + 8)): every lane gets its own rows' bytes; a slipped row map is
    caught."""
    import re

    import numpy as np

    src = (EXP / "qf.cu").read_text()
    wrow = int(re.search(r"#define QF_WROW (\d+)", src).group(1))
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

    for glu in (True, False):
        assert replay(32, 3, glu, 1, 2, kernel_rows) == 0
        assert replay(32, 3, glu, 1, 2, lambda q, n0, N, g: kernel_rows(q ^ 1, n0, N, g)) > 0
    # the kernel's own row map, as written in stage_w
    assert "const int row = q < 8 ? T.n0 + q : (GLU ? N + T.n0 + q - 8 : T.n0 + q);" in src
    assert "cp16(wd + (c < 8 ? q * QF_WROW + 16 * c : 16 * QF_WROW + 16 * q), src);" in src
    assert "w[0][j] = *reinterpret_cast<const uint2*>(wb + gid * QF_WROW + 32 * j + 8 * tig);" in src
    assert "w[1][j] = *reinterpret_cast<const uint2*>(wb + (gid + 8) * QF_WROW + 32 * j + 8 * tig);" in src
    assert "compute(i, w, *reinterpret_cast<const uint4*>(wb + 16 * QF_WROW + 16 * gid)," in src
    assert "*reinterpret_cast<const uint4*>(wb + 16 * QF_WROW + 16 * (gid + 8)));" in src
