#!/usr/bin/env bash
# ATT_PREFETCH A/B on the H200 (SmolLM2: .models/sm-a and sm-b shipped first; this call carries
# .whl and .synthtok): tg128 at depth 0 and 4096 with MEMRA_ATT_PREFETCH 1 / 0 / 1 / 0, then
# memra profile of a decode step at depth 64 and 4096 with each.
set -u
source .whl/setup.sh > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=200
source experiments/h200_common.sh
link_models
for pf in 1 0 1 0; do
  MEMRA_ATT_PREFETCH=$pf timeout 60 python3 -m memra bench smollm2-135m -p 0 -n 128 -d 0,4096 \
    --tag MEMRA_ATT_PREFETCH=$pf --out $OUT/bench-att-prefetch.jsonl 2>&1 | grep -E "gate|tg128"
done
for pf in 1 0; do
  for d in 64 4096; do
    MEMRA_ATT_PREFETCH=$pf timeout 60 python3 -m memra profile smollm2-135m --depth $d --json \
      >> $OUT/profile-att-prefetch$pf.jsonl 2> $OUT/profile-att-prefetch$pf-d$d.txt
    grep -E "attn_decode|step" $OUT/profile-att-prefetch$pf-d$d.txt | tail -2
  done
done
