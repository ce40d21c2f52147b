"""Constrained vs unconstrained decode speed on the GPU runner (issue 13's speed floor).

    python3 experiments/structured_speed.py --model synth:llama3-8b:Q4_K_M --batch 1,16 \
        --steps 128 --reps 5 --out $OUT/structured.jsonl

What it measures: `batch` sequences decoding `steps` tokens through Runner.step (the decode
graph of the bucket), greedy, in two arms interleaved A/B/A/B `reps` times:
  free  — no constraint (the graph without the mask kernel);
  json  — every row under a nested JSON schema (tests/test_structured.py's "nested"):
          each step fills the rows' masks with llguidance's batch fill on the host, uploads
          them, and the graph applies them (kernels/mask.cu) before the argmax; the chosen
          tokens are consumed by the matchers. A row whose JSON is complete starts a new one
          (its matcher is reset), so every step of the arm is constrained.
tok/s = batch * steps / wall time of the steps (host mask work included: it is what a
server pays today; the fill is not yet overlapped with the GPU step). Each line of --out
is one arm of one rep; a summary line per (model, batch) gives the median ratio json/free.
Synthetic models decode at their real speed (memra synth: random but valid weights); the
JSON constraint keeps their random text valid JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NESTED = {"type": "object", "properties": {
    "order": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "status": {"enum": ["open", "paid", "shipped"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}}},
        "required": ["id", "status", "items"], "additionalProperties": False},
    "paid": {"type": "boolean"}},
    "required": ["order", "paid"], "additionalProperties": False}


def run_arm(r, tok, con, batch: int, steps: int, json_mode: bool, prompt: list[int]) -> dict:
    from memra.gpu.runner import Row, Sampling
    from memra.text.grammar import fill_masks, new_masks

    greedy = Sampling(0.0)
    seqs = [r.open() for _ in range(batch)]
    try:
        matchers = [con.matcher() for _ in range(batch)] if json_mode else None
        masks = new_masks(max(batch, 1), tok.n_vocab)

        def rows_of(feeds):
            if json_mode:
                fill_masks([(m, i) for i, m in enumerate(matchers)], masks)
            return [Row(s, f, sample=greedy, mask=masks[i] if json_mode else None) for i, (s, f) in
                    enumerate(zip(seqs, feeds))]

        def commit(outs):
            toks = [o.token for o in outs]
            if json_mode:
                for m, t in zip(matchers, toks):
                    if not m.consume(t):
                        raise RuntimeError(f"the grammar rejected token {t}: {m.error}")
                    if m.stopped:
                        m.m.reset()
            return toks

        toks = commit(r.step(rows_of([prompt] * batch)))
        r.g.sync()
        fill_s = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            tf = time.perf_counter()
            rows = rows_of([[t] for t in toks])
            fill_s += time.perf_counter() - tf
            toks = commit(r.step(rows))
        r.g.sync()
        wall = time.perf_counter() - t0
    finally:
        for s in seqs:
            r.close(s)
    return {"tok_s": batch * steps / wall, "step_ms": 1e3 * wall / steps,
            "mask_fill_ms": 1e3 * fill_s / steps if json_mode else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", required=True, help="alias, GGUF path or synth:SHAPE:QUANT")
    ap.add_argument("--tokenizer-from", default="smollm2-135m", help="the synthetic models' tokenizer")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from memra.gpu.runner import Runner
    from memra.model.gguf import open_gguf
    from memra.text.grammar import compile_constraint
    from memra.text.tokenizer import Tokenizer
    from memra.tune.bench import resolve_model
    from memra.tune.receipts import git_sha, utc_now

    batches = [int(b) for b in a.batch.split(",")]
    out = open(a.out, "a")
    for spec in a.model:
        name, path = resolve_model(spec, a.tokenizer_from)
        g = open_gguf(path)
        tok = Tokenizer.from_gguf(g)
        con = compile_constraint(tok, "json_schema", NESTED)
        r = Runner(g, max_len=a.steps + 64, max_seqs=max(batches))
        prompt = tok.encode("Reply with the order as JSON:", add_special=True)
        for b in batches:  # warm: both graphs captured, llguidance's pool started
            run_arm(r, tok, con, b, 4, False, prompt)
            run_arm(r, tok, con, b, 4, True, prompt)
        res: dict = {}
        for rep in range(a.reps):
            for b in batches:
                for mode in (("free", "json") if rep % 2 == 0 else ("json", "free")):
                    m = run_arm(r, tok, con, b, a.steps, mode == "json", prompt)
                    res.setdefault((b, mode), []).append(m["tok_s"])
                    line = {"schema": "memra.structured-speed/1", "ts": utc_now(), "git_sha": git_sha(),
                            "device": r.g.info.name, "model": name, "spec": spec, "batch": b, "mode": mode,
                            "steps": a.steps, "rep": rep, **m}
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    print(f"{name} batch {b} {mode}: {m['tok_s']:.1f} tok/s ({m['step_ms']:.3f} ms a step, "
                          f"mask fill {m['mask_fill_ms']:.3f} ms)", flush=True)
        for b in batches:
            free, js = statistics.median(res[(b, "free")]), statistics.median(res[(b, "json")])
            ratios = [j / f for j, f in zip(res[(b, "json")], res[(b, "free")])]
            line = {"schema": "memra.structured-speed-summary/1", "ts": utc_now(), "git_sha": git_sha(),
                    "device": r.g.info.name, "model": name, "batch": b, "free_tok_s": free, "json_tok_s": js,
                    "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "reps": a.reps, "floor": 0.95, "meets_floor": statistics.median(ratios) >= 0.95}
            out.write(json.dumps(line) + "\n")
            print(f"SUMMARY {name} batch {b}: json/free = {line['ratio_median']:.3f} "
                  f"(min {line['ratio_min']:.3f}, max {line['ratio_max']:.3f}) free {free:.1f} json {js:.1f} tok/s",
                  flush=True)
        del r
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
