"""v17 (experiments/f16_decode/v17/qf.cu: qf_gemm's cp.async staging planned once a thread, qf_mv's activations from
one address a superblock) against v16 (kernels/qf.cu, the engine's) on the device, in one process: for each qf launch
of the 8B Q4_K_M's decode step (memra.tune.campaign.plan_shapes with MEMRA_QF_HEAD=1: the 7 layer shapes and the head)
at 1 and 8 rows (qf_mv) and 16, 32 and 64 (qf_gemm), the built-in configuration (above 8 rows AB_CONFIGS' too) timed as `memra tune` times a job (memra.tune.measure.gpu_measure: CUDA graphs of 20 launches
over weight copies rotated past the L2), arms v16, v17, v16 in turn. Bits: v16 runs first, so the tune case's
reference bits (its built-in configuration's launch on the cached inputs) are v16's, and v17's check passes only if
every output equals them (`ok`).

Prediction (static SASS of the superblock loop, NVRTC 13.5 here; the device's NVRTC 13.0 may differ): the glu Q4_K
gate+up at 64 rows 1,117 -> 720 instructions with v16's three staging loops (run 1-5 times a superblock) gone, the
Q6_K down 1,283 -> 954, the Q4_K down 1,064 -> 609, the Q4_K QKV at 16 rows 1,010 -> 495; qf_gemm issued ~48 % of
its cycles on the H100 (ncu, session 55), so ~1.3-1.6x at 64 rows if the issue slots bind. qf_mv's loop (two
superblocks) 889 -> 770 (Q4_K), 1,240 -> 1,111 (Q6_K): ~5-10 % at one row, where the kernel sits between DRAM and
its issue rate (62 % of DRAM against mv_q8's 75 %).

    source .whl/setup.sh && python3 experiments/f16_decode/v17/ab.py --out $OUT/v17-ab.jsonl [--reps 30]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

NBS = tuple(int(v) for v in os.environ.get("AB_NBS", "1,8,16,32,64").split(","))
# extra qf_gemm configurations beside the built-in one, "GW NT ST KS" each (QF_WSMEM 1)
CONFIGS = [dict(zip(("QF_GWARPS", "QF_NT", "QF_STAGES", "QF_KSPLIT"), map(int, c.split())), QF_WSMEM=1)
           for c in os.environ.get("AB_CONFIGS", "").split(";") if c.strip()]


def kernels_with(src: Path) -> Path:
    """A kernels folder: the checkout's headers and `src` as qf.cu."""
    d = Path(tempfile.mkdtemp(prefix="qf-v17-"))
    for f in (ROOT / "kernels").glob("*.cuh"):
        shutil.copy(f, d / f.name)
    shutil.copy(src, d / "qf.cu")
    return d


def loader(root: Path | None):
    """memra.gpu.ops.qf._module compiling from `root` (None: the engine's kernels/)."""
    from memra.gpu.compile import compile_cubin
    from memra.gpu.cuda import Module
    from memra.gpu.ops import qf as QF

    cache = {}

    def _module(g, cfg, canary=0):
        d = {**cfg, **({"MEMRA_CANARY": canary} if canary else {})}
        key = tuple(sorted(d.items()))
        if key not in cache:
            cache[key] = g.module(QF.KERNEL_FILE, d) if root is None else \
                Module(g, QF.KERNEL_FILE, d, compile_cubin(QF.KERNEL_FILE, g.info.arch, d, root=root))
        return cache[key]
    return _module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    os.environ["MEMRA_QF_HEAD"] = "1"
    from memra.gpu.cuda import gpu
    from memra.gpu.ops import qf as QF
    from memra.tune.campaign import Job, model_info, plan_shapes
    from memra.tune.measure import gpu_measure

    g = gpu()
    arms = {"v16": loader(None), "v17": loader(kernels_with(HERE / "qf.cu"))}
    m = model_info("synth:llama3-8b:Q4_K_M")
    measure = gpu_measure(g, reps=args.reps, seed=17)
    out = open(args.out, "a")
    base = {"device": g.info.name, "git_sha": os.environ.get("MEMRA_GIT_SHA", ""), "reps": args.reps}
    t0 = time.time()
    for nb in NBS:
        for op, kernel, shape in plan_shapes(m, nb):
            if kernel not in ("qf", "qf_glu"):
                continue
            for cfg in [{}] + (CONFIGS if nb > QF.MV_ROWS else []):
                job = Job(kernel=kernel, variant="qf", config=cfg, shape={**shape, "batch": nb}, src="qf.cu")
                for arm in ("v16", "v17", "v16"):
                    QF._module = arms[arm]
                    r = measure(job)
                    rec = {"kind": "v17_ab", **base, "arm": arm, "op": op, "kernel": kernel, "shape": shape, "nb": nb, "config": cfg,
                           **{k: r.get(k) for k in ("ok", "max_err", "error", "median_us", "p20_us", "p80_us",
                                                    "bytes")}}
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    print(f"{time.time() - t0:6.1f}s {arm} {op:12s} {kernel:6s} nb={nb:2d} {shape} {cfg or 'built-in'} "
                          f"ok={r.get('ok')} {r.get('median_us') or r.get('error')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
