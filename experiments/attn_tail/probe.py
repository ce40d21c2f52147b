#!/usr/bin/env python3
"""Where the decode attention's time at depth goes (issue 14 item 3; session 38's plan).

Why: SmolLM2's tg128 @ d4096 floor (2.5x llama.cpp; session 30 1.84x) is the one a single kernel could reach.
Its step is 663 µs at depth 4,096 against 449 at depth 0 (H200): +7.1 µs a layer, which is attn_decode_rope's
growth from ~3.2 µs at one key (session 26) to ~10.6 at 4,096 (session 31), a launch in a graph with PDL. Its K/V at 4,096 keys are 3.1 MB a layer
(~0.75 µs at the copy rate), so the time is a chain of latencies, not bytes. Which links — the split's 128-key
loop, the partial's store, the fence and the counter, the merge's weights, the merge's loads — nobody has
measured: attn_fixed cut the one-split launch only (no merge), attn_merge (v10) priced the merge's load rounds.

attn_decode_rope as the engine launches it at depth (the table's long module: 8 warps, 64-key tiles, ring 2,
the tensor-core body; the plan's depth split count — 88 a head block on SmolLM2, 33 on the 8B / 1B — trimmed by
splits_for; the whole GQA group a block once KV heads x splits fill the SMs, else one head: plan.att_hpb_at),
cut short in a generated copy of kernels/attention.cu (build/attention.cu, ignored; each anchor must match):

  full     kernels/attention.cu itself
  wait     ATT_PROBE 1: returns right after its PDL wait
  append   ATT_PROBE 2: after the query rope, the K/V append and their barrier
  loop     ATT_PROBE 5: every thread exits after the split's key loop (RING_AFTER_LOOP)
  partial  ATT_PROBE 8: after the partial (o, m, l) is stored (split_body's end)
  count    ATT_PROBE 9: after the fence and the counter (the last block zeroes it; nobody merges)
  weights  ATT_PROBE 10: the last block leaves after the merge's weights (M, exp, the denominator)
and bit-neutral candidates, checked bit for bit against full before they are timed:
  mlo      ATT_MLO 1: the merge's first round of partial loads issued before its weights' loads (one L2
           round trip less on the last block's path; the same fma chain in the same order)
  mj32     ATT_MERGE_MJ 32 (session 30 measured -0.3 µs at 4,096 keys and +3.4 % at 1,024 on the 8B)
  fence1   ATT_FENCE1 1: the block's barrier, then thread 0's fence and the counter (cooperative groups' grid
           barrier), instead of every thread's fence before the barrier
  ring3    ATT_RING 3: with ATT_EARLY's prologue both 64-key tiles of a 128-key split are in flight before the
           PDL wait (ring 2: the first); session 17 found 3 stages no better, before ATT_EARLY existed
  best     mlo and fence1 together

Each arm is timed as a graph of 20 launches with PDL (as the engine launches), the copies rotated over 2x L2,
at 128 (one split: the reference without a merge), 1,024, 4,096 and 16,384 keys on the SmolLM2 / 1B / 8B head
shapes, at the engine's plan and, where it changes the layout, at a 16-split plan (LAYOUTS). The increments d_<arm> (each cut over the one before) price the links; the caveat is attn_fixed's: a
cut block leaves early, so the next copy's blocks start sooner (the increments are upper bounds on the
engine's, where the next matvec prefetches under the tail).

    python3 experiments/attn_tail/probe.py --compile-only                                # CPU: every arm builds
    source .whl/setup.sh && python3 experiments/attn_tail/probe.py > $OUT/attn-tail.jsonl  # device, ~2-3 min
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from attn_fixed.probe import EDITS as FIXED_EDITS  # noqa: E402
from attn_fixed.probe import graph_us  # noqa: E402,F401  (µs a launch in a graph of 20; attn_cluster takes it too)
from kernel_edit import build_copy, make_variant  # noqa: E402
from memra.gpu.ops import attention as ATT  # noqa: E402

BUILD, ARM_FILE, HEADER0 = build_copy(HERE, "attention.cu")
HEADER = HEADER0 + """// ATT_PROBE 1: attn_decode_rope returns after its PDL wait; 2: after the rope / append barrier; 5: every thread
// exits after the key loop; 8: after the partial's store; 9: after the fence and the counter (the last block zeroes
// it); 10: the last block leaves after the merge's weights. ATT_MLO 1: the merge's first round of partial loads
// before the weights' loads; ATT_FENCE1 1: the block's barrier, then one thread's fence before the counter
// (both bit-neutral).
#ifndef ATT_PROBE
#define ATT_PROBE 0
#endif
#ifndef ATT_MLO
#define ATT_MLO 0
#endif
#ifndef ATT_FENCE1
#define ATT_FENCE1 0
#endif
#define ATT_CUT(n) do { if (ATT_PROBE == (n)) asm volatile("exit;" ::: "memory"); } while (0)
"""
_MERGE_OLD = """        const size_t base = ((size_t)t * n_head + (size_t)hb * G) * S;  // head g: + g * S
        for (int g = warp; g < G; g += ATT_WARPS) {"""
_MERGE_NEW = """        const size_t base = ((size_t)t * n_head + (size_t)hb * G) * S;  // head g: + g * S
        constexpr int MO0 = (G * D + NT - 1) / NT;
#if ATT_MLO
        float v0[MO0][ATT_MERGE_MJ];  // ATT_MLO: the first round's partial loads, before the weights' loads
#pragma unroll
        for (int o = 0; o < MO0; o++) {
            const int i = min(tid + o * NT, G * D - 1);
            const float* po = part_o + (base + (size_t)(i / D) * S) * D + i % D;
#pragma unroll
            for (int jj = 0; jj < ATT_MERGE_MJ; jj++) v0[o][jj] = __ldcg(po + (size_t)min(jj, n_act - 1) * D);
        }
#endif
        for (int g = warp; g < G; g += ATT_WARPS) {"""
_LOADS_OLD = """                float v[MO][ATT_MERGE_MJ];  // every load of the round issued before the first fma
#pragma unroll
                for (int o = 0; o < MO; o++) {  // unconditional loads (indices clamped): all issued at once"""
_LOADS_NEW = """                float v[MO][ATT_MERGE_MJ];  // every load of the round issued before the first fma
#if ATT_MLO
                if (j0 == 0) {
#pragma unroll
                    for (int o = 0; o < MO; o++)
#pragma unroll
                        for (int jj = 0; jj < ATT_MERGE_MJ; jj++) v[o][jj] = v0[o][jj];
                } else
#endif
#pragma unroll
                for (int o = 0; o < MO; o++) {  // unconditional loads (indices clamped): all issued at once"""
EDITS = [
    *FIXED_EDITS[:2],   # attn_fixed's cuts 1 (after the PDL wait) and 2 (after the rope / append barrier)
    ("    RING_AFTER_LOOP;\n", "    RING_AFTER_LOOP;\n    ATT_CUT(5);\n", 2),
    ("        part_ml[(part0 + (size_t)tid * S) * 2 + 1] = l_s[tid];\n    }\n}\n",
     "        part_ml[(part0 + (size_t)tid * S) * 2 + 1] = l_s[tid];\n    }\n    ATT_CUT(8);\n}\n"),
    ("        if (!s_last) return;\n        __threadfence();\n",
     "#if ATT_PROBE == 9\n        if (s_last && tid == 0) counters[t * gridDim.x + hb] = 0;\n        return;\n#endif\n"
     "        if (!s_last) return;\n        __threadfence();\n"),
    ("            if (lane == 0) inv_den[g] = 1.0f / den;\n        }\n        __syncthreads();\n",
     "            if (lane == 0) inv_den[g] = 1.0f / den;\n        }\n        __syncthreads();\n"
     "#if ATT_PROBE == 10\n        if (tid == 0) counters[t * gridDim.x + hb] = 0;\n        return;\n#endif\n"),
    (_MERGE_OLD, _MERGE_NEW),
    (_LOADS_OLD, _LOADS_NEW),
    # ATT_FENCE1: the block's barrier first, then one thread's fence and the counter (cooperative groups' grid
    # barrier pattern: bar.sync orders the block's partial stores before thread 0's gpu-scope fence)
    ("        __threadfence();  // this block's partial, visible device-wide before it is counted\n"
     "        __syncthreads();\n        if (tid == 0) s_last = atomicAdd(&counters[t * gridDim.x + hb], 1) == n_act - 1;\n",
     "#if !ATT_FENCE1\n        __threadfence();  // this block's partial, visible device-wide before it is counted\n#endif\n"
     "        __syncthreads();\n#if ATT_FENCE1\n        if (tid == 0) __threadfence();\n#endif\n"
     "        if (tid == 0) s_last = atomicAdd(&counters[t * gridDim.x + hb], 1) == n_act - 1;\n"),
]
# arm: extra defines of the build copy (None: kernels/attention.cu itself)
ARMS = {"full": None, "wait": {"ATT_PROBE": 1}, "append": {"ATT_PROBE": 2}, "loop": {"ATT_PROBE": 5},
        "partial": {"ATT_PROBE": 8}, "count": {"ATT_PROBE": 9}, "weights": {"ATT_PROBE": 10},
        "mlo": {"ATT_MLO": 1}, "mj32": {"ATT_MERGE_MJ": 32}, "fence1": {"ATT_FENCE1": 1}, "ring3": {"ATT_RING": 3},
        "best": {"ATT_MLO": 1, "ATT_FENCE1": 1}}
NEUTRAL = ("mlo", "mj32", "fence1", "ring3", "best")   # whole launches: the same bits as full (checked)
CUTS = ("wait", "append", "loop", "partial", "count", "weights", "full")
SHAPES = {"smollm2": {"n_head": 9, "n_head_kv": 3, "head_dim": 64},
          "llama-1b": {"n_head": 32, "n_head_kv": 8, "head_dim": 64},
          "llama3-8b": {"n_head": 32, "n_head_kv": 8, "head_dim": 128}}
CONFIG = {"ATT_WARPS": 8, "ATT_TILE": 64}   # the H200 table's long module (every shape; hpb 1 in the table)
CTX = (128, 1024, 4096, 16384)
# other plan split counts (MEMRA_ATT_SPLITS), at the contexts where they change the layout: how the loop and the
# merge trade (a cluster merge through distributed shared memory needs every split of a head block in one
# cluster: at most 16)
LAYOUTS = (16,)


def generate() -> None:
    if make_variant(ROOT / "kernels" / "attention.cu", BUILD, EDITS, HEADER):
        raise SystemExit("attention.cu's anchors moved: update EDITS")


class ArmGpu:
    """The device with attention.cu's modules from the build copy with `arm`'s defines (None: kernels/), every
    launch with PDL. `arm` may change between launches (module() is asked at each)."""

    def __init__(self, g):
        self._g, self.arm = g, None

    def module(self, kernel_file, defines=None):
        extra = ARMS[self.arm] if self.arm else None
        if kernel_file == ATT.KERNEL_FILE and extra is not None:
            return self._g.module(ARM_FILE, {**(defines or {}), **extra})
        return self._g.module(kernel_file, defines)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self._g.launch(kernel, grid, block, args, shmem, True)

    def __getattr__(self, name):
        return getattr(self._g, name)


def layout(s: dict, ctx: int, sms: int, splits: int = 0) -> tuple[int, int]:
    """(grid y, heads a block) of the engine's decode launch at ctx keys on the MEMRA_ATT_DEPTH path: the plan's
    split count (the larger of the table's heads-a-block count and the whole group's; `splits` instead when
    given, as MEMRA_ATT_SPLITS sets it), trimmed (splits_for); the whole group a block once KV heads x splits fill
    the SMs (plan.att_hpb_at), else the table's one."""
    nh, nkv, D = s["n_head"], s["n_head_kv"], s["head_dim"]
    S = splits or max(ATT.default_splits(nh, sms), ATT.default_splits(nkv, sms))
    y = ATT.splits_for(ctx, S, D, CONFIG)
    return y, (nh // nkv if nkv * y >= sms else 1)


def active(n: int, S: int) -> int:
    """The non-empty splits of a row of n keys on S splits (attention.cu's key_range at ATT_MIN_CHUNK 128 and
    64-key tiles)."""
    chunk = max(ATT.MIN_CHUNK, -(-(-(-n // S)) // 64) * 64)
    return -(-n // chunk)


def case_at(ag, s: dict, ctx: int, rng, rotate: int, splits: int = 0):
    y, hpb = layout(s, ctx, ag.info.sm_count, splits)
    case = ATT.tune_case(ag, "attn_decode", "default", {**CONFIG, "hpb": hpb}, {**s, "ctx": ctx, "batch": 1},
                         rng, rotate)
    case.S = y
    po, pml = ATT.scratch_shapes(1, s["n_head"], y, s["head_dim"])
    case.part_o, case.part_ml = ag.empty(po, np.float32), ag.empty(pml, np.float32)
    return case, y, hpb


def outputs(g, ag, case) -> bytes:
    """Copy 0's output row and q8 twin after one launch of the current arm (poisoned before it: an arm that wrote
    nothing cannot pass for exact)."""
    for a in (case.out, case.xq, case.xs):
        if a is not None:
            a.poison()
    case.launch(0)
    g.sync()
    nq = case.T * case.nh * case.D
    parts = [case.out.numpy()[:nq].tobytes()]
    if case.q8:
        parts += [case.xq.numpy()[:nq].tobytes(), case.xs.numpy()[:nq // 32].tobytes()]
    return b"".join(parts)


def compile_arms(arm_file: str, arms: dict) -> int:
    """NVRTC every arm (name: extra defines of arm_file; None: kernels/attention.cu) for every shape at one head
    and the whole group a block."""
    from memra.gpu.compile import compile_cubin

    for name, s in SHAPES.items():
        G = s["n_head"] // s["n_head_kv"]
        for hpb in sorted({1, G}):
            d = ATT.module_defines(s["head_dim"], hpb, CONFIG)
            for arm, extra in arms.items():
                if extra is None:
                    compile_cubin(ATT.KERNEL_FILE, "sm_90a", d)
                else:
                    compile_cubin(arm_file, "sm_90a", {**d, **extra})
                print(f"compiled {name} hpb {hpb} {arm} (ATT_TC {d['ATT_TC']})", flush=True)
    return 0


def start(gen, arm_file: str, arms: dict, arm_gpu):
    """The probes' command line: (0, None) after --compile-only (the build copy generated by gen, every arm
    compiled here), else (None, (device, arm_gpu over it, random generator, bytes the copies rotate over, the
    shapes' names and sizes))."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    gen()
    if args.compile_only:
        return compile_arms(arm_file, arms), None
    from memra.gpu.cuda import gpu

    g = gpu()
    return None, (g, arm_gpu(g), np.random.default_rng(0), 2 * int(g.info.l2_bytes),
                  [(n, SHAPES[n]) for n in args.shapes.split(",")])


def main() -> int:
    rc, dev = start(generate, ARM_FILE, ARMS, ArmGpu)
    if dev is None:
        return rc
    g, ag, rng, rotate, shapes = dev
    for name, s in shapes:
        for ctx, plan_s in [(c, 0) for c in CTX] + [(c, x) for x in LAYOUTS for c in CTX if c > 128 * x]:
            ag.arm = None
            case, y, hpb = case_at(ag, s, ctx, rng, rotate, plan_s)
            row = {"shape": name, "ctx": ctx, "plan_splits": plan_s or "engine", "splits": y, "hpb": hpb,
                   "active": active(ctx, y), "pdl": True, "device": g.info.name,
                   "kv_mb": round(2 * ctx * s["n_head_kv"] * s["head_dim"] * 2 / 1e6, 3)}
            ok, err, detail = case.check()
            if not ok:
                print(json.dumps({**row, "error": detail}), flush=True)
                continue
            ref = outputs(g, ag, case)
            for arm in ARMS:
                ag.arm = arm if arm != "full" else None
                try:
                    if arm in NEUTRAL:
                        row["exact_" + arm] = outputs(g, ag, case) == ref
                    row[arm] = round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)
                except Exception as e:   # an arm the device refuses (shared memory, a launch error)
                    row["error_" + arm] = f"{type(e).__name__}: {str(e)[:200]}"
            prev = None   # each cut's increment over the one before it
            for arm in CUTS:
                if prev and arm in row and prev in row:
                    row["d_" + arm] = round(row[arm] - row[prev], 3)
                prev = arm
            for arm in NEUTRAL:
                if arm in row:
                    row["saves_" + arm] = round(row["full"] - row[arm], 3)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
