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
