"""Is mma.sync m16n8k16 (f16 x f16 -> f32) invariant to permuting k inside one instruction? (session 52)

A direct-fragment f16 decode kernel would hand each lane the weights it loads contiguously, i.e. a permutation of
k inside each k16 step (the activations permuted alike). That keeps the prompt GEMM's bits only if the tensor core's
sum of 16 products does not depend on their slots. perm.cu runs one mma a trial on (A, B, C) and on (A[:, P],
B[P, :], C); this counts the outputs whose bits differ, per kind of P: 'halves' (inside k 0..7 and 8..15), 'full'
(any), 'q4k' (the slots a lane's four contiguous bytes would fill: 2t, 2t + 1 <- 4t, 4t + 1; 2t + 8, 2t + 9 <-
4t + 2, 4t + 3), 'swap' (the two halves exchanged), and 'swapAB' (the operands' roles exchanged: D' = B^T A^T
against D^T on the 8 x 8 overlap, as mv_f16's MF_DF 2 runs them), on values of three kinds: 'wide' (exponents over 2^-12..2^12:
alignment truncation shows), 'model' (dequantized-weight-like A, normal B, C the size of a partial sum), 'zeroC'.

    python3 experiments/f16_decode/perm_probe.py [--trials 20000] [--out perm.jsonl]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gemm_tile"))

Q4K_SLOTS = np.array([4 * (s // 2 % 4) + s % 2 + 2 * (s // 8) for s in range(16)])   # slot s <- element


def perms(kind: str, rng, n: int) -> np.ndarray:
    if kind == "full":
        return np.stack([rng.permutation(16) for _ in range(n)])
    if kind == "halves":
        return np.stack([np.concatenate([rng.permutation(8), 8 + rng.permutation(8)]) for _ in range(n)])
    if kind == "q4k":
        return np.tile(Q4K_SLOTS, (n, 1))
    if kind == "swap":
        return np.tile(np.r_[8:16, 0:8], (n, 1))
    raise ValueError(kind)


def values(kind: str, rng, n: int):
    if kind == "wide":
        e = rng.integers(-12, 13, (n, 16, 16))
        a = (rng.choice([-1, 1], (n, 16, 16)) * rng.uniform(1, 2, (n, 16, 16)) * 2.0 ** e)
        e = rng.integers(-12, 13, (n, 8, 16))
        b = (rng.choice([-1, 1], (n, 8, 16)) * rng.uniform(1, 2, (n, 8, 16)) * 2.0 ** e)
        c = rng.standard_normal((n, 16, 8)) * 2.0 ** rng.integers(-8, 9, (n, 16, 8))
    else:
        a = (rng.integers(0, 16, (n, 16, 16)) * 0.013 - 0.05) * rng.uniform(0.5, 2, (n, 16, 1))
        b = rng.standard_normal((n, 8, 16)) * 2
        c = rng.standard_normal((n, 16, 8)) * 3 if kind == "model" else np.zeros((n, 16, 8))
    return a.astype(np.float16), b.astype(np.float16), c.astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--out", default="perm.jsonl")
    args = ap.parse_args()
    import tile as TL
    from memra.gpu.cuda import gpu
    g = gpu()
    cub, _ = TL.compile_module({}, HERE / "perm.cu")
    mod = TL.prebuilt_module(g, {}, "perm", "perm.cu", {}, lambda: cub)
    fn = mod.kernel("mma_trial")
    rng = np.random.default_rng(52)
    n = args.trials
    out = open(args.out, "a")

    def run(a, b, c):
        A, B, C = g.to_device(a.view(np.uint16).reshape(-1)), g.to_device(b.view(np.uint16).reshape(-1)), g.to_device(c.reshape(-1))
        D = g.empty((n * 128,), np.float32)
        g.launch(fn, (n, 1, 1), (32, 1, 1), (A, B, C, D))
        g.sync()
        return D.numpy().copy()

    for vk in ("wide", "model", "zeroC"):
        a, b, c = values(vk, rng, n)
        base = run(a, b, c)
        ref = (a.astype(np.float64) @ b.astype(np.float64).transpose(0, 2, 1) + c).reshape(-1)
        for pk in ("halves", "full", "q4k", "swap"):
            P = perms(pk, rng, n)
            ap_ = np.take_along_axis(a, P[:, None, :], axis=2)
            bp = np.take_along_axis(b, P[:, None, :], axis=2)
            got = run(np.ascontiguousarray(ap_), np.ascontiguousarray(bp), c)
            rec = {"device": g.info.name, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": "perm",
                   "values": vk, "perm": pk, "trials": n, "outputs": int(base.size),
                   "differ": int(np.sum(base.view(np.uint32) != got.view(np.uint32))),
                   "max_rel_vs_f64": float(np.max(np.abs(base - ref) / (np.abs(ref) + 1e-30)))}
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
        # session 52's v7 question: the weights as B and the activations as A — D'[m][n] against D[n][m] on the
        # 8 x 8 overlap (A' rows 0..7 the activation rows, 8..15 zero; B' columns weight rows 0..7; C' = C^T)
        a2 = np.zeros_like(a)
        a2[:, :8, :] = b
        b2 = np.ascontiguousarray(a[:, :8, :])
        c2 = np.zeros_like(c)
        c2[:, :8, :] = c[:, :8, :].transpose(0, 2, 1)
        got = run(np.ascontiguousarray(a2), b2, c2).reshape(n, 16, 8)[:, :8, :]
        want = base.reshape(n, 16, 8)[:, :8, :].transpose(0, 2, 1)
        rec = {"device": g.info.name, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": "perm",
               "values": vk, "perm": "swapAB", "trials": n, "outputs": int(want.size),
               "differ": int(np.sum(np.ascontiguousarray(got).view(np.uint32) != np.ascontiguousarray(want).view(np.uint32)))}
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
