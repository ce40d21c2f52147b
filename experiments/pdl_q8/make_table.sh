#!/usr/bin/env bash
# experiments/pdl_q8: the shipped table with the 8B Q8_0's batch-1 matvec entries (qkv 6144 x 4096, o 4096 x
# 4096, gate+up 28672 x 4096, down 4096 x 14336, head 128256 x 4096) taken from session 24's PDL-timed campaign
# (research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl), as session 25 did for the 1B's (+3.3 % tg128,
# adopted). The configurations only move work between warps and rows (mv_q8's order depends on K only): the
# same bits.
#   bash experiments/pdl_q8/make_table.sh DIR      -> DIR/nvidia-h200.json (and DIR/q8-pdl.jsonl)
set -euo pipefail
dir=${1:?output folder}
mkdir -p "$dir"
python3 - research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl > "$dir/q8-pdl.jsonl" <<'PY'
import json, sys
want = {("matvec", 4096, 6144), ("matvec", 4096, 4096), ("matvec_glu", 4096, 28672), ("matvec", 14336, 4096),
        ("matvec", 4096, 128256)}
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r["shape"]
    if s.get("type") == "Q8_0" and s.get("batch") == 1 and (r["kernel"], s.get("cols"), s.get("rows")) in want:
        sys.stdout.write(line)
PY
python3 -m memra tune freeze --device "NVIDIA H200" --out-dir "$dir" --pdl research/tune "$dir/q8-pdl.jsonl" > "$dir/freeze.txt"
