#!/usr/bin/env python3
"""check: experiments/gemm_wg/gemm_wg.cu must give mv_q8's bits, and how fast against gemm.cu.

Built on experiments/gemm_check.py (planes, random weights, the matvec launch rule, the device
wrapper, q8 quantization on the device, timing). On the H200:

    python3 experiments/gemm_wg/check.py                  # compile, bit checks, canary, timing
    python3 experiments/gemm_wg/check.py --compile-only   # CPU: every module through NVRTC
    options: --types Q4_K,Q4_0,Q8_0  --swap 0,1 (descriptor field order to try)  --no-timing  --reps 20

Checks (per type and descriptor order): random valid weights, activations quantized on the device,
y poisoned with 0xFF (or the residual, aliased), mv_q8 as memra launches it, then gemm_wg once; the
uint32 views of y must be equal; shapes 200 x 2560 (and _glu) and 72 x 768 at nb 1, 7, 64, 65, 130;
the canary (MEMRA_CANARY=1 drops unit 1) must differ. Timing: the 8B's shapes at 128 and 512 rows,
gemm_wg against kernels/gemm.cu with the table's 512-row configuration 2,2,2,4,1,3,1,1 (both bit-checked
against mv_q8). JSON lines to $OUT/gemm-wg.jsonl when OUT is set; exit 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import gemm_check as gc  # noqa: E402

SRC = "gemm_wg.cu"
TYPES = {"Q4_0": 2, "Q4_K": 12, "Q8_0": 8}
GT = {2: (48, 4), 12: (48, 16), 8: (80, 4)}   # gemm.cu's G<T> WBS, MWS
GEMM_CFG = {"GM_WM": 2, "GM_WN": 2, "GM_TM": 2, "GM_TN": 4, "GM_WK": 1, "GM_STAGES": 3, "GM_LREG": 1, "GM_MINB": 1}
CHECK_SHAPES = ((200, 2560), (72, 768))
CHECK_NBS = (1, 7, 64, 65, 130)
TIME_SHAPES = (("Q4_K glu 2x14336x4096", 12, 14336, 4096, True), ("Q4_K 4096x4096", 12, 4096, 4096, False),
               ("Q4_K qkv 6144x4096", 12, 6144, 4096, False), ("Q4_0 4096x4096", 2, 4096, 4096, False),
               ("Q8_0 4096x4096", 8, 4096, 4096, False))
TIME_NBS = (128, 512)


def smem(t: int, stages: int = 3, lreg: int = 1) -> int:
    """gemm_wg.cu's WG_SMEM."""
    up = lambda x: (x + 127) // 128 * 128   # noqa: E731
    wbs, mws = GT[t]
    off_b = up(64 * wbs + 64 * mws)
    stage = up(off_b + 2 * 2048 + 64 * 16)
    return stages * stage + 2 * 2048 + 64 * 16 + (5 - lreg) * 32 * 128 * 4


def defs(t: int, swap: int, canary: int = 0) -> dict:
    d = {"MV_TYPE": t, "WG_SWAP": swap, "WG_EXPECT_SMEM": smem(t)}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def compile_wg(job):
    from cuda.core import Program, ProgramOptions

    d = job
    opts = ProgramOptions(name=SRC, arch=gc.ARCH, std="c++17", lineinfo=True, include_path=[str(gc.KDIR)],
                          define_macro=[(k, str(v)) for k, v in sorted(d.items())], ptxas_options=["-v"])
    log = io.StringIO()
    try:
        obj = Program((HERE / SRC).read_text(), "c++", opts).compile("cubin", logs=log)
    except Exception as e:   # the NVRTC log
        return gc.module_key(SRC, d), None, f"{type(e).__name__}: {e}", log.getvalue()
    return gc.module_key(SRC, d), bytes(obj.code), None, log.getvalue()


