#!/usr/bin/env python3
"""run.py — gemm_tile2_q6k.cu (gemm_tile2's design for Q6_K weights) against float64, the exact float32
chains and memra's gemm. Host helpers from experiments/gemm_tile/tile.py (timing, JSONL, activations).

    python3 experiments/gemm_tile2_q6k/run.py --compile-only   # CPU: NVRTC every module, regs / spills / smem
    python3 experiments/gemm_tile2_q6k/run.py --dry-run        # CPU: launch shapes + model_q6k replays + mutations
    python3 experiments/gemm_tile2_q6k/run.py --mock           # CPU: the device run on mock_gpu.py (emulated launches)
    python3 experiments/gemm_tile2_q6k/run.py --postmortem DIR # CPU: Q6_DUMP dumps against the chain and hypotheses
    python3 experiments/gemm_tile2_q6k/run.py                  # device (H200): checks, then timing (ab.sh)

Device run: every configuration checked against the float64 reference at TOL 1e-5 (small shapes with
partial batch tiles, one-stage-pair K, split-K 2 / 4; the 8B Q6_K shapes at 512 / 128 / 64 rows on
REF_ROWS outputs at each end), the outputs of every ks = 1 configuration bit-identical to its CPU chain
(GT_FORM 0: the per-16 chain, GT_FORM 1: the J chain; small shapes all outputs, 8B shapes rows
0..CHAIN_ROWS-1), batch invariance (rows of nb 64 and 128 bit-identical inside nb 512), then CUDA-event
medians (weights rotated over copies > 3x the L2) beside memra's gemm (2,2,2,4,1,3,1,1 with GM_MINB 1,
and its default configuration). JSON lines to $OUT/gemm-tile2-q6k.jsonl. Exit 1 on a failed check, 2 on
an error.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import tile as T  # noqa: E402  (gemm_tile's host code: time_us, jsonl_writer, make_x, launch_memra)

SRC = HERE / "gemm_tile2_q6k.cu"
TOL = T.TOL
Q6_K = 14
KERNEL, REDUCE = "gemm_tile_q6k", "gemm_tile_q6k_reduce"

G24 = {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}   # BM 128 x BN 128, 8 warps, 2 ring slots
G22 = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}   # BM 128 x BN 64, 4 warps, 3 ring slots
CONFIGS = (
    ("q6 F0 2,4,2", {**G24, "GT_FORM": 0}),
    ("q6 F0 2,4,2 PU2", {**G24, "GT_FORM": 0, "GT_PU": 2}),
    ("q6 F1 2,4,2", {**G24, "GT_FORM": 1}),
    ("q6 F0 2,2,3", {**G22, "GT_FORM": 0}),
    ("q6 F1 2,2,3", {**G22, "GT_FORM": 1}),
    ("q6 F0 2,4,2 coop", {**G24, "GT_FORM": 0, "GT_COOP": 1}),   # cooperative unpack into an int8 tile
    ("q6 F1 2,4,2 coop", {**G24, "GT_FORM": 1, "GT_COOP": 1}),
)
# compiled for the static counts only (sass_q6k.py), not run (they spill): no prefetch, and the unsigned
# build with the offset IMMA
SASS_ONLY = (
    ("q6 F0 2,4,2 pf0", {**G24, "GT_FORM": 0, "GT_PF": 0}),
    ("q6 F0 2,4,2 u8+offset IMMA", {**G24, "GT_FORM": 0, "GT_SIGNED": 0}),
    ("q6 F1 2,4,2 u8+offset IMMA", {**G24, "GT_FORM": 1, "GT_SIGNED": 0}),
)
MEMRA_CFGS = ("2,2,2,4,1,3,1,1", None)   # GM_*: the brief's configuration, and memra's default
# (name, N, K, split-K counts for GT_FORM 0)
SHAPES = (("Q6_K 4096x14336", 4096, 14336, (1, 4)),
          ("Q6_K 4096x4096", 4096, 4096, (1, 4)),
          ("Q6_K 1024x4096", 1024, 4096, (1, 4, 8)))
NBS = (64, 128, 512)
CHAIN_ROWS = 32
MOCK_SHAPES = (("mock Q6_K 512x2048", 512, 2048, (1, 4)),)
# small checks (N, K, nb, ks): partial batch tiles, K of one stage pair, split-K 2 / 4 (GT_FORM 0)
SMALL = ((256, 1024, 37, 1), (128, 512, 130, 1), (256, 512, 1, 1), (256, 2048, 77, 2), (128, 4096, 200, 4))


def tiles(defs):
    wm, wn = int(defs.get("GT_WM", 2)), int(defs.get("GT_WN", 4))
    return 64 * wm, 32 * wn, 32 * wm * wn


def smem_bytes(defs) -> int:
    bm, bn, _ = tiles(defs)
    ns = int(defs.get("GT_STAGES", 2))
    form = int(defs.get("GT_FORM", 0))
    rs = 8 * bm * 8 + bm * 4 if form else 8 * bm * 16
    coop = bm * 272 if int(defs.get("GT_COOP", 0)) else 0
    return ns * (bm * 208 + bn * 272 + bm * 20 + bn * 64) + 2 * (rs + 8 * bn * 4) + coop


def launch_shape(defs, N: int, K: int, nb: int, ks: int = 1):
    bm, bn, nt = tiles(defs)
    if K % 512 or (K // 256) % ks or N % bm or nb < 1:
        raise ValueError(f"gemm_tile2_q6k: K = {K} must be a multiple of 512 with K / 256 divisible by ks = {ks}, "
                         f"N = {N} of {bm}")
    if ks > 1 and int(defs.get("GT_FORM", 0)) == 1:
        raise ValueError("gemm_tile2_q6k: GT_FORM 1 (the J chain) has no split-K")
    if smem_bytes(defs) > 232448:
        raise ValueError(f"gemm_tile2_q6k: {defs} needs {smem_bytes(defs)} B of shared memory")
    return (N // bm, -(-nb // bn), ks), (nt, 1, 1), smem_bytes(defs)


def compile_module(defs: dict) -> tuple[bytes, str]:
    """SRC through gemm_tile/tile.py's compile_module: (cubin, ptxas log)."""
    return T.compile_module(defs, SRC)


