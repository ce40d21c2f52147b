#!/usr/bin/env bash
# MEMRA_ATT_DEPTH=1 (the depth path, session 12) against the default, one H200 call (~3 min), synthetic
# files, arms interleaved:
#   source .whl/setup.sh && bash experiments/h200_depth13.sh      (carry .whl, .synthtok)
# Per model: tg128 from depth 0 (the path's one-split decode grid and the table's heads per block),
# then pp512 + tg128 at depth 4096 (its split count and whole-group blocks), -r 3 each. The
# prediction (research/2026-12-02-session12/depth/): tg128 @ d4096 8B +12.7 %, 1B +17.7 %,
# SmolLM2 +2-3 %, Gemma-3 about 0 (its blocks stay one head below 132 splits); tg128 d0 within
# 1 %; pp512 @ d4096 -13 to -21 % until prefill stops paying a block per split (experiments/attn_walk).
# Receipts in $OUT/depth13.jsonl (the depth arm's seams name it), log $OUT/depth13.log.
NAME=depth13
source experiments/h200_synth_bench.sh
for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M; do
  for arm in 0 1 0 1; do MEMRA_ATT_DEPTH=$arm bench depth=$arm $m -p 0 -n 128 -r 3; done
  for arm in 0 1; do MEMRA_ATT_DEPTH=$arm bench depth=$arm $m -p 512 -n 128 -d 4096 -r 3; done
done
log done
