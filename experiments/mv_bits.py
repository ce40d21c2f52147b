#!/usr/bin/env python3
"""A decode-matvec tunable is bit-neutral: every batch-1 entry an experiment's candidate group changes
(experiments/mv_*/tables.py GROUPS), run on its own shape (random valid blocks, random activations, residual or
GLU as the engine launches it) with the shipped entry's configuration and with the group's tunables laid over it,
the outputs compared bit for bit. One JSON line a shape; exit 1 on any difference.

    source .whl/setup.sh && python3 experiments/mv_bits.py experiments/mv_early/tables.py mid [MAKE_PY]   # on the GPU

MAKE_PY (e.g. experiments/mv_early/make.py): the experiment's generator of a build copy of kernels/matvec.cu
(its generate() and ARM_FILE); every matvec.cu module then comes from that copy (experiments/engine_arm.route).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mv_tables  # noqa: E402
from memra.gpu.cuda import gpu  # noqa: E402
from memra.gpu.ops import matvec as M  # noqa: E402


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(tables_py: str, group: str, make_py: str | None = None) -> int:
    pick = load(tables_py, "tables").GROUPS[group]
    if make_py:
        import engine_arm

        make = load(make_py, "make")
        make.generate()
        engine_arm.route("matvec.cu", make.ARM_FILE, {})
    g, rng, bad = gpu(), np.random.default_rng(28), 0
    t = json.loads(mv_tables.SHIPPED.read_text())
    for kernel in ("matvec", "matvec_glu"):
        for key, buckets in t["entries"][kernel].items():
            base = (buckets.get("1") or {}).get("config")
            s = mv_tables.shape(key)
            extra = pick(kernel, s) if base else None
            if not extra:
                continue
            glu = kernel == "matvec_glu"
            if s["rows"] * s["cols"] > 1 << 28:   # the LM heads: their float64 reference would take minutes
                print(json.dumps({"kernel": kernel, "shape": key, "skipped": "size"}), flush=True)
                continue
            tid, N = M.type_id(s["type"]), s["rows"] // 2 if glu else s["rows"]
            c = M._Case(g, tid, N, s["cols"], rng, glu=glu)
            ys = []
            for conf in (base, {**base, **extra}):   # laid over the shape's built-in configuration, as the engine does
                cfg = M.launch_config(tid, True, N, s["cols"], 1, glu, None, lambda _n, conf=conf: conf)
                c.run(key, "q8", 1, act="silu" if glu else None, residual=not glu, config=cfg)
                ys.append(c.y.numpy().view(np.uint32).copy())
            same = bool(np.array_equal(ys[0], ys[1]))
            bad += not same
            print(json.dumps({"kernel": kernel, "shape": key, "config": {**base, **extra}, "bit_identical": same,
                              "differ": int((ys[0] != ys[1]).sum())}), flush=True)
    print("ALL BIT-IDENTICAL" if not bad else f"{bad} DIFFER", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
