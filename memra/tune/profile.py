"""`memra profile`: where one decode step's (or one prefill chunk's) time goes, launch by
launch of the launch plan.

    rows = profile(runner, rows=1, depth=64)       # one dict per plan launch, plan order
    rows = profile(runner, rows=128, prefill=True)  # a 128-row prefill chunk after 64 tokens
    summary = by_kernel(rows)                       # aggregated per (op, kernel, shape)

`rows` sequences are filled to `depth` tokens (random ids; speed does not depend on them),
then one decode step of the plan's graph bucket runs eagerly, each plan launch under a
recorder that keeps the kernel launches it issued. Each plan launch is then timed as a CUDA
graph of `reps` copies of its kernel launches (so the per-node cost inside a graph counts,
as in the real step), median of 8 replays; the whole captured step is timed the same way
and reported beside the sum (a prefill chunk: its bucket's captured graph, and `eager_us`,
the same launches issued one by one from the host, MEMRA_PREFILL_GRAPH=0's way). Bytes: the
weights a matvec reads, the K/V rows attention reads at this depth, and the activations the
other launches read and write. Matrix launches (matvec, mvt, GEMM) also carry their integer
operations, 2 x weight rows x K x the launch's rows (gate and up rows both; a padded chunk's
rows too: the launch computes them), as `tops`, against `INT8_PEAK_TOPS` (the device's dense
int8 tensor peak where known: its spec sheet's figure, which mma.sync does not reach).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memra.errors import MemraError


class _Recorder:
    """Forwards to the GPU and keeps every kernel launch (the runner launches through it)."""

    def __init__(self, g):
        self._g = g
        self.calls: list[tuple] = []

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self.calls.append((kernel, grid, block, tuple(args), shmem, pdl))
        self._g.launch(kernel, grid, block, args, shmem, pdl)

    def __getattr__(self, name):
        return getattr(self._g, name)


@dataclass
class _Timed:
    us: float
    launches: int


def _graph(g, calls, reps: int):
    """`reps` copies of a plan launch's kernel launches captured in a graph, uploaded."""
    with g.capture() as gr:
        for _ in range(reps):
            for k, grid, block, args, shmem, pdl in calls:
                g.launch(k, grid, block, args, shmem, pdl)
    gr.upload()
    return gr


def _time(g, calls, reps: int) -> _Timed:
    gr = _graph(g, calls, reps)
    ms = g.time_ms(gr.launch, reps=8, warmup=2)
    gr.close()
    return _Timed(float(np.median(ms)) * 1e3 / reps, len(calls))


def _warm(g, calls, ms: float = 20.0) -> None:
    """Keep the device busy ~ms with copies of `calls` before the per-launch timings: a call's first GPU work after
    an idle spell read every small launch ~2.7x slow in session 47 (SmolLM2's alone times summed 900 µs against a
    461 µs step; the same call's next model and session 48's runs after benches were normal), as a device not yet at
    its clocks would."""
    gr = _graph(g, calls, 50)
    once = float(np.median(g.time_ms(gr.launch, reps=2, warmup=0))) * 1e3   # µs a replay
    g.time_ms(gr.launch, reps=int(ms * 1e3 / max(once, 1.0)) + 1, warmup=0)
    gr.close()


def _bytes(runner, L, depth: int) -> int:
    """Device bytes one plan launch reads and writes (weights, K/V rows, activations)."""
    from memra.gpu.plan import MATRIX_OPS

    c, rows = runner.cfg, L.rows
    if L.op in MATRIX_OPS:
        w = runner.W[L.args["weight"]]
        n_out = w.rows // 2 if L.args["glu"] else w.rows
        act = w.K * (2 if L.op == "gemm_f16" else 2.25 if L.op == "qf" else 1 if L.args["q8"] else 4)
        return w.nbytes + int(rows * (act + 4 * n_out * (2 if L.args["res"] else 1)))
    if L.op in ("attention", "attention_rope"):
        w = L.args["window"]
        keys = min(depth + 1, w) if w else depth + 1
        return rows * (keys * 2 * c.kv_dim * 2 + 2 * 4 * c.q_dim)
    if L.op in ("norm", "add_norm"):
        return rows * c.n_embd * 4 * (3 if L.op == "add_norm" else 2) + c.n_embd * 4
    if L.op == "embed":
        return rows * c.n_embd * 4 * 2
    if L.op in ("argmax", "sample", "softcap"):
        return rows * c.n_vocab * 4
    n = int(L.shape.get("n", c.n_embd))
    return rows * n * 4 * 2


# dense int8 tensor-core TOPS by device name (NVIDIA's spec sheets; SXM parts)
INT8_PEAK_TOPS = {"NVIDIA H200": 1979.0, "NVIDIA H100 80GB HBM3": 1979.0}


def int8_peak_tops(device_name: str) -> float | None:
    return INT8_PEAK_TOPS.get(" ".join(str(device_name).split()))


def _ops(runner, L) -> int:
    """Integer (or float) multiply-adds x 2 of a matrix launch; 0 for the others."""
    from memra.gpu.plan import MATRIX_OPS

    if L.op not in MATRIX_OPS:
        return 0
    w = runner.W[L.args["weight"]]
    return 2 * w.rows * w.K * L.rows


def _tops(ops: int, us: float) -> float | None:
    return round(ops / us / 1e6, 2) if ops and us else None


