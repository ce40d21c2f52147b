#!/usr/bin/env python3
"""tile.py — gemm_tile.cu (the free-order Q4_K tile prototype) against float64 and memra's gemm.

    python3 experiments/gemm_tile/tile.py --compile-only   # CPU: NVRTC every module, regs / spills / smem
    python3 experiments/gemm_tile/tile.py --dry-run        # CPU: the data preparation and references of
                                                           # the device run (smaller K unless --full),
                                                           # and the numpy model of the kernel's index maps
    python3 experiments/gemm_tile/tile.py                  # device (H200): checks, then timing

Device run (experiments/gemm_tile/ab.sh calls it): random valid Q4_K weights (memra's
MV.random_weight), uploaded with memra's MV.upload_weight (planes), activations quantized on the
device by memra's quantize_q8 (bit-identical to quantize_q8_ref). Checks: every prototype
configuration, glu (y = silu(gate) * up, gate and up stacked as memra's glu weight) and plain,
on a small shape with partial batch tiles and on the 8B shapes (Q4_K glu 2x14336x4096, Q4_K
4096x14336) at 128 and 512 rows (the float64 reference on a subset of output rows: the first and
last REF_ROWS outputs, every column), y poisoned (NaN) first. Criterion: relative L2 error
||y - ref|| / ||ref|| <= TOL = 1e-5 (memra's matvec / gemm TOL; float32 accumulation of 128
k32 terms, ~1e-6 expected) and every output finite. memra's gemm is checked on the same subset
(its own TOL). Timing: CUDA events around each launch, weights rotated over copies > 3x the
60 MB L2, median of --reps; the prototype configurations and memra's gemm (2,2,2,4,1,3,1,1 and
memra's built-in configuration for the batch) at 128 and 512 rows. JSON lines to
$OUT/gemm-tile.jsonl; a table at the end. Exit 1 on a failed check, 2 on an error.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
SRC = HERE / "gemm_tile.cu"
ARCH = "sm_90a"
Q4_K = 12
TOL = 1e-5
REF_ROWS = 384            # outputs checked at each end of an 8B shape (float64 reference)
L2_BYTES = 60 << 20

# (name, defines) of the prototype configurations: GT_WM x GT_WN warps of 64 x 32 outputs
CONFIGS = (
    ("2,4,3", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3}),    # BM 128 x BN 128, 8 warps
    ("2,2,3", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}),    # BM 128 x BN 64, 4 warps
    ("1,4,4", {"GT_WM": 1, "GT_WN": 4, "GT_STAGES": 4}),    # BM 64 x BN 128, 4 warps
    ("4,2,2", {"GT_WM": 4, "GT_WN": 2, "GT_STAGES": 2}),    # BM 256 x BN 64, 8 warps
    # GT_MINTC: the min term (sum_j ndmm sx, per stage) on the tensor cores as 3xTF32 m16n8k8
    ("2,4,3 tc", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1}),
    ("2,2,3 tc", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_MINTC": 1}),
    # GT_MAGIC (with GT_MINTC): the IMMA starts from 12582912.0f's bits, fl(I dsc) in one FFMA
    ("2,4,3 tcm", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}),
    ("2,2,3 tcm", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}),
)
# memra's gemm configurations timed beside it (GM_WM..GM_MINB); None = memra's built-in one for nb
MEMRA_CFGS = ("2,2,2,4,1,3,1,1", None)
GM_KEYS = ("GM_WM", "GM_WN", "GM_TM", "GM_TN", "GM_WK", "GM_STAGES", "GM_LREG", "GM_MINB")
# 8B shapes: (name, rows of the weight, K, glu, split-K counts timed). The split count is a
# property of the shape (K), never of the batch: a row's bits do not depend on nb.
SHAPES = (("Q4_K glu 2x14336x4096", 2 * 14336, 4096, True, (1,)),
          ("Q4_K 4096x14336", 4096, 14336, False, (1, 4)))
NBS = (128, 512)
# --mock (CPU emulation of the launches): the same code path on smaller weights
MOCK_SHAPES = (("mock glu 2x1024x1024", 2 * 1024, 1024, True, (1,)), ("mock 512x4096", 512, 4096, False, (1, 4)))


# ---------------------------------------------------------------------------------------
# the launch contract (gemm_tile.cu)

def tiles(defs: dict) -> tuple[int, int, int]:
    """(BM weight rows, BN columns, threads) of a configuration."""
    wm, wn = int(defs.get("GT_WM", 2)), int(defs.get("GT_WN", 4))
    return 64 * wm, 32 * wn, 32 * wm * wn


def smem_bytes(defs: dict) -> int:
    bm, bn, _ = tiles(defs)
    ns = int(defs.get("GT_STAGES", 3))
    ts = 272
    sc = 12 if int(defs.get("GT_MINTC", 0)) else 8
    rsc = 16 if int(defs.get("GT_MAGIC", 0)) else sc
    return 2 * bm * ts + 2 * 8 * bm * rsc + 2 * 8 * bn * sc + ns * bn * ts


def launch_shape(defs: dict, rows: int, K: int, nb: int, glu: bool, ks: int = 1):
    bm, bn, nt = tiles(defs)
    N = rows // 2 if glu else rows
    obm = bm // 2 if glu else bm
    if K % (256 * ks) or N % obm or nb < 1:
        raise ValueError(f"gemm_tile: K = {K} must be a multiple of 256 x ks = {ks} and N = {N} of {obm}")
    if smem_bytes(defs) > 232448 or int(defs.get("GT_WN", 4)) < 2:
        raise ValueError(f"gemm_tile: configuration {defs} does not fit (smem {smem_bytes(defs)}, GT_WN >= 2)")
    return (N // obm, -(-nb // bn), ks), (nt, 1, 1), smem_bytes(defs)


# ---------------------------------------------------------------------------------------
# compile

def compile_module(defs: dict, src: Path = SRC, default_device: bool = False) -> tuple[bytes, str]:
    """A prototype's .cu (gemm_tile.cu unless `src`) through NVRTC with memra's options
    (memra.gpu.compile.options_for: sm_90a, c++17, -lineinfo, -I kernels/) plus -I its folder and
    ptxas -v; (cubin, log). The other prototypes' host scripts compile through this too. default_device:
    -default-device (NVRTC 12.x takes a generic lambda inside a kernel for a host function without it)."""
    from cuda.core import Program, ProgramOptions

    opts = ProgramOptions(name=src.name, arch=ARCH, std="c++17", lineinfo=True,
                          include_path=[str(ROOT / "kernels"), str(src.parent)],
                          define_macro=[(k, str(v)) for k, v in sorted(defs.items())] or None,
                          ptxas_options=["-v"], device_as_default_execution_space=default_device or None)
    log = io.StringIO()
    obj = Program(src.read_text(), "c++", opts).compile("cubin", logs=log)
    return bytes(obj.code), log.getvalue()


def prebuilt_module(g, cache: dict, k, kernel_file: str, defines: dict, cubin, mock: bool = False):
    """memra's Module of a cubin built outside memra.gpu.compile (a generated kernel copy), cached in
    `cache` under the caller's key k; cubin: a callable giving the bytes, called once (mock: g.module)."""
    if k not in cache:
        if mock:
            cache[k] = g.module(kernel_file, defines)
        else:
            from memra.gpu.cuda import Module
            cache[k] = Module(g, kernel_file, defines, cubin())
    return cache[k]


