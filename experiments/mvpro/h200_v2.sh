#!/usr/bin/env bash
# The v2 prologue's check on the H200 (SmolLM2 only: .models/sm-a and sm-b shipped first, this
# call carrying .whl and .synthtok), with experiments/mvpro/prologue.patch and v2 applied:
# kernel-check of the matvec family (mv_q8p bits), tg128 with MEMRA_FUSED_PRO 1 / 0 / 1 / 0,
# memra profile of a decode step with the prologue. The tree's table is 3c7a5bb's (its matvec
# and norm entries stale on these sources; the same configurations either way).
set -u
source .whl/setup.sh > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=200
source experiments/h200_common.sh
link_models
timeout 120 python3 -m memra kernel-check --only matvec > $OUT/kc-matvec-v2.txt 2>&1
echo "kernel-check matvec rc=$? $(grep -c '^PASS' $OUT/kc-matvec-v2.txt) PASS"; grep -E "^FAIL" $OUT/kc-matvec-v2.txt | head
grep -E "ALL GREEN|checks passed" $OUT/kc-matvec-v2.txt | tail -1
for pro in 1 0 1 0; do
  MEMRA_FUSED_PRO=$pro timeout 60 python3 -m memra bench smollm2-135m -p 0 -n 128 --tag MEMRA_FUSED_PRO=$pro-v2 \
    --out $OUT/bench-pro-v2.jsonl 2>&1 | grep -E "gate|tg128"
done
for pro in 1 0; do
  MEMRA_FUSED_PRO=$pro timeout 60 python3 -m memra profile smollm2-135m --depth 64 --json > $OUT/profile-v2-pro$pro.jsonl \
    2> $OUT/profile-v2-pro$pro.txt
  tail -11 $OUT/profile-v2-pro$pro.txt
done
