"""Per matvec shape, the best configuration with MV_L2PF 0 (matvec.cu before variant 6: the same
SASS) against the best overall, from tune receipts of the current matvec.cu (rows whose config
names MV_L2PF).

    python3 experiments/mv_l2pf/summary.py research/tune/h200-nvidia-h200.jsonl
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    best: dict = defaultdict(dict)  # (kernel, shape) -> {l2pf: (us, cfg, gbps)}
    for line in open(path):
        r = json.loads(line)
        if r.get("kernel") not in ("matvec", "matvec_glu") or not r.get("ok"):
            continue
        c = r["config"]
        if "MV_L2PF" not in c:
            continue
        k = (r["kernel"], "cols=%(cols)s,rows=%(rows)s,type=%(type)s" % r["shape"], r["shape"].get("batch", 1))
        pf = int(c["MV_L2PF"])
        if pf not in best[k] or r["median_us"] < best[k][pf][0]:
            best[k][pf] = (r["median_us"], {a: b for a, b in c.items() if a != "MV_L2PF"}, r["gbps"])
    print(f"{'kernel':10s} {'shape':38s} {'pf0 us':>8s} {'best us':>8s} {'pf':>3s} {'gain':>6s} {'GB/s':>6s}  best config")
    tot0 = tot1 = 0.0
    for k in sorted(best):
        d = best[k]
        if 0 not in d:
            continue
        pf, (us, cfg, gb) = min(d.items(), key=lambda kv: kv[1][0])
        us0 = d[0][0]
        tot0 += us0
        tot1 += us
        print(f"{k[0]:10s} {k[1]:38s} {us0:8.2f} {us:8.2f} {pf:3d} {us0 / us:6.3f} {gb:6.0f}  {cfg}")
    if tot0:
        print(f"sum of shapes: {tot0:.1f} -> {tot1:.1f} us ({tot0 / tot1:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