def ptxas_info(log: str, fn: str) -> tuple[int, int]:
    import re
    part = log.split(f"Compiling entry function '{fn}'")[1]
    r = int(re.search(r"Used (\d+) registers", part).group(1))
    sp = re.search(r"(\d+) bytes spill stores", part)
    return r, int(sp.group(1)) if sp else 0


def _compile_one(item):
    name, defs = item
    cub, log = compile_module(defs)
    return name, cub, {fn: ptxas_info(log, fn) for fn in ("gemm_tile", "gemm_tile_glu")}


def compile_all(workers: int) -> dict:
    """{config name: (cubin, {fn: (regs, spill bytes)})} (processes, before any CUDA context);
    raises on a compile error."""
    out = {}
    with ProcessPoolExecutor(max(1, min(workers, len(CONFIGS)))) as ex:
        for name, cub, info in ex.map(_compile_one, CONFIGS):
            out[name] = (cub, info)
    return out


# ---------------------------------------------------------------------------------------
# host data and references

def q8_dequant(x: np.ndarray) -> np.ndarray:
    """float64 values of quantize_q8_ref(x): d * q per 32."""
    from memra.gpu.q8 import quantize_q8_ref
    nb, K = x.shape
    q, s = quantize_q8_ref(x)
    return (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)


