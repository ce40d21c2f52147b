#!/usr/bin/env python3
"""run.py — the slot order in the decode matvec: build/matvec.cu's arms beside memra's mv_q8, checked and timed.

    python3 experiments/slot_order/mv/run.py --compile-only   # CPU: NVRTC every module (regs, spills)
    python3 experiments/slot_order/mv/run.py --mock           # CPU: the device run on a mock device (small shapes)
    python3 experiments/slot_order/mv/run.py                  # device (H200), via ab.sh

Arms (same tunables: the H200 table's configuration for the shape and batch over memra's default_config):
  base  memra's own mv_q8 / mv_q8_glu (kernels/matvec.cu, memra's compile and launcher)
  fold  build/matvec.cu MV_FOLD 1                (T::accum slots, left fold)
  slot  build/matvec.cu MV_FOLD 1, MV_CHAINF 1   (the slot order: memra.gpu.chain.slot_chain)
  sfl   build/matvec.cu MV_FOLD 2, MV_CHAINF 1   (the slot order, its fold by broadcast shuffles)
The arms launch through memra's own launcher (memra.gpu.ops.matvec.matvec: grid, block, chunks, views): a
thin wrapper of the device hands it build/matvec.cu's module when the config carries MV_FOLD.
Checks (y poisoned first), activations quantized by memra's quantize_q8 and read back: bit-exact against
ref.py (base: ref.emulate fold 0, i.e. the emulation of today's kernel; fold: ref.emulate fold 1; slot:
slot_chain) for plain and + residual outputs, silu(gate) * up within 2e-6 relative (the device's expf);
and every arm within 1e-5 of float64. Small shapes (256 x 4096, nb 1 / 3 / 8) then a row subset of the
timed shapes at nb 1 and 8. Timing: CUDA graphs of 24 launches (weights rotated over copies), median of
20 graph replays. $OUT/slot-mv.jsonl; exit 1 on a failed check or a spill, 2 on an error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import make  # noqa: E402
import ref  # noqa: E402
import tile as T  # noqa: E402  (compile_module, ptxas_info, time_us, jsonl_writer)
from memra.gpu.ops import matvec as MV  # noqa: E402

BUILD = make.OUT
ARMS = (("base", {}), ("fold", {"MV_FOLD": 1}), ("slot", {"MV_FOLD": 1, "MV_CHAINF": 1}),
        ("sfl", {"MV_FOLD": 2, "MV_CHAINF": 1}))   # sfl: the slot order, fold by shuffles
TNAME = {2: "Q4_0", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}
# (label, type, weight rows, K, glu): Llama-3 8B, then SmolLM2-135M-like (K = 576: 9 units, 23 empty slots;
# Q4_K needs K % 256, so the small ones are Q8_0 and Q4_0)
SHAPES = (("attn_output", 12, 4096, 4096, False), ("qkv", 12, 6144, 4096, False), ("gate+up", 12, 28672, 4096, True),
          ("ffn_down", 14, 4096, 14336, False), ("gate+up", 2, 28672, 4096, True), ("gate+up", 8, 28672, 4096, True),
          ("smol attn", 8, 576, 576, False), ("smol gate+up", 8, 3072, 576, True),
          ("smol attn", 2, 576, 576, False), ("smol gate+up", 2, 3072, 576, True))
MOCK_SHAPES = (("m attn", 12, 96, 2048, False), ("m down", 14, 64, 2048, False), ("m gate+up", 2, 128, 1024, True),
               ("m smol", 8, 64, 576, False))
SMALL = (256, 4096)
NBS = (1, 8)
REF_ROWS = 64
L2_BYTES = 60 << 20
MAX_SETS = 48


def table_config(t: int, rows: int, K: int, glu: bool, nb: int) -> dict:
    """The H200 table's tunables for (shape, batch bucket) over memra's built-in default (what the engine runs)."""
    d = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())["entries"]
    e = d.get("matvec_glu" if glu else "matvec", {}).get(f"cols={K},rows={rows},type={TNAME[t]}", {}).get(str(MV.bucket(nb)))
    N = rows // 2 if glu else rows
    return {**MV.default_config(t, "q8", N, K, nb, glu), **(e["config"] if e else {})}


def small_configs():
    """(type, nb, glu, config) of the small checks: memra's default config for 256 x 4096."""
    return [(t, nb, glu, MV.default_config(t, "q8", SMALL[0], SMALL[1], nb, glu))
            for t in TNAME for nb in (1, 3, 8) for glu in (False, True)]


