"""mv_qf.cu (v8, the "qf" arithmetic: integer weights through the tensor core, a per-sub-block f32 fold) against the
engine's q8 decode kernels at 1 and 8 rows, on the 8B Q4_K_M's Q4_K shapes (experiments/f16_decode/README.md,
session 53).

Per shape and row count: mv_q8 (1 row) / mvt (8 rows) at the shipped H200 table's configuration, then mv_qf at every
configuration in CONFIGS: µs (median of CUDA-graph launches over weight copies rotated past L2), GB/s, and the
error of the first outputs against the float64 qf value (sum over sub-blocks of d sc S1 - dmin m S2 with S1 exact):
`rel` = max |y - ref| / max |ref| (glu: on act(gate) up). Bits between configurations with the same chain count and
layout (`differ` against `same_bits_as`, the first configuration run with the same chain count: MQ_WARPS / MQ_AHEAD /
MQ_WA / MQ_SUBN / MQ_SHARE must not change them; different chains are different arithmetics; `differ_wa` against the
first configuration of the other layout with the same chains).

    source .whl/setup.sh && [QF_SET=1..8] [QF_OPS=gate_up,qkv] python3 experiments/f16_decode/qf_probe.py --out F
    QF_CONFIGS="4,4,1,1" python3 experiments/f16_decode/qf_probe.py --out F      # one configuration (ncu)
    python3 experiments/f16_decode/qf_probe.py --compile-only
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))

SRC = Path(__file__).with_name("mv_qf.cu")
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"
ROTATE = 160 << 20
Q4_K = 12
SHAPES = [("8B", "gate_up", 2 * 14336, 4096, True), ("8B", "down", 4096, 14336, False),
          ("8B", "qkv", 6144, 4096, False), ("8B", "attn_output", 4096, 4096, False)]
KEYS = ("MQ_WARPS", "MQ_CHAINS", "MQ_AHEAD", "MQ_WA", "MQ_SUBN", "MQ_SHARE", "MQ_MINB", "MQ_XV", "MQ_ABL", "MQ_TL",
        "MQ_PF")
# Session 53's runs, one configuration set each (QF_SET; tuples in KEYS' order, the missing tail 0), the receipts
# spelling each configuration out by name:
#  1 v8 (MQ_WA 0) against v9 (MQ_WA 1); 2 (the default) v10's MQ_SUBN / MQ_SHARE and register budgets; 3 MQ_XV;
#  4 v9's ablations (MQ_ABL: timing only, the outputs are wrong); 5 v11's tile layout (MQ_TL 1); 6 the meta tiled
#  too (MQ_TL 2); 7 v12's L2 prefetch (MQ_PF); 8 short-lived warps (8 / 16 chains a tile)
SETS = {
    "1": [(4, 1, 1, 0), (8, 2, 1, 0), (4, 1, 1, 1), (4, 1, 2, 1), (8, 1, 1, 1), (4, 2, 1, 1), (4, 4, 1, 1),
          (8, 4, 1, 1), (8, 8, 1, 1), (8, 2, 2, 1), (4, 1, 3, 1)],
    "2": [(4, 1, 1, 0, 0, 0, 0), (4, 4, 1, 1, 0, 0, 0), (4, 4, 1, 1, 1, 0, 0), (4, 4, 1, 1, 0, 1, 0),
          (4, 4, 1, 1, 1, 1, 0), (4, 1, 1, 1, 0, 0, 0), (4, 1, 1, 1, 1, 1, 0), (4, 2, 1, 1, 0, 0, 0),
          (4, 2, 1, 1, 1, 1, 0), (8, 4, 1, 1, 1, 1, 0), (8, 8, 1, 1, 1, 1, 0), (2, 2, 1, 1, 1, 1, 0),
          (4, 4, 1, 1, 1, 1, 4), (4, 2, 1, 1, 1, 1, 4), (4, 4, 1, 1, 1, 1, 5), (4, 1, 1, 1, 1, 1, 4),
          (8, 4, 1, 1, 1, 1, 2), (4, 4, 2, 1, 1, 1, 4)],
    "3": [(4, 4, 1, 1, 0, 0, 0, 0), (4, 4, 1, 1, 0, 0, 0, 1), (4, 4, 1, 1, 0, 0, 4, 1), (4, 2, 1, 1, 0, 0, 4, 1),
          (4, 1, 1, 1, 0, 0, 4, 1), (4, 4, 1, 1, 1, 0, 4, 1), (8, 4, 1, 1, 0, 0, 2, 1), (4, 4, 2, 1, 0, 0, 4, 1),
          (4, 1, 1, 1, 0, 0, 0, 0), (4, 1, 1, 1, 0, 0, 0, 1)],
    "4": [(4, 4, 1, 1, 0, 0, 0, 0, a) for a in (0, 1, 2, 4, 8, 16, 32, 49, 14, 63)] +
         [(4, 1, 1, 1, 0, 0, 0, 0, a) for a in (0, 63)],
    "5": [(4, 4, 1, 1, 0, 0, 0, 0, 0, 0), (4, 4, 1, 1, 0, 0, 0, 0, 0, 1), (4, 2, 1, 1, 0, 0, 0, 0, 0, 1),
          (4, 1, 1, 1, 0, 0, 0, 0, 0, 1), (8, 4, 1, 1, 0, 0, 0, 0, 0, 1), (4, 4, 2, 1, 0, 0, 0, 0, 0, 1),
          (4, 4, 1, 1, 1, 0, 0, 0, 0, 1), (4, 4, 1, 1, 0, 0, 0, 0, 63, 1), (4, 1, 1, 1, 0, 0, 0, 0, 63, 1),
          (8, 8, 1, 1, 0, 0, 0, 0, 0, 1), (4, 4, 1, 1, 0, 0, 4, 0, 0, 1)],
    "6": [(4, 4, 1, 1, 0, 0, 0, 0, 0, 0), (4, 4, 1, 1, 0, 0, 0, 0, 0, 1), (4, 4, 1, 1, 0, 0, 0, 0, 0, 2),
          (4, 2, 1, 1, 0, 0, 0, 0, 0, 2), (4, 4, 1, 1, 0, 0, 0, 0, 63, 2), (4, 4, 1, 1, 0, 0, 0, 0, 63, 1),
          (4, 4, 1, 1, 1, 0, 0, 0, 0, 2), (4, 4, 2, 1, 0, 0, 0, 0, 0, 2), (4, 4, 1, 1, 0, 0, 4, 0, 0, 2)],
    "7": [(4, 4, 1, 1, 0, 0, 0, 0, 0, 2, 0), (4, 4, 1, 1, 0, 0, 0, 0, 0, 2, 1), (4, 4, 1, 1, 0, 0, 0, 0, 0, 2, 2),
          (4, 2, 1, 1, 0, 0, 0, 0, 0, 2, 2), (4, 2, 1, 1, 0, 0, 0, 0, 0, 2, 4), (4, 1, 1, 1, 0, 0, 0, 0, 0, 2, 4),
          (4, 4, 1, 1, 0, 0, 0, 0, 63, 2, 2), (4, 2, 1, 1, 0, 0, 0, 0, 63, 2, 4), (4, 1, 1, 1, 0, 0, 0, 0, 0, 2, 8),
          (4, 4, 1, 1, 1, 0, 0, 0, 0, 2, 2)],
    "8": [(4, 4, 1, 1, 0, 0, 0, 0, 0, 2), (8, 8, 1, 1, 0, 0, 0, 0, 0, 2), (16, 16, 1, 1, 0, 0, 0, 0, 0, 2),
          (16, 8, 1, 1, 0, 0, 0, 0, 0, 2), (8, 8, 1, 1, 0, 0, 0, 0, 63, 2), (16, 16, 1, 1, 0, 0, 0, 0, 63, 2),
          (16, 16, 1, 1, 1, 0, 0, 0, 0, 2)],
}
CONFIGS = [c + (0,) * (len(KEYS) - len(c)) for c in SETS[os.environ.get("QF_SET", "2")]]
if os.environ.get("QF_CONFIGS"):   # "W,C,A,...;..." in KEYS' order (a profiler's run: one configuration)
    CONFIGS = [c + (0,) * (len(KEYS) - len(c)) for c in
               (tuple(int(v) for v in x.split(",")) for x in os.environ["QF_CONFIGS"].split(";"))]
if os.environ.get("QF_OPS"):       # "gate_up,qkv"
    SHAPES = [sh for sh in SHAPES if sh[1] in os.environ["QF_OPS"].split(",")]


def _compile(c):
    import tile as TL
    return TL.compile_module(dict(zip(KEYS, c)), SRC)


def regs(log: str):
    import re
    return [int(v) for v in re.findall(r"Used (\d+) registers", log)], \
        [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]


def tile_rows(N: int, glu: bool) -> np.ndarray:
    """The weight rows of mv_qf.cu's 16-row tiles in A-row order (glu: gate rows 8t .. 8t + 7, then their up rows
    N + 8t ..; plain: rows 16t .. 16t + 15)."""
    if not glu:
        return np.arange(N)
    t8 = np.arange(N).reshape(-1, 1, 8)
    return np.concatenate([t8, t8 + N], axis=1).ravel()


def tile_layout(bulk: np.ndarray, N: int, K: int, glu: bool) -> np.ndarray:
    """mv_qf.cu's MQ_TL layout of a Q4_K bulk plane (rows x K/256 x 128 bytes): per 16-row tile (tile_rows) and
    superblock, [tig][half][A row][pair][8 B]."""
    nsb = K // 256
    x = bulk.reshape(-1, nsb * 128)[tile_rows(N, glu)].reshape(-1, 16, nsb, 2, 2, 4, 8)   # tile, row, sb, half, pair, tig, B
    return np.ascontiguousarray(x.transpose(0, 2, 5, 3, 1, 4, 6)).reshape(-1)


def tile_meta(meta: np.ndarray, N: int, K: int, glu: bool) -> np.ndarray:
    """mv_qf.cu's MQ_TL 2 meta: per 16-row tile and superblock the A rows' 16 meta bytes, [tile][sb][A row][16 B]."""
    nsb = K // 256
    x = meta.reshape(-1, nsb * 16)[tile_rows(N, glu)].reshape(-1, 16, nsb, 16)   # tile, A row, sb, byte
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(-1)


def ref_qf(raw: np.ndarray, K: int, xh16: np.ndarray, s2: np.ndarray, nr: int) -> np.ndarray:
    """float64 qf outputs of weight rows 0..nr-1 (memra.gpu.ops.qf.reference: sum_s d sc S1 - dmin m S2, S1 exact)."""
    from memra.gpu.ops.qf import reference
    return reference(raw[:nr], xh16, np.asarray(s2, np.float64))


def probe_args():
    """The probes' command line (qf_probe.py, gq_probe.py, qf2_probe.py): --out, --reps, --compile-only."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compile-only", action="store_true")
    return ap.parse_args()