def _compile_one(item):
    name, defs = item
    cub, log = compile_module(defs)
    return name, cub, {KERNEL: T.ptxas_info(log, KERNEL)}


def compile_all(workers: int, configs=CONFIGS) -> dict:
    """Processes by spawn (not fork: warm_memra's thread may run beside it)."""
    import multiprocessing
    out = {}
    with ProcessPoolExecutor(max(1, min(workers, len(configs))), mp_context=multiprocessing.get_context("spawn")) as ex:
        for name, cub, info in ex.map(_compile_one, configs):
            out[name] = (cub, info)
    return out


def kss_for(defs, kss):
    return tuple(k for k in kss if k == 1 or int(defs.get("GT_FORM", 0)) == 0)


# ---------------------------------------------------------------------------------------
# device

class Run:
    def __init__(self, cubins: dict, mock: bool = False):
        self.cfg = dict(CONFIGS)
        if mock:
            from mock_q6k import MockQ6Gpu
            from mock_gpu import MockModule
            self.g = MockQ6Gpu()
            self.mods = {name: MockModule(SRC.name, defs) for name, defs in CONFIGS}
            return
        from memra.gpu.cuda import Module, gpu
        self.g = gpu(0)
        self.mods = {name: Module(self.g, SRC.name, dict(defs), cubins[name][0]) for name, defs in CONFIGS}

    def launch_tile(self, cfg, w, xq, xs, y, nb: int, ks: int = 1, ws=None):
        defs = self.cfg[cfg]
        grid, block, smem = launch_shape(defs, w.rows, w.K, nb, ks)
        mod = self.mods[cfg]
        self.g.launch(mod.kernel(KERNEL), grid, block, (w.bulk, w.meta, xq, xs, ws if ks > 1 else y, np.int32(w.rows),
                                                        np.int32(w.K), np.int32(nb), np.int32(ks)), shmem=smem)
        if ks > 1:
            self.g.launch(mod.kernel(REDUCE), (-(-w.rows * nb // 256),), (256,),
                          (ws, y, np.int32(w.rows), np.int32(nb), np.int32(ks)))

    def launch_memra(self, cfg, w, xq, xs, y, nb: int):
        T.Run.launch_memra(self, cfg, w, xq, xs, y, nb, False)


def warm_memra() -> None:
    """Compile memra's gemm.cu for the launches the run makes (sm_90a: the H200's arch_for) into its
    on-disk cubin cache, in parallel processes, so the timed loop does not compile them one by one."""
    try:
        from memra.gpu.compile import compile_many
        from memra.gpu.ops.gemm import KERNEL_FILE, _defines, launch_config
        jobs, seen = [], set()
        for nb in NBS:
            for mcfg in MEMRA_CFGS:
                cfg = dict(zip(T.GM_KEYS, (int(v) for v in mcfg.split(",")))) if mcfg else None
                d = _defines(Q6_K, launch_config(nb, cfg))
                key = tuple(sorted((k, str(v)) for k, v in d.items()))
                if key not in seen:
                    seen.add(key)
                    jobs.append((KERNEL_FILE, T.ARCH, d))
        for _ in compile_many(jobs, 8):
            pass
        print(f"memra gemm: {len(jobs)} modules compiled into the cache", flush=True)
    except Exception as e:   # noqa: BLE001 - only a warm-up: the launches compile on demand otherwise
        print(f"memra gemm warm-up skipped: {e}", flush=True)


def device_main(args, jsonl) -> int:
    global CONFIGS
    import model_q6k as MQ
    from memra.gpu.compare import compare
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

    t0 = time.perf_counter()
    if args.mock:   # the compile step is tested by --compile-only; the mock needs only the register info
        cubins = {name: (b"", {KERNEL: (0, 0)}) for name, _ in CONFIGS}
    else:   # memra's gemm modules (Q6_K, both configurations, every nb) into memra's cubin cache, beside ours
        import threading
        warm = threading.Thread(target=warm_memra, daemon=True)
        warm.start()
        cubins = compile_all(16)
        warm.join()
    fails = 0
    for name, (_, info) in cubins.items():
        jsonl({"kind": "compile", "config": name, "info": {k: list(v) for k, v in info.items()}})
        print(f"compiled {name}: " + ", ".join(f"{fn} {r} regs {sp} B spill" for fn, (r, sp) in info.items()), flush=True)
        if any(sp for _, sp in info.values()):
            print(f"FAIL  {name} spills: left out of the run", flush=True)
            jsonl({"kind": "check", "name": f"no spill {name}", "ok": False})
            fails += 1
    CONFIGS = tuple(c for c in CONFIGS if not any(sp for _, sp in cubins[c[0]][1].values()))
    run = Run(cubins, args.mock)
    g = run.g
    print(f"device {g.info.name}; compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    rng = np.random.default_rng(6543)

    def check(name, y, ref_y, outs, nrow, tol, **rec):
        nonlocal fails
        got = y.numpy().reshape(-1, y.shape[-1])[:nrow]
        got = got[:, outs] if outs is not None else got
        o = compare(name, got, ref_y, tol)
        fails += not o.ok
        print(f"{'PASS' if o.ok else 'FAIL'}  {name}  {o.detail}", flush=True)
        jsonl({"kind": "check", "name": name, "ok": bool(o.ok), "err": o.err, **rec})

    def chain_check(name, y, chain, nrow, outs):
        nonlocal fails
        got = y.numpy().reshape(-1, y.shape[-1])[:nrow][:, outs]
        diff = int(np.count_nonzero(got.view(np.uint32) != chain[:nrow].view(np.uint32)))
        if args.mock:   # the mock's launches compute float64 products, not the chains
            print(f"info  {name}: chain bits (mock, not counted) {diff} of {got.size} differ", flush=True)
            return
        fails += diff != 0
        print(f"{'PASS' if not diff else 'FAIL'}  {name}: bit-identical to the float32 chain ({diff} of {got.size} differ)",
              flush=True)
        jsonl({"kind": "check", "name": f"chain bits {name}", "ok": diff == 0, "differ": diff, "n": int(got.size)})

    def acts(nb, K):
        x = T.make_x(rng, nb, K)
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        q, s = quantize_q8_ref(x)
        return q, s, xq, xs

    for (N, K, nb, ks) in SMALL:
        raw = MV.random_weight(Q6_K, N, K, rng)
        w = MV.upload_weight(g, raw, Q6_K)
        q, s, xq, xs = acts(nb, K)
        rows = np.arange(N)
        ref = MQ.ref64(raw, rows, q, s["d"])
        chains = {f: MQ.chain_ref(raw, rows, q, s["d"], f) for f in (0, 1)} if ks == 1 else {}
        wsb = g.empty((ks * nb * N,), np.float32) if ks > 1 else None
        for cfg, defs in CONFIGS:
            if ks not in kss_for(defs, (ks,)):
                continue
            y = g.empty((nb, N), np.float32)
            y.poison()
            run.launch_tile(cfg, w, xq, xs, y, nb, ks, wsb)
            g.sync()
            check(f"{cfg} N={N} K={K} nb={nb} ks={ks}", y, ref, None, nb, TOL, config=cfg, N=N, K=K, nb=nb, ks=ks)
            if os.environ.get("Q6_DUMP") and not args.mock and ks == 1 and cfg in ("q6 F0 2,4,2", "q6 F0 2,4,2 coop"):   # the inputs and outputs of a case, for a CPU post-mortem
                tag = re.sub(r"[^A-Za-z0-9]+", "_", f"{cfg}_N{N}_K{K}_nb{nb}_ks{ks}")
                np.savez_compressed(f"{os.environ['Q6_DUMP']}/q6dump_{tag}.npz", raw=raw, q=q, d=s["d"],
                                    got=y.numpy().reshape(-1, N)[:nb], ref=ref)
            if ks == 1:
                chain_check(f"{cfg} N={N} K={K} nb={nb}", y, chains[int(defs.get("GT_FORM", 0))], nb, rows)
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    results = []
    for sname, N, K, kss in (MOCK_SHAPES if args.mock else SHAPES):
        if args.shapes and not any(k in sname for k in args.shapes.split(",")):
            continue
        raw = MV.random_weight(Q6_K, N, K, rng)
        w0 = MV.upload_weight(g, raw, Q6_K)
        sets = 3 if args.mock else max(2, -(-3 * T.L2_BYTES // w0.nbytes))
        wl = [w0] + [MV.upload_weight(g, raw, Q6_K) for _ in range(sets - 1)]
        k = min(T.REF_ROWS, N // 2)
        outs = np.concatenate([np.arange(k), np.arange(N - k, N)])
        nbmax = max(NBS)
        q, s, xq, xs = acts(nbmax, K)
        ref = MQ.ref64(raw, outs, q, s["d"])
        couts = np.arange(CHAIN_ROWS)
        chains = {f: MQ.chain_ref(raw, couts, q, s["d"], f) for f in (0, 1)}
        y = g.empty((nbmax, N), np.float32)
        wsb = g.empty((max(kss) * nbmax * N,), np.float32) if max(kss) > 1 else None
        bits = {}
        for nb in sorted(NBS, reverse=True):   # 512 first: the smaller batches' rows are compared with it
            for cfg, defs in CONFIGS:
                for ks in kss_for(defs, kss):
                    tag = f"{cfg} ks{ks}"
                    y.poison()
                    run.launch_tile(cfg, w0, xq, xs, y, nb, ks, wsb)
                    g.sync()
                    check(f"{tag} {sname} nb={nb}", y, ref[:nb], outs, nb, TOL, config=cfg, ks=ks, shape=sname, nb=nb)
                    if ks == 1:
                        chain_check(f"{tag} {sname} nb={nb} (rows 0..{CHAIN_ROWS - 1})", y,
                                    chains[int(defs.get("GT_FORM", 0))], nb, couts)
                    b = y.numpy()[:nb].view(np.uint32)
                    if tag in bits:
                        same = np.array_equal(bits[tag][:nb], b)
                        fails += not same
                        print(f"{'PASS' if same else 'FAIL'}  {tag} {sname}: rows 0..{nb - 1} of nb={nb} "
                              f"bit-identical inside nb={nbmax}", flush=True)
                        jsonl({"kind": "check", "name": f"batch invariance {tag} {sname} nb={nb}", "ok": bool(same)})
                    else:
                        bits[tag] = b.copy()
                    us = T.time_us(g, [lambda i=i, cfg=cfg, ks=ks: run.launch_tile(cfg, wl[i], xq, xs, y, nb, ks, wsb)
                                       for i in range(sets)], args.reps)
                    results.append((sname, nb, tag, us))
                    jsonl({"kind": "time", "impl": "tile2_q6k", "config": cfg, "ks": ks, "shape": sname, "nb": nb,
                           "us": us, "tops": 2 * N * K * nb / us / 1e6, "sets": sets})
                    print(f"time  {tag:24s} {sname} nb={nb}: {us:8.1f} us", flush=True)
            for mcfg in MEMRA_CFGS:
                name = f"memra {mcfg or 'default'}"
                y.poison()
                run.launch_memra(mcfg, w0, xq, xs, y, nb)
                g.sync()
                check(f"{name} {sname} nb={nb}", y, ref[:nb], outs, nb, MV.TOL, config=mcfg, shape=sname, nb=nb)
                us = T.time_us(g, [lambda i=i: run.launch_memra(mcfg, wl[i], xq, xs, y, nb) for i in range(sets)],
                               args.reps)
                results.append((sname, nb, name, us))
                jsonl({"kind": "time", "impl": "memra", "config": mcfg, "shape": sname, "nb": nb, "us": us,
                       "tops": 2 * N * K * nb / us / 1e6, "sets": sets})
                print(f"time  {name:24s} {sname} nb={nb}: {us:8.1f} us", flush=True)
        wl = None   # free the weight copies before the next shape
        print(f"{sname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    print(f"\n{'shape':20s} {'nb':>4s} {'impl':30s} {'us':>9s} {'vs memra 2,2,2,4':>16s} {'vs memra default':>16s}")
    b1 = {(s_, nb): us for s_, nb, n, us in results if n == f"memra {MEMRA_CFGS[0]}"}
    b2 = {(s_, nb): us for s_, nb, n, us in results if n == "memra default"}
    for s_, nb, n, us in sorted(results, key=lambda r: (r[0], r[1])):
        x1, x2 = b1.get((s_, nb)), b2.get((s_, nb))
        print(f"{s_:20s} {nb:4d} {n:30s} {us:9.1f} {(x1 / us if x1 else float('nan')):15.2f}x "
              f"{(x2 / us if x2 else float('nan')):15.2f}x")
        jsonl({"kind": "table", "shape": s_, "nb": nb, "impl": n, "us": us, "vs_memra": x1 / us if x1 else None,
               "vs_memra_default": x2 / us if x2 else None})
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


# ---------------------------------------------------------------------------------------
# CPU: the numpy model (model_q6k.py)

W12 = {"GT_WM": 1, "GT_WN": 2}
MODEL_CASES = (   # (defs, N, K, nb, ks)
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0}, 128, 1024, 40, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 1}, 128, 1024, 40, 1),
    ({**W12, "GT_STAGES": 3, "GT_FORM": 0}, 64, 1536, 70, 1),     # NS 3, 2 column tiles (partial)
    ({**W12, "GT_STAGES": 3, "GT_FORM": 1, "GT_PF": 0}, 64, 1024, 33, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0, "GT_PF": 0}, 64, 512, 40, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0, "GT_SIGNED": 0}, 64, 1024, 40, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 1, "GT_SIGNED": 0}, 64, 512, 40, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0}, 64, 2048, 40, 2),       # split-K: parts of 4 stages
    ({**W12, "GT_STAGES": 3, "GT_FORM": 0}, 64, 3072, 9, 4),        # split-K 4: parts of 3 stages (odd sb0)
    ({"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2, "GT_FORM": 0}, 128, 512, 130, 1),   # the timed 2,4,2 (RPT 2, CPT 2)
    ({"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_FORM": 1}, 128, 1024, 70, 1),   # 2,2,3 (RPT 1, CPT 2)
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0, "GT_COOP": 1}, 128, 1024, 40, 1),       # cooperative unpack
    ({**W12, "GT_STAGES": 3, "GT_FORM": 1, "GT_COOP": 1}, 64, 1536, 70, 1),
    ({**W12, "GT_STAGES": 2, "GT_FORM": 0, "GT_COOP": 1}, 64, 3072, 9, 4),         # coop + split-K 4
    ({"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2, "GT_FORM": 1, "GT_COOP": 1}, 128, 512, 130, 1),   # the timed coop tile
)
MUTATIONS = (   # (tag, description, defs): each must be caught (error > 1e-3, a race, or a failed assertion)
    ("araddr", "ldmatrix A lane map with the row-half and k-half bits swapped", {}),
    ("qhshift", "quarter 3 takes qh bits 4-5 (quarter 2's) instead of 6-7", {}),
    ("offset16", "the build's offset -16 instead of -32", {}),
    ("scidx", "the second 16-half uses the first half's scale", {}),
    ("scidx", "(GT_FORM 1)", {"GT_FORM": 1}),
    ("metawin", "meta window without the 2 (sb & 1) shift", {}),
    ("ring", "meta / Q8Scale of stage t + 1 into slot t % NS", {}),
    ("passbuf", "the pass after the refill barrier for stage s + 1 instead of s + 2", {}),
    ("pfearly", "next half's ql plane 0 loaded after quarter 1 (quarter 2 still reads it)", {}),
    ("coopbar", "GT_COOP: no barrier between the unpack and the next stage's A loads", {"GT_COOP": 1}),
    ("offset16", "(GT_COOP: the unpack's build)", {"GT_COOP": 1}),
    ("andlut", "and_m's lop3 LUT 0x88 (b & c = m & 0: no qh bits; the bug the H200 found)", {}),
    ("andlut", "(GT_COOP: the unpack's build)", {"GT_COOP": 1}),
)


def lop3_selftest() -> int:
    """The kernel's inline-asm lop3 helpers as the hardware runs them (LUT immediates and operand order
    parsed from gemm_tile2_q6k.cu by model_q6k.kernel_lop3): build_s must give the bytes q - 32 of its
    comment for every quarter, on random words."""
    import model_q6k as MQ
    rng = np.random.default_rng(5)
    L, H = (rng.integers(0, 2 ** 32, 1 << 14, dtype=np.uint64) for _ in range(2))
    bad = [g for g in range(4) if not np.array_equal(MQ.build_s(L, H, g), MQ.build_s_intent(L, H, g))]
    ok = not bad
    print(f"{'PASS' if ok else 'FAIL'}  lop3 LUTs of {SRC.name} {MQ._LOP3}: build_s = q - 32 bytes "
          f"{'for quarters 0-3' if ok else f'WRONG for quarters {bad}'}", flush=True)
    return 0 if ok else 1


def model_selftest() -> int:
    import model_q6k as MQ
    bad = lop3_selftest()
    for defs, N, K, nb, ks in MODEL_CASES:
        t = time.perf_counter()
        form = int(defs.get("GT_FORM", 0))
        y, raw, q, s = MQ.replay(defs, N, K, nb, ks=ks, seed=len(str(defs)) + K)
        rows = np.arange(N)
        ref = MQ.ref64(raw, rows, q, s["d"])
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        msg = f"float64 rel err {err:.1e}"
        ok = err < 1e-6
        if ks == 1:
            ch = MQ.chain_ref(raw, rows, q, s["d"], form)
            diff = int(np.count_nonzero(y.view(np.uint32) != ch.view(np.uint32)))
            msg += f", {diff} of {y.size} differ from the form-{form} chain"
            ok &= diff == 0
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  model of gemm_tile_q6k {defs} N={N} K={K} nb={nb} ks={ks}: no race, "
              f"every output once, {msg} ({time.perf_counter() - t:.0f} s)", flush=True)
    for tag, desc, extra in MUTATIONS:
        defs = {**W12, "GT_STAGES": 2, "GT_FORM": 0, **extra}
        try:
            y, raw, q, s = MQ.replay(defs, 64, 1024, 40, mut=(tag,), seed=11)
            ref = MQ.ref64(raw, np.arange(64), q, s["d"])
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            caught, why = not err < 1e-3, f"rel err {err:.2g}"
        except (MQ.Race, AssertionError) as e:
            caught, why = True, f"{type(e).__name__}: {str(e)[:90]}"
        bad += not caught
        print(f"{'PASS' if caught else 'FAIL'}  mutation {tag}: {desc} {extra or ''}: {'caught' if caught else 'NOT caught'} "
              f"({why})", flush=True)
    # the exactness bounds the formulas rely on, at their extremes (not reachable by random data)
    qm = np.full(16, -32, np.int64)
    xq = np.full(16, -127, np.int64)
    ia = int(qm @ xq)
    J = 2 * 128 * ia
    print(f"info  bounds: |Ia| <= {ia} < 2^22 = {2 ** 22} (magic bias of the per-16 chain); |J| <= {J} "
          f"{'<=' if J <= 2 ** 24 else '>'} 2^24 (float(J) exact), > 2^22 (no magic bias for J)", flush=True)
    bad += not (ia < 2 ** 22 and J <= 2 ** 24)
    return bad


def postmortem(ddir: str) -> int:
    """CPU: each Q6_DUMP file (run.py's device dumps: raw, q, d, got, ref) against the exact chain of its
    form and against emulated failure hypotheses (the chain of a weight decoded with the slip), printing the
    differing bits of each. A bit-exact hypothesis is the device's behaviour."""
    import glob
    import model_q6k as MQ

    def zero(raw, lo, hi):   # the chain's weights with bytes [lo, hi) of every super-block zeroed
        r = raw.copy()
        r.reshape(r.shape[0], -1, 210)[..., lo:hi] = 0
        return r

    hyps = (("as specified", lambda r: r), ("qh ignored (and_m LUT 0x88)", lambda r: zero(r, 128, 192)))
    files = sorted(glob.glob(f"{ddir}/q6dump_*.npz"))
    for f in files:
        z = np.load(f)
        raw, got = z["raw"], z["got"]
        form = 1 if "_F1_" in f else 0
        rows = np.arange(raw.shape[0])
        res = []
        for name, h in hyps:
            ch = MQ.chain_ref(h(raw), rows, z["q"], z["d"], form)
            res.append(f"{name}: {int(np.count_nonzero(got.view(np.uint32) != ch.view(np.uint32)))}")
        err = float(np.linalg.norm(got - z["ref"]) / np.linalg.norm(z["ref"]))
        print(f"{Path(f).name}: rel err {err:.2g}; bits differing of {got.size}: " + ", ".join(res), flush=True)
    return 0 if files else 2


def dry_run(args) -> int:
    for sname, N, K, kss in SHAPES:
        for nb in NBS:
            shp = []
            for cfg, defs in CONFIGS:
                for ks in kss_for(defs, kss):
                    grid, block, smem = launch_shape(defs, N, K, nb, ks)
                    shp.append(f"{cfg} ks{ks}: {grid} x {block[0]}, {smem} B")
            print(f"ok  {sname} nb={nb}: " + "; ".join(shp), flush=True)
    return model_selftest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--mock", action="store_true")
    ap.add_argument("--postmortem", metavar="DIR", default="", help="CPU: replay Q6_DUMP dumps in DIR")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    try:
        if args.compile_only:
            t0 = time.perf_counter()
            res = compile_all(args.jobs, CONFIGS + SASS_ONLY)
            bad = 0
            for name, defs in CONFIGS + SASS_ONLY:
                cub, info = res[name]
                for fn, (r, sp) in info.items():
                    bad += sp > 0 and (name, defs) in CONFIGS
                    print(f"{'ok  ' if not sp else 'SPILL'} {name:28s} {fn} {r} regs, {sp} B spill, "
                          f"smem {smem_bytes(defs)} B, {len(cub)} B cubin{'' if (name, defs) in CONFIGS else ' (static counts only)'}",
                          flush=True)
            print(f"{len(res)} modules in {time.perf_counter() - t0:.1f} s, {bad} timed configurations spilling")
            return 1 if bad else 0
        if args.postmortem:
            return postmortem(args.postmortem)
        if args.dry_run:
            return 1 if dry_run(args) else 0
        return device_main(args, T.jsonl_writer("gemm-tile2-q6k.jsonl"))
    except Exception:   # noqa: BLE001
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
