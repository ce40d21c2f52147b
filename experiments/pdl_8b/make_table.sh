#!/usr/bin/env bash
# experiments/pdl_8b: the shipped table with the synthetic 8B models' batch-1 matvec entries (K 4096 or 14,336:
# only the 8B's shapes have them; Q8_0, Q4_0, Q4_K and Q6_K) taken from session 24's PDL-timed campaign
# (research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl), as session 25 did for the 1B's (+3.3 % tg128,
# adopted). The configurations only move work between warps and rows (mv_q8's order depends on K only): the
# same bits.
#   bash experiments/pdl_8b/make_table.sh DIR      -> DIR/nvidia-h200.json (and DIR/pdl-8b.jsonl, DIR/freeze.txt)
set -euo pipefail
dir=${1:?output folder}
mkdir -p "$dir"
python3 - research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl > "$dir/pdl-8b.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r["shape"]
    if r["kernel"] in ("matvec", "matvec_glu") and s.get("batch") == 1 and s.get("cols") in (4096, 14336):
        sys.stdout.write(line)
PY
python3 -m memra tune freeze --device "NVIDIA H200" --out-dir "$dir" --pdl research/tune "$dir/pdl-8b.jsonl" > "$dir/freeze.txt"
