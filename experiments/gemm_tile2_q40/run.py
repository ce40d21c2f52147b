#!/usr/bin/env python3
"""run.py — gemm_tile2_q40.cu (experiments/gemm_tile2's pipelined tile GEMM for Q4_0 / Q8_0) against
float64, the exact float32 chain and memra's gemm. Host helpers from experiments/gemm_tile/tile.py.

    python3 experiments/gemm_tile2_q40/run.py --compile-only   # CPU: NVRTC every module, regs / spills / smem
    python3 experiments/gemm_tile2_q40/run.py --dry-run        # CPU: launch shapes + model_q40 (maps, races, chain bits, mutations)
    python3 experiments/gemm_tile2_q40/run.py --mock           # CPU: the device run on mock_q40.MockGpu
    python3 experiments/gemm_tile2_q40/run.py                  # device (H200): checks, then timing

Device run (ab.sh): every configuration checked against the float64 reference at TOL 1e-5 (glu and plain;
small shapes with partial batch tiles, one-stage K, split-K; the model shapes at 512 / 128 / 64 rows on
2 x 128 output rows), ks = 1 plain outputs bit-identical to the CPU float32 chain (model_q40.chain_ref;
small shapes: all, model shapes: rows 0..31), batch invariance (rows of nb 64 / 128 bit-identical inside
nb 512), CUDA-event medians (weights rotated over copies > 3x the L2) beside memra's gemm at
2,2,2,4,1,3,1,1 with GM_MINB 1 and at its default configuration. JSON lines to $OUT/gemm-tile2-q40.jsonl.
Exit 1 on a failed check, 2 on an error.
"""
from __future__ import annotations

import argparse
import os
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
import tile as T  # noqa: E402
import model_q40 as MQ  # noqa: E402

SRC = HERE / "gemm_tile2_q40.cu"
TOL = T.TOL
Q4_0, Q8_0 = 2, 8
TNAME = {Q4_0: "Q4_0", Q8_0: "Q8_0"}
KFN = {Q4_0: "gemm_q40", Q8_0: "gemm_q80"}

G24 = {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}   # BM 128 x BN 128, 8 warps
G22 = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}   # BM 128 x BN 64, 4 warps
CONFIGS = tuple(
    (f"{TNAME[qt]} {n}", {"GT_QT": qt, **d})
    for qt in (Q4_0, Q8_0)
    for n, d in (("2,4,2", {**G24, "GT_PF": 1}), ("2,4,2 pf2", {**G24, "GT_PF": 2}), ("2,2,3 pf2", {**G22, "GT_PF": 2}))) + (
    # Q4_0 only (Q8_0's 137 KB does not fit twice): BM 128 x BN 64, 2 ring slots, 102 KB: 2 blocks an SM
    ("Q4_0 2,2,2 x2", {"GT_QT": Q4_0, "GT_WM": 2, "GT_WN": 2, "GT_STAGES": 2, "GT_PF": 1, "GT_MINB": 2}),)
# compiled (--compile-only, sass) but not timed
EXTRA = tuple(
    (f"{TNAME[qt]} {n}", {"GT_QT": qt, **d})
    for qt in (Q4_0, Q8_0)
    for n, d in (("2,4,2 pf0", {**G24, "GT_PF": 0}), ("2,4,2 pfb0", {**G24, "GT_PF": 1, "GT_PFB": 0}),
                 ("2,4,2 su1", {**G24, "GT_PF": 1, "GT_SU": 1}),
                 ("2,4,2 su8", {**G24, "GT_PF": 1, "GT_SU": 8}))) + (
    ("Q4_0 2,4,3 pf2", {"GT_QT": Q4_0, "GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_PF": 2}),)
