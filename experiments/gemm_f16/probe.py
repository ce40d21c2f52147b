"""gemm_f16.cu on the device: checked against numpy, timed against the engine's prompt tile.

For each of the 8B's prompt GEMM shapes at 512 rows (and the configurations in CONFIGS):
- check: the first CHECK_ROWS outputs against float64 products of the f16-rounded weights (ggml's
  dequantized value rounded once) and activations (max error over max |reference|, bound TOL),
  and the order's contract bit for bit: rows 0..36 of a 37-row launch equal those of the 512-row
  one (chunk invariance), and every configuration gives the first one's bits (tile invariance);
- time: gemm_f16 (and to_f16, the conversion that replaces the q8 quantize) against gemm_tile.cu
  with the table's 512-row configuration for the shape (quantize_q8 timed beside it), each a CUDA
  graph of launches (experiments/gemm_tile/tile.py's time_us), median µs, TFLOPS.

    source .whl/setup.sh && python3 experiments/gemm_f16/probe.py --out $OUT/gemm-f16.jsonl

One JSON line per shape and configuration (kind "gemm_f16"), and one per shape for the tile.

The warp-specialized wgmma kernel (kernels/gemm_f16_wg.cu since session 43; first run there) runs beside them in
WG_CONFIGS (kind "gemm_f16_wg"): the same checks, except that its bits are compared within the
configurations of one WG_BN (the wgmma N: the instruction shape; across WG_BN the bits may differ and
are only reported, as its agreement with gemm_f16.cu's mma.sync bits is), plus a chunk of 37 rows at
row offset 150 (position invariance: the rows sit at other tile columns) and, for the plain entry,
the residual (y = fl(res + acc) bit for bit). Before the main run a subprocess (--wg-smoke, timeout
--smoke-timeout) launches every wg configuration once on small shapes: a hang or a fault there (a
wrong descriptor, a ring deadlock) only drops the wg configurations from the main run.

    python3 experiments/gemm_f16/probe.py --compile-only   # CPU: every module through NVRTC, registers
                                                           # and spills (the wg kernel's split by role
                                                           # when nvdisasm is installed), exit 0
    python3 experiments/gemm_f16/probe.py --out F --set wg # only the wg configurations (and the tile)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
SRC = ROOT / "kernels" / "gemm_f16.cu"   # the engine's mma.sync kernel (its experiment copy landed)
WG_SRC = ROOT / "kernels" / "gemm_f16_wg.cu"

Q4_0, Q8_0, Q4_K, Q6_K = 2, 8, 12, 14
# (name, type, weight rows (glu: gate and up stacked), K, glu): the 8B Q4_K_M's prompt GEMMs and
# the gate+up of its Q4_0 / Q8_0 twins
SHAPES = [
    ("gate_up", Q4_K, 2 * 14336, 4096, True),
    ("down", Q6_K, 4096, 14336, False),
    ("down", Q4_K, 4096, 14336, False),
    ("qkv", Q4_K, 6144, 4096, False),
    ("attn_output", Q4_K, 4096, 4096, False),
    ("gate_up", Q4_0, 2 * 14336, 4096, True),
    ("gate_up", Q8_0, 2 * 14336, 4096, True),
]
CONFIGS = [dict(GF_WM=2, GF_WN=4, GF_TM=8, GF_TN=4), dict(GF_WM=2, GF_WN=4, GF_TM=8, GF_TN=4, GF_OVERLAP=1),
           dict(GF_WM=2, GF_WN=4, GF_TM=4, GF_TN=4), dict(GF_WM=2, GF_WN=4, GF_TM=4, GF_TN=4, GF_OVERLAP=1)]
# (GF_MINB 2 with 2 x 2 warps, two blocks an SM, lost everywhere: Q4_K gate+up 874.9 µs against 682.9,
# research/2026-12-06-session43/f; gone with the experiment copy of gemm_f16.cu)
# kernels/gemm_f16_wg.cu: WG_BN 128 (the dequant a stage against 512 cycles of wgmma), WG_BN 256 (twice the
# wgmma a stage for the same dequant), WG_MT 2 (256 weight rows a block: half the x traffic; its
# producer holds 4 units a pair, so no prefetch), WG_BN 256 with WG_INFLIGHT 0 (the slot released after
# wait_group 0: the price of draining the wgmma pipe a stage; same bits as WG_BN 256)
WG_CONFIGS = [dict(WG_BN=128), dict(WG_BN=256), dict(WG_BN=128, WG_MT=2, WG_PREFETCH=0),
              dict(WG_BN=256, WG_INFLIGHT=0)]
NB, CHUNK, CHECK_ROWS, TOL = 512, 37, 256, 1e-4
CHUNK_OFF = 150   # the wg kernel's second chunk: rows 150..186 launched as rows 0..36
TNAME = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}


def geom(cfg: dict) -> tuple[int, int, int, int]:
    """(threads, BM weight rows, BN activation rows, shared memory bytes) of a configuration."""
    wm, wn, tm, tn = (int(cfg[k]) for k in ("GF_WM", "GF_WN", "GF_TM", "GF_TN"))
    bm, bn = 16 * tm * wm, 8 * tn * wn
    return 32 * wm * wn, bm, bn, 2 * (bm + bn) * 272


def wg_geom(cfg: dict) -> tuple[int, int, int, int]:
    """(threads, BM, BN, shared memory bytes) of a wg configuration (gemm_f16_wg.cu's contract)."""
    bm, bn, st = 128 * int(cfg.get("WG_MT", 1)), int(cfg.get("WG_BN", 128)), int(cfg.get("WG_STAGES", 4))
    return 384, bm, bn, st * (bm + bn) * 128 + 1024 + 16 * st


def _compile(defs: dict, src: Path = SRC):
    import tile as TL
    return TL.compile_module(defs, src, default_device=src == WG_SRC)


def _compile_job(job):
    src, defs = job
    return _compile(defs, src)


def table_config(kernel: str, t: int, rows: int, K: int) -> dict:
    entries = json.loads((ROOT / "tune/defaults/nvidia-h200.json").read_text())["entries"]
    e = entries.get(kernel, {}).get(f"cols={K},rows={rows},type={TNAME[t]}", {}).get("512")
    return dict(e["config"]) if e else {}


def module_keys(types, sets: str) -> list[tuple[str, int, int]]:
    """("f16" | "wg", type, configuration index) of every module a run needs (gemm_f16.cu's first
    configuration always: its to_f16 converts the activations)."""
    keys = []
    for t in types:
        keys += [("f16", t, ci) for ci in range(len(CONFIGS) if sets in ("all", "f16") else 1)]
        if sets in ("all", "wg"):
            keys += [("wg", t, wi) for wi in range(len(WG_CONFIGS))]
    return keys


def key_job(key) -> tuple[Path, dict]:
    kind, t, ci = key
    return (SRC, {"MV_TYPE": t, **CONFIGS[ci]}) if kind == "f16" else (WG_SRC, {"MV_TYPE": t, **WG_CONFIGS[ci]})


def nvdisasm_path() -> str | None:
    import shutil
    exe = shutil.which("nvdisasm")
    if exe:
        return exe
    try:
        import nvidia
        for base in nvidia.__path__:
            for cand in sorted(Path(base).glob("*/bin/nvdisasm")):
                return str(cand)
    except ImportError:
        pass
    return None


def sass_roles(body: str) -> dict:
    """{"consumer" | "producer" | "shared": {"STL": n, "LDL": n}} of one entry's SASS (nvdisasm text): its control
    flow graph (basic blocks split at labels, branches and EXIT), a block the consumer's if it reaches or is
    reached from a block with HGMMA and neither reaches nor is reached from one with LDGSTS, the producer's
    the other way round, shared otherwise (the prologue before the role branch)."""
    import re
    ins, labels = [], {}
    for line in body.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?);", line)
        if m:
            ins.append(m.group(1).strip())

    def parts(t):
        pred = re.match(r"@!?U?P\w+\s+", t)
        op = (t[pred.end():] if pred else t).split()[0]
        return bool(pred), op.split(".")[0], re.search(r"`\((\.L_x_\d+)\)", t)

    leaders = {0} | set(labels.values())
    for i, t in enumerate(ins):
        _, op, _ = parts(t)
        if op in ("BRA", "EXIT", "RET", "BRX", "JMP") and i + 1 < len(ins):
            leaders.add(i + 1)
    starts = sorted(x for x in leaders if x < len(ins))
    block_of = {}
    for b, st in enumerate(starts):
        for i in range(st, starts[b + 1] if b + 1 < len(starts) else len(ins)):
            block_of[i] = b
    succ = {b: set() for b in range(len(starts))}
    for b, st in enumerate(starts):
        last = (starts[b + 1] if b + 1 < len(starts) else len(ins)) - 1
        pred, op, tgt = parts(ins[last])
        if op == "BRA" and tgt and tgt.group(1) in labels:
            succ[b].add(block_of[labels[tgt.group(1)]])
        if (op not in ("BRA", "EXIT", "RET", "BRX", "JMP") or pred) and last + 1 < len(ins):
            succ[b].add(b + 1)

    def reach(srcs, graph):
        seen, todo = set(srcs), list(srcs)
        while todo:
            for n in graph[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    pred_g = {b: set() for b in succ}
    for b, ns in succ.items():
        for n in ns:
            pred_g[n].add(b)
    H = {block_of[i] for i, t in enumerate(ins) if parts(t)[1] == "HGMMA"}
    L = {block_of[i] for i, t in enumerate(ins) if parts(t)[1] == "LDGSTS"}
    cons = reach(H, succ) | reach(H, pred_g)
    prod = reach(L, succ) | reach(L, pred_g)
    out = {r: {"STL": 0, "LDL": 0} for r in ("consumer", "producer", "shared")}
    for i, t in enumerate(ins):
        op = parts(t)[1]
        if op in ("STL", "LDL"):
            b = block_of[i]
            role = "shared" if (b in cons) == (b in prod) else ("consumer" if b in cons else "producer")
            out[role][op] += 1
    return out


def wg_spill_roles(cubin: bytes, exe: str) -> dict:
    """{entry: sass_roles(...)}: the wg entries' local-memory instructions by warpgroup role."""
    import re
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([exe, f.name], capture_output=True, text=True).stdout
    out = {}
    for fn in ("gemm_f16", "gemm_f16_glu"):
        m = re.search(rf"^\s*\.text\.{fn}:\s*$", sass, re.M)
        if not m:
            continue
        rest = sass[m.end():]
        n = re.search(r"^\s*\.text\.\w+:\s*$", rest, re.M)
        out[fn] = sass_roles(rest[:n.start()] if n else rest)
    return out


def compile_only(sets: str) -> int:
    """Every module of a run through NVRTC (sm_90a) on the CPU: registers and spill bytes per entry; the wg
    kernel's local-memory instructions split by warpgroup role when nvdisasm is found (pip's
    nvidia-cuda-nvdisasm has it). Exit 1 on a compile error."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    import tile as TL
    keys = module_keys(sorted({s[1] for s in SHAPES}), sets)
    t0 = time.time()
    with ProcessPoolExecutor(max(1, os.cpu_count() or 1)) as ex:
        built = list(ex.map(_compile_job, [key_job(k) for k in keys]))
    exe = nvdisasm_path()
    bad = 0
    for key, (cub, log) in zip(keys, built):
        kind, t, ci = key
        cfg = CONFIGS[ci] if kind == "f16" else WG_CONFIGS[ci]
        fns = ("gemm_f16", "gemm_f16_glu") + (("to_f16",) if kind == "f16" else ())
        info = {}
        for fn in fns:
            try:
                info[fn] = TL.ptxas_info(log, fn)
            except Exception:
                info[fn] = None
                bad += 1
        roles = wg_spill_roles(cub, exe) if (kind == "wg" and exe) else None
        rec = {"kind": "compile", "module": "gemm_f16_wg.cu" if kind == "wg" else "gemm_f16.cu", "type": TNAME[t],
               "config": cfg, "regs_spill_bytes": info}
        if kind == "wg":
            rec["smem"] = wg_geom(cfg)[3]
            if roles is not None:
                rec["spill_instrs_by_role"] = roles
        warn = [l.strip() for l in log.splitlines() if "warning" in l.lower() or "C7" in l]
        if warn:
            rec["ptxas_warnings"] = warn[:5]
        print(json.dumps(rec), flush=True)
    print(f"compiled {len(keys)} modules in {time.time() - t0:.0f} s"
          + ("" if exe else " (no nvdisasm: spills not split by role)"), flush=True)
    return 1 if bad else 0


def wg_smoke(args) -> int:
    """One wg configuration (--wg-config) launched on small shapes, every type, glu and plain, checked against
    float64 (all outputs): a subprocess of the main run, so that a hang or a fault costs only this
    configuration. Exit 0: all within TOL; 1: a wrong result; anything else (or the parent's timeout): a fault."""
    import tile as TL
    from memra.gpu.cuda import gpu
    from memra.gpu.ops import matvec as MV
    from memra.model import quants as Q

    wi = args.wg_config
    cfg = WG_CONFIGS[wi]
    nt, bm, bn, smem = wg_geom(cfg)
    g = gpu()
    rng = np.random.default_rng(1)
    out = open(args.out, "a")
    bad = 0
    for t in sorted({s[1] for s in SHAPES}):
        m = TL.prebuilt_module(g, {}, (t, wi), "gemm_f16_wg.cu", {"MV_TYPE": t, **cfg},
                               lambda: Path(args.cubins, f"wg-{t}-{wi}.cubin").read_bytes())
        for glu in (True, False):
            n_out, K, nb = 2 * (bm // 2 if glu else bm), 1024, 300
            rows = 2 * n_out if glu else n_out
            raw = MV.random_weight(t, rows, K, rng)
            w = MV.upload_weight(g, raw, t)
            x16 = (rng.standard_normal((nb, K)) * 2).astype(np.float16)
            xh = g.to_device(x16.view(np.uint16))
            y = g.empty((nb, n_out), np.float32)
            y.poison()
            grid = (-(-nb // bn), n_out // (bm // 2 if glu else bm), 1)
            t1 = time.time()
            if glu:
                g.launch(m.kernel("gemm_f16_glu"), grid, (nt, 1, 1),
                         (w.bulk, w.meta, xh, y, np.int32(n_out), np.int32(K), np.int32(nb), np.int32(1)), shmem=smem)
            else:
                g.launch(m.kernel("gemm_f16"), grid, (nt, 1, 1),
                         (w.bulk, w.meta, xh, y, np.uint64(0), np.int32(n_out), np.int32(K), np.int32(nb)),
                         shmem=smem)
            g.sync()
            wf = Q.dequantize(raw, t, (rows, K)).astype(np.float16).astype(np.float64)
            prod = x16.astype(np.float64) @ wf.T
            ref = prod[:, :n_out] / (1 + np.exp(-prod[:, :n_out])) * prod[:, n_out:] if glu else prod
            got = y.numpy()
            err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) if np.all(np.isfinite(got)) else float("inf")
            rec = {"kind": "gemm_f16_wg_smoke", "type": TNAME[t], "glu": glu, "N": n_out, "K": K, "nb": nb,
                   "config": cfg, "err": err, "ok": err < TOL, "s": round(time.time() - t1, 3), "device": g.info.name}
            bad += not rec["ok"]
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="JSON lines appended here (required unless --compile-only)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--limit", type=float, default=420.0, help="seconds: stop starting shapes after this")
    ap.add_argument("--set", default="all", choices=("all", "f16", "wg"),
                    help="configurations run: gemm_f16.cu's, the wg kernel's, or both (the tile always)")
    ap.add_argument("--compile-only", action="store_true", help="CPU: compile every module, report, exit")
    ap.add_argument("--no-smoke", action="store_true", help="run the wg configurations without the smoke subprocess")
    ap.add_argument("--smoke-timeout", type=float, default=90.0, help="seconds for one wg configuration's smoke")
    ap.add_argument("--wg-smoke", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wg-config", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cubins", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile_only:
        return compile_only(args.set)
    if not args.out:
        ap.error("--out is required")
    if args.wg_smoke:
        return wg_smoke(args)
    t0 = time.time()

    import tile as TL
    from memra.gpu.cuda import gpu
    from memra.gpu.ops import gemm_tile as GT
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE
    from memra.model import quants as Q

    # every module compiled before the CUDA context, side by side in processes
    from concurrent.futures import ProcessPoolExecutor
    keys = module_keys(sorted({s[1] for s in SHAPES}), args.set)
    with ProcessPoolExecutor(8) as ex:
        built = list(ex.map(_compile_job, [key_job(k) for k in keys]))
    mods = dict(zip(keys, built))
    print(f"compiled {len(mods)} modules in {time.time() - t0:.0f} s", flush=True)

    # the wg configurations' smoke, one subprocess each (before this process makes its CUDA context)
    wg_live = list(range(len(WG_CONFIGS))) if args.set in ("all", "wg") else []
    if wg_live and not args.no_smoke:
        import tempfile
        tmp = tempfile.mkdtemp(prefix="gemm-f16-wg-")
        for (kind, t, wi), (cub, _) in mods.items():
            if kind == "wg":
                Path(tmp, f"wg-{t}-{wi}.cubin").write_bytes(cub)
        for wi in list(wg_live):
            t1 = time.time()
            try:
                r = subprocess.run([sys.executable, __file__, "--wg-smoke", "--wg-config", str(wi), "--cubins", tmp,
                                    "--out", args.out], capture_output=True, text=True, timeout=args.smoke_timeout)
                rc, tail = r.returncode, (r.stdout + r.stderr)[-1500:]
            except subprocess.TimeoutExpired as e:
                rc, tail = "timeout", str(e.stdout or "")[-1500:]
            rec = {"kind": "gemm_f16_wg_smoke_summary", "config": WG_CONFIGS[wi], "rc": rc,
                   "s": round(time.time() - t1, 1)}
            if rc not in (0, 1):   # a fault or a hang: this configuration stays out of the main run
                wg_live.remove(wi)
                rec["dropped"] = True
                rec["tail"] = tail
            print(json.dumps(rec), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    g = gpu()
    sha = subprocess_sha()
    cache: dict = {}
    rng = np.random.default_rng(0)
    out = open(args.out, "a")

    def module(kind, t, ci):
        src, defs = key_job((kind, t, ci))
        return TL.prebuilt_module(g, cache, (kind, t, ci), src.name, defs, lambda: mods[(kind, t, ci)][0])

    def launch(kind, t, ci, w, xh, y, n_out, K, nb, glu, res=None):
        nt, bm, bn, smem = geom(CONFIGS[ci]) if kind == "f16" else wg_geom(WG_CONFIGS[ci])
        obm = bm // 2 if glu else bm
        assert n_out % obm == 0 and K % 128 == 0
        m = module(kind, t, ci)
        grid = (-(-nb // bn), n_out // obm, 1)
        if glu:
            g.launch(m.kernel("gemm_f16_glu"), grid, (nt, 1, 1),
                     (w.bulk, w.meta, xh, y, np.int32(n_out), np.int32(K), np.int32(nb), np.int32(1)), shmem=smem)
        else:
            g.launch(m.kernel("gemm_f16"), grid, (nt, 1, 1),
                     (w.bulk, w.meta, xh, y, np.uint64(0) if res is None else res, np.int32(n_out), np.int32(K),
                      np.int32(nb)), shmem=smem)

    def f16_launch(t, ci, w, xh, y, n_out, K, nb, glu):
        launch("f16", t, ci, w, xh, y, n_out, K, nb, glu)

    def to_f16(t, x, xh, n):
        m = module("f16", t, 0)
        g.launch(m.kernel("to_f16"), (-(-n // 512), 1, 1), (256, 1, 1), (x, xh, np.int32(n)))

    for name, t, rows, K, glu in SHAPES:
        if time.time() - t0 > args.limit:
            print(f"limit reached before {name} {TNAME[t]}", flush=True)
            break
        n_out = rows // 2 if glu else rows
        raw = MV.random_weight(t, rows, K, rng)
        w = MV.upload_weight(g, raw, t)
        x = (rng.standard_normal((NB, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xd = g.to_device(x)
        xh = g.empty((NB, K), np.uint16)
        to_f16(t, xd, xh, NB * K)
        g.sync()
        x16 = xh.numpy().view(np.float16).astype(np.float64)
        conv_ok = bool(np.array_equal(xh.numpy(), x.astype(np.float16).view(np.uint16)))
        # the reference: the first CHECK_ROWS outputs (glu: their gate and up rows)
        sel = np.r_[0:CHECK_ROWS, n_out:n_out + CHECK_ROWS] if glu else np.r_[0:CHECK_ROWS]
        wf = Q.dequantize(raw[sel], t, (len(sel), K)).astype(np.float16).astype(np.float64)
        prod = x16 @ wf.T
        if glu:
            gt, up = prod[:, :CHECK_ROWS], prod[:, CHECK_ROWS:]
            ref = gt / (1 + np.exp(-gt)) * up
        else:
            ref = prod
        bits0 = None
        for ci, cfg in enumerate(CONFIGS if args.set in ("all", "f16") else []):
            rec = {"kind": "gemm_f16", "shape": name, "type": TNAME[t], "rows": rows, "K": K, "glu": glu, "nb": NB,
                   "config": cfg, "git_sha": sha, "device": g.info.name}
            try:
                y = g.empty((NB, n_out), np.float32)
                y.poison()
                f16_launch(t, ci, w, xh, y, n_out, K, NB, glu)
                g.sync()
                got = y.numpy()
                err = float(np.max(np.abs(got[:, :CHECK_ROWS] - ref)) / np.max(np.abs(ref)))
                yc = g.empty((CHUNK, n_out), np.float32)
                yc.poison()
                f16_launch(t, ci, w, xh, yc, n_out, K, CHUNK, glu)
                g.sync()
                chunk_same = bool(np.array_equal(yc.numpy().view(np.uint32), got[:CHUNK].view(np.uint32)))
                bits = got.view(np.uint32).copy()
                cfg_same = True if bits0 is None else bool(np.array_equal(bits, bits0))
                bits0 = bits if bits0 is None else bits0
                us = TL.time_us(g, [lambda: f16_launch(t, ci, w, xh, y, n_out, K, NB, glu)], args.reps)
                conv_us = TL.time_us(g, [lambda: to_f16(t, xd, xh, NB * K)], args.reps)
                flops = 2.0 * NB * rows * K
                rec.update(ok=bool(err < TOL and chunk_same and cfg_same and conv_ok), err=err, chunk_same=chunk_same,
                           config_same=cfg_same, to_f16_exact=conv_ok, us=us, to_f16_us=conv_us,
                           tflops=flops / us / 1e6)
            except Exception as e:  # a configuration that fails to launch: recorded, the rest go on
                rec.update(ok=False, error=f"{type(e).__name__}: {e}")
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()
        # the wg kernel: bits compared within one WG_BN (one wgmma shape), reported across
        wg_bits: dict = {}
        for wi in wg_live:
            cfg = WG_CONFIGS[wi]
            bn = int(cfg.get("WG_BN", 128))
            rec = {"kind": "gemm_f16_wg", "shape": name, "type": TNAME[t], "rows": rows, "K": K, "glu": glu,
                   "nb": NB, "config": cfg, "git_sha": sha, "device": g.info.name}
            try:
                y = g.empty((NB, n_out), np.float32)
                y.poison()
                launch("wg", t, wi, w, xh, y, n_out, K, NB, glu)
                g.sync()
                got = y.numpy()
                err = float(np.max(np.abs(got[:, :CHECK_ROWS] - ref)) / np.max(np.abs(ref)))
                finite = bool(np.all(np.isfinite(got)))
                yc = g.empty((CHUNK, n_out), np.float32)
                yc.poison()
                launch("wg", t, wi, w, xh, yc, n_out, K, CHUNK, glu)
                g.sync()
                chunk_same = bool(np.array_equal(yc.numpy().view(np.uint32), got[:CHUNK].view(np.uint32)))
                xo = xh.view(np.uint16, (CHUNK, K), offset=CHUNK_OFF * K * 2)
                yc.poison()
                launch("wg", t, wi, w, xo, yc, n_out, K, CHUNK, glu)
                g.sync()
                chunk_off_same = bool(np.array_equal(yc.numpy().view(np.uint32),
                                                     got[CHUNK_OFF:CHUNK_OFF + CHUNK].view(np.uint32)))
                bits = got.view(np.uint32).copy()
                cfg_same = bool(np.array_equal(bits, wg_bits[bn])) if bn in wg_bits else True
                wg_bits.setdefault(bn, bits)
                extra = {}
                if bn != 128 and 128 in wg_bits:
                    extra["same_bits_as_bn128"] = bool(np.array_equal(bits, wg_bits[128]))
                if bits0 is not None:
                    extra["same_bits_as_gemm_f16"] = bool(np.array_equal(bits, bits0))
                res_ok = True
                if not glu:   # the residual: y = fl(res + acc), acc the launch above
                    resh = rng.standard_normal((NB, n_out)).astype(np.float32)
                    resd = g.to_device(resh)
                    yr = g.empty((NB, n_out), np.float32)
                    yr.poison()
                    launch("wg", t, wi, w, xh, yr, n_out, K, NB, glu, res=resd)
                    g.sync()
                    res_ok = bool(np.array_equal(yr.numpy().view(np.uint32), (resh + got).view(np.uint32)))
                    extra["res_exact"] = res_ok
                us = TL.time_us(g, [lambda: launch("wg", t, wi, w, xh, y, n_out, K, NB, glu)], args.reps)
                flops = 2.0 * NB * rows * K
                rec.update(ok=bool(finite and err < TOL and chunk_same and chunk_off_same and cfg_same and res_ok
                                   and conv_ok), err=err, chunk_same=chunk_same, chunk_off_same=chunk_off_same,
                           config_same=cfg_same, to_f16_exact=conv_ok, us=us, tflops=flops / us / 1e6, **extra)
            except Exception as e:
                rec.update(ok=False, error=f"{type(e).__name__}: {e}")
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()
        # the engine's prompt tile on the same weight (q8 activations), the table's configuration
        kern = "gemm_tile_glu" if glu else "gemm_tile"
        cfg = table_config(kern, t, rows, K)
        rec = {"kind": "gemm_tile", "shape": name, "type": TNAME[t], "rows": rows, "K": K, "glu": glu, "nb": NB,
               "config": cfg, "git_sha": sha, "device": g.info.name}
        try:
            xq, xs = g.empty((NB, K), np.int8), g.empty((NB, K // 32), Q8_SCALE)
            MV.quantize_q8(g, xd, xq, xs, NB)
            y = g.empty((NB, n_out), np.float32)
            us = TL.time_us(g, [lambda: GT.gemm_tile(g, w, y, xq=xq, xs=xs, nb=NB, glu="silu" if glu else None,
                                                     config=cfg)], args.reps)
            q_us = TL.time_us(g, [lambda: MV.quantize_q8(g, xd, xq, xs, NB)], args.reps)
            rec.update(us=us, quantize_us=q_us, tflops=2.0 * NB * rows * K / us / 1e6)
        except Exception as e:
            rec.update(error=f"{type(e).__name__}: {e}")
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return 0


def subprocess_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
