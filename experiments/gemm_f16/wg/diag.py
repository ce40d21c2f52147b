#!/usr/bin/env python3
"""diag.py — where kernels/gemm_f16_wg.cu's time goes: the same kernel with one part taken out at a time.

A probe-only copy of the engine's kernel (made in a temporary folder from kernels/gemm_f16_wg.cu by the text edits
in EDITS, each of which must find its line: an edit of the kernel that moves one fails here, loudly) with a knob
WG_DIAG: 0 the kernel as it is; 1 the producer loads the weight units but does not dequantize or store them (one
word of each unit stored instead, so the loads stay); 2 no x copies (the x tiles are whatever the slots held);
3 the consumers skip the wgmma (they still wait for each stage and release it). The outputs of 1-3 are wrong by
design: only the time counts. The gaps to 0 say what bounds a stage: the dequant (1), the L2's x traffic (2) or the
tensor cores (3).

    python3 experiments/gemm_f16/wg/diag.py --compile-only        # CPU: the edits apply and every module builds
    source .whl/setup.sh && python3 experiments/gemm_f16/wg/diag.py --out $OUT/wg-diag.jsonl   # device, ~1 min

One JSON line per (shape, configuration, WG_DIAG): median µs of a CUDA graph of launches (experiments/gemm_tile's
time_us), the 8B's gate+up (Q4_K) and Q6_K down at 512 rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import tile as TL  # noqa: E402  (experiments/gemm_tile: compile_module, prebuilt_module, time_us)

from memra.gpu.ops import gemm_f16 as GF  # noqa: E402
from memra.gpu.ops import matvec as MV  # noqa: E402

KERNEL = ROOT / "kernels" / "gemm_f16_wg.cu"
Q4_K, Q6_K = 12, 14
SHAPES = [("gate_up", Q4_K, 2 * 14336, 4096, True), ("down", Q6_K, 4096, 14336, False)]
CONFIGS = [{"WG_BN": 256, "WG_INFLIGHT": 0}, {"WG_BN": 128}]
NB = 512

# (the kernel's line, what replaces it): the knob's three cuts
EDITS = [
    ("                        DeqCvt<T>::deq(v[i][h], g, f);\n",
     "#if WG_DIAG == 1\n"
     "                        if (g == 0) st_shared_v4(wa + sw128(r, h), *(const uint32_t*)&v[i][h], 0u, 0u, 0u);\n"
     "                        continue;\n"
     "#endif\n"
     "                        DeqCvt<T>::deq(v[i][h], g, f);\n"),
    ("                cp16_zfill(dst + 2048 * q, xs + xoff[q], m0 + r0 + 16 * q < nb);   // 16 rows = 2 atoms\n",
     "#if WG_DIAG != 2\n"
     "                cp16_zfill(dst + 2048 * q, xs + xoff[q], m0 + r0 + 16 * q < nb);   // 16 rows = 2 atoms\n"
     "#else\n"
     "                ;\n"
     "#endif\n"),
    ("                wgmma_tile(acc[mt], sw128_desc(wt + (WG_MT * c + mt) * 8192 + 32 * kk), db);\n",
     "#if WG_DIAG != 3\n"
     "                wgmma_tile(acc[mt], sw128_desc(wt + (WG_MT * c + mt) * 8192 + 32 * kk), db);\n"
     "#else\n"
     "                ;\n"
     "#endif\n"),
]


def knobbed_copy(folder: Path, edits, knob: str, who: str) -> Path:
    """A copy of the kernel in `folder` with `edits` applied and `knob` defaulting to 0 (diag.py's, cvt.py's);
    raises if an edit's line is not in the kernel once (the kernel moved on)."""
    src = KERNEL.read_text()
    for old, new in edits:
        n = src.count(old)
        if n != 1:
            raise SystemExit(f"{who}: the kernel line {old.strip()!r} occurs {n} times (the kernel moved on: "
                             f"update EDITS)")
        src = src.replace(old, new)
    out = folder / "gemm_f16_wg.cu"
    out.write_text(f"#ifndef {knob}\n#define {knob} 0\n#endif\n" + src)
    return out


