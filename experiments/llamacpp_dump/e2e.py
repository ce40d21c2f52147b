"""End to end: memra's numerics="llamacpp" against llama.cpp (the wheel, through libdump.so)
with the server's batching: the prompt in the batches its server makes (logits of the last
token), then each greedy token of llama.cpp's continuation decoded alone. Per position: are the logit vectors
bit-identical, max |d logit|, same argmax.

    python experiments/llamacpp_dump/e2e.py smollm2-135m [n_predict] [prompt index ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from dump import Dumper  # noqa: E402

from memra.model.aliases import resolve  # noqa: E402
from memra.model.gguf import open_gguf  # noqa: E402
from memra.cpu.reference import ReferenceModel  # noqa: E402
from memra.text.tokenizer import Tokenizer  # noqa: E402
from test_parity_models import LONG_PROMPT, PROMPTS, server_prompt_batches  # noqa: E402


def run(alias, n_predict=32, which=None):
    path = resolve(alias)
    g = open_gguf(path)
    tok = Tokenizer.from_gguf(g)
    eog = sorted(tok.eog_ids)
    m = ReferenceModel(g, numerics="llamacpp")
    d = Dumper(path)
    prompts = PROMPTS + [LONG_PROMPT]
    idx = which if which else range(len(PROMPTS))
    tot = same_bits = same_top = 0
    tm = 0.0
    for i in idx:
        ids = tok.encode(prompts[i])
        d.reset()
        cache = m.new_cache(len(ids) + n_predict)
        s = 0
        for n in server_prompt_batches(len(ids), swa=m.cfg.swa_window > 0):  # the server's batches
            lc = d.eval(ids[s:s + n])
            t0 = time.time()
            mm = m.forward(ids[s:s + n], cache)
            tm += time.time() - t0
            s += n
        row = []
        for step in range(n_predict):
            a = lc.copy()
            a[eog] = -np.inf
            b = mm.copy()
            b[eog] = -np.inf
            t = int(np.argmax(a))
            eq = np.array_equal(lc.view(np.uint32), mm.view(np.uint32))
            tot += 1
            same_bits += eq
            same_top += int(np.argmax(b)) == t
            row.append("=" if eq else ("~" if int(np.argmax(b)) == t else "X"))
            if not eq and row.count("=") == len(row) - 1:
                dd = np.abs(lc.astype(np.float64) - mm)
                print(f"  prompt {i}: first difference at step {step}: max|d| {dd.max():.3e}, "
                      f"{(dd > 0).mean() * 100:.1f} % of logits")
            if step + 1 < n_predict:
                lc = d.eval([t])
                t0 = time.time()
                mm = m.forward([t], cache)
                tm += time.time() - t0
        print(f"prompt {i} ({len(ids)} tokens): {''.join(row)}")
    print(f"{alias}: bit-identical logits at {same_bits}/{tot} positions, same top-1 {same_top}/{tot}; "
          f"memra {tm:.1f} s")


if __name__ == "__main__":
    a = sys.argv[1:]
    run(a[0] if a else "smollm2-135m", int(a[1]) if len(a) > 1 else 32, [int(v) for v in a[2:]] or None)
