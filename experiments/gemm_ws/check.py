#!/usr/bin/env python3
"""gemm_ws check: experiments/gemm_ws/gemm_ws.cu must give mv_q8's bits (as kernels/gemm.cu does), and how
fast it is against gemm.cu at the H200 table's configurations, at 16-128 rows on the 8B's Q4_K shapes.

Standalone like experiments/gemm_check.py, whose device helpers it uses (planes, random weights, q8.cu's
quantize, the chunked mv_q8 launches, CUDA-graph timing); imports no memra module.

    python3 experiments/gemm_ws/check.py                  # device: compile, checks, timing
    python3 experiments/gemm_ws/check.py --compile-only   # CPU: every module through NVRTC
    options: --configs 'WM,WN,TM,TN,WK,PW,STAGES,LREG,MINB;...'  --nbs 16,32,64,128  --reps 25  --no-checks
             --no-timing  --smoke  --jobs N  --shapes glu,qkv,...

Checks (each a bit comparison of y as uint32 against mv_q8 launched exactly as the engine's matvec does):
Q4_K at nu = 40 and 12 (uneven and empty slots) and an 8B-sized K, nb 1, 5, 9, 16, 33, 64, 128, plain and
_glu (act 1, 2), the residual aliased to y; each configuration at grid = the tile count and at a small
persistent grid (several tiles a block, partial column tiles); the canary (MEMRA_CANARY=1 must differ).
Timing (CUDA graphs, weights rotated over copies >= 150 MB so L2 does not hold them): per shape and nb,
gemm.cu at the table's configuration (tune/defaults/nvidia-h200.json, the nearest bucket at or above nb)
and every gemm_ws configuration at both grids (persistent: blocks an SM from the occupancy API x SMs),
each with its own bit check against mv_q8. With $OUT set, JSON lines go to $OUT/gemm-ws.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
import gemm_check as gc  # noqa: E402

WS_SRC = "ws:gemm_ws.cu"
WS_KEYS = ("WS_WM", "WS_WN", "WS_TM", "WS_TN", "WS_WK", "WS_PW", "WS_STAGES", "WS_LREG", "WS_MINB")
# candidates (WM,WN,TM,TN,WK,PW,STAGES,LREG,MINB): experiments/gemm_ws/README.md's register table; the
# first is the check's and the canary's configuration
WS_CONFIGS = ("2,2,2,4,1,1,4,1,1", "2,2,2,4,1,1,4,1,2", "2,2,2,2,1,1,4,1,3", "2,4,2,2,1,1,4,1,2",
              "1,1,2,4,4,1,4,1,2", "1,1,2,4,4,2,4,1,2", "2,1,2,4,2,1,4,1,2", "1,1,2,2,8,2,4,1,2")
SHAPES = {   # name: (ggml type, N output rows, K, glu) — the 8B Q4_K_M's launches
    "glu": (12, 14336, 4096, True),
    "qkv": (12, 6144, 4096, False),
    "qk": (12, 5120, 4096, False),
    "o": (12, 4096, 4096, False),
    "down": (12, 4096, 14336, False),
    "down6": (14, 4096, 14336, False),
    "v6": (14, 1024, 4096, False),
    "head6": (14, 128256, 4096, False),
}
TYPE_NAME = {12: "Q4_K", 14: "Q6_K"}
CHECK_SHAPES = ((200, 2560), (72, 768), (320, 4096))
TYPES = (12, 14)
CHECK_NBS = (1, 5, 9, 16, 33, 64, 128)
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"


def ws_cfg(text: str) -> dict:
    v = [int(x) for x in text.split(",")]
    if len(v) != len(WS_KEYS):
        raise SystemExit(f"--configs: need {','.join(WS_KEYS)}, got {text!r}")
    return dict(zip(WS_KEYS, v))


def ws_name(cfg: dict) -> str:
    return ",".join(str(cfg[k]) for k in WS_KEYS)


def ws_defines(t: int, cfg: dict, glu: bool, canary: int = 0) -> dict:
    d = {"MV_TYPE": t, **cfg, "WS_GLU": int(glu)}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def ws_geometry(cfg: dict, t: int = 12):
    """(BM, BN, threads, dynamic shared bytes): gemm_ws.cu's formula (its gemm_ws_smem must agree)."""
    bm, bn = 16 * cfg["WS_WM"] * cfg["WS_TM"], 8 * cfg["WS_WN"] * cfg["WS_TN"]
    wk, ns = cfg["WS_WK"], cfg["WS_STAGES"]
    nc = 32 * cfg["WS_WM"] * cfg["WS_WN"] * wk
    nout = 4 * cfg["WS_TM"] * cfg["WS_TN"]
    lv = 5 - (wk.bit_length() - 1)
    wbs, xcb, mcb = (48, 16, 16) if t == 12 else (80, 32, 20)
    stage = (bm * wbs + bn * 80 + bn * xcb + bm * mcb + 127) // 128 * 128
    smem = (wk * ns * stage + (lv - cfg["WS_LREG"]) * nout * nc * 4 + (nc * nout * 4 if wk > 1 else 0)
            + 24 * wk * ns)
    return bm, bn, nc + 32 * cfg["WS_PW"], smem