def run_wg(d, w, xq, xs, y, N, nb, glu, act, res, dd, target=None):
    k = d.kernel(SRC, dd, "gemm_q8_glu" if glu else "gemm_q8")
    obm = 32 if glu else 64
    d.launch(k, ((N + obm - 1) // obm, (nb + 63) // 64, 1), (128, 1, 1),
             (w.bulk, w.meta, xq, xs, y, res or 0, np.int32(N), np.int32(w.K), np.int32(nb), np.int32(act)),
             shmem=smem(w.t), target=target)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--types", default="Q4_K,Q4_0,Q8_0")
    ap.add_argument("--swap", default="0,1")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    types = [TYPES[x] for x in args.types.split(",")]
    swaps = [int(x) for x in args.swap.split(",")]

    wg_jobs = [defs(t, s) for t in types for s in swaps] + [defs(t, swaps[0], canary=1) for t in types]
    other = [("q8.cu", {"Q8_WARPS": gc.Q8_WARPS})]
    for t in types:
        for (N, K) in CHECK_SHAPES + tuple((s[2], s[3]) for s in TIME_SHAPES if s[1] == t):
            for nb in CHECK_NBS + TIME_NBS:
                for glu in (False, True):
                    other += [("matvec.cu", dd) for _, _, dd in gc.mv_chunks(t, K, nb, glu)]
        other.append(("gemm.cu", {"MV_TYPE": t, **GEMM_CFG}))
    t0 = time.perf_counter()
    cubins = gc.compile_all(other, args.jobs)
    from concurrent.futures import ProcessPoolExecutor

    bad = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for key, cub, err, log in ex.map(compile_wg, wg_jobs):
            regs = [ln.strip() for ln in log.splitlines() if "registers" in ln]
            print(f"{'ok ' if cub else 'ERR'} {key[1]}  {' | '.join(regs)}{'' if cub else chr(10) + err}", flush=True)
            if cub:
                cubins[key] = cub
            else:
                bad += 1
    print(f"compiled {len(cubins)} modules in {time.perf_counter() - t0:.1f} s, {bad} errors", flush=True)
    if bad:
        return 2
    if args.compile_only:
        return 0

    out = Path(os.environ["OUT"]) / "gemm-wg.jsonl" if os.environ.get("OUT") else None
    fh = out.open("a") if out else None

    def jsonl(rec):
        if fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()

    d = gc.Dev(cubins)
    tally = gc.Tally(jsonl)
    rng = np.random.default_rng(7)
    for t in types:
        for swap in swaps:
            for (N, K) in CHECK_SHAPES:
                for glu in (False, True):
                    rows = 2 * N if glu else N
                    w = gc.W(d, t, gc.random_weight(t, rows, K, rng))
                    for nb in CHECK_NBS:
                        for alias in ((False, True) if not glu else (False,)):
                            xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
                            ny = nb * N * 4
                            ym, yw = d.alloc(ny), d.alloc(ny)
                            if alias:
                                r0 = rng.standard_normal(nb * N).astype(np.float32)
                                d.upload(ym, r0)
                                d.upload(yw, r0)
                            else:
                                d.memset(ym, 0xFF, ny)
                                d.memset(yw, 0xFF, ny)
                            act = 1 if glu else 0
                            gc.run_mv(d, w, xq, xs, ym, N, nb, glu, act, ym if alias else 0)
                            run_wg(d, w, xq, xs, yw, N, nb, glu, act, yw if alias else 0, defs(t, swap))
                            d.sync()
                            a, b = d.download(ym, ny, np.float32), d.download(yw, ny, np.float32)
                            tally.add(f"gemm_wg == mv_q8  {gc.TYPES[t][0]} swap={swap} {N}x{K} nb={nb} "
                                      f"{'glu' if glu else 'plain'}{' res' if alias else ''}",
                                      bool(np.array_equal(a.view(np.uint32), b.view(np.uint32))), gc.diff_detail(a, b),
                                      type=gc.TYPES[t][0], swap=swap, N=N, K=K, nb=nb, glu=glu, res=alias)
                    d.free_all()
        # canary: must differ
        N, K = CHECK_SHAPES[0]
        w = gc.W(d, t, gc.random_weight(t, N, K, rng))
        xq, xs = gc.quantize_dev(d, rng.standard_normal((64, K)).astype(np.float32))
        ym, yw = d.alloc(64 * N * 4), d.alloc(64 * N * 4)
        gc.run_mv(d, w, xq, xs, ym, N, 64, False, 0, 0)
        run_wg(d, w, xq, xs, yw, N, 64, False, 0, 0, defs(t, swaps[0], canary=1))
        d.sync()
        same = np.array_equal(d.download(ym, 64 * N * 4, np.uint32), d.download(yw, 64 * N * 4, np.uint32))
        tally.add(f"canary caught {gc.TYPES[t][0]}", not same)
        d.free_all()
    print(f"{tally.ok} passed, {tally.bad} failed", flush=True)

    if not args.no_timing:
        print(f"\n{'shape':26s} {'nb':>4s} {'wg us':>8s} {'TOPS':>6s} {'gemm us':>8s} {'TOPS':>6s} {'gemm/wg':>7s}  swap exact",
              flush=True)
        for sname, t, N, K, glu in TIME_SHAPES:
            if t not in types:
                continue
            rows = 2 * N if glu else N
            raw = gc.random_weight(t, rows, K, rng)
            ws = [gc.W(d, t, raw)]
            copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
            ws += [gc.W(d, t, raw) for _ in range(copies - 1)]
            act = 1 if glu else 0
            for nb in TIME_NBS:
                xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
                ny = nb * N * 4
                ym, yg, yw = d.alloc(ny), d.alloc(ny), d.alloc(ny)
                gc.run_mv(d, ws[0], xq, xs, ym, N, nb, glu, act, 0)
                a = d.download(ym, ny, np.float32)
                gg = [gc.graph_of(d, lambda tg, w=w: gc.run_gemm(d, w, xq, xs, yg, N, nb, glu, act, 0, GEMM_CFG, target=tg))
                      for w in ws]
                g_us = gc.time_fn(d, [lambda g=g: g.launch(d.stream) for g in gg], args.reps)
                g_ok = np.array_equal(a.view(np.uint32), d.download(yg, ny, np.float32).view(np.uint32))
                for swap in swaps:
                    gw = [gc.graph_of(d, lambda tg, w=w: run_wg(d, w, xq, xs, yw, N, nb, glu, act, 0, defs(t, swap),
                                                                target=tg)) for w in ws]
                    w_us = gc.time_fn(d, [lambda g=g: g.launch(d.stream) for g in gw], args.reps)
                    w_ok = np.array_equal(a.view(np.uint32), d.download(yw, ny, np.float32).view(np.uint32))
                    ops = 2.0 * rows * K * nb
                    rec = {"kind": "time", "shape": sname, "nb": nb, "swap": swap, "wg_us": w_us, "gemm_us": g_us,
                           "wg_tops": ops / w_us * 1e-6, "gemm_tops": ops / g_us * 1e-6, "wg_exact": bool(w_ok),
                           "gemm_exact": bool(g_ok), "gemm_cfg": GEMM_CFG}
                    jsonl(rec)
                    print(f"{sname:26s} {nb:4d} {w_us:8.1f} {rec['wg_tops']:6.1f} {g_us:8.1f} {rec['gemm_tops']:6.1f} "
                          f"{g_us / w_us:6.2f}x  {swap}    {w_ok}/{g_ok}", flush=True)
                    for g in gw:
                        if g is not None:
                            g.close()
                for g in gg:
                    if g is not None:
                        g.close()
            d.free_all()
    if fh:
        fh.close()
    return 1 if tally.bad else 0


if __name__ == "__main__":
    sys.exit(main())
