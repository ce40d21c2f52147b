"""What a launch boundary costs in a decode step (issue 14 item 5's opportunity), on the device:
a CUDA graph of N `phase` launches with PDL (the engine's way: one launch per op) against one
`persist` launch running the same N phases with a grid barrier between them (persist.cu). Each
phase streams `bytes` from its own region of a buffer larger than the L2 (as a decode step's
matvecs stream their weights), over the same grid in both arms.

    python3 experiments/persist/probe.py [--phases 240] [--bytes 0,65536,524288,4194304] [--blocks 132,264]

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=240)
    ap.add_argument("--bytes", default="0,65536,524288,4194304")
    ap.add_argument("--blocks", default="132,264")
    ap.add_argument("--threads", type=int, default=256)
    args = ap.parse_args()
    g = gpu()
    m = g.module(SRC, {})
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

            out = {}
            for name, fn in (("launches", launches), ("persist", one)):
                fn()
                g.sync()
                with g.capture() as gr:
                    fn()
                gr.upload()
                ms = np.median(g.time_ms(gr.launch, reps=20, warmup=3))
                gr.close()
                out[name] = float(ms) * 1e3 / N
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


if __name__ == "__main__":
    sys.exit(main())
