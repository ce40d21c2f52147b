"""Decode over 512+ KV cells (llama.cpp's split-KV flash attention, one chunk per thread):
a ~300-token context filled in batches of 48 (each under the 64-query tiled attention), then
greedy decode steps; memra's logits against the wheel's, bit for bit.

    python experiments/llamacpp_dump/split_kv.py [smollm2-135m] [n_steps]
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from dump import Dumper  # noqa: E402

from memra.model.aliases import resolve  # noqa: E402
from memra.model.gguf import open_gguf  # noqa: E402
from memra.cpu.reference import ReferenceModel  # noqa: E402
from memra.text.tokenizer import Tokenizer  # noqa: E402
from test_parity_models import LONG_PROMPT  # noqa: E402


def main(alias="smollm2-135m", n_steps="8"):
    path = resolve(alias)
    g = open_gguf(path)
    ids = Tokenizer.from_gguf(g).encode(LONG_PROMPT)[:300]
    m = ReferenceModel(g, numerics="llamacpp")
    d = Dumper(path)
    cache = m.new_cache(len(ids) + int(n_steps))
    for s in range(0, len(ids), 48):
        lc = d.eval(ids[s:s + 48])
        mm = m.forward(ids[s:s + 48], cache)
    same = []
    for _ in range(int(n_steps)):
        same.append(np.array_equal(lc.view(np.uint32), mm.view(np.uint32)))
        t = int(np.argmax(lc))
        lc, mm = d.eval([t]), m.forward([t], cache)
    print(f"{alias}: {len(ids)} cells filled, decode steps bit-identical: {same}")


if __name__ == "__main__":
    main(*sys.argv[1:])