MEMRA_CFGS = ("2,2,2,4,1,3,1,1", None)   # the brief's configuration (GM_MINB 1) and memra's default
# (name, rows, K, glu, split-Ks (GT_FORM 0 only), types)
SHAPES = (
    ("8B glu 2x14336x4096", 2 * 14336, 4096, True, (1,), (Q4_0, Q8_0)),
    ("8B 4096x14336", 4096, 14336, False, (1, 4), (Q4_0, Q8_0)),
    ("8B 6144x4096", 6144, 4096, False, (1, 2), (Q4_0, Q8_0)),
    ("8B 4096x4096", 4096, 4096, False, (1, 4), (Q4_0, Q8_0)),
    ("1B glu 2x8192x2048", 2 * 8192, 2048, True, (1,), (Q4_0,)),
    ("1B 2048x8192", 2048, 8192, False, (1, 4), (Q4_0,)),
    ("1B 3072x2048", 3072, 2048, False, (1, 4), (Q4_0,)),
)
NBS = (512, 128, 64)
CHAIN_ROWS = 32
REF_ROWS = 128            # model shapes: float64 reference on the first and last REF_ROWS outputs
MOCK_SHAPES = (("mock glu 2x1024x1024", 2 * 1024, 1024, True, (1,), (Q4_0, Q8_0)),
               ("mock 512x2048", 512, 2048, False, (1, 4), (Q4_0, Q8_0)))
SMALL = ((256, 768, 37, 1), (256, 256, 5, 1), (256, 1024, 130, 2), (512, 1536, 77, 3))


def cfg_type(defs) -> int:
    return int(defs.get("GT_QT", 2))


def smem_bytes(defs: dict) -> int:
    return MQ.smem_bytes(defs)


