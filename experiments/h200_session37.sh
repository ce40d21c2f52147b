#!/usr/bin/env bash
# Session 37's device calls (prepared in session 36; research/2026-12-05-session37 says what each gave).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=r bash experiments/h200_session37.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; STAGE d needs the real models shipped and carries
# .llamacpp; STAGE t needs the models shipped. Name the card of every receipt; compare arms only inside one call.
# STAGE r (ran, H100; lost): the short module with a deeper ring (ATT_RING 4 on the 8B's 32-key tiles, 3 on the
#  head-64 shapes' 64-key tiles): tg128 at depth 0 against the table, two pairs; and the 8B at depth 128, the table's
#  switch 256 against 128.
# STAGE w (ran, H100): where the switch sits: 64 / 96 / 128 / 160 / 256 on the 8B at depths 0 and 128, 64 / 128 / 256
#  on the head-64 shapes at depth 128.
# STAGE v (ran, H100): the switch at 129 against the table's 256 at depths 128 and 0 on the three shapes.
# STAGE k (ran, H100: nothing run): on an H200 only, kernel-check --add-to with experiments/switch129 applied.
# STAGE d (not run; models shipped, carry .llamacpp): `--vs llama.cpp` (h200_common.sh depth_vs).
# STAGE t (not run; models shipped): the GPU tests whole.
set -u
source experiments/h200_common.sh
stage_begin s37
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
r)
  # MODEL|ARGS|ARM A|ARM B (MEMRA_ATT_SWITCH values; empty: the table's)
  for p in "synth:llama3-8b:Q4_K_M|-d 0||256:ATT_TC=0,ATT_TILE=32,ATT_RING=4" \
           "synth:llama-1b:Q4_0|-d 0||256:ATT_TC=0,ATT_RING=3" \
           "synth:smollm2-135m:Q4_1|-d 0||256:ATT_TC=0,ATT_RING=3" \
           "synth:llama3-8b:Q4_K_M|-d 128||128"; do
    IFS='|' read -r a d x y <<< "$p"
    for sw in "$x" "$y" "$x" "$y"; do
      [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-500} ] || break
      arm_run "$a $d switch=${sw:-table}" bench-ring.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench $a $d \
        -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-ring.jsonl $OUT/ 2>/dev/null ;;
w)
  # where the switch sits (STAGE r: 128 beat the table's 256 at depth 128 on the 8B by 2.8 %): tg128 at depth 0 and
  # 128, arms alternating; SW_8B / SW_64: the MEMRA_ATT_SWITCH arms (space-separated; "table" = the table's)
  for p in "synth:llama3-8b:Q4_K_M|-d 128|${SW_8B:-table 64 96 128 160}" "synth:llama3-8b:Q4_K_M|-d 0|${SW_8B:-table 64 96 128 160}" \
           "synth:llama-1b:Q4_0|-d 128|${SW_64:-table 64:ATT_TC=0 128:ATT_TC=0}" \
           "synth:smollm2-135m:Q4_1|-d 128|${SW_64:-table 64:ATT_TC=0 128:ATT_TC=0}"; do
    IFS='|' read -r a d xs <<< "$p"
    for pass in 1 2; do for sw in $xs; do
      [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-500} ] || break
      [ "$sw" = table ] && v= || v=$sw
      arm_run "$a $d switch=$sw" bench-where.jsonl env MEMRA_ATT_SWITCH=$v python3 -m memra bench $a $d -p 0 -n 128 -r 3
    done; done
  done
  cp $R/bench-where.jsonl $OUT/ 2>/dev/null ;;
v)
  # the switch at 129 keys (STAGE w: the long module wins from 129 keys, the short one below) against the table's 256
  for p in "synth:llama3-8b:Q4_K_M|129" "synth:llama-1b:Q4_0|129:ATT_TC=0" "synth:smollm2-135m:Q4_1|129:ATT_TC=0"; do
    IFS='|' read -r a y <<< "$p"
    for d in "-d 128" "-d 0"; do for sw in "" "$y" "" "$y"; do
      [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-500} ] || break
      arm_run "$a $d switch=${sw:-table}" bench-129.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench $a $d \
        -p 0 -n 128 -r 3
    done; done
  done
  cp $R/bench-129.jsonl $OUT/ 2>/dev/null ;;
k)
  # the switch at 129 landed in the tree (engine choices, frozen): on an H200 only, kernel-check --add-to of the launch
  # cases the receipt lacks (the row filter's cases, now keyed by their switch), then the 8B at depth 128 against 256
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { log "not an H200: nothing run"; exit 0; }
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-300} kernel_check
  for sw in "" 256 "" 256; do
    [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-500} ] || break
    arm_run "synth:llama3-8b:Q4_K_M -d 128 switch=${sw:-table}" bench-h200.jsonl env MEMRA_ATT_SWITCH=$sw \
      python3 -m memra bench synth:llama3-8b:Q4_K_M -d 128 -p 0 -n 128 -r 3
  done
  cp $R/bench-h200.jsonl $OUT/ 2>/dev/null ;;
d)
  depth_vs ;;
t)
  gpu_tests ${T_END:-585} ;;
esac
tar czf $OUT/s37-$STAGE.tgz -C /tmp s37-$STAGE
