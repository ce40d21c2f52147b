#!/usr/bin/env bash
# Session 11: attn_fa's decode packing with RoPE, the KV append, the split merge and the q8 twin
# inside (kernels/attn_fa.cu v5) — kernel-check of the attention families, then MEMRA_ATTN=decode
# against MEMRA_ATTN=fa, one after the other per model (synthetic files of the four benchmark
# shapes: pp512 and tg128, and the 8B's tg128 at depth 4096). No models need shipping; carry
# .whl and .synthtok:
#   source .whl/setup.sh && bash experiments/h200_fa11.sh
# $OUT/kc-fa.txt, $OUT/ab-fa.jsonl (memra bench receipts; fa runs carry the seam), $OUT/ab-fa.log
set -u
: "${OUT:?}"
export PYTHONUNBUFFERED=1 COLUMNS=200
TOK=.synthtok/smollm2-tokenizer.gguf
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
timeout 200 python3 -m memra kernel-check --only "${KC_ONLY:-attn_fa,attention,rope}" > $OUT/kc-fa.txt 2>&1
echo "kernel-check rc=$? $(el)"; grep -aE "^FAIL|MISSED|not caught|GREEN|RED" $OUT/kc-fa.txt | head -20
for m in ${MODELS:-synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M}; do
  for a in decode fa; do
    MEMRA_ATTN=$a timeout 150 python3 -m memra bench $m -p 512 -n 128 -r ${REPS:-3} --synth-tokenizer $TOK \
      --out $OUT/ab-fa.jsonl > $OUT/ab-fa-cur.txt 2>&1
    echo "$m $a rc=$? $(el)"; grep -aE "gate|pp512|tg128|rror" $OUT/ab-fa-cur.txt | tail -4
    cat $OUT/ab-fa-cur.txt >> $OUT/ab-fa.log
  done
done
if [ -n "${DEPTH:-4096}" ]; then
  for a in decode fa; do
    MEMRA_ATTN=$a timeout 150 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 512 -n 128 -d ${DEPTH:-4096} -r ${REPS:-3} \
      --synth-tokenizer $TOK --out $OUT/ab-fa.jsonl > $OUT/ab-fa-cur.txt 2>&1
    echo "8B d${DEPTH:-4096} $a rc=$? $(el)"; grep -aE "gate|pp512|tg128|rror" $OUT/ab-fa-cur.txt | tail -4
    cat $OUT/ab-fa-cur.txt >> $OUT/ab-fa.log
  done
fi
rm -f $OUT/ab-fa-cur.txt
echo "done $(el)"
