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
esac
tar czf $OUT/s27-$STAGE.tgz -C /tmp s27-$STAGE
