"""Where the host time of a constrained decode step goes, on the CPU (no GPU needed).

    python3 experiments/structured_host.py [--tokenizer .synthtok/smollm2-tokenizer.gguf] [--steps 300]

A random walk through experiments/structured_speed.py's nested JSON schema (each step a
token drawn uniformly from the mask; a finished document starts over), at batch 1 and 16,
over SmolLM2's vocabulary (49152) and the same padded to Llama-3's 128256 (the synthetic
llama3-8b's). Per step it times: the fill (one row directly; 16 rows through llguidance's
LLExecutor pool, what memra.text.grammar.fill_masks did until now, and one by one, what it
does unless MEMRA_MASK_THREADS > 1); the matchers' consume; copying given mask rows into
the runner's host buffer (Runner._write_masks); and counts the positions where the mask
allows a single token (the grammar forces it: llguidance's fast-forward tokens).

What it showed (2-core CI box, 2026-12-01; noisy to +-30 %):
  vocab 49152:  batch 1 fill 0.025-0.06 ms, consume 0.004-0.008 ms; batch 16 fill
                0.7-1.9 ms (LLExecutor), one by one 0.35-0.7 ms, consume 0.1 ms
  vocab 128256: batch 1 fill 0.08-0.09 ms; batch 16 fill 1.1-2.2 ms (LLExecutor), one by
                one 0.8 ms, consume 0.13-0.2 ms
  mask row copy into the runner's buffer: 0.004-0.018 ms at batch 1, 0.06 ms at 16
  single-allowed positions: 73 % of the walk (1465 of 2000 steps; ff tokens non-empty at
  exactly those), compute_ff_tokens 0.02 ms
The fill is the host's cost, and llguidance's pool made it slower, not faster. On the
H200's host (session 5, the pool) it was 0.07-0.12 ms (batch 1) and 2.4-2.9 ms (batch 16),
longer than SmolLM2's whole batch-16 step (1.7 ms); an overlap with the device's step hides
it (memra.gpu.runner: Row.mask LATER). The forced
share says that appending forced tokens without sampling steps is the next large lever
(several tokens of one row in one step: the eager path, to be measured on the GPU)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))


def padded_tokenizer(src: str, n_vocab: int, out: Path) -> Path:
    from gguf import GGUFWriter

    from memra.model import synth

    w = GGUFWriter(out, "llama")
    synth._add_tokenizer(w, src, n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return out


def walk(tok, con, batch: int, steps: int, seed: int = 0) -> dict:
    import llguidance

    from memra.text.grammar import new_masks

    pool = llguidance.LLExecutor()  # llguidance's default: 80 % of the cores, up to 32

    def fill_masks(pairs, masks):
        if len(pairs) == 1:
            pairs[0][0].fill(masks[pairs[0][1]])
        else:
            pool.unsafe_compute_mask_ptr([(m.m, i) for m, i in pairs], masks.ctypes.data, masks.shape[1] * 4,
                                         masks.shape[0])

    rng = np.random.default_rng(seed)
    ms = [con.matcher() for _ in range(batch)]
    masks = new_masks(64, tok.n_vocab)
    host = np.empty_like(masks)
    t = {"fill": 0.0, "fill_one_by_one": 0.0, "consume": 0.0, "row_copy": 0.0}
    single = 0
    for step in range(steps):
        pairs = [(m, i) for i, m in enumerate(ms)]
        t0 = time.perf_counter()
        if step % 2 == 0 or batch == 1:
            fill_masks(pairs, masks)
            t["fill"] += time.perf_counter() - t0
        else:
            for m, i in pairs:
                m.fill(masks[i])
            t["fill_one_by_one"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(batch):
            host[i] = np.asarray(masks[i]).view(np.int32)
        t["row_copy"] += time.perf_counter() - t0
        toks = []
        for i in range(batch):
            ok = np.flatnonzero(np.unpackbits(masks[i].view(np.uint8), bitorder="little")[:tok.n_vocab])
            single += ok.size == 1
            toks.append(int(rng.choice(ok)))
        t0 = time.perf_counter()
        for m, k in zip(ms, toks):
            if not m.consume(k):
                raise RuntimeError(m.error)
            if m.stopped:
                m.m.reset()
        t["consume"] += time.perf_counter() - t0
    n_fill = steps if batch == 1 else (steps + 1) // 2
    out = {"fill_ms": 1e3 * t["fill"] / n_fill, "consume_ms": 1e3 * t["consume"] / steps,
           "row_copy_ms": 1e3 * t["row_copy"] / steps, "single_allowed": single / (steps * batch)}
    if batch > 1:
        out["fill_one_by_one_ms"] = 1e3 * t["fill_one_by_one"] / (steps // 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=str(ROOT / ".synthtok" / "smollm2-tokenizer.gguf"))
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()

    import tempfile

    from structured_speed import NESTED

    from memra.model.gguf import open_gguf
    from memra.text.grammar import compile_constraint
    from memra.text.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as d:
        for path in (Path(a.tokenizer), padded_tokenizer(a.tokenizer, 128256, Path(d) / "pad.gguf")):
            tok = Tokenizer.from_gguf(open_gguf(path))
            con = compile_constraint(tok, "json_schema", NESTED)
            for b in (1, 16):
                r = walk(tok, con, b, a.steps)
                print(f"vocab {tok.n_vocab} batch {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
