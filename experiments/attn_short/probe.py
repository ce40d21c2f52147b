#!/usr/bin/env python3
"""attn_short against the engine's short-context decode attention, per launch (experiments/attn_short/README.md).

Both arms are memra.gpu.ops.attention's tune case (attn_decode_rope as the engine launches it: RoPE and the
K/V append inside, the q8 twin, one token at position ctx - 1 of its own sequence, the copies rotated past the
L2): "engine" with kernels/attention.cu and the H200 table's short-row configuration of the shape, the others with
the module taken from kernels/attn_short.cu (the same parameters; ATT_RING 0, so no dynamic shared
memory), SHORT_PF / SHORT_KB / SHORT_VB / ATT_WARPS per arm. Every arm's launch is checked first (the tune case's check: the output
against the float64 reference at TOL, the counters zero, the q8 twin quantize_q8's bits of the output), then
timed as a graph of 20 PDL launches (experiments/attn_fixed's graph_us), at 1 / 32 / 64 / 96 / 128 / 256 keys on the
SmolLM2, Gemma-3, 1B and 8B head shapes.

    python3 experiments/attn_short/probe.py --compile-only            # CPU: NVRTC of every arm's module
    source .whl/setup.sh && python3 experiments/attn_short/probe.py > $OUT/attn-short.jsonl   # device, ~1 min

A row: {"shape", "ctx", "splits", "engine": µs, "<arm>": µs, "best": arm, "saved_us": engine - best} (or
"<arm>_error": the failed check), "engine_long": µs at the entry's own configuration (the long module, which
would take the rows above a switch lowered to attn_short's crossover), and where a KV head has several query heads "hpb_group_bits_same" /
"kb8_vb8_hpb_group" (hpb_group: the whole group a block, bit for bit against one head a block, and its µs). saved_us x the layers (SmolLM2 30, Gemma-3 18, the 1B 16, the 8B 32) bounds what an
engine module built from the winner could take off a token at that depth.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from attn_fixed.probe import device, graph_us  # noqa: E402
from memra.gpu.ops import attention as ATT  # noqa: E402

SHORT_FILE = ATT.SHORT_FILE
# n_head, n_head_kv, head_dim; the engine's configuration of the shape's short rows (tune/defaults/nvidia-h200.json,
# attn_decode's entry at batch 1: its config with `short` laid over it, `switch` dropped)
SHAPES = {
    "smollm2": ({"n_head": 9, "n_head_kv": 3, "head_dim": 64},
                {"ATT_TILE": 64, "ATT_WARPS": 8, "hpb": 1, "ATT_MIN_CHUNK": 256, "ATT_TC": 0}),
    "gemma3": ({"n_head": 4, "n_head_kv": 1, "head_dim": 256},
               {"ATT_TILE": 32, "ATT_WARPS": 8, "hpb": 1, "ATT_MIN_CHUNK": 32}),
    "llama-1b": ({"n_head": 32, "n_head_kv": 8, "head_dim": 64},
                 {"ATT_TILE": 64, "ATT_WARPS": 8, "hpb": 1, "ATT_MIN_CHUNK": 256, "ATT_TC": 0}),
    "llama3-8b": ({"n_head": 32, "n_head_kv": 8, "head_dim": 128},   # no `short` in its entry: plan.ATT_SHORT
                  {"ATT_TILE": 32, "ATT_WARPS": 8, "hpb": 1, "ATT_TC": 0}),
}
LONG = {"ATT_TILE": 64, "ATT_WARPS": 8, "hpb": 1}   # every shape's entry without its `short` (the long module)
ARMS = {"kb2_vb8": {"SHORT_PF": 2, "SHORT_KB": 2, "SHORT_VB": 8},   # v1's scores loop, v3's P V
        "kb8_vb8": {"SHORT_PF": 2, "SHORT_KB": 8, "SHORT_VB": 8},
        "kb8_vb16": {"SHORT_PF": 2, "SHORT_KB": 8, "SHORT_VB": 16},
        "kb4_vb8": {"SHORT_PF": 2, "SHORT_KB": 4, "SHORT_VB": 8},
        "w16_kb8": {"SHORT_PF": 2, "SHORT_KB": 8, "SHORT_VB": 8, "ATT_WARPS": 16},
        # 16 warps x 12 key steps: one batch of loads up to 192 keys at head 256 (KB / VB 8 take two past 128 keys);
        # 128 registers, no spills (16 / 16 spills)
        "w16_kb12": {"SHORT_PF": 2, "SHORT_KB": 12, "SHORT_VB": 12, "ATT_WARPS": 16}}
# the key counts timed; PROBE_CTX=160,192,... others (session 50: Gemma-3's switch0 193 lost 0.3-1 % at depth 128,
# whose rows of 129-192 keys the probe had not timed)
CTX = tuple(int(x) for x in os.environ.get("PROBE_CTX", "1,32,64,96,128,256").split(","))


def arm_config(shape: dict, arm: str) -> dict:
    """The tune-case config of an attn_short arm: one head a block, the arm's warps (8 unless it names ATT_WARPS;
    8 where its warps would not cover the head: 32 x warps >= head_dim)."""
    w = ARMS[arm].get("ATT_WARPS", 8)
    return {"ATT_WARPS": w if 32 * w >= shape["head_dim"] else 8, "hpb": 1, "ATT_RING": 0, "ATT_EARLY": 0}


class ShortGpu:
    """The device with attention.cu's modules taken from attn_short.cu (the arm's SHORT_* defines added)."""

    def __init__(self, g, extra: dict):
        self._g, self.extra = g, extra

    def module(self, kernel_file, defines=None):
        if kernel_file == ATT.KERNEL_FILE:
            d = {k: v for k, v in (defines or {}).items() if k != "ATT_WARPS"}
            return self._g.module(SHORT_FILE, {**d, **self.extra})
        return self._g.module(kernel_file, defines)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self._g.launch(kernel, grid, block, args, 0, True)

    def __getattr__(self, name):
        return getattr(self._g, name)


class PdlGpu(ShortGpu):
    """The engine's arm: kernels/attention.cu, every launch with PDL."""

    def module(self, kernel_file, defines=None):
        return self._g.module(kernel_file, defines)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self._g.launch(kernel, grid, block, args, shmem, True)