def _per_launch(runner, launches, bucket: int, feed, state, depth: int, reps: int) -> list[dict]:
    """Each plan launch run once eagerly under a recorder, then timed alone (graph of reps copies)."""
    g = runner.g
    recs = []
    for L in launches:
        rec = _Recorder(g)
        runner._run([L], bucket, *feed, state, g=rec)
        recs.append(rec.calls)
    g.sync()
    if recs and recs[0]:
        _warm(g, recs[0])
    out = []
    for L, calls in zip(launches, recs):
        t = _time(g, calls, reps)
        nbytes, ops = _bytes(runner, L, depth), _ops(runner, L)
        out.append({"name": L.name, "op": L.op, "kernel": L.kernel, "variant": L.variant,
                    "shape": dict(L.shape), "rows": L.rows, "config": dict(L.config or {}),
                    "layer": L.layer, "group": L.group, "launches": t.launches, "us": round(t.us, 3),
                    "bytes": int(nbytes), "gb_s": round(nbytes / (t.us * 1e-6) / 1e9, 1) if t.us else None,
                    "ops": int(ops), "tops": _tops(ops, t.us)})
    return out


def profile(runner, rows: int = 1, depth: int = 64, reps: int = 20, seed: int = 0, prefill: bool = False) -> dict:
    """The per-launch breakdown of one decode step of `rows` sequences at `depth`, or
    (prefill) of one prefill chunk of `rows` token rows of one sequence after `depth`."""
    from memra.gpu import plan as PLAN
    from memra.gpu.runner import Row, Sampling

    top = PLAN.PREFILL_CHUNK if prefill else PLAN.MAX_ROWS
    if not 1 <= rows <= top:
        raise MemraError(f"--rows must be in 1..{top}{' with --prefill' if prefill else ''}, got {rows}")
    if depth < 0 or depth + (rows if prefill else 1) + 1 > runner.max_len:
        raise MemraError(f"--depth {depth} does not fit a context of {runner.max_len}")
    rng = np.random.default_rng(seed)
    V = runner.cfg.n_vocab
    g = runner.g
    seqs = [runner.open() for _ in range(1 if prefill else rows)]
    eager_us = None
    try:
        if depth:
            for s in seqs:  # one sequence per step: the prefill chunks of a long depth stay small
                runner.step([Row(s, rng.integers(0, V, depth).tolist())])
        if prefill:
            s = seqs[0]
            # the chunk once through the runner (its bucket's graph captured), then its rows
            # rewritten in place by every replay below (the same KV rows, the same values)
            runner.step([Row(s, rng.integers(0, V, rows).tolist())])
            bucket = PLAN.prefill_bucket(rows) if runner.prefill_graph else rows
            launches = runner.plan.step(bucket, decode=False)
            feed = runner.step_rows(bucket)
            step_us = None
            if runner.prefill_graph:
                gr = runner._graphs[runner.prefill_key(bucket, "p")]  # the chunk's (Runner._chunk)
                step_us = float(np.median(g.time_ms(gr.launch, reps=8, warmup=2))) * 1e3

            def eager():
                runner._run(launches, bucket, *feed)

            # the same launches issued one by one from the host (MEMRA_PREFILL_GRAPH=0's cost)
            eager_us = float(np.median(g.time_ms(eager, reps=5, warmup=1))) * 1e3
            if step_us is None:
                step_us = eager_us
            out = _per_launch(runner, launches, bucket, feed, None, depth, reps)
        else:
            first = rng.integers(0, V, rows).tolist()
            greedy = [Sampling(0.0)] * rows
            # the state of one decode step, its graph captured; positions mapped for every replay below
            gr = runner.decode_prepare(seqs, first, 16, greedy)
            step_us = float(np.median(g.time_ms(gr.launch, reps=8, warmup=2))) * 1e3
            # the step was replayed: put its state back before the eager, recorded one
            runner.decode_prepare(seqs, first, 16, greedy)
            bucket = PLAN.graph_bucket(rows)
            # the step's own attention kind (decode_prepare set it: the attention switch's short module, the long
            # one, or both, by the rows' key counts), as its graph launches
            launches = runner.plan.step(bucket, decode=True, sampler="greedy", att_kind=runner.dec_kind)
            out = _per_launch(runner, launches, bucket, (runner.r_tok, runner.r_pos, runner.r_seq),
                              runner._state(1), depth, reps)
    finally:
        for s in seqs:
            runner.close(s)
    total = sum(r["us"] for r in out)
    doc = {"rows": rows, "depth": depth, "bucket": bucket, "prefill": prefill, "step_us": round(step_us, 2),
           "sum_us": round(total, 2), "tok_s": round(rows * 1e6 / step_us, 1) if step_us else None,
           "launches": out}
    if eager_us is not None:
        doc["eager_us"] = round(eager_us, 2)
    return doc


def by_kernel(rows: list[dict]) -> list[dict]:
    """Plan launches of the same op, kernel, variant, shape and config summed (the layers
    of one model share most shapes), largest total first."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r["group"] or r["op"], r["kernel"], r["variant"], tuple(sorted(r["shape"].items())),
               tuple(sorted(r["config"].items())), r["rows"])
        g = groups.setdefault(key, {"group": key[0], "kernel": r["kernel"], "variant": r["variant"],
                                    "shape": r["shape"], "config": r["config"], "rows": r["rows"],
                                    "count": 0, "us_each": [], "total_us": 0.0, "bytes": 0, "ops": 0})
        g["count"] += 1
        g["us_each"].append(r["us"])
        g["total_us"] += r["us"]
        g["bytes"] += r["bytes"]
        g["ops"] += r["ops"]
    out = []
    for g in groups.values():
        g["us_each"] = round(float(np.median(g["us_each"])), 3)
        g["total_us"] = round(g["total_us"], 2)
        g["gb_s"] = round(g["bytes"] / (g["total_us"] * 1e-6) / 1e9, 1) if g["total_us"] else None
        g["tops"] = _tops(g["ops"], g["total_us"])
        out.append(g)
    return sorted(out, key=lambda g: -g["total_us"])
