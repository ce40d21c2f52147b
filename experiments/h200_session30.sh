#!/usr/bin/env bash
# H200 calls prepared in session 29 (a, l, t, d) and 30 (tc); all run in session 30 (research/2026-12-04-session30).
# STAGE a ran at 56cb56e, before the landing: experiments/attn_merge's make.py / ab.py / ab.sh were removed once
# attention.cu v10 landed (their edit no longer applies); `git checkout 56cb56e` reproduces it.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session30.sh
# .whl from experiments/h200_wheels.sh (the GPU tests' extras), not ../shared/device/wheels.sh alone.
# STAGE a (~4 min; carry .whl, .synthtok; the real models shipped first for SmolLM2): attn_merge in the engine
#  (experiments/attn_merge/ab.py: attention.cu from its build copy at MERGE_MJ 0 = kernels/' SASS, or 16), tg128
#  at depth 4,096 with arms 0 16 16 0 on the 8B Q4_K_M, SmolLM2 (real file) and the 1B (predicted +3 / +5 / +7 %:
#  75 / 35 / 49 µs a token), then ab.sh's kernel probe with MJ 32 beside 16 (one round for 32 splits), then the
#  tensor-core split body's first run (experiments/attn_tc/probe.sh: ok against the float64 reference, µs).
# STAGE l (~7 min, models shipped), after `git apply experiments/attn_merge/landing.patch` is committed: the h200
#  campaign's attn_decode jobs (the entries go stale with the source), freeze --pdl, kernel-check --add-to.
# STAGE t (~6 min, models shipped): the GPU tests.
# STAGE d (~8 min; carry .llamacpp too): llama.cpp built in the call, `--vs llama.cpp` of the depth cells (MODELS
#  overrides: a space-separated list, each item a model and its own arguments).
set -u
source experiments/h200_common.sh
stage_begin s30
case "$STAGE" in
a)
  for m in "synth:llama3-8b:Q4_K_M" "smollm2-135m" "synth:llama-1b:Q4_0"; do
    for mj in 0 16 16 0; do
      MERGE_MJ=$mj timeout 120 python3 experiments/attn_merge/ab.py bench $m -p 0 -n 128 -d 4096 -r 3 \
        --synth-tokenizer $TOK --tag "ATT_MERGE_MJ=$mj (experiments/attn_merge)" --out $R/bench-merge.jsonl \
        > $R/bench.txt 2>&1
      log "$m d4096 MJ $mj rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110) $(el)"
    done
  done
  cp $R/bench-merge.jsonl $OUT/
  OUT=$R ARMS="0 16 32 0 16 32" timeout 150 bash experiments/attn_merge/ab.sh > $R/ab.txt 2>&1
  log "ab.sh rc=$? $(el)"; sed -n '/^(/,$p' $R/ab.txt | tee -a $R/log.txt
  cp $R/attn-merge.jsonl $OUT/attn-merge-32.jsonl
  # the tensor-core body's first device run (experiments/attn_tc: correctness against the float64 reference, µs)
  OUT=$R timeout 200 bash experiments/attn_tc/probe.sh > $R/tc.txt 2>&1; log "attn_tc probe rc=$? $(el)"
  grep -E "BAD|tc 1" $R/tc.txt | head -8 | tee -a $R/log.txt; cp $R/attn-tc.jsonl $OUT/ ;;
tc)
  # (added in session 30) the tensor-core body in the engine: tg128 at depth 4,096 and 0 on the 1B and SmolLM2
  # shapes (head 64), arms ship (kernels/) / tc1 (ATT_TC 1) / tc0 (the build copy at ATT_TC 0: kernels/' code) with
  # tc* on a table whose attention tile is 16 ATT_WARPS (experiments/attn_tc/ab.py); the gates print first. Its
  # session 30 run gave that table through MEMRA_TUNE_TABLE, which bench did not read then: every arm ran the
  # shipped table and tc1 failed to compile; --tune-table since.
  python3 experiments/attn_tc/ab.py table tune/defaults/nvidia-h200.json $R/t128.json
  for m in synth:llama-1b:Q4_0 synth:smollm2-135m:Q4_1; do
    for d in 4096 0; do
      for arm in ship tc1 tc0 tc1 ship; do
        [ $(( $(date +%s) - T0 )) -lt ${TC_LIMIT:-300} ] || break
        case $arm in
          ship) set -- env python3 -m memra; TT= ;;
          tc1) set -- env ATT_TC=1 python3 experiments/attn_tc/ab.py; TT="--tune-table $R/t128.json" ;;
          tc0) set -- env ATT_TC=0 python3 experiments/attn_tc/ab.py; TT="--tune-table $R/t128.json" ;;
        esac
        arm_run "attn_tc $arm $m d$d" bench-tc.jsonl "$@" bench $m -p 0 -n 128 -d $d -r 3 $TT
      done
    done
  done
  cp $R/bench-tc.jsonl $OUT/ ;;
l)
  attn_land l 300 ;;
t)
  gpu_tests 585 ;;
d)
  if [ -n "${MODELS:-}" ]; then llamacpp_vs $MODELS
  else llamacpp_vs "synth:llama3-8b:Q4_K_M -d 4096" "smollm2-135m -d 4096" synth:llama3-8b:Q4_K_M; fi ;;
esac
tar czf $OUT/s30-$STAGE.tgz -C /tmp s30-$STAGE
