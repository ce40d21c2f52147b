"""What a decode graph of G steps costs to capture (MEMRA_GRAPH_STEPS): seconds to capture the
1-step and the G-step graph of one decode chunk key, per model, on the device. `memra run`
captures a chunk's graph lazily at each new split count or attention kind inside its decode
(the bench captures before its clock), so this is what the experiment would add there.

    python3 experiments/graph_steps_capture.py synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 \
        --synth-tokenizer .synthtok/smollm2-tokenizer.gguf > $OUT/graph-capture.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--synth-tokenizer", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=16)
    a = ap.parse_args()
    from memra.gpu.engine import GPUEngine
    from memra.gpu.runner import Sampling
    from memra.tune.bench import resolve_model

    for spec in a.models:
        name, path = resolve_model(spec, a.synth_tokenizer)
        e = GPUEngine(path, n_ctx=512)
        sm = [Sampling(0.0)]
        (_, sp, kd), = e.decode_chunks(0, 0, 16, 16)
        out = {"model": name, "device": e.g.info.name, "splits": sp, "kind": kd}
        before = set(e._graphs)
        e.decode_graph_at(1, sm, sp, kd, 1)   # compiles and loads the step's modules, captures its graph
        for k in set(e._graphs) - before:     # captured again below, modules loaded: the capture alone
            del e._graphs[k]
        for steps in (1, a.steps):
            e.g.sync()
            t0 = time.perf_counter()
            e.decode_graph_at(1, sm, sp, kd, steps)
            e.g.sync()
            out[f"capture_s_{steps}"] = round(time.perf_counter() - t0, 4)
        print(json.dumps(out), flush=True)
        del e


if __name__ == "__main__":
    main()
