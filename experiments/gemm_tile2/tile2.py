#!/usr/bin/env python3
"""tile2.py — gemm_tile2.cu (the pipelined successor of the gemm_tile prototype) against float64,
gemm_tile "2,4,3 tcm" and memra's gemm. Host code reused from experiments/gemm_tile/tile.py.

    python3 experiments/gemm_tile2/tile2.py --compile-only   # CPU: NVRTC every module, regs / spills / smem
    python3 experiments/gemm_tile2/tile2.py --dry-run        # CPU: numpy model of gemm_tile2's index maps
    python3 experiments/gemm_tile2/tile2.py --mock           # CPU: the device run on mock_gpu.py
    python3 experiments/gemm_tile2/tile2.py                  # device (H200): checks, then timing

Device run (ab.sh): every configuration (gemm_tile2's and gemm_tile "2,4,3 tcm") checked against the
float64 reference at TOL 1e-5 (glu and plain; small shapes with partial batch tiles; the 8B shapes at
64 / 128 / 512 rows on REF_ROWS outputs at each end), batch invariance (rows 0..63 of nb = 64 and rows
0..127 of nb = 128 bit-identical inside nb = 512), then CUDA-event medians (weights rotated over copies
> 3x the L2) beside memra's gemm at 2,2,2,4,1,3,1,1 with GM_MINB 1. JSON lines to $OUT/gemm-tile2.jsonl.
Exit 1 on a failed check, 2 on an error.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import tile as T  # noqa: E402  (gemm_tile's host code: references, checks, timing, launch contract)

SRCS = {"tile": ROOT / "experiments" / "gemm_tile" / "gemm_tile.cu", "tile2": HERE / "gemm_tile2.cu"}
TOL = T.TOL
Q4_K = T.Q4_K

# (name, source, defines). gemm_tile2: GT_WM x GT_WN warps of 64 x 32 outputs, GT_STAGES ring depth,
# GT_FORM 0 (tcm, free order) / 1 (exact chain), GT_PF prefetch (1 full, 2 IMMA operands only, 0 none),
# GT_PU pair-loop unroll (4 full, 1 rolled)
G24 = {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}   # BM 128 x BN 128, 8 warps, 2 ring slots (184 / 168 KB)
G22 = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}   # BM 128 x BN 64, 4 warps (for 64 rows)
CONFIGS = (
    ("tile 2,4,3 tcm", "tile", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}),
    ("t2 F0 2,4,2", "tile2", {**G24, "GT_FORM": 0, "GT_PF": 1}),
    ("t2 F0 2,4,2 pf2", "tile2", {**G24, "GT_FORM": 0, "GT_PF": 2}),
    ("t2 F0 2,4,2 pf0", "tile2", {**G24, "GT_FORM": 0, "GT_PF": 0}),
    ("t2 F1 2,4,2", "tile2", {**G24, "GT_FORM": 1, "GT_PF": 1}),
    ("t2 F1 2,4,2 pf2", "tile2", {**G24, "GT_FORM": 1, "GT_PF": 2}),
    ("t2 F0 2,2,3 pf2", "tile2", {**G22, "GT_FORM": 0, "GT_PF": 2}),
    ("t2 F1 2,2,3", "tile2", {**G22, "GT_FORM": 1, "GT_PF": 1}),
)
MEMRA_CFG = "2,2,2,4,1,3,1,1"   # with GM_MINB 1 (the H200 table's configuration for the glu)
SHAPES = (("Q4_K glu 2x14336x4096", 2 * 14336, 4096, True, (1,)),
          ("Q4_K 4096x14336", 4096, 14336, False, (1, 4)))   # split-K 4: GT_FORM 0 and gemm_tile only
NBS = (64, 128, 512)
CHAIN_ROWS = 32           # GT_FORM 1, plain 8B shape: output rows compared bit for bit with the CPU chain
MOCK_SHAPES = (("mock glu 2x1024x1024", 2 * 1024, 1024, True, (1,)), ("mock 512x4096", 512, 4096, False, (1, 4)))
# small checks: (N, K, nb, ks): partial batch tiles, one stage (K 256), split-K (GT_FORM 0 / gemm_tile)
SMALL = ((512, 768, 37, 1), (256, 512, 130, 1), (256, 256, 5, 1), (256, 1024, 1, 1), (256, 1024, 77, 2),
         (512, 3072, 200, 3))
# sass2.py's table: every timed configuration (glu and plain) and two that are not timed
SASS_TABLE = tuple((f"{n} {fn[10:] or 'plain'}", src, d, fn) for n, src, d in CONFIGS
                   for fn in ("gemm_tile_glu", "gemm_tile")) + (
    ("t2 F0 2,4,2 pf2 PASS3", "tile2", {**G24, "GT_FORM": 0, "GT_PF": 2, "GT_PASS": 3}, "gemm_tile_glu"),
    ("t2 F1 2,4,2 PASS3", "tile2", {**G24, "GT_FORM": 1, "GT_PF": 2, "GT_PASS": 3}, "gemm_tile_glu"),
)


def tiles(defs: dict) -> tuple[int, int, int]:
    return T.tiles(defs)


def smem_bytes(src: str, defs: dict) -> int:
    if src == "tile":
        return T.smem_bytes(defs)
    bm, bn, _ = tiles(defs)
    ns = int(defs.get("GT_STAGES", 2))
    form = int(defs.get("GT_FORM", 0))
    rs, cs = 8 * bm * (12 if form else 16), 8 * bn * (8 if form else 12)
    return ns * (bm * 144 + bn * 272 + bm * 16 + bn * 64) + 2 * (rs + cs)


def launch_shape(src: str, defs: dict, rows: int, K: int, nb: int, glu: bool, ks: int = 1):
    if src == "tile":
        return T.launch_shape(defs, rows, K, nb, glu, ks)
    bm, bn, nt = tiles(defs)
    N = rows // 2 if glu else rows
    obm = bm // 2 if glu else bm
    if K % (256 * ks) or N % obm or nb < 1:
        raise ValueError(f"gemm_tile2: K = {K} must be a multiple of 256 x ks = {ks} and N = {N} of {obm}")
    if ks > 1 and int(defs.get("GT_FORM", 0)) == 1:
        raise ValueError("gemm_tile2: GT_FORM 1 (the exact chain) has no split-K")
    if smem_bytes(src, defs) > 232448 or int(defs.get("GT_WN", 4)) < 2 or int(defs.get("GT_STAGES", 2)) < 2:
        raise ValueError(f"gemm_tile2: configuration {defs} does not fit (smem {smem_bytes(src, defs)})")
    return (N // obm, -(-nb // bn), ks), (nt, 1, 1), smem_bytes(src, defs)


def compile_module(src: str, defs: dict) -> tuple[bytes, str]:
    """SRCS[src] through gemm_tile/tile.py's compile_module: (cubin, ptxas log)."""
    return T.compile_module(defs, SRCS[src])


