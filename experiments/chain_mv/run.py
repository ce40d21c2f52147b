#!/usr/bin/env python3
"""run.py — chain_mv.cu on the device: bit-exact checks against the chain reference, timing vs memra's matvec.

    python3 experiments/chain_mv/run.py --compile-only   # CPU: NVRTC every configuration (regs, spills, smem)
    python3 experiments/chain_mv/run.py --mock           # CPU: the whole device run on a mock device (small shapes)
    python3 experiments/chain_mv/run.py                  # device (H200), via ab.sh

Device run: random valid Q4_K weights (memra's MV.random_weight) uploaded in planes (MV.upload_weight),
activations quantized on the device by memra's quantize_q8 and read back (the chain reference takes the
kernel's exact inputs). Checks, y poisoned (NaN) first: every configuration on small shapes (partial
row blocks, a partial K tile, batch configurations at nb < CM_B) and on the 8B shapes (a subset of
rows: the first and last REF_ROWS): bit-exact against chain_ref.chain_ref (the float32 chain in
numpy, exact fma) and, as a sanity check, within 1e-5 of the float64 product. Timing (batch 1): CUDA
events around each launch, weights rotated over copies > 3x the 60 MB L2, median of --reps, beside
memra's matvec with the H200 table's configuration for the shape (tune/defaults/nvidia-h200.json,
'matvec'; for the 28672 x 4096 gate + up: 'matvec_glu', i.e. mv_q8_glu, plus the plain mv_q8 on the
same 28672 rows). JSON lines to $OUT/chain-mv.jsonl. Exit 1 on a failed check, 2 on an error.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import chain_ref as CR  # noqa: E402
import tile as T  # noqa: E402  (gemm_tile's host code: compile_module, time_us, jsonl_writer)

SRC = HERE / "chain_mv.cu"
Q4_K = 12
L2_BYTES = 60 << 20
REF_ROWS = 256
# (name, defines): batch 1 configurations, then batched ones (checked; timed at nb = CM_B).
# v1 (CM_V2 0): the session-15 kernel, grid = one block a row group. v2 (CM_V2 1): the persistent
# (group, tile) stream, grid = min(groups, CM_GPS x SMs) (CM_GPS defaults to CM_MINB; a define the
# kernel ignores); CM_ASYNC: cp.async weight ring; CM_XS: activation tiles staged in shared memory
# once a block; CM_NCW: chain warps (v2's shared memory is all dynamic); CM_GLU 1: gate + up
# (timed on the gate + up shape only), CM_GLU 2: its raw chains (checked only, never timed).
V2 = {"CM_V2": 1}
CONFIGS = (("nw8", {"CM_NW": 8}),
           ("p32", {**V2, "CM_NW": 8}),
           ("p16", {**V2, "CM_NW": 8, "CM_CR": 16, "CM_MINB": 2}),
           ("a16pf2", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2}),
           ("a16pf1x3", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 1, "CM_MINB": 3}),
           ("a32pf2", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 32, "CM_PF": 2}),
           ("a8pf2x4", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 8, "CM_PF": 2, "CM_MINB": 4}),
           ("a16xs", {**V2, "CM_ASYNC": 1, "CM_XS": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2}),
           ("g16", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2, "CM_GLU": 1}),
           ("g16raw", {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2, "CM_GLU": 2}),
           ("b8nw4", {"CM_NW": 4, "CM_B": 8}),
           ("b8x4", {**V2, "CM_ASYNC": 1, "CM_XS": 1, "CM_NW": 4, "CM_B": 8, "CM_CR": 4, "CM_PF": 2, "CM_GPS": 2}),
           ("b8x8", {**V2, "CM_ASYNC": 1, "CM_XS": 1, "CM_NW": 8, "CM_NCW": 2, "CM_B": 8, "CM_CR": 8, "CM_PF": 2}))
# 8B shapes (rows, K, memra table kernel): q/k/v o 4096x4096, fused qkv 6144x4096, down 4096x14336,
# gate + up 28672x4096 (memra: matvec_glu)
SHAPES = ((4096, 4096, "matvec"), (6144, 4096, "matvec"), (4096, 14336, "matvec"), (28672, 4096, "matvec_glu"))
MOCK_SHAPES = ((96, 1024, "matvec"), (64, 2304, "matvec"), (64, 1024, "matvec_glu"))


def compile_module(defs: dict) -> tuple[bytes, str]:
    return T.compile_module(defs, SRC)


def ptx_info(log: str) -> dict:
    if "Compiling entry function 'chain_mv'" not in log:   # no ptxas report (seen on a warm machine)
        return {"regs": -1, "spill": 0, "smem": -1}
    part = log.split("Compiling entry function 'chain_mv'")[1]
    sp = re.search(r"(\d+) bytes spill stores", part)
    sm = re.search(r"(\d+) bytes smem", part)
    return {"regs": int(re.search(r"Used (\d+) registers", part).group(1)), "spill": int(sp.group(1)) if sp else 0,
            "smem": int(sm.group(1)) if sm else 0}


def table_config(kernel: str, rows: int, K: int) -> dict | None:
    """The H200 table's tunables for memra's matvec at batch 1 (None: memra's built-in default)."""
    d = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())["entries"]
    N = rows // 2 if kernel == "matvec_glu" else rows
    for key in (f"cols={K},rows={N},type=Q4_K", f"cols={K},rows={rows},type=Q4_K"):
        e = d.get(kernel, {}).get(key, {}).get("1")
        if e:
            from memra.gpu.ops import matvec as MV   # a table entry lists only the tunables it swept: the built-in default under it
            return {**MV.default_config(Q4_K, "q8", N, K, 1, kernel == "matvec_glu"), **e["config"]}
    return None