def modules() -> list[dict]:
    """Every build/matvec.cu module the run loads (and the base arm's, for the compile table): defines dicts."""
    out = []
    items = [(t, nb, cfg) for t, nb, _, cfg in small_configs()]
    items += [(t, nb, table_config(t, rows, K, glu, nb)) for _, t, rows, K, glu in SHAPES for nb in NBS]
    for t, nb, cfg in items:
        for _, arm in ARMS:
            d = {"MV_TYPE": t, "MV_B": MV.bucket(nb), **cfg, **arm}
            if d not in out:
                out.append(d)
    return out


def key(d: dict) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in d.items()))


def _compile(d):
    cub, log = T.compile_module(d, BUILD)
    return key(d), cub, {fn: T.ptxas_info(log, fn) for fn in ("mv_q8", "mv_q8_glu")}


def _compile_base(d):
    """memra's own module (kernels/matvec.cu) into memra's cubin cache: the base arm's g.module then hits it."""
    from memra.gpu.compile import compile_cubin
    compile_cubin(MV.KERNEL_FILE, T.ARCH, d)


def compile_all(jsonl) -> tuple[dict, int]:
    """{key: cubin}, spill count; prints the compile table (regs / spill bytes of mv_q8 and mv_q8_glu; the
    FOLD 0 CHAINF 0 rows are build/matvec.cu's copy of today's kernel). Also fills memra's cubin cache with
    the base arm's modules (all in processes, before any CUDA context)."""
    make.main()
    mods = modules()
    base = [d for d in mods if "MV_FOLD" not in d]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max(1, min(len(mods), os.cpu_count() or 1))) as ex:
        pre = [ex.submit(_compile_base, d) for d in base]
        res = list(ex.map(_compile, mods))
        for f in pre:
            f.result()
    cubs, spills = {}, 0
    print(f"compiled {len(mods)} build/matvec.cu modules and {len(base)} of memra's in {time.perf_counter() - t0:.1f} s")
    print(f"{'type':5s} {'B':>2s} {'NW':>2s} {'ROWS':>4s} {'UNR':>3s} {'FOLD':>4s} {'CHF':>3s}  mv_q8 regs/spill  glu regs/spill")
    for d, (k, cub, inf) in zip(mods, res):
        cubs[k] = cub
        sp = inf["mv_q8"][1] + inf["mv_q8_glu"][1]
        spills += sp > 0 and not (d.get("MV_FOLD") == 2 and d["MV_B"] > 1)   # sfl is a batch-1 arm (timed at 8 all the same)
        print(f"{TNAME[d['MV_TYPE']]:5s} {d['MV_B']:2d} {d['MV_NWARPS']:2d} {d['MV_ROWS']:4d} {d['MV_UNROLL']:3d} "
              f"{d.get('MV_FOLD', 0):4d} {d.get('MV_CHAINF', 0):3d}  {inf['mv_q8'][0]:5d} / {inf['mv_q8'][1]:<5d}"
              f"      {inf['mv_q8_glu'][0]:4d} / {inf['mv_q8_glu'][1]}{'   SPILL' if sp else ''}")
        jsonl({"kind": "compile", "defines": d, "mv_q8": inf["mv_q8"], "mv_q8_glu": inf["mv_q8_glu"]})
    return cubs, spills


class BuildGpu:
    """The device, except that a matvec.cu module whose defines carry MV_FOLD is build/matvec.cu's."""

    def __init__(self, g, cubs, mock):
        self.g, self.cubs, self.mock, self.mods = g, cubs, mock, {}

    def module(self, file, defines=None):
        d = dict(defines or {})
        if file != MV.KERNEL_FILE or "MV_FOLD" not in d:
            return self.g.module(file, d)
        k = key(d)
        return T.prebuilt_module(self.g, self.mods, k, file, d,
                                 lambda: self.cubs[k] if k in self.cubs else _compile(d)[1], self.mock)

    def __getattr__(self, n):
        return getattr(self.g, n)


