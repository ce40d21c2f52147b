#!/usr/bin/env python3
"""attn_ring (make.py's copy of kernels/attention.cu with ATT_RING stages: K/V tiles staged into
shared memory by cp.async) against the engine's own attn_decode_rope (memra.gpu.ops.attention,
kernels/attention.cu unedited), as the engine launches it: memra.gpu.ops.attention._TuneCase (one
token at position ctx - 1, the paged pools, RoPE and the append inside, the q8 twin), the same
case object for both arms, the ring arm through a Gpu proxy that swaps the module (build/
attention.cu + ATT_RING) and adds the ring's dynamic shared memory, so the launch arguments are
attention()'s own. Per (shape, ctx, hpb, splits): the outputs (out and the q8 twin) bit for bit,
then the time of each arm as the tune harness times it (a graph of L2-cold launches over `sets`
copies, experiments/attn_depth/probe.py), the arms' graphs timed in interleaved rounds.

    source .whl/setup.sh && python3 experiments/attn_ring/check.py > $OUT/attn-ring.jsonl

One JSON line per (shape, ctx, hpb, S, arm) with us, ref_us (attention.cu in the same rounds),
speedup, exact; a summary line at the end. Exit 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from make import make  # noqa: E402

SRC = "../experiments/attn_ring/build/attention.cu"  # relative to kernels/
SHAPES = (("8B", 32, 8, 128), ("1B", 32, 8, 64), ("SmolLM2", 9, 3, 64))
CTXS = (64, 1024, 4096, 16384)
RINGS = (2, 3)


class RingGpu:
    """The Gpu as attention() sees it for the ring arm: module() gives build/attention.cu with
    ATT_RING, launch() adds the ring's dynamic shared memory; everything else is the Gpu's."""

    def __init__(self, g, ring: int):
        self._g, self.ring = g, ring

    def __getattr__(self, name):
        return getattr(self._g, name)

    def module(self, kernel_file, defines=None):
        assert kernel_file == "attention.cu", kernel_file
        return self._g.module(SRC, {**dict(defines or {}), "ATT_RING": self.ring})

    def launch(self, kernel, grid, block, args, shmem: int = 0, pdl: bool = False):
        d = kernel.module.defines
        nbytes = self.ring * 2 * int(d.get("ATT_TILE", 64)) * int(d["HEAD_DIM"]) * 2
        if not getattr(kernel, "_ring_optin", False):
            # static + dynamic above 48 KB needs the opt-in even when the dynamic part alone is
            # <= 48 KB (head 64, ring 3: 48 KB + ~2-8 KB static), which Gpu.launch does not see
            kernel._smem_limit = 0
            kernel.allow_shared(max(nbytes, 1))
            kernel._ring_optin = True
        return self._g.launch(kernel, grid, block, args, shmem=nbytes, pdl=pdl)


def configs(ATT, nh, nkv, D, sms):
    """(ATT_WARPS, hpb, S): session 16's table layout (8 warps, one head a block, default_splits
    of its head blocks), the engine's heads_per_block at its default_splits, the whole GQA group at
    64 splits (session 16's best at depth); for head_dim 64 also the built-in rule's 4 warps
    (warps_for) at one head a block."""
    G = nh // nkv
    out = [(8, 1, ATT.default_splits(nh, sms))]
    h = ATT.heads_per_block(nkv, G)
    if h != 1:
        out.append((8, h, ATT.default_splits(nh // h, sms)))
    out.append((8, G, 64))
    if ATT.warps_for(D) != 8:
        out.append((ATT.warps_for(D), 1, ATT.default_splits(nh, sms)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--ctx", default=",".join(map(str, CTXS)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    make(HERE / "build" / "attention.cu")
    from memra.gpu import cuda
    from memra.gpu.compile import compile_many
    from memra.gpu.ops import attention as ATT
    from memra.gpu.ops.rope import kv_defines

    t_start = time.perf_counter()
    g = cuda.gpu()
    sms, rotate = g.info.sm_count, 2 * int(g.info.l2_bytes)
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    ctxs = [int(x) for x in args.ctx.split(",")]

    # every module, compiled in parallel into the cubin cache first
    jobs = []
    for name, nh, nkv, D in shapes:
        for w, hpb, _ in configs(ATT, nh, nkv, D, sms):
            d = {"HEAD_DIM": D, "N_GQA": hpb, **ATT.defines(D, {"ATT_WARPS": w}), "KV_BLOCK": 16,
                 **kv_defines((False, False))}
            jobs.append(("attention.cu", g.info.arch, d))
            jobs += [(SRC, g.info.arch, {**d, "ATT_RING": r}) for r in RINGS]
    for job, err, secs in compile_many(jobs):
        if err:
            print(json.dumps({"compile_error": str(job), "log": err[-2000:]}), flush=True)
            return 2
    print(json.dumps({"compiled": len(jobs), "s": round(time.perf_counter() - t_start, 1)}), file=sys.stderr,
          flush=True)

    rng = np.random.default_rng(7)
    bad, rows = 0, []
    for name, nh, nkv, D in shapes:
        cfgs = configs(ATT, nh, nkv, D, sms)
        for ctx in ctxs:
            c = ATT._TuneCase(g, {"hpb": 1}, nh, nkv, D, ctx, 1, rng, rotate)
            smax = max(S for _, _, S in cfgs)
            po, pml = ATT.scratch_shapes(1, nh, smax, D)
            c.part_o, c.part_ml = g.empty(po, np.float32), g.empty(pml, np.float32)
            nq = nh * D
            n = max(24, c.sets) // c.sets * c.sets
            for w, hpb, S in cfgs:
                c.hpb, c.S, c.config = hpb, S, {"hpb": hpb, "ATT_WARPS": w}
                arms = {"ref": g, **{f"ring{r}": RingGpu(g, r) for r in RINGS}}
                bits, exact = {}, {}
                for arm, gg in arms.items():  # set 0, poisoned outputs first
                    c.g = gg
                    c.out.view(np.float32, (nq,), 0).poison()
                    if c.q8:
                        c.xq.view(np.int8, (nq,), 0).poison()
                        c.xs.view(None, (nq // 32,), 0).fill_bytes(0xFF)
                    c.launch(0)
                    g.sync()
                    o = c.out.view(np.float32, (nq,), 0).numpy().view(np.uint32)
                    xq = c.xq.view(np.int8, (nq,), 0).numpy() if c.q8 else None
                    xs = c.xs.view(None, (nq // 32,), 0).numpy().view(np.uint8) if c.q8 else None
                    bits[arm] = (o, xq, xs)
                    if arm != "ref":
                        a = bits["ref"]
                        exact[arm] = bool(np.array_equal(a[0], o)) and (
                            not c.q8 or (np.array_equal(a[1], xq) and np.array_equal(a[2], xs)))
                        bad += not exact[arm]
                    if np.count_nonzero(c.counters.numpy()):
                        print(json.dumps({"error": f"{arm}: counters not left zero"}), flush=True)
                        bad += 1
                graphs = {}
                for arm, gg in arms.items():  # every arm captured before any is uploaded or launched
                    c.g = gg                  # (cuda.py Graph.upload: an uploaded, unlaunched graph
                    with g.capture() as graph:  # slowed every graph captured after it on the H200)
                        for i in range(n):
                            c.launch(i % c.sets)
                    graphs[arm] = graph
                c.g = g
                ms = {arm: [] for arm in arms}
                for graph in graphs.values():  # first launch (upload) of each, then timed rounds
                    graph.launch()
                g.sync()
                for _ in range(args.rounds):  # interleaved rounds
                    for arm, graph in graphs.items():
                        ms[arm] += list(g.time_ms(graph.launch, reps=args.reps, warmup=1))
                for graph in graphs.values():
                    graph.close()
                us = {arm: float(np.median(v)) * 1e3 / n for arm, v in ms.items()}
                regs = {}
                for arm, gg in arms.items():  # the modules attention() used (cached)
                    md = {"HEAD_DIM": D, "N_GQA": hpb, **ATT.defines(D, c.config), "KV_BLOCK": 16}
                    k = gg.module("attention.cu", md).kernel("attn_decode_rope")
                    regs[arm] = (k.num_regs, k.local_bytes)
                kv = 2 * ctx * nkv * D * 2
                for arm in arms:
                    rec = {"shape": name, "n_head": nh, "n_head_kv": nkv, "head_dim": D, "ctx": ctx, "warps": w, "hpb": hpb,
                           "S": S, "arm": arm, "us": round(us[arm], 2), "ref_us": round(us["ref"], 2),
                           "speedup": round(us["ref"] / us[arm], 3), "kv_gbps": round(kv / us[arm] / 1e3, 1),
                           "exact": exact.get(arm, True), "regs": regs[arm][0], "local_bytes": regs[arm][1], "launches": n, "sets": c.sets, "device": g.info.name}
                    rows.append(rec)
                    print(json.dumps(rec), flush=True)
            del c
    print(json.dumps({"summary": True, "cases": len(rows), "inexact": bad,
                      "s": round(time.perf_counter() - t_start, 1)}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