def ws_tiles(cfg: dict, N: int, nb: int, glu: bool) -> int:
    bm, bn, _, _ = ws_geometry(cfg)
    obm = bm // 2 if glu else bm
    return -(-N // obm) * -(-nb // bn)


_base_job = gc._compile_job


CACHE = Path(os.environ.get("WS_CUBIN_CACHE", "/tmp/gemm_ws_cubins"))


def _job(job):
    """gc._compile_job, gemm_ws.cu from this folder, and a cubin cache across this script's calls (a device
    stage runs it three times: smoke, checks, timing)."""
    import hashlib

    src, defines = job
    text = (HERE / "gemm_ws.cu").read_text() if src == WS_SRC else ""
    key = hashlib.sha256(repr((src, sorted(defines.items()), text,
                               sorted((p.name, p.read_text()) for p in gc.KDIR.glob("*.cu*")))).encode()).hexdigest()
    f = CACHE / f"{key}.cubin"
    if f.exists():
        return gc.module_key(src, defines), f.read_bytes(), None, 0.0
    if src != WS_SRC:
        out = _base_job(job)
    else:
        from cuda.core import Program, ProgramOptions

        opts = ProgramOptions(name="gemm_ws.cu", arch=gc.ARCH, std="c++17", lineinfo=True,
                              include_path=[str(gc.KDIR)],
                              define_macro=[(k, str(v)) for k, v in sorted(defines.items())])
        t0 = time.perf_counter()
        try:
            obj = Program(text, "c++", opts).compile("cubin")
        except Exception as e:  # noqa: BLE001 - the NVRTC log
            return gc.module_key(src, defines), None, f"{type(e).__name__}: {e}", 0.0
        out = gc.module_key(src, defines), bytes(obj.code), None, time.perf_counter() - t0
    if out[1] is not None:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(out[1])
        tmp.replace(f)
    return out


gc._compile_job = _job   # compile_all's workers (forked) take gemm_ws.cu through _job


def table_config(t: int, N: int, K: int, glu: bool, nb: int) -> dict:
    """gemm.cu's H200 table entry for this shape (rows as the table counts them) at the nearest bucket at or
    above nb (the engine's lookup); the built-in CONFIGS' rule when the shape has no entry."""
    e = json.loads(TABLE.read_text())["entries"].get("gemm_glu" if glu else "gemm", {})
    rows = 2 * N if glu else N
    ent = e.get(f"cols={K},rows={rows},type={TYPE_NAME[t]}")
    if ent:
        for b in sorted(int(x) for x in ent):
            if b >= nb:
                return dict(ent[str(b)]["config"])
        return dict(ent[str(max(int(x) for x in ent))]["config"])
    for top, text in ((16, "1,1,2,2,8,3,1,2"), (64, "1,1,2,4,4,3,1,2"), (1 << 30, "2,1,2,4,2,3,1,2")):
        if nb <= top:
            return gc.parse_cfg(text)
    raise AssertionError


def run_ws(d, w, xq, xs, y, N, nb, glu, act, res, cfg, grid=None, canary=0, target=None):
    k = d.kernel(WS_SRC, ws_defines(w.t, cfg, glu, canary), "gemm_ws_glu" if glu else "gemm_ws")
    _, _, nthr, smem = ws_geometry(cfg, w.t)
    g = grid or ws_tiles(cfg, N, nb, glu)
    d.launch(k, (g, 1, 1), (nthr, 1, 1), (w.bulk, w.meta, xq, xs, y, res or 0, np.int32(N), np.int32(w.K),
                                           np.int32(nb), np.int32(act)), shmem=smem, target=target)


def persistent_grid(d, t, cfg, glu, N, nb) -> tuple[int, int]:
    """(grid, blocks an SM): the tiles or, if fewer, every block the machine holds at once."""
    drv = d.drv
    k = d.kernel(WS_SRC, ws_defines(t, cfg, glu), "gemm_ws_glu" if glu else "gemm_ws")
    _, _, nthr, smem = ws_geometry(cfg, t)
    d.allow_smem(k, smem)
    try:
        h = k.handle if isinstance(k.handle, drv.CUkernel) else drv.CUkernel(int(k.handle))
        fn = d._ck(drv.cuKernelGetFunction(h), "cuKernelGetFunction")
        per_sm = d._ck(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, nthr, smem), "occupancy")
    except Exception as e:  # noqa: BLE001 - fall back to the configuration's own MINB
        print(f"(occupancy not read: {type(e).__name__}: {e}; using WS_MINB)", flush=True)
        per_sm = cfg["WS_MINB"]
    sms = d.dev.properties.multiprocessor_count if hasattr(d.dev, "properties") else 132
    return max(1, min(ws_tiles(cfg, N, nb, glu), int(per_sm) * int(sms))), int(per_sm)


