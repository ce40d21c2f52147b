#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_tc/build/attention.cu (make.py) at ATT_TC = $ATT_TC
(default 1; 0 is kernels/attention.cu's code), kernels/ untouched (experiments/engine_arm.py). The tensor-core body
takes 16 keys a warp (ATT_TILE = 16 ATT_WARPS) or a warp pair (ATT_TILE = 8 ATT_WARPS: the shipped table's 8 warps
and 64-key tiles); `table` writes a table whose attn_decode entries take the first (tile_table below). Bench
receipts carry {"attention": "attn_tc N"} in their seams (off the boards). Every attention.cu module gets ATT_TC,
so a model it cannot build (head 256, a q8_0 cache, MEMRA_ATT_RING=0) fails to compile.

    ATT_TC=1 python3 experiments/attn_tc/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -d 4096   # pairs, shipped table
    python3 experiments/attn_tc/ab.py table tune/defaults/nvidia-h200.json /tmp/t128.json   # tile 128 at 8 warps
    ATT_TC=1 python3 experiments/attn_tc/ab.py bench synth:llama-1b:Q4_0 -p 0 -n 128 -d 4096 --tune-table /tmp/t128.json
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def tile_table(src: str, dst: str) -> None:
    """src's table with every attn_decode entry's ATT_TILE set to 16 ATT_WARPS (the tensor-core body's tile)."""
    t = json.loads(Path(src).read_text())
    for entry in t["entries"]["attn_decode"].values():
        for choice in entry.values():
            cfg = choice["config"]
            cfg["ATT_TILE"] = 16 * int(cfg.get("ATT_WARPS", 4))
    Path(dst).write_text(json.dumps(t, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["table"]:
        tile_table(sys.argv[2], sys.argv[3])
        sys.exit(0)
    import engine_arm  # noqa: E402
    import make  # noqa: E402

    tc = int(os.environ.get("ATT_TC", "1"))
    make.generate()
    engine_arm.run("attention.cu", make.ARM_FILE, {"ATT_TC": tc}, {"attention": f"attn_tc {tc}"}, sys.argv[1:])