def short_defines(shape: dict, arm: str) -> dict:
    cfg = arm_config(shape, arm)
    d = ATT.module_defines(shape["head_dim"], 1, cfg)
    d.update({k: v for k, v in ARMS[arm].items() if k != "ATT_WARPS"}, ATT_WARPS=cfg["ATT_WARPS"])
    return d


def hpb_group(g, s: dict, ctx: int, G: int, rng, rotate: int) -> dict:
    """kb8_vb8 at the whole GQA group a block (N_GQA = G sub-blocks of 8 warps: what the runner launches from
    plan.att_group_rows rows) on the inputs of a one-head-a-block launch: its output and q8 twin bit for bit the
    same (a head's bits must not depend on N_GQA), and its µs a launch."""
    extra = {k: v for k, v in ARMS["kb8_vb8"].items() if k != "ATT_WARPS"}
    cfg1 = arm_config(s, "kb8_vb8")
    case = ATT.tune_case(ShortGpu(g, {**extra, "ATT_WARPS": cfg1["ATT_WARPS"]}), "attn_decode", "default", cfg1,
                         {**s, "ctx": ctx, "batch": 1}, rng, rotate)
    n = s["n_head"] * s["head_dim"]

    def outputs():
        case.launch(0)
        g.sync()
        return (case.out.numpy()[:n].view(np.uint32).copy(), case.xq.numpy()[:n].copy() if case.q8 else None)

    one = outputs()
    w = cfg1["ATT_WARPS"] * G
    if w > 32:
        return {"hpb_group": f"skipped: {w} warps"}
    case.g, case.config, case.hpb = ShortGpu(g, {**extra, "ATT_WARPS": w}), {**cfg1, "ATT_WARPS": w, "hpb": G}, G
    grp = outputs()
    same = bool(np.array_equal(one[0], grp[0]) and (one[1] is None or np.array_equal(one[1], grp[1])))
    return {"hpb_group_bits_same": same, "kb8_vb8_hpb_group": round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)}


def compile_only() -> int:
    from memra.gpu.compile import compile_cubin

    for name, (s, _) in SHAPES.items():
        for arm in ARMS:
            compile_cubin(SHORT_FILE, "sm_90a", short_defines(s, arm))
            print(f"compiled {name} {arm}", flush=True)
        G = s["n_head"] // s["n_head_kv"]
        if G > 1:   # hpb_group's module
            d = {**short_defines(s, "kb8_vb8"), "N_GQA": G}
            d["ATT_WARPS"] *= G
            compile_cubin(SHORT_FILE, "sm_90a", d)
            print(f"compiled {name} kb8_vb8 N_GQA {G}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        return compile_only()
    g, rng, rotate = device()
    for name, (s, engine_cfg) in SHAPES.items():
        for ctx in CTX:
            row = {"shape": name, "ctx": ctx, "pdl": True}
            arms = [("engine", PdlGpu(g, {}), engine_cfg)]
            if engine_cfg != LONG:   # the entry's own configuration: what rows above a lowered switch would run
                arms.append(("engine_long", PdlGpu(g, {}), LONG))
            for arm in ARMS:
                cfg = arm_config(s, arm)
                extra = {k: v for k, v in ARMS[arm].items() if k != "ATT_WARPS"}
                arms.append((arm, ShortGpu(g, {**extra, "ATT_WARPS": cfg["ATT_WARPS"]}), cfg))
            for arm, ag, cfg in arms:
                try:
                    case = ATT.tune_case(ag, "attn_decode", "default", cfg, {**s, "ctx": ctx, "batch": 1}, rng, rotate)
                    ok, err, detail = case.check()
                    if not ok:
                        row[arm + "_error"] = detail
                        continue
                    row["splits"] = case.S
                    row[arm] = round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)
                except Exception as e:   # an arm the launcher or the compiler refuses
                    row[arm + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            G = s["n_head"] // s["n_head_kv"]
            if G > 1 and "kb8_vb8" in row:
                try:
                    row.update(hpb_group(g, s, ctx, G, rng, rotate))
                except Exception as e:
                    row["hpb_group_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            timed = [a for a in ARMS if a in row]
            if "engine" in row and timed:
                best = min(timed, key=lambda a: row[a])
                row["best"], row["saved_us"] = best, round(row["engine"] - row[best], 3)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