def check_smem(d, tally, cfgs):
    """gemm_ws_smem (the kernel's compile-time shared-memory size) equals ws_geometry's formula."""
    drv = d.drv
    for t in TYPES:
        for cfg in cfgs:
            for glu in (False, True):
                key = gc.module_key(WS_SRC, ws_defines(t, cfg, glu))
                d.kernel(WS_SRC, ws_defines(t, cfg, glu), "gemm_ws_glu" if glu else "gemm_ws")
                mod = d.mods[key]
                h = mod.handle if isinstance(mod.handle, drv.CUlibrary) else drv.CUlibrary(int(mod.handle))
                ptr, size = d._ck(drv.cuLibraryGetGlobal(h, b"gemm_ws_smem"), "cuLibraryGetGlobal")
                v = d.download(int(ptr), 4, np.int32)[0]
                want = ws_geometry(cfg, t)[3]
                tally.add(f"gemm_ws_smem == formula  {TYPE_NAME[t]} {ws_name(cfg)} glu={int(glu)}", int(v) == want,
                          f"{v} vs {want}")


def check_cases(d, tally, rng, cfgs, smoke: bool = False):
    for t in TYPES:
        for (N, K) in (CHECK_SHAPES[:1] if smoke else CHECK_SHAPES):
            for nb in ((16, 33) if smoke else CHECK_NBS):
                for glu, act in ((False, 0), (True, 1), (True, 2)):
                    w = gc.W(d, t, gc.random_weight(t, 2 * N if glu else N, K, rng))
                    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
                    xq, xs = gc.quantize_dev(d, x)
                    res = rng.standard_normal((nb, N)).astype(np.float32)
                    resd = d.alloc(res.nbytes)
                    d.upload(resd, res)
                    ny = nb * N * 4
                    ym, yg = d.alloc(ny), d.alloc(ny)
                    for vname, alias in [("", False)] + ([("+res(alias y)", True)] if act != 2 else []):
                        gc.prep_out(d, ym, resd, ny, alias)
                        gc.run_mv(d, w, xq, xs, ym, N, nb, glu, act, ym if alias else 0)
                        a = d.download(ym, ny, np.float32)
                        tag = f"{TYPE_NAME[t]} {'glu act=' + str(act) if glu else 'plain'}{vname} {N}x{K} nb={nb}"
                        for cfg in cfgs:
                            full = ws_tiles(cfg, N, nb, glu)
                            for grid in sorted({full, min(full, 3)}):
                                gc.prep_out(d, yg, resd, ny, alias)
                                run_ws(d, w, xq, xs, yg, N, nb, glu, act, yg if alias else 0, cfg, grid=grid)
                                b = d.download(yg, ny, np.float32)
                                ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                                tally.add(f"gemm_ws == mv_q8  {tag} cfg {ws_name(cfg)} grid {grid}/{full}", ok,
                                          gc.diff_detail(a, b), N=N, K=K, nb=nb, glu=glu, act=act, alias_res=alias,
                                          cfg=cfg, grid=grid, tiles=full)
                    d.free_all()
        # the canary: unit 1 dropped must show
        N, K, nb = CHECK_SHAPES[0][0], CHECK_SHAPES[0][1], 16
        w = gc.W(d, t, gc.random_weight(t, N, K, rng))
        xq, xs = gc.quantize_dev(d, rng.standard_normal((nb, K)).astype(np.float32))
        ym, yg = d.alloc(nb * N * 4), d.alloc(nb * N * 4)
        d.memset(ym, 0xFF, nb * N * 4)
        d.memset(yg, 0xFF, nb * N * 4)
        gc.run_mv(d, w, xq, xs, ym, N, nb, False, 0, 0)
        run_ws(d, w, xq, xs, yg, N, nb, False, 0, 0, cfgs[0], canary=1)
        a, b = d.download(ym, nb * N * 4, np.float32), d.download(yg, nb * N * 4, np.float32)
        tally.add(f"canary: gemm_ws MEMRA_CANARY=1 differs from mv_q8  {TYPE_NAME[t]} {N}x{K} nb={nb}",
                  not np.array_equal(a.view(np.uint32), b.view(np.uint32)), gc.diff_detail(a, b), canary=True)
        d.free_all()