def launch_shape(defs: dict, rows: int, K: int, nb: int, glu: bool, ks: int = 1, form: int = 0):
    c = MQ._cfg(defs)
    bm, bn, nt = c["BM"], c["BN"], c["NT"]
    N = rows // 2 if glu else rows
    obm = bm // 2 if glu else bm
    if K % (256 * ks) or N % obm or nb < 1:
        raise ValueError(f"gemm_tile2_q40: K = {K} must be a multiple of 256 x ks = {ks} and N = {N} of {obm}")
    if ks > 1 and form == 1:
        raise ValueError("gemm_tile2_q40: GT_FORM 1 (the exact chain) has no split-K")
    if c["TOTAL"] > 232448 or c["WN"] < 2 or c["NS"] < 2:
        raise ValueError(f"gemm_tile2_q40: configuration {defs} does not fit (smem {c['TOTAL']})")
    return (N // obm, -(-nb // bn), ks), (nt, 1, 1), c["TOTAL"]


def compile_module(defs: dict) -> tuple[bytes, str]:
    """SRC through gemm_tile/tile.py's compile_module: (cubin, ptxas log)."""
    return T.compile_module(defs, SRC)


def fns_of(defs) -> tuple[str, str]:
    k = KFN[cfg_type(defs)]
    return k, k + "_glu"


def _compile_one(item):
    name, defs = item
    if name.startswith("memra:"):   # warm memra's cubin cache (memra.gpu.compile) in parallel
        from memra.gpu.compile import compile_cubin
        compile_cubin("gemm.cu", T.ARCH, defs)
        return name, b"", {}
    cub, log = compile_module(defs)
    return name, cub, {fn: T.ptxas_info(log, fn) for fn in fns_of(defs)}


def memra_modules() -> list:
    from memra.gpu.ops import gemm as GM
    out = {}
    for qt in (Q4_0, Q8_0):
        for cfg in MEMRA_CFGS:
            for nb in NBS:
                config = dict(zip(T.GM_KEYS, (int(v) for v in cfg.split(",")))) if cfg else None
                d = GM._defines(qt, GM.launch_config(nb, config))
                out[str(sorted(d.items()))] = d
    return [(f"memra:{k}", d) for k, d in out.items()]


def compile_all(workers: int, configs=None, memra: bool = False) -> dict:
    items = list(configs or CONFIGS) + (memra_modules() if memra else [])
    out = {}
    # spawn, not fork: the device run starts its host-data threads first, and a fork beside running
    # threads (import locks, BLAS) can hang a child
    import multiprocessing
    with ProcessPoolExecutor(max(1, min(workers, len(items))), mp_context=multiprocessing.get_context("spawn")) as ex:
        for name, cub, info in ex.map(_compile_one, items):
            if not name.startswith("memra:"):
                out[name] = (cub, info)
    return out


# ---------------------------------------------------------------------------------------
# device

class Run:
    def __init__(self, cubins: dict, mock: bool = False):
        self.cfg = dict(CONFIGS)
        if mock:
            import mock_q40
            self.g = mock_q40.MockGpu()
            self.mods = {name: mock_q40.MockModule(SRC.name, defs) for name, defs in CONFIGS}
            return
        from memra.gpu.cuda import Module, gpu
        self.g = gpu(0)
        self.mods = {name: Module(self.g, SRC.name, dict(defs), cubins[name][0]) for name, defs in CONFIGS}

    def launch_tile(self, cfg, w, xq, xs, y, nb, glu, ks=1, ws=None):
        defs = self.cfg[cfg]
        assert w.ggml_type == cfg_type(defs)
        grid, block, smem = launch_shape(defs, w.rows, w.K, nb, glu, ks)
        N = w.rows // 2 if glu else w.rows
        mod = self.mods[cfg]
        plain, gl = fns_of(defs)
        self.g.launch(mod.kernel(gl if glu else plain), grid, block,
                      (w.bulk, w.meta, xq, xs, ws if ks > 1 else y, np.int32(N), np.int32(w.K), np.int32(nb),
                       np.int32(ks)), shmem=smem)
        if ks > 1:
            self.g.launch(mod.kernel("gemm_tile_reduce"), (-(-N * nb // 256),), (256,),
                          (ws, y, np.int32(N), np.int32(nb), np.int32(ks), np.int32(1 if glu else 0)))

    launch_memra = T.Run.launch_memra


def prep(i: int, rows: int, K: int, glu: bool, qt: int) -> dict:
    """Host data of one timed shape (own seed: independent of the order): GGUF rows, activations, the
    float64 reference on the first / last REF_ROWS outputs and (plain) the float32 chain on rows 0..31.
    Runs in a thread while the modules compile."""
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    rng = np.random.default_rng(1000 + i)
    N = rows // 2 if glu else rows
    raw = MV.random_weight(qt, rows, K, rng)
    x = T.make_x(rng, max(NBS), K)
    outs = np.concatenate([np.arange(REF_ROWS), np.arange(N - REF_ROWS, N)])
    ref = MQ.ref_rows(raw, qt, glu, T.q8_dequant(x), outs)
    qh, sh = quantize_q8_ref(x)
    chain = None if glu else MQ.chain_ref(raw, qt, np.arange(CHAIN_ROWS), qh, sh["d"])
    return {"raw": raw, "x": x, "outs": outs, "ref": ref, "chain": chain}


def clone(g, w):
    """A device copy of a Weight (the timing loop's rotation), without packing the planes again."""
    from memra.gpu.ops.matvec import Weight
    buf = g.empty(w.buf.nbytes, np.uint8)
    g.copy(buf, w.buf)
    bv = buf.view(np.uint8, (w.bulk.nbytes,), 0)
    mv = buf.view(np.uint8, (w.meta.nbytes,), w.meta.ptr - w.buf.ptr) if w.meta.ptr != w.bulk.ptr else bv
    return Weight(w.ggml_type, w.rows, w.K, buf, bv, mv)


def device_main(args, jsonl) -> int:
    global CONFIGS
    from memra.gpu.compare import compare
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

    t0 = time.perf_counter()
    # Q40_REHEARSE=1 with --mock: the real shapes with the mock's emulation off (launches only recorded):
    # times the host side of the device run (every check fails by design)
    rehearse = args.mock and os.environ.get("Q40_REHEARSE") == "1"
    shapes = MOCK_SHAPES if args.mock and not rehearse else SHAPES
    todo = [(i, sname, rows, K, glu, kss, qt) for i, (sname, rows, K, glu, kss, types) in enumerate(shapes) for qt in types
            if not args.shapes or any(k in sname for k in args.shapes.split(","))]
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(2)   # host data of the timed shapes, overlapped with the compile
    futs = {(i, qt): pool.submit(prep, 10 * i + qt, rows, K, glu, qt) for i, _, rows, K, glu, _, qt in todo}
    if args.mock:
        cubins = {name: (b"", {fn: (0, 0) for fn in fns_of(d)}) for name, d in CONFIGS}
    else:
        cubins = compile_all(16, memra=True)
    spilled = 0
    for name, (_, info) in cubins.items():
        jsonl({"kind": "compile", "config": name, "info": {k: list(v) for k, v in info.items()}})
        print(f"compiled {name}: " + ", ".join(f"{fn} {r} regs {sp} B spill" for fn, (r, sp) in info.items()), flush=True)
        if any(sp for _, sp in info.values()):
            print(f"FAIL  {name} spills: left out of the run", flush=True)
            jsonl({"kind": "check", "name": f"no spill {name}", "ok": False})
            spilled += 1
    CONFIGS = tuple(c for c in CONFIGS if not any(sp for _, sp in cubins[c[0]][1].values()))
    run = Run(cubins, args.mock)
    g = run.g
    if rehearse:
        g.emulate = False
    print(f"device {g.info.name}; compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    rng = np.random.default_rng(4321)
    fails = spilled

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
        if args.mock:   # the mock's emulated launch computes float64 products, not the chain
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
        return x, xq, xs

    for qt in (Q4_0, Q8_0):
        cfgs = [(n, d) for n, d in CONFIGS if cfg_type(d) == qt]
        for glu in (True, False):
            for (N, K, nb, ks) in SMALL:
                raw = MV.random_weight(qt, 2 * N if glu else N, K, rng)
                w = MV.upload_weight(g, raw, qt)
                x, xq, xs = acts(nb, K)
                ref = MQ.ref_rows(raw, qt, glu, T.q8_dequant(x), np.arange(N))
                qh, sh = quantize_q8_ref(x)
                chain = None if glu or ks > 1 else MQ.chain_ref(raw, qt, np.arange(N), qh, sh["d"])
                wsb = g.empty((ks * nb * w.rows,), np.float32) if ks > 1 else None
                for cfg, defs in cfgs:
                    y = g.empty((nb, N), np.float32)
                    y.poison()
                    run.launch_tile(cfg, w, xq, xs, y, nb, glu, ks, wsb)
                    g.sync()
                    check(f"{cfg} {'glu ' if glu else ''}N={N} K={K} nb={nb} ks={ks}", y, ref, None, nb, TOL,
                          config=cfg, N=N, K=K, nb=nb, glu=glu, ks=ks)
                    if chain is not None:
                        chain_check(f"{cfg} N={N} K={K} nb={nb}", y, chain, nb, np.arange(N))
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)
    tw = time.perf_counter()
    pool.shutdown(wait=True)   # no host threads (GIL) beside the timing loops: they could delay launches
    print(f"host data of {len(futs)} shapes ready at {time.perf_counter() - t0:.1f} s (waited {time.perf_counter() - tw:.1f} s)",
          flush=True)

    results = []
    for i, sname, rows, K, glu, kss, qt in todo:
        tname = f"{TNAME[qt]} {sname}"
        N = rows // 2 if glu else rows
        D = futs.pop((i, qt)).result()
        raw, x, outs, ref, chain = D["raw"], D["x"], D["outs"], D["ref"], D["chain"]
        w0 = MV.upload_weight(g, raw, qt)
        sets = 2 if args.mock else max(2, -(-3 * T.L2_BYTES // w0.nbytes))
        ws = [w0] + [clone(g, w0) for _ in range(sets - 1)]
        nbmax = max(NBS)
        xq, xs = g.empty((nbmax, K), np.int8), g.empty((nbmax, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nbmax)
        couts = np.arange(CHAIN_ROWS)
        y = g.empty((nbmax, N), np.float32)
        wsb = g.empty((max(kss) * nbmax * rows,), np.float32) if max(kss) > 1 else None
        bits = {}
        for nb in NBS:   # 512 first: the smaller batches' rows are compared with it
            for cfg, defs in CONFIGS:
                if cfg_type(defs) != qt:
                    continue
                for ks in kss:
                    tag = f"{cfg} ks{ks}"
                    y.poison()
                    run.launch_tile(cfg, w0, xq, xs, y, nb, glu, ks, wsb)
                    g.sync()
                    check(f"{tag} {sname} nb={nb}", y, ref[:nb], outs, nb, TOL, config=cfg, ks=ks, shape=tname, nb=nb)
                    if chain is not None and ks == 1:
                        chain_check(f"{tag} {sname} nb={nb} (rows 0..{CHAIN_ROWS - 1})", y, chain, nb, couts)
                    b = y.numpy()[:nb].view(np.uint32)
                    if tag in bits:
                        same = np.array_equal(bits[tag][:nb], b)
                        fails += not same
                        print(f"{'PASS' if same else 'FAIL'}  {tag} {tname}: rows 0..{nb - 1} of nb={nb} "
                              f"bit-identical inside nb={nbmax}", flush=True)
                        jsonl({"kind": "check", "name": f"batch invariance {tag} {tname} nb={nb}", "ok": bool(same)})
                    else:
                        bits[tag] = b.copy()
                    us = T.time_us(g, [lambda i=i, cfg=cfg, ks=ks: run.launch_tile(cfg, ws[i], xq, xs, y, nb, glu, ks, wsb)
                                       for i in range(sets)], args.reps)
                    results.append((tname, nb, tag, us))
                    jsonl({"kind": "time", "impl": "tile2_q40", "config": cfg, "ks": ks, "form": 1 if ks == 1 else 0,
                           "shape": tname, "nb": nb, "us": us, "tops": 2 * rows * K * nb / us / 1e6, "sets": sets})
                    print(f"time  {tag:22s} {tname} nb={nb}: {us:8.1f} us", flush=True)
            for mc in MEMRA_CFGS:
                name = f"memra {mc or 'default'}"
                y.poison()
                run.launch_memra(mc, w0, xq, xs, y, nb, glu)
                g.sync()
                check(f"{name} {tname} nb={nb}", y, ref[:nb], outs, nb, MV.TOL, config=mc, shape=tname, nb=nb)
                us = T.time_us(g, [lambda i=i, mc=mc: run.launch_memra(mc, ws[i], xq, xs, y, nb, glu) for i in range(sets)],
                               args.reps)
                results.append((tname, nb, name, us))
                jsonl({"kind": "time", "impl": "memra", "config": mc, "shape": tname, "nb": nb, "us": us,
                       "tops": 2 * rows * K * nb / us / 1e6, "sets": sets})
                print(f"time  {name:22s} {tname} nb={nb}: {us:8.1f} us", flush=True)
        ws = w0 = D = None   # free the device copies before the next shape
        print(f"{tname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    print(f"\n{'shape':30s} {'nb':>4s} {'impl':28s} {'us':>9s} {'vs memra cfg':>12s} {'vs memra default':>16s}")
    b1 = {(s_, nb): us for s_, nb, n, us in results if n == f"memra {MEMRA_CFGS[0]}"}
    b2 = {(s_, nb): us for s_, nb, n, us in results if n == "memra default"}
    for s_, nb, n, us in sorted(results, key=lambda r: (r[0], -r[1])):
        a, b = b1.get((s_, nb)), b2.get((s_, nb))
        print(f"{s_:30s} {nb:4d} {n:28s} {us:9.1f} {(a / us if a else float('nan')):11.2f}x {(b / us if b else float('nan')):15.2f}x")
        jsonl({"kind": "table", "shape": s_, "nb": nb, "impl": n, "us": us, "vs_memra_cfg": a / us if a else None,
               "vs_memra_default": b / us if b else None})
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


# ---------------------------------------------------------------------------------------
# CPU: the numpy model (model_q40.py)

def _m(qt, **kw):
    return {"GT_QT": qt, "GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, **kw}


MODEL_CASES = tuple(c for qt in (Q4_0, Q8_0) for c in (   # (defs, glu, K, nb)
    (_m(qt), True, 1024, 40),
    (_m(qt), False, 1024, 40),
    (_m(qt, GT_STAGES=3, GT_PF=2), False, 1024, 40),
    (_m(qt, GT_PF=2), True, 768, 40),
    (_m(qt, GT_PF=0), False, 768, 40),
    (_m(qt, GT_PFB=0), False, 768, 40),                                   # the branchy prefetch
    (_m(qt, GT_PASS=3), False, 1024, 40),
    (_m(qt), False, 256, 5),                                              # one stage
    (_m(qt, GT_WN=4), True, 512, 70),                                     # RPT 2
    ({"GT_QT": qt, "GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_PF": 2}, False, 768, 40),   # CPT 2, NS 3, the timed 2,2,3
    ({"GT_QT": qt, "GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}, False, 512, 130),              # the timed 2,4,2
    ({"GT_QT": qt, "GT_WM": 2, "GT_WN": 2, "GT_STAGES": 2}, True, 512, 70),                # the 2,2,2 x2 shape
    (_m(qt, ks=2), True, 1536, 40),                                       # split-K
    (_m(qt, GT_STAGES=3, GT_PF=2, ks=3), False, 1536, 40),
))
MUTATIONS = (   # (mutation, defs): each must be caught (err > 1e-3, chain bits, a race or an assertion)
    ("araddr: ldmatrix A lane map with the row-half and k-half bits swapped", {"GT_QT": Q8_0}),
    ("araddr: (Q4_0)", {"GT_QT": Q4_0}),
    ("nibble: Q4_0 a1 / a2 swapped (lo, hi of row g, then row g + 8)", {"GT_QT": Q4_0}),
    ("shift: Q4_0 low nibbles not shifted up (q, not 16 q)", {"GT_QT": Q4_0}),
    ("offset: Q4_0 high nibbles without the ^ 0x80 (16 q, not 16 (q - 8))", {"GT_QT": Q4_0}),
    ("div16: Q4_0 d not divided by 16", {"GT_QT": Q4_0}),
    ("rperm: row scalar position with the row half and m tile swapped", {"GT_QT": Q8_0}),
    ("ring: meta / Q8Scale of stage t + 1 into slot t % NS", {"GT_QT": Q4_0}),
    ("ring: (NS 3, Q8_0)", {"GT_QT": Q8_0, "GT_STAGES": 3}),
    ("passbuf: the pass after B_s+1 for stage s + 1 instead of s + 2", {"GT_QT": Q8_0}),
    ("pf2race: GT_PF 2 loads step 7's scalars after the refill's barrier", {"GT_QT": Q4_0, "GT_PF": 2}),
)


def model_selftest() -> int:
    from memra.gpu.ops import matvec as MV
    bad = 0
    for qt in (Q4_0, Q8_0):
        for defs in (G24, {**G24, "GT_XROT": 0}, G22):
            d = {"GT_QT": qt, **defs}
            rw = MV.random_weight(qt, 256, 512, np.random.default_rng(1))
            blk = MQ.Block(rw, np.zeros((130, 512), np.int8), np.ones((130, 16), np.float32),
                           np.zeros((130, 16), np.int32), d, True, 0, 0, 130)
            print(f"info  LDGSTS phase conflicts {d}: {blk.phase_conflicts()} (1 = conflict-free; W raw weights, "
                  f"X activations, S Q8Scale); smem {smem_bytes(d)} B", flush=True)
    for defs, glu, K, nb in MODEL_CASES:
        t = time.perf_counter()
        defs = dict(defs)
        ks = defs.pop("ks", 1)
        err, bits, N = MQ.replay(defs, glu, K, nb, ks=ks)
        ok = err < 1e-5 and bits <= 0
        bad += not ok
        tag = {**defs, **({"ks": ks} if ks > 1 else {})}
        chain = f", chain bits {bits} of {N * nb} differ" if bits >= 0 else ""
        print(f"{'PASS' if ok else 'FAIL'}  model of {KFN[defs['GT_QT']]}{'_glu' if glu else ''} {tag} N={N} K={K} nb={nb}: "
              f"races none, every output once, float64 rel err {err:.1e}{chain} ({time.perf_counter() - t:.0f} s)", flush=True)
    # fma32 (the chain's exact float32 fma: experiments/chain_mv/chain_ref.py's) against exact rational rounding
    import chain_ref
    rng = np.random.default_rng(3)
    bad += chain_ref.fma_selftest(rng)
    # the magic-bias product: fma(M + I', d', -M d') == fl(I d) for the extreme I of each type, random d
    from memra.gpu.q8 import quantize_q8_ref
    for qt, imax in ((Q4_0, 32 * 8 * 128), (Q8_0, 32 * 128 * 127)):
        I = np.concatenate([np.arange(-imax, -imax + 2000), np.arange(imax - 2000, imax + 1), np.zeros(100, np.int64),
                            rng.integers(-imax, imax + 1, 200000)]).astype(np.int64)
        d = (rng.uniform(0.5, 1.5, I.size) * rng.choice([-1, 1], I.size) * 2.0 ** rng.integers(-24, 0, I.size)
             ).astype(np.float16).astype(np.float32)
        sc = 16 if qt == Q4_0 else 1
        dd = d / np.float32(sc)
        c = (0x4B400000 + sc * I).astype(np.int32).view(np.float32)
        p = MQ.fma32(c, dd, (-MQ.MAGF * dd).astype(np.float32))
        want = (I.astype(np.float64) * d.astype(np.float64)).astype(np.float32)
        diff = p.view(np.uint32) != want.view(np.uint32)
        zs = diff & (p == 0) & (want == 0)   # +0 for -0 (I d = 0 with d < 0 or d = -0): the chain's acc starts
        n = int(np.count_nonzero(diff & ~zs))  # at +0 and never becomes -0, so fma(+-0, dx, acc) is the same
        bad += n > 0
        print(f"{'PASS' if not n else 'FAIL'}  magic-bias product {TNAME[qt]}: fma(M + {sc} I, d/{sc}, -M d/{sc}) == fl(I d) "
              f"bitwise on {I.size} cases incl. |I| = {imax} (2^22 = {2 ** 22}) and I = 0: {n} differ "
              f"(+ {int(zs.sum())} zeros of the other sign, harmless: see README)", flush=True)
    raw = MV.random_weight(Q4_0, 64, 1024, rng)
    x = T.make_x(rng, 9, 1024)
    q, s = quantize_q8_ref(x)
    for qt in (Q4_0, Q8_0):
        raw = MV.random_weight(qt, 64, 1024, rng)
        y = MQ.chain_ref(raw, qt, np.arange(64), q, s["d"])
        ref = MQ.ref_rows(raw, qt, False, T.q8_dequant(x), np.arange(64))
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        bad += not err < 1e-5
        print(f"{'PASS' if err < 1e-5 else 'FAIL'}  chain_ref {TNAME[qt]} vs float64, 64 x 1024, nb 9: rel err {err:.1e}", flush=True)
    base = {"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2}
    for desc, extra in MUTATIONS:
        m = desc.split(":")[0]
        try:
            err, bits, _ = MQ.replay({**base, **extra}, False, 1024, 40, mut=(m,))
            caught, why = not err < 1e-3 or bits != 0, f"rel err {err:.2g}, chain bits {bits} differ"
        except (MQ.Race, AssertionError) as e:
            caught, why = True, f"{type(e).__name__}: {str(e)[:90]}"
        bad += not caught
        print(f"{'PASS' if caught else 'FAIL'}  mutation {desc} {extra}: {'caught' if caught else 'NOT caught'} ({why})",
              flush=True)
    return bad


def dry_run(args) -> int:
    for sname, rows, K, glu, kss, types in SHAPES:
        for nb in NBS:
            shp = []
            for cfg, defs in CONFIGS:
                if cfg_type(defs) not in types:
                    continue
                for ks in kss:
                    grid, block, smem = launch_shape(defs, rows, K, nb, glu, ks)
                    shp.append(f"{cfg} ks{ks}: {grid} x {block[0]}, {smem} B")
            print(f"ok  {sname} nb={nb}: " + "; ".join(shp), flush=True)
    try:
        launch_shape(CONFIGS[0][1], 4096, 4096, 64, False, 2, form=1)
        print("FAIL  GT_FORM 1 with ks 2 accepted")
        return 1
    except ValueError as e:
        print(f"ok  refused: {e}")
    return model_selftest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--extra", action="store_true", help="--compile-only: also the untimed variants")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--mock", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    try:
        if args.compile_only:
            t0 = time.perf_counter()
            cfgs = CONFIGS + (EXTRA if args.extra else ())
            res = compile_all(args.jobs, cfgs)
            bad = 0
            for name, defs in cfgs:
                cub, info = res[name]
                for fn, (r, sp) in info.items():
                    bad += sp > 0 and name in dict(CONFIGS)
                    print(f"{'ok  ' if not sp else 'SPILL'} {name:18s} {fn:14s} {r} regs, {sp} B spill, "
                          f"smem {smem_bytes(defs)} B, {len(cub)} B cubin", flush=True)
            print(f"{len(res)} modules in {time.perf_counter() - t0:.1f} s, {bad} timed configurations spilling")
            return 1 if bad else 0
        if args.dry_run:
            return 1 if dry_run(args) else 0
        return device_main(args, T.jsonl_writer("gemm-tile2-q40.jsonl"))
    except Exception:   # noqa: BLE001
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
