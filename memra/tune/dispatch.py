"""Which of a matvec's three paths runs at a row count: measured per shape, frozen per device.

The q8 path multiplies a quantized weight by a step's rows with one of three kernels that
give the same bits for every row (kernels/gemm.cu's and kernels/mvt.cu's headers: their
float operations are mv_q8's, in its order): mv_q8 in launches of at most 8 rows, the
skinny tensor-core mvt (up to 15 rows), the tensor-core GEMM. So the choice is free per
shape and row count, and the fastest one is a measurement, not a constant:

    memra tune dispatch -m synth:llama3-8b:Q4_K_M --out research/tune/h200-dispatch-nvidia-h200.jsonl
    memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults

A dispatch job is one path at one shape and row bucket (1, 2, 4, ..., 64: the decode graph
buckets; 128: every prefill chunk above 64 rows; at each, the shapes the plan's step launches:
the output head at decode buckets only), timed with the path's own table
configuration for that shape and bucket (what the engine would launch) through the path's
family hooks. Its receipt is an ordinary tuning receipt: kernel `dispatch` (`dispatch_glu` for
a gate+up pair), variant = the path, src = the path's own kernel file (PATH_SRC: a path's time
depends on its kernel and its configuration only, so after a change to one kernel `--resume`
re-times that path's jobs and keeps the others'). `freeze` then keeps the fastest path per
shape and bucket under src = the three kernel files (SRC: the choice depends on all three, so a
change to any of them makes the entry stale; entry_src), and keeps
the built-in rule's path (memra.gpu.plan.dispatch_rule) unless another is faster by
--min-gain; a second pass (launched_keep) leaves to the rule any choice whose receipts of some
path timed a configuration that path's own frozen entry has replaced since (a later mv_q8, mvt
or gemm campaign), until `--resume` re-times it with the current one. The planner asks the table first (memra.gpu.plan.Planner._dispatch) and uses the
rule where it has no entry, or where the entry's path is off (MEMRA_GEMM=0, MEMRA_MVT=0, a type
the path lacks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from memra.gpu.plan import DISPATCH_KERNELS as KERNELS
from memra.gpu.plan import dispatch_kernel as kernel_of
from memra.gpu.plan import dispatch_paths
from memra.gpu.plan import dispatch_rule as rule

SRC = "matvec.cu+mvt.cu+gemm.cu"   # the three kernels a dispatch entry compares
PATHS = ("matvec", "mvt", "gemm")
PATH_SRC = {"matvec": "matvec.cu", "mvt": "mvt.cu", "gemm": "gemm.cu"}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)

__all__ = ["KERNELS", "kernel_of", "rule", "SRC", "PATHS", "PATH_SRC", "ROWS", "launched", "reached", "available",
           "is_builtin", "shapes", "jobs", "path_config", "launched_keep", "entry_src", "path_job"]


def launched(op: str, rows: int) -> bool:
    """Whether the engine multiplies op's weights over `rows` rows at all: the output head runs in
    decode steps only (at most memra.gpu.plan.MAX_ROWS rows; a prefill chunk computes no logits).
    jobs() asks the plan itself (shapes at each row count); this is freeze's test for receipts of
    jobs made before it did."""
    from memra.gpu.plan import MAX_ROWS

    return not (op == "output" and rows > MAX_ROWS)


def reached(ops: Iterable[str], rows: int) -> bool:
    """Whether a dispatch receipt's row count is one the engine launches for any of its ops
    ("model:op"): freeze leaves out entries no step reaches (a head at the prefill bucket)."""
    return any(launched(str(o).rsplit(":", 1)[-1], int(rows)) for o in ops)


def available(path: str, ggml_type: int) -> bool:
    """Whether `path` runs weights of this type (on the q8 path)."""
    from memra.gpu.ops import matvec as MV

    return path == "matvec" if ggml_type in MV.FLOAT_TYPES else path in dispatch_paths(ggml_type)


def is_builtin(kernel: str, variant: str, config: Mapping, shape: Mapping) -> bool:
    """freeze's --min-gain test: the rule's path at the receipt's row count."""
    return kernel in KERNELS and variant == rule(int(shape["batch"]))


# the plan kernels of a q8 matvec, whichever path the plan chose for it
_MATVEC_KERNELS = {"matvec": False, "matvec_glu": True, "mvt": False, "mvt_glu": True, "gemm": False, "gemm_glu": True}


def shapes(model: str, rows: int = 1, ops: Iterable[str] | None = None) -> list[tuple[str, bool, dict]]:
    """(op, glu, shape) of the quantized matvecs the plan's step over `rows` rows launches
    (memra.tune.campaign.plan_shapes: a decode step up to 64 rows, a prefill chunk above, which
    has no head), without the batch."""
    from memra.gpu.ops import matvec as MV
    from memra.tune.campaign import model_info, plan_shapes

    ops = set(ops or ())
    out, seen = [], set()
    for op, kernel, s in plan_shapes(model_info(model), rows):
        if kernel not in _MATVEC_KERNELS or (ops and op not in ops):
            continue
        glu = _MATVEC_KERNELS[kernel]
        key = (glu, s["type"], s["rows"], s["cols"])
        if key in seen or MV.type_id(s["type"]) in MV.FLOAT_TYPES:
            continue
        seen.add(key)
        out.append((op, glu, {k: s[k] for k in ("type", "rows", "cols")}))
    return out


