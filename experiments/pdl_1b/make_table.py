#!/usr/bin/env python3
"""build/table-1b-pdl.json: the committed H200 table with the 1B's batch-1 matvec (and its 8192-wide
quantize) choices taken from session 24's PDL-timed table (research/2026-12-03-session24/q/
table-pdl.json), nothing else changed.

Session 24 §5: the PDL-timed table as a whole lost tg128 on six of eight cells, but the 1B gained
+3.1 % (one pass of one pair). The 1B's shapes (K = 2048, and its 8192-wide down) are its own, so this
table isolates that gain for an engine A/B with arms alternating (experiments/h200_session25.sh STAGE
a, last) before any table takes it. The row-1 dispatch choices of those shapes go with them: the PDL freeze
left them to the rule (their receipts timed the replaced configurations).

    python3 experiments/pdl_1b/make_table.py     # here; prints the entries it moved
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLAIN = ROOT / "tune" / "defaults" / "nvidia-h200.json"
PDL = ROOT / "research" / "2026-12-03-session24" / "q" / "table-pdl.json"
OUT = HERE / "build" / "table-1b-pdl.json"


def is_1b(shape_key: str) -> bool:
    """The synthetic llama-1b Q4_0's matvec shapes: Q4_0 at K = 2048 (QKV, attn_output, gate+up) and
    its 8192-wide down, and its Q6_K head (2048 x 128256); Gemma-3's K = 2048 down is Q6_K at 640 rows."""
    f = dict(kv.split("=") for kv in shape_key.split(","))
    if "n" in f:   # quantize_q8 of the 8192-wide down's input: the 1B's alone
        return f["n"] == "8192"
    cols_rows = (f.get("cols"), f.get("rows"))
    return (f.get("type") == "Q4_0" and (f.get("cols") == "2048" or cols_rows == ("8192", "2048"))) or \
        (f.get("type") == "Q6_K" and cols_rows == ("2048", "128256"))


def main() -> int:
    plain, pdl = json.loads(PLAIN.read_text()), json.loads(PDL.read_text())
    moved = []
    for kernel in ("matvec", "matvec_glu", "dispatch", "dispatch_glu", "quantize_q8"):
        shapes = plain["entries"].setdefault(kernel, {})
        for skey in sorted(set(shapes) | set(pdl["entries"].get(kernel, {}))):
            if not is_1b(skey):
                continue
            new = pdl["entries"].get(kernel, {}).get(skey, {}).get("1")
            old = shapes.get(skey, {}).get("1")
            if (new and new["config"]) == (old and old["config"]):
                continue
            if new is None:
                shapes[skey].pop("1", None)
            else:
                shapes.setdefault(skey, {})["1"] = new
            moved.append(f"{kernel} {skey} 1: {old and old['config']} -> {new and new['config']}")
    plain["experiment"] = "experiments/pdl_1b: the 1B's batch-1 matvec entries from session 24's PDL-timed table"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(plain, indent=1, sort_keys=True) + "\n")
    print("\n".join(moved), file=sys.stderr)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