def ref_rows(raw: np.ndarray, glu: bool, xv: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """float64 reference y[:, outs] (outs: output rows; glu: silu(gate) * up)."""
    from memra.gpu.ops import matvec as MV
    N = raw.shape[0] // 2 if glu else raw.shape[0]
    rows = np.concatenate([outs, N + outs]) if glu else outs
    wf = MV.dequant_rows(raw[rows], Q4_K).astype(np.float64)
    return MV.matvec_ref(wf, xv, None, "silu" if glu else None)


def subset(N: int) -> np.ndarray:
    k = min(REF_ROWS, N // 2)
    return np.concatenate([np.arange(k), np.arange(N - k, N)])


def make_x(rng, nb: int, K: int) -> np.ndarray:
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    x[0, :32] = 0.0   # an all-zero q8 block (d = 0, s = 0)
    return x


# ---------------------------------------------------------------------------------------
# numpy model of the kernel's index maps (CPU): staging, permutations, ldmatrix, mma fragments

def model_block(raw: np.ndarray, q: np.ndarray, xsd: np.ndarray, xss: np.ndarray, defs: dict, glu: bool,
                ob: int, cb: int, nb: int) -> np.ndarray:
    """One block's outputs computed by replaying gemm_tile.cu's data movement: store_w's unpack
    into the 272-stride tile and its rperm / cperm scalars, ldmatrix.x4 lane addresses, the
    m16n8k32 fragment layouts and the epilogue's row / column maps; the float formula in float64.
    raw: GGUF rows, q: int8 activations [nb, K], xsd / xss: their d / s [nb, K/32].
    Returns {(row, col): value}."""
    from memra.gpu.ops.matvec import pack_planes
    BM, BN, NT = tiles(defs)
    WM, WN = BM // 64, BN // 32
    mintc = bool(int(defs.get("GT_MINTC", 0)))
    rows, K = raw.shape[0], q.shape[1]
    # the loaders' thread -> chunk maps cover every chunk once (weights 8 a row, x 16 a column, scales 4)
    WCH, XCH, SCH1 = BM * 8 // NT, BN * 16 // NT, max(1, BN * 4 // NT)
    wc = sorted(8 * ((WCH * t) >> 3) + ((WCH * t) & 7) + i for t in range(NT) for i in range(WCH))
    xc = sorted(16 * ((XCH * t) >> 4) + ((XCH * t) & 15) + i for t in range(NT) for i in range(XCH))
    sc_ = sorted(SCH1 * t + i for t in range(NT) for i in range(SCH1) if SCH1 * t + i < BN * 4)
    assert wc == list(range(BM * 8)) and xc == list(range(BN * 16)) and sc_ == list(range(BN * 4))
    N = rows // 2 if glu else rows
    bulk, meta = pack_planes(raw, Q4_K)
    TS = 272

    def wrow(r):
        if not glu:
            return ob + r
        w, l = r >> 6, r & 63
        return (0 if l < 32 else N) + ob + 32 * w + (l & 31)

    def rperm(r):
        w, l = r >> 6, r & 63
        return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1)

    def cperm(c):
        w, l = c >> 5, c & 31
        return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1)

    acc = np.zeros((WM * WN, 32, 4, 4, 4))
    for sb in range(K // 256):
        wt = np.zeros(BM * TS, np.uint8)
        rs = np.zeros((8, BM, 2))
        cs = np.zeros((8, BN, 2))
        cmin = np.zeros((8, BN))   # GT_MINTC: sx at the B-fragment permutation 4 g + ni
        for c in range(BM * 8):           # store_w's chunks
            r, part = c >> 3, c & 7
            v = bulk[wrow(r), 128 * sb + 16 * part: 128 * sb + 16 * part + 16]
            o = r * TS + 64 * (part >> 1) + 16 * (part & 1)
            wt[o:o + 16] = v & 15
            wt[o + 32:o + 48] = v >> 4
        for t in range(BM):
            m = meta[wrow(t), 16 * sb: 16 * sb + 16].astype(np.int64)
            d = float(np.frombuffer(bytes(m[0:2].astype(np.uint8)), "<f2")[0])
            dmin = float(np.frombuffer(bytes(m[2:4].astype(np.uint8)), "<f2")[0])
            for j in range(8):
                if j < 4:
                    sc, mn = m[4 + j] & 63, m[8 + j] & 63
                else:
                    sc = (m[8 + j] & 0xF) | ((m[j] >> 6) << 4)
                    mn = (m[8 + j] >> 4) | ((m[4 + j] >> 6) << 4)
                rs[j, rperm(t)] = (d * sc, -(dmin * mn))
        for c in range(BN * 4):
            col, j = c >> 2, 2 * (c & 3)
            cc = min(cb + col, nb - 1)
            for jj in (j, j + 1):
                dx = float(xsd[cc, 8 * sb + jj])
                cs[jj, cperm(col)] = (dx, dx * float(xss[cc, 8 * sb + jj]))
                cmin[jj, 32 * (col >> 5) + 4 * (col & 7) + ((col >> 3) & 3)] = dx * float(xss[cc, 8 * sb + jj])
        xt = np.zeros(BN * TS, np.int8)
        for c in range(BN * 16):          # load_x's chunks
            col, part = c >> 4, c & 15
            cc = min(cb + col, nb - 1)
            xt[col * TS + 16 * part: col * TS + 16 * part + 16] = q[cc, 256 * sb + 16 * part: 256 * sb + 16 * part + 16]
        wts = wt.view(np.int8)
        for warp in range(WM * WN):
            wm, wn = warp // WN, warp % WN
            lanes = np.arange(32)
            a_off = (wm * 64 + (lanes & 7) + 8 * ((lanes >> 3) & 1)) * TS + 16 * (lanes >> 4)
            b_off = (wn * 32 + (lanes & 7) + 8 * (lanes >> 4)) * TS + 16 * ((lanes >> 3) & 1)

            def ldsm4(buf, addr):
                # matrix i: rows from lanes 8i..8i+7; lane t gets 4 bytes of row t / 4 at byte 4 (t % 4)
                regs = np.zeros((4, 32, 4), np.int64)
                for i in range(4):
                    for t in range(32):
                        a = addr[8 * i + t // 4] + 4 * (t % 4)
                        regs[i, t] = buf[a:a + 4]
                return regs

            for j in range(8):
                A = [ldsm4(wts, a_off + mi * 16 * TS + 32 * j) for mi in range(4)]
                Bp = [ldsm4(xt, b_off + np_ * 16 * TS + 32 * j) for np_ in range(2)]
                B = [(Bp[n // 2][2 * (n % 2)], Bp[n // 2][2 * (n % 2) + 1]) for n in range(4)]
                for t in range(32):
                    g, tig = t >> 2, t & 3
                    base_r = (wm * 64 + 8 * g) // 2 * 2
                    rsv = rs[j, base_r: base_r + 8].reshape(-1)
                    base_c = wn * 32 + 8 * tig
                    csv = cs[j, base_c: base_c + 8].reshape(-1)
                    for mi in range(4):
                        for ni in range(4):
                            # m16n8k32 s8: A rows g / g + 8, k bytes 4 tig.. (a0 a1) and 16 + 4 tig.. (a2 a3);
                            # B column g... from each lane's b0 (k 4 tig..) and b1 (k 16 + 4 tig..)
                            for e in range(4):
                                h, ce = e >> 1, e & 1
                                # C element (row 8h + g, col 2 tig + ce) = sum over k of A[row, k] B[k, col]
                                arow = [A[mi][h][lane] for lane in range(4 * g, 4 * g + 4)] + \
                                       [A[mi][2 + h][lane] for lane in range(4 * g, 4 * g + 4)]
                                bl = 4 * (2 * tig + ce)
                                bcol = [B[ni][0][lane] for lane in range(bl, bl + 4)] + \
                                       [B[ni][1][lane] for lane in range(bl, bl + 4)]
                                I = int(np.dot(np.concatenate(arow), np.concatenate(bcol)))
                                dsc, ndmm = rsv[4 * mi + 2 * h], rsv[4 * mi + 2 * h + 1]
                                dx, sx = csv[4 * ni + 2 * ce], csv[4 * ni + 2 * ce + 1]
                                acc[warp, t, mi, ni, e] += I * dsc * dx + (0.0 if mintc else ndmm * sx)
            if mintc:   # the stage's min term: m16n8k8 fragments from the kernel's smem layouts
                for mi in range(4):
                    for ni in range(4):
                        A = np.zeros((16, 8))
                        Bm = np.zeros((8, 8))
                        for t in range(32):
                            g, tig = t >> 2, t & 3
                            pr = wm * 64 + 8 * g          # rm base: rows (mi, h) at + 2 mi + h
                            pc = wn * 32 + 4 * g          # cm base: columns ni at + ni
                            A[g, tig] = rs[tig, pr + 2 * mi, 1]
                            A[g + 8, tig] = rs[tig, pr + 2 * mi + 1, 1]
                            A[g, tig + 4] = rs[tig + 4, pr + 2 * mi, 1]
                            A[g + 8, tig + 4] = rs[tig + 4, pr + 2 * mi + 1, 1]
                            Bm[tig, g] = cmin[tig, pc + ni]
                            Bm[tig + 4, g] = cmin[tig + 4, pc + ni]
                        D = A @ Bm
                        for t in range(32):
                            g, tig = t >> 2, t & 3
                            for e in range(4):
                                acc[warp, t, mi, ni, e] += D[8 * (e >> 1) + g, 2 * tig + (e & 1)]
    out = {}
    for warp in range(WM * WN):
        wm, wn = warp // WN, warp % WN
        for t in range(32):
            g, tig = t >> 2, t & 3
            for ni in range(4):
                for e in range(4):
                    col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1)
                    if col >= nb:
                        continue
                    if glu:
                        for mi in range(2):
                            row = ob + wm * 32 + 16 * mi + 8 * (e >> 1) + g
                            gt, up = acc[warp, t, mi, ni, e], acc[warp, t, mi + 2, ni, e]
                            out[(row, col)] = gt / (1 + np.exp(-gt)) * up
                    else:
                        for mi in range(4):
                            out[(ob + wm * 64 + 16 * mi + 8 * (e >> 1) + g, col)] = acc[warp, t, mi, ni, e]
    return out


def model_selftest(rng) -> int:
    """The index-map model of one block (a small configuration, glu and plain, a partial batch
    tile) against the float64 reference: every output the block writes, exactly once."""
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    bad = 0
    for glu, defs in ((True, {"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2}), (False, {"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2}),
                      (True, {"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_MINTC": 1, "GT_MAGIC": 1}),
                      (False, {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 2, "GT_MINTC": 1})):
        BM, BN, _ = tiles(defs)
        N = 2 * (BM // 2 if glu else BM)
        K, nb = 512, 40
        raw = MV.random_weight(Q4_K, 2 * N if glu else N, K, rng)
        x = make_x(rng, nb, K)
        q, s = quantize_q8_ref(x)
        xv = q8_dequant(x)
        obm = BM // 2 if glu else BM
        got = {}
        for bx in range(N // obm):
            for by in range(-(-nb // BN)):
                blk = model_block(raw, q, s["d"], s["s"], defs, glu, bx * obm, by * BN, nb)
                assert not (set(blk) & set(got)), "an output written twice"
                got.update(blk)
        assert set(got) == {(r, c) for r in range(N) for c in range(nb)}, "outputs missing"
        ref = ref_rows(raw, glu, xv, np.arange(N))
        y = np.array([[got[(r, c)] for r in range(N)] for c in range(nb)])
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        ok = err < 1e-12
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  model of gemm_tile{'_glu' if glu else ''} {defs}, N={N} K={K} nb={nb}: "
              f"every output once, float64 rel err {err:.1e} (index maps, fragments)", flush=True)
    return bad


# ---------------------------------------------------------------------------------------
# device

class Run:
    def __init__(self, cubins: dict, mock: bool = False):
        self.defs = dict(CONFIGS)
        if mock:
            from mock_gpu import MockGpu, MockModule
            self.g = MockGpu()
            self.mods = {name: MockModule("gemm_tile.cu", defs) for name, defs in CONFIGS}
            return
        from memra.gpu.cuda import Module, gpu
        self.g = gpu(0)
        self.mods = {name: Module(self.g, "gemm_tile.cu", dict(defs), cubins[name][0]) for name, defs in CONFIGS}

    def launch_tile(self, cfg: str, w, xq, xs, y, nb: int, glu: bool, ks: int = 1, ws=None):
        """ks > 1: split-K into ws (>= ks * nb * w.rows floats), then gemm_tile_reduce into y."""
        defs = self.defs[cfg]
        grid, block, smem = launch_shape(defs, w.rows, w.K, nb, glu, ks)
        N = w.rows // 2 if glu else w.rows
        mod = self.mods[cfg]
        k = mod.kernel("gemm_tile_glu" if glu else "gemm_tile")
        self.g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, ws if ks > 1 else y, np.int32(N), np.int32(w.K),
                                       np.int32(nb), np.int32(ks)), shmem=smem)
        if ks > 1:
            self.g.launch(mod.kernel("gemm_tile_reduce"), (-(-N * nb // 256),), (256,),
                          (ws, y, np.int32(N), np.int32(nb), np.int32(ks), np.int32(1 if glu else 0)))

    def launch_memra(self, cfg, w, xq, xs, y, nb: int, glu: bool):
        from memra.gpu.ops.gemm import gemm
        config = dict(zip(GM_KEYS, (int(v) for v in cfg.split(",")))) if cfg else None
        gemm(self.g, w, y, xq=xq, xs=xs, nb=nb, glu="silu" if glu else None, config=config)


class _Uncaptured:
    """A Gpu seen without its capture(): time_us's launch-by-launch fallback."""
    def __init__(self, g):
        self._g = g

    def __getattr__(self, name):
        if name == "capture":
            raise AttributeError(name)
        return getattr(self._g, name)


def time_us(g, fns, reps: int, launches: int = 24) -> float:
    """Median us of one fns[i % len(fns)]() call, after 2 warm-ups each: `launches` calls (a
    multiple of len(fns)) captured in one CUDA graph, the graph timed `reps` times between two
    events (memra.tune.measure's method: a small kernel timed one launch at a time measures
    the host's launch latency instead). The mock device (no graphs) times launches one by one."""
    from cuda.core import EventOptions
    emu = getattr(g, "emulate", None)
    if emu is not None:   # the mock: launches only check their arguments here
        g.emulate = False
    for f in fns:
        for _ in range(2):
            f()
    g.sync()
    if emu is not None or not hasattr(g, "capture"):
        opts = EventOptions(timing_enabled=True)
        pairs = []
        for r in range(reps):
            a = g.stream.record(options=opts)
            fns[r % len(fns)]()
            b = g.stream.record(options=opts)
            pairs.append((a, b))
        g.sync()
        if emu is not None:
            g.emulate = emu
        return float(np.median([b - a for a, b in pairs])) * 1e3
    n = max(launches, len(fns))
    n -= n % len(fns)
    try:
        with g.capture() as graph:
            for i in range(n):
                fns[i % len(fns)]()
    except Exception as e:   # a launcher that allocates or syncs cannot be captured: one at a time
        print(f"time_us: graph capture failed ({e}); timing launch by launch", flush=True)
        g.sync()
        return time_us(_Uncaptured(g), fns, reps)
    try:
        graph.upload()
        ms = g.time_ms(graph.launch, reps=max(5, reps // 4), warmup=2)
    finally:
        graph.close()
    return float(np.median(ms)) * 1e3 / n


def device_main(args, jsonl) -> int:
    from memra.gpu.compare import compare
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE

    t0 = time.perf_counter()
    cubins = compile_all(16)
    for name, (_, info) in cubins.items():
        jsonl({"kind": "compile", "config": name, "info": {k: list(v) for k, v in info.items()}})
        print(f"compiled {name}: " + ", ".join(f"{fn} {r} regs {sp} B spill" for fn, (r, sp) in info.items()), flush=True)
        if any(sp for _, sp in info.values()):
            print(f"FAIL  {name} spills", flush=True)
            return 1
    run = Run(cubins, args.mock)
    g = run.g
    shapes = MOCK_SHAPES if args.mock else SHAPES
    print(f"device {g.info.name}; compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    rng = np.random.default_rng(4321)
    fails = 0

    def check(name, y, ref_y, outs, nrow, tol, **rec):
        nonlocal fails
        got = y.numpy().reshape(-1, y.shape[-1])[:nrow]
        got = got[:, outs] if outs is not None else got
        o = compare(name, got, ref_y, tol)
        fails += not o.ok
        print(f"{'PASS' if o.ok else 'FAIL'}  {name}  {o.detail}", flush=True)
        jsonl({"kind": "check", "name": name, "ok": o.ok, "err": o.err, **rec})

    def acts(nb, K):
        x = make_x(rng, nb, K)
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        return x, xq, xs

    # small shapes: every configuration, partial batch tiles, glu and plain, K 512 / 768
    for glu in (True, False):
        for (N, K, nb, ks) in ((512, 768, 37, 1), (256, 512, 130, 1), (256, 1024, 1, 1), (256, 1024, 77, 2),
                               (512, 3072, 200, 3)):
            raw = MV.random_weight(Q4_K, 2 * N if glu else N, K, rng)
            w = MV.upload_weight(g, raw, Q4_K)
            x, xq, xs = acts(nb, K)
            ref = ref_rows(raw, glu, q8_dequant(x), np.arange(N))
            wsb = g.empty((ks * nb * w.rows,), np.float32) if ks > 1 else None
            for cfg, _ in CONFIGS:
                y = g.empty((nb, N), np.float32)
                y.poison()
                run.launch_tile(cfg, w, xq, xs, y, nb, glu, ks, wsb)
                g.sync()
                check(f"tile {cfg} {'glu ' if glu else ''}N={N} K={K} nb={nb} ks={ks}", y, ref, None, nb, TOL,
                      config=cfg, N=N, K=K, nb=nb, glu=glu, ks=ks)
    # determinism: the same rows at two batch sizes (a row's bits do not depend on nb or its tile)
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    results = []
    for sname, rows, K, glu, kss in shapes:
        if args.shapes and not any(k in sname for k in args.shapes.split(",")):
            continue
        N = rows // 2 if glu else rows
        raw = MV.random_weight(Q4_K, rows, K, rng)
        w0 = MV.upload_weight(g, raw, Q4_K)
        sets = 3 if args.mock else max(2, -(-3 * L2_BYTES // w0.nbytes))
        ws = [w0] + [MV.upload_weight(g, raw, Q4_K) for _ in range(sets - 1)]
        outs = subset(N)
        nbmax = max(NBS)
        x, xq, xs = acts(nbmax, K)
        xv = q8_dequant(x)
        ref = ref_rows(raw, glu, xv, outs)
        y = g.empty((nbmax, N), np.float32)
        wsb = g.empty((max(kss) * nbmax * rows,), np.float32) if max(kss) > 1 else None
        bits = {}
        for nb in NBS:
            for cfg, _ in CONFIGS:
                for ks in kss:
                    tag = f"{cfg} ks{ks}"
                    y.poison()
                    run.launch_tile(cfg, w0, xq, xs, y, nb, glu, ks, wsb)
                    g.sync()
                    check(f"tile {tag} {sname} nb={nb}", y, ref[:nb], outs, nb, TOL, config=cfg, ks=ks, shape=sname,
                          nb=nb)
                    b = y.numpy()[:nb].view(np.uint32)
                    if tag in bits:   # batch independence: rows < 128 of nb = 512 equal nb = 128's bits
                        same = np.array_equal(bits[tag][:min(NBS)], b[:min(NBS)])
                        fails += not same
                        print(f"{'PASS' if same else 'FAIL'}  tile {tag} {sname}: batch rows 0..{min(NBS) - 1} "
                              f"bit-identical at nb={min(NBS)} and nb={nb}", flush=True)
                    else:
                        bits[tag] = b.copy()
                    us = time_us(g, [lambda i=i, cfg=cfg, ks=ks: run.launch_tile(cfg, ws[i], xq, xs, y, nb, glu, ks, wsb)
                                     for i in range(sets)], args.reps)
                    results.append((sname, nb, f"tile {tag}", us))
                    jsonl({"kind": "time", "impl": "tile", "config": cfg, "ks": ks, "shape": sname, "nb": nb, "us": us,
                           "tops": 2 * N * (2 if glu else 1) * K * nb / us / 1e6, "sets": sets})
                    print(f"time  tile {tag:10s} {sname} nb={nb}: {us:8.1f} us", flush=True)
            for mcfg in MEMRA_CFGS:
                y.poison()
                run.launch_memra(mcfg, w0, xq, xs, y, nb, glu)
                g.sync()
                name = f"memra {mcfg or 'default'}"
                check(f"{name} {sname} nb={nb}", y, ref[:nb], outs, nb, MV.TOL, config=mcfg, shape=sname, nb=nb)
                us = time_us(g, [lambda i=i, mcfg=mcfg: run.launch_memra(mcfg, ws[i], xq, xs, y, nb, glu)
                                 for i in range(sets)], args.reps)
                results.append((sname, nb, name, us))
                jsonl({"kind": "time", "impl": "memra", "config": mcfg or "default", "shape": sname, "nb": nb,
                       "us": us, "tops": 2 * N * (2 if glu else 1) * K * nb / us / 1e6, "sets": sets})
                print(f"time  {name:14s} {sname} nb={nb}: {us:8.1f} us", flush=True)
        ws.clear()   # the weight copies freed before the next shape
        print(f"{sname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    print(f"\n{'shape':24s} {'nb':>4s} {'impl':22s} {'us':>9s} {'vs memra 2,2,2,4,1,3,1,1':>24s}")
    base = {(s, nb): us for s, nb, n, us in results if n == "memra 2,2,2,4,1,3,1,1"}
    for s, nb, n, us in results:
        b = base.get((s, nb))
        print(f"{s:24s} {nb:4d} {n:22s} {us:9.1f} {(b / us if b else float('nan')):23.2f}x")
        jsonl({"kind": "table", "shape": s, "nb": nb, "impl": n, "us": us, "speedup_vs_memra_512cfg": b / us if b else None})
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


def dry_run(args) -> int:
    """The device run's host side without a device: data preparation and the float64
    references (K cut to 1024 unless --full), plus the index-map model."""
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    rng = np.random.default_rng(4321)
    t0 = time.perf_counter()
    for sname, rows, K, glu, kss in SHAPES:
        K = K if args.full else 1024
        N = rows // 2 if glu else rows
        raw = MV.random_weight(Q4_K, rows, K, rng)
        bulk, meta = MV.pack_planes(raw, Q4_K)
        assert bulk.shape == (rows, K // 2) and meta.shape == (rows, K // 16)
        assert np.array_equal(MV.unpack_planes(bulk, meta, Q4_K), raw)
        for nb in NBS:
            x = make_x(rng, nb, K)
            q, s = quantize_q8_ref(x)
            outs = subset(N)
            ref = ref_rows(raw, glu, q8_dequant(x), outs)
            for cfg, defs in CONFIGS:
                for ks in kss:
                    grid, block, smem = launch_shape(defs, rows, K if args.full else 256 * 4 * ks, nb, glu, ks)
            assert ref.shape == (nb, len(outs)) and np.all(np.isfinite(ref))
            print(f"ok  {sname} K={K} nb={nb}: planes round-trip, q8 ({int(s['s'].min())}..{int(s['s'].max())}), "
                  f"reference {ref.shape} rms {np.sqrt(np.mean(ref ** 2)):.3g}, grids "
                  + ", ".join(f"{c}: {launch_shape(d, rows, K, nb, glu)[0]}" for c, d in CONFIGS), flush=True)
    print(f"data preparation ok in {time.perf_counter() - t0:.1f} s", flush=True)
    return model_selftest(np.random.default_rng(5))


def jsonl_writer(name: str):
    out = os.environ.get("OUT")
    path = Path(out) / name if out else None

    def write(rec):
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
    return write


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--mock", action="store_true", help="the device run on mock_gpu.MockGpu (CPU; emulated launches)")
    ap.add_argument("--full", action="store_true", help="dry run at the 8B shapes' real K")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    try:
        if args.compile_only:
            t0 = time.perf_counter()
            res = compile_all(args.jobs)
            bad = 0
            for name, defs in CONFIGS:
                cub, info = res[name]
                for fn, (r, sp) in info.items():
                    bad += sp > 0
                    print(f"{'ok  ' if not sp else 'SPILL'} {name} {fn:14s} {r} regs, {sp} B spill, "
                          f"smem {smem_bytes(defs)} B, {len(cub)} B cubin", flush=True)
            print(f"{len(res)} modules in {time.perf_counter() - t0:.1f} s, {bad} spilling")
            return 1 if bad else 0
        if args.dry_run:
            return 1 if dry_run(args) else 0
        return device_main(args, jsonl_writer("gemm-tile.jsonl"))
    except Exception:   # noqa: BLE001 - fail clearly
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
