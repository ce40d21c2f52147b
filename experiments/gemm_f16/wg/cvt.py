#!/usr/bin/env python3
"""cvt.py — gemm_f16_wg.cu's producer dequant without I2F (kernels/deq_cvt.cuh, landed in session 45) against the
T::deq it replaced: same bits? how much faster?

The model (deq_cvt.cuh's header): T::deq converts 1.5 values a conversion-pipe slot (I2F a value, F2FP a pair) at 16
a clock an SM, 768 clocks a 128 x 64 stage, where the stage's wgmma takes ~512 at WG_BN 128 and ~1,024 at 256;
DeqCvt<T> turns each byte into a float with one PRMT and one FADD (exact), leaving the F2FP packs: 256 clocks a
stage. Session 45 (research/2026-12-06-session45, H100): every launch the same bits; Q6_K down at 512 rows 229.8 ->
192.9 us, at 64 rows 223.1 -> 177.5, the 4-bit types +2-8 %. The landing's edits were made by this script's --land
from those receipts (`git show 3c097ca:experiments/gemm_f16/wg/cvt.py`); it now probes the landed kernel.

A probe-only copy of the engine's kernel (made in a temporary folder from kernels/gemm_f16_wg.cu by the text edit in
EDITS, which must find its line once) with a knob WG_CVT: 0 T::deq (the kernel before session 45), 1 DeqCvt<T> (the
kernel as it is). For each shape, row count and configuration: both modules' outputs compared bit for bit (and
WG_CVT 1 against the engine's own gemm_f16 launch), then each timed (arms alternating, -r rounds).

    python3 experiments/gemm_f16/wg/cvt.py --compile-only          # CPU: the edit applies and every module builds
    python3 experiments/gemm_f16/wg/cvt.py --compile-only --sass   # + I2F / F2FP counts a module (nvdisasm on PATH)
    source .whl/setup.sh && python3 experiments/gemm_f16/wg/cvt.py --out $OUT/wg-cvt.jsonl   # device, ~2 min

One JSON line per (shape, type, rows, configuration): us of both arms (medians of CUDA graphs, experiments/
gemm_tile's time_us), `same_bits` (WG_CVT 1 = WG_CVT 0 = the engine's launch, bit for bit).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
sys.path.insert(0, str(HERE))
import diag as DIAG  # noqa: E402  (knobbed_copy, compile_knobbed, compile_all, launcher)
from diag import GF, MV, TL  # noqa: E402  (the engine's gemm_f16 and matvec, experiments/gemm_tile)

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS = 2, 3, 6, 7, 8, 12, 13, 14, 23
WIDE, WG, WG64 = {"WG_BN": 256, "WG_INFLIGHT": 0}, {"WG_BN": 128}, {"WG_BN": 64}
# (name, type, weight rows (gate and up stacked for glu), K, glu, [(activation rows, configuration)...]): the 8B's
# shapes at the table's configurations (session 44's campaign) and the built-ins, then every other type once
SHAPES = [
    ("gate_up", Q4_K, 2 * 14336, 4096, True, [(512, WIDE), (128, WG), (64, WG64)]),
    ("down", Q6_K, 4096, 14336, False, [(512, WG), (512, {"WG_BN": 128, "WG_INFLIGHT": 0}), (64, WG64)]),
    ("down", Q4_K, 4096, 14336, False, [(512, WG), (512, {"WG_BN": 128, "WG_STAGES": 6}), (64, WG64)]),
    ("qkv", Q4_K, 6144, 4096, False, [(512, WIDE), (64, WG64)]),
    ("attn_output", Q4_K, 4096, 4096, False, [(512, WG), (64, WG64)]),
    ("gate_up", Q4_0, 2 * 14336, 4096, True, [(512, WIDE), (64, WG64)]),
    ("gate_up", Q8_0, 2 * 14336, 4096, True, [(512, WIDE), (64, WG64)]),
    ("down", Q8_0, 4096, 14336, False, [(512, {"WG_BN": 128, "WG_INFLIGHT": 0})]),
    *[("other", t, 2048, 2048, False, [(512, WG), (64, WG64)]) for t in (Q4_1, Q5_0, Q5_1, Q5_K, IQ4_XS)],
]

# (the kernel's line, what replaces it)
EDITS = [
    ("                        DeqCvt<T>::deq(v[i][h], g, f);\n",
     "#if WG_CVT\n"
     "                        DeqCvt<T>::deq(v[i][h], g, f);\n"
     "#else\n"
     "                        T::deq(v[i][h], g, f);\n"
     "#endif\n"),
]


def cvt_source(folder: Path) -> Path:
    """The knobbed copy of the kernel in `folder` (diag.py's knobbed_copy; deq_cvt.cuh from kernels/)."""
    return DIAG.knobbed_copy(folder, EDITS, "WG_CVT", "cvt.py")


def modules():
    """(type, configuration items, WG_CVT) of every module the run needs."""
    return sorted({(t, tuple(sorted(cfg.items())), c) for _, t, _, _, _, runs in SHAPES for _, cfg in runs
                   for c in (0, 1)})


def _compile(job):
    src, (t, cfg, c) = job
    return DIAG.compile_knobbed(src, "WG_CVT", t, cfg, c)


def sass_counts(cubin: bytes) -> dict:
    """I2F and F2FP instructions of the module (nvdisasm): the conversions the producer issues."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(["nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", out)
    return {k: ops.count(k) for k in ("I2F", "I2FP", "F2FP", "PRMT", "FADD", "FFMA", "FMUL", "LOP3", "SHF", "IMAD")} | {"total": len(ops)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSON lines appended here (required unless --compile-only)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--sass", action="store_true", help="with --compile-only: count each module's conversions")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, arms alternating")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wg-cvt-"))
    src = cvt_source(folder)
    cubs = DIAG.compile_all(src, modules(), _compile)
    if args.compile_only:
        if args.sass:
            for (t, cfg, c), cub in sorted(cubs.items()):
                print(t, dict(cfg), f"WG_CVT {c}", sass_counts(cub), flush=True)
        return 0
    g, rng, cache = DIAG.device_run(ap, args)
    bad = 0
    with open(args.out, "a") as out:
        for name, t, rows, K, glu, runs in SHAPES:
            w = MV.upload_weight(g, MV.random_weight(t, rows, K, rng), t)
            n_out = rows // 2 if glu else rows
            for nb, cfg in runs:
                xh = g.to_device(rng.standard_normal((nb, K)).astype(np.float16).view(np.uint16))
                ys = {c: g.empty((nb, n_out), np.float32) for c in ("eng", 0, 1)}
                grid, block, smem = GF.launch_shape(t, cfg, n_out, nb, glu)
                launch = {}
                for c in (0, 1):
                    key = (t, tuple(sorted(cfg.items())), c)
                    m = TL.prebuilt_module(g, cache, key, "gemm_f16_wg.cu", {"MV_TYPE": t, "WG_CVT": c, **cfg},
                                           lambda k=key: cubs[k])
                    launch[c] = DIAG.launcher(g, m, w, xh, ys[c], n_out, K, nb, glu, grid, block, smem)
                    launch[c]()
                GF.gemm_f16(g, w, ys["eng"], xh=xh, nb=nb, glu="silu" if glu else None, config=cfg)
                got = {c: ys[c].numpy().view(np.uint32) for c in ys}
                same = bool(np.array_equal(got[0], got[1]) and np.array_equal(got[0], got["eng"]))
                bad += not same
                us = {0: [], 1: []}
                for _ in range(args.rounds):
                    for c in (0, 1):
                        us[c].append(TL.time_us(g, [launch[c]], args.reps))
                rec = {"kind": "gemm_f16_wg_cvt", "shape": name, "type": MV.TYPES[t][0], "rows": rows, "K": K,
                       "nb": nb, "config": cfg, "same_bits": same, "us_i2f": float(np.median(us[0])),
                       "us_cvt": float(np.median(us[1])), "us_i2f_all": us[0], "us_cvt_all": us[1],
                       "device": g.info.name}
                rec["gain"] = rec["us_i2f"] / rec["us_cvt"] - 1.0
                print(json.dumps(rec), flush=True)
                out.write(json.dumps(rec) + "\n")
    print(f"{'ALL SAME BITS' if not bad else f'{bad} LAUNCHES DIFFER'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
