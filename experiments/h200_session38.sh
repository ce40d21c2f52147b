#!/usr/bin/env bash
# The next session's device calls (prepared in session 37, research/2026-12-05-session37).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=l bash experiments/h200_session38.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; every stage needs the real models shipped (the
# kernel-check launch set reads SmolLM2 and Gemma-3; STAGE d's `--vs`); STAGE d carries .llamacpp. Name the card of
# every receipt; compare arms only inside one call.
# STAGE l (~8-10 min, an H200 only: the receipt is the H200's): experiments/switch129 landed in the tree first (git
#  apply its landing.patch, re-freeze, commit): kernel-check --add-to of the cases the receipt lacks (~502: the row
#  filter's keys now name the switch, the decode depth's heads a block, attn_fa's twin), then tg128 at depth 128 on the
#  three switch shapes, the table (129) against MEMRA_ATT_SWITCH=256 (the H100 gave +3.0 / +2.8 / +1.8 %), two pairs
#  while R_LIMIT lasts. On an H100 it stops at once.
# STAGE g (~3 min, no models, any card: an A/B inside the call): MEMRA_GRAPH_STEPS 1 against 16 (decode_run's whole
#  16-step chunk one graph launch: PDL across the steps' boundaries), tg128 at depth 0 on the SmolLM2 / 1B shapes and
#  the 8B, two pairs. Predicted +0.2-0.5 % on the small shapes (~1-2 µs a step of graph-launch boundary in ~450 µs),
#  ~0 on the 8B.
# STAGE d (~9 min, carry .llamacpp): `--vs llama.cpp` (h200_common.sh depth_vs): the floors at HEAD (last: session 30).
# STAGE t (~9-10 min): the GPU tests whole (T_END bounds them; session 36 ran 21, session 37 none).
# Order within the 30 device minutes: ship the models (six calls, experiments/ship_models.py's .models/ship-0N), then on
# an H200 l, g, d, t (T_END: what is left); on an H100 g and t (its figures are not H200 floors; l must not run there).
# memra bench's tg replays decode_run's chunked graphs since session 37 (4ac23cf): d is the first `--vs` run with it.
set -u
source experiments/h200_common.sh
stage_begin s38
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
l)
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { log "not an H200: nothing run"; exit 0; }
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-420} kernel_check
  for p in "synth:llama3-8b:Q4_K_M|256" "synth:llama-1b:Q4_0|256:ATT_TC=0" "synth:smollm2-135m:Q4_1|256:ATT_TC=0"; do
    IFS='|' read -r a y <<< "$p"
    for sw in "" "$y" "" "$y"; do
      [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-560} ] || break
      arm_run "$a -d 128 switch=${sw:-table}" bench-switch129.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench \
        $a -d 128 -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-switch129.jsonl $OUT/ 2>/dev/null ;;
g)
  for a in synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    for gs in 1 16 1 16; do
      [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-400} ] || break
      arm_run "$a graph_steps=$gs" bench-graph-steps.jsonl env MEMRA_GRAPH_STEPS=$gs python3 -m memra bench $a \
        -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-graph-steps.jsonl $OUT/ 2>/dev/null ;;
d)
  depth_vs ;;
t)
  gpu_tests ${T_END:-585} ;;
esac
tar czf $OUT/s38-$STAGE.tgz -C /tmp s38-$STAGE
