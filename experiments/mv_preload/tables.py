#!/usr/bin/env python3
"""Candidate tables for the MV_PRELOAD engine A/B: the shipped H200 table with MV_PRELOAD set on the
batch-1 matvec entries a group names, nothing else changed (MV_PRELOAD only moves loads before the
PDL wait: the same bits).

    python3 experiments/mv_preload/tables.py OUT_DIR     -> OUT_DIR/{mid,all}/nvidia-h200.json

mid: the 4096-wide non-GLU matvecs short of the LM head (attn_output, QKV and its parts), MV_PRELOAD 2:
     at K = 4096 a lane has 2 units a row, so its whole slice is in registers before the wait.
all: mid, plus gate+up (4096-wide GLU, MV_PRELOAD 2) and ffn_down (14,336-wide, the first 2 of 7 units).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "tune" / "defaults" / "nvidia-h200.json"


def shape(key: str) -> dict:
    return {k: (v if k == "type" else int(v)) for k, v in re.findall(r"(\w+)=(\w+)", key)}


def pick(kernel: str, key: str, group: str) -> int:
    s = shape(key)
    if kernel == "matvec" and s["cols"] == 4096 and s["rows"] < 100_000:
        return 2
    if group == "all" and kernel == "matvec_glu" and s["cols"] == 4096:
        return 2
    if group == "all" and kernel == "matvec" and s["cols"] == 14336:
        return 2
    return 0


def main(out: Path) -> None:
    for group in ("mid", "all"):
        t = json.loads(SHIPPED.read_text())
        n = 0
        for kernel in ("matvec", "matvec_glu"):
            for key, buckets in t["entries"][kernel].items():
                e = buckets.get("1")
                if e and (p := pick(kernel, key, group)):
                    e["config"] = {**e["config"], "MV_PRELOAD": p}
                    n += 1
                    print(f"{group}: {kernel} {key} {e['config']}")
        d = out / group
        d.mkdir(parents=True, exist_ok=True)
        (d / "nvidia-h200.json").write_text(json.dumps(t, indent=1, sort_keys=True))
        print(f"{group}: {n} entries -> {d / 'nvidia-h200.json'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
