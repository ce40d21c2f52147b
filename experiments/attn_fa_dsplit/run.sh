#!/usr/bin/env bash
# attn_fa_dsplit on the H200 (~2 min): bits against the stock kernel at split 256 (several splits a
# row) and the engine's 4096, then timing at 512 rows, depth 0 and 4096, arms alternating.
#   source .whl/setup.sh >/dev/null && bash experiments/attn_fa_dsplit/run.sh     # $OUT set
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
timeout 150 python3 experiments/attn_fa_dsplit/ab.py --split 256 --no-timing > $OUT/fa-dsplit-256.jsonl 2> $OUT/fa-dsplit-256.err
echo "split 256 rc=$? $(tail -1 $OUT/fa-dsplit-256.err)"
timeout 300 python3 experiments/attn_fa_dsplit/ab.py --split 4096 > $OUT/fa-dsplit.jsonl 2> $OUT/fa-dsplit.err
echo "split 4096 rc=$? $(tail -1 $OUT/fa-dsplit.err)"
python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if 'us_stock' in r: print(r['shape'], r['depth'], r['variant'], r['us_stock'], r['us_variant'], r['speedup_vs_stock'])
" $OUT/fa-dsplit.jsonl
