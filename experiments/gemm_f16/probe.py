"""gemm_f16.cu on the device: checked against numpy, timed against the engine's prompt tile.

For each of the 8B's prompt GEMM shapes at 512 rows (and the configurations in CONFIGS):
- check: the first CHECK_ROWS outputs against float64 products of the f16-rounded weights (ggml's
  dequantized value rounded once) and activations (max error over max |reference|, bound TOL),
  and the order's contract bit for bit: rows 0..36 of a 37-row launch equal those of the 512-row
  one (chunk invariance), and every configuration gives the first one's bits (tile invariance);
- time: gemm_f16 (and to_f16, the conversion that replaces the q8 quantize) against gemm_tile.cu
  with the table's 512-row configuration for the shape (quantize_q8 timed beside it), each a CUDA
  graph of launches (experiments/gemm_tile/tile.py's time_us), median µs, TFLOPS.

    source .whl/setup.sh && python3 experiments/gemm_f16/probe.py --out $OUT/gemm-f16.jsonl

One JSON line per shape and configuration (kind "gemm_f16"), and one per shape for the tile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
SRC = Path(__file__).with_name("gemm_f16.cu")

Q4_0, Q8_0, Q4_K, Q6_K = 2, 8, 12, 14
# (name, type, weight rows (glu: gate and up stacked), K, glu): the 8B Q4_K_M's prompt GEMMs and
# the gate+up of its Q4_0 / Q8_0 twins
SHAPES = [
    ("gate_up", Q4_K, 2 * 14336, 4096, True),
    ("down", Q6_K, 4096, 14336, False),
    ("down", Q4_K, 4096, 14336, False),
    ("qkv", Q4_K, 6144, 4096, False),
    ("attn_output", Q4_K, 4096, 4096, False),
    ("gate_up", Q4_0, 2 * 14336, 4096, True),
    ("gate_up", Q8_0, 2 * 14336, 4096, True),
]
CONFIGS = [dict(GF_WM=2, GF_WN=4, GF_TM=8, GF_TN=4), dict(GF_WM=2, GF_WN=4, GF_TM=8, GF_TN=4, GF_OVERLAP=1),
           dict(GF_WM=2, GF_WN=4, GF_TM=4, GF_TN=4), dict(GF_WM=2, GF_WN=4, GF_TM=4, GF_TN=4, GF_OVERLAP=1),
           dict(GF_WM=2, GF_WN=2, GF_TM=4, GF_TN=4, GF_MINB=2)]
NB, CHUNK, CHECK_ROWS, TOL = 512, 37, 256, 1e-4
TNAME = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}


def geom(cfg: dict) -> tuple[int, int, int, int]:
    """(threads, BM weight rows, BN activation rows, shared memory bytes) of a configuration."""
    wm, wn, tm, tn = (int(cfg[k]) for k in ("GF_WM", "GF_WN", "GF_TM", "GF_TN"))
    bm, bn = 16 * tm * wm, 8 * tn * wn
    return 32 * wm * wn, bm, bn, 2 * (bm + bn) * 272


def _compile(defs: dict):
    import tile as TL
    return TL.compile_module(defs, SRC)


def table_config(kernel: str, t: int, rows: int, K: int) -> dict:
    entries = json.loads((ROOT / "tune/defaults/nvidia-h200.json").read_text())["entries"]
    e = entries.get(kernel, {}).get(f"cols={K},rows={rows},type={TNAME[t]}", {}).get("512")
    return dict(e["config"]) if e else {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--limit", type=float, default=420.0, help="seconds: stop starting shapes after this")
    args = ap.parse_args()
    t0 = time.time()

    import tile as TL
    from memra.gpu.cuda import gpu
    from memra.gpu.ops import gemm_tile as GT
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE
    from memra.model import quants as Q

    # every module compiled before the CUDA context, side by side in processes
    from concurrent.futures import ProcessPoolExecutor
    keys = [(t, ci) for t in sorted({s[1] for s in SHAPES}) for ci in range(len(CONFIGS))]
    with ProcessPoolExecutor(8) as ex:
        built = list(ex.map(_compile, [({"MV_TYPE": t, **CONFIGS[ci]}) for t, ci in keys]))
    mods = dict(zip(keys, built))
    print(f"compiled {len(mods)} modules in {time.time() - t0:.0f} s", flush=True)
    g = gpu()
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    cache: dict = {}
    rng = np.random.default_rng(0)
    out = open(args.out, "a")

    def module(t, ci):
        return TL.prebuilt_module(g, cache, (t, ci), "gemm_f16.cu", {"MV_TYPE": t, **CONFIGS[ci]},
                                  lambda: mods[(t, ci)][0])

    def f16_launch(t, ci, w, xh, y, n_out, K, nb, glu):
        nt, bm, bn, smem = geom(CONFIGS[ci])
        obm = bm // 2 if glu else bm
        assert n_out % obm == 0 and K % 128 == 0
        m = module(t, ci)
        grid = (-(-nb // bn), n_out // obm, 1)
        if glu:
            g.launch(m.kernel("gemm_f16_glu"), grid, (nt, 1, 1),
                     (w.bulk, w.meta, xh, y, np.int32(n_out), np.int32(K), np.int32(nb), np.int32(1)), shmem=smem)
        else:
            g.launch(m.kernel("gemm_f16"), grid, (nt, 1, 1),
                     (w.bulk, w.meta, xh, y, np.uint64(0), np.int32(n_out), np.int32(K), np.int32(nb)), shmem=smem)

    def to_f16(t, x, xh, n):
        m = module(t, 0)
        g.launch(m.kernel("to_f16"), (-(-n // 512), 1, 1), (256, 1, 1), (x, xh, np.int32(n)))

    for name, t, rows, K, glu in SHAPES:
        if time.time() - t0 > args.limit:
            print(f"limit reached before {name} {TNAME[t]}", flush=True)
            break
        n_out = rows // 2 if glu else rows
        raw = MV.random_weight(t, rows, K, rng)
        w = MV.upload_weight(g, raw, t)
        x = (rng.standard_normal((NB, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xd = g.to_device(x)
        xh = g.empty((NB, K), np.uint16)
        to_f16(t, xd, xh, NB * K)
        g.sync()
        x16 = xh.numpy().view(np.float16).astype(np.float64)
        conv_ok = bool(np.array_equal(xh.numpy(), x.astype(np.float16).view(np.uint16)))
        # the reference: the first CHECK_ROWS outputs (glu: their gate and up rows)
        sel = np.r_[0:CHECK_ROWS, n_out:n_out + CHECK_ROWS] if glu else np.r_[0:CHECK_ROWS]
        wf = Q.dequantize(raw[sel], t, (len(sel), K)).astype(np.float16).astype(np.float64)
        prod = x16 @ wf.T
        if glu:
            gt, up = prod[:, :CHECK_ROWS], prod[:, CHECK_ROWS:]
            ref = gt / (1 + np.exp(-gt)) * up
        else:
            ref = prod
        bits0 = None
        for ci, cfg in enumerate(CONFIGS):
            rec = {"kind": "gemm_f16", "shape": name, "type": TNAME[t], "rows": rows, "K": K, "glu": glu, "nb": NB,
                   "config": cfg, "git_sha": sha, "device": g.info.name}
            try:
                y = g.empty((NB, n_out), np.float32)
                y.poison()
                f16_launch(t, ci, w, xh, y, n_out, K, NB, glu)
                g.sync()
                got = y.numpy()
                err = float(np.max(np.abs(got[:, :CHECK_ROWS] - ref)) / np.max(np.abs(ref)))
                yc = g.empty((CHUNK, n_out), np.float32)
                yc.poison()
                f16_launch(t, ci, w, xh, yc, n_out, K, CHUNK, glu)
                g.sync()
                chunk_same = bool(np.array_equal(yc.numpy().view(np.uint32), got[:CHUNK].view(np.uint32)))
                bits = got.view(np.uint32).copy()
                cfg_same = True if bits0 is None else bool(np.array_equal(bits, bits0))
                bits0 = bits if bits0 is None else bits0
                us = TL.time_us(g, [lambda: f16_launch(t, ci, w, xh, y, n_out, K, NB, glu)], args.reps)
                conv_us = TL.time_us(g, [lambda: to_f16(t, xd, xh, NB * K)], args.reps)
                flops = 2.0 * NB * rows * K
                rec.update(ok=bool(err < TOL and chunk_same and cfg_same and conv_ok), err=err, chunk_same=chunk_same,
                           config_same=cfg_same, to_f16_exact=conv_ok, us=us, to_f16_us=conv_us,
                           tflops=flops / us / 1e6)
            except Exception as e:  # a configuration that fails to launch: recorded, the rest go on
                rec.update(ok=False, error=f"{type(e).__name__}: {e}")
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()
        # the engine's prompt tile on the same weight (q8 activations), the table's configuration
        kern = "gemm_tile_glu" if glu else "gemm_tile"
        cfg = table_config(kern, t, rows, K)
        rec = {"kind": "gemm_tile", "shape": name, "type": TNAME[t], "rows": rows, "K": K, "glu": glu, "nb": NB,
               "config": cfg, "git_sha": sha, "device": g.info.name}
        try:
            xq, xs = g.empty((NB, K), np.int8), g.empty((NB, K // 32), Q8_SCALE)
            MV.quantize_q8(g, xd, xq, xs, NB)
            y = g.empty((NB, n_out), np.float32)
            us = TL.time_us(g, [lambda: GT.gemm_tile(g, w, y, xq=xq, xs=xs, nb=NB, glu="silu" if glu else None,
                                                     config=cfg)], args.reps)
            q_us = TL.time_us(g, [lambda: MV.quantize_q8(g, xd, xq, xs, NB)], args.reps)
            rec.update(us=us, quantize_us=q_us, tflops=2.0 * NB * rows * K / us / 1e6)
        except Exception as e:
            rec.update(error=f"{type(e).__name__}: {e}")
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
