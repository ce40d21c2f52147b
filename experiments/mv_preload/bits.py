#!/usr/bin/env python3
"""MV_PRELOAD is bit-neutral: every batch-1 entry tables.py's "all" group changes, run on its own shape (random
valid blocks, random activations, residual or GLU as the engine launches it) with the entry's configuration and
with MV_PRELOAD added, the outputs compared bit for bit. One JSON line a shape; exit 1 on any difference.

    source .whl/setup.sh && python3 experiments/mv_preload/bits.py      # on the GPU
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from memra.gpu.cuda import gpu  # noqa: E402
from memra.gpu.ops import matvec as M  # noqa: E402
import tables  # noqa: E402


def main() -> int:
    g, rng, bad = gpu(), np.random.default_rng(28), 0
    with tempfile.TemporaryDirectory() as d:
        tables.main(Path(d))
        t = json.loads((Path(d) / "all" / "nvidia-h200.json").read_text())
    for kernel in ("matvec", "matvec_glu"):
        for key, buckets in t["entries"][kernel].items():
            cfg = (buckets.get("1") or {}).get("config", {})
            if "MV_PRELOAD" not in cfg:
                continue
            s = tables.shape(key)
            glu = kernel == "matvec_glu"
            c = M._Case(g, M.type_id(s["type"]), s["rows"] // 2 if glu else s["rows"], s["cols"], rng, glu=glu)
            base = {k: v for k, v in cfg.items() if k != "MV_PRELOAD"}
            ys = []
            for conf in (base, cfg):
                c.run(key, "q8", 1, act="silu" if glu else None, residual=not glu, config={"MV_KSPLIT": 1, **conf})
                ys.append(c.y.numpy().view(np.uint32).copy())
            same = bool(np.array_equal(ys[0], ys[1]))
            bad += not same
            print(json.dumps({"kernel": kernel, "shape": key, "config": cfg, "bit_identical": same,
                              "differ": int((ys[0] != ys[1]).sum())}), flush=True)
    print(f"{'ALL BIT-IDENTICAL' if not bad else f'{bad} DIFFER'}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