def jobs(models: Iterable[str], table: Mapping | None = None, rows: Iterable[int] = ROWS,
         ops: Iterable[str] | None = None, reps: int | None = None) -> list:
    """One job per shape the plan launches at each row count, and available path, with the
    path's table configuration (the launcher's built-in one where the table has none)."""
    from memra.errors import MemraError
    from memra.gpu.ops import matvec as MV
    from memra.tune.campaign import MATVEC_OPS, Job

    unknown = sorted(set(ops or ()) - set(MATVEC_OPS))
    if unknown:  # else no job at all, and a silent "0 jobs"
        raise MemraError(f"--ops: no op {', '.join(map(repr, unknown))} (ops: {', '.join(MATVEC_OPS)})")
    out: dict[tuple, Job] = {}
    for m in models:
        for r in rows:
            for op, glu, s in shapes(m, r, ops):
                t = MV.type_id(s["type"])
                for path in PATHS:
                    if not available(path, t):
                        continue
                    cfg = path_config(table, path, glu, s, r)
                    j = Job(kernel=kernel_of(glu), variant=path, config=cfg, shape={**s, "batch": int(r)},
                            src=PATH_SRC[path], ops=(f"{m}:{op}",), campaign="dispatch", reps=reps)
                    k = j.key()
                    if k in out:   # the same job from another model or op: keep where it comes from
                        if j.ops[0] not in out[k].ops:
                            out[k] = replace(out[k], ops=out[k].ops + j.ops)
                    else:
                        out[k] = j
    return list(out.values())


def path_config(table: Mapping | None, path: str, glu: bool, shape: Mapping, rows: int) -> dict:
    """The configuration `path` launches at `rows` rows of `shape` under `table`: its q8 entry
    (mv_q8's at min(rows, 8): the engine's launches of at most 8 rows), {} (the launcher's built-in
    one) where the table has none."""
    from memra.tune import tables as TABLES

    pk = path + ("_glu" if glu else "")
    ch = TABLES.lookup(table, pk, {k: shape[k] for k in ("type", "rows", "cols")},
                       min(int(rows), 8) if path == "matvec" else int(rows)) if table else None
    return dict(ch.config) if ch is not None and ch.variant == "q8" else {}


def launched_keep(receipts, table: Mapping, keep=None):
    """freeze's second keep test, once the paths' own entries are frozen (`table`): a dispatch
    receipt measured a path with the configuration the path launched then; when a path's table
    entry has changed since (a later campaign of mv_q8, mvt or gemm), its receipts time a launch
    the engine no longer makes. A (kernel, shape, row count) whose receipts of some path are all
    of such configurations has no measured choice: all its receipts are left out and the planner
    takes the rule (memra.gpu.plan.dispatch_rule) until `memra tune dispatch --resume` re-times
    it (its jobs carry the current configurations). Returns (keep, the groups left out)."""
    from memra.tune.receipts import config_key

    def cur(r) -> bool:
        shape = dict(r["shape"])
        want = path_config(table, r["variant"], r["kernel"] == "dispatch_glu", shape, int(r["batch"]))
        return config_key(dict(r["config"])) == config_key(want)

    current: dict = {}                     # receipt (its index) -> timed the current configuration
    paths: dict[tuple, dict[str, bool]] = {}
    for i, r in receipts.iterrows():
        if r["kernel"] not in KERNELS or (keep is not None and not keep(r)):
            continue
        current[i] = cur(r)
        by = paths.setdefault((r["kernel"], r["shape_key"], int(r["batch"])), {})
        by[r["variant"]] = by.get(r["variant"], False) or current[i]
    open_ = {g for g, by in paths.items() if not all(by.values())}

    def keep2(r) -> bool:
        if r["kernel"] not in KERNELS:
            return keep is None or bool(keep(r))
        return current.get(r.name, False) and (r["kernel"], r["shape_key"], int(r["batch"])) not in open_

    return keep2, sorted(open_)


def entry_src(current_hash) -> dict:
    """freeze's entry_src for the dispatch kernels: their entries name all three kernel files (SRC)
    and the hash of their hashes (current_hash: memra.tune.tables._current_hash), whichever
    path's receipt won."""
    return {k: (SRC, current_hash(SRC)) for k in KERNELS}


def path_job(job):
    """The path's own job behind a dispatch job (what its family hooks time)."""
    from memra.tune.campaign import Job

    glu = job.kernel == "dispatch_glu"
    return Job(kernel=job.variant + ("_glu" if glu else ""), variant="q8", config=dict(job.config),
               shape=dict(job.shape), src=PATH_SRC[job.variant], ops=job.ops, campaign=job.campaign,
               reps=job.reps)

