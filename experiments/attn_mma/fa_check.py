#!/usr/bin/env python3
"""fa_check: kernels/attn_fa.cu — one tensor-core attention kernel for decode
and prefill rows — checked and timed against the engine's attn_decode (kernels/attention.cu).

    python3 experiments/attn_mma/fa_check.py --compile-only   # CPU: NVRTC, every head size
    python3 experiments/attn_mma/fa_check.py                  # device: checks, then timing

Checks, per model shape (SmolLM2, llama-1b, llama3-8b, Gemma-3 global and sliding-window
layers): a 128-token prefill chunk of one sequence at positions [depth, depth + 128) over a
paged cache (a shuffled block table), random q (float32) and K/V (f16 values ~N(0, 1)):
  - bits: the chunk's rows packed as prefill (attn_fa, tokens grouped, FA_WARPS * 16 / qpk a
    block) equal the same rows one token a block (attn_fa, tpb 1) and in the decode packing
    (attn_fa_dec: the block's warps split the keys and the output dims) — uint32 views;
  - values: within 1e-2 of a float64 reference whose q is rounded to f16 (the kernel's only
    input rounding besides the f16 probabilities), relative to max |V|.
Timing (CUDA graphs of 20 launches, median of 10 replays): the prefill chunk (128 rows at
depth 384 and 4096) and one decode row (depth 64 and 4096), attn_fa (+ fa_combine where a
row has several splits) against attn_decode as the engine launches it. JSON lines to
$OUT/fa-check.jsonl when $OUT is set. Exit 1 on a bit mismatch or a value out of tolerance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {  # name: (head_dim, n_head, n_kv, window)
    "smollm2": (64, 9, 3, 0),
    "llama-1b": (64, 32, 8, 0),
    "llama3-8b": (128, 32, 8, 0),
    "gemma3-global": (256, 4, 1, 0),
    "gemma3-swa": (256, 4, 1, 512),
}
FA_WARPS = 4    # --warps: the prefill packing's (memra.gpu.ops.attn_fa.FA_WARPS; the decode packing: 4)
FA_SPLIT = 256  # --split
FULL_GRID = False  # --full-grid
KVB = 16


def defines(D: int) -> dict:
    from memra.gpu.ops.attn_fa import defines as d

    return d(D, FA_SPLIT, KVB)


def compile_only() -> int:
    from memra.gpu.compile import compile_cubin
    from memra.gpu.ops.attn_fa import smem_bytes

    for D in (64, 128, 256):
        cub = compile_cubin("attn_fa.cu", "sm_90a", defines(D))
        print(f"attn_fa HEAD_DIM={D}: {len(cub)} bytes of cubin, {smem_bytes(D, False)} / {smem_bytes(D, True)} "
              f"bytes of shared memory (prefill / decode packing)")
    return 0


class Case:
    """One sequence of n_ctx positions in a paged cache, q for T rows at [depth, depth + T)."""

    def __init__(self, g, rng, D, n_head, n_kv, window, depth, T):
        self.D, self.n_head, self.n_kv, self.window, self.T = D, n_head, n_kv, window, T
        n_ctx = depth + T
        nb = -(-n_ctx // KVB)
        self.max_blocks = nb
        perm = rng.permutation(nb + 3)[:nb].astype(np.int32)  # a shuffled table over a larger pool
        self.bt = perm[None, :]
        pool = nb + 3
        k = rng.standard_normal((pool, KVB, n_kv * D)).astype(np.float16)
        v = rng.standard_normal((pool, KVB, n_kv * D)).astype(np.float16)
        self.k16, self.v16 = k, v
        self.q = rng.standard_normal((T, n_head * D)).astype(np.float32)
        self.pos = np.arange(depth, depth + T, dtype=np.int32)
        self.seq = np.zeros(T, np.int32)
        self.scale = 1.0 / np.sqrt(D)
        self.d = {
            "q": g.to_device(self.q), "k": g.to_device(k.view(np.uint16)), "v": g.to_device(v.view(np.uint16)),
            "pos": g.to_device(self.pos), "seq": g.to_device(self.seq), "bt": g.to_device(self.bt),
        }
        self.n_split = -(-n_ctx // FA_SPLIT)
        self.d["po"] = g.empty((T, n_head, self.n_split, D), np.float32)
        self.d["pml"] = g.empty((T, n_head, self.n_split, 2), np.float32)
        self.d["out"] = g.empty((T, n_head * D), np.float32)
        self.d["cnt"] = g.to_device(np.zeros(T * n_kv, np.int32))  # the decode packing's (left zero)

    def reference(self):
        """float64 attention with q rounded to f16, keys gathered through the table."""
        D, G = self.D, self.n_head // self.n_kv
        kk = self.k16[self.bt[0]].reshape(-1, self.n_kv, D).astype(np.float64)
        vv = self.v16[self.bt[0]].reshape(-1, self.n_kv, D).astype(np.float64)
        q = self.q.astype(np.float16).astype(np.float64).reshape(self.T, self.n_head, D)
        out = np.empty((self.T, self.n_head, D))
        for t in range(self.T):
            p = int(self.pos[t])
            lo = max(0, p + 1 - self.window) if self.window else 0
            for h in range(self.n_head):
                sc = kk[lo:p + 1, h // G] @ q[t, h] * self.scale
                w = np.exp(sc - sc.max())
                out[t, h] = (w @ vv[lo:p + 1, h // G]) / w.sum()
        return out.reshape(self.T, -1)


def launch_fa(g, mod, c: Case, tpb: int) -> None:
    """tpb 0: the decode packing (attn_fa_dec); else attn_fa over groups of tpb tokens, on the
    engine's grid x (the groups rounded up to a power of two: memra.gpu.runner._pow2_at_most),
    or one block a row with --full-grid (sessions 20-21's timings: 512 rows of the 8B at 8 warps
    launched 512 blocks along x for 16 groups, the rest exiting at count 0)."""
    from memra.gpu.ops.attn_fa import attn_fa, group_table
    from memra.gpu.runner import _pow2_at_most

    d = c.d
    key = ("groups", tpb)
    if tpb and key not in d:  # uploaded once, outside any capture
        n = len(group_table(c.seq, c.pos, tpb))
        size = c.T if FULL_GRID else _pow2_at_most(n, c.T)
        d[key] = (g.to_device(group_table(c.seq, c.pos, tpb, size=size)), size)
    kc = d["k"].view(shape=(c.k16.shape[0], KVB, c.n_kv * c.D))
    vc = d["v"].view(shape=(c.k16.shape[0], KVB, c.n_kv * c.D))
    attn_fa(g, d["q"], kc, vc, d["out"], d["po"], d["pml"], d["pos"], d["seq"], d["bt"], c.max_blocks, n_tokens=c.T,
            n_kv=c.n_kv, qpk=c.n_head // c.n_kv, head_dim=c.D, window=c.window, scale=c.scale, n_split=c.n_split,
            split=FA_SPLIT, decode=tpb == 0, groups=d[key][0] if tpb else None,
            n_groups=d[key][1] if tpb else c.T,
            warps=FA_WARPS if tpb == prefill_tpb(c) else 4, counters=d["cnt"] if tpb == 0 else None)


def prefill_tpb(c: Case) -> int:
    return FA_WARPS * (16 // (c.n_head // c.n_kv))


def launch_decode_kernel(g, c: Case, extra: dict) -> None:
    """attn_decode as the engine launches it for these rows."""
    from memra.gpu.ops import attention as ATT

    G = c.n_head // c.n_kv
    hpb = G if c.T >= 16 else ATT.heads_per_block(c.n_kv, G)
    ns = ATT.default_splits(c.n_head // hpb, g.info.sm_count)
    if "att" not in extra:
        po, pml = ATT.scratch_shapes(c.T, c.n_head, ns, c.D)
        extra["att"] = (g.empty(po, np.float32), g.empty(pml, np.float32),
                        g.to_device(np.zeros(c.T * c.n_head, np.int32)))
    po, pml, cnt = extra["att"]
    kc = c.d["k"].view(shape=(c.k16.shape[0], KVB, c.n_kv * c.D))
    vc = c.d["v"].view(shape=(c.k16.shape[0], KVB, c.n_kv * c.D))
    ATT.attention(g, c.d["q"], kc, vc, c.d["out"], po, pml, c.d["pos"], c.d["seq"], c.d["bt"], c.max_blocks,
                  n_tokens=c.T, n_kv=c.n_kv, n_gqa=G, head_dim=c.D, window=c.window, scale=c.scale, n_splits=ns,
                  counters=cnt, hpb=hpb)


def graph_us(g, fn, reps: int = 20) -> float:
    fn()  # outside the capture: buffers allocated, modules loaded
    g.sync()
    with g.capture() as gr:
        for _ in range(reps):
            fn()
    ms = g.time_ms(gr.launch, reps=10, warmup=2)
    gr.close()
    return float(np.median(ms)) * 1e3 / reps


def main() -> int:
    global FA_SPLIT, FA_WARPS, FULL_GRID
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--split", type=int, default=FA_SPLIT)
    ap.add_argument("--warps", type=int, default=FA_WARPS, help="the prefill packing's warps a block (1, 2, 4, 8)")
    ap.add_argument("--rows", type=int, default=128, help="prefill rows a timed case (a chunk)")
    ap.add_argument("--src", help="a variant of kernels/attn_fa.cu (a path): checked against the stock file's "
                    "bits too, and timed beside it")
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE: a -D of the variant's modules")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--modes", default="prefill:384,prefill:4096,decode:64,decode:4096")
    ap.add_argument("--once", action="store_true", help="one launch of each timed case, untimed (for ncu)")
    ap.add_argument("--full-grid", action="store_true", help="the prefill packing's grid x one block a row (as "
                    "sessions 20-21 timed it) instead of the engine's trimmed grid")
    a = ap.parse_args()
    FA_SPLIT, FA_WARPS, FULL_GRID = a.split, a.warps, a.full_grid
    import memra.gpu.ops.attn_fa as FA

    stock = FA.KERNEL_FILE
    variant = str(Path(a.src).resolve()) if a.src else stock

    extra = dict(kv.split("=", 1) for kv in a.define)
    stock_defines = FA.defines

    def variant_defines(*args, **kw):
        return {**stock_defines(*args, **kw), **extra}

    def use(src):
        FA.KERNEL_FILE = src
        FA.defines = variant_defines if src != stock else stock_defines

    use(variant)
    shapes = {k: SHAPES[k] for k in a.shapes.split(",")}
    if a.compile_only:
        return compile_only()
    from memra.gpu.cuda import gpu

    g = gpu()
    rng = np.random.default_rng(0)
    out_f = open(Path(os.environ["OUT"]) / "fa-check.jsonl", "a") if os.environ.get("OUT") else None

    def emit(rec):
        print(json.dumps(rec), flush=True)
        if out_f:
            out_f.write(json.dumps(rec) + "\n")

    bad = 0
    mods = {D: None for D in sorted({v[0] for v in shapes.values()})}  # attn_fa loads its modules
    for name, (D, nh, nkv, win) in ({} if a.no_checks else shapes).items():
        for depth in (384, 1000):
            c = Case(g, rng, D, nh, nkv, win, depth, 128)
            outs = []
            runs = [(variant, prefill_tpb(c)), (variant, 1), (variant, 0)]  # prefill, one token a block, decode
            if variant != stock:
                runs.append((stock, prefill_tpb(c)))  # the variant's bits = the stock kernel's
            for src, tpb in runs:
                use(src)
                c.d["out"].fill_bytes(0xFF)
                c.d["po"].fill_bytes(0xFF)
                launch_fa(g, mods[D], c, tpb)
                outs.append(c.d["out"].numpy().copy())
            use(variant)
            pre = outs[0]
            same = all(bool(np.array_equal(pre.view(np.uint32), x.view(np.uint32))) for x in outs[1:])
            ref = c.reference()
            err = float(np.max(np.abs(pre - ref)))
            ok = same and np.isfinite(pre).all() and err < 1e-2
            bad += not ok
            emit({"kind": "record", "what": "fa-check", "shape": name, "depth": depth, "T": 128,
                  "prefill_eq_decode": same, "max_abs_err": err, "ok": bool(ok), "n_split": c.n_split})
    if not a.no_timing:
        for name, (D, nh, nkv, win) in shapes.items():
            if name == "gemma3-swa":
                continue
            for md in a.modes.split(","):
                mode, depth = md.split(":")
                depth, T = int(depth), (a.rows if mode == "prefill" else 1)
                c = Case(g, rng, D, nh, nkv, win, depth, T)
                tpb = prefill_tpb(c) if mode == "prefill" else 0
                if a.once:
                    launch_fa(g, mods[D], c, tpb)
                    g.sync()
                    continue
                dec_extra: dict = {}
                us_fa = graph_us(g, lambda: launch_fa(g, mods[D], c, tpb))
                rec = {"kind": "record", "what": "fa-time", "shape": name, "mode": mode, "depth": depth, "T": T,
                       "fa_warps": FA_WARPS, "fa_split": FA_SPLIT, "full_grid": FULL_GRID, "src": Path(variant).name if variant == stock
                       else a.src, "defines": extra, "us_attn_fa": round(us_fa, 2)}
                if variant != stock:  # arms alternating: stock, variant, stock, variant
                    arms = {"stock": [], "variant": []}
                    for _ in range(2):
                        for arm, src in (("stock", stock), ("variant", variant)):
                            use(src)
                            arms[arm].append(graph_us(g, lambda: launch_fa(g, mods[D], c, tpb)))
                    use(variant)
                    rec.update(us_stock=[round(x, 2) for x in arms["stock"]],
                               us_variant=[round(x, 2) for x in arms["variant"]],
                               speedup_vs_stock=round(min(arms["stock"]) / min(arms["variant"]), 3))
                else:
                    us_dec = graph_us(g, lambda: launch_decode_kernel(g, c, dec_extra))
                    rec.update(us_attn_decode=round(us_dec, 2), speedup=round(us_dec / us_fa, 2))
                emit(rec)
    print(f"{'ALL OK' if not bad else f'{bad} FAILED'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
