"""experiments/f16_decode/v17/qf.cu: kernels/qf.cu with qf_gemm's cp.async staging planned once a thread (v17), prepared
for a device A/B (experiments/f16_decode/v17/ab.py). Its claim is that every staged byte lands where v16 put it — so the
outputs are v16's bit for bit — with fewer instructions a superblock. Here, on the CPU: the copy differs from the engine
kernel only in the staging, it builds (NVRTC) for both weight types, and a replay of both staging plans (the thread and
lane arithmetic of each, written out from the source) gives the same shared-memory image of every stage: activations,
sums and weights, for every tile width, warp count, partial activation tile, glu and plain, Q4_K and Q6_K; a plan
that drops a piece or shifts a row is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from memra.gpu.ops import qf as QF

ROOT = Path(__file__).resolve().parent.parent
V17 = ROOT / "experiments" / "f16_decode" / "v17" / "qf.cu"
ENGINE = ROOT / "kernels" / "qf.cu"
START, END = "    auto stage_x = [&](int i, int s) {", "    auto stage = [&](int i, int s) {"


def _regions(lines: list[str], marks: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """[first, last] line ranges, each from the first line holding its start mark to the next line holding its end mark."""
    out = []
    for a, b in marks:
        i = next(k for k, ln in enumerate(lines) if a in ln)
        out.append((i, next(k for k in range(i, len(lines)) if b in lines[k])))
    return out


def test_the_copy_is_the_engine_kernel_but_its_changes():
    """kernels/qf.cu and the copy differ only in the header's variant history (v17's line), qf_mv's activation loads
    (one address a superblock, unpredicated) and qf_gemm's staging: a faithful A/B, and landing it is a copy."""
    import difflib

    v16, v17 = ENGINE.read_text().splitlines(), V17.read_text().splitlines()
    inc, endif = '#include "common.cuh"', "#endif"
    ok16 = _regions(v16, [("qf.cu — the", inc), ("const int sb = sb0 + i + r;", endif), (START.strip(), END.strip())])
    ok17 = _regions(v17, [("qf.cu — the", inc), ("const int sb = sb0 + i + r;", endif),
                          ("// v17: each thread's copies planned once", END.strip())])
    inside = lambda i, j, regs: all(any(a <= k <= b for a, b in regs) for k in range(i, j))  # noqa: E731
    changes = [op for op in difflib.SequenceMatcher(None, v16, v17, autojunk=False).get_opcodes() if op[0] != "equal"]
    assert changes
    for tag, i1, i2, j1, j2 in changes:
        assert inside(i1, i2, ok16) and inside(j1, j2, ok17), (tag, v16[i1:i2][:3], v17[j1:j2][:3])
    assert any("//  v17 (session 57" in ln for ln in v17[:ok17[0][1]])


@pytest.mark.parametrize("t", QF.TYPES)
def test_it_builds(t, tmp_path):
    """NVRTC (no GPU): the v17 copy at the engine's 64-row configurations, glu and plain, and on the register ring's
    path (every variant of QF.compile_variants built once by hand in session 57: 51, none failed)."""
    import shutil

    from memra.gpu.compile import compile_cubin

    for f in (ROOT / "kernels").glob("*.cuh"):
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(V17, tmp_path / "qf.cu")
    ring = {"QF_GWARPS": 4, "QF_NT": 1, "QF_STAGES": 2, "QF_KSPLIT": 0, "QF_WSMEM": 0}   # the register ring's path
    for nb, N, K, glu, over in ((64, 1024, 4096, False, None), (64, 4096, 14336, False, None),
                                (16, 512, 4096, True, None), (9, 64, 1024, False, ring)):
        cfg = QF.launch_config(nb, N, K, glu, over, t)
        assert compile_cubin("qf.cu", "sm_90a", cfg, root=tmp_path)


# -- the staging plans, replayed -------------------------------------------------------------------------------------

def _x_v16(R, GW, c0, nb, xrow):
    """{staged half offset: (row, element) or None (zero-filled)} of stage_x's activations, v16: k = tid .. R 32 step
    32 GW, r = k >> 5, c = k & 31."""
    out = {}
    for tid in range(32 * GW):
        for k in range(tid, R * 32, 32 * GW):
            r, c = k >> 5, k & 31
            row = c0 + r
            for e in range(8):
                out[r * xrow + 8 * c + e] = (row, 8 * c + e) if row < nb else None
    return out


