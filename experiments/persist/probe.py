"""What a launch boundary costs in a decode step (issue 14 item 5's opportunity), on the device:
a CUDA graph of N `phase` launches with PDL (the engine's way: one launch per op) against one
`persist` launch running the same N phases with a grid barrier between them (persist.cu). Each
phase streams `bytes` from its own region of a buffer larger than the L2 (as a decode step's
matvecs stream their weights), over the same grid in both arms.

    python3 experiments/persist/probe.py [--phases 240] [--bytes 0,65536,524288,4194304] [--blocks 132,264]
    python3 experiments/persist/probe.py --tail [--rows 576,4096]   # session 23: a one-block op
                                                                  # in its producer's tail
    python3 experiments/persist/probe.py --cluster [--sizes 8,16]   # session 46: one cluster, phases
                                                                  # split by the cluster barrier (cluster.cu)

One JSON line per (bytes, blocks): µs per phase in each arm (medians of graph replays), the
difference (what removing a launch boundary saves, per boundary), GB/s of the streaming. A
SmolLM2 decode step is ~244 launches in ~479 µs (docs/PERFORMANCE.md): the saving per boundary
times that count bounds what a persistent decode kernel could buy there.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from memra.gpu.cuda import gpu

SRC = "../experiments/persist/persist.cu"  # relative to kernels/


def graph_us(g, fn) -> float:
    """fn's launches run once, then captured in a graph: µs a replay (median of 20)."""
    fn()
    g.sync()
    with g.capture() as gr:
        fn()
    gr.upload()
    us = float(np.median(g.time_ms(gr.launch, reps=20, warmup=3))) * 1e3
    gr.close()
    return us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=240)
    ap.add_argument("--bytes", default="0,65536,524288,4194304")
    ap.add_argument("--blocks", default="132,264")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--tail", action="store_true", help="N x (phase, rowop) launches against N phase_tail")
    ap.add_argument("--rows", default="576,4096", help="--tail: the one-block op's row lengths")
    ap.add_argument("--cluster", action="store_true", help="one cluster's persistent launch (cluster.cu)")
    ap.add_argument("--sizes", default="8,16", help="--cluster: cluster sizes (blocks, one an SM)")
    args = ap.parse_args()
    g = gpu()
    if args.cluster:
        return cluster(g, args)
    m = g.module(SRC, {})
    if args.tail:
        return tail(g, m, args)
    k_phase, k_persist = m.kernel("phase"), m.kernel("persist")
    N = args.phases
    dst = g.empty(4096, np.float32)
    bar = g.to_device(np.zeros(2, np.uint32))
    for nbytes in (int(x) for x in args.bytes.split(",")):
        words = max(1, nbytes // 16) if nbytes else 0
        src = g.empty(max(16, words * 16 * N), np.uint8)   # N distinct regions: N x bytes (> L2 for the larger sizes)
        src.fill_bytes(0)
        for nb in (int(x) for x in args.blocks.split(",")):
            def launches():
                for k in range(N):
                    g.launch(k_phase, (nb,), (args.threads,), (src, dst, np.int64(words), np.int32(k)), pdl=True)

            def one():
                g.launch(k_persist, (nb,), (args.threads,), (src, dst, np.int64(words), np.int32(N), bar), pdl=True)

            out = {name: graph_us(g, fn) / N for name, fn in (("launches", launches), ("persist", one))}
            if int(bar.numpy()[0]) != 0:
                print(json.dumps({"error": "barrier counter left non-zero"}))
                return 1
            gbps = {k: (nbytes / (v * 1e-6) / 1e9 if nbytes else None) for k, v in out.items()}
            print(json.dumps({"phases": N, "bytes": nbytes, "blocks": nb, "threads": args.threads,
                              "us_per_phase_launches": round(out["launches"], 3),
                              "us_per_phase_persist": round(out["persist"], 3),
                              "saved_us_per_boundary": round(out["launches"] - out["persist"], 3),
                              "gbps_launches": gbps["launches"] and round(gbps["launches"], 1),
                              "gbps_persist": gbps["persist"] and round(gbps["persist"], 1)}), flush=True)
    return 0


def tail(g, m, args) -> int:
    """A RMSNorm-shaped one-block op (rowop) as its own PDL launch after each phase, against the same
    work done by the phase's last block (phase_tail: a fence and a count per block, the last one
    reads the row back). Checks that both arms write the same row, then times the two graphs."""
    k_phase, k_row, k_tail = m.kernel("phase"), m.kernel("rowop"), m.kernel("phase_tail")
    N, T = args.phases, 256
    dst = g.empty(4096, np.float32)
    cnt = g.to_device(np.zeros(1, np.uint32))
    row = g.to_device(np.random.default_rng(0).standard_normal(4096).astype(np.float32))
    outs = {a: g.empty(4096, np.float32) for a in ("pairs", "tail")}
    for nbytes in (int(x) for x in args.bytes.split(",")):
        words = max(1, nbytes // 16) if nbytes else 0
        src = g.empty(max(16, words * 16 * N), np.uint8)
        src.fill_bytes(0)
        for nb in (int(x) for x in args.blocks.split(",")):
            for n in (int(x) for x in args.rows.split(",")):
                def pairs():
                    for k in range(N):
                        g.launch(k_phase, (nb,), (T,), (src, dst, np.int64(words), np.int32(k)), pdl=True)
                        g.launch(k_row, (1,), (T,), (dst, row, outs["pairs"], np.int32(n), np.int32(nb)), pdl=True)

                def tails():
                    for k in range(N):
                        g.launch(k_tail, (nb,), (T,), (src, dst, np.int64(words), np.int32(k), row, outs["tail"],
                                                       np.int32(n), cnt), pdl=True)

                res = {name: graph_us(g, fn) / N for name, fn in (("pairs", pairs), ("tail", tails))}
                a, b = outs["pairs"].numpy()[:n], outs["tail"].numpy()[:n]
                same = bool(np.array_equal(a, b))
                if int(cnt.numpy()[0]) != 0 or not same:
                    print(json.dumps({"error": "tail counter left non-zero or rows differ", "same": same}))
                    return 1
                print(json.dumps({"mode": "tail", "phases": N, "bytes": nbytes, "blocks": nb, "row": n,
                                  "us_per_phase_pairs": round(res["pairs"], 3),
                                  "us_per_phase_tail": round(res["tail"], 3),
                                  "saved_us_per_launch": round(res["pairs"] - res["tail"], 3)}), flush=True)
    return 0


def cluster(g, args) -> int:
    """One cluster of `size` blocks (one an SM: the dynamic shared memory keeps a second block off) running N
    phases in one launch (cluster.cu's modes: 0 barrier + DSMEM exchange, 1 streaming alone, 2 mode 0 with the
    next phase's loads in flight across the barrier), against graphs of N PDL `phase` launches on `size` and on
    132 blocks. Modes 0 and 2 must leave the same values; the JSON line gives µs a phase of each arm."""
    from cuda.core import LaunchConfig, launch

    k_phase = g.module(SRC, {}).kernel("phase")
    k_cl = g.module("../experiments/persist/cluster.cu", {}).kernel("cl_persist")
    smem = 120 * 1024
    k_cl.allow_shared(smem)
    k_cl.allow_nonportable_cluster()
    N, T = args.phases, args.threads
    dst = g.empty(4096, np.float32)
    for nbytes in (int(x) for x in args.bytes.split(",")):
        words = max(1, nbytes // 16) if nbytes else 0
        src = g.empty(max(16, words * 16 * N), np.uint8)
        src.fill_bytes(0)
        for cs in (int(x) for x in args.sizes.split(",")):
            def launches(nb):
                def fn():
                    for k in range(N):
                        g.launch(k_phase, (nb,), (T,), (src, dst, np.int64(words), np.int32(k)), pdl=True)
                return fn

            def persist(mode):
                def fn():
                    cfg = LaunchConfig(grid=(cs, 1, 1), cluster=(cs, 1, 1), block=(T,), shmem_size=smem,
                                       programmatic_stream_serialization=True)
                    launch(g._target, cfg, k_cl._k, np.uint64(src.ptr), np.uint64(dst.ptr), np.int64(words),
                           np.int32(N), np.int32(mode))
                return fn

            row = {"mode": "cluster", "phases": N, "bytes": nbytes, "size": cs, "threads": T}
            vals = {}
            try:
                for name, fn in ((f"launches_{cs}", launches(cs)), ("launches_132", launches(132)),
                                 ("cl_barrier", persist(0)), ("cl_stream", persist(1)), ("cl_prefetch", persist(2))):
                    row[f"us_per_phase_{name}"] = round(graph_us(g, fn) / N, 3)
                    if name in ("cl_barrier", "cl_prefetch"):
                        vals[name] = dst.numpy()[:cs].copy()
            except Exception as e:  # a cluster size the part cannot place: say so, go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(json.dumps(row), flush=True)
                g.sync()
                continue
            row["same_values"] = bool(len(vals) == 2 and np.array_equal(vals["cl_barrier"], vals["cl_prefetch"]))
            if nbytes:
                for k in [k for k in row if k.startswith("us_per_phase_")]:
                    row["gbps_" + k[len("us_per_phase_"):]] = round(nbytes / (row[k] * 1e-6) / 1e9, 1)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
