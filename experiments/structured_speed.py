"""Constrained vs unconstrained decode speed on the GPU runner (issue 13's speed floor).

    python3 experiments/structured_speed.py --model synth:llama3-8b:Q4_K_M --batch 1,16 \
        --steps 128 --reps 5 --out $OUT/structured.jsonl

What it measures: `batch` sequences decoding `steps` tokens through Runner.step (the decode
graph of the bucket), greedy, in two arms interleaved A/B/A/B `reps` times:
  free  — no constraint (the graph without the mask kernel);
  json  — every row under a nested JSON schema (tests/test_structured.py's "nested"), the
          server's path: rows carry mask=LATER and the step's fill callback runs
          llguidance's batch fill into the runner's pinned mask buffer while the device runs
          the step's body (embedding .. logits); the runner then queues the asynchronous
          copy and the tail graph (kernels/mask.cu, then the argmax); the chosen tokens are
          consumed by the matchers. A row whose JSON is complete starts a new one (its
          matcher is reset), so every step of the arm is constrained.
  json-sync — the same, the masks filled on the host before the step (the path before the
          overlap; what MEMRA_MASK_OVERLAP=0 gives the server).
  json-ff — json with forced tokens fast-forwarded (memra.text.grammar.fast_forward, the
          server's path): after a sampled token the tokens the grammar forces are emitted
          without sampling and fed, sampled after the last under the mask fast_forward left,
          the way the scheduler (memra.serve.scheduler.Scheduler._step) feeds them: a
          memra.text.grammar.FeedCosts (one for the runner, kept across reps as a server
          keeps its scheduler's) picks per step from measured times between one joint call
          — one row's run alone as a verification step (Runner.verify with masks: a graph
          per row count), several rows' runs as one eager Runner.step call of multi-token
          rows — and dripping them a token a decode step beside the others; rows without a
          run take the decode graph with mask=LATER and the overlapped fill. Every row emits
          the same steps + 1 tokens as in json (a forced run is cut at that count).
          MEMRA_FORCED=always: the joint call every time (the behaviour before the policy).
tok/s = emitted tokens (batch * steps; json-ff: forced ones included) / wall time of the
steps (host mask work included). Each line of --out is one arm of one rep (mask_fill_ms: the
fill's host time a step; json-ff: per emitted token of a row, fast_forward's included, and
also `forced` tokens, `row_steps` (the rows' model steps: their sampled tokens),
`steps_per_token` (row_steps / emitted tokens; 1 in the other arms), `calls` (runner calls),
`graph_calls`, `verify_calls`, `eager_calls` (of them: decode graph steps, verification
steps, eager steps), `drip_rows` (run tokens fed one a decode step) and `identical` (row 0
emitted json's tokens: fast-forward changed nothing)); a summary line per (model, batch) gives the median ratios json/free, json-sync/free and
json-ff/free, and json-ff's FeedCosts so far (ff_taken: steps fed by verify / eager / drip;
ff_costs_ms: its time estimates by path:size).
Session 5 (H200, 1acf818, the sync path): 8B 0.920 (batch 1) / 0.749 (batch 16); SmolLM2
0.784 / 0.418, the fill 0.07-0.12 ms a step at batch 1 and 2.4-2.9 ms at batch 16.
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


MODES = ("free", "json", "json-sync", "json-ff")


def run_arm(r, tok, con, batch: int, steps: int, mode: str, prompt: list[int], costs=None) -> dict:
    from memra.gpu.runner import LATER, Row, Sampling
    from memra.text.grammar import fill_masks, new_masks

    if mode == "json-ff":
        return run_ff_arm(r, tok, con, batch, steps, prompt, costs)
    greedy = Sampling(0.0)
    json_mode = mode != "free"
    seqs = [r.open() for _ in range(batch)]
    fill_s = 0.0
    try:
        matchers = [con.matcher() for _ in range(batch)] if json_mode else None
        masks = new_masks(max(batch, 1), tok.n_vocab)
        pairs = [(m, i) for i, m in enumerate(matchers)] if json_mode else []

        def fill(buf):
            nonlocal fill_s
            tf = time.perf_counter()
            fill_masks(pairs, buf)
            fill_s += time.perf_counter() - tf

        def step(feeds):
            if mode == "json":
                return r.step([Row(s, f, sample=greedy, mask=LATER) for s, f in zip(seqs, feeds)], fill=fill)
            if mode == "json-sync":
                fill(masks)
            return r.step([Row(s, f, sample=greedy, mask=masks[i] if json_mode else None) for i, (s, f) in
                           enumerate(zip(seqs, feeds))])

        def commit(outs):
            toks = [o.token for o in outs]
            if json_mode:
                for m, t in zip(matchers, toks):
                    if not m.consume(t):
                        raise RuntimeError(f"the grammar rejected token {t}: {m.error}")
                    if m.stopped:
                        m.m.reset()
            return toks

        toks = commit(step([prompt] * batch))
        row0 = [toks[0]]
        r.g.sync()
        fill_s = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            toks = commit(step([[t] for t in toks]))
            row0.append(toks[0])
        r.g.sync()
        wall = time.perf_counter() - t0
    finally:
        for s in seqs:
            r.close(s)
    return {"tok_s": batch * steps / wall, "step_ms": 1e3 * wall / steps,
            "mask_fill_ms": 1e3 * fill_s / steps if json_mode else 0.0, "row0": row0}


def run_ff_arm(r, tok, con, batch: int, steps: int, prompt: list[int], costs=None) -> dict:
    """Arm json-ff: every row emits steps + 1 tokens (the first from the prompt's step, not
    timed), forced runs fast-forwarded and fed as the server's scheduler feeds them; see the
    module docstring. costs: the memra.text.grammar.FeedCosts that decides (kept across
    calls, as a server keeps its scheduler's; a fresh one when None)."""
    from memra.gpu.runner import LATER, MAX_ROWS, Row, Sampling
    from memra.text.grammar import FeedCosts, fast_forward, fill_masks, new_masks, one_hot

    costs = costs if costs is not None else FeedCosts()
    greedy = Sampling(0.0)
    seqs = [r.open() for _ in range(batch)]
    matchers = [con.matcher() for _ in range(batch)]
    masks = new_masks(batch, tok.n_vocab)  # row i's mask after its forced run
    feed: list[list[int]] = [list(prompt) for _ in range(batch)]  # what each row feeds next
    ready = [False] * batch  # masks[i] holds row i's next mask (fast_forward computed it)
    emitted = [0] * batch
    row0: list[int] = []
    target = steps + 1
    zero = {"fill_s": 0.0, "forced": 0, "calls": 0, "row_steps": 0, "graph_calls": 0, "eager_calls": 0,
            "verify_calls": 0, "drip_rows": 0}
    st = dict(zero)

    def take(i: int, t: int, ff: bool = True) -> None:
        """Row i's sampled token t: consumed, then (ff) its forced run, cut at the target
        count (a finished document starts over, as in the other arms)."""
        m = matchers[i]
        if not m.consume(t):
            raise RuntimeError(f"the grammar rejected token {t}: {m.error}")
        emitted[i] += 1
        st["row_steps"] += 1
        feed[i], ready[i] = [t], False
        if i == 0:
            row0.append(t)
        if ff:
            forward(i)

    def forward(i: int) -> None:
        m = matchers[i]
        tf = time.perf_counter()
        while emitted[i] < target:
            if m.stopped:
                m.m.reset()
            forced, ready[i] = fast_forward(m, target - emitted[i], masks[i])
            feed[i] += forced
            emitted[i] += len(forced)
            st["forced"] += len(forced)
            if i == 0:
                row0.extend(forced)
            if not m.stopped:
                break
        st["fill_s"] += time.perf_counter() - tf

    def own_mask(i: int) -> np.ndarray:
        if not ready[i]:
            tf = time.perf_counter()
            matchers[i].fill(masks[i])
            ready[i] = True
            st["fill_s"] += time.perf_counter() - tf
        return masks[i]

    def step(live: list[int], first: bool = False) -> None:
        """One scheduler step over the live rows (memra.serve.scheduler.Scheduler._step's
        choices): rows with forced runs are fed jointly — one verification step when a
        single row has one (Runner.verify with masks: one-hot rows for the forced tokens,
        then the row's own mask), else one eager call — or dripped a token a decode step,
        as costs decides from the measured times; the prompts' step is eager."""
        plain = [i for i in live if len(feed[i]) == 1]
        multi = [i for i in live if len(feed[i]) > 1]
        drip, ver = [], None
        if multi and not first:
            joint = "verify" if len(multi) == 1 and len(feed[multi[0]]) <= MAX_ROWS else "eager"
            pick = costs.choose([len(feed[i]) for i in multi], len(plain), joint)
            if pick == "drip":
                drip, multi = multi, []
            elif pick == "verify":
                ver, multi = multi[0], []
        rows_dec = plain + drip
        if rows_dec:  # the decode graph, the sampled rows' masks filled while the device runs the body
            pairs = [(matchers[i], k) for k, i in enumerate(rows_dec) if i in plain]

            def fill(buf):
                tf = time.perf_counter()
                fill_masks(pairs, buf)
                st["fill_s"] += time.perf_counter() - tf

            rows = [Row(seqs[i], feed[i], sample=greedy, mask=LATER) if i in plain else Row(seqs[i], feed[i][:1])
                    for i in rows_dec]
            t0 = time.perf_counter()
            outs = r.step(rows, fill=fill) if pairs else r.step(rows)
            costs.observe("graph", len(rows), time.perf_counter() - t0)
            st["calls"] += 1
            st["graph_calls"] += 1
            for i, o in zip(rows_dec, outs):
                if i in plain:
                    take(i, o.token, not first)
                else:  # a dripped run: the next token next step, the last one sampled
                    feed[i], ready[i] = feed[i][1:], False
                    st["drip_rows"] += 1
        if ver is not None:  # one row's run as a verification step (a captured graph)
            i = ver
            m = np.concatenate([one_hot(feed[i][1:], tok.n_vocab), own_mask(i)[None, :]])
            t0 = time.perf_counter()
            out = r.verify(seqs[i], feed[i], greedy, masks=m)
            costs.observe("verify", len(feed[i]), time.perf_counter() - t0)
            st["calls"] += 1
            st["verify_calls"] += 1
            if out[:-1] != feed[i][1:]:
                raise RuntimeError(f"row {i}'s forced run verified as {out[:-1]}, not {feed[i][1:]}")
            take(i, out[-1])
        if multi:  # forced runs (and the prompts): one eager call of multi-token rows
            rows = [Row(seqs[i], feed[i], sample=greedy, mask=own_mask(i)) for i in multi]
            t0 = time.perf_counter()
            outs = r.step(rows)
            costs.observe("eager", sum(len(feed[i]) for i in multi), time.perf_counter() - t0)
            st["calls"] += 1
            st["eager_calls"] += 1
            for i, o in zip(multi, outs):
                take(i, o.token, not first)

    try:
        step(list(range(batch)), first=True)  # the prompts: the first token, as in the other arms
        r.g.sync()
        n0 = sum(emitted)
        st.update(zero)
        t0 = time.perf_counter()
        for i in range(batch):  # the forced runs after the first token are timed
            forward(i)
        while True:
            live = [i for i in range(batch) if emitted[i] < target]
            if not live:
                break
            step(live)
        r.g.sync()
        wall = time.perf_counter() - t0
    finally:
        for s in seqs:
            r.close(s)
    n = sum(emitted) - n0
    return {"tok_s": n / wall, "step_ms": 1e3 * wall / max(st["calls"], 1),
            "mask_fill_ms": 1e3 * st["fill_s"] * batch / n, "forced": st["forced"], "row_steps": st["row_steps"],
            "steps_per_token": st["row_steps"] / n, "calls": st["calls"], "graph_calls": st["graph_calls"],
            "eager_calls": st["eager_calls"], "verify_calls": st["verify_calls"], "drip_rows": st["drip_rows"],
            "row0": row0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", required=True, help="alias, GGUF path or synth:SHAPE:QUANT")
    ap.add_argument("--tokenizer-from", default="smollm2-135m", help="the synthetic models' tokenizer")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--emulate", action="store_true",
                    help="the CPU emulator of the GPU (tests/gpu_emulator.py): checks the script, times nothing real")
    a = ap.parse_args()

    from memra.gpu.runner import Runner
    from memra.model.gguf import open_gguf
    from memra.text.grammar import FeedCosts, compile_constraint
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
        emu = None
        if a.emulate:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from gpu_emulator import FakeGpu

            emu = FakeGpu(1 << 29)
        r = Runner(g, max_len=a.steps + 64, max_seqs=max(batches), gpu=emu)
        prompt = tok.encode("Reply with the order as JSON:", add_special=True)
        costs = FeedCosts()  # json-ff's policy: one for the runner, as the server's scheduler keeps it
        for b in batches:  # warm: every graph captured, llguidance's pool started
            for mode in MODES:
                run_arm(r, tok, con, b, 4, mode, prompt, costs)
        res: dict = {}
        same: dict = {}
        for rep in range(a.reps):
            for b in batches:
                lines, row0 = [], {}
                for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                    m = run_arm(r, tok, con, b, a.steps, mode, prompt, costs)
                    row0[mode] = m.pop("row0")
                    res.setdefault((b, mode), []).append(m["tok_s"])
                    lines.append({"schema": "memra.structured-speed/1", "ts": utc_now(), "git_sha": git_sha(),
                                  "device": r.g.info.name, "model": name, "spec": spec, "batch": b, "mode": mode,
                                  "steps": a.steps, "rep": rep, **m})
                    extra = (f", {m['steps_per_token']:.3f} sampled steps a token; calls: {m['graph_calls']} graph, "
                             f"{m['verify_calls']} verify, {m['eager_calls']} eager; {m['drip_rows']} dripped rows"
                             if mode == "json-ff" else "")
                    print(f"{name} batch {b} {mode}: {m['tok_s']:.1f} tok/s ({m['step_ms']:.3f} ms a step, "
                          f"mask fill {m['mask_fill_ms']:.3f} ms{extra})", flush=True)
                same.setdefault(b, []).append(row0["json-ff"] == row0["json"])
                for line in lines:
                    if line["mode"] == "json-ff":
                        line["identical"] = same[b][-1]
                    out.write(json.dumps(line) + "\n")
                out.flush()
                if not same[b][-1]:
                    print(f"{name} batch {b} json-ff: row 0's tokens DIFFER from json's", flush=True)
        for b in batches:
            free, js = statistics.median(res[(b, "free")]), statistics.median(res[(b, "json")])
            ratios = [j / f for j, f in zip(res[(b, "json")], res[(b, "free")])]
            sync = [j / f for j, f in zip(res[(b, "json-sync")], res[(b, "free")])]
            ff = [j / f for j, f in zip(res[(b, "json-ff")], res[(b, "free")])]
            line = {"schema": "memra.structured-speed-summary/1", "ts": utc_now(), "git_sha": git_sha(),
                    "device": r.g.info.name, "model": name, "batch": b, "free_tok_s": free, "json_tok_s": js,
                    "path": "overlapped", "json_sync_tok_s": statistics.median(res[(b, "json-sync")]),
                    "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "sync_ratio_median": statistics.median(sync),
                    "json_ff_tok_s": statistics.median(res[(b, "json-ff")]), "ff_ratio_median": statistics.median(ff),
                    "ff_ratio_min": min(ff), "ff_ratio_max": max(ff), "ff_identical": all(same[b]),
                    "ff_taken": dict(costs.taken),  # json-ff's FeedCosts: how forced steps were fed so far
                    "ff_costs_ms": {f"{k[0]}:{k[1]}": round(1e3 * v, 4) for k, v in sorted(costs.t.items())},
                    "reps": a.reps, "floor": 0.95, "meets_floor": statistics.median(ratios) >= 0.95}
            out.write(json.dumps(line) + "\n")
            print(f"SUMMARY {name} batch {b}: json/free = {line['ratio_median']:.3f} "
                  f"(min {line['ratio_min']:.3f}, max {line['ratio_max']:.3f}) free {free:.1f} json {js:.1f} tok/s; "
                  f"json-sync/free = {line['sync_ratio_median']:.3f}; json-ff/free = {line['ff_ratio_median']:.3f} "
                  f"(tokens {'identical' if line['ff_identical'] else 'DIFFER'})", flush=True)
        del r
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
