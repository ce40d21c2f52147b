#!/usr/bin/env bash
# experiments/pdl_8b: the shipped table with the synthetic 8B models' batch-1 matvec entries (K 4096 or 14,336:
# only the 8B's shapes have them; Q8_0, Q4_0, Q4_K and Q6_K) taken from session 24's PDL-timed campaign
# (research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl), as session 25 did for the 1B's (+3.3 % tg128,
# adopted): `memra tune freeze --pdl --pdl-match` over research/tune and that campaign, the expression naming
# the shipped PDL entries (the 1B's) and the 8B's. The configurations only move work between warps and rows
# (mv_q8's order depends on K only): the same bits.
#   bash experiments/pdl_8b/make_table.sh DIR      -> DIR/nvidia-h200.json (and DIR/freeze.txt)
set -euo pipefail
dir=${1:?output folder}
mkdir -p "$dir"
adopted='(matvec|matvec_glu) cols=2048,rows=(2048|3072|16384|128256),type=[A-Z0-9_]+|quantize_q8 n=8192'
eight_b='(matvec|matvec_glu) cols=(4096|14336),rows=[0-9]+,type=[A-Z0-9_]+'
python3 -m memra tune freeze --device "NVIDIA H200" --out-dir "$dir" --pdl --pdl-match "$adopted|$eight_b" \
  research/tune research/2026-12-03-session24/q/h200-pdl-nvidia-h200.jsonl > "$dir/freeze.txt"
