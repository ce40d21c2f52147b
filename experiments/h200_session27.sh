#!/usr/bin/env bash
# Session 27's H200 calls (research/2026-12-04-session27).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=t bash experiments/h200_session27.sh
# Carry .whl and .synthtok; STAGE t needs the real models shipped first (experiments/ship_models.py's six
# calls, the machine kept warm).
# STAGE t (~9 min):
#  1. experiments/attn_fixed/probe.py --rows 64: the decode attention of a 64-row step cut step by step (the
#     8B and 1B head shapes, 128 and 512 keys, one head a block and the whole GQA group). Session 24's
#     profile had the 8B's at 44.7 µs a layer at depth 128 (804 GB/s; the K/V it reads, 33.5 MB, take
#     ~8 µs at the copy bandwidth): which step holds the rest decides the next change.
#  2. The GPU tests whole (tests/test_serve_gpu.py included): they last passed whole in session 23; sessions
#     24-26 ran them after campaigns and ran out of the call's time.
# STAGE p (~6 min, no real models): experiments/attn_fixed/probe.py --rows 64 --sweep (the bit-neutral
#  choices a 64-row step could make apart from batch 1: heads a block, ring stages, the early prologue; 128,
#  512, 2048 keys), then ncu of the 8B's 64-row step (memra profile -np 64 -d 128): gemm_q8_glu (34 % of
#  the step in session 24's profile, 97 TOPS) and attn_decode_rope.
set -u
source experiments/h200_common.sh
stage_begin s27
case "$STAGE" in
t)
  link_models "the GPU tests' real-model cases need them"
  timeout 150 python3 experiments/attn_fixed/probe.py --rows 64 > $R/attn-rows64.jsonl 2> $R/attn-rows64.err
  log "attn rows64 rc=$? $(el)"; tail -3 $R/attn-rows64.err | tee -a $R/log.txt
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r.get('shape'), r.get('ctx'), 'hpb', r.get('hpb'), 'splits', r.get('splits'), 'phase', r.get('phase'), 'wait', r.get('wait'),
          ' '.join(f'{k}={r[k]}' for k in r if k.startswith('d_')), 'full', r.get('full'), 'GB/s', r.get('gbps'), r.get('error', ''))
" $R/attn-rows64.jsonl | tee -a $R/log.txt
  cp $R/attn-rows64.jsonl $OUT/
  gpu_tests 585 ;;
p)
  timeout 240 python3 experiments/attn_fixed/probe.py --rows 64 --sweep > $R/attn-rows64-sweep.jsonl 2> $R/sweep.err
  log "attn rows64 sweep rc=$? $(el)"; tail -3 $R/sweep.err | tee -a $R/log.txt
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r['shape'], r['ctx'], 'hpb', r['hpb'], 'ring', r['ring'], 'early', r['early'], 'splits', r.get('splits'), 'full', r.get('full'), 'GB/s', r.get('gbps'), r.get('error', ''))
" $R/attn-rows64-sweep.jsonl | tee -a $R/log.txt
  cp $R/attn-rows64-sweep.jsonl $OUT/
  OUT=$R KIND=decode ROWS=64 TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/gemm_q8_glu/128 synth:llama3-8b:Q4_K_M/attn_decode_rope/128" \
    timeout 300 bash experiments/h200_ncu.sh > $R/ncu.log 2>&1
  log "ncu rc=$? $(el)"; tail -8 $R/ncu.log | tee -a $R/log.txt ;;
esac
tar czf $OUT/s27-$STAGE.tgz -C /tmp s27-$STAGE