def shape_weights(g, rng):
    """Per SHAPES entry: (op, rows, K, glu, N, raw, ws, base) — N output rows, raw random valid Q4_K rows, ws their
    uploads copied until the copies pass ROTATE bytes (at most 8), base the records' shape fields."""
    from memra.gpu.ops import matvec as M
    for model, op, rows, K, glu in SHAPES:
        raw = M.random_weight(Q4_K, rows, K, rng)
        ws = [M.upload_weight(g, raw, Q4_K) for _ in range(max(1, min(8, -(-ROTATE // raw.nbytes))))]
        base = {"model": model, "op": op, "type": "Q4_K", "rows": rows, "K": K, "glu": glu,
                "weight_bytes": ws[0].nbytes, "rotate": len(ws)}
        yield op, rows, K, glu, (rows // 2 if glu else rows), raw, ws, base


def probe_session(args, kind: str, src: Path, keys: tuple, mods: list, compile_fn, tag: str):
    """The set-up gq_probe.py and qf2_probe.py share: `mods` (tuples of `keys`' values) built from `src` in a process
    pool by compile_fn (a module-level function: (cubin, log)); with --compile-only their registers printed and None
    returned; else (g, table, emit, module): the device, the shipped H200 table, a JSONL writer appending to
    args.out (the compile record first) and module(m), m's prebuilt module (cached under `tag`)."""
    from concurrent.futures import ProcessPoolExecutor
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=max(1, min(12, os.cpu_count() or 1))) as ex:
        built = dict(zip(mods, ex.map(compile_fn, mods)))
    rec0 = {"kind": kind, "modules": len(built), "s": round(time.time() - t0, 1),
            "regs_spill": {str(m): regs(v[1]) for m, v in built.items()}}
    if args.compile_only:
        print(json.dumps(rec0))
        return None
    import tile as TL
    from memra.gpu.cuda import gpu
    g = gpu()
    table = json.loads(TABLE.read_text())
    out = open(args.out, "a")

    def emit(rec):
        rec = {"device": g.info.name, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **rec}
        print(json.dumps(rec)[:300], flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    emit(rec0)
    cache: dict = {}

    def module(m):
        return TL.prebuilt_module(g, cache, (tag, m), src.name, dict(zip(keys, m)), lambda m=m: built[m][0])
    return g, table, emit, module


def measure(g, rec: dict, run, ws: list, y, shape: tuple, bits: np.ndarray, ref: np.ndarray, nr: int, reps: int) -> dict:
    """One configuration of gq_probe.py / qf2_probe.py into rec: run(w) on a NaN-poisoned y (shape (nb, N)) — its
    outputs whose bits differ from `bits` (the one-row launches'), `rel` against the float64 `ref` on the first nr
    weight rows — then µs (time_us over the rotated weight copies ws) and GB/s; an exception as rec's error."""
    import tile as TL
    try:
        y.upload(np.full(shape[0] * shape[1], np.nan, np.float32))
        run(ws[0])
        g.sync()
        got = y.numpy().reshape(shape)
        rec["differ"] = int((got.view(np.uint32) != bits).sum())
        rec["rel"] = float(np.max(np.abs(got[:, :nr] - ref)) / np.max(np.abs(ref)))
        us = TL.time_us(g, [lambda w=w: run(w) for w in ws], reps, launches=max(24, 3 * len(ws)))
        rec.update(us=round(us, 2), gbps=round(ws[0].nbytes / us / 1e3, 1))
    except Exception as e:
        rec["error"] = str(e)[:300]
    return rec


def main() -> int:
    args = probe_args()
    got = probe_session(args, "qf_compile", SRC, KEYS, CONFIGS, _compile, "qf")
    if got is None:
        return 0
    g, table, emit, module = got
    import tile as TL
    from memra.gpu.ops import matvec as M
    from memra.gpu.ops import mvt as MVT
    from memra.gpu.q8 import Q8_SCALE
    from memra.tune.tables import lookup
    rng = np.random.default_rng(53)
    for op, rows, K, glu, N, raw, ws, base in shape_weights(g, rng):
        tls = tms = None
        if any(len(c) > 9 and c[9] for c in CONFIGS):
            bulk, meta = M.pack_planes(raw, Q4_K)
            tl = tile_layout(np.asarray(bulk), rows // 2 if glu else rows, K, glu)
            tls = [g.to_device(tl) for _ in ws]
            tm = tile_meta(np.asarray(meta), rows // 2 if glu else rows, K, glu)
            tms = [g.to_device(tm) for _ in ws]
        act = "silu" if glu else None
        nr = 32
        for nb in (1, 8):
            x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
            xh16 = x.astype(np.float16)
            s2 = xh16.astype(np.float32).reshape(nb, K // 32, 32).sum(-1, dtype=np.float32)
            xh = g.to_device(xh16.view(np.uint16).reshape(-1))
            xs2 = g.to_device(s2.reshape(-1))
            xq = g.empty((nb * K,), np.int8)
            xs = g.empty((nb * K // 32,), Q8_SCALE)
            M.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb * N,), np.float32)
            shape = f"cols={K},rows={rows},type=Q4_K"
            if nb == 1:
                c = lookup(table, "matvec_glu" if glu else "matvec", shape, nb)
                cfg, kern = (c.config if c else None), "mv_q8"

                def q8(w, cfg=cfg):
                    M.matvec(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, tuned=(lambda _n: cfg) if cfg else None)
            else:
                c = lookup(table, "mvt_glu" if glu else "mvt", shape, nb)
                cfg, kern = (c.config if c else None), "mvt"

                def q8(w, cfg=cfg):
                    MVT.mvt(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, config=cfg)
            us = TL.time_us(g, [lambda w=w: q8(w) for w in ws], args.reps, launches=max(24, 3 * len(ws)))
            emit({"kind": "time", **base, "nb": nb, "kernel": kern, "config": cfg, "us": round(us, 2),
                  "gbps": round(ws[0].nbytes / us / 1e3, 1)})
            # the reference: output rows 0..nr-1 (glu: gate rows 0..nr-1 and up rows N..N+nr-1)
            if glu:
                gt = ref_qf(raw[:nr], K, xh16, s2, nr)
                up = ref_qf(raw[N:N + nr], K, xh16, s2, nr)
                ref = gt / (1 + np.exp(-gt)) * up
            else:
                ref = ref_qf(raw, K, xh16, s2, nr)
            outs = {}
            for cf in CONFIGS:
                if K % (256 * cf[1]):
                    continue
                kernel = module(cf).kernel("mv_qf_glu" if glu else "mv_qf")
                tiles = (2 * N if glu else N) // (16 if cf[3] else 8)
                grid = (-(-tiles * cf[1] // cf[0]), 1, 1)

                def run(w, kernel=kernel, grid=grid, cf=cf, ws=ws, tls=tls, tms=tms):
                    b = tls[ws.index(w)] if len(cf) > 9 and cf[9] else w.bulk
                    m = tms[ws.index(w)] if len(cf) > 9 and cf[9] >= 2 else w.meta
                    a = ((b, m, xh, xs2, y, np.int32(N), np.int32(K), np.int32(nb), np.int32(1)) if glu
                         else (b, m, xh, xs2, y, np.uint64(0), np.int32(N), np.int32(K), np.int32(nb)))
                    g.launch(kernel, grid, (32 * cf[0], 1, 1), a)
                rec = {"kind": "time", **base, "nb": nb, "kernel": "mv_qf", "config": dict(zip(KEYS, cf))}
                try:
                    y.upload(np.full(nb * N, np.nan, np.float32))
                    run(ws[0])
                    g.sync()
                    got = y.numpy().reshape(nb, N)
                    outs[cf] = got.view(np.uint32).copy()
                    rel = float(np.max(np.abs(got[:, :nr] - ref)) / np.max(np.abs(ref)))
                    rec["rel"] = rel
                    rec["finite"] = bool(np.isfinite(got).all())
                    same = [o for o in outs if o[1] == cf[1] and o != cf]
                    if same:
                        rec["same_bits_as"] = str(same[0])
                        rec["differ"] = int((outs[same[0]] != outs[cf]).sum())
                    other = [o for o in outs if o[1] == cf[1] and o[3] != cf[3]]
                    if other:
                        rec["differ_wa"] = int((outs[other[0]] != outs[cf]).sum())
                    us = TL.time_us(g, [lambda w=w: run(w) for w in ws], args.reps, launches=max(24, 3 * len(ws)))
                    rec.update(us=round(us, 2), gbps=round(ws[0].nbytes / us / 1e3, 1))
                except Exception as e:
                    rec["error"] = str(e)[:300]
                emit(rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
