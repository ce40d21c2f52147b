#!/usr/bin/env bash
# attention.cu variant 7 (ATT_PIPE: the next tile's K rows loaded when a tile starts; README.md,
# withdrawn, not committed) against variant 6, end to end, one H200 call, synthetic files. With
# the variant in kernels/attention.cu and variant 6 beside it:
#   git show c178ed7:kernels/attention.cu > experiments/attn_pipe/old_attention.cu
#   source .whl/setup.sh && bash experiments/attn_pipe/ab.sh          (carry .whl, .synthtok)
# Arms, each a copy of the tree under /tmp: old (variant 6), pipe (kernels/attention.cu as is),
# pipe-m3 (ATT_MINB 3: at most 85 registers, 3 blocks of 256 threads an SM). Per model, arms
# interleaved: tg128 from depth 0, then pp512 + tg128 at depth 4096 (-r 3). Receipts carry the
# arm as a seam; $OUT/attn-pipe.{jsonl,log}.
set -u
: "${OUT:?}"
export PYTHONUNBUFFERED=1 COLUMNS=200
TOK=$PWD/.synthtok/smollm2-tokenizer.gguf
T0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/attn-pipe.log; }
for a in old pipe pipe-m3; do
  rm -rf /tmp/arm-$a && mkdir -p /tmp/arm-$a && cp -r memra kernels tune pyproject.toml /tmp/arm-$a/
done
cp experiments/attn_pipe/old_attention.cu /tmp/arm-old/kernels/attention.cu
sed -i 's/^#define ATT_MINB 1$/#define ATT_MINB 3/' /tmp/arm-pipe-m3/kernels/attention.cu
grep -c "define ATT_MINB 3" /tmp/arm-pipe-m3/kernels/attention.cu | tee -a $OUT/attn-pipe.log
bench() {  # arm model args...
  local a=$1 m=$2; shift 2
  ( cd /tmp/arm-$a && MEMRA_EXPERIMENT_ARM=$a PYTHONPATH=/tmp/site:/tmp/arm-$a timeout 120 python3 -m memra bench $m \
      --synth-tokenizer $TOK --out $OUT/attn-pipe-$a.jsonl "$@" > /tmp/cur.txt 2>&1 )
  log "$a $m $* rc=$? $(grep -aE 'pp512|tg128' /tmp/cur.txt | tr -s ' ' | cut -d' ' -f2- | tr '\n' ' ')"
}
for m in synth:llama3-8b:Q4_K_M synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0; do
  for a in old pipe pipe-m3; do bench $a $m -p 0 -n 128 -r 3; done
  for a in old pipe pipe-m3; do bench $a $m -p 512 -n 128 -d 4096 -r 3; done
  for a in pipe-m3 pipe old; do bench $a $m -p 0 -n 128 -r 3; done
done
log done
