#!/usr/bin/env python3
"""dispatch_probe: which of a matvec's three bit-identical paths is fastest at each row count.

Issue 10 asks for a measured threshold per weight type and shape between the batched matvec
and the GEMM; the planner uses constants (mv_q8 below MVT_MIN_ROWS = 3 rows, the skinny mvt
below GEMM_MIN_ROWS = 16, the GEMM from there). This probe times, for every matvec shape a
model decodes with (memra.tune.campaign.plan_shapes) and each row count, the three paths
with the device table's configuration for that kernel, shape and row bucket (mv_q8 in chunks
of <= 8 rows with the 8-row bucket's above 8 rows, as the engine launches it), through
memra.tune's measure (the job's check against the family's reference first, then a CUDA
graph of launches, median of replays; inputs rotated past twice the L2). It prints the
winner per shape and row count and the thresholds that would follow, and writes one JSON
line per measurement to $OUT/dispatch-probe.jsonl (or --out).

    python3 experiments/dispatch_probe.py -m smollm2-135m -m synth:llama3-8b:Q4_K_M \
        [--rows 1,2,3,4,6,8,12,16,24,32,48,64] [--ops qkv,attn_output,gate_up,down] [--reps 30] [--list]

--list prints the jobs without a GPU. Every job's inputs and check were run on the CPU
emulator (tests/gpu_emulator.py) for SmolLM2 at 2, 12 and 24 rows; the timing needs the GPU.
The output head is slow to check (its float64 reference per job): --ops leaves it out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SRC = {"matvec": "matvec.cu", "mvt": "mvt.cu", "gemm": "gemm.cu"}


def shapes(model: str) -> list[tuple[str, str, dict]]:
    """(op, kernel, shape) of the model's q8 matvecs at one row (the decode step's)."""
    from memra.tune.campaign import model_info, plan_shapes

    out, seen = [], set()
    for op, kernel, s in plan_shapes(model_info(model), 1):
        if kernel in ("matvec", "matvec_glu") and (kernel, s["type"], s["rows"], s["cols"]) not in seen:
            seen.add((kernel, s["type"], s["rows"], s["cols"]))
            out.append((op, kernel, dict(s)))
    return out


def jobs(models, rows, table, ops=None) -> list:
    from memra.gpu.ops import gemm as GEMM
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops import mvt as MVT
    from memra.tune import tables as TABLES
    from memra.tune.campaign import Job

    out = []
    for m in models:
        for op, kernel, s in shapes(m):
            if ops and op not in ops:
                continue
            t = MV.type_id(s["type"])
            if t in MV.FLOAT_TYPES:
                continue
            glu = kernel.endswith("_glu")
            for r in rows:
                for path in ("matvec", "mvt", "gemm"):
                    if (path == "mvt" and t not in MVT.TYPES) or (path == "gemm" and t not in GEMM.TYPES):
                        continue
                    k = path + ("_glu" if glu else "")
                    ch = TABLES.lookup(table, k, s, min(r, 8) if path == "matvec" else r) if table else None
                    cfg = dict(ch.config) if ch is not None and ch.variant == "q8" else {}
                    out.append((m, op, path, Job(kernel=k, variant="q8", config=cfg, shape={**s, "batch": r},
                                                 src=SRC[path])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ops", default="", help="only these ops (comma list: qkv, attn_output, gate_up, down, output)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    models = a.model or ["smollm2-135m", "synth:llama3-8b:Q4_K_M"]
    rows = [int(x) for x in a.rows.split(",")]
    ops = {x for x in a.ops.split(",") if x}
    if a.list:
        for m, op, path, j in jobs(models, rows, None, ops):
            print(m, op, path, j.label())
        return 0
    from memra.gpu import cuda
    from memra.tune import tables as TABLES
    from memra.tune.measure import device_context, gpu_measure, precompile

    g = cuda.gpu()
    table, where = TABLES.load_table(g.info.name, g.info.cc, sms=g.info.sm_count)
    todo = jobs(models, rows, table, ops)
    n, bad = precompile([j for *_, j in todo], g.info.arch)  # every module, in parallel
    print(f"{len(todo)} jobs; {n} modules compiled, {bad} refused", flush=True)
    ctx = device_context(g)
    measure = gpu_measure(g, reps=a.reps, seed=0)
    out = Path(a.out or os.path.join(os.environ.get("OUT", "."), "dispatch-probe.jsonl"))
    best: dict[tuple, dict] = {}
    with open(out, "a") as f:
        for m, op, path, j in todo:
            try:
                res = measure(j)
            except Exception as e:  # a configuration the launcher refuses: recorded, the probe goes on
                res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            row = {"kind": "dispatch-probe", "model": m, "op": op, "path": path, "kernel": j.kernel,
                   "shape": {k: v for k, v in j.shape.items() if k != "batch"}, "rows": j.shape["batch"],
                   "config": j.config, "table": where, **{k: ctx[k] for k in ("device", "git_sha")}, **res}
            f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
            f.flush()
            key = (m, op, j.shape["type"], j.shape["rows"], j.shape["cols"], j.shape["batch"])
            if res.get("ok") and (key not in best or res["median_us"] < best[key]["us"]):
                best[key] = {"path": path, "us": res["median_us"]}
            print(f"{m} {op} {path:6s} {j.label()}: "
                  + (f"{res['median_us']:.2f} us" if res.get("ok") else f"FAILED {res.get('error')}"), flush=True)
    print("\nfastest path per shape and row count (the constants: mv_q8 < 3 <= mvt < 16 <= gemm)")
    per: dict[tuple, list] = {}
    for (m, op, t, n, k, r), b in sorted(best.items()):
        per.setdefault((m, op, t, n, k), []).append(f"{r}:{b['path']}")
    for key, v in per.items():
        print(" ".join(map(str, key)), " ".join(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
