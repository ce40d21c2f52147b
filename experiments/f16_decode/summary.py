"""Per shape and row count, the probe's times in one line each (the q8 kernel, then every f16 configuration), and
the bits records' nonzero counts: the tables of README.md come from this.

    python3 experiments/f16_decode/summary.py research/2026-12-07-session52/f16/mv-f16.jsonl [more.jsonl ...]
"""
from __future__ import annotations

import collections
import json
import sys

SKIP = ("WG_MT", "WG_STAGES", "WG_INFLIGHT", "WG_PREFETCH")


def label(r: dict) -> str:
    if r["kernel"] in ("matvec", "mvt", "gemm"):
        return r["kernel"]
    return r["kernel"] + str(tuple(v for k, v in r["config"].items() if k not in SKIP))


def main(paths: list[str]) -> int:
    for path in paths:
        rows = [json.loads(line) for line in open(path)]
        by = collections.defaultdict(list)
        for r in rows:
            if r["kind"] == "time" and "us" in r:
                by[(r["model"], r["op"], r["type"], r["nb"])].append(r)
            elif r["kind"] == "perm":
                print("perm", r["values"], r["perm"], "differ", r["differ"], "of", r["outputs"])
            elif r["kind"].endswith("_bits"):
                bad = {k: v for k, v in r["checks"].items()
                       if any(isinstance(x, int) and not isinstance(x, bool) and x for x in v.values())}
                print(r["kind"], r["model"], r["op"], r["type"], f"{len(r['checks'])} checks,",
                      "nonzero:", {k: [x for x in v.values() if isinstance(x, int) and not isinstance(x, bool)]
                                   for k, v in bad.items()} or "none")
        for k, v in by.items():
            print(path.rsplit("/", 1)[-1], k, " | ".join(f"{label(r)} {r['us']}" for r in v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
