"""A copy of a tuning table with MV_L2PF set on the matvec entries whose shapes gained in the
session-18 campaign (research/2026-12-03-session18/l2pf/): the engine-level A/B of matvec.cu
variant 6 without a new freeze.

    python3 experiments/mv_l2pf/table_pf.py tune/defaults/nvidia-h200.json OUT.json [PF]
"""
import json
import sys

# the campaign's best configuration of each (its best with MV_L2PF 0 is the table's, or as fast)
SHAPES = {"cols=8192,rows=2048,type=Q4_0": {"MV_NWARPS": 8, "MV_ROWS": 2, "MV_UNROLL": 2, "MV_L2PF": 1},
          "cols=4096,rows=1024,type=Q6_K": {"MV_NWARPS": 4, "MV_ROWS": 1, "MV_UNROLL": 2, "MV_L2PF": 1}}

t = json.load(open(sys.argv[1]))
pf = int(sys.argv[3]) if len(sys.argv) > 3 else None
for shape, v in SHAPES.items():
    for batch, e in t["entries"]["matvec"].get(shape, {}).items():
        e["config"] = dict(v) if pf is None else dict(v, MV_L2PF=pf)
        print("set", shape, batch, e["config"])
json.dump(t, open(sys.argv[2], "w"), indent=1)
