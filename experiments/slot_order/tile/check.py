"""The slot order in the tile GEMM on a GPU (tile_land/gemm_tile.cu + gemm_tile.patch, written by ab.sh into
the call's kernels/ as gemm_tile.cu): bit checks of GT_ORDER 1 against memra.gpu.chain.slot_chain and of
GT_ORDER 0 against memra.gpu.chain.chain (tile_land's kernel-check cases), the canary, then the 8B shapes
at 64 and 512 rows: GT_ORDER 0, GT_ORDER 1 (per type its register-safe variant) and memra's gemm.cu.

    source .whl/setup.sh && python3 experiments/slot_order/tile/check.py --out $OUT/slot-tile.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments" / "tile_land"), str(ROOT / "experiments" / "gemm_tile")]

KERNEL = "gemm_tile.cu"
UMAX = 512
SLOT_TYPES = (2, 8, 12)   # GT_ORDER 1 is not built for Q6_K
SHAPES = (("Q4_K gate+up", 12, 28672, 4096, True), ("Q4_K qkv", 12, 6144, 4096, False),
          ("Q4_K o", 12, 4096, 4096, False), ("Q6_K down", 14, 4096, 14336, False),
          ("Q4_0 gate+up", 2, 28672, 4096, True), ("Q8_0 gate+up", 8, 28672, 4096, True))
NBS = (64, 512)


def slot_extra(t: int, nb: int) -> dict:
    """GT_ORDER 1's extra tunables: Q4_K keeps the fold in shared memory where it fits (the 2 x 2-warp
    3-stage tile of <= 64 rows: 254 registers, 0 spills) and in registers at 512 rows (255, 40 B spill;
    the 2 x 4 tile has no room for 64 KB of fold); Q4_0 / Q8_0 in registers (<= 255, 0 spills)."""
    return {"GT_ORDER": 1, "GT_TOT": 1 if (t == 12 and nb <= 64) else 0}


def smem_bytes(L, t: int, cfg: dict) -> int:
    """launch.py's formula + GT_ORDER 1's: Q4_K meta 64 B a row and stage (not 16), the u16 position
    table, GT_TOT 1's fold (64 floats a thread)."""
    s = L.smem_bytes(t, {k: v for k, v in cfg.items() if k in L.default_config(t)})
    if cfg.get("GT_ORDER", 0):
        bm, bn, nt = L.tile(t, cfg)
        s += (int(cfg["GT_STAGES"]) * bm * 48 if t == 12 else 0) + 2 * UMAX + (64 * 4 * nt if cfg.get("GT_TOT") else 0)
    return s


