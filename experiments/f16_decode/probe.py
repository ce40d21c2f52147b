"""Generated rows in the f16 arithmetic: what the decode matmuls would cost, and whether its bits hold across kernels.

The question (experiments/f16_decode/README.md): issue 11's c = 64 step is 87 % gemm.cu, whose every output folds
each 32-element block in float in mv_q8's order (its int8 mma are 1.3 % of its instructions). The prompt rows'
arithmetic (gemm_f16.cu / gemm_f16_wg.cu: f16 weights and activations, one f32 accumulator an output over the k16
steps in increasing k) has no per-block float work. Were generated rows in that arithmetic too, a request would keep
its bits alone or among 63 others only if the one-row launch and the 64-row launch give the same bits, and single-
stream decode would need a one-row kernel in it about as fast as mv_q8. This probe measures, per shape of the 8B
Q4_K_M, the 1B Q4_0 and Gemma-3 (random valid blocks, weights rotated through more bytes than L2):
  - time: the q8 decode kernel the engine runs at nb rows (mv_q8 at 1, mvt at 8, gemm.cu at 16 / 64; the table's
    configuration as memra.tune.tables.lookup gives it — session 51's first run, before time_q8, took the nearest
    bucket where the row count had none, e.g. mv_q8's 1-row entry at 8 rows), against gemm_f16.cu (mma.sync) at small
    tiles and gemm_f16_wg.cu (wgmma) at WG_BN 64 / 128, at nb = 1, 8, 16, 64 (µs, median of CUDA-graph launches);
  - bits: every f16 configuration's output at nb = 64 against the first configuration's (mma.sync m16n8k16 against
    wgmma m64n64k16 / m64n128k16: the same operands and k16 steps; the hardware's sum inside a step is not
    documented to agree across instructions), and row 0 at nb = 1 against row 0 at nb = 64 (batch invariance);
  - error: the f16 outputs' first rows against the float64 product of the f16-rounded operands (plain shapes).

    source .whl/setup.sh && python3 experiments/f16_decode/probe.py --out $OUT/f16-decode.jsonl [--quick]
    python3 experiments/f16_decode/probe.py --out F --mv     # experiments/f16_decode/mv_f16.cu instead: the one-row
                                                            # f16 kernel (MV_CONFIGS) against mv_q8 / mvt at 1 and 8
                                                            # rows; MF_CHAINS 1 bit for bit against gemm_f16, more
                                                            # chains against the float64 product
    python3 experiments/f16_decode/probe.py --out F --wgc    # wgc.py's chained wgmma GEMM (+ its fold) against
                                                            # gemm.cu at 16 / 64 rows; its bits against gemm_f16
                                                            # (1 chain) and mv_f16.cu at the same chains (8 rows)

One JSON line per (shape, kernel, configuration, nb) with us and GB/s; one "bits" line per shape.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))

Q4_0, Q5_0, Q8_0, Q4_K, Q6_K = 2, 6, 8, 12, 14
TN = {Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
# (model, op, type, weight rows (glu: gate and up stacked), K, glu)
SHAPES = [
    ("8B", "gate_up", Q4_K, 2 * 14336, 4096, True),
    ("8B", "down", Q6_K, 4096, 14336, False),
    ("8B", "down", Q4_K, 4096, 14336, False),
    ("8B", "qkv", Q4_K, 6144, 4096, False),
    ("8B", "attn_output", Q4_K, 4096, 4096, False),
    ("1B", "gate_up", Q4_0, 2 * 8192, 2048, True),
    ("1B", "down", Q4_0, 2048, 8192, False),
    ("1B", "qkv", Q4_0, 3072, 2048, False),
    ("gemma3", "gate_up", Q5_0, 2 * 2048, 640, True),
    ("gemma3", "down", Q8_0, 640, 2048, False),
]
NBS = (1, 8, 16, 64)
# gemm_f16.cu (mma.sync) tiles for few rows: GF_WN 1, GF_TN 2 (BN 16), 16-64 weight rows a block
GF = [dict(GF_WM=1, GF_WN=1, GF_TM=1, GF_TN=2), dict(GF_WM=2, GF_WN=1, GF_TM=1, GF_TN=2),
      dict(GF_WM=4, GF_WN=1, GF_TM=1, GF_TN=2), dict(GF_WM=2, GF_WN=1, GF_TM=2, GF_TN=2),
      dict(GF_WM=2, GF_WN=4, GF_TM=4, GF_TN=4)]
WG = [dict(WG_BN=64, WG_MT=1, WG_STAGES=4, WG_INFLIGHT=1, WG_PREFETCH=1),
      dict(WG_BN=128, WG_MT=1, WG_STAGES=4, WG_INFLIGHT=1, WG_PREFETCH=1),
      dict(WG_BN=256, WG_MT=1, WG_STAGES=4, WG_INFLIGHT=0, WG_PREFETCH=1)]
# mv_f16.cu (MF_WARPS, MF_CHAINS, MF_DEPTH, MF_H2, MF_XP, MF_DF, MF_PF, MF_MINB); a chain count applies where K / C
# is a multiple of 256; MF_H2 1 to Q4_0 and Q8_0 (their exact f16x2 dequant), MF_H2 2 to Q4_K and Q6_K (f16x2 with
# pre-rounded scales: another arithmetic); MF_XP 1 reads the activations in fragment order (xperm); MF_DF 1 (no shared
# tile) to Q4_0, Q8_0, Q4_K, Q6_K; MF_PF the bulk L2 prefetch distance in stages; MF_MINB __launch_bounds__'s minimum
# blocks (a register budget). Session 51's first run: v1 (4-tuples); session 52's runs: v3 / v4 (6-tuples), v5 MF_PF
# (7-tuples); the configurations below (8-tuples) are v6's occupancy question: 16 (the baselines), 24 and 32 warps
# an SM (CPU-compiled: 64-80 registers, 0-60 bytes of spills at ring depth 2-3); the first six are v7 (MF_DF 2:
# the weights as mma's B operand, 8 rows a warp), at 1, 2, 4 and 8 chains.
MV_CONFIGS = [(4, 1, 2, 0, 0, 2, 0, 0), (8, 2, 2, 0, 0, 2, 0, 0), (4, 1, 2, 2, 0, 2, 0, 0), (4, 1, 2, 1, 0, 2, 0, 0),
              (8, 8, 2, 0, 0, 2, 0, 0), (8, 4, 2, 2, 0, 2, 0, 0),
              (4, 1, 4, 0, 1, 0, 0, 0), (8, 1, 2, 0, 1, 0, 0, 3), (4, 1, 3, 0, 1, 0, 0, 6), (4, 1, 2, 0, 1, 0, 0, 8),
              (8, 1, 2, 0, 1, 0, 0, 4), (4, 1, 2, 2, 1, 0, 0, 8), (4, 1, 2, 1, 1, 0, 0, 8),
              (8, 8, 2, 0, 1, 0, 0, 0), (8, 8, 2, 0, 1, 0, 0, 4), (8, 4, 2, 0, 1, 0, 0, 4), (8, 8, 2, 2, 1, 0, 0, 4)]
MV_KEYS = ("MF_WARPS", "MF_CHAINS", "MF_DEPTH", "MF_H2", "MF_XP", "MF_DF", "MF_PF", "MF_MINB")
MV_SRC = Path(__file__).resolve().parent / "mv_f16.cu"
ROTATE = 160 << 20   # weight bytes a timed shape rotates through (H200 L2: 50 MB)
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"


def mv_applies(c, t: int, K: int) -> bool:
    """Whether mv_f16 configuration c runs on type t at K (chains: K / C a multiple of 256; MF_H2's and MF_DF's
    types)."""
    return ((K % (256 * c[1]) == 0 or c[1] == 1) and
            (c[3] == 0 or (c[3] == 1 and t in (Q4_0, Q8_0)) or (c[3] == 2 and t in (Q4_K, Q6_K))) and
            (c[5] == 0 or t in (Q4_0, Q8_0, Q4_K, Q6_K)))


def xperm(xh16: np.ndarray) -> np.ndarray:
    """Activation rows (f16, K a multiple of 128) in MF_XP's fragment order (index_check.xperm_src: position p holds
    k = xperm_src(p)): per 128-k stage, lane group tig's words (16 kk + 2 tig, + 8) for kk 0..7, in order."""
    nb, K = xh16.shape
    return np.ascontiguousarray(xh16.reshape(nb, K // 128, 8, 2, 4, 2).transpose(0, 1, 4, 2, 3, 5).reshape(nb, K))


def table_config(table: dict, kernel: str, t: int, rows: int, K: int, nb: int) -> dict | None:
    """The shipped table's configuration for the shape at nb rows as the engine looks it up
    (memra.tune.tables.lookup: the row bucket's entry, else None, the launcher's built-in)."""
    from memra.tune.tables import lookup
    c = lookup(table, kernel, f"cols={K},rows={rows},type={TN[t]}", nb)
    return c.config if c else None


def timer(g, emit, reps: int, base: dict, ws: list, nbytes: int):
    """timed(kernel, cfg, nb, fn): fn(w) over the rotated weight copies ws, one CUDA graph, median µs emitted (a
    MemraError emitted as the record's error)."""
    import tile as TL
    from memra.errors import MemraError

    def timed(kernel, cfg, nb, fn):
        try:
            fns = [lambda w=w: fn(w) for w in ws]
            us = TL.time_us(g, fns, reps, launches=max(24, len(fns) * 3))
            emit({"kind": "time", **base, "kernel": kernel, "config": cfg, "nb": nb, "us": round(us, 2),
                  "gbps": round(nbytes / us / 1e3, 1)})
        except MemraError as e:
            emit({"kind": "time", **base, "kernel": kernel, "config": cfg, "nb": nb, "error": str(e)[:300]})
    return timed


def time_q8(timed, g, table, t, rows, K, glu, nb, y, xq, xs):
    """The q8 decode kernel the engine's rule runs at nb rows (memra.gpu.plan.dispatch_rule: mv_q8 in chunks of up to
    8, mvt from MVT_MIN_ROWS, gemm.cu from GEMM_MIN_ROWS), at the table's configuration; mv_q8 also at 3..8 rows."""
    from memra.gpu.ops import gemm as GM
    from memra.gpu.ops import matvec as M
    from memra.gpu.ops import mvt as MVT
    act, sfx = ("silu", "_glu") if glu else (None, "")
    if nb <= 8:
        cfg = table_config(table, "matvec" + sfx, t, rows, K, nb)
        timed("matvec", cfg, nb, lambda w: M.matvec(g, w, y, xq=xq, xs=xs, nb=nb, glu=act,
                                                    tuned=(lambda _n: cfg) if cfg else None))
    if MVT.MVT_MIN_ROWS <= nb < GM.GEMM_MIN_ROWS:
        cfg = table_config(table, "mvt" + sfx, t, rows, K, nb)
        timed("mvt", cfg, nb, lambda w: MVT.mvt(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, config=cfg))
    if nb >= GM.GEMM_MIN_ROWS:
        cfg = table_config(table, "gemm" + sfx, t, rows, K, nb)
        timed("gemm", cfg, nb, lambda w: GM.gemm(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, config=cfg))


def ref_f64(raw, t: int, K: int, xh16, nb: int, nr: int = 32):
    """The float64 product of the first nr weight rows (dequantized, rounded to f16) and nb f16 activation rows."""
    from memra.model import quants as Q
    wf = Q.dequantize(raw[:nr], t, (nr, K)).astype(np.float16).astype(np.float64)
    return xh16[:nb].astype(np.float64) @ wf.T


def mv_launch(g, cache, built, t, c, w, xh, y, N, K, nb, glu):
    """mv_f16.cu's launch of nb rows at configuration c = (MF_WARPS, MF_CHAINS, ..): its module from built[(t, c)]
    (a compiled cubin and its log), loaded once into cache."""
    import tile as TL
    mod = TL.prebuilt_module(g, cache, ("mv", t, c), "mv_f16.cu", {"MV_TYPE": t, **dict(zip(MV_KEYS, c))},
                             lambda: built[(t, c)][0])
    tiles = (2 * N if glu else N) // (8 if len(c) > 5 and c[5] == 2 else 16)   # MF_DF 2: 8 weight rows a warp
    grid = (-(-tiles * c[1] // c[0]), 1, 1)
    args = ((w.bulk, w.meta, xh, y, np.int32(N), np.int32(K), np.int32(nb), np.int32(1)) if glu else
            (w.bulk, w.meta, xh, y, np.uint64(0), np.int32(N), np.int32(K), np.int32(nb)))
    g.launch(mod.kernel("mv_f16_glu" if glu else "mv_f16"), grid, (32 * c[0], 1, 1), args)


def skipped(emit, t0: float, limit: float, model: str, op: str) -> bool:
    """True (and the skip recorded) once `limit` seconds have passed since t0: no new shape starts."""
    if time.time() - t0 <= limit:
        return False
    emit({"kind": "skipped", "model": model, "op": op, "reason": "limit"})
    return True


def open_run(out_path: str, seed: int):
    """(table, g, rng, emit): the shipped table, the GPU, the run's random generator and its recorder."""
    from memra.gpu.cuda import gpu
    g = gpu()
    return (json.loads(TABLE.read_text()), g, np.random.default_rng(seed),
            recorder(g.info.name, open(out_path, "a")))


def recorder(dev: str, out):
    """emit(rec): one JSON line (device and time added) printed and appended to the open file `out`."""
    def emit(rec):
        rec = {"device": dev, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **rec}
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return emit


def shape_inputs(g, rng, model, op, t, rows, K, glu, nrows):
    """A shape's weight (random valid blocks, uploaded as many times as ROTATE wants), nrows activation rows as f32,
    their q8 twin and f16 bits, the output buffer and the record's fields:
    (N, raw, ws, nbytes, xq, xs, xh16, xh, y, act, base)."""
    from memra.gpu.ops import matvec as M
    from memra.gpu.q8 import Q8_SCALE
    N = rows // 2 if glu else rows
    raw = M.random_weight(t, rows, K, rng)
    nw = max(1, min(8, -(-ROTATE // raw.nbytes)))
    ws = [M.upload_weight(g, raw, t) for _ in range(nw)]
    x = (rng.standard_normal((nrows, K)) * 2).astype(np.float32)
    xq = g.empty((nrows * K,), np.int8)
    xs = g.empty((nrows * K // 32,), Q8_SCALE)
    M.quantize_q8(g, g.to_device(x), xq, xs, nrows)
    xh16 = x.astype(np.float16)
    xh = g.to_device(xh16.view(np.uint16).reshape(-1))
    y = g.empty((nrows * N,), np.float32)
    base = {"model": model, "op": op, "type": TN[t], "rows": rows, "K": K, "glu": glu, "weight_bytes": ws[0].nbytes,
            "rotate": nw}
    return N, raw, ws, ws[0].nbytes, xq, xs, xh16, xh, y, ("silu" if glu else None), base


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--limit", type=float, default=400.0, help="seconds: no new shape after this")
    ap.add_argument("--quick", action="store_true", help="the 8B's shapes and nb 1 / 64 only")
    ap.add_argument("--mv", action="store_true", help="mv_f16.cu against the q8 decode kernels (see above)")
    ap.add_argument("--wgc", action="store_true", help="wgc.py's chained wgmma GEMM against gemm.cu (see above)")
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "OP", "CONFIG"),
                    help="for a profiler: mv_f16 at CONFIG (comma-separated MV_KEYS values; q8: none) on one shape "
                         "(e.g. 8B gate_up), then the q8 kernel on it, --reps launches each at --nb rows; --out unused")
    ap.add_argument("--nb", type=int, default=1, help="--one's activation rows (the q8 kernel the engine runs there)")
    args = ap.parse_args()
    if args.one:
        return one_main(args)
    if args.mv:
        return mv_main(args)
    if args.wgc:
        return wgc_main(args)
    t0 = time.time()

    from memra.errors import MemraError
    from memra.gpu.compile import compile_many
    from memra.gpu.ops import gemm_f16 as GF16
    from memra.gpu.ops import matvec as M

    shapes = [s for s in SHAPES if s[0] == "8B"] if args.quick else SHAPES
    nbs = (1, 64) if args.quick else NBS
    table, g, rng, emit = open_run(args.out, 51)

    # every module first, in parallel processes (the cubin cache), so the timed loop compiles nothing
    jobs = []
    for _, _, t, rows, K, glu in shapes:
        for cfg in GF + WG:
            c = GF16.launch_config(t, 64, cfg, rows)
            jobs.append((GF16.kernel_file(c), "sm_90a", M.type_defines(t, c)))
    t1 = time.time()
    fails = [j for j, logtxt, _ in compile_many(jobs, 16) if logtxt]
    emit({"kind": "compile", "modules": len(jobs), "failed": len(fails), "s": round(time.time() - t1, 1)})

    for model, op, t, rows, K, glu in shapes:
        if skipped(emit, t0, args.limit, model, op):
            continue
        N, raw, ws, nbytes, xq, xs, xh16, xh, y, act, base = shape_inputs(g, rng, model, op, t, rows, K, glu, 64)
        timed = timer(g, emit, args.reps, base, ws, nbytes)
        for nb in nbs:
            time_q8(timed, g, table, t, rows, K, glu, nb, y, xq, xs)
            for cfg in GF + WG:
                timed("gemm_f16", cfg, nb, lambda w, nb=nb, cfg=cfg: GF16.gemm_f16(
                    g, w, y, xh=xh, nb=nb, glu=act, config=cfg))

        # bits: every f16 configuration at nb = 64 (and nb = 1) against the first one's
        outs = {}
        for i, cfg in enumerate(GF + WG):
            for nb in (1, 64):
                try:
                    y.poison()
                    GF16.gemm_f16(g, ws[0], y, xh=xh, nb=nb, glu=act, config=cfg)
                    g.sync()
                    outs[(i, nb)] = y.numpy()[: nb * N].reshape(nb, N).copy()
                except MemraError:
                    pass
        ref = outs.get((0, 64))
        agree = {}
        for (i, nb), o in outs.items():
            if ref is None:
                break
            r = ref[:nb]
            agree[f"{i}@{nb}"] = int(np.sum(o.view(np.uint32) != r.view(np.uint32)))
        err = None
        if not glu and ref is not None:
            want = ref_f64(raw, t, K, xh16, 64)
            err = float(np.max(np.abs(ref[:, :want.shape[1]] - want)) / np.max(np.abs(want)))
        emit({"kind": "bits", **base, "configs": GF + WG, "differ_vs_config0_nb64": agree, "err_vs_f64": err})
        ws = None   # the shape's weight copies freed before the next one's
    emit({"kind": "done", "s": round(time.time() - t0, 1)})
    return 0


def mv_main(args) -> int:
    """--mv: mv_f16.cu's configurations at 1 and 8 rows against the engine's q8 kernel at those rows (table
    configurations), on every shape; bits against gemm_f16 (MF_CHAINS 1) or error against float64 (more)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    import tile as TL
    from memra.gpu.ops import gemm_f16 as GF16

    t0 = time.time()
    types = sorted({s[2] for s in SHAPES})
    keys = [(t, c) for t in types for c in MV_CONFIGS if mv_applies(c, t, 1 << 20)]
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as ex:
        built = dict(zip(keys, ex.map(_mv_compile, keys)))
    table, g, rng, emit = open_run(args.out, 52)
    cache: dict = {}

    emit({"kind": "mv_compile", "modules": len(keys), "s": round(time.time() - t0, 1),
          "regs_spill": {f"{t}:{c}": [TL.ptxas_info(log, "mv_f16"), TL.ptxas_info(log, "mv_f16_glu")]
                         for (t, c), (_, log) in built.items()}})

    def mv(t, c, w, xh, y, N, K, nb, glu):
        mv_launch(g, cache, built, t, c, w, xhp if c[4] else xh, y, N, K, nb, glu)

    for model, op, t, rows, K, glu in SHAPES:
        if skipped(emit, t0, args.limit, model, op):
            continue
        N, raw, ws, nbytes, xq, xs, xh16, xh, y, act, base = shape_inputs(g, rng, model, op, t, rows, K, glu, 8)
        cfgs = [c for c in MV_CONFIGS if mv_applies(c, t, K)]
        xhp = g.to_device(xperm(xh16).view(np.uint16).reshape(-1))
        timed = timer(g, emit, args.reps, base, ws, nbytes)
        for nb in (1, 8):
            time_q8(timed, g, table, t, rows, K, glu, nb, y, xq, xs)
            for c in cfgs:
                timed("mv_f16", dict(zip(MV_KEYS, c)), nb,
                      lambda w, nb=nb, c=c: mv(t, c, w, xh, y, N, K, nb, glu))

        # bits / error: gemm_f16's built-in at nb rows against every mv_f16 configuration
        checks = {}
        for nb in (1, 8):
            y.poison()
            GF16.gemm_f16(g, ws[0], y, xh=xh, nb=nb, glu=act)
            g.sync()
            want = y.numpy()[: nb * N].copy()
            ref64 = None if glu else ref_f64(raw, t, K, xh16, nb)
            for c in cfgs:
                y.poison()
                mv(t, c, ws[0], xh, y, N, K, nb, glu)
                g.sync()
                got = y.numpy()[: nb * N].copy()
                rec = {"differ": int(np.sum(got.view(np.uint32) != want.view(np.uint32))),
                       "finite": bool(np.all(np.isfinite(got)))}
                if ref64 is not None:
                    gg = got.reshape(nb, N)[:, :ref64.shape[1]]
                    rec["err_vs_f64"] = float(np.max(np.abs(gg - ref64)) / np.max(np.abs(ref64)))
                checks[f"{c}@{nb}"] = rec
        emit({"kind": "mv_bits", **base, "checks": checks})
        ws = None   # the shape's weight copies freed before the next one's
    emit({"kind": "done", "s": round(time.time() - t0, 1)})
    return 0


def one_main(args) -> int:
    """--one MODEL OP CONFIG: a profiler's run (ncu -k regex:mv_f16|matvec|gemm): the shape's first (Q4_K for the 8B's
    down) weight, mv_f16 at CONFIG (unless CONFIG is q8; at most 8 rows) and the engine's q8 kernel at args.nb rows,
    args.reps launches each, no timing, no records."""
    import tile as TL
    model, op, cfg = args.one
    c = None if cfg == "q8" else tuple(int(v) for v in cfg.split(","))
    shape = next(sh for sh in SHAPES if sh[0] == model and sh[1] == op)
    _, _, t, rows, K, glu = shape
    table, g, rng, _ = open_run("/dev/null", 54)
    N, raw, ws, nbytes, xq, xs, xh16, xh, y, act, base = shape_inputs(g, rng, model, op, t, rows, K, glu,
                                                                        max(8, args.nb))
    if c is not None:
        built = {(t, c): TL.compile_module({"MV_TYPE": t, **dict(zip(MV_KEYS, c))}, MV_SRC)}
        xin = g.to_device(xperm(xh16).view(np.uint16).reshape(-1)) if len(c) > 4 and c[4] else xh
        cache: dict = {}
        for i in range(args.reps):
            mv_launch(g, cache, built, t, c, ws[i % len(ws)], xin, y, N, K, min(args.nb, 8), glu)
    time_q8(lambda kernel, cfg, nb, fn: [fn(ws[i % len(ws)]) for i in range(args.reps)], g, table, t, rows, K, glu,
            args.nb, y, xq, xs)
    g.sync()
    print(f"one: {model} {op} {c} and the q8 kernel at {args.nb} rows, {args.reps} launches each, {nbytes} weight "
          f"bytes", flush=True)
    return 0


WGC_CHAINS = (1, 2, 4, 8)
# session 51's run: WG_BN 64 and 128 (128 lost on every shape); session 52's: WG_BN 64 with wgc.py's WGC_PF 0 / 4 / 8
# (4 and 8 slower on every shape; the edit is gone from wgc.py); now WG_BN 64 with and without WGC_AHEAD (the
# producer's loads two pairs ahead)
WGC_CFGS = [dict(WG_BN=64, WG_MT=1, WG_STAGES=4, WG_INFLIGHT=1, WG_PREFETCH=1, WGC_AHEAD=0),
            dict(WG_BN=64, WG_MT=1, WG_STAGES=4, WG_INFLIGHT=1, WG_PREFETCH=1, WGC_AHEAD=1)]
WGC_SRC = Path("/tmp/f16_decode_wgc/gemm_f16_wgc.cu")


def wgc_main(args) -> int:
    """--wgc: the chained wgmma GEMM (wgc.py: chains over K in grid z, then fold_chains) at 16 and 64 rows against
    the engine's gemm.cu (table configurations); bits: 1 chain against gemm_f16's built-in, C chains against
    mv_f16.cu at MF_CHAINS C (rows 0..7 of an 8-row launch)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    import tile as TL
    import wgc
    from memra.gpu.ops import gemm_f16 as GF16

    t0 = time.time()
    WGC_SRC.parent.mkdir(parents=True, exist_ok=True)
    wgc.generate(WGC_SRC)
    types = sorted({s[2] for s in SHAPES})
    wkeys = [(t, i) for t in types for i in range(len(WGC_CFGS))]
    mkeys = [(t, (8, c, 2, 0)) for t in types for c in WGC_CHAINS]
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as ex:
        wbuilt = dict(zip(wkeys, ex.map(_wgc_compile, wkeys)))
        mbuilt = dict(zip(mkeys, ex.map(_mv_compile, mkeys)))
    table, g, rng, emit = open_run(args.out, 53)
    cache: dict = {}

    emit({"kind": "wgc_compile", "modules": len(wkeys) + len(mkeys), "s": round(time.time() - t0, 1),
          "regs_spill": {f"{t}:{WGC_CFGS[i]['WG_BN']}:{WGC_CFGS[i]['WGC_AHEAD']}": TL.ptxas_info(log, "gemm_f16")
                         for (t, i), (_, log) in wbuilt.items()}})

    def wgc_launch(t, i, C, w, xh, part, y, N, K, nb, glu):
        cfg = WGC_CFGS[i]
        m = TL.prebuilt_module(g, cache, ("wgc", t, i), "gemm_f16_wgc.cu", {"MV_TYPE": t, **cfg},
                               lambda: wbuilt[(t, i)][0])
        bm, bn, _ = GF16.tile(cfg)
        smem = GF16.smem_bytes(cfg)
        Nw = 2 * N if glu else N
        g.launch(m.kernel("gemm_f16"), (-(-nb // bn), Nw // bm, C), (384, 1, 1),
                 (w.bulk, w.meta, xh, part, np.uint64(0), np.int32(Nw), np.int32(K), np.int32(nb)), shmem=smem)
        g.launch(m.kernel("fold_chains"), (-(-(nb * N) // 256), 1, 1), (256, 1, 1),
                 (part, y, np.uint64(0), np.int32(N), np.int32(nb), np.int32(C), np.int32(1 if glu else 0),
                  np.int32(1)))

    def mv(t, c, w, xh, y, N, K, nb, glu):
        mv_launch(g, cache, mbuilt, t, c, w, xh, y, N, K, nb, glu)

    for model, op, t, rows, K, glu in SHAPES:
        if skipped(emit, t0, args.limit, model, op):
            continue
        N, raw, ws, nbytes, xq, xs, xh16, xh, y, act, base = shape_inputs(g, rng, model, op, t, rows, K, glu, 64)
        chains = [c for c in WGC_CHAINS if c == 1 or K % (256 * c) == 0]   # 1 chain: any K of 128s
        part = g.empty((max(chains) * 64 * rows,), np.float32)
        timed = timer(g, emit, args.reps, base, ws, nbytes)
        for nb in (16, 64):
            time_q8(timed, g, table, t, rows, K, glu, nb, y, xq, xs)
            for i, wc in enumerate(WGC_CFGS):
                for C in chains:
                    timed("wgc", {**wc, "chains": C}, nb, lambda w, nb=nb, i=i, C=C: wgc_launch(
                        t, i, C, w, xh, part, y, N, K, nb, glu))

        bits = {}
        y.poison()
        GF16.gemm_f16(g, ws[0], y, xh=xh, nb=64, glu=act)
        g.sync()
        ref1 = y.numpy()[: 64 * N].copy()
        for C in chains:
            y.poison()
            mv(t, (8, C, 2, 0), ws[0], xh, y, N, K, 8, glu)
            g.sync()
            mv8 = y.numpy()[: 8 * N].copy()
            for i, wc in enumerate(WGC_CFGS):
                y.poison()
                wgc_launch(t, i, C, ws[0], xh, part, y, N, K, 64, glu)
                g.sync()
                got = y.numpy()[: 64 * N].copy()
                rec = {"vs_mv_f16_rows0_7": int(np.sum(got[: 8 * N].view(np.uint32) != mv8.view(np.uint32)))}
                if C == 1:
                    rec["vs_gemm_f16"] = int(np.sum(got.view(np.uint32) != ref1.view(np.uint32)))
                bits[f"WG_BN {wc['WG_BN']} WGC_AHEAD {wc['WGC_AHEAD']} chains {C}"] = rec
        emit({"kind": "wgc_bits", **base, "checks": bits})
        ws = None
    emit({"kind": "done", "s": round(time.time() - t0, 1)})
    return 0


def _wgc_compile(key):
    import tile as TL
    t, i = key
    return TL.compile_module({"MV_TYPE": t, **WGC_CFGS[i]}, WGC_SRC, default_device=True)


def _mv_compile(key):
    import tile as TL
    t, c = key
    return TL.compile_module({"MV_TYPE": t, **dict(zip(MV_KEYS, c))}, MV_SRC)


if __name__ == "__main__":
    raise SystemExit(main())
