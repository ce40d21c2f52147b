#!/usr/bin/env bash
# The next session's first H200 call (prepared in session 25; research/2026-12-03-session25 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session26.sh
# Carry .whl and .synthtok (no real models needed). $OUT gets at most five files (a call returns eight).
# STAGE a (~4 min):
#  1. experiments/attn_fixed/probe.py with the arm twinreg (the attention's q8 twin from registers, a warp a
#     block of 32, no staging barrier; bit-exact, checked against quantize_q8): session 25 put the twin and
#     the grid's end at 0.65-0.68 µs a launch at head 64 (SmolLM2, the 1B: 30 / 16 launches a token).
#     Predicted: 0.2-0.4 µs saved a launch at head 64 (the barrier, the shared-memory round trip and a
#     quarter of the threads doing 4 values each), less at head 128. A saving >= 0.2 µs goes into
#     kernels/attention.cu as v9 next (kernel-check, the attention campaign, tg128 A/B).
#  2. experiments/attn_fa_dsplit/run.sh: attn_fa's prefill packing with two warps a 16-row tile (16 warps
#     an SM), bits against the stock kernel, timing at 512 rows, depth 0 and 4096. Predicted ~1.2x on the
#     8B at depth 4096 (issue 10's pp512 @ d4096, 0.99x in session 24), worse if the 128-register cap's
#     spills sit in the tile loop.
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
  mkdir -p $R/dsplit
  OUT=$R/dsplit timeout 400 bash experiments/attn_fa_dsplit/run.sh 2>&1 | tee -a $R/log.txt
  cp $R/dsplit/fa-dsplit.jsonl $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s26-$STAGE.tgz -C /tmp s26-$STAGE
