"""The launches a runner on one plan makes, and the kernel modules they load: every decode step at every CUDA-graph
bucket with each sampler, prompt and generated-row chunks at row counts that reach every module (PREFILL_ROWS), and the
eager head over gathered rows, each mapped by its kernel family (memra/gpu/ops/<family>.py `launch_cases`) to the
module it loads. The runner compiles `plan_modules` ahead of use (memra.gpu.compile.AheadOfUse); kernel-check's
launch set (memra.tune.launches) runs every plan's `plan_cases`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Mapping, Sequence

# prefill chunks: 1..8 rows reach every matvec nb (and mvt's one-tile bucket); 9 and 15 mvt's
# two-tile bucket (full and partial second tile); 16, 17, 64, 65 and 128 the GEMM's built-in
# configurations (nb <= 16, <= 64, more) with full and partial batch tiles; 512 the largest
# chunk (memra.gpu.plan.PREFILL_CHUNK)
PREFILL_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 64, 65, 128, 512)
# the runner's eager head takes any count of gathered rows up to MAX_ROWS: every row bucket and q8 dispatch path
# (memra.gpu.plan._dispatch: mv_q8 below 3 rows, mvt below 16, the GEMM from 16) is reached by these (kernel-check's
# before session 57 stopped at 8 and 64: 26 launch cases of 9..63 rows were never run)
HEAD_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 32, 33, 64)
SAMPLERS = ("none", "greedy", "sample")

# the family module that maps each plan op; FAMILY_MODULE is every kernel family (kernel-check's list)
OP_FAMILY = {"embed": "embed", "norm": "norm", "add_norm": "norm", "matvec": "matvec", "quantize": "matvec",
             "gemm": "gemm", "gemm_tile": "gemm_tile", "gemm_f16": "gemm_f16", "to_f16": "gemm_f16",
             "qf": "qf", "to_qf": "qf",
             "mvt": "mvt", "rope": "rope", "attention": "attention", "attention_rope": "attention",
             "attention_fa": "attn_fa",
             "act_mul": "act", "softcap": "act", "argmax": "sample", "sample": "sample", "mask": "mask"}
FAMILY_MODULE = {"matvec": "memra.gpu.ops.matvec", "embed": "memra.gpu.ops.embed", "norm": "memra.gpu.ops.norm",
                 "rope": "memra.gpu.ops.rope", "attention": "memra.gpu.ops.attention", "act": "memra.gpu.ops.act",
                 "sample": "memra.gpu.ops.sample", "gemm": "memra.gpu.ops.gemm", "mask": "memra.gpu.ops.mask",
                 "mvt": "memra.gpu.ops.mvt", "attn_fa": "memra.gpu.ops.attn_fa",
                 "gemm_tile": "memra.gpu.ops.gemm_tile", "gemm_f16": "memra.gpu.ops.gemm_f16",
                 "qf": "memra.gpu.ops.qf"}


@dataclass
class PlanContext:
    """What a family needs beyond the launch: the model's config and the planner's fixed
    choices (heads per attention block, splits, KV block)."""
    cfg: object
    plan: object
    path: str
    kv_block: int = 16


def family_module(fam: str):
    try:
        return importlib.import_module(FAMILY_MODULE[fam])
    except ModuleNotFoundError:
        return None


def plan_launches(plan, gemm: bool):
    """Every launch a runner on this plan makes (module doc). Without the GEMM a step of
    more than 8 rows is 8-row matvec chunks and a remainder, and every other kernel's bucket
    stops at 8: steps of 1, 2, 4, 8 (decode) and 1..8 (prefill) rows reach all its modules."""
    from memra.gpu.plan import GRAPH_BUCKETS, Launch

    E = plan.cfg.n_embd
    decode = GRAPH_BUCKETS if gemm else tuple(b for b in GRAPH_BUCKETS if b <= 8)
    prefill = PREFILL_ROWS if gemm else tuple(r for r in PREFILL_ROWS if r <= 8)
    for rows in decode:
        yield from plan.step(rows, decode=True, sampler="none")  # the layers and the head
        for sampler in SAMPLERS[1:]:  # the sampler after the head's logits (and a constrained row's mask)
            yield from (L for L in plan.head(rows, sampler + "+mask") if L.op in ("argmax", "sample", "mask"))
    # a hybrid plan's chunks of each row kind (and both kinds in one step where its plan allows:
    # without the prompt tile)
    kinds = (("p", "g") + (() if plan.use_tile else ("pg",))) if plan.hybrid else ("p",)
    for rows in prefill:
        for k in kinds:
            yield from plan.step(rows, decode=False, kinds=k)
    for k in HEAD_ROWS:
        if plan.head_q8:  # runner._head re-quantizes the gathered rows
            yield Launch("head_q8", "quantize", "quantize_q8", "default", {"n": E}, k,
                         plan.tuned("quantize_q8", {"n": E}, k), "rows", -1, {"src": "hsel", "K": E})
        for sampler in SAMPLERS:
            yield from plan.head(k, sampler, src="hsel")


def plan_cases(ctx: PlanContext, gemm: bool, mods: Mapping, families: Sequence[str] | None = None):
    """(family, launch, case) of each distinct launch of a runner on ctx.plan (plan_launches), through its family's
    launch_cases."""
    seen = set()
    for L in plan_launches(ctx.plan, gemm):
        a = L.args
        sig = (L.op, L.kernel, L.variant, tuple(L.shape.values()), L.rows,
               tuple((L.config or {}).items()), a.get("glu"), a.get("q8"), bool(a.get("res")),
               a.get("window"), a.get("twin"), bool(a.get("w_post")), a.get("packing"),
               a.get("att_rows"), a.get("att_switch"))
        if sig in seen:
            continue
        seen.add(sig)
        fam = OP_FAMILY[L.op]
        if families is not None and fam not in families:
            continue
        mod = mods.get(fam)
        if mod is None or not hasattr(mod, "launch_cases"):
            raise KeyError(f"the plan launches {L.op} ({L.kernel}) but family {fam} has no launch_cases")
        for c in mod.launch_cases(L, ctx):
            yield fam, L, c


def plan_modules(plan) -> list[tuple[str, dict]]:
    """(kernel file, defines) of every module a runner on `plan` (one Planner: its path, seams and table) can load —
    its decode steps at every graph bucket, prefill chunks and heads over every row count's path — each once: what the
    runner compiles ahead of its first step (memra.gpu.compile.AheadOfUse)."""
    mods = {f: family_module(f) for f in FAMILY_MODULE}
    cases = plan_cases(PlanContext(plan.cfg, plan, plan.path), plan.use_gemm, mods)
    return launch_modules({i: c for i, (_, _, c) in enumerate(cases)})


def launch_modules(cases: Mapping[str, Mapping]) -> list[tuple[str, dict]]:
    """(kernel file, defines) of every module the cases load, each once."""
    out, seen = [], set()
    for c in cases.values():
        k = (c["file"], tuple(sorted(c["defines"].items())))
        if k not in seen:
            seen.add(k)
            out.append((c["file"], dict(c["defines"])))
    return out