def _compile_one(item):
    name, src, defs = item
    cub, log = compile_module(src, defs)
    return name, cub, {fn: T.ptxas_info(log, fn) for fn in ("gemm_tile", "gemm_tile_glu")}


def compile_all(workers: int) -> dict:
    out = {}
    with ProcessPoolExecutor(max(1, min(workers, len(CONFIGS)))) as ex:
        for name, cub, info in ex.map(_compile_one, CONFIGS):
            out[name] = (cub, info)
    return out


# ---------------------------------------------------------------------------------------
# device

def kss_for(src: str, defs: dict, kss) -> tuple:
    """split-K counts a configuration runs: GT_FORM 1 (the exact chain) has none."""
    return tuple(k for k in kss if k == 1 or src == "tile" or int(defs.get("GT_FORM", 0)) == 0)


class Run:
    def __init__(self, cubins: dict, mock: bool = False):
        self.cfg = {name: (src, defs) for name, src, defs in CONFIGS}
        if mock:
            from mock_gpu import MockGpu, MockModule
            self.g = MockGpu()
            self.mods = {name: MockModule(SRCS[src].name, defs) for name, src, defs in CONFIGS}
            return
        from memra.gpu.cuda import Module, gpu
        self.g = gpu(0)
        self.mods = {name: Module(self.g, SRCS[src].name, dict(defs), cubins[name][0]) for name, src, defs in CONFIGS}

    def launch_tile(self, cfg: str, w, xq, xs, y, nb: int, glu: bool, ks: int = 1, ws=None):
        src, defs = self.cfg[cfg]
        grid, block, smem = launch_shape(src, defs, w.rows, w.K, nb, glu, ks)
        N = w.rows // 2 if glu else w.rows
        mod = self.mods[cfg]
        self.g.launch(mod.kernel("gemm_tile_glu" if glu else "gemm_tile"), grid, block,
                      (w.bulk, w.meta, xq, xs, ws if ks > 1 else y, np.int32(N), np.int32(w.K), np.int32(nb),
                       np.int32(ks)), shmem=smem)
        if ks > 1:
            self.g.launch(mod.kernel("gemm_tile_reduce"), (-(-N * nb // 256),), (256,),
                          (ws, y, np.int32(N), np.int32(nb), np.int32(ks), np.int32(1 if glu else 0)))

    launch_memra = T.Run.launch_memra


def device_main(args, jsonl) -> int:
    global CONFIGS
    from memra.gpu.compare import compare
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE

    t0 = time.perf_counter()
    cubins = {} if args.mock else compile_all(16)
    if args.mock:   # the compile step is tested by --compile-only; the mock only needs the register info
        cubins = {name: (b"", {"gemm_tile": (0, 0), "gemm_tile_glu": (0, 0)}) for name, _, _ in CONFIGS}
    spilled = 0
    for name, (_, info) in cubins.items():
        jsonl({"kind": "compile", "config": name, "info": {k: list(v) for k, v in info.items()}})
        print(f"compiled {name}: " + ", ".join(f"{fn} {r} regs {sp} B spill" for fn, (r, sp) in info.items()), flush=True)
        if any(sp for _, sp in info.values()):   # a failed check; the configuration is left out, the rest run
            print(f"FAIL  {name} spills: left out of the run", flush=True)
            jsonl({"kind": "check", "name": f"no spill {name}", "ok": False})
            spilled += 1
    CONFIGS = tuple(c for c in CONFIGS if not any(sp for _, sp in cubins[c[0]][1].values()))
    run = Run(cubins, args.mock)
    g = run.g
    shapes = MOCK_SHAPES if args.mock else SHAPES
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

    def acts(nb, K):
        x = T.make_x(rng, nb, K)
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        return x, xq, xs

    import model2
    from memra.gpu.q8 import quantize_q8_ref

    def chain_check(name, y, chain, nrow, outs):
        """GT_FORM 1, plain: the outputs bit-identical to the CPU float32 chain (model2.chain_ref)."""
        nonlocal fails
        got = y.numpy().reshape(-1, y.shape[-1])[:nrow][:, outs]
        diff = int(np.count_nonzero(got.view(np.uint32) != chain[:nrow].view(np.uint32)))
        ok = diff == 0
        if args.mock:   # the mock's emulated launch computes float64 products, not the chain
            print(f"info  {name}: chain bits (mock, not counted) {diff} of {got.size} differ", flush=True)
            return
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: bit-identical to the float32 chain ({diff} of {got.size} differ)",
              flush=True)
        jsonl({"kind": "check", "name": f"chain bits {name}", "ok": ok, "differ": diff, "n": int(got.size)})

    def is_chain(src, defs):
        return src == "tile2" and int(defs.get("GT_FORM", 0)) == 1

    for glu in (True, False):
        for (N, K, nb, ks) in SMALL:
            raw = MV.random_weight(Q4_K, 2 * N if glu else N, K, rng)
            w = MV.upload_weight(g, raw, Q4_K)
            x, xq, xs = acts(nb, K)
            ref = T.ref_rows(raw, glu, T.q8_dequant(x), np.arange(N))
            qh, sh = quantize_q8_ref(x)
            chain = None if glu or ks > 1 else model2.chain_ref(raw, np.arange(N), qh, sh["d"], sh["s"])
            wsb = g.empty((ks * nb * w.rows,), np.float32) if ks > 1 else None
            for cfg, src, defs in CONFIGS:
                if ks not in kss_for(src, defs, (ks,)):
                    continue
                y = g.empty((nb, N), np.float32)
                y.poison()
                run.launch_tile(cfg, w, xq, xs, y, nb, glu, ks, wsb)
                g.sync()
                check(f"{cfg} {'glu ' if glu else ''}N={N} K={K} nb={nb} ks={ks}", y, ref, None, nb, TOL,
                      config=cfg, N=N, K=K, nb=nb, glu=glu, ks=ks)
                if chain is not None and is_chain(src, defs):
                    chain_check(f"{cfg} N={N} K={K} nb={nb}", y, chain, nb, np.arange(N))
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    results = []
    for sname, rows, K, glu, kss in shapes:
        if args.shapes and not any(k in sname for k in args.shapes.split(",")):
            continue
        N = rows // 2 if glu else rows
        raw = MV.random_weight(Q4_K, rows, K, rng)
        w0 = MV.upload_weight(g, raw, Q4_K)
        sets = 3 if args.mock else max(2, -(-3 * T.L2_BYTES // w0.nbytes))
        ws = [w0] + [MV.upload_weight(g, raw, Q4_K) for _ in range(sets - 1)]
        outs = T.subset(N)
        nbmax = max(NBS)
        x, xq, xs = acts(nbmax, K)
        ref = T.ref_rows(raw, glu, T.q8_dequant(x), outs)
        couts = np.arange(CHAIN_ROWS)
        qh, sh = quantize_q8_ref(x)
        chain = None if glu else model2.chain_ref(raw, couts, qh, sh["d"], sh["s"])
        y = g.empty((nbmax, N), np.float32)
        wsb = g.empty((max(kss) * nbmax * rows,), np.float32) if max(kss) > 1 else None
        bits = {}
        for nb in sorted(NBS, reverse=True):   # 512 first: the smaller batches' rows are compared with it
            for cfg, src, defs in CONFIGS:
                for ks in kss_for(src, defs, kss):
                    tag = f"{cfg} ks{ks}"
                    y.poison()
                    run.launch_tile(cfg, w0, xq, xs, y, nb, glu, ks, wsb)
                    g.sync()
                    check(f"{tag} {sname} nb={nb}", y, ref[:nb], outs, nb, TOL, config=cfg, ks=ks, shape=sname, nb=nb)
                    if chain is not None and is_chain(src, defs):
                        chain_check(f"{tag} {sname} nb={nb} (rows 0..{CHAIN_ROWS - 1})", y, chain, nb, couts)
                    b = y.numpy()[:nb].view(np.uint32)
                    if tag in bits:   # batch invariance: rows 0..nb-1 bit-identical inside nb = 512
                        same = np.array_equal(bits[tag][:nb], b)
                        fails += not same
                        print(f"{'PASS' if same else 'FAIL'}  {tag} {sname}: rows 0..{nb - 1} of nb={nb} "
                              f"bit-identical inside nb={nbmax}", flush=True)
                        jsonl({"kind": "check", "name": f"batch invariance {tag} {sname} nb={nb}", "ok": bool(same)})
                    else:
                        bits[tag] = b.copy()
                    us = T.time_us(g, [lambda i=i, cfg=cfg, ks=ks: run.launch_tile(cfg, ws[i], xq, xs, y, nb, glu, ks, wsb)
                                       for i in range(sets)], args.reps)
                    results.append((sname, nb, tag, us))
                    jsonl({"kind": "time", "impl": src, "config": cfg, "ks": ks, "shape": sname, "nb": nb, "us": us,
                           "tops": 2 * rows * K * nb / us / 1e6, "sets": sets})
                    print(f"time  {tag:22s} {sname} nb={nb}: {us:8.1f} us", flush=True)
            y.poison()
            run.launch_memra(MEMRA_CFG, w0, xq, xs, y, nb, glu)
            g.sync()
            name = f"memra {MEMRA_CFG}"
            check(f"{name} {sname} nb={nb}", y, ref[:nb], outs, nb, MV.TOL, config=MEMRA_CFG, shape=sname, nb=nb)
            us = T.time_us(g, [lambda i=i: run.launch_memra(MEMRA_CFG, ws[i], xq, xs, y, nb, glu) for i in range(sets)],
                           args.reps)
            results.append((sname, nb, name, us))
            jsonl({"kind": "time", "impl": "memra", "config": MEMRA_CFG, "shape": sname, "nb": nb, "us": us,
                   "tops": 2 * rows * K * nb / us / 1e6, "sets": sets})
            print(f"time  {name:22s} {sname} nb={nb}: {us:8.1f} us", flush=True)
        ws.clear()   # the weight copies freed before the next shape
        print(f"{sname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    print(f"\n{'shape':24s} {'nb':>4s} {'impl':28s} {'us':>9s} {'vs memra':>9s} {'vs tile tcm':>11s}")
    base = {(s_, nb): us for s_, nb, n, us in results if n == f"memra {MEMRA_CFG}"}
    tcm = {(s_, nb): us for s_, nb, n, us in results if n == "tile 2,4,3 tcm ks1"}
    for s_, nb, n, us in sorted(results, key=lambda r: (r[0], r[1])):
        b, t = base.get((s_, nb)), tcm.get((s_, nb))
        print(f"{s_:24s} {nb:4d} {n:28s} {us:9.1f} {(b / us if b else float('nan')):8.2f}x {(t / us if t else float('nan')):10.2f}x")
        jsonl({"kind": "table", "shape": s_, "nb": nb, "impl": n, "us": us, "vs_memra": b / us if b else None,
               "vs_tile_tcm": t / us if t else None})
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


# ---------------------------------------------------------------------------------------
# CPU: the numpy model (model2.py)

MODEL_CASES = (   # (defs, glu, K, nb): every schedule knob, both formulas, RPT / CPT 1 and 2, NS 2 and 3
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0}, True, 1024, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 1}, False, 1024, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 3, "GT_FORM": 0, "GT_PF": 2}, False, 1024, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 1, "GT_PF": 2}, True, 768, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0, "GT_PF": 0}, True, 768, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 1, "GT_PF": 0}, False, 512, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0, "GT_PASS": 3, "GT_MINS": 0}, True, 1024, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0, "GT_PU": 4, "GT_MINS": 1}, False, 512, 40),
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 1}, True, 256, 5),
    ({"GT_WM": 1, "GT_WN": 4, "GT_STAGES": 2, "GT_FORM": 0}, True, 512, 70),     # RPT 2
    ({"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_FORM": 1}, False, 768, 40),    # CPT 2, NS 3
    ({"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2, "GT_FORM": 0}, True, 512, 130),    # the timed 2,4,2 (RPT 2, CPT 2)
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0, "ks": 2}, True, 1536, 40),   # split-K: parts of 3 stages
    ({"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 3, "GT_FORM": 0, "GT_PF": 2, "ks": 3}, False, 1536, 40),
)
MUTATIONS = (   # (mutation, defs): each must be caught (error > 1e-3, a race, or a failed assertion)
    ("araddr: ldmatrix A lane map with the row-half and k-half bits swapped", {}),
    ("nibble: the high-nibble step masks the low nibbles", {}),
    ("div16: odd sub-blocks' dsc not divided by 16", {}),
    ("aperm: min-term A quad with the row-half and k-half components swapped", {}),
    ("bperm: min-term B lo pair at +1 instead of +2", {}),
    ("ring: meta / Q8Scale of stage t + 1 into slot t % NS", {}),
    ("ring: (NS 3)", {"GT_STAGES": 3}),
    ("passbuf: the pass after B_s+1 for stage s + 1 instead of s + 2", {}),
    ("pf2race: GT_PF 2 loads step 7's scalars after the refill's barrier", {"GT_PF": 2}),
)


def model_selftest() -> int:
    import model2
    bad = 0
    # LDGSTS shared-store phases: the worst lanes of an 8-lane phase on one 16-byte bank slot, per map
    raw = np.zeros((256, 512 // 256 * 144), np.uint8)
    for defs in ({"GT_WM": 2, "GT_WN": 4}, {"GT_WM": 2, "GT_WN": 4, "GT_XROT": 0}, {"GT_WM": 2, "GT_WN": 2},
                 {"GT_WM": 1, "GT_WN": 4}):
        from memra.gpu.ops import matvec as MV
        rw = MV.random_weight(Q4_K, 256, 512, np.random.default_rng(1))
        blk = model2.Block(rw, np.zeros((130, 512), np.int8), np.ones((130, 16), np.float32),
                           np.zeros((130, 16), np.int32), defs, True, 0, 0, 130)
        print(f"info  LDGSTS phase conflicts {defs}: {blk.phase_conflicts()} (1 = conflict-free; W raw weights, "
              f"X activations, S Q8Scale)", flush=True)
    del raw
    for defs, glu, K, nb in MODEL_CASES:
        t = time.perf_counter()
        defs = dict(defs)
        ks = defs.pop("ks", 1)
        err, N = model2.replay(defs, glu, K, nb, ks=ks)
        defs = {**defs, **({"ks": ks} if ks > 1 else {})}
        ok = err < 1e-12
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  model of gemm_tile2{'_glu' if glu else ''} {defs} N={N} K={K} nb={nb}: "
              f"races none, every output once, float64 rel err {err:.1e} ({time.perf_counter() - t:.0f} s)", flush=True)
    # the exact float32 chain (GT_FORM 1's bitwise device check): model2's fma32 (experiments/chain_mv/
    # chain_ref.py's) against exact rational rounding, chain_ref against the float64 reference
    import chain_ref
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    rng = np.random.default_rng(3)
    bad += chain_ref.fma_selftest(rng)
    import tile as T
    raw = MV.random_weight(Q4_K, 64, 1024, rng)
    x = T.make_x(rng, 9, 1024)
    q, s = quantize_q8_ref(x)
    y = model2.chain_ref(raw, np.arange(64), q, s["d"], s["s"])
    ref = T.ref_rows(raw, False, T.q8_dequant(x), np.arange(64))
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    bad += not err < 1e-5
    print(f"{'PASS' if err < 1e-5 else 'FAIL'}  chain_ref (float32 chain) vs float64, 64 x 1024, nb 9: rel err {err:.1e}", flush=True)
    base = {"GT_WM": 1, "GT_WN": 2, "GT_STAGES": 2, "GT_FORM": 0}
    for desc, extra in MUTATIONS:
        m = desc.split(":")[0]
        try:
            err, _ = model2.replay({**base, **extra}, True, 1024, 40, mut=(m,))
            caught, why = not err < 1e-3, f"rel err {err:.2g}"
        except (model2.Race, AssertionError) as e:
            caught, why = True, f"{type(e).__name__}: {str(e)[:90]}"
        bad += not caught
        print(f"{'PASS' if caught else 'FAIL'}  mutation {desc} {extra or ''}: {'caught' if caught else 'NOT caught'} ({why})",
              flush=True)
    return bad


def dry_run(args) -> int:
    """The device run's host side without a device (launch shapes of every configuration at every
    shape and batch) and the index-map model."""
    for sname, rows, K, glu, kss in SHAPES:
        for nb in NBS:
            shp = []
            for cfg, src, defs in CONFIGS:
                for ks in kss_for(src, defs, kss):
                    grid, block, smem = launch_shape(src, defs, rows, K, nb, glu, ks)
                    shp.append(f"{cfg} ks{ks}: {grid} x {block[0]}, {smem} B")
            print(f"ok  {sname} nb={nb}: " + "; ".join(shp), flush=True)
    return model_selftest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--mock", action="store_true", help="the device run on mock_gpu.MockGpu (CPU; emulated launches)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    try:
        if args.compile_only:
            t0 = time.perf_counter()
            res = compile_all(args.jobs)
            bad = 0
            for name, src, defs in CONFIGS:
                cub, info = res[name]
                for fn, (r, sp) in info.items():
                    bad += sp > 0
                    print(f"{'ok  ' if not sp else 'SPILL'} {name:18s} {fn:14s} {r} regs, {sp} B spill, "
                          f"smem {smem_bytes(src, defs)} B, {len(cub)} B cubin", flush=True)
            print(f"{len(res)} modules in {time.perf_counter() - t0:.1f} s, {bad} spilling")
            return 1 if bad else 0
        if args.dry_run:
            return 1 if dry_run(args) else 0
        return device_main(args, T.jsonl_writer("gemm-tile2.jsonl"))
    except Exception:   # noqa: BLE001 - fail clearly
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
