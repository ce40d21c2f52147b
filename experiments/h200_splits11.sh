#!/usr/bin/env bash
# Session 11: a prefill chunk's attention launched with the deepest row's split count
# (memra.gpu.ops.attention.splits_for) instead of the plan's — kernel-check of the attention
# family (its split-count checks: the same bits with both grids), then MEMRA_PREFILL_SPLITS=full
# (the old grid) against the default, one after the other per model (synthetic files of the
# benchmark shapes; pp512, and a short tg as the control). Carry .whl and .synthtok:
#   source .whl/setup.sh && bash experiments/h200_splits11.sh
# $OUT/kc-att.txt, $OUT/ab-splits.jsonl (receipts; the full arm carries its seam), $OUT/ab-splits.log
set -u
: "${OUT:?}"
export PYTHONUNBUFFERED=1 COLUMNS=200
TOK=.synthtok/smollm2-tokenizer.gguf
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
timeout 100 python3 -m memra kernel-check --only attention > $OUT/kc-att.txt 2>&1
echo "kernel-check rc=$? $(el)"; grep -aE "split count|^FAIL|MISSED|not caught|GREEN|FAILED" $OUT/kc-att.txt | head -12
for m in ${MODELS:-synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M}; do
  for a in full default; do
    if [ $a = full ]; then export MEMRA_PREFILL_SPLITS=full; else unset MEMRA_PREFILL_SPLITS; fi
    timeout 100 python3 -m memra bench $m -p 512 -n 32 -r ${REPS:-3} --synth-tokenizer $TOK \
      --out $OUT/ab-splits.jsonl > $OUT/cur.txt 2>&1
    echo "$m $a rc=$? $(el)"; grep -aE "gate prefill|pp512|tg32|rror" $OUT/cur.txt | tail -3
    cat $OUT/cur.txt >> $OUT/ab-splits.log
  done
done
rm -f $OUT/cur.txt; echo "done $(el)"
