#!/usr/bin/env python3
"""mvt_check: kernels/mvt.cu (mvt_q8, mvt_q8_glu) must give mv_q8's bits, and how fast.

Modelled on experiments/gemm_check.py and built on it: the planes layout, random weights, the
matvec launch rule (memra's chunks of <= 8 rows, bucket MV_B, default config per chunk), the
device wrapper, q8 quantization on the device and the timing helpers are imported from there
(gemm_check imports no memra module: numpy and cuda.core / cuda.bindings only).

    python3 experiments/mvt/mvt_check.py                 # device: compile, checks, timing
    python3 experiments/mvt/mvt_check.py --compile-only  # CPU: every module through NVRTC
                                                         #      (+ ptxas -v registers / spills of mvt)
    python3 experiments/mvt/mvt_check.py --selftest      # CPU: numpy model of mvt.cu's index maps
    MVT_SRC=<file> [MVT_DEFS=K=V,..] [MVT_CHECK_CFGS=..] python3 ...   # a variant of mvt.cu instead
    options: --types Q4_K,Q6_K  --no-timing  --no-checks  --reps 25  --jobs N
             --configs 'TN,WK,WM,PREFETCH[,WLOAD[,MINB[,KPERM[,XPF]]]];...' (timed mvt configs; TN 0 = by nb)
             --shapes Q4_K,Q6_K  --nbs 2,4,8,16  --no-gemm

Device run (H200): compiles every module first (in parallel; a compile error prints the NVRTC
log and exits 2). Checks, for every type: random valid weights in planes, activations quantized
on the device by q8.cu, y poisoned with 0xFF bytes (or holding the residual when res aliases
y), mv_q8 launched in chunks of <= 8 rows exactly as memra's matvec launcher does, then mvt once
per check config (TN 2 / WK 8 / prefetch 2 with no_allocate weights, TN 1 / WK 16 / prefetch 3 / KPERM 1,
TN 2 / WK 1 / 4 tiles per block / no prefetch); the uint32 views of y must be equal. nb = 1..16
on 200 x 2560 (nu = 40: uneven slots), nb 1, 7, 16 on 72 x 768 (nu = 12: empty slots); plain,
_glu act 1 and 2, residual aliased to y. A canary (MEMRA_CANARY=1 drops unit 1) must differ.
One line per case, then "N passed, M failed". Timing on the llama3-8b shapes at nb 2, 4, 8, 16
(CUDA graphs over weight copies >= 150 MB, events, median of --reps): mvt for each timed config
(each with its own bit check against mv_q8), mv_q8 chunked as the engine runs it, and gemm.cu's
small-batch config 1,1,2,2,8,3,1,2; us, weight GB/s, % of the 4.3 TB/s floor, ratios. With $OUT
set, JSON lines go to $OUT/mvt-check.jsonl. Exit 1 on any bit mismatch (or a canary not caught).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import gemm_check as gc  # noqa: E402  (experiments/gemm_check.py)

KDIR = gc.KDIR
ARCH = gc.ARCH
TYPES = gc.TYPES
NAME2T = gc.NAME2T
FLOOR_GBS = 4300.0        # a streaming kernel's bandwidth on the H200 (DESIGN.md: ~4.3-4.5 TB/s)

MVT_KEYS = ("MVT_TN", "MVT_WK", "MVT_WM", "MVT_PREFETCH", "MVT_WLOAD", "MVT_MINB", "MVT_KPERM", "MVT_XPF")
MVT_BUILTIN = {"MVT_TN": 2, "MVT_WK": 8, "MVT_WM": 1, "MVT_PREFETCH": 2, "MVT_WLOAD": 0, "MVT_MINB": 2, "MVT_KPERM": 0}
CHECK_CFGS = (
    MVT_BUILTIN,
    {"MVT_TN": 1, "MVT_WK": 16, "MVT_WM": 1, "MVT_PREFETCH": 3, "MVT_WLOAD": 1, "MVT_MINB": 1, "MVT_KPERM": 1},
    {"MVT_TN": 2, "MVT_WK": 1, "MVT_WM": 4, "MVT_PREFETCH": 0, "MVT_WLOAD": 0, "MVT_MINB": 1, "MVT_KPERM": 0},
)
CHECK_SHAPES = ((200, 2560), (72, 768))
CHECK_NBS_A = tuple(range(1, 17))
CHECK_NBS_B = (1, 7, 16)
# timed mvt configs: TN 0 = 1 for nb <= 8, else 2
# (MINB keeps <= 128 registers: 512-thread blocks want MINB 1, 128-thread ones MINB 4; at MINB 2 a
# 512-thread block gets 64 registers and spills)
TIME_CFGS = ("0,8,1,2", "0,16,1,2,0,1", "0,4,1,2,0,4", "0,4,2,2", "0,8,1,1", "0,8,1,3", "0,8,1,2,1",
             "0,8,1,2,0,2,1", "0,8,1,2,1,2,1", "1,8,1,1,0,3")   # the last: 24 warps/SM, 80 registers
TIME_NBS = (2, 4, 8, 16)
GEMM_SMALL = {"GM_WM": 1, "GM_WN": 1, "GM_TM": 2, "GM_TN": 2, "GM_WK": 8, "GM_STAGES": 3, "GM_LREG": 1,
              "GM_MINB": 2}


# ---------------------------------------------------------------------------------------
# configs, launch contract

def parse_cfg(text: str) -> dict:
    v = [int(x) for x in text.split(",")]
    if not 4 <= len(v) <= 8:
        raise SystemExit(f"--configs: need TN,WK,WM,PREFETCH[,WLOAD[,MINB[,KPERM[,XPF]]]], got {text!r}")
    d = dict(MVT_BUILTIN)
    d.update(zip(MVT_KEYS, v))
    if len(v) < 8:
        d.pop("MVT_XPF", None)   # only variants with the tunable (experiments/mvt/v5) take it
    return d


# MVT_CHECK_CFGS='TN,WK,WM,PREFETCH[,...];...': the bit-check configurations instead of CHECK_CFGS
# (a variant whose tunables differ, e.g. experiments/mvt/v6 has no WK 1)
if os.environ.get("MVT_CHECK_CFGS"):
    CHECK_CFGS = tuple(parse_cfg(c) for c in os.environ["MVT_CHECK_CFGS"].split(";") if c.strip())


def cfg_for(cfg: dict, nb: int) -> dict:
    """TN 0 means: 1 n tile when nb <= 8, else 2."""
    if cfg["MVT_TN"] == 0:
        return {**cfg, "MVT_TN": 1 if nb <= 8 else 2}
    return cfg


def cfg_name(cfg: dict) -> str:
    return ",".join(str(cfg[k]) for k in MVT_KEYS if k in cfg)


def mvt_launch(cfg: dict, N: int, nb: int, glu: bool):
    """(grid, block) of an mvt_q8[_glu] launch (mvt.cu's contract); no dynamic shared memory."""
    obm = 8 if glu else 16
    rpb = obm * cfg["MVT_WM"]
    return ((N + rpb - 1) // rpb, (nb + 8 * cfg["MVT_TN"] - 1) // (8 * cfg["MVT_TN"]), 1), \
        (32 * cfg["MVT_WM"] * cfg["MVT_WK"], 1, 1)


def mvt_defs() -> dict:
    """MVT_DEFS="K=V,K=V": defines added to every mvt.cu module (a variant's own tunables)."""
    return dict(kv.split("=", 1) for kv in os.environ.get("MVT_DEFS", "").split(",") if kv.strip())


def v6_smem(t: int, cfg: dict) -> int:
    """Dynamic shared memory of kernels/mvt.cu layout 1 (variant 6; first experiments/mvt/v6/mvt.cu, in git history); 0 unless MVT_SMEM=v6.
    Its own tunables MVT_UPW (1) and MVT_STAGES (3) come from MVT_DEFS."""
    if os.environ.get("MVT_SMEM") != "v6":
        return 0
    extra = mvt_defs()
    _, blk, bb, _, bulk = TYPES[t]
    meta = bb - bulk
    su = cfg["MVT_WK"] * int(extra.get("MVT_UPW", 1))
    tr, bn = 16 * cfg["MVT_WM"], 8 * cfg["MVT_TN"]
    bpu, mst = bulk * 64 // blk, su * 64 // blk * meta
    stage = tr * (su * bpu + 16) + tr * ((mst + 4 + 15) // 16 * 16) + bn * (su * 64 + 16) + bn * 16 * su
    return int(extra.get("MVT_STAGES", 3)) * stage


def run_mvt(d, w, xq, xs, y, N, nb, glu, act, res, cfg, extra=None, target=None):
    defs = {"MV_TYPE": w.t, **cfg, **(extra or {})}
    k = d.kernel("mvt.cu", defs, "mvt_q8_glu" if glu else "mvt_q8")
    grid, block = mvt_launch(cfg, N, nb, glu)
    d.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, res or 0, np.int32(N), np.int32(w.K),
                              np.int32(nb), np.int32(act)), shmem=v6_smem(w.t, cfg), target=target)


# ---------------------------------------------------------------------------------------
# modules

def _compile_job(job):
    """(key, cubin | None, error | None, seconds, ptxas log); runs in a worker process."""
    src, defines, verbose = job
    from cuda.core import Program, ProgramOptions

    # MVT_SRC=<file>: a variant of mvt.cu to check and time instead (its headers from kernels/)
    path = Path(os.environ["MVT_SRC"]) if src == "mvt.cu" and os.environ.get("MVT_SRC") else KDIR / src
    code = path.read_text()
    kw = {"ptxas_options": ["-v"]} if verbose else {}
    # device_as_default_execution_space: NVRTC 13.0 (the H200 image's) treated the experiment's
    # generic lambdas as host functions without it (kernels/mvt.cu has none; kept harmless)
    extra = mvt_defs() if src == "mvt.cu" else {}
    opts = ProgramOptions(name=src, arch=ARCH, std="c++17", lineinfo=True, include_path=[str(KDIR)],
                          device_as_default_execution_space=True,
                          define_macro=[(k, str(v)) for k, v in sorted({**defines, **extra}.items())], **kw)
    t0 = time.perf_counter()
    log = io.StringIO()
    try:
        obj = Program(code, "c++", opts).compile("cubin", logs=log)
    except Exception as e:   # NVRTCError carries the compilation log
        return gc.module_key(src, defines), None, f"{type(e).__name__}: {e}", 0.0, log.getvalue()
    return gc.module_key(src, defines), bytes(obj.code), None, time.perf_counter() - t0, log.getvalue()


def ptxas_summary(log: str) -> dict:
    """{kernel: (registers, spill stores, spill loads)} from a ptxas -v log."""
    out, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            out.setdefault(cur, [0, 0, 0])[1:] = [int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out.setdefault(cur, [0, 0, 0])[0] = int(m.group(1))
    return {k: tuple(v) for k, v in out.items()}


def compile_all(jobs: list, workers: int, verbose_mvt: bool = False):
    uniq = list({gc.module_key(s, d): (s, d) for s, d in jobs}.values())
    uniq.sort(key=lambda j: j[0] not in ("gemm.cu", "mvt.cu"))
    t0 = time.perf_counter()
    out, logs = {}, {}

    def take(res):
        key, cubin, err, _, log = res
        if err is not None:
            src, defs = key
            print(f"COMPILE ERROR {src} {' '.join(f'-D{k}={v}' for k, v in defs)}\n{err}", flush=True)
            return False
        out[key] = cubin
        if log:
            logs[key] = log
        return True

    work = [(s, d, verbose_mvt and s == "mvt.cu") for s, d in uniq]
    if workers <= 1:
        for j in work:
            if not take(_compile_job(j)):
                sys.exit(2)
    else:
        import multiprocessing as mp
        from concurrent.futures import as_completed

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as ex:
            futs = [ex.submit(_compile_job, j) for j in work]
            for f in as_completed(futs):
                if not take(f.result()):
                    ex.shutdown(wait=False, cancel_futures=True)
                    sys.exit(2)
    print(f"compiled {len(uniq)} modules in {time.perf_counter() - t0:.1f} s ({workers} workers)", flush=True)
    return out, logs


def plan_modules(types, timing: bool, checks: bool, tcfgs, gemm: bool) -> list:
    jobs = [("q8.cu", {"Q8_WARPS": gc.Q8_WARPS})]
    for t in (types if checks else ()):
        for (N, K) in CHECK_SHAPES:
            for nb in (CHECK_NBS_A if (N, K) == CHECK_SHAPES[0] else CHECK_NBS_B):
                for glu in (False, True):
                    for _, _, d in gc.mv_chunks(t, K, nb, glu):
                        jobs.append(("matvec.cu", d))
        for cfg in CHECK_CFGS:
            jobs.append(("mvt.cu", {"MV_TYPE": t, **cfg}))
    if 12 in types and checks:
        jobs.append(("mvt.cu", {"MV_TYPE": 12, **MVT_BUILTIN, "MEMRA_CANARY": 1}))
    if timing:
        for _, t, N, K, glu in gc.TIME_SHAPES:
            if t not in types:
                continue
            for nb in TIME_NBS:
                for _, _, d in gc.mv_chunks(t, K, nb, glu):
                    jobs.append(("matvec.cu", d))
                for c in tcfgs:
                    jobs.append(("mvt.cu", {"MV_TYPE": t, **cfg_for(c, nb)}))
            if gemm:
                jobs.append(("gemm.cu", {"MV_TYPE": t, **GEMM_SMALL}))
    return jobs


# ---------------------------------------------------------------------------------------
# device checks

class Tally(gc.Tally):
    """gemm_check's tally; prints failures always, passes only with --verbose (the JSON lines
    hold every case)."""
    verbose = False

    def add(self, name: str, ok: bool, detail: str = "", **rec):
        if ok:
            self.ok += 1
        else:
            self.bad += 1
        if self.verbose or not ok:
            print(f"{'PASS' if ok else 'FAIL'}  {name}{'  ' + detail if detail else ''}", flush=True)
        self.jsonl({"kind": "check", "name": name, "ok": bool(ok), "detail": detail, **rec})


def check_case(d, tally, t, N, K, nb, rng):
    name = TYPES[t][0]
    for glu, act in ((False, 0), (True, 1), (True, 2)):
        w = gc.W(d, t, gc.random_weight(t, 2 * N if glu else N, K, rng))
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xq, xs = gc.quantize_dev(d, x)
        res = rng.standard_normal((nb, N)).astype(np.float32)
        resd = d.alloc(res.nbytes)
        d.upload(resd, res)
        ny = nb * N * 4
        ym, yt = d.alloc(ny), d.alloc(ny)
        variants = [("", False)] + ([("+res(alias y)", True)] if act != 2 else [])
        for vname, alias in variants:
            def prep(y):
                gc.prep_out(d, y, resd, ny, alias)
            prep(ym)
            gc.run_mv(d, w, xq, xs, ym, N, nb, glu, act, ym if alias else 0)
            a = d.download(ym, ny, np.float32)
            tag = f"{name} {'glu act=' + str(act) if glu else 'plain'}{vname} {N}x{K} nb={nb}"
            for cfg in CHECK_CFGS:
                prep(yt)
                run_mvt(d, w, xq, xs, yt, N, nb, glu, act, yt if alias else 0, cfg)
                b = d.download(yt, ny, np.float32)
                ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                tally.add(f"mvt == mv_q8  {tag}  cfg {cfg_name(cfg)}", ok, gc.diff_detail(a, b),
                          type=name, N=N, K=K, nb=nb, glu=glu, act=act, alias_res=alias, cfg=cfg)
        d.free_all()


def canary_case(d, tally, rng):
    t, (N, K), nb = 12, CHECK_SHAPES[0], 16
    w = gc.W(d, t, gc.random_weight(t, N, K, rng))
    xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
    ym, yt = d.alloc(nb * N * 4), d.alloc(nb * N * 4)
    d.memset(ym, 0xFF, nb * N * 4)
    d.memset(yt, 0xFF, nb * N * 4)
    gc.run_mv(d, w, xq, xs, ym, N, nb, False, 0, 0)
    run_mvt(d, w, xq, xs, yt, N, nb, False, 0, 0, MVT_BUILTIN, extra={"MEMRA_CANARY": 1})
    a, b = d.download(ym, nb * N * 4, np.float32), d.download(yt, nb * N * 4, np.float32)
    caught = not np.array_equal(a.view(np.uint32), b.view(np.uint32))
    tally.add(f"canary: mvt MEMRA_CANARY=1 (drops unit 1) differs from mv_q8  Q4_K {N}x{K} nb={nb}",
              caught, gc.diff_detail(a, b), canary=True)
    d.free_all()


# ---------------------------------------------------------------------------------------
# timing

def timed(d, ws, launch, reps):
    """Median us of one launch set per weight copy (CUDA graphs, rotated), eager if no graphs."""
    gs = [gc.graph_of(d, lambda tg, w=w: launch(w, tg)) for w in ws]
    fs = ([lambda w=w: launch(w, None) for w in ws] if any(g is None for g in gs)
          else [lambda g=g: g.launch(d.stream) for g in gs])
    us = gc.time_fn(d, fs, reps)
    for g in gs:
        if g is not None:
            g.close()
    return us


def timing(d, tally, types, reps, rng, jsonl, tcfgs, gemm: bool):
    print(f"\ntiming (CUDA graph per launch set, median of {reps}; weights rotated over copies >= 150 MB)",
          flush=True)
    print(f"{'shape':26s} {'nb':>3s} {'mvt us':>8s} {'GB/s':>6s} {'%flr':>5s} {'mv_q8 us':>9s} {'gemm us':>8s} "
          f"{'mv/mvt':>7s} {'gm/mvt':>7s}  TN,WK,WM,PF,WLOAD,MINB,KPERM", flush=True)
    best_rows = []
    for sname, t, N, K, glu in gc.TIME_SHAPES:
        if t not in types:
            continue
        rows = 2 * N if glu else N
        raw = gc.random_weight(t, rows, K, rng)
        ws = [gc.W(d, t, raw)]
        copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
        ws += [gc.W(d, t, raw) for _ in range(copies - 1)]
        del raw
        wb = ws[0].nbytes
        floor_us = wb / (FLOOR_GBS * 1e3)
        act = 1 if glu else 0
        for nb in TIME_NBS:
            xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
            ny = nb * N * 4
            ym, yt, yg = d.alloc(ny), d.alloc(ny), d.alloc(ny)
            d.memset(ym, 0xFF, ny)
            mv_us = timed(d, ws, lambda w, tg: gc.run_mv(d, w, xq, xs, ym, N, nb, glu, act, 0, target=tg), reps)
            a = d.download(ym, ny, np.float32)
            gm_us, gm_exact = float("nan"), None
            if gemm:
                d.memset(yg, 0xFF, ny)
                gm_us = timed(d, ws, lambda w, tg: gc.run_gemm(d, w, xq, xs, yg, N, nb, glu, act, 0, GEMM_SMALL,
                                                               target=tg), reps)
                gm_exact = bool(np.array_equal(a.view(np.uint32), d.download(yg, ny, np.float32).view(np.uint32)))
            best = None
            for c in tcfgs:
                cfg = cfg_for(c, nb)
                d.memset(yt, 0xFF, ny)
                us = timed(d, ws, lambda w, tg: run_mvt(d, w, xq, xs, yt, N, nb, glu, act, 0, cfg, target=tg), reps)
                b = d.download(yt, ny, np.float32)
                ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                tally.add(f"mvt == mv_q8  timing {sname} nb={nb} cfg {cfg_name(cfg)}", ok, gc.diff_detail(a, b),
                          type=TYPES[t][0], N=N, K=K, nb=nb, glu=glu, act=act, cfg=cfg)
                rec = {"kind": "time", "shape": sname, "type": TYPES[t][0], "rows": rows, "K": K, "nb": nb,
                       "mvt_us": us, "mv_us": mv_us, "gemm_us": gm_us if gemm else None, "weight_bytes": wb, "copies": copies,
                       "mvt_gbs": wb / us * 1e-3, "mv_gbs": wb / mv_us * 1e-3,
                       "gemm_gbs": wb / gm_us * 1e-3 if gemm else None,
                       "floor_us": floor_us, "pct_floor": 100 * floor_us / us, "mv_over_mvt": mv_us / us,
                       "gemm_over_mvt": gm_us / us if gemm else None, "cfg": cfg, "exact": bool(ok), "gemm_exact": gm_exact}
                jsonl(rec)
                print(f"{sname:26s} {nb:3d} {us:8.1f} {rec['mvt_gbs']:6.0f} {rec['pct_floor']:5.1f} {mv_us:9.1f} "
                      f"{gm_us:8.1f} {rec['mv_over_mvt']:6.2f}x {gm_us / us:6.2f}x  {cfg_name(cfg)}"
                      f"{'' if ok else '  BITS DIFFER'}", flush=True)
                if ok and (best is None or us < best["mvt_us"]):
                    best = rec
            if gm_exact is False:
                print(f"  note: gemm small config differs from mv_q8 at {sname} nb={nb} (gemm_check's business)")
            if best:
                best_rows.append(best)
        d.free_all()
    if best_rows:
        print(f"\nbest exact mvt config per shape and nb\n{'shape':26s} {'nb':>3s} {'mvt us':>8s} {'GB/s':>6s} "
              f"{'%flr':>5s} {'mv/mvt':>7s} {'gm/mvt':>7s}  config", flush=True)
        for r in best_rows:
            print(f"{r['shape']:26s} {r['nb']:3d} {r['mvt_us']:8.1f} {r['mvt_gbs']:6.0f} {r['pct_floor']:5.1f} "
                  f"{r['mv_over_mvt']:6.2f}x {r['gemm_over_mvt'] or float('nan'):6.2f}x  {cfg_name(r['cfg'])}", flush=True)
            jsonl({**r, "kind": "best"})


# ---------------------------------------------------------------------------------------
# CPU selftest: numpy model of mvt.cu's index maps (which words a lane loads from global for
# A and B, afrag / mma fragments through gemm_check's models, the scales a lane reads, the C
# layout and epilogue rows, and the slot walk with its prefetch ring) against the GGUF integer
# sums and mv_q8's float order.

NCH = {t: gc.GT[t][0] for t in TYPES}


def tile_weight_row(r: int, ob: int, N: int, glu: bool) -> int:
    """mvt.cu: the weight row behind tile row r (0..15) of the tile at output ob."""
    if glu:
        o = min(ob + (r & 7), N - 1)
        return o + N if r >= 8 else o
    return min(ob + r, N - 1)


KPERM_TYPES = (12, 13, 8)


def tile_sums(t: int, a, xb, u: int, col0: int, nb: int, row_of, qv, xq) -> int:
    """The mma of a unit's A fragments `a` and the B words `xb` of the n8 tile at column col0
    (gemm_check's models), every element against its integer sum from GGUF semantics;
    row_of(tile row) -> weight row. Returns the sums checked."""
    nk = gc.GT[t][6]
    k16 = nk == 4
    lanes = np.arange(32)
    gid, tig = lanes >> 2, lanes & 3
    checked = 0
    for k in range(nk):
        breg = [xb[k]] if k16 else [xb[2 * k], xb[2 * k + 1]]
        dv = gc.model_mma(a[k], breg, k16)
        for e in range(4):
            tr = gid + 8 * (e >> 1)            # C row (tile row)
            col = col0 + 2 * tig + (e & 1)
            for L in range(32):
                if col[L] >= nb:
                    continue
                w_row = row_of(int(tr[L]))
                el = gc.goff(t, u, k) + np.arange(16) if k16 else 64 * u + 32 * k + np.arange(32)
                ref = int((qv[w_row, el].astype(np.int64) * xq[col[L], el]).sum())
                if int(dv[e][L]) != ref:
                    raise AssertionError(f"{TYPES[t][0]} u={u} row={w_row} col={col[L]} k={k}: "
                                         f"model {int(dv[e][L])} != ref {ref}")
                checked += 1
    return checked


def selftest_type(t: int, rng, glu: bool, TN: int = 2, kperm: bool = False) -> int:
    """Every (row, column, unit, k-chunk) integer sum of mvt.cu's tiles, modelled from the lane
    addresses the kernel computes, against sums from GGUF semantics. Returns sums checked."""
    K = 768
    N = 21 if glu else 37             # partial tiles: rows clamp
    nb = 8 * TN - 3                   # columns clamp
    rows_w = 2 * N if glu else N
    bulk, meta, qv, xq, xs = gc.model_inputs(t, rows_w, K, nb, rng)
    bl, ml = bulk.ravel(), meta.ravel()
    xqb = xq.view(np.uint8).ravel()
    xsw = xs.view(np.uint32).ravel()          # d, s as words
    nblk = K // TYPES[t][1]
    brs, mrs = nblk * TYPES[t][4], nblk * (TYPES[t][2] - TYPES[t][4])
    nch, nk = NCH[t], gc.GT[t][6]
    k16 = nk == 4
    lanes = np.arange(32)
    gid, tig = lanes >> 2, lanes & 3
    obm = 8 if glu else 16
    nu = K // 64
    checked = 0

    def word(buf, off):
        assert np.all(off % 4 == 0) and np.all(off + 4 <= buf.size), "unaligned or out-of-bounds word load"
        return gc._pack(np.stack([buf[off + i] for i in range(4)], -1))

    for ob in range(0, N, obm):
        # the lane's weight rows: mvt.cu's wr[0], wr[1]
        wr = np.array([[tile_weight_row(g, ob, N, glu), tile_weight_row(g + 8, ob, N, glu)] for g in gid])
        for u in range(nu):
            # fetch(): q[c][rh] = word at bulk row wr[rh] + chunk(u, c) + 4 tig
            # (MVT_KPERM: word at chunk(u, c & ~1) + 8 tig + 4 (c & 1), the pair as one 8-byte load)
            if kperm:
                assert all(gc.chunk(t, u, c) % 8 == 0 for c in range(0, nch, 2))
                q = [[word(bl, wr[:, rh] * brs + gc.chunk(t, u, c & ~1) + 8 * tig + 4 * (c & 1)) for rh in range(2)]
                     for c in range(nch)]
            else:
                q = [[word(bl, wr[:, rh] * brs + gc.chunk(t, u, c) + 4 * tig) for rh in range(2)] for c in range(nch)]
            # load_meta<GLd>(w[rh], meta row + moff(u)): the model reads the same bytes
            mw = [np.stack([ml[r * mrs + gc.moff(t, u):r * mrs + gc.moff(t, u) + gc.META_NEED[t]] for r in wr[:, rh]])
                  for rh in range(2)]
            for r in wr.ravel():
                assert r * mrs + gc.moff(t, u) + gc.META_NEED[t] <= ml.size, "meta read past the plane"
            a = gc.model_afrag(t, q, mw, u, tig)
            for cb in range(0, nb, 8 * TN):
                for ni in range(TN):
                    if ni == 1 and not cb + 8 < nb:
                        continue                               # the kernel skips a dead n tile
                    colB = np.minimum(cb + 8 * ni + gid, nb - 1)
                    # xb[g] = word at xq row colB + goff(u, g) + 4 tig
                    # (MVT_KPERM: word at goff(u, g & ~1) + 8 tig + 4 (g & 1))
                    if kperm:
                        xb = [word(xqb, colB * K + gc.goff(t, u, g & ~1) + 8 * tig + 4 * (g & 1)) for g in range(4)]
                    else:
                        xb = [word(xqb, colB * K + gc.goff(t, u, g) + 4 * tig) for g in range(4)]
                    checked += tile_sums(t, a, xb, u, cb + 8 * ni, nb,
                                         lambda r: tile_weight_row(r, ob, N, glu), qv, xq)
                    # scales: columns 2 tig + cc, blocks sb, sb + 1 (+2, +3 for Q6_K), as uint4 loads
                    sb = gc.goff(t, u, 0) // 32
                    for cc in range(2):
                        colS = np.minimum(cb + 8 * ni + 2 * tig + cc, nb - 1)
                        base = (colS * (K // 32) + sb) * 2           # in words
                        assert np.all(base % 4 == 0), "scale uint4 load not 16-byte aligned"
                        for g in range(4):
                            e = g if k16 else g >> 1
                            got_d = xsw[base + 2 * e].view(np.float32)
                            got_s = xsw[base + 2 * e + 1].view(np.int32)
                            want = xs[colS, gc.goff(t, u, g) // 32]
                            assert np.array_equal(got_d, want["d"]) and np.array_equal(got_s, want["s"]), \
                                f"{TYPES[t][0]} u={u} g={g}: scale block mismatch"
    return checked


def mv_order(c: np.ndarray) -> np.float32:
    """mv_q8 (MV_KSPLIT 1): lane l folds units l, l+32, ... in order, then warp_sum's butterfly."""
    nu = c.size
    P = np.zeros(32, np.float32)
    for lane in range(32):
        for u in range(lane, nu, 32):
            P[lane] = np.float32(P[lane] + c[u])
    v = P.copy()
    for o in (16, 8, 4, 2, 1):
        v = (v + v[np.arange(32) ^ o]).astype(np.float32)
    return v[0]


def brev(j: int, lv: int) -> int:
    return int(f"{j:0{lv}b}"[::-1], 2) if lv else 0


def mvt_order(c: np.ndarray, wk: int, pf: int, canary: bool = False) -> np.float32:
    """mvt.cu's K loop, statement for statement: the consumer walk with leading empty slots
    merged as zeros, the producer pf units ahead filling a ring of pf + 1 (the consumed unit
    must be the one fetched pf steps earlier), the binary-counter merge, then the WK roots
    meeting at offsets wk/2 .. 1. c[u]: the unit's contribution (float32, added with one
    rounding as accum_r's final __fadd_rn does)."""
    nu = c.size
    lv = 5 - (wk.bit_length() - 1)
    nleaf = 1 << lv
    slot = lambda k, j: k + wk * brev(j, lv)
    roots = []
    for k in range(wk):
        P = np.float32(0)
        L = [np.float32(0)] * max(lv, 1)

        def merge(j):
            nonlocal P
            tz = (~j & (j + 1)).bit_length() - 1        # trailing ones of j
            v = P
            for lvl in range(min(tz, lv)):
                v = np.float32(L[lvl] + v)
            if tz >= lv:
                P = v
            else:
                L[tz] = v
                P = np.float32(0)
        cj, cu = 0, k
        while cu >= nu and cj < nleaf:
            merge(cj)
            cj += 1
            cu = slot(k, cj) if cj < nleaf else 0
        pj, pu = cj, cu

        def padv():
            nonlocal pj, pu
            pu += 32
            while pu >= nu and pj < nleaf:
                pj += 1
                pu = slot(k, pj) if pj < nleaf else 0
        ring = [None] * (pf + 1)
        for i in range(pf):
            if pj < nleaf:
                ring[i] = pu
                padv()
        while cj < nleaf:
            if pj < nleaf:
                ring[pf] = pu
                padv()
            assert ring[0] == cu, f"prefetch ring out of step: holds {ring[0]}, consuming {cu}"
            # MVT_JFIX: with wk % 4 == 0 every unit of group k has u & 3 == k & 3 (the kernel
            # compiles the Q4_K / Q5_K loop for that constant j)
            assert wk % 4 or cu & 3 == k & 3, f"JFIX: unit {cu} of group {k} (WK {wk}) has another j"
            if not (canary and cu == 1):
                P = np.float32(P + c[cu])
            ring = ring[1:] + [ring[pf]]
            cu += 32
            while cu >= nu and cj < nleaf:
                merge(cj)
                cj += 1
                cu = slot(k, cj) if cj < nleaf else 0
        roots.append(P)
    return gc.meet_roots(roots, wk)


def selftest_order(rng) -> int:
    n = 0
    for nu in (1, 3, 5, 12, 31, 32, 33, 40, 64, 100, 224):
        for _ in range(8):
            c = (rng.standard_normal(nu) * np.exp2(rng.integers(-20, 20, nu))).astype(np.float32)
            ref = mv_order(c)
            for wk in (1, 2, 4, 8, 16):
                for pf in (0, 1, 2, 3):
                    got = mvt_order(c, wk, pf)
                    assert np.float32(ref).view(np.uint32) == np.float32(got).view(np.uint32), (nu, wk, pf, ref, got)
                    n += 1
    # the canary changes the result (unit 1 dropped) whenever unit 1 contributes
    c = np.ones(40, np.float32)
    assert mvt_order(c, 8, 2, canary=True) != mv_order(c)
    return n


def selftest_epilogue() -> None:
    """Every output (row < N, col < nb) written by exactly one thread (group wk = 0), for the
    block grid of mvt_launch; for _glu the thread's C rows gid / gid + 8 are weight rows n, N + n."""
    for cfg in CHECK_CFGS:
        TN, WM = cfg["MVT_TN"], cfg["MVT_WM"]
        for glu in (False, True):
            for N, nb in ((77, 13), (40, 16), (9, 1)):
                hits = np.zeros((N, nb), np.int32)
                grid, _ = mvt_launch(cfg, N, nb, glu)
                obm = 8 if glu else 16
                for bx in range(grid[0]):
                    for by in range(grid[1]):
                        cb = by * 8 * TN
                        for wm in range(WM):
                            ob = (bx * WM + wm) * obm
                            for lane in range(32):
                                g, tg = lane >> 2, lane & 3
                                for ni in range(TN):
                                    for e in range(2 if glu else 4):
                                        row = ob + g + 8 * (e >> 1)
                                        col = cb + 8 * ni + 2 * tg + (e & 1)
                                        if row >= N or col >= nb:
                                            continue
                                        hits[row, col] += 1
                                        if glu:   # P[o] from C row g, P[o + 2] from C row g + 8
                                            assert tile_weight_row(g, ob, N, True) == row
                                            assert tile_weight_row(g + 8, ob, N, True) == N + row
                                        else:
                                            assert tile_weight_row(g + 8 * (e >> 1), ob, N, False) == row
                assert (hits == 1).all(), (cfg_name(cfg), glu, N, nb)


def selftest(types) -> int:
    rng = np.random.default_rng(11)
    t0 = time.perf_counter()
    n = selftest_order(rng)
    print(f"PASS  slot walk: bit-reversed leaves + prefetch ring + stack + WK roots == mv_q8's lane order and "
          f"butterfly ({n} random reductions, WK 1..16, prefetch 0..3, bit-exact); JFIX's constant j holds; "
          f"canary model differs", flush=True)
    selftest_epilogue()
    print("PASS  epilogue: every output written once by group 0; _glu gate/up rows pair up in one thread", flush=True)
    for t in types:
        n1 = selftest_type(t, rng, glu=False, TN=2)
        n2 = selftest_type(t, rng, glu=True, TN=1)
        kp = ""
        if t in KPERM_TYPES:
            n3 = selftest_type(t, rng, glu=False, TN=2, kperm=True) + selftest_type(t, rng, glu=True, TN=1, kperm=True)
            kp = f"; MVT_KPERM 1: {n3}"
        print(f"PASS  {TYPES[t][0]:6s} lane word maps (bulk, meta, activations, scales), afrag, mma fragments, "
              f"C layout: {n1 + n2} integer sums equal GGUF-semantics references{kp}", flush=True)
    print(f"selftest done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--types", default=",".join(v[0] for v in TYPES.values()))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-checks", action="store_true", help="timing only")
    ap.add_argument("--no-gemm", action="store_true", help="do not time gemm.cu's small-batch config")
    ap.add_argument("--verbose", action="store_true", help="print every passing check too")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--configs", default="", help="timed mvt configs 'TN,WK,WM,PREFETCH[,WLOAD[,MINB[,KPERM]]];...' "
                                                  "(TN 0: 1 for nb <= 8, else 2; default: TIME_CFGS)")
    ap.add_argument("--shapes", default="", help="timing shapes whose name contains one of these (comma list)")
    ap.add_argument("--nbs", default="", help="timing nb values (comma list)")
    args = ap.parse_args()
    types = [NAME2T[n.strip().upper()] for n in args.types.split(",") if n.strip()]
    if args.selftest:
        return selftest(types)

    global TIME_NBS
    tcfgs = [parse_cfg(c) for c in (args.configs.split(";") if args.configs else TIME_CFGS) if c.strip()]
    if args.shapes:
        keys = [k.strip() for k in args.shapes.split(",")]
        gc.TIME_SHAPES = tuple(sh for sh in gc.TIME_SHAPES if any(k in sh[0] for k in keys))
    if args.nbs:
        TIME_NBS = tuple(int(v) for v in args.nbs.split(","))
    jobs = plan_modules(types, timing=not args.no_timing, checks=not args.no_checks, tcfgs=tcfgs,
                        gemm=not args.no_gemm)
    cubins, logs = compile_all(jobs, args.jobs, verbose_mvt=args.compile_only)
    if args.compile_only:
        for (src, defs), cub in sorted(cubins.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            extra = ""
            if src == "mvt.cu":
                s = ptxas_summary(logs.get((src, defs), ""))
                extra = "  " + " ".join(f"{k}: {r} regs, spill {st}/{ld} B" for k, (r, st, ld) in sorted(s.items()))
            print(f"ok  {src:10s} {' '.join(f'{k}={v}' for k, v in defs)}  ({len(cub)} bytes){extra}")
        print(f"{len(cubins)} passed, 0 failed")
        return 0

    jsonl = gc.jsonl_writer("mvt-check.jsonl")

    d = gc.Dev(cubins)
    props = d.dev.properties
    src_hash = hashlib.sha256(b"".join([(KDIR / f).read_bytes() for f in ("mvt.cu", "mma_frag.cuh", "matvec.cu", "gemm.cu",
                                       "qtypes.cuh", "common.cuh", "q8.cuh")])).hexdigest()[:16]
    jsonl({"kind": "run", "device": d.dev.name, "sms": props.multiprocessor_count, "sources_sha": src_hash,
           "check_cfgs": CHECK_CFGS, "time_cfgs": tcfgs, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    print(f"device {d.dev.name}, {props.multiprocessor_count} SMs, sources {src_hash}", flush=True)
    Tally.verbose = args.verbose
    tally = Tally(jsonl)
    rng = np.random.default_rng(4321)
    t0 = time.perf_counter()
    if not args.no_checks:
        for t in types:
            for (N, K) in CHECK_SHAPES:
                for nb in (CHECK_NBS_A if (N, K) == CHECK_SHAPES[0] else CHECK_NBS_B):
                    check_case(d, tally, t, N, K, nb, rng)
            print(f"{TYPES[t][0]:6s} checks so far: {tally.ok} passed, {tally.bad} failed", flush=True)
        if 12 in types:
            canary_case(d, tally, rng)
        print(f"checks done in {time.perf_counter() - t0:.1f} s: {tally.ok} passed, {tally.bad} failed", flush=True)
    if not args.no_timing:
        timing(d, tally, types, args.reps, rng, jsonl, tcfgs, gemm=not args.no_gemm)
    print(f"\n{tally.ok} passed, {tally.bad} failed")
    jsonl({"kind": "summary", "passed": tally.ok, "failed": tally.bad})
    return 1 if tally.bad else 0


if __name__ == "__main__":
    sys.exit(main())
