#!/usr/bin/env python3
"""v7 A/B on the device: kernels/mvt.cu's MVT_SB=1 (variant 7, the super-block walk) against the
built-in layout-0 configuration and layout 1, on the 8B's Q4_K shapes, with bit checks first.

    python3 experiments/mvt/v7/ab.py [--reps 50] [--rounds 2] [--arms L0,SB,L1,L1s6] [--no-q5k]

Arms (all TN 1 / WK 8 / WM 1 / MINB 2, the H200 table's Q4_K entries at 4 and 8 rows):
  L0    layout 0 as built in (PREFETCH 2, WLOAD 0, KPERM 1): the table's config for every Q4_K shape
  SB    L0 + MVT_SB=1 (variant 7)
  L1    layout 1, UPW 1, 3 stages (the campaign's layout-1 config)
  L1s6  layout 1, UPW 1, 6 stages (a control: more bytes in flight a block, no code change)
Checks (exit 1 on any mismatch): every arm's bits == mv_q8's (the oracle, memra's chunked launch)
on glu 2x14336x4096, 6144x4096, 4096x4096, 4096x14336 at nb 3, 4, 5, 7, 8, 12 (12: grid.y 2),
plus small shapes with uneven / empty slots (200x2560, 72x768: nsb 10 and 3 < WK) plain, glu
SiLU / GELU, residual aliased to y; Q5_K (SB shares the code) on the small shapes; the canary
(MEMRA_CANARY=1 with MVT_SB=1) must differ. Timing: CUDA graph per launch, weights rotated over
copies >= 150 MB, median of --reps, arms interleaved in --rounds rounds; table + JSON lines
to $OUT/mvt-q4k-ab.jsonl.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))          # experiments/mvt
sys.path.insert(0, str(HERE.parents[1]))      # experiments
os.environ.pop("MVT_SRC", None)
os.environ.pop("MVT_DEFS", None)
import gemm_check as gc  # noqa: E402
import mvt_check as mc  # noqa: E402

BASE = {"MVT_TN": 1, "MVT_WK": 8, "MVT_WM": 1, "MVT_MINB": 2}
ARMS = {
    "L0": {**BASE, "MVT_PREFETCH": 2, "MVT_WLOAD": 0, "MVT_KPERM": 1},
    "SB": {**BASE, "MVT_PREFETCH": 2, "MVT_WLOAD": 0, "MVT_KPERM": 1, "MVT_SB": 1},
    "L1": {**BASE, "MVT_LAYOUT": 1, "MVT_UPW": 1, "MVT_STAGES": 3},
    "L1s6": {**BASE, "MVT_LAYOUT": 1, "MVT_UPW": 1, "MVT_STAGES": 6},
}
SHAPES = (   # name, N (rows of y), K, glu
    ("Q4_K glu 2x14336x4096", 14336, 4096, True),
    ("Q4_K 6144x4096", 6144, 4096, False),
    ("Q4_K 4096x4096", 4096, 4096, False),
    ("Q4_K 4096x14336", 4096, 14336, False),
)
CHECK_NBS = (3, 4, 5, 7, 8, 12)
TIME_NBS = (4, 8)
SMALL = ((200, 2560), (72, 768))
SMALL_NBS = (1, 3, 8, 12)


def smem(t: int, cfg: dict) -> int:
    """Layout 1's dynamic shared memory (memra/gpu/ops/mvt.py smem_bytes, mvt_check.v6_smem)."""
    if cfg.get("MVT_LAYOUT", 0) != 1:
        return 0
    _, blk, bb, _, bulk = gc.TYPES[t]
    meta = bb - bulk
    su = cfg["MVT_WK"] * cfg["MVT_UPW"]
    tr, bn = 16 * cfg["MVT_WM"], 8 * cfg["MVT_TN"]
    bpu, mst = bulk * 64 // blk, su * 64 // blk * meta
    stage = tr * (su * bpu + 16) + tr * ((mst + 4 + 15) // 16 * 16) + bn * (su * 64 + 16) + bn * 16 * su
    return cfg["MVT_STAGES"] * stage


def mdefs(t: int, cfg: dict) -> dict:
    d = {"MV_TYPE": t, **cfg}
    if cfg.get("MVT_LAYOUT", 0) == 1:
        d["MVT_EXPECT_SMEM"] = smem(t, cfg)
    return d


def run_arm(d, w, xq, xs, y, N, nb, glu, act, res, cfg, extra=None, target=None):
    defs = {**mdefs(w.t, cfg), **(extra or {})}
    k = d.kernel("mvt.cu", defs, "mvt_q8_glu" if glu else "mvt_q8")
    obm = 8 if glu else 16
    grid = ((N + obm * cfg["MVT_WM"] - 1) // (obm * cfg["MVT_WM"]), (nb + 8 * cfg["MVT_TN"] - 1) // (8 * cfg["MVT_TN"]), 1)
    block = (32 * cfg["MVT_WM"] * cfg["MVT_WK"], 1, 1)
    d.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, res or 0, np.int32(N), np.int32(w.K), np.int32(nb),
                              np.int32(act)), shmem=smem(w.t, cfg), target=target)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default="L0,SB,L1,L1s6")
    ap.add_argument("--no-q5k", action="store_true")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    arms = {a: ARMS[a] for a in args.arms.split(",")}
    t_start = time.perf_counter()

    # modules: q8, mv_q8's chunks for every (type, K, nb, glu) checked, the arms, the canary
    jobs = [("q8.cu", {"Q8_WARPS": gc.Q8_WARPS})]
    types = [12] + ([] if args.no_q5k else [13])
    for t in types:
        for glu in (False, True):
            for K in {K for _, _, K, _ in SHAPES} | {K for _, K in SMALL}:
                for nb in set(CHECK_NBS) | set(SMALL_NBS) | set(TIME_NBS):
                    for _, _, dd in gc.mv_chunks(t, K, nb, glu):
                        jobs.append(("matvec.cu", dd))
        for name, cfg in arms.items():
            if t == 12 or name == "SB":
                jobs.append(("mvt.cu", mdefs(t, cfg)))
    jobs.append(("mvt.cu", {**mdefs(12, ARMS["SB"]), "MEMRA_CANARY": 1}))
    cubins, logs = mc.compile_all(jobs, args.jobs, verbose_mvt=True)
    for (src, defs), _ in sorted(cubins.items()):
        if src == "mvt.cu":
            s = mc.ptxas_summary(logs.get((src, defs), ""))
            print(f"  mvt {' '.join(f'{k}={v}' for k, v in defs)}: "
                  + ", ".join(f"{k} {r} regs spill {st}" for k, (r, st, _) in sorted(s.items())), flush=True)
    if args.compile_only:
        return 0

    jsonl = gc.jsonl_writer("mvt-q4k-ab.jsonl")

    d = gc.Dev(cubins)
    props = d.dev.properties
    jsonl({"kind": "run", "device": d.dev.name, "sms": props.multiprocessor_count, "arms": arms,
           "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    print(f"device {d.dev.name}, {props.multiprocessor_count} SMs", flush=True)
    ok_n = bad_n = 0
    rng = np.random.default_rng(20261202)

    def check(tag, w, N, K, nb, glu, act, alias, arm_names, ref_cache=None):
        nonlocal ok_n, bad_n
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xq, xs = gc.quantize_dev(d, x)
        ny = nb * N * 4
        resd = d.alloc(ny)
        d.upload(resd, rng.standard_normal((nb, N)).astype(np.float32))
        ym, yt = d.alloc(ny), d.alloc(ny)

        def prep(y):
            gc.prep_out(d, y, resd, ny, alias)
        prep(ym)
        gc.run_mv(d, w, xq, xs, ym, N, nb, glu, act, ym if alias else 0)
        a = d.download(ym, ny, np.float32)
        for an in arm_names:
            prep(yt)
            run_arm(d, w, xq, xs, yt, N, nb, glu, act, yt if alias else 0, arms[an])
            b = d.download(yt, ny, np.float32)
            ok = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
            ok_n += ok
            bad_n += not ok
            name = f"{an:5s} == mv_q8  {tag} nb={nb}{' glu act=' + str(act) if glu else ''}{' +res(alias y)' if alias else ''}"
            if not ok:
                print(f"FAIL  {name}  {gc.diff_detail(a, b)}", flush=True)
            jsonl({"kind": "check", "name": name, "ok": ok, "arm": an, "N": N, "K": K, "nb": nb, "glu": glu,
                   "act": act, "alias_res": alias, "detail": gc.diff_detail(a, b)})

    # small shapes: uneven / empty slots, every epilogue flavour; Q4_K all arms, Q5_K the SB arm
    for t in types:
        for (N, K) in SMALL:
            for glu in (False, True):
                w = gc.W(d, t, gc.random_weight(t, 2 * N if glu else N, K, rng))
                for nb in SMALL_NBS:
                    for act, alias in (((1, False), (2, False), (1, True)) if glu else ((0, False), (0, True))):
                        check(f"{gc.TYPES[t][0]} {N}x{K}", w, N, K, nb, glu, act, alias,
                              [a for a in arms if t == 12 or a == "SB"])
                d.free_all()
    # canary
    N, K = SMALL[0]
    w = gc.W(d, 12, gc.random_weight(12, N, K, rng))
    xq, xs = gc.quantize_dev(d, rng.standard_normal((8, K)).astype(np.float32))
    ym, yt = d.alloc(8 * N * 4), d.alloc(8 * N * 4)
    gc.run_mv(d, w, xq, xs, ym, N, 8, False, 0, 0)
    run_arm(d, w, xq, xs, yt, N, 8, False, 0, 0, ARMS["SB"], extra={"MEMRA_CANARY": 1})
    caught = not np.array_equal(d.download(ym, 8 * N * 4, np.uint32), d.download(yt, 8 * N * 4, np.uint32))
    print(f"{'PASS' if caught else 'FAIL'}  canary (MVT_SB=1, MEMRA_CANARY=1 drops unit 1) differs from mv_q8", flush=True)
    ok_n += caught
    bad_n += not caught
    jsonl({"kind": "check", "name": "canary SB", "ok": bool(caught)})
    d.free_all()
    print(f"small-shape checks: {ok_n} passed, {bad_n} failed ({time.perf_counter() - t_start:.0f} s)", flush=True)

    # the 8B shapes: checks at CHECK_NBS, then timing at TIME_NBS, arms interleaved
    results = []
    for sname, N, K, glu in SHAPES:
        rows = 2 * N if glu else N
        raw = gc.random_weight(12, rows, K, rng)
        ws = [gc.W(d, 12, raw)]
        copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
        ws += [gc.W(d, 12, raw) for _ in range(copies - 1)]
        del raw
        act = 1 if glu else 0
        for nb in CHECK_NBS:
            check(sname, ws[0], N, K, nb, glu, act, False, list(arms))
        wb = ws[0].nbytes
        for nb in TIME_NBS:
            xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
            yt = d.alloc(nb * N * 4)
            us = {a: [] for a in arms}
            for r in range(args.rounds):
                for an in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                    cfg = arms[an]
                    us[an].append(mc.timed(d, ws, lambda w, tg, cfg=cfg: run_arm(d, w, xq, xs, yt, N, nb, glu, act, 0,
                                                                                 cfg, target=tg), args.reps))
            for an in arms:
                m = float(np.min(us[an]))
                rec = {"kind": "time", "shape": sname, "rows": rows, "K": K, "nb": nb, "arm": an, "cfg": arms[an],
                       "us": m, "us_rounds": us[an], "gbs": wb / m * 1e-3, "weight_bytes": wb, "copies": copies,
                       "reps": args.reps}
                jsonl(rec)
                results.append(rec)
            print(f"{sname:24s} nb={nb}: " + "  ".join(f"{an} {min(us[an]):6.1f}" for an in arms), flush=True)
        d.free_all()
        print(f"  ({time.perf_counter() - t_start:.0f} s)", flush=True)

    print(f"\n{'shape':24s} {'nb':>3s} " + " ".join(f"{a + ' us':>9s} {'TB/s':>5s}" for a in arms) + "   SB/L0")
    for sname, N, K, glu in SHAPES:
        for nb in TIME_NBS:
            rs = {r["arm"]: r for r in results if r["shape"] == sname and r["nb"] == nb}
            if not rs:
                continue
            line = f"{sname:24s} {nb:3d} " + " ".join(f"{rs[a]['us']:9.1f} {rs[a]['gbs'] / 1e3:5.2f}" for a in arms)
            if "SB" in rs and "L0" in rs:
                line += f"   {rs['L0']['us'] / rs['SB']['us']:.2f}x"
            print(line, flush=True)
    print(f"\nchecks: {ok_n} passed, {bad_n} failed; total {time.perf_counter() - t_start:.0f} s", flush=True)
    jsonl({"kind": "summary", "passed": ok_n, "failed": bad_n, "seconds": time.perf_counter() - t_start})
    return 1 if bad_n else 0


if __name__ == "__main__":
    sys.exit(main())