def timing(d, tally, rng, reps, jsonl, cfgs, shapes, nbs):
    print(f"\ntiming (CUDA graphs, median of {reps}; weights rotated over copies >= 150 MB)", flush=True)
    print(f"{'shape':6s} {'nb':>4s} {'arm':28s} {'grid':>9s} {'us':>8s} {'TOPS':>6s} {'vs gemm.cu':>10s}", flush=True)
    for sname in shapes:
        t, N, K, glu = SHAPES[sname]
        rows = 2 * N if glu else N
        raw = gc.random_weight(t, rows, K, rng)
        ws = [gc.W(d, t, raw)]
        copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
        ws += [gc.W(d, t, raw) for _ in range(copies - 1)]
        del raw
        act = 1 if glu else 0
        for nb in nbs:
            x = rng.standard_normal((nb, K)).astype(np.float32)
            xq, xs = gc.quantize_dev(d, x)
            ny = nb * N * 4
            ym, yg = d.alloc(ny), d.alloc(ny)
            d.memset(ym, 0xFF, ny)
            gc.run_mv(d, ws[0], xq, xs, ym, N, nb, glu, act, 0)
            a = d.download(ym, ny, np.float32)
            ops = 2.0 * rows * K * nb

            def timed(run):
                gg = [gc.graph_of(d, lambda tg, w=w: run(w, tg)) for w in ws]
                fns = ([lambda w=w: run(w, None) for w in ws] if any(g is None for g in gg)
                       else [lambda g=g: g.launch(d.stream) for g in gg])
                d.memset(yg, 0xFF, ny)
                us = gc.time_fn(d, fns, reps)
                b = d.download(yg, ny, np.float32)
                for g in gg:
                    if g is not None:
                        g.close()
                return us, b

            base_cfg = table_config(t, N, K, glu, nb)
            base_us, b = timed(lambda w, tg: gc.run_gemm(d, w, xq, xs, yg, N, nb, glu, act, 0, base_cfg, target=tg))
            ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
            tally.add(f"gemm.cu == mv_q8  timing {sname} nb={nb} cfg {gc.cfg_name(base_cfg)}", ok, gc.diff_detail(a, b))
            rec = {"kind": "time", "arm": "gemm.cu", "shape": sname, "type": TYPE_NAME[t], "N": N, "K": K, "glu": glu,
                   "nb": nb,
                   "cfg": gc.cfg_name(base_cfg), "us": base_us, "tops": ops / base_us * 1e-6, "exact": bool(ok),
                   "reps": reps, "copies": copies}
            jsonl(rec)
            print(f"{sname:6s} {nb:4d} {'gemm.cu ' + gc.cfg_name(base_cfg):28s} {'':>9s} {base_us:8.1f} "
                  f"{rec['tops']:6.1f} {1.0:9.3f}x", flush=True)
            for cfg in cfgs:
                full = ws_tiles(cfg, N, nb, glu)
                pgrid, per_sm = persistent_grid(d, t, cfg, glu, N, nb)
                for grid in sorted({full, pgrid}, reverse=True):
                    us, b = timed(lambda w, tg: run_ws(d, w, xq, xs, yg, N, nb, glu, act, 0, cfg, grid=grid, target=tg))
                    ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                    tally.add(f"gemm_ws == mv_q8  timing {sname} nb={nb} cfg {ws_name(cfg)} grid {grid}", ok,
                              gc.diff_detail(a, b))
                    rec = {"kind": "time", "arm": "gemm_ws", "shape": sname, "type": TYPE_NAME[t], "N": N, "K": K,
                           "glu": glu, "nb": nb,
                           "cfg": ws_name(cfg), "grid": grid, "tiles": full, "blocks_per_sm": per_sm, "us": us,
                           "tops": ops / us * 1e-6, "vs_gemm": base_us / us, "exact": bool(ok), "reps": reps,
                           "copies": copies}
                    jsonl(rec)
                    print(f"{sname:6s} {nb:4d} {'ws ' + ws_name(cfg):28s} {f'{grid}/{full}':>9s} {us:8.1f} "
                          f"{rec['tops']:6.1f} {base_us / us:9.3f}x", flush=True)
        d.free_all()


