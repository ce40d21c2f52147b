"""The runner's exactness checks: a sequence's logits do not depend on the batch it runs
in, and a captured decode step replays exactly what its launches compute eagerly.

    r = batch_invariance(runner, prompt_ids, n_steps=24, co=63)   # alone vs among 63 others
    r = graph_vs_eager(runner, prompt_ids, buckets=(1, 2, ..., 64))

Both drive memra.gpu.runner.Runner.step only, as the server will. Comparisons are bit for
bit (the float32 logits' bytes) and on the greedy tokens; each result says where the first
difference is. Used by the GPU tests, their CPU twins on the emulator, and the device
script that writes the receipt (experiments/h200_runner.py).
"""

from __future__ import annotations

import numpy as np

from memra.errors import MemraError


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint32),
                                                 np.ascontiguousarray(b).view(np.uint32))


def batch_invariance(runner, prompt_ids, n_steps: int = 16, co: int = 63, seed: int = 0) -> dict:
    """Greedy decode of `prompt_ids` alone (one sequence per step), then the same sequence
    among `co` others: they hold prompts of other lengths (so other positions), sample with
    other settings (temperature, top-k, top-p, seeds; some greedy), join in the same steps
    (the prompt step is a mixed eager step, the rest decode steps of the 64-row bucket) and
    the target sits at a different row of every step. Returns {"identical", "steps",
    "first_diff", "tokens_alone", "tokens_batched", "max_abs_diff"}."""
    from memra.gpu.runner import MAX_ROWS, Row, Sampling

    if not 0 <= co < MAX_ROWS:
        raise MemraError(f"co-runners must be in 0..{MAX_ROWS - 1}, got {co}")
    rng = np.random.default_rng(seed)
    V = runner.cfg.n_vocab
    greedy = Sampling(0.0)
    prompt = [int(t) for t in prompt_ids]

    # alone
    s = runner.open()
    try:
        alone_logits, alone_toks = [], []
        o = runner.step([Row(s, prompt, logits="last", sample=greedy)])[0]
        for i in range(n_steps):
            alone_logits.append(o.logits)
            alone_toks.append(o.token)
            if i + 1 < n_steps:
                o = runner.step([Row(s, [o.token], logits="last", sample=greedy)])[0]
    finally:
        runner.close(s)

    # among co-runners
    seqs = [runner.open() for _ in range(co + 1)]
    target = seqs[0]
    try:
        others = seqs[1:]
        lens = rng.integers(1, max(2, 3 * len(prompt)), co)
        settings = [greedy if k % 4 == 0 else
                    Sampling(float(rng.uniform(0.3, 1.5)), int(rng.choice([0, 5, 40])),
                             float(rng.choice([1.0, 0.9])), float(rng.choice([0.0, 0.05])), int(rng.integers(1 << 30)))
                    for k in range(co)]
        rows = [Row(target, prompt, logits="last", sample=greedy)] + \
               [Row(q, rng.integers(0, V, int(n)).tolist(), sample=st) for q, n, st in zip(others, lens, settings)]
        order = rng.permutation(len(rows))
        outs = runner.step([rows[i] for i in order])
        by_seq = {rows[i].seq.slot: o for i, o in zip(order, outs)}
        batched_logits, batched_toks = [], []
        nxt = {q.slot: by_seq[q.slot].token for q in seqs}
        for i in range(n_steps):
            t = by_seq[target.slot]
            batched_logits.append(t.logits)
            batched_toks.append(t.token)
            if i + 1 == n_steps:
                break
            rows = [Row(target, [nxt[target.slot]], logits="last", sample=greedy)] + \
                   [Row(q, [nxt[q.slot]], sample=st) for q, st in zip(others, settings)]
            order = rng.permutation(len(rows))
            outs = runner.step([rows[j] for j in order])
            by_seq = {rows[j].seq.slot: o for j, o in zip(order, outs)}
            nxt = {q.slot: by_seq[q.slot].token for q in seqs}
    finally:
        for q in seqs:
            runner.close(q)

    first = next((i for i in range(n_steps) if not _same(alone_logits[i], batched_logits[i])), None)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(alone_logits, batched_logits))
    return {"identical": first is None and alone_toks == batched_toks, "steps": n_steps, "co_runners": co,
            "first_diff": first, "tokens_alone": alone_toks, "tokens_batched": batched_toks,
            "max_abs_diff": diff}


def graph_vs_eager(runner, prompt_ids, buckets=(1, 2, 4, 8, 16, 32, 64), seed: int = 0) -> dict:
    """For each bucket size B: B sequences (prompts of other lengths) take one decode step
    replayed from the captured graph, are rewound, and take it again with the same launches
    issued eagerly; every row's logits must be the same bits. Returns {"identical",
    "buckets": {B: first differing row or None}}."""
    from memra.gpu.runner import Row

    rng = np.random.default_rng(seed)
    V = runner.cfg.n_vocab
    res = {}
    for B in buckets:
        seqs = [runner.open() for _ in range(B)]
        try:
            prompts = [[int(t) for t in prompt_ids][: max(1, len(prompt_ids) - k % 5)] +
                       rng.integers(0, V, k % 7).tolist() for k in range(B)]
            runner.step([Row(q, p) for q, p in zip(seqs, prompts)])
            toks = rng.integers(0, V, B).tolist()
            runs = []
            for graph in (True, False):
                out = runner.step([Row(q, [t], logits="last") for q, t in zip(seqs, toks)], graph=graph)
                runs.append([o.logits for o in out])
                for q in seqs:
                    runner.rewind(q, q.n - 1)
            res[B] = next((i for i in range(B) if not _same(runs[0][i], runs[1][i])), None)
        finally:
            for q in seqs:
                runner.close(q)
    return {"identical": all(v is None for v in res.values()), "buckets": res}
