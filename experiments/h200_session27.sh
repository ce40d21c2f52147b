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
# STAGE g (~1 min, no real models): experiments/gemm_check.py timing only, 64 rows, the table's 64-row
#  configurations of the 8B's gate+up (2,2,2,4,1,3,1,1), Q6_K down (2,1,2,4,4,3,1,1) and Q4_K down
#  (1,1,2,4,4,3,1,2) over output-row counts that fill half a wave to two waves of blocks: is the 64-row
#  step's GEMM time whole waves (gate+up: 448 blocks at 2 an SM = 1.7 waves, ncu)?
# STAGE v (~6 min; carry .llamacpp): llama.cpp's build, then `memra bench --vs llama.cpp` with attention.cu
#  v9: the 8B Q4_K_M at depth 0 and 4096, the 1B, the 8B Q4_0 and Q8_0 (in session 27 the last three ran as
#  the same command in three calls right after the first).
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
g)
  G="glu n4224:12:4224:4096:1;glu n8448:12:8448:4096:1;glu n14336:12:14336:4096:1;glu n16896:12:16896:4096:1"
  G="$G;q6k n2048:14:2048:14336:0;q6k n4096:14:4096:14336:0;q6k n8448:14:8448:14336:0"
  G="$G;q4k n2048:12:2048:14336:0;q4k n4096:12:4096:14336:0;q4k n8448:12:8448:14336:0"
  OUT=$R GEMM_TIME_SHAPES="$G" timeout 200 python3 experiments/gemm_check.py --no-checks --no-legacy --types Q4_K,Q6_K \
    --nbs 64 --configs "2,2,2,4,1,3,1,1;2,1,2,4,4,3,1,1;1,1,2,4,4,3,1,2" > $R/gemm-waves.txt 2>&1
  log "gemm waves rc=$? $(el)"
  cp $R/gemm-check.jsonl $OUT/gemm-waves.jsonl 2>/dev/null ;;
v)
  timeout 330 bash .llamacpp/build.sh > $R/llamacpp-build.txt 2>&1
  log "llama.cpp build rc=$? $(el)"; tail -1 $R/llamacpp-build.txt | tee -a $R/log.txt
  for m in "synth:llama3-8b:Q4_K_M -d 0,4096" synth:llama-1b:Q4_0 synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0; do
    timeout 170 python3 -m memra bench $m -p 512 -n 128 --vs llama.cpp --llama-bench /root/llama.cpp/build/bin/llama-bench \
      --synth-tokenizer $TOK --out $R/bench-vs.jsonl > $R/bench.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench.txt | tail -8 | tee -a $R/log.txt
  done
  cp $R/bench-vs.jsonl $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s27-$STAGE.tgz -C /tmp s27-$STAGE