def glu_of(defs: dict) -> int:
    return int(defs.get("CM_GLU", 0))


def dyn_smem(defs: dict) -> int:
    """v2: all its shared memory is dynamic: the P / X double buffers (4 (2 chains + 2 CM_B) CM_PS bytes),
    CM_XS's activation tiles (2 CM_B x 32 x 80 B) and CM_ASYNC's ring (CM_NBUF x CM_NW x CM_RPW x 1536 B)."""
    if not int(defs.get("CM_V2", 0)):
        return 0
    nw, b, cr, rpw = CR.kdefs(defs)
    n = 4 * (2 * cr * b + 2 * b) * CR.PS
    if int(defs.get("CM_XS", 0)):
        n += 2 * b * 32 * 80
    if int(defs.get("CM_ASYNC", 0)):
        n += (int(defs.get("CM_PF", 1)) + 1) * nw * rpw * 1536
    return n


def threads(defs: dict) -> int:
    return 32 * (CR.kdefs(defs)[0] + int(defs.get("CM_NCW", 1)))


def launch_shape(defs: dict, N: int, sms: int = 132, grid_cap: int | None = None) -> tuple[tuple, tuple, int]:
    """(grid, block, dynamic shared bytes) for N output rows (CM_GLU: the weight has 2N rows)."""
    nw, b, cr, _ = CR.kdefs(defs)
    cro = cr // 2 if glu_of(defs) else cr
    ng = -(-N // cro)
    grid = ng
    if int(defs.get("CM_V2", 0)):
        grid = min(ng, int(defs.get("CM_GPS", defs.get("CM_MINB", 1))) * sms)
    if grid_cap:
        grid = min(grid, grid_cap)
    return (grid,), (threads(defs),), dyn_smem(defs)


def occupancy(defs: dict, regs: int, smem: int) -> int:
    """Resident blocks an SM (H200: 64 K registers in 4 partitions, a warp's registers in 256s,
    228 KB shared memory, 1 KB reserved a block)."""
    warps = threads(defs) // 32
    wr = -(-regs * 32 // 256) * 256
    by_regs = 0
    while True:   # warps spread over 4 partitions of 16 K registers
        n = by_regs + 1
        if -(-n * warps // 4) * wr > 16384 or n * warps > 64:
            break
        by_regs = n
    by_smem = (233472) // (smem + dyn_smem(defs) + 1024)
    return min(by_regs, by_smem, 32)


# ---------------------------------------------------------------------------------------
# the mock device (CPU): memra's gemm_tile MockGpu plus chain_mv (chain_ref) and mv_q8 (float64)

def silu_mul32(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """memra's glu epilogue in float32 numpy: (g / (1 + exp(-g))) * up (the device's expf may differ
    by an ulp or two from numpy's exp: compared with a tolerance, the chains themselves bit-exactly)."""
    with np.errstate(over="ignore"):
        g = gate.astype(np.float32)
        return ((g / (np.float32(1) + np.exp(-g))) * up.astype(np.float32)).astype(np.float32)


def mock_gpu():
    from mock_gpu import MockGpu, MockModule
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE

    class ChainMock(MockGpu):
        def module(self, file, defines=None):
            if file in ("matvec.cu", "q8.cu", "chain_mv.cu"):
                return MockModule(file, defines)
            return super().module(file, defines)

        def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
            n = kernel.name
            if n not in ("chain_mv", "mv_q8", "mv_q8_glu"):
                return super().launch(kernel, grid, block, args, shmem, pdl)
            if shmem > 232448 or int(np.prod(block)) > 1024:
                raise RuntimeError(f"mock: {n} block {block} shmem {shmem} over the limits")
            self.launches.append((n, tuple(grid), tuple(block), int(shmem)))
            if not self.emulate:
                return
            if n == "chain_mv":
                bulk, meta, xq, xs, y, N, K, nb = args
                N, K, nb = int(N), int(K), int(nb)
                glu = glu_of(getattr(kernel, "defines", {}))
                NW = 2 * N if glu else N
                b = self._arr(bulk, NW * K // 2, np.uint8).reshape(NW, K // 2)
                m = self._arr(meta, NW * K // 16, np.uint8).reshape(NW, K // 16)
                raw = MV.unpack_planes(b, m, Q4_K)
                q = self._arr(xq, nb * K, np.int8).reshape(nb, K)
                s = self._arr(xs, nb * K // 32, Q8_SCALE).reshape(nb, K // 32)
                ref = CR.chain_ref(raw, q, s)
                out = silu_mul32(ref[:, :N], ref[:, N:]) if glu == 1 else ref
                self._arr(y, out.size, np.float32)[:] = out.ravel()
            else:
                bulk, meta, xq, xs, y, res, N, K, nb, act = args
                N, K, nb = int(N), int(K), int(nb)
                glu = n.endswith("glu")
                w = self._weight(bulk, meta, 2 * N if glu else N, K)
                out = MV.matvec_ref(w, self._acts(xq, xs, nb, K), None, "silu" if glu else None)
                self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()

    return ChainMock()


# ---------------------------------------------------------------------------------------
# device run

def device_main(args, jsonl) -> int:
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE

    t0 = time.perf_counter()
    cub = {}
    for name, defs in CONFIGS:
        c, log = compile_module(defs)
        inf = ptx_info(log)
        cub[name] = c
        occ = occupancy(defs, inf["regs"], max(inf["smem"], 0)) if inf["regs"] > 0 else -1
        jsonl({"kind": "compile", "config": name, "defs": defs, **inf, "dyn_smem": dyn_smem(defs), "blocks_per_sm": occ})
        print(f"compiled {name} {defs}: {inf['regs']} regs, {inf['spill']} B spill, {inf['smem']} B smem + "
              f"{dyn_smem(defs)} B dynamic, {occ} blocks/SM", flush=True)
        if inf["spill"]:
            print(f"FAIL  {name} spills", flush=True)
            return 1
    if args.mock:
        from mock_gpu import MockModule
        g = mock_gpu()
        mods = {name: MockModule("chain_mv.cu", defs) for name, defs in CONFIGS}
    else:
        from memra.gpu.cuda import Module, gpu
        g = gpu(0)
        mods = {name: Module(g, "chain_mv.cu", dict(defs), cub[name]) for name, defs in CONFIGS}
    defs_of = dict(CONFIGS)
    sms = int(getattr(g.info, "sm_count", 132))
    print(f"device {g.info.name} ({sms} SMs); compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "sms": sms, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    rng = np.random.default_rng(2468)
    fails = 0

    def launch(cfg, w, xq, xs, y, nb, grid_cap=None):
        defs = defs_of[cfg]
        N = w.rows // 2 if glu_of(defs) else w.rows
        grid, block, shmem = launch_shape(defs, N, sms, grid_cap)
        k = mods[cfg].kernel("chain_mv")
        if args.mock:
            k.defines = defs
        g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, np.int32(N), np.int32(w.K), np.int32(nb)), shmem=shmem)

    def acts(nb, K):
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0.0
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        g.sync()
        return xq, xs, xq.numpy().reshape(nb, K), xs.numpy().reshape(nb, K // 32)

    def check(name, y, nb, N, raw_sub, outs, q, s, glu=0, **rec):
        """y [nb, N] (glu 2: [nb, 2N], the gate rows then the up rows; glu 1: silu(gate) up) at the
        output rows `outs`; raw_sub: their weight rows (glu: the gate rows, then the up rows)."""
        nonlocal fails
        W = 2 * N if glu == 2 else N
        got = y.numpy().reshape(-1)[:nb * W].reshape(nb, W)
        if glu == 2:
            got = np.concatenate([got[:, outs], got[:, N + outs]], 1)
        else:
            got = got[:, outs]
        ref = CR.chain_ref(raw_sub, q, s)
        if glu == 1:
            h = len(outs)
            ref = silu_mul32(ref[:, :h], ref[:, h:])
        ndiff = int((got.view(np.uint32) != ref.view(np.uint32)).sum())
        same = ndiff == 0
        if glu == 1:   # the epilogue's expf vs numpy's exp: a few ulp (the chains: g16raw, bit-exact)
            rel = float(np.max(np.abs(got.astype(np.float64) - ref) / (np.abs(ref.astype(np.float64)) + 1e-30))) \
                if np.all(np.isfinite(got)) else float("inf")
            ok = rel <= 2e-6
            fails += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {name}: silu(gate) up vs float32 numpy of chain_ref: max rel {rel:.1e} "
                  f"({ndiff} of {got.size} not bit-equal: the epilogue's expf)", flush=True)
            jsonl({"kind": "check", "name": name, "ok": ok, "bit_exact": same, "ndiff": ndiff, "maxrel": rel, **rec})
            return
        wf = MV.dequant_rows(raw_sub, Q4_K).astype(np.float64)
        xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, -1)
        r64 = xv @ wf.T
        err = float(np.linalg.norm(got.astype(np.float64) - r64) / np.linalg.norm(r64)) if np.all(np.isfinite(got)) else float("inf")
        ok = same and err <= 1e-5
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: bit-exact vs chain_ref {'yes' if same else f'NO ({ndiff} differ)'}, "
              f"float64 rel err {err:.2e}", flush=True)
        jsonl({"kind": "check", "name": name, "ok": ok, "bit_exact": same, "ndiff": ndiff, "err64": err, **rec})

    def wrows(raw, glu, N, outs):
        return np.concatenate([raw[outs], raw[N + outs]]) if glu else raw[outs]

    # small shapes: partial row blocks, a partial K tile, batched configurations at nb < CM_B;
    # v2 also on a 3-block grid (each block walks several groups: the prefetch across group boundaries)
    for (N, K) in ((203, 2816), (64, 1024)):
        raw = MV.random_weight(Q4_K, N, K, rng)
        w = MV.upload_weight(g, raw, Q4_K)
        for cfg, defs in CONFIGS:
            B = int(defs.get("CM_B", 1))
            glu = glu_of(defs)
            No = N // 2 if glu else N
            outs = np.arange(No)
            for cap in ((None, 3) if int(defs.get("CM_V2", 0)) else (None,)):
                for nb in sorted({1, max(1, B - 1), B}):
                    xq, xs, q, s = acts(nb, K)
                    y = g.empty((nb, 2 * No if glu == 2 else No), np.float32)
                    y.poison()
                    launch(cfg, w, xq, xs, y, nb, cap)
                    g.sync()
                    check(f"chain_mv {cfg} N={No}{' glu' if glu else ''} K={K} nb={nb}{f' grid={cap}' if cap else ''}",
                          y, nb, No, wrows(raw, glu, No, outs), outs, q, s, glu, config=cfg, rows=No, cols=K, batch=nb,
                          grid_cap=cap)
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    results = []
    for rows, K, mk in (MOCK_SHAPES if args.mock else SHAPES):
        sname = f"Q4_K {rows}x{K}"
        raw = MV.random_weight(Q4_K, rows, K, rng)
        w0 = MV.upload_weight(g, raw, Q4_K)
        sets = 3 if args.mock else max(2, -(-3 * L2_BYTES // w0.nbytes))
        ws = [w0] + [MV.upload_weight(g, raw, Q4_K) for _ in range(sets - 1)]
        xq8, xs8, q8, s8 = acts(8, K)
        y = g.empty((8, rows), np.float32)
        gb = w0.nbytes / 1e3
        for cfg, defs in CONFIGS:
            B = int(defs.get("CM_B", 1))
            glu = glu_of(defs)
            if glu and mk != "matvec_glu":
                continue
            No = rows // 2 if glu else rows
            k = min(REF_ROWS, No // 2)
            outs = np.concatenate([np.arange(k), np.arange(No - k, No)])
            y.poison()
            launch(cfg, w0, xq8, xs8, y, B)
            g.sync()
            check(f"chain_mv {cfg} {sname} nb={B}", y, B, No, wrows(raw, glu, No, outs), outs, q8[:B], s8[:B], glu,
                  config=cfg, shape=sname, batch=B)
            if glu == 2:
                continue
            us = T.time_us(g, [lambda i=i, cfg=cfg, B=B: launch(cfg, ws[i], xq8, xs8, y, B) for i in range(sets)], args.reps)
            results.append((sname, B, f"chain_mv {cfg}", us))
            jsonl({"kind": "time", "impl": "chain_mv", "config": cfg, "shape": sname, "nb": B, "us": us,
                   "gbps": gb / us, "sets": sets})
            print(f"time  chain_mv {cfg:9s} {sname} nb={B}: {us:8.2f} us  {gb / us:7.0f} GB/s", flush=True)
        # memra: the table's configuration at batch 1 (and for the gate + up both its glu and plain kernels)
        variants = [("mv_q8_glu" if mk == "matvec_glu" else "mv_q8", "silu" if mk == "matvec_glu" else None,
                     table_config(mk, rows, K))]
        if mk == "matvec_glu":
            variants.append(("mv_q8 (plain, default cfg)", None, None))
        for nb in (1, 8):
            for vname, glu, cfg in variants:
                fn = lambda i, glu=glu, cfg=cfg, nb=nb: MV.matvec(g, ws[i], y, xq=xq8, xs=xs8, nb=nb, glu=glu, config=cfg)
                us = T.time_us(g, [lambda i=i: fn(i) for i in range(sets)], args.reps)
                results.append((sname, nb, f"memra {vname}", us))
                jsonl({"kind": "time", "impl": "memra", "variant": vname, "config": cfg, "shape": sname, "nb": nb,
                       "us": us, "gbps": gb / us, "sets": sets})
                print(f"time  memra {vname} {cfg} {sname} nb={nb}: {us:8.2f} us  {gb / us:7.0f} GB/s", flush=True)
        ws.clear()   # the weight copies freed before the next shape
        print(f"{sname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    print(f"\n{'shape':20s} {'nb':>3s} {'impl':34s} {'us':>8s} {'GB/s':>7s} {'memra/this':>10s}")
    base = {(s, nb): us for s, nb, n, us in results if n.startswith("memra mv_q8") and "plain" not in n}
    for s, nb, n, us in results:
        b = base.get((s, nb))
        gbps = [r for r in (MOCK_SHAPES if args.mock else SHAPES) if f"Q4_K {r[0]}x{r[1]}" == s][0]
        nbytes = gbps[0] * gbps[1] // 256 * 144
        print(f"{s:20s} {nb:3d} {n:34s} {us:8.2f} {nbytes / us / 1e3:7.0f} {(b / us if b else float('nan')):10.2f}")
        jsonl({"kind": "table", "shape": s, "nb": nb, "impl": n, "us": us, "memra_over_this": b / us if b else None})
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--mock", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    try:
        if args.compile_only:
            bad = 0
            for name, defs in CONFIGS:
                _, log = compile_module(defs)
                inf = ptx_info(log)
                bad += inf["spill"] > 0
                print(f"{'ok  ' if not inf['spill'] else 'SPILL'} {name:9s} {str(defs):96s} {inf['regs']:3d} regs, "
                      f"{inf['spill']} B spill, {inf['smem']:5d} B smem + {dyn_smem(defs):6d} B dynamic, "
                      f"{occupancy(defs, inf['regs'], inf['smem'])} blocks/SM", flush=True)
            return 1 if bad else 0
        return device_main(args, T.jsonl_writer("chain-mv.jsonl"))
    except Exception:   # noqa: BLE001
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
