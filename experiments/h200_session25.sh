#!/usr/bin/env bash
# The next session's first H200 call (prepared in session 24; research/2026-12-03-session24 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session25.sh
# Here first: `bash ../shared/device/llamacpp.sh` (-> .llamacpp/). Ship the models first
# (experiments/ship_models.py's six calls); carry .whl, .synthtok and .llamacpp. $OUT gets at most
# five files (a call returns eight).
# STAGE s (~5 min, right after a): tests/test_serve_gpu.py and `memra bench serve --vs` llama-server.
# STAGE f (~7 min, models shipped): kernel-check --add-to of the table frozen with --pdl, the GPU tests,
# the 1B's `--vs llama.cpp` run.
# STAGE a (~6 min):
#  1. experiments/attn_fixed/probe.py with the cuts inside the split (ATT_PROBE 3..7): where the
#     short-context attention's 1.8-1.9 µs split body goes (session 24 §4), step by step.
#  2. experiments/mv_l2pf: the decode matvec with MV_L2PF 0 / 1 / 7 (the next units' lines sent to L2
#     before the PDL wait; 0 = kernels/matvec.cu's code) in the engine, tg128, arms alternating: the
#     8B Q8_0 and Q4_K_M twice, the Q4_0, the 1B and SmolLM2 once. Predicted: attn_output (4096 x 4096,
#     45-50 % of the bandwidth after a latency-bound attention) and QKV toward L2 speed: 8B Q8_0 +2..4 %,
#     Q4_K_M +1..3 %, the small models nothing (their rows are one unit a lane: already prefetched).
#     A win lands next: MV_L2PF into kernels/matvec.cu (bit-neutral), its axis in the matvec campaigns,
#     freeze, kernel-check --add-to, the GPU tests.
#  (in the background: llama-server's build for STAGE s)
#  3. experiments/pdl_1b: the 1B's batch-1 matvec entries from session 24's PDL-timed table against the
#     committed table, tg128, three pairs alternating (session 24 §5's +3.1 % was one pair).
set -u
source experiments/h200_common.sh
stage_begin s25
case "$STAGE" in
a)
  link_models "SmolLM2's bench cells need it"
  serve_build_start   # llama-server and the served 8B, in the background for STAGE s (carry .llamacpp)
  timeout 150 python3 experiments/attn_fixed/probe.py > $R/attn-fixed-cuts.jsonl 2> $R/attn-fixed.err
  log "attn_fixed rc=$? $(el)"; cat $R/attn-fixed-cuts.jsonl | tee -a $R/log.txt; cp $R/attn-fixed-cuts.jsonl $OUT/
  ab() {  # MODEL ARMS...
    local m=$1 n; shift
    for n in "$@"; do
      MV_L2PF_AB=$n timeout 60 python3 experiments/mv_l2pf/ab.py bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
        --tag "MV_L2PF=$n (experiments/mv_l2pf)" --out $R/bench-mv-l2pf.jsonl > $R/bench.txt 2>&1
      log "$m MV_L2PF=$n rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
    cp $R/bench-mv-l2pf.jsonl $OUT/
  }
  ab synth:llama3-8b:Q8_0 0 1 7; ab synth:llama3-8b:Q4_K_M 0 1 7
  ab synth:llama3-8b:Q4_0 0 1 7; ab synth:llama-1b:Q4_0 0 1 7; ab smollm2-135m 0 1 7
  ab synth:llama3-8b:Q8_0 7 1 0; ab synth:llama3-8b:Q4_K_M 7 1 0
  # bit-neutral by construction; checked: 64 greedy tokens of the 8B Q8_0 at MV_L2PF 0 and 7, same ids
  greedy_ids_arms MV_L2PF_AB "0 7" experiments/mv_l2pf/ab.py llama3-8b Q8_0
  # 3. the 1B's PDL-timed matvec entries alone (experiments/pdl_1b; session 24 §5: +3.1 % in one pair)
  # (run at 8e183dd with the table experiments/pdl_1b built; that table is now the shipped one, frozen
  #  with --pdl: the plain-timed freeze of research/tune/ is the table before)
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir $R/plain > $R/pdl-1b.txt 2>&1; log "plain table rc=$?"
  for tb in $R/plain/nvidia-h200.json tune/defaults/nvidia-h200.json tune/defaults/nvidia-h200.json \
            $R/plain/nvidia-h200.json $R/plain/nvidia-h200.json tune/defaults/nvidia-h200.json; do
    timeout 40 python3 -m memra bench synth:llama-1b:Q4_0 -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
      --out $R/bench-pdl-1b.jsonl > $R/bench.txt 2>&1
    log "1B $(basename $tb) rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
  done
  cp $R/bench-pdl-1b.jsonl $OUT/
  serve_build_wait ;;
s)
  # issue 11's table with this session's tables (session 22's run predates the 128-row tile entries:
  # a ~100-token prompt is one 128-row chunk); in the call right after STAGE a (the build lives while
  # the machine stays warm)
  serve_evidence ;;
f)
  # the table frozen with --pdl (the 1B's batch-1 matvec entries PDL-timed): kernel-check of the launch
  # cases it adds, the GPU tests while llama.cpp builds, then the 1B's `--vs llama.cpp` run
  link_models "kernel-check's launch set needs them"
  serve_build_start
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
  gpu_tests 330
  serve_build_wait
  timeout 120 python3 -m memra bench synth:llama-1b:Q4_0 -p 512 -n 128 --vs llama.cpp \
    --llama-bench /root/llama.cpp/build/bin/llama-bench --synth-tokenizer $TOK --out $R/bench-vs.jsonl > $R/bench-1b.txt 2>&1
  log "bench 1B rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-1b.txt | tail -5 | tee -a $R/log.txt
  cp $R/bench-vs.jsonl $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s25-$STAGE.tgz -C /tmp s25-$STAGE