def run(g, L, w, y, xq, xs, nb, cfg, glu=None, residual=None, canary=0):
    t = w.ggml_type
    N, K = (w.rows // 2 if glu else w.rows), w.K
    if cfg.get("GT_ORDER") and K // 64 > UMAX:
        raise ValueError("K > 64 GT_UMAX")
    L.check(t, {k: v for k, v in cfg.items() if k in L.default_config(t)}, N, K, nb, bool(glu))
    bm, bn, nt = L.tile(t, cfg)
    obm = bm // 2 if glu else bm
    d = {"MV_TYPE": t, **cfg}
    if canary:
        d["MEMRA_CANARY"] = canary
    k = g.module(KERNEL, d).kernel("gemm_tile_glu" if glu else "gemm_tile")
    g.launch(k, (N // obm, -(-nb // bn), 1), (nt, 1, 1),
             (w.bulk, w.meta, xq, xs, y, residual if residual is not None else np.uint64(0),
              np.int32(N), np.int32(K), np.int32(nb), np.int32({None: 0, "silu": 1, "gelu": 2}[glu])),
             shmem=smem_bytes(L, t, cfg), pdl=True)


def slot_case(g, L, GT, rng, t, N, K, nb, glu=None, alias=False, canary=0):
    """GT_ORDER 1 on random GGUF rows: plain outputs = slot_chain bit for bit; glu = act_mul of the plain
    gate / up outputs; residual (aliasing y) = fl(slot_chain + r)."""
    from memra.gpu import chain as CH
    from memra.gpu.ops import act as ACT
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

    cfg = {**GT.launch_config(t, nb), **slot_extra(t, nb)}
    rows = 2 * N if glu else N
    raw = MV.random_weight(t, rows, K, rng)
    w = MV.upload_weight(g, raw, t)
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
    q, s = quantize_q8_ref(x)
    want = CH.slot_chain(raw, t, q, s["d"], s["s"])
    name = f"slot {MV.TYPES[t][0]} nb={nb} {N}x{K}{' glu-' + glu if glu else ''}{' +res(alias)' if alias else ''}" \
           f"{' canary' if canary else ''} {cfg}"
    yp = g.empty((nb, rows), np.float32)
    yp.poison()
    run(g, L, w, yp, xq, xs, nb, cfg, canary=canary)
    g.sync()
    got = yp.numpy()
    bad = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
    chain_eq = int(np.count_nonzero(got.view(np.uint32) == CH.chain(raw, t, q, s["d"], s["s"]).view(np.uint32))) \
        if rows * nb <= 64 * 1024 else -1
    if bad:
        return name, False, f"{bad} of {got.size} differ from slot_chain (max |d| {np.abs(got - want).max():.3g})"
    if not glu and not alias:
        return name, True, f"= slot_chain bit for bit ({chain_eq} of {got.size} also equal the chain's bits)"
    res = rng.standard_normal((nb, N)).astype(np.float32)
    if glu:
        ref = g.empty((nb, N), np.float32)
        ACT.act_mul(g, yp.view(np.float32, (nb * rows,), 0), yp.view(np.float32, (nb * rows - N,), 4 * N), ref,
                    N, nb, {"silu": "silu", "gelu": "gelu_tanh"}[glu], gate_stride=rows, up_stride=rows, out_stride=N)
        g.sync()
        want_out = ref.numpy()
    else:
        want_out = (want + res).astype(np.float32)
    y = g.to_device(res) if alias else g.empty((nb, N), np.float32)
    if not alias:
        y.poison()
    run(g, L, w, y, xq, xs, nb, cfg, glu=glu, residual=y if alias else None, canary=canary)
    g.sync()
    bad = int(np.count_nonzero(y.numpy().view(np.uint32) != want_out.view(np.uint32)))
    return name, not bad, (f"{bad} of {y.numpy().size} differ" if bad else "= reference bit for bit")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="slot-tile.jsonl")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from memra.gpu import cuda
    from memra.gpu.compile import compile_many
    from memra.gpu.ops import gemm as GEMM
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE
    import launch as L
    import ops_gemm_tile as GT
    import tile as T

    g = cuda.gpu()
    out = open(args.out, "a")
    rng = np.random.default_rng(17)
    t0 = time.perf_counter()
    # every tile module of this run, compiled in parallel into the cubin cache first
    jobs = []
    for t in (2, 8, 12, 14):
        for nb in NBS:
            jobs.append((KERNEL, g.info.arch, {"MV_TYPE": t, **GT.launch_config(t, nb)}))
            if t in SLOT_TYPES:
                jobs.append((KERNEL, g.info.arch, {"MV_TYPE": t, **GT.launch_config(t, nb), **slot_extra(t, nb)}))
    jobs.append((KERNEL, g.info.arch, {"MV_TYPE": 12, **GT.launch_config(12, 33), **slot_extra(12, 33), "MEMRA_CANARY": 1}))
    for j, err, sec in compile_many(jobs):
        if err:
            print("COMPILE", j[2], err[-2000:], flush=True)
    print(f"compiled {len(jobs)} modules at {time.perf_counter() - t0:.1f} s", flush=True)

    fails = 0

    def rec(kind, name, ok, detail, canary=False):
        nonlocal fails
        ok = (not ok) if canary else ok
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {kind} {'canary ' if canary else ''}{name}: {detail}", flush=True)
        out.write(json.dumps({"kind": kind, "name": name, "canary": canary, "ok": bool(ok), "detail": detail}) + "\n")

    # GT_ORDER 1 against slot_chain: small (K = 1024: one unit a slot, 16 slots empty) and mid shapes
    # (K = 4096: 2 units a slot; 14336: 7, slot ends inside stages), nb 1 / 7 / 64+, glu, residual
    cases = []
    for t in SLOT_TYPES:
        cases += [(t, 128, 1024, 1, None, False), (t, 256, 4096, 7, None, False), (t, 128, 14336, 65, None, False),
                  (t, 128, 4096, 130, None, True), (t, 128, 2048, 33, "silu", False), (t, 256, 4096, 64, "gelu", False)]
    cases += [(12, 128, 4096, 512, "silu", False), (2, 256, 14336, 16, None, True)]
    for t, N, K, nb, glu, alias in cases:
        try:
            rec("slot", *slot_case(g, L, GT, rng, t, N, K, nb, glu, alias))
        except Exception as e:   # noqa: BLE001 - report and go on
            rec("slot", f"{t} {N}x{K} nb={nb}", False, repr(e)[:300])
    rec("slot", *slot_case(g, L, GT, rng, 12, 128, 4096, 33, canary=1), canary=True)
    # GT_ORDER 0 (this file's default) still the chain: tile_land's kernel-check family, one case a type and nb
    for t in (2, 8, 12, 14):
        for nb, glu, alias in ((9, None, False), (64, "silu", False), (130, None, True)):
            o = GT.check_case(g, rng, t, nb, glu, alias)
            rec("chain", o.name, o.ok, o.detail)
    print(f"checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    table = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())["entries"]
    res = {}
    for name, t, rows, K, glu in SHAPES:
        raw = MV.random_weight(t, rows, K, rng)
        w0 = MV.upload_weight(g, raw, t)
        sets = max(2, -(-3 * int(g.info.l2_bytes) // w0.nbytes))
        ws = [w0] + [MV.upload_weight(g, raw, t) for _ in range(sets - 1)]
        N = rows // 2 if glu else rows
        act = "silu" if glu else None
        for nb in NBS:
            x = rng.standard_normal((nb, K)).astype(np.float32)
            xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
            MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb, N), np.float32)
            key = f"cols={K},rows={rows},type={MV.TYPES[t][0]}"
            e = table.get("gemm_glu" if glu else "gemm", {}).get(key, {})
            ent = e.get(str(nb)) or e.get(str(max(int(b) for b in e))) if e else None
            mcfg = ent["config"] if ent else None
            c0 = GT.launch_config(t, nb)
            impls = [("order0", c0)] + ([("order1", {**c0, **slot_extra(t, nb)})] if t in SLOT_TYPES else [])
            fns = [(i, (lambda c: lambda k: run(g, L, ws[k], y, xq, xs, nb, c, glu=act))(c)) for i, c in impls]
            fns.append(("gemm.cu", lambda k: GEMM.gemm(g, ws[k], y, xq=xq, xs=xs, nb=nb, glu=act, config=mcfg)))
            for impl, fn in fns:
                us = T.time_us(g, [lambda k=k: fn(k) for k in range(sets)], args.reps)
                res[(name, nb, impl)] = us
                print(f"time  {name:14s} nb={nb:4d} {impl:8s} {us:9.1f} us", flush=True)
                out.write(json.dumps({"kind": "time", "shape": name, "type": MV.TYPES[t][0], "rows": rows, "K": K,
                                      "glu": glu, "nb": nb, "impl": impl, "us": us,
                                      "config": dict(impls)[impl] if impl != "gemm.cu" else mcfg}) + "\n")
        ws.clear()
    print(f"\n{'shape':14s} {'nb':>4s} {'order0':>9s} {'order1':>9s} {'gemm.cu':>9s} {'o1/o0':>6s} {'gemm/o1':>7s} {'gemm/o0':>7s}")
    for name, *_ in SHAPES:
        for nb in NBS:
            a, b, c = (res.get((name, nb, i)) for i in ("order0", "order1", "gemm.cu"))
            f = lambda v: f"{v:9.1f}" if v else f"{'-':>9s}"   # noqa: E731
            r = lambda p, q: f"{p / q:6.3f}" if p and q else f"{'-':>6s}"   # noqa: E731
            print(f"{name:14s} {nb:4d} {f(a)} {f(b)} {f(c)} {r(b, a)} {r(c, b):>7s} {r(c, a):>7s}")
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
