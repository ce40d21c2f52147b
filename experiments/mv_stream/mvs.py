"""mvs.cu (bulk-copy streamed one-row matvec, experiments/mv_stream/README.md) against the engine's mv_q8.

Per shape (the 8B Q4_K_M's, the 1B Q4_0's; random valid blocks, weights rotated through more bytes than L2): mv_q8 at
the shipped H200 table's configuration, then mvs.cu at every configuration in CONFIGS that fits, at one activation
row: µs (median of CUDA-graph launches) and GB/s; per configuration its output's bits against mv_q8's (`differ`:
outputs whose bits differ, must be 0: the same arithmetic).

    source .whl/setup.sh && python3 experiments/mv_stream/mvs.py --out $OUT/mvs.jsonl [--quick]
    python3 experiments/mv_stream/mvs.py --compile-only     # CPU: build every configuration (no device)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))

BUILD = Path("/tmp/mv_stream")
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"
ROTATE = 160 << 20
Q4_0, Q8_0, Q4_K, Q6_K = 2, 8, 12, 14
TN = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
# (model, op, type, weight rows (glu: gate and up stacked), K, glu)
SHAPES = [
    ("8B", "gate_up", Q4_K, 2 * 14336, 4096, True),
    ("8B", "down", Q6_K, 4096, 14336, False),
    ("8B", "qkv", Q4_K, 6144, 4096, False),
    ("8B", "attn_output", Q4_K, 4096, 4096, False),
    ("8B", "output", Q6_K, 128256, 4096, False),
    ("1B", "gate_up", Q4_0, 2 * 8192, 2048, True),
    ("1B", "down", Q4_0, 2048, 8192, False),
    ("1B", "qkv", Q4_0, 3072, 2048, False),
]
# (MVS_WARPS, MVS_ROWS, MVS_STAGES, CPS: resident blocks an SM the grid is sized for)
# (session 53's first run: every configuration slower than mv_q8; the second adds the Q6_K down's, which did not fit)
CONFIGS = [(4, 1, 4, 2), (4, 1, 3, 3), (8, 1, 3, 2), (4, 2, 3, 2), (2, 1, 4, 4), (8, 1, 2, 3), (4, 1, 2, 4),
           (2, 2, 3, 3), (2, 1, 2, 4), (4, 1, 2, 2), (2, 1, 3, 3), (8, 1, 2, 2)]
KEYS = ("MVS_WARPS", "MVS_ROWS", "MVS_STAGES")
SMEM_MAX = 227 * 1024   # an H100 / H200 SM's shared memory for blocks (228 KB less 1 KB a block reserved)


def build_dir(k4bf: bool = False) -> Path:
    """/tmp/mv_stream: mvs.cu and qtypes_s.cuh (kernels/qtypes.cuh with the weight loaders' __ldg plain loads; k4bf:
    and experiments/mv_k4bf's branch-free rowscal_k4)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    src = (ROOT / "kernels" / "qtypes.cuh").read_text()
    if k4bf:
        sys.path.insert(0, str(ROOT / "experiments" / "mv_k4bf"))
        import ab
        a = src.index("MEMRA_DEVICE RK4 rowscal_k4(const uint4& meta, int j) {")
        src = src[:a] + ab.BODY + src[src.index("\n}\n", a) + 3:]
    a = src.index("MEMRA_DEVICE uint4 ld16(")
    b = src.index("template <class L>", a)
    head = src[a:b]
    assert head.count("__ldg(") == 4, "qtypes.cuh's loaders changed: review mvs.py's edit"
    (BUILD / "qtypes_s.cuh").write_text(src[:a] + head.replace("__ldg(", "ldp(") + src[b:])
    pre = ("template <class P> __device__ __forceinline__ P ldp(const P* p) { return *p; }   // mvs.py: plain load\n")
    text = (BUILD / "qtypes_s.cuh").read_text()
    i = text.index("MEMRA_DEVICE uint4 ld16(")
    (BUILD / "qtypes_s.cuh").write_text(text[:i] + pre + text[i:])
    shutil.copy(Path(__file__).with_name("mvs.cu"), BUILD / "mvs.cu")
    return BUILD / "mvs.cu"


def stage_bytes(t: int, K: int, glu: bool, c) -> int:
    from memra.gpu.ops import matvec as M
    _, blk, bb, _, _ = M.TYPES[t]
    bulk, meta = M.pack_planes(np.zeros((1, K // blk * bb), np.uint8), t)
    nrw = c[0] * c[1] * (2 if glu else 1)
    return (nrw * (bulk.nbytes + meta.nbytes) + 127) // 128 * 128


def fits(t, rows, K, glu, c) -> bool:
    N = rows // 2 if glu else rows
    smem = c[2] * stage_bytes(t, K, glu, c) + 16 * c[2]
    return N % (c[0] * c[1]) == 0 and smem * c[3] <= SMEM_MAX and smem <= SMEM_MAX


def compile_all(jobs, k4bf: bool = False):
    """{(t, c[:3]): (cubin, log)} for every (type, configuration), in parallel."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    src = build_dir(k4bf)
    keys = sorted(set(jobs))
    with ProcessPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as ex:
        outs = list(ex.map(_compile, [(src, t, c) for t, c in keys]))
    return dict(zip(keys, outs))


def _compile(arg):
    import tile as TL
    src, t, c = arg
    return TL.compile_module({"MV_TYPE": t, **dict(zip(KEYS, c))}, src)


def regs(log: str) -> list:
    import re
    return [(int(a), int(b)) for a, b in zip(re.findall(r"Used (\d+) registers", log),
                                             re.findall(r"(\d+) bytes spill stores", log))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the 8B gate+up and down only")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--k4bf", action="store_true", help="mvs.cu with experiments/mv_k4bf's rowscal_k4 (mv_q8 as is)")
    args = ap.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    jobs = [(t, c[:3]) for _, _, t, rows, K, glu in shapes for c in CONFIGS if fits(t, rows, K, glu, c)]
    t0 = time.time()
    built = compile_all(jobs, args.k4bf)
    info = {f"{TN[t]}:{c}": regs(v[1]) for (t, c), v in built.items()}
    if args.compile_only:
        print(json.dumps({"kind": "mvs_compile", "modules": len(built), "s": round(time.time() - t0, 1),
                          "regs_spill": info}))
        return 0

    import tile as TL
    from memra.gpu.cuda import gpu
    from memra.gpu.ops import matvec as M
    from memra.gpu.q8 import Q8_SCALE
    from memra.tune.tables import lookup
    g = gpu()
    table = json.loads(TABLE.read_text())
    out = open(args.out, "a")
    sms = g.info.sm_count

    def emit(rec):
        rec = {"device": g.info.name, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **rec}
        line = json.dumps(rec)
        print(line[:300], flush=True)
        out.write(line + "\n")
        out.flush()
    emit({"kind": "mvs_compile", "modules": len(built), "s": round(time.time() - t0, 1), "regs_spill": info,
          "sms": sms})
    rng = np.random.default_rng(53)
    cache: dict = {}
    for model, op, t, rows, K, glu in shapes:
        N = rows // 2 if glu else rows
        raw = M.random_weight(t, rows, K, rng)
        nw = max(1, min(8, -(-ROTATE // raw.nbytes)))
        ws = [M.upload_weight(g, raw, t) for _ in range(nw)]
        x = (rng.standard_normal((1, K)) * 2).astype(np.float32)
        xq = g.empty((K,), np.int8)
        xs = g.empty((K // 32,), Q8_SCALE)
        M.quantize_q8(g, g.to_device(x), xq, xs, 1)
        y0 = g.empty((N,), np.float32)
        y1 = g.empty((N,), np.float32)
        act = "silu" if glu else None
        base = {"model": model, "op": op, "type": TN[t], "rows": rows, "K": K, "glu": glu,
                "weight_bytes": ws[0].nbytes, "rotate": nw}
        c = lookup(table, "matvec_glu" if glu else "matvec", f"cols={K},rows={rows},type={TN[t]}", 1)
        cfg = c.config if c else None

        def q8(w):
            M.matvec(g, w, y0, xq=xq, xs=xs, nb=1, glu=act, tuned=(lambda _n: cfg) if cfg else None)
        us = TL.time_us(g, [lambda w=w: q8(w) for w in ws], args.reps, launches=max(24, 3 * len(ws)))
        emit({"kind": "time", **base, "kernel": "mv_q8", "config": cfg, "us": round(us, 2),
              "gbps": round(ws[0].nbytes / us / 1e3, 1)})
        q8(ws[0])
        ref = y0.numpy().view(np.uint32).copy()
        for cf in CONFIGS:
            if not fits(t, rows, K, glu, cf):
                continue
            key = (t, cf[:3])
            mod = TL.prebuilt_module(g, cache, key, "mvs.cu", {"MV_TYPE": t, **dict(zip(KEYS, cf[:3]))},
                                     lambda: built[key][0])
            kern = mod.kernel("mvs_q8_glu" if glu else "mvs_q8")
            smem = cf[2] * stage_bytes(t, K, glu, cf) + 16 * cf[2]
            kern.allow_shared(smem)
            grid = (min(N // (cf[0] * cf[1]), sms * cf[3]), 1, 1)
            block = (32 * (cf[0] + 1), 1, 1)

            def run(w, kern=kern, grid=grid, block=block, smem=smem):
                g.launch(kern, grid, block, (w.bulk, w.meta, xq, xs, y1, np.uint64(0), np.int32(N), np.int32(K),
                                             np.int32(1)), shmem=smem)
            rec = {"kind": "time", **base, "kernel": "mvs", "k4bf": args.k4bf, "config": dict(zip(KEYS + ("CPS",), cf)),
                   "grid": grid[0], "smem": smem}
            try:
                y1.upload(np.full(N, np.nan, np.float32))
                run(ws[0])
                g.sync()
                got = y1.numpy().view(np.uint32)
                rec["differ"] = int((got != ref).sum())
                us = TL.time_us(g, [lambda w=w: run(w) for w in ws], args.reps, launches=max(24, 3 * len(ws)))
                rec.update(us=round(us, 2), gbps=round(ws[0].nbytes / us / 1e3, 1))
            except Exception as e:   # a launch failure is recorded, the run goes on
                rec["error"] = str(e)[:300]
            emit(rec)
        del ws
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
