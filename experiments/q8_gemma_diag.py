"""Where does the GPU q8 path leave the q8 CPU reference on gemma3?

Teacher-forced on the reference's own greedy tokens, the GPU engine and the CPU reference run
the same token sequence; per step this prints max |Δlogit| and the reference's top-2 margin,
for the q8 path (against numerics="q8") and the f32 path (against numerics="f32"), on the tiny
synthetic gemma3 and llama models of the GPU tests.

What it showed on the H200 (71899b2, PDL on and off alike): q8 path 0.18-0.32 max |Δlogit| from
the first step on both models, f32 path 3e-3-1.4e-2. experiments/q8_flip_bisect.py then traced
the q8 gap on the CPU: not a mismatch but rint() roundings of the q8 activations flipped by
1e-5 float-order noise and amplified layer by layer.

Device: source .whl/setup.sh && python3 experiments/q8_gemma_diag.py   (carry .synthtok)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memra.gpu.engine import GPUEngine  # noqa: E402
from memra.model.gguf import open_gguf  # noqa: E402
from memra.cpu.reference import ReferenceModel  # noqa: E402
from memra.model.synth import synth  # noqa: E402

TOK = str(Path(__file__).resolve().parents[1] / ".synthtok" / "smollm2-tokenizer.gguf")
ids = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]
for arch in ("gemma3", "llama"):
    p = synth(Path(f"/tmp/diag-{arch}.gguf"), arch, "tiny", "Q4_K_M", 0, TOK)
    for path, numerics in (("q8", "q8"), ("f32", "f32")):
        ref = ReferenceModel(open_gguf(p), numerics=numerics)
        cache = ref.new_cache(64)
        eng = GPUEngine(str(p), n_ctx=64, matvec_path=path)
        lr = ref.forward(ids, cache)
        lg = eng.prefill(ids)
        rows = [(0, float(np.abs(lg - lr).max()), float(np.abs(lr).max()))]
        tok = int(np.argmax(lr))
        margins = []
        for step in range(1, 24):
            top = np.sort(lr)[-2:]
            margins.append(float(top[1] - top[0]))
            lr = ref.forward([tok], cache)
            lg = eng.decode(tok, graph=False)
            rows.append((step, float(np.abs(lg - lr).max()), float(np.abs(lr).max())))
            tok = int(np.argmax(lr))
        print(f"{arch} {path}: max|dlogit| per step " + " ".join(f"{d:.1e}" for _, d, _ in rows))
        print(f"   |logit| max {max(m for *_, m in rows):.1f}; ref margins min {min(margins):.3f}")
