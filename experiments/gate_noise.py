"""How far the GPU engine's teacher-forced log-probs sit from the CPU reference's when nothing
is wrong: the measurement behind memra.gpu.gate.TF_BOUND.

    python3 experiments/gate_noise.py [--emulated] [--path q8|f32] [--out FILE.jsonl] MODEL...

MODEL: an alias or GGUF path, or tiny:ARCH:QUANT (a tiny synthetic model, made in a temporary
folder). --emulated runs the engine on tests/gpu_emulator.py's FakeGpu (numpy, float64 sums:
another summation order than both the GPU and the reference), else on the GPU. For each model
and prompt: the cross-check's verdict and the per-position |Δ log-prob| (memra.gpu.gate:
next token, both top-1s) over TF_POSITIONS positions against ReferenceModel(numerics=path),
and the reference's median top-2 margin (a flat model makes the comparison vacuous). One JSON
line per (model, prompt), then a summary line.

Measured (CPU, emulated; research/2026-12-01-gates/, 2026-12-01):
    gate-noise-emulated-{q8,f32}.jsonl: tiny llama Q4_K_M / Q4_0, qwen2 Q8_0, qwen3 Q4_0 /
      Q5_K_M, gemma3 Q4_K_M / Q6_K (f32: one mix an architecture), smollm2-135m, gemma3-270m,
      32 positions: q8 max 0.245, p99 0.135; f32 max 0.0070, p99 0.0045
    gate-noise-emulated-{q8,f32}-80pos.jsonl: the two real models, 80 positions (the GPU
      tests' length): q8 max 0.258, largest median of a run 0.040; f32 max 0.0053
Run on the H200 (experiments/h200_gates.sh) for the GPU's own figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "Once upon a time, in a small village by the sea, there lived"]


def _path_of(spec: str, tmp: Path) -> tuple[str, Path]:
    if spec.startswith("tiny:"):
        from memra.model.synth import synth

        _, arch, quant = spec.split(":")
        return spec, synth(tmp / f"tiny-{arch}-{quant}.gguf", arch, "tiny", quant, 0, "smollm2-135m")
    from memra.model.aliases import resolve

    return spec, Path(resolve(spec))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--path", default="q8", choices=("q8", "f32"))
    ap.add_argument("--out")
    ap.add_argument("--positions", type=int, default=None, help="positions per prompt (default: TF_POSITIONS)")
    a = ap.parse_args()
    from memra.cpu.reference import ReferenceModel
    from memra.gpu import gate as G
    from memra.gpu.engine import GPUEngine
    from memra.model.gguf import open_gguf
    from memra.text.tokenizer import Tokenizer

    gpu = None
    if a.emulated:
        sys.path.insert(0, str(ROOT / "tests"))
        from gpu_emulator import FakeGpu
    out = open(a.out, "a") if a.out else None
    allv, rows = [], []
    with tempfile.TemporaryDirectory() as td:
        for spec in a.models:
            name, path = _path_of(spec, Path(td))
            g = open_gguf(path)
            if a.emulated:
                gpu = FakeGpu(3 << 30)
            n = a.positions or G.TF_POSITIONS
            eng = GPUEngine(g, n_ctx=max(96, n + 8), gpu=gpu, matvec_path=a.path)
            ref = ReferenceModel(g, numerics=a.path)
            tok = Tokenizer.from_gguf(g)
            for text in PROMPTS:
                t0 = time.perf_counter()
                ids = tok.encode(text, add_special=True, parse_special=True)
                x, t = G.run_gates(eng, ids, reference=ref, n=n)
                r_logits = G.reference_logits(ref, x.tokens[:t.positions])
                lp = G.log_softmax(r_logits)
                top = np.sort(lp, axis=-1)[:, -2:]
                row = {"model": name, "path": a.path, "emulated": a.emulated, "prompt": text[:24],
                       "cross_check": x.verdict, "positions": t.positions, "tf_verdict": t.verdict,
                       "max_delta": t.max_delta, "median_delta": t.median_delta, "worst": t.worst,
                       "deltas": [round(d, 8) for d in t.deltas],
                       "ref_median_margin": float(np.median(top[:, 1] - top[:, 0])),
                       "s": round(time.perf_counter() - t0, 1)}
                allv += t.deltas
                rows.append(row)
                line = json.dumps(row)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
            g.close()
    v = np.array(allv)
    summary = {"summary": True, "path": a.path, "emulated": a.emulated, "n": int(v.size),
               "max": float(v.max()), "median": float(np.median(v)), "p99": float(np.percentile(v, 99)),
               "per_model_max": {r["model"]: max(x["max_delta"] for x in rows if x["model"] == r["model"])
                                 for r in rows},
               "bound": G.TF_BOUND[a.path], "cross_check": sorted({r["cross_check"] for r in rows})}
    print(json.dumps(summary), flush=True)
    if out:
        out.write(json.dumps(summary) + "\n")
    return 0 if summary["max"] <= G.TF_BOUND[a.path] and "MISMATCH" not in summary["cross_check"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
