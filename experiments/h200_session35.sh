#!/usr/bin/env bash
# The next session's device calls (prepared in session 34, research/2026-12-05-session34).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=p bash experiments/h200_session35.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; STAGE d needs the real models shipped (SmolLM2's
# cells) and carries .llamacpp; STAGE t needs the models shipped. Session 34 got an H100 for every call: say which
# card each receipt's `device` names, and compare arms only inside one call.
# STAGE p (~3 min, no models): `memra profile` (the decode step's per-kernel breakdown, each launch alone in a graph)
#  of the 8B Q4_K_M at depths 128 and 4,096 and the SmolLM2 shape: issue 14 asks docs/PERFORMANCE.md to say where a
#  token's time goes, and the last 8B breakdown (session 23) predates attention v9-v11.
# STAGE d (~9 min; models shipped, carry .llamacpp): `--vs llama.cpp` on the 8B, the 8B at depth 4,096, SmolLM2 at
#  4,096 and at 0, the 1B (MODELS overrides): the board's ratios at HEAD (the last run: session 30).
# STAGE s (~6 min, no models; ran in session 35 on an H100; its ab.py is gone since the landing of session 36):
#  experiments/attn_switch
#  (MEMRA_ATT_SWITCH=256: the CUDA-core 32-key attention below
#  256 keys, the shipped tensor-core one above), tg128 through its ab.py, control / switch / control / switch, at
#  depths 0 and 4,096 on the 8B Q4_K_M, then depth 0 on the 1B and the SmolLM2 shape; then its kernel-check
#  (attention family, the two modules' configurations). Predicted: the 8B +3 % at depth 0 (session 31's 497 vs 482
#  t/s), 0 at 4,096; the 1B / SmolLM2 +1 % at depth 0. The gates must stay MATCH.
# (STAGE w, experiments/gemm_ws, ran in session 35 and was withdrawn: research/2026-12-05-session35.)
# STAGE t (~9-10 min on an H100, models shipped): the GPU tests (43 passed in session 34); needed after an engine or
#  kernel change.
set -u
source experiments/h200_common.sh
stage_begin s35
case "$STAGE" in
p)
  for a in "synth:llama3-8b:Q4_K_M -d 128" "synth:llama3-8b:Q4_K_M -d 4096" "synth:smollm2-135m:Q4_1 -d 128"; do
    [ $(( $(date +%s) - T0 )) -lt ${P_LIMIT:-200} ] || break
    timeout 120 python3 -m memra profile $a --synth-tokenizer $TOK --json >> $OUT/profile.jsonl 2>> $R/log.txt
    log "profile $a rc=$? $(el)"
  done ;;
s)
  for a in "synth:llama3-8b:Q4_K_M" "synth:llama3-8b:Q4_K_M -d 4096" "synth:llama-1b:Q4_0" "synth:smollm2-135m:Q4_1"; do
    for sw in "" 256 "" 256; do
      [ $(( $(date +%s) - T0 )) -lt 420 ] || break
      arm_run "$a switch=${sw:-off}" bench-switch.jsonl env MEMRA_ATT_SWITCH=$sw python3 experiments/attn_switch/ab.py \
        bench $a -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-switch.jsonl $OUT/ 2>/dev/null
  MEMRA_ATT_SWITCH=256 timeout $(( 570 - ($(date +%s) - T0) )) python3 experiments/attn_switch/ab.py kernel-check \
    --only attention > $R/kc-switch.txt 2>&1
  log "switch kernel-check rc=$? $(tail -1 $R/kc-switch.txt)"
  grep -E "^FAIL|MISSED" $R/kc-switch.txt | head -20 | tee -a $R/log.txt
  cp $R/kc-switch.txt $OUT/ ;;
d)
  depth_vs ;;   # llama.cpp built in the call (carry .llamacpp)
t)
  gpu_tests 585 ;;
esac
tar czf $OUT/s35-$STAGE.tgz -C /tmp s35-$STAGE
