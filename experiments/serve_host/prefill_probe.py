"""Prefill as `memra serve` runs it, against the one-sequence prompt `memra bench -p 512` times (session 58), and
one 100-token prompt (the c = 1 cell's TTFT).

host_bench.py's emulation matches the device's c = 64 cell (TTFT p50 ~460 ms, 4.1-4.2k t/s) only with prompts
at ~12k tokens/s, where pp512 of the 8B Q4_K_M read ~18k on the H100. This times, on the GPU, the runner's step()
over what a scheduler step hands it at c = 64 — R requests of ~100-token prompts in one call (2048-token budget:
20 of them; 8192: 64), each sampling its last row — and over one 512-token prompt, after memra serve's warm-up
(every prefill bucket captured). Per case: tokens, seconds (median of REPS, each after a device sync), tokens/s.

    python3 experiments/serve_host/prefill_probe.py MODEL.gguf [--ctx 640] [--reps 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=640)   # room for the 512-token case
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--emulate", action="store_true", help="on tests/gpu_emulator.py's FakeGpu (a CPU smoke run)")
    a = ap.parse_args()
    import numpy as np

    from memra.gpu.runner import Row, Sampling
    from memra.serve.scheduler import open_engine

    if a.emulate:
        sys.path.insert(0, str(ROOT / "tests"))
        from gpu_emulator import FakeGpu

        from memra.gpu.runner import Runner
        from memra.serve.scheduler import warm_up_gpu

        eng = Runner(a.model, gpu=FakeGpu(1 << 30), max_len=a.ctx, max_seqs=64)
        warm_up_gpu(eng)
    else:
        eng = open_engine(a.model, None, "gpu", ctx=a.ctx, parallel=64)   # warm_up_gpu: every bucket captured
    rng = np.random.default_rng(0)
    n_vocab = eng.cfg.n_vocab
    cases = [("1 x 100 (c = 1: its TTFT was 29-34 ms on the H100)", [100]), ("1 x 512", [512]),
             ("5 x 100", [100] * 5), ("20 x 100 (budget 2048)", [100] * 20),
             ("64 x 100 (budget 8192)", [100] * 64)]
    out = []
    for name, lens in cases:
        times = []
        for _ in range(a.reps + 1):   # the first is not kept
            seqs = [eng.open() for _ in lens]
            rows = [Row(s, rng.integers(1, n_vocab, n).tolist(), sample=Sampling(0.0)) for s, n in zip(seqs, lens)]
            eng.g.sync()
            t0 = time.perf_counter()
            eng.step(rows)
            eng.g.sync()
            times.append(time.perf_counter() - t0)
            for s in seqs:
                eng.close(s)
        t = statistics.median(times[1:])
        rec = {"case": name, "tokens": sum(lens), "median_s": round(t, 5), "tok_s": round(sum(lens) / t, 1),
               "reps": a.reps}
        out.append(rec)
        print(json.dumps(rec), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