def plan(cfgs, shapes, nbs, checks: bool, timing_on: bool) -> list:
    jobs = [("q8.cu", {"Q8_WARPS": gc.Q8_WARPS})]
    for t in TYPES:
        for cfg in cfgs:
            for glu in (False, True):
                jobs.append((WS_SRC, ws_defines(t, cfg, glu)))
        jobs.append((WS_SRC, ws_defines(t, cfgs[0], False, canary=1)))
    mv_nbs = set()
    if checks:
        for t in TYPES:
            for (N, K) in CHECK_SHAPES:
                mv_nbs |= {(t, K, nb, glu) for nb in CHECK_NBS for glu in (False, True)}
    if timing_on:
        for s in shapes:
            t, N, K, glu = SHAPES[s]
            mv_nbs |= {(t, K, nb, glu) for nb in nbs}
            for nb in nbs:
                jobs.append(("gemm.cu", {"MV_TYPE": t, **table_config(t, N, K, glu, nb)}))
    for t, K, nb, glu in sorted(mv_nbs):
        for _, _, dd in gc.mv_chunks(t, K, nb, glu):
            jobs.append(("matvec.cu", dd))
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--configs", default=";".join(WS_CONFIGS))
    ap.add_argument("--shapes", default="glu,qkv,down6,o,down,head6")
    ap.add_argument("--nbs", default="64,128,16,32")   # c = 64 first: a cut-short call keeps it
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="checks of one small shape at nb 16 and 33 only (a first device call: does it finish)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    a = ap.parse_args()
    cfgs = [ws_cfg(c) for c in a.configs.split(";") if c]
    shapes = [s for s in a.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    nbs = [int(x) for x in a.nbs.split(",") if x]
    cubins = gc.compile_all(plan(cfgs, shapes, nbs, not a.no_checks, not a.no_timing), a.jobs)
    if a.compile_only:
        return 0
    jsonl = gc.jsonl_writer("gemm-ws.jsonl")
    d = gc.Dev(cubins)
    tally = gc.Tally(jsonl)
    rng = np.random.default_rng(20261205)
    name = getattr(d.dev, "name", "gpu")
    jsonl({"kind": "device", "device": name, "git_sha": os.environ.get("MEMRA_GIT_SHA", ""),
           "date": time.strftime("%Y-%m-%d")})
    try:
        check_smem(d, tally, cfgs)
    except Exception as e:  # noqa: BLE001 - a driver-binding mismatch here must not stop the bit checks
        print(f"(gemm_ws_smem not read: {type(e).__name__}: {e})", flush=True)
    if not a.no_checks:
        check_cases(d, tally, rng, cfgs, a.smoke)
    if not a.no_timing:
        timing(d, tally, rng, a.reps, jsonl, cfgs, shapes, nbs)
    print(f"\n{tally.ok} passed, {tally.bad} failed", flush=True)
    return 1 if tally.bad else 0


if __name__ == "__main__":
    sys.exit(main())
