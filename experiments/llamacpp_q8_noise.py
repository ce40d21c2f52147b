"""How much does llama.cpp (CPU, xllamacpp) disagree with itself on the real models?

What it showed (SmolLM2-135M Q4_1, 16 prompts x 32 greedy tokens, 2 threads): teacher-forcing
llama.cpp with an f32 KV cache and no flash attention on the continuation that llama.cpp with
its defaults (f16 KV cache, flash attention auto) generated gives the same top-1 token at only
97.85 % of positions, median |delta log-prob| 0.022, p90 0.095. The CPU reference against
llama.cpp's defaults measures 97.1 % / 0.019 on the same prompts (Gemma-3-270M Q4_K_M:
97.1 % / 0.018). With every weight stored as F32 (so llama.cpp does not quantize activations)
the reference agrees to a median of 0.0003 and 100 % top-1.

Why: for quantized weights llama.cpp rounds each activation row to 8 bits (q8_0/q8_1/q8_K)
before its integer dot products. On these small models that perturbs log-probs by ~0.02 and
is chaotic: a 1e-4 upstream change (f16 vs f32 KV) flips enough roundings to re-draw the noise.
An emulation of the q8 rounding alone therefore cannot track llama.cpp; what does is every
float operation in llama.cpp's own order: ReferenceModel(numerics="llamacpp") now gives
llama.cpp's logits bit for bit on both models (experiments/llamacpp_dump), and
tests/test_parity_models.py holds the 99 % top-1 bound on the quantized files.

Run: python experiments/llamacpp_q8_noise.py [smollm2-135m|gemma3-270m]
"""

import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import peer as P  # noqa: E402
from memra.model.aliases import resolve  # noqa: E402

PROMPTS = [
    "The capital of France is", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village,", "The three primary colors are",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "1, 2, 3, 5, 8, 13,",
    "La tour Eiffel est située à", "Here is a list of healthy breakfast ideas:\n1.",
    "import numpy as np\n\nx = np.arange(10)\n", "Water boils at a temperature of",
    "In 1969, the first humans", "The quick brown fox",
    "Q: What is the largest planet in the solar system?\nA:", "Dear Sir or Madam,\n\nI am writing to",
    "SELECT name, age FROM users WHERE", "Photosynthesis is the process by which",
]


class F32KVPeer(P.LlamaCppPeer):
    """llama.cpp with an f32 KV cache and flash attention off (everything else as the peer)."""

    def __init__(self, path):
        import xllamacpp as x

        p = x.CommonParams()
        p.model.path = str(path)
        p.n_ctx, p.n_parallel, p.n_batch = 4096, 1, 512
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
        p.port = P._free_port()
        p.warmup = False
        p.cache_type_k = p.cache_type_v = 0  # GGML_TYPE_F32
        p.flash_attn_type = 0  # disabled
        self._server = x.Server(p)
        self.url = self._server.listening_address
        self._http = httpx.Client(base_url=self.url, timeout=600)


def main(alias: str = "smollm2-135m") -> None:
    path = resolve(alias)
    a, b = P.LlamaCppPeer(path), F32KVPeer(path)
    same, deltas = [], []
    for text in PROMPTS:
        ids = a.tokenize(text)
        ra = a.complete(ids, 32, n_probs=8)
        for i, tok in enumerate(ra["ids"]):  # teacher-force b on a's continuation
            rb = b.complete(ids + ra["ids"][:i], 1, n_probs=8)
            same.append(ra["top"][i][0][0] == rb["top"][0][0][0])
            db = dict(rb["top"][0])
            if tok in db:
                deltas.append(abs(dict(ra["top"][i])[tok] - db[tok]))
    print(f"{alias}: llama.cpp (f16 KV, FA auto) vs llama.cpp (f32 KV, no FA): top-1 agree "
          f"{np.mean(same):.4f} over {len(same)} positions, median |d logprob| {np.median(deltas):.4f}, "
          f"p90 {np.percentile(deltas, 90):.4f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
