#!/usr/bin/env python3
"""cvt.py — gemm_f16_wg.cu's producer dequant without I2F (deq_cvt.cuh), against the kernel as it is: same bits?
how much faster?

The model (deq_cvt.cuh's header): the producer converts 1.5 values a conversion-pipe slot (I2F a value, F2FP a
pair) at 16 a clock an SM, 768 clocks a 128 x 64 stage, where the stage's wgmma takes ~512 at WG_BN 128 and ~1,024
at 256; diag.py measured the Q6_K down at WG_BN 128 1.55x slower than without its dequant. deq_cvt.cuh turns each
byte into a float with one PRMT and one FADD (exact), leaving the F2FP packs: 256 clocks a stage. Predicted: the
WG_BN 128 and 64 launches (the 4,096-row weights, every 64- and 128-row launch of the table) toward diag's
no-dequant times (Q6_K down at 512 rows 226.8 -> ~150-170 us), WG_BN 256 less (its wgmma already outlasts the
dequant: ~-5-15 %).

A probe-only copy of the engine's kernel (made in a temporary folder from kernels/gemm_f16_wg.cu by the text edits
in EDITS, each of which must find its line once) with a knob WG_CVT: 0 T::deq (the kernel as it is), 1 DeqCvt<T>.
For each shape, row count and configuration: both modules' outputs compared bit for bit (and WG_CVT 0 against the
engine's own gemm_f16 launch), then each timed (arms alternating, -r rounds).

    python3 experiments/gemm_f16/wg/cvt.py --compile-only          # CPU: the edits apply and every module builds
    python3 experiments/gemm_f16/wg/cvt.py --compile-only --sass   # + I2F / F2FP counts a module (nvdisasm on PATH)
    source .whl/setup.sh && python3 experiments/gemm_f16/wg/cvt.py --out $OUT/wg-cvt.jsonl   # device, ~2 min
    python3 experiments/gemm_f16/wg/cvt.py --land wg-cvt.jsonl     # the landing's kernel edits, in kernels/

--land writes kernels/deq_cvt.cuh and edits kernels/gemm_f16_wg.cu (the producer calls DeqCvt<T>::deq; its header
gains variant v2 with the run's numbers) and gemm_f16.cu's stale header lines: the same bytes wherever it runs with the
same receipts, so a device call can land, kernel-check and campaign on its copy, and the CPU's copy, made by the
same command from the committed receipts, has the same source hashes (it refuses receipts whose bits differ).

One JSON line per (shape, type, rows, configuration): us of both arms (medians of CUDA graphs, experiments/
gemm_tile's time_us), `same_bits` (WG_CVT 1 = WG_CVT 0 = the engine's launch, bit for bit).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
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

HEADER = HERE / "deq_cvt.cuh"
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
    ('#include "qtypes.cuh"\n',
     '#include "qtypes.cuh"\n#include "deq_cvt.cuh"\n'),
    ("                        T::deq(v[i][h], g, f);\n",
     "#if WG_CVT\n"
     "                        DeqCvt<T>::deq(v[i][h], g, f);\n"
     "#else\n"
     "                        T::deq(v[i][h], g, f);\n"
     "#endif\n"),
]


def cvt_source(folder: Path) -> Path:
    """The knobbed copy of the kernel (and deq_cvt.cuh) in `folder` (diag.py's knobbed_copy)."""
    shutil.copy(HEADER, folder / HEADER.name)
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


PROBE_NOTE = ("// A probe-only header (experiments/gemm_f16/wg/cvt.py compiles gemm_f16_wg.cu with it, WG_CVT 1, against\n"
              "// T::deq, WG_CVT 0); it lands as the kernel's own once a device run shows the same bits and the time.\n")
LANDED_NOTE = ("// gemm_f16_wg.cu's producer calls DeqCvt<T>::deq where it called T::deq (experiments/gemm_f16/wg/cvt.py\n"
               "// measured both; kernel-check holds every gemm_f16 launch to gemm_f16.cu's bits).\n")


def land_summary(recs: list[dict]) -> str:
    """The v2 line's numbers: the 512-row launches of the 8B's gate+up and downs, both arms, and the device."""
    want = [("down", "Q6_K"), ("down", "Q4_K"), ("gate_up", "Q4_K"), ("gate_up", "Q8_0"), ("down", "Q8_0")]
    parts = []
    for shape, t in want:
        r = next((r for r in recs if (r["shape"], r["type"], r["nb"]) == (shape, t, 512)), None)
        if r is not None:
            parts.append(f"{t} {shape.replace('_', '+')} {r['us_i2f']:.1f} -> {r['us_cvt']:.1f}")
    return ", ".join(parts) + f" (us at 512 rows, {recs[0]['device']})"


def land_edits(summary: str) -> dict[str, list[tuple[str, str]]]:
    """kernels/ file -> (old text, new text) edits of the landing; each old text must occur once."""
    import textwrap

    v2 = ("//   v2 (session 45, experiments/gemm_f16/wg/cvt.py): the producer's integer -> float step by the exponent\n"
          + "".join(f"//     {line}\n" for line in textwrap.wrap(
              "trick (deq_cvt.cuh: no I2F, the same floats and bits as T::deq): " + summary + ".", 110)))
    return {
        "gemm_f16_wg.cu": [
            ('#include "qtypes.cuh"\n', '#include "qtypes.cuh"\n#include "deq_cvt.cuh"\n'),
            ("                        T::deq(v[i][h], g, f);\n",
             "                        DeqCvt<T>::deq(v[i][h], g, f);\n"),
            ("//     everywhere (389-593).\n", "//     everywhere (389-593).\n" + v2),
            ("// W is dequantized exactly as gemm_f16.cu does it (qtypes.cuh's T::deq, the f32 value ggml gives, rounded to\n"
             "// f16 once by cvt.rn.f16x2.f32; the same source compiled with the same options). Entries and arguments are\n",
             "// W is dequantized to the values gemm_f16.cu's qtypes.cuh T::deq gives (the f32 value ggml gives; deq_cvt.cuh's\n"
             "// DeqCvt<T> computes them without I2F), rounded to f16 once by cvt.rn.f16x2.f32. Entries and arguments are\n"),
            ("(WG_PREFETCH) -> dequantize pair P's units (T::deq, cvt.rn.f16x2.f32)",
             "(WG_PREFETCH) -> dequantize pair P's units (DeqCvt<T>::deq, cvt.rn.f16x2.f32)"),
        ],
        "gemm_f16.cu": [
            ("// (memra.gpu.plan; off by default) for MEMRA_ATTN=hybrid's prompt rows.\n",
             "// (memra.gpu.plan; the default since session 43) for MEMRA_ATTN=hybrid's prompt rows: its to_f16\n"
             "// everywhere, its GEMM off sm_90a (gemm_f16_wg.cu on sm_90a: the same bits).\n"),
            ("Not yet timed on a device: the experiment's probe\n"
             "//     (experiments/gemm_f16/probe.py, 8B shapes at 512 rows against gemm_tile.cu) is the first\n"
             "//     measurement to make.\n",
             "Timed in session 42 (research/2026-12-06-session42/f:\n"
             "//     at parity with the int8 tile on the 8B's Q4_K gate+up at 512 rows, 677 vs 689 us, 1.39x on the\n"
             "//     Q6_K down); on sm_90a the engine runs gemm_f16_wg.cu instead.\n"),
        ],
    }


def land(receipts: Path, kdir: Path = ROOT / "kernels") -> None:
    """The landing's edits in `kdir` from a device run's receipts (all launches the same bits)."""
    recs = [json.loads(line) for line in receipts.read_text().splitlines() if line.strip()]
    if not recs or not all(r["same_bits"] for r in recs):
        raise SystemExit(f"cvt.py --land: {receipts} is empty or has launches whose bits differ: not landing")
    header = HEADER.read_text()
    if header.count(PROBE_NOTE) != 1:
        raise SystemExit("cvt.py --land: deq_cvt.cuh's probe note moved: update PROBE_NOTE")
    texts = {}
    for name, edits in land_edits(land_summary(recs)).items():
        src = (kdir / name).read_text()
        for old, new in edits:
            if src.count(old) != 1:
                raise SystemExit(f"cvt.py --land: {name}: {old.strip()[:60]!r} occurs {src.count(old)} times")
            src = src.replace(old, new)
        texts[name] = src
    (kdir / HEADER.name).write_text(header.replace(PROBE_NOTE, LANDED_NOTE))
    for name, src in texts.items():
        (kdir / name).write_text(src)
    print(f"landed: {kdir / HEADER.name}, " + ", ".join(str(kdir / n) for n in texts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSON lines appended here (required unless --compile-only)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--sass", action="store_true", help="with --compile-only: count each module's conversions")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, arms alternating")
    ap.add_argument("--land", type=Path, metavar="RECEIPTS", help="apply the landing's edits to kernels/ (above)")
    args = ap.parse_args()
    if args.land:
        land(args.land)
        return 0
    folder = Path(tempfile.mkdtemp(prefix="wg-cvt-"))
    src = cvt_source(folder)
    cubs = DIAG.compile_all(src, modules(), _compile)
    if args.compile_only:
        if args.sass:
            for (t, cfg, c), cub in sorted(cubs.items()):
                print(t, dict(cfg), f"WG_CVT {c}", sass_counts(cub), flush=True)
        return 0
    if not args.out:
        ap.error("--out is required for a device run")

    from memra.gpu.cuda import gpu

    g = gpu()
    rng = np.random.default_rng(0)
    cache: dict = {}
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