def diag_source(folder: Path) -> Path:
    """The knobbed copy of the kernel in `folder`."""
    return knobbed_copy(folder, EDITS, "WG_DIAG", "diag.py")


def launcher(g, m, w, xh, y, n_out: int, K: int, nb: int, glu: bool, grid, block, smem):
    """A closure launching module m's gemm_f16 (or _glu, SiLU) entry over y = W xh, as the engine's launcher does."""
    if glu:
        args = (w.bulk, w.meta, xh, y, np.int32(n_out), np.int32(K), np.int32(nb), np.int32(MV.ACTS["silu"]))
        k = m.kernel("gemm_f16_glu")
    else:
        args = (w.bulk, w.meta, xh, y, np.uint64(0), np.int32(n_out), np.int32(K), np.int32(nb))
        k = m.kernel("gemm_f16")
    return lambda: g.launch(k, grid, block, args, shmem=smem)


def jobs():
    return [(t, cfg, d) for _, t, _, _, _ in SHAPES for cfg in CONFIGS for d in range(4)]


def compile_knobbed(src: str, knob: str, t: int, cfg, value: int) -> bytes:
    """The knobbed copy `src` compiled for MV_TYPE t, configuration cfg and knob = value (diag.py's, cvt.py's)."""
    cub, _ = TL.compile_module({"MV_TYPE": t, knob: value, **dict(cfg)}, Path(src), default_device=True)
    return cub


def compile_all(src: Path, modules, compile_one) -> dict:
    """{module: cubin} of compile_one((str(src), module)) for every module, in parallel processes."""
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(min(8, os.cpu_count() or 1)) as ex:
        cubs = dict(zip(modules, ex.map(compile_one, [(str(src), m) for m in modules])))
    print(f"compiled {len(cubs)} modules", flush=True)
    return cubs


def device_run(ap, args):
    """A probe's device half begins: --out required; (the GPU, the weights' rng, a module cache)."""
    if not args.out:
        ap.error("--out is required for a device run")
    from memra.gpu.cuda import gpu

    return gpu(), np.random.default_rng(0), {}


def _compile(job):
    src, (t, cfg, d) = job
    return compile_knobbed(src, "WG_DIAG", t, cfg, d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSON lines appended here (required unless --compile-only)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wg-diag-"))
    src = diag_source(folder)
    cubs = compile_all(src, sorted({(t, tuple(sorted(c.items())), d) for t, c, d in jobs()}), _compile)
    if args.compile_only:
        return 0
    g, rng, cache = device_run(ap, args)
    with open(args.out, "a") as out:
        for name, t, rows, K, glu in SHAPES:
            w = MV.upload_weight(g, MV.random_weight(t, rows, K, rng), t)
            xh = g.to_device(rng.standard_normal((NB, K)).astype(np.float16).view(np.uint16))
            n_out = rows // 2 if glu else rows
            y = g.empty((NB, n_out), np.float32)
            for cfg in CONFIGS:
                grid, block, smem = GF.launch_shape(t, cfg, n_out, NB, glu)
                for d in range(4):
                    key = (t, tuple(sorted(cfg.items())), d)
                    m = TL.prebuilt_module(g, cache, key, "gemm_f16_wg.cu", {"MV_TYPE": t, "WG_DIAG": d, **cfg},
                                           lambda k=key: cubs[k])
                    us = TL.time_us(g, [launcher(g, m, w, xh, y, n_out, K, NB, glu, grid, block, smem)], args.reps)
                    rec = {"kind": "gemm_f16_wg_diag", "shape": name, "type": MV.TYPES[t][0], "config": cfg,
                           "WG_DIAG": d, "nb": NB, "us": us, "device": g.info.name}
                    print(json.dumps(rec), flush=True)
                    out.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
