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
d)
  depth_vs ;;   # llama.cpp built in the call (carry .llamacpp)
t)
  gpu_tests 585 ;;
esac
tar czf $OUT/s35-$STAGE.tgz -C /tmp s35-$STAGE
