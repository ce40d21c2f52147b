"""mv_qf.cu's gm_qf (v13, the qf arithmetic at 8..64 activation rows a block column) against the engine's q8 kernels at
the same rows (probe.time_q8: mv_q8 up to 8 rows, mvt at 3..15, gemm.cu from 16, the shipped H200 table's
configurations; session 54's run timed mvt alone at 8) on the 8B Q4_K_M's Q4_K shapes,
and its bits against the one-row kernel's (experiments/f16_decode/README.md, session 54).

Per shape and row count nb: the engine's q8 kernels; then per chain count C (the arithmetic: chains over K, CHAINS)
mv_qf at one row (MQ_WARPS max(4, C), MQ_WA 1) launched once for every activation row alone — the isolation contract's
reference — and gm_qf at every (GQ_WARPS, GQ_NT, GQ_STAGES) in GM with 8 GQ_NT <= nb rounded up: µs (median of CUDA
graph launches over weight copies rotated past L2), GB/s, `differ` = outputs whose bits differ from the one-row
launches' (must be 0), `rel` = max |y - ref| / max |ref| on the first 32 weight rows against the float64 qf value.

    source .whl/setup.sh && [GQ_NBS=8,64] [QF_OPS=gate_up,qkv] python3 experiments/f16_decode/gq_probe.py --out F
    python3 experiments/f16_decode/gq_probe.py --compile-only
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import qf_probe as QP  # noqa: E402  (ROOT / gemm_tile on sys.path, SHAPES, ref_qf, regs)

SRC = HERE / "mv_qf.cu"
KEYS = ("MQ_WARPS", "MQ_CHAINS", "MQ_WA", "GQ_NT", "GQ_STAGES", "GQ_WARPS")
CHAINS = {"gate_up": (1, 2), "down": (4, 8), "qkv": (2, 4), "attn_output": (2, 4)}
GM = [(4, 1, 2), (8, 1, 2), (4, 1, 3), (4, 4, 2), (4, 8, 2), (8, 8, 2), (4, 8, 3), (8, 4, 2)]
NBS = tuple(int(v) for v in os.environ.get("GQ_NBS", "8,64").split(","))
if os.environ.get("GQ_ONLY"):   # "C W NT ST": one chain count and gm_qf configuration (a profiler's run)
    _c, *_g = (int(v) for v in os.environ["GQ_ONLY"].split())
    CHAINS = {k: (_c,) for k in CHAINS}
    GM = [tuple(_g)]
XROW = 288


def mod(c: int, w: int, nt: int, st: int) -> tuple:
    """The module of gm_qf at (GQ_WARPS w, MQ_CHAINS c, GQ_NT nt, GQ_STAGES st); its mv_qf (the one-row reference)
    at MQ_WARPS max(4, c), MQ_WA 1."""
    return (max(4, c), c, 1, nt, st, w)


def modules() -> list[tuple]:
    cs = sorted({c for sh in QP.SHAPES for c in CHAINS[sh[1]]})
    return [mod(c, *cfg) for c in cs for cfg in GM]


def _compile(m):
    import tile as TL
    return TL.compile_module(dict(zip(KEYS, m)), SRC)


def smem(w: int, c: int, nt: int, st: int) -> int:
    return st * 8 * nt * (2 * XROW + 32) + (4 * nt * 32 * w * 4 if c > 1 else 0)


def main() -> int:
    args = QP.probe_args()
    got = QP.probe_session(args, "gq_compile", SRC, KEYS, modules(), _compile, "gq")
    if got is None:
        return 0
    g, table, emit, module = got
    import probe as PR
    import tile as TL
    from memra.gpu.ops import matvec as M
    from memra.gpu.q8 import Q8_SCALE
    rng = np.random.default_rng(54)
    for op, rows, K, glu, N, raw, ws, base in QP.shape_weights(g, rng):
        timed = PR.timer(g, emit, args.reps, base, ws, ws[0].nbytes)
        nr = 32
        for nb in NBS:
            x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
            xh16 = x.astype(np.float16)
            s2 = xh16.astype(np.float32).reshape(nb, K // 32, 32).sum(-1, dtype=np.float32)
            xh = g.to_device(xh16.view(np.uint16).reshape(-1))
            xs2 = g.to_device(s2.reshape(-1))
            xq = g.empty((nb * K,), np.int8)
            xs = g.empty((nb * K // 32,), Q8_SCALE)
            M.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb * N,), np.float32)
            PR.time_q8(timed, g, table, QP.Q4_K, rows, K, glu, nb, y, xq, xs)   # mv_q8 / mvt / gemm.cu
            if glu:
                gt = QP.ref_qf(raw[:nr], K, xh16, s2, nr)
                up = QP.ref_qf(raw[N:N + nr], K, xh16, s2, nr)
                ref = gt / (1 + np.exp(-gt)) * up
            else:
                ref = QP.ref_qf(raw, K, xh16, s2, nr)
            rows_x = [g.to_device(xh16[r].view(np.uint16)) for r in range(nb)]
            rows_s = [g.to_device(s2[r]) for r in range(nb)]
            y1 = g.empty((N,), np.float32)
            for C in CHAINS[op]:
                if K % (256 * C):
                    continue
                # the one-row reference: mv_qf at MQ_WA 1, every activation row launched alone
                k1 = module(mod(C, *GM[0])).kernel("mv_qf_glu" if glu else "mv_qf")
                w1 = max(4, C)
                tiles = (2 * N if glu else N) // 16
                grid1 = (-(-tiles * C // w1), 1, 1)

                def one(w, r, k1=k1, grid1=grid1):
                    a = ((w.bulk, w.meta, rows_x[r], rows_s[r], y1, np.int32(N), np.int32(K), np.int32(1),
                          np.int32(1)) if glu else
                         (w.bulk, w.meta, rows_x[r], rows_s[r], y1, np.uint64(0), np.int32(N), np.int32(K),
                          np.int32(1)))
                    g.launch(k1, grid1, (32 * w1, 1, 1), a)
                bits = np.empty((nb, N), np.uint32)
                for r in range(nb):
                    one(ws[0], r)
                    g.sync()
                    bits[r] = y1.numpy().view(np.uint32)
                us1 = TL.time_us(g, [lambda w=w: one(w, 0) for w in ws], args.reps, launches=max(24, 3 * len(ws)))
                emit({"kind": "time", **base, "nb": 1, "kernel": "mv_qf", "config": {"MQ_WARPS": w1, "MQ_CHAINS": C,
                      "MQ_WA": 1}, "us": round(us1, 2), "gbps": round(ws[0].nbytes / us1 / 1e3, 1),
                      "rows_as_reference": nb})
                for (W, NT, ST) in GM:
                    if 8 * NT > max(8, nb) or (8 * NT < nb and NT < 4):
                        continue
                    m = mod(C, W, NT, ST)
                    kern = module(m).kernel("gm_qf_glu" if glu else "gm_qf")
                    grid = (-(-tiles // W), -(-nb // (8 * NT)), 1)
                    sm = smem(W, C, NT, ST)

                    def run(w, kern=kern, grid=grid, sm=sm, W=W):
                        a = ((w.bulk, w.meta, xh, xs2, y, np.int32(N), np.int32(K), np.int32(nb), np.int32(1))
                             if glu else
                             (w.bulk, w.meta, xh, xs2, y, np.uint64(0), np.int32(N), np.int32(K), np.int32(nb)))
                        g.launch(kern, grid, (32 * W, 1, 1), a, shmem=sm)
                    rec = {"kind": "time", **base, "nb": nb, "kernel": "gm_qf", "config": dict(zip(KEYS, m)),
                           "smem": sm}
                    emit(QP.measure(g, rec, run, ws, y, (nb, N), bits, ref, nr, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
