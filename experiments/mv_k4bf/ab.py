"""The Q4_K / Q5_K row scalars without branches (experiments/mv_k4bf/README.md): an A/B of the engine's q8 decode
kernels against a copy of kernels/ whose qtypes.cuh rowscal_k4 is BODY below, same configurations, same shapes.

rowscal_k4(meta, j) gives the 6-bit scales and mins of sub-blocks 2j and 2j + 1 (j = u & 3, a lane's unit). In
kernels/qtypes.cuh it calls scale_min_k4 twice, whose `if (j < 4)` and run-time byte selects compile to branches
that split a warp (lanes hold units of different j): ncu on the H100 (research/2026-12-07-session53/prof/) counts
~270 of the ~370 instructions of mv_q8_glu's unit loop (8B gate+up, two rows) in them, at 16 active threads. BODY
computes the same integers (both sub-blocks' bytes are adjacent in each scale word: one shift by 16 (j & 1), two
masks, one select on j >= 2; mv_k4bf/check.py compares every case on the CPU) with no branch.

Per shape (the 8B Q4_K_M's Q4_K matmuls; its Q6_K output as a control the edit does not touch) and row count (mv_q8
at 1, mvt at 8): the table's configuration, both arms alternating in one process, µs (median of CUDA-graph
launches), and the outputs' bits against each other (`differ`, must be 0).

    source .whl/setup.sh && python3 experiments/mv_k4bf/ab.py --out $OUT/k4bf.jsonl
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

COPY = Path("/tmp/mv_k4bf/kernels")
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"
ROTATE = 160 << 20
Q4_K, Q6_K = 12, 14
TN = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
SHAPES = [("8B", "gate_up", Q4_K, 2 * 14336, 4096, True), ("8B", "down", Q4_K, 4096, 14336, False),
          ("8B", "qkv", Q4_K, 6144, 4096, False), ("8B", "attn_output", Q4_K, 4096, 4096, False),
          ("8B", "down6", Q6_K, 4096, 14336, False)]

BODY = """MEMRA_DEVICE RK4 rowscal_k4(const uint4& meta, int j) {
    // sub-blocks 2j, 2j + 1 are bytes 2 (j & 1) and 2 (j & 1) + 1 of each scale word: both at once, no branch
    // (the integers of scale_min_k4(meta, 2j / 2j + 1): j < 2 the low 6 bits of scales[i], scales[4 + i]; j >= 2
    // the low / high nibble of scales[8 + i - 4] with the top 2 bits of scales[i - 4] / scales[i])
    const int sh = 16 * (j & 1);
    const uint32_t y = meta.y >> sh, z = meta.z >> sh, w = meta.w >> sh;
    const uint32_t sc = j >= 2 ? ((w & 0x0F0Fu) | ((y >> 2) & 0x3030u)) : (y & 0x3F3Fu);
    const uint32_t mn = j >= 2 ? (((w >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u)) : (z & 0x3F3Fu);
    RK4 q;
    q.sc0 = (int)(sc & 0xFFu); q.sc1 = (int)((sc >> 8) & 0xFFu);
    q.m0 = (int)(mn & 0xFFu); q.m1 = (int)((mn >> 8) & 0xFFu);
    q.d = f16_to_f32((uint16_t)meta.x);
    q.dmin = f16_to_f32((uint16_t)(meta.x >> 16));
    return q;
}
"""


def make_copy() -> Path:
    """kernels/ copied to /tmp/mv_k4bf/kernels with rowscal_k4's body replaced by BODY."""
    if COPY.exists():
        shutil.rmtree(COPY)
    shutil.copytree(ROOT / "kernels", COPY)
    p = COPY / "qtypes.cuh"
    src = p.read_text()
    a = src.index("MEMRA_DEVICE RK4 rowscal_k4(const uint4& meta, int j) {")
    b = src.index("\n}\n", a) + 3
    p.write_text(src[:a] + BODY + src[b:])
    return COPY


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="A/B alternations per shape and row count")
    args = ap.parse_args()
    import tile as TL
    from memra.gpu.compile import compile_cubin
    from memra.gpu.cuda import Module, gpu
    from memra.gpu.ops import matvec as M
    from memra.gpu.ops import mvt as MVT
    from memra.gpu.q8 import Q8_SCALE
    from memra.tune.tables import lookup

    root = make_copy()
    g = gpu()
    table = json.loads(TABLE.read_text())
    out = open(args.out, "a")
    orig = g.module
    mods: dict = {}

    def module_b(kernel_file, defines=None):   # the B arm: the copy's kernels
        defines = dict(defines or {})
        key = (kernel_file, tuple(sorted((k, str(v)) for k, v in defines.items())))
        if key not in mods:
            mods[key] = Module(g, kernel_file, defines, compile_cubin(kernel_file, g.info.arch, defines, root=root))
        return mods[key]

    def emit(rec):
        rec = {"device": g.info.name, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **rec}
        print(json.dumps(rec)[:300], flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    rng = np.random.default_rng(53)
    for model, op, t, rows, K, glu in SHAPES:
        N = rows // 2 if glu else rows
        raw = M.random_weight(t, rows, K, rng)
        ws = [M.upload_weight(g, raw, t) for _ in range(max(1, min(8, -(-ROTATE // raw.nbytes))))]
        act = "silu" if glu else None
        for nb in (1, 8):
            x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
            xq = g.empty((nb * K,), np.int8)
            xs = g.empty((nb * K // 32,), Q8_SCALE)
            M.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb * N,), np.float32)
            shape = f"cols={K},rows={rows},type={TN[t]}"
            if nb == 1:
                c = lookup(table, "matvec_glu" if glu else "matvec", shape, nb)
                cfg = c.config if c else None
                kernel = "mv_q8"

                def fn(w, cfg=cfg, xq=xq, xs=xs, y=y, nb=nb):
                    M.matvec(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, tuned=(lambda _n: cfg) if cfg else None)
            else:
                c = lookup(table, "mvt_glu" if glu else "mvt", shape, nb)
                cfg = c.config if c else None
                kernel = "mvt"

                def fn(w, cfg=cfg, xq=xq, xs=xs, y=y, nb=nb):
                    MVT.mvt(g, w, y, xq=xq, xs=xs, nb=nb, glu=act, config=cfg)
            bits = {}
            times = {"A": [], "B": []}
            for rnd in range(args.rounds):
                for arm in ("A", "B"):
                    g.module = orig if arm == "A" else module_b
                    try:
                        if rnd == 0:
                            y.upload(np.full(nb * N, np.nan, np.float32))
                            fn(ws[0])
                            g.sync()
                            bits[arm] = y.numpy().view(np.uint32).copy()
                        times[arm].append(TL.time_us(g, [lambda w=w: fn(w) for w in ws], args.reps,
                                                     launches=max(24, 3 * len(ws))))
                    finally:
                        g.module = orig
            a, b = float(np.median(times["A"])), float(np.median(times["B"]))
            emit({"kind": "ab", "model": model, "op": op, "type": TN[t], "rows": rows, "K": K, "glu": glu, "nb": nb,
                  "kernel": kernel, "config": cfg, "weight_bytes": ws[0].nbytes, "us_A": round(a, 2),
                  "us_B": round(b, 2), "B_vs_A_pct": round(100 * (b / a - 1), 2), "runs_A": [round(v, 2) for v in
                  times["A"]], "runs_B": [round(v, 2) for v in times["B"]],
                  "gbps_B": round(ws[0].nbytes / b / 1e3, 1), "differ": int((bits["A"] != bits["B"]).sum())})
        del ws
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
