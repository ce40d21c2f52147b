#!/usr/bin/env bash
# The next session's first H200 call (prepared in session 25; research/2026-12-03-session25 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session26.sh
# Carry .whl and .synthtok (no real models needed). $OUT gets at most five files (a call returns eight).
# STAGE a (~8 min):
#  1. experiments/attn_fixed/probe.py with the arm twinreg (the attention's q8 twin from registers, a warp a
#     block of 32, no staging barrier; bit-exact, checked against quantize_q8): session 25 put the twin and
#     the grid's end at 0.65-0.68 µs a launch at head 64 (SmolLM2, the 1B: 30 / 16 launches a token).
#     Predicted: 0.2-0.4 µs saved a launch at head 64 (the barrier, the shared-memory round trip and a
#     quarter of the threads doing 4 values each), less at head 128; then the same change in the engine
#     (experiments/attn_twin/ab.py), tg128 alternating on the synthetic SmolLM2 / 1B / Gemma-3 / 8B shapes
#     (predicted +1-2 % on the head-64 models) and 64 greedy ids compared. A win goes into
#     kernels/attention.cu as v9 next (kernel-check --add-to, the attention campaign, GPU tests).
#  2. experiments/attn_fa_dsplit/run.sh: attn_fa's prefill packing with two warps a 16-row tile (16 warps
#     an SM), bits against the stock kernel, timing at 512 rows, depth 0 and 4096. Predicted ~1.2x on the
#     8B at depth 4096 (issue 10's pp512 @ d4096, 0.99x in session 24), worse if the 128-register cap's
#     spills sit in the tile loop.
# STAGE l (~9 min, models shipped: experiments/ship_models.py's six calls): attention.cu v9 (stage a's
#  twinreg, landed) — the h200 campaign's attn_decode jobs again (the four table entries went stale),
#  the freeze (--pdl), kernel-check --add-to (the attention family runs whole), the GPU tests.
set -u
source experiments/h200_common.sh
stage_begin s26
case "$STAGE" in
a)
  timeout 200 python3 experiments/attn_fixed/probe.py > $R/attn-fixed-twin.jsonl 2> $R/attn-fixed.err
  log "attn_fixed rc=$? $(el)"
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if 'shape' in r: print(r['shape'], r['ctx'], 'pdl' if r['pdl'] else 'plain', 'full', r['full'], 'twinreg', r['twinreg'], 'saves', r['twinreg_saves'])
" $R/attn-fixed-twin.jsonl | tee -a $R/log.txt
  cp $R/attn-fixed-twin.jsonl $OUT/
  # the same twin in the engine (experiments/attn_twin/ab.py: attention.cu from the probe's build copy
  # at ATT_TWINREG 0 / 1), tg128, arms alternating; then 64 greedy ids of the 1B at 0 and 1
  for m in synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 synth:gemma3-270m:Q4_K_M synth:llama3-8b:Q4_K_M; do
    for n in 0 1 1 0; do
      ATT_TWINREG_AB=$n timeout 90 python3 experiments/attn_twin/ab.py bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
        --tag "ATT_TWINREG=$n (experiments/attn_twin)" --out $R/bench-twin.jsonl > $R/bench.txt 2>&1
      log "$m ATT_TWINREG=$n rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
  done
  cp $R/bench-twin.jsonl $OUT/
  greedy_ids_arms ATT_TWINREG_AB "0 1" experiments/attn_twin/ab.py llama-1b Q4_0
  mkdir -p $R/dsplit
  OUT=$R/dsplit timeout 400 bash experiments/attn_fa_dsplit/run.sh 2>&1 | tee -a $R/log.txt
  cp $R/dsplit/fa-dsplit.jsonl $OUT/ 2>/dev/null ;;
l)
  attn_land l 200
  GPU_TESTS_EXTRA="--ignore=tests/test_serve_gpu.py" gpu_tests 585 ;;
esac
tar czf $OUT/s26-$STAGE.tgz -C /tmp s26-$STAGE
