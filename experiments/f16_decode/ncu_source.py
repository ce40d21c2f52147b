"""ncu's source page (`ncu -i R --page source --csv --print-source sass`, STAGE p of experiments/h200_session49.sh) as
numbers: executed warp instructions by opcode, warp-stall samples by reason and by opcode, the hottest instructions.

    python3 experiments/f16_decode/ncu_source.py research/2026-12-07-session53/prof/prof-8B-gate_up-64.csv.gz [TOP]
"""
from __future__ import annotations

import collections
import csv
import gzip
import re
import sys


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main(path: str, top: int = 12) -> int:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    hdr = rows[1]
    data = [r for r in rows[2:] if len(r) >= len(hdr)]
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ops, op_samples, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in data:
        m = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", r[ix["Source"]].strip())
        op = m.group(1) if m else "?"
        ops[op] += num(r[ix["Instructions Executed"]])
        op_samples[op] += num(r[ix["Warp Stall Sampling (All Samples)"]])
        for c in stall_cols:
            stalls[c[6:]] += num(r[ix[c]])
    n, s, t = sum(ops.values()), sum(op_samples.values()), sum(stalls.values())
    print(f"{rows[0][1] if len(rows[0]) > 1 else ''}: {n:.0f} warp instructions, {s:.0f} stall samples")
    print("mix %:", ", ".join(f"{k} {100 * v / n:.1f}" for k, v in ops.most_common(16)))
    print("stalls %:", ", ".join(f"{k} {100 * v / t:.1f}" for k, v in stalls.most_common(10)))
    print("samples by opcode %:", ", ".join(f"{k} {100 * v / s:.1f}" for k, v in op_samples.most_common(12)))
    hot = sorted(data, key=lambda r: -num(r[ix["Warp Stall Sampling (All Samples)"]]))[:top]
    for r in hot:
        reasons = sorted(((num(r[ix[c]]), c[6:]) for c in stall_cols), reverse=True)[:2]
        print(f"  {100 * num(r[ix['Warp Stall Sampling (All Samples)']]) / s:5.1f}%  threads "
              f"{r[ix['Avg. Threads Executed']]:>4}  {r[ix['Source']].strip()[:60]:60s} {reasons}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