def mock_gpu():
    """gemm_tile's MockGpu; mv_q8 / mv_q8_glu emulated by ref.arm_ref with the module's MV_FOLD / MV_CHAINF
    (the mock checks the plumbing, launches and references, not the kernel)."""
    from mock_gpu import MockGpu, MockKernel, MockModule
    from memra.gpu.q8 import Q8_SCALE

    class Mod(MockModule):
        def kernel(self, name):
            k = MockKernel(name)
            k.defines = self.defines
            return k

    class Mock(MockGpu):
        def module(self, file, defines=None):
            return Mod(file, defines) if file == MV.KERNEL_FILE else super().module(file, defines)

        def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
            if kernel.name not in ("mv_q8", "mv_q8_glu"):
                return super().launch(kernel, grid, block, args, shmem, pdl)
            self.launches.append((kernel.name, tuple(grid), tuple(block), int(shmem)))
            if not self.emulate:
                return
            bulk, meta, xq, xs, y, res, N, K, nb, act = args
            N, K, nb = int(N), int(K), int(nb)
            d, glu = kernel.defines, kernel.name.endswith("glu")
            t = int(d["MV_TYPE"])
            _, blk, bb, _, bl = MV.TYPES[t]
            R = 2 * N if glu else N
            b = self._arr(bulk, R * K // blk * bl, np.uint8).reshape(R, -1)
            m = self._arr(meta, R * K // blk * (bb - bl), np.uint8).reshape(R, -1)
            raw = MV.unpack_planes(b, m, t)
            q = self._arr(xq, nb * K, np.int8).reshape(nb, K)
            s = self._arr(xs, nb * K // 32, Q8_SCALE).reshape(nb, K // 32)
            r = None if int(getattr(res, "ptr", res)) == 0 else self._arr(res, nb * N, np.float32).reshape(nb, N).copy()
            out = ref.arm_ref(raw, t, q, s["d"], s["s"], int(d.get("MV_FOLD", 0)), int(d.get("MV_CHAINF", 0)), glu, r)
            self._arr(y, nb * N, np.float32)[:] = out.ravel()

    return Mock()


def device_main(args, jsonl) -> int:
    from memra.gpu.q8 import Q8_SCALE

    t0 = time.perf_counter()
    cubs, spills = compile_all(jsonl)
    if spills:
        print(f"FAIL  {spills} modules spill")
        return 1
    if args.mock:
        g = mock_gpu()
    else:
        from memra.gpu.cuda import gpu
        g = gpu(0)
    bg = BuildGpu(g, cubs, args.mock)
    print(f"device {g.info.name}; compiled at {time.perf_counter() - t0:.1f} s", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "mock": bool(args.mock), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    rng = np.random.default_rng(97531)
    fails = 0
    exact_of = {}   # (shape tag, arm, nb) -> every check passed

    def acts(nb, K):
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0.0
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        g.sync()
        s = xs.numpy().reshape(nb, K // 32)
        return xq, xs, xq.numpy().reshape(nb, K), s["d"].copy(), s["s"].astype(np.int64)

    def run_arm(arm, w, y, xq, xs, nb, glu, cfg, res=None):
        MV.matvec(bg, w, y, xq=xq, xs=xs, nb=nb, glu="silu" if glu else None, residual=res, config={**cfg, **arm})

    def check(name, got, refv, r64, exact, **rec):
        nonlocal fails
        ndiff = int((got.view(np.uint32) != refv.view(np.uint32)).sum())
        fin = bool(np.all(np.isfinite(got)))
        if exact:
            ok = ndiff == 0
            what = "bit-exact" if ok else f"NOT bit-exact ({ndiff} of {got.size} differ)"
        else:
            rel = float(np.max(np.abs(got.astype(np.float64) - refv) / (np.abs(refv.astype(np.float64)) + 1e-30))) if fin else np.inf
            ok = rel <= 2e-6
            what = f"max rel {rel:.1e} vs float32 epilogue ({ndiff} of {got.size} not bit-equal)"
        err = float(np.linalg.norm(got.astype(np.float64) - r64) / np.linalg.norm(r64)) if fin else np.inf
        ok = ok and err <= 1e-5
        fails += not ok
        k = (rec["shape"], rec["arm"], rec["nb"])
        exact_of[k] = exact_of.get(k, True) and ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {what}, float64 rel {err:.1e}", flush=True)
        jsonl({"kind": "check", "name": name, "ok": ok, "exact": bool(ndiff == 0), "ndiff": ndiff, "err64": err, **rec})

    def check_all(tag, t, raw, w, N, glu, nb, cfg, outs):
        """Every arm on weight w (its raw rows `raw`; glu: 2N rows) at nb, checked at output rows `outs`."""
        xq, xs, q, d, S = acts(nb, w.K)
        wr = np.concatenate([raw[outs], raw[N + outs]]) if glu else raw[outs]
        r64 = ref.float64_ref(wr, t, q, d)
        if glu:
            h = len(outs)
            r64 = r64[:, :h] / (1 + np.exp(-r64[:, :h])) * r64[:, h:]
        resv = rng.standard_normal((nb, N)).astype(np.float32)
        for an, arm in ARMS:
            fold, chf = int(arm.get("MV_FOLD", 0)), int(arm.get("MV_CHAINF", 0))
            yraw = ref.arm_raw(wr, t, q, d, S, fold, chf)
            for res in ((False,) if glu else (False, True)):
                y = g.to_device(resv) if res else g.empty((nb, N), np.float32)
                if not res:
                    y.poison()
                run_arm(arm, w, y, xq, xs, nb, glu, cfg, y if res else None)   # + residual: aliased, as the engine runs it
                g.sync()
                got = y.numpy().reshape(nb, N)[:, outs]
                if glu:
                    h = len(outs)
                    refv = ref.silu_mul(yraw[:, :h], yraw[:, h:])
                else:
                    refv = yraw + resv[:, outs] if res else yraw
                check(f"{an:4s} {tag} nb={nb}{' +res' if res else ''}", got, refv.astype(np.float32),
                      r64 + resv[:, outs] if res else r64, exact=not glu, arm=an, shape=tag, nb=nb, res=res, cfg=cfg)

    # small shapes: every type, nb 1 / 3 / 8, plain + residual and glu, memra's default config
    for t, nb, glu, cfg in small_configs():
        N = SMALL[0]
        raw = MV.random_weight(t, 2 * N if glu else N, SMALL[1], rng)
        w = MV.upload_weight(g, raw, t)
        check_all(f"{TNAME[t]} {'2x' if glu else ''}{N}x{SMALL[1]}", t, raw, w, N, glu, nb, cfg, np.arange(N))
    print(f"small checks done at {time.perf_counter() - t0:.1f} s", flush=True)

    results = []
    for label, t, rows, K, glu in (MOCK_SHAPES if args.mock else SHAPES):
        N = rows // 2 if glu else rows
        sname = f"{TNAME[t]} {label} {'2x' if glu else ''}{N}x{K}"
        raw = MV.random_weight(t, rows, K, rng)
        w0 = MV.upload_weight(g, raw, t)
        k = min(REF_ROWS, N // 2)
        outs = np.concatenate([np.arange(k), np.arange(N - k, N)])
        for nb in NBS:
            check_all(sname, t, raw, w0, N, glu, nb, table_config(t, rows, K, glu, nb), outs)
        sets = 3 if args.mock else min(MAX_SETS, max(2, -(-3 * L2_BYTES // w0.nbytes)))
        ws = [w0] + [MV.upload_weight(g, raw, t) for _ in range(sets - 1)]
        xq, xs, *_ = acts(8, K)
        y = g.empty((8, N), np.float32)
        for nb in NBS:
            cfg = table_config(t, rows, K, glu, nb)
            base = None
            for an, arm in ARMS:
                us = T.time_us(g, [lambda i=i, arm=arm: run_arm(arm, ws[i], y, xq, xs, nb, glu, cfg) for i in range(sets)],
                               args.reps, launches=max(24, sets))
                base = us if an == "base" else base
                gbps = w0.nbytes / us / 1e3
                ex = exact_of.get((sname, an, nb), False)
                results.append((sname, nb, an, us, gbps, us / base, ex))
                jsonl({"kind": "time", "exact": ex, "shape": sname, "type": TNAME[t], "rows": rows, "K": K, "glu": glu, "arm": an,
                       "nb": nb, "us": us, "gbps": gbps, "ratio": us / base, "cfg": cfg, "sets": sets})
                print(f"time  {an:4s} {sname} nb={nb} {cfg}: {us:8.2f} us {gbps:7.0f} GB/s  x{us / base:.3f}", flush=True)
        ws.clear()
        print(f"{sname} done at {time.perf_counter() - t0:.1f} s", flush=True)

    names = [a for a, _ in ARMS]
    print(f"\n{'shape':32s} {'nb':>2s} {'base us':>8s} " + " ".join(f"{a + ' us':>8s}" for a in names[1:]) + " "
          + " ".join(f"{a + '/base':>9s}" for a in names[1:]) + f" {'base GB/s':>9s}  exact " + "/".join(a[0] for a in names))
    n = len(ARMS)
    for i in range(0, len(results), n):
        g_ = results[i:i + n]
        print(f"{g_[0][0]:32s} {g_[0][1]:2d} " + " ".join(f"{r[3]:8.2f}" for r in g_) + " "
              + " ".join(f"{r[5]:9.3f}" for r in g_[1:]) + f" {g_[0][4]:9.0f}  " + "/".join("y" if r[6] else "N" for r in g_))
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--mock", action="store_true")
    ap.add_argument("--reps", type=int, default=80, help="time_us reps (graph replays = reps / 4)")
    args = ap.parse_args()
    jsonl = T.jsonl_writer("slot-mv.jsonl")
    try:
        if args.compile_only:
            return 1 if compile_all(jsonl)[1] else 0
        return device_main(args, jsonl)
    except Exception:   # noqa: BLE001
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