def _x_v17(R, GW, c0, nb, xrow):
    """v17: thread (warp, lane)'s copy j: staged row warp + GW j < R, piece lane; rows >= nb zero-filled."""
    out = {}
    XCP = -(-R // GW)
    for warp in range(GW):
        for lane in range(32):
            xn = sum(1 for j in range(XCP) if warp + GW * j < R and c0 + warp + GW * j < nb)
            for j in range(XCP):
                if warp + GW * j >= R:
                    break
                r = warp + GW * j
                dst = warp * xrow + 8 * lane + GW * xrow * j
                assert dst == r * xrow + 8 * lane
                row = c0 + r if j < xn else None
                for e in range(8):
                    out[dst + e] = (row, 8 * lane + e) if row is not None else None
    return out


def _s_v16(R, GW, c0, nb):
    out = {}
    for tid in range(32 * GW):
        for k in range(tid, R * 4, 32 * GW):
            r, c = k >> 2, k & 3
            row = c0 + r
            for e in range(4):
                out[r * 16 + 4 * c + e] = (row, 4 * c + e) if row < nb else None
    return out


def _s_v17(R, GW, c0, nb):
    out = {}
    SCP = -(-4 * R // (32 * GW))
    for tid in range(32 * GW):
        ks = [tid + 32 * GW * j for j in range(SCP)]
        sn = sum(1 for k in ks if k < 4 * R and c0 + (k >> 2) < nb)
        for j, k in enumerate(ks):
            if k >= 4 * R:
                break
            row = c0 + (k >> 2) if j < sn else None
            for e in range(4):   # dst 16 k bytes = 4 k floats; src row's 4 (k & 3) ..
                out[4 * k + e] = (row, 4 * (k & 3) + e) if row is not None else None
    return out


def _w_v16(t, glu, N, n0):
    """{staged byte offset of a warp's stage: (weight row, 'bulk' | 'meta', byte in the superblock's bulk / window)}."""
    _, wrow, mrow = QF.GEOM[t]
    out = {}
    rows = lambda q: n0 + q if q < 8 else ((N + n0 + q - 8) if glu else n0 + q)  # noqa: E731
    if t == 14:
        for k in range(16 * 12):
            q, c = k // 12, k % 12
            for e in range(16):
                out[q * wrow + 16 * c + e] = (rows(q), "bulk", 16 * c + e)
        for k in range(16 * 5):
            q, c = k // 5, k % 5
            for e in range(4):
                out[16 * wrow + mrow * q + 4 * c + e] = (rows(q), "meta", 4 * c + e)
    else:
        for k in range(16 * 9):
            q, c = k // 9, k % 9
            for e in range(16):
                out[(q * wrow + 16 * c if c < 8 else 16 * wrow + 16 * q) + e] = \
                    (rows(q), "bulk" if c < 8 else "meta", (16 * c if c < 8 else 0) + e)
    return out


def _w_v17(t, glu, N, n0, shift=0):
    _, wrow, mrow = QF.GEOM[t]
    bulk = 192 if t == 14 else 128
    out = {}
    for lane in range(32):
        wq, wh = lane & 15, lane >> 4
        wrow_ = n0 + wq if wq < 8 else ((N + n0 + wq - 8) if glu else n0 + wq)
        wrow_ += shift   # (a slipped row, for the test that the replay bites)
        wdl = wq * wrow + 16 * wh
        wml = 16 * wrow + mrow * wq + (12 * wh if t == 14 else 0)
        for j in range(bulk // 32):
            for e in range(16):
                out[wdl + 32 * j + e] = (wrow_, "bulk", 16 * wh + 32 * j + e)
        if t == 14:
            for c in range(3):
                if 3 * wh + c < 5:
                    for e in range(4):
                        out[wml + 4 * c + e] = (wrow_, "meta", 12 * wh + 4 * c + e)
        elif wh == 0:
            for e in range(16):
                out[wml + e] = (wrow_, "meta", e)
    return out


@pytest.mark.parametrize("nt", [1, 2, 4, 8])
@pytest.mark.parametrize("gw", [1, 2, 4, 8, 16])
def test_the_activation_and_sum_stages_are_v16s(nt, gw):
    R = 8 * nt
    for t in QF.TYPES:
        xrow = QF.GEOM[t][0]
        for c0, nb in ((0, R), (R, R + 3), (0, 1), (2 * R, 5 * R)):
            assert _x_v17(R, gw, c0, nb, xrow) == _x_v16(R, gw, c0, nb, xrow), (t, c0, nb)
            if t == 12:
                assert _s_v17(R, gw, c0, nb) == _s_v16(R, gw, c0, nb), (c0, nb)


@pytest.mark.parametrize("t", QF.TYPES)
def test_the_weight_stages_are_v16s_and_a_slipped_row_or_a_dropped_piece_is_caught(t):
    for glu, N, n0 in ((False, 64, 16), (True, 64, 8), (False, 4096, 4080), (True, 14336, 0)):
        assert _w_v17(t, glu, N, n0) == _w_v16(t, glu, N, n0), (t, glu, N, n0)
    assert _w_v17(t, False, 64, 16, shift=1) != _w_v16(t, False, 64, 16)
    xrow = QF.GEOM[t][0]
    x = _x_v17(32, 8, 0, 32, xrow)
    del x[5 * xrow + 8]
    assert x != _x_v16(32, 8, 0, 32, xrow)


def test_the_replays_cover_every_staged_byte_once():
    """The plans' images have no holes: every activation half of the R staged rows, every sum, every byte of a
    warp's 16 rows and their meta (Q6_K: the 20-byte window) is written."""
    assert len(_x_v17(32, 8, 0, 32, 288)) == 32 * 256 and len(_s_v17(32, 8, 0, 32)) == 32 * 16
    assert len(_w_v17(12, False, 64, 0)) == 16 * 128 + 16 * 16
    assert len(_w_v17(14, False, 64, 0)) == 16 * 192 + 16 * 20
