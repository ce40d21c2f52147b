"""qf.cu (v14: every per-sub-block float operation in the tensor core; written as the engine kernel it is to become)
against the engine's q8 decode kernels at 1, 8 and 64 rows on the 8B Q4_K_M's Q4_K shapes, and its bits across row counts
(experiments/f16_decode/README.md, session 54).

Per shape and row count nb: the engine's q8 kernels (probe.time_q8: mv_q8 up to 8 rows, mvt at 3..15, gemm.cu from
16, the shipped H200 table's configurations; session 54's first run timed mvt alone at 8);
then per chain count C (CHAINS: the arithmetic) the one-row reference — qf_mv launched once for every activation row
alone — and qf_mv at nb rows (nb <= 8) and qf_gemm at every configuration in GM that fits nb: µs (median of CUDA-graph
launches over weight copies rotated past L2), GB/s, `differ` = outputs whose bits differ from the one-row launches'
(the isolation contract: must be 0), `rel` = max |y - ref| / max |ref| on the first 32 weight rows against the
float64 value of the same arithmetic (S1 exact, S2 = hi + lo as the kernel sees it).

    source .whl/setup.sh && [Q2_NBS=1,8,64] [QF_OPS=gate_up,qkv] python3 experiments/f16_decode/qf2_probe.py --out F
    python3 experiments/f16_decode/qf2_probe.py --compile-only
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import qf_probe as QP  # noqa: E402  (ROOT / gemm_tile on sys.path, SHAPES, ref_qf, regs)

SRC = HERE.parents[1] / "kernels" / "qf.cu"   # (v14-v15: the engine kernel since session 55)
KEYS = ("QF_WARPS", "QF_CHAINS", "QF_GWARPS", "QF_NT", "QF_STAGES", "QF_KSPLIT", "QF_WSMEM", "QF_AHEAD")
CHAINS = {"gate_up": (1, 2), "down": (4, 8), "qkv": (2, 4), "attn_output": (2, 4)}
ONE_WARPS = (4, 8)                         # qf_mv's QF_WARPS (>= C) timed at one row
ONE_AHEAD = tuple(int(v) for v in os.environ.get("Q2_AHEAD", "1").split(","))   # and its QF_AHEAD
# qf_gemm's configurations (QF_GWARPS, QF_NT, QF_STAGES, QF_KSPLIT[, QF_WSMEM]); Q2_SET 2: session 54's second run (v15,
# the weights staged through shared memory, against v14's best)
GMS = {"1": [(4, 1, 2, 0), (8, 1, 2, 0), (4, 1, 2, 1), (4, 4, 2, 0), (4, 8, 2, 0), (8, 8, 2, 0), (4, 8, 3, 0),
             (4, 4, 2, 1), (4, 8, 2, 1), (8, 8, 2, 1)],
       "2": [(4, 1, 2, 1), (4, 1, 2, 1, 1), (4, 4, 2, 1), (4, 8, 2, 1), (8, 8, 2, 1), (4, 8, 2, 0, 1), (4, 8, 2, 1, 1),
             (8, 4, 2, 0, 1), (8, 4, 2, 1, 1), (4, 4, 2, 0, 1), (4, 4, 2, 1, 1), (8, 8, 2, 1, 1), (4, 8, 3, 1, 1)]}
GM = [c + (0,) * (5 - len(c)) for c in GMS[os.environ.get("Q2_SET", "1")]]
NBS = tuple(int(v) for v in os.environ.get("Q2_NBS", "1,8,64").split(","))
if os.environ.get("Q2_ONLY"):   # "C W NT ST KS": one chain count and qf_gemm configuration (a profiler's run)
    _c, *_g = (int(v) for v in os.environ["Q2_ONLY"].split())
    CHAINS = {k: (_c,) for k in CHAINS}
    GM = [tuple(_g) + (0,) * (5 - len(_g))]


def modules() -> list[tuple]:
    cs = sorted({c for sh in QP.SHAPES for c in CHAINS[sh[1]]})
    out = [(max(4, c), c) + cfg + (1,) for c in cs for cfg in GM]
    out += [(w, c) + GM[0] + (a,) for c in cs for w in ONE_WARPS for a in ONE_AHEAD
            if w >= max(4, c) and w % c == 0 and (w, a) != (max(4, c), 1)]
    return out


def _compile(m):
    import tile as TL
    return TL.compile_module(dict(zip(KEYS, m)), SRC)


def smem(w: int, c: int, nt: int, st: int, ks: int, wsm: int = 0) -> int:
    from memra.gpu.ops.qf import smem_bytes
    return smem_bytes({"QF_GWARPS": w, "QF_CHAINS": c, "QF_NT": nt, "QF_STAGES": st, "QF_KSPLIT": ks, "QF_WSMEM": wsm})


def producer(x: np.ndarray):
    """to_qf's host replay (memra.gpu.ops.qf.producer): xh bits in qf order, xs2, the natural-order f16 values and
    S2 = hi + lo."""
    from memra.gpu.ops.qf import producer as P
    xh, xs2, x16, s2 = P(x)
    return xh.view(np.float16), xs2, x16, s2


def main() -> int:
    args = QP.probe_args()
    got = QP.probe_session(args, "q2_compile", SRC, KEYS, modules(), _compile, "q2")
    if got is None:
        return 0
    g, table, emit, module = got
    import probe as PR
    from memra.gpu.ops import matvec as M
    from memra.gpu.q8 import Q8_SCALE
    rng = np.random.default_rng(54)
    for op, rows, K, glu, N, raw, ws, base in QP.shape_weights(g, rng):
        sfx = "_glu" if glu else ""
        timed = PR.timer(g, emit, args.reps, base, ws, ws[0].nbytes)
        tiles = rows // 16
        nr = 32
        for nb in NBS:
            x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
            xq16, xs2h, xh16, s2ref = producer(x)
            # the device's producer against its host replay
            xh = g.empty((nb * K,), np.uint16)
            xs2 = g.empty((nb * K // 16,), np.float32)
            g.launch(module(modules()[0]).kernel("to_qf"), (-(-nb * K // 256 // 8), 1, 1), (256, 1, 1),
                     (g.to_device(x.reshape(-1)), xh, xs2, np.int32(nb), np.int32(K)))
            g.sync()
            emit({"kind": "producer", **base, "nb": nb,
                  "differ_x": int((xh.numpy().reshape(nb, K) != xq16.view(np.uint16)).sum()),
                  "differ_s2": int((xs2.numpy().reshape(nb, -1).view(np.uint32) != xs2h.view(np.uint32)).sum())})
            xh = g.to_device(xq16.view(np.uint16).reshape(-1))
            xs2 = g.to_device(xs2h.reshape(-1))
            xq = g.empty((nb * K,), np.int8)
            xs = g.empty((nb * K // 32,), Q8_SCALE)
            M.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb * N,), np.float32)
            PR.time_q8(timed, g, table, QP.Q4_K, rows, K, glu, nb, y, xq, xs)   # mv_q8 / mvt / gemm.cu
            if glu:
                gt = QP.ref_qf(raw[:nr], K, xh16, s2ref, nr)
                up = QP.ref_qf(raw[N:N + nr], K, xh16, s2ref, nr)
                ref = gt / (1 + np.exp(-gt)) * up
            else:
                ref = QP.ref_qf(raw, K, xh16, s2ref, nr)
            rows_x = [g.to_device(xq16[r].view(np.uint16)) for r in range(nb)]
            rows_s = [g.to_device(xs2h[r]) for r in range(nb)]
            y1 = g.empty((N,), np.float32)
            for C in CHAINS[op]:
                if K % (256 * C):
                    continue

                def mv(w, xa, sa, yy, n, W, A=1, C=C):
                    k = module((W, C) + GM[0] + (A,)).kernel("qf_mv" + sfx)
                    a = ((w.bulk, w.meta, xa, sa, yy, np.int32(N), np.int32(K), np.int32(n), np.int32(1)) if glu
                         else (w.bulk, w.meta, xa, sa, yy, np.uint64(0), np.int32(N), np.int32(K), np.int32(n)))
                    g.launch(k, (-(-tiles * C // W), 1, 1), (32 * W, 1, 1), a)
                w0 = max(4, C)
                bits = np.empty((nb, N), np.uint32)
                for r in range(nb):
                    mv(ws[0], rows_x[r], rows_s[r], y1, 1, w0)
                    g.sync()
                    bits[r] = y1.numpy().view(np.uint32)
                rel1 = float(np.max(np.abs(bits[:, :nr].view(np.float32) - ref)) / np.max(np.abs(ref)))
                cfgs = [("qf_mv", (W, A), None) for W in ONE_WARPS for A in ONE_AHEAD if W >= C and W % C == 0
                        and nb <= 8]
                cfgs += [("qf_gemm", None, c) for c in GM if nb > 1 and 8 * c[1] <= max(8, nb)
                         and not (8 * c[1] < nb and c[1] < 4)]
                for kern, W, c in cfgs:
                    if kern == "qf_mv":
                        config = {"QF_WARPS": W[0], "QF_CHAINS": C, "QF_AHEAD": W[1]}

                        def run(w, W=W):
                            mv(w, xh, xs2, y, nb, *W)
                    else:
                        m = (max(4, C), C) + c + (1,)
                        config = dict(zip(KEYS, m))
                        kg = module(m).kernel("qf_gemm" + sfx)
                        grid = (-(-tiles // c[0]), -(-nb // (8 * c[1])), C if c[3] else 1)
                        sm = smem(c[0], C, c[1], c[2], c[3], c[4])
                        wsp = g.empty((max(1, C * nb * rows),), np.float32)
                        cnt = g.to_device(np.zeros(grid[0] * grid[1], np.int32))

                        def run(w, kg=kg, grid=grid, sm=sm, c=c, wsp=wsp, cnt=cnt):
                            a = ((w.bulk, w.meta, xh, xs2, y, wsp, cnt, np.int32(N), np.int32(K), np.int32(nb),
                                  np.int32(1)) if glu else
                                 (w.bulk, w.meta, xh, xs2, y, np.uint64(0), wsp, cnt, np.int32(N), np.int32(K),
                                  np.int32(nb)))
                            g.launch(kg, grid, (32 * c[0], 1, 1), a, shmem=sm)
                    rec = {"kind": "time", **base, "nb": nb, "kernel": kern, "config": config, "rel_one_row": rel1}
                    emit(QP.measure(g, rec, run, ws, y, (nb, N), bits, ref, nr, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
