#!/usr/bin/env bash
# Session 36's device calls: the attention switch's landing (kernels/attention.cu v12's row filter; the 8B's attn_decode
# entry names `switch` 256, an engine choice), then the GPU tests.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session36.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; every stage needs the real models shipped
# (kernel-check's launch set names them). A card other than the H200 cannot extend the H200's kernel-check receipt:
# there STAGE a checks the attention family without a receipt (the landing then waits for an H200).
# STAGE a (~9 min): kernel-check --add-to the committed H200 receipt (attention.cu changed: that family runs whole,
#  the switch's launch cases among it); tg128 of the 8B Q4_K_M with the table (the switch on) against
#  MEMRA_ATT_SWITCH=0, alternating, two pairs at depth 0 and one at 4,096 (predicted +3 % at 0, 0 at 4,096; gates
#  MATCH); then `memra profile` of the 8B at depths 128 / 4,096 and the SmolLM2 shape with what time is left (issue
#  14: where a token's time goes).
# STAGE c (~5 min): the head-64 models' switch with v10's body at the table's 64-key tiles as the short module
#  (MEMRA_ATT_SWITCH=256:ATT_TC=0 against 0, one pair each, the 1B Q4_0 and the SmolLM2 shape at depth 0): session 31
#  measured v10 -> v11 at -1.1 / -1.3 % at depth 0 on them, so predicted +1.1-1.3 %; session 35's 32-key short module
#  lost there.
# STAGE m (~10 min, models shipped): on the H200 the head-64 shapes' pending engine choices (c/) applied, frozen and
#  their kernel-check cases checked (the table, choices and receipt come back); then the short
#  module with its own ATT_MIN_CHUNK (the runner's grid now takes the larger of the two modules' split needs): tg128 at
#  depth 0, the table against MEMRA_ATT_SWITCH with ATT_MIN_CHUNK 32 (8B: 32-key tiles) / 64 (1B, SmolLM2 shape: v10's
#  body at 64-key tiles), two pairs each. memra profile put the 8B's short module at 9.1 us a layer at 128 keys (one
#  block a head walking 4 tiles) and the SmolLM2 shape's attention at 38 % of its step: predicted +2-3 % on the 8B,
#  +2-4 % on the head-64 models. Then the GPU tests with the time left.
# STAGE t (~9-10 min on an H100): the GPU tests.
# STAGE d (~9 min, carry .llamacpp): `--vs llama.cpp` (h200_common.sh depth_vs).
set -u
source experiments/h200_common.sh
stage_begin s36
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
log "device: $DEV"
case "$STAGE" in
a)
  link_models "kernel-check's launch set names them"
  if [ "$DEV" = "NVIDIA H200" ]; then
    KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=240 kernel_check
  else
    timeout 240 python3 -m memra kernel-check --only attention > $R/kernel-check.txt 2>&1
    log "kernel-check --only attention (no receipt on $DEV) rc=$? $(tail -1 $R/kernel-check.txt) $(el)"
    grep -E "^FAIL|MISSED|canary.*not caught" $R/kernel-check.txt | head -20 | tee -a $R/log.txt
    gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  fi
  for a in "synth:llama3-8b:Q4_K_M" "synth:llama3-8b:Q4_K_M" "synth:llama3-8b:Q4_K_M -d 4096"; do
    for sw in 0 ""; do
      [ $(( $(date +%s) - T0 )) -lt 400 ] || break
      arm_run "$a switch=${sw:-table}" bench-switch.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench $a \
        -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-switch.jsonl $OUT/ 2>/dev/null
  for a in "synth:llama3-8b:Q4_K_M -d 128" "synth:llama3-8b:Q4_K_M -d 4096" "synth:smollm2-135m:Q4_1 -d 128"; do
    [ $(( $(date +%s) - T0 )) -lt 480 ] || break
    timeout 80 python3 -m memra profile $a --synth-tokenizer $TOK --json >> $OUT/profile.jsonl 2>> $R/log.txt
    log "profile $a rc=$? $(el)"
  done ;;
c)
  for a in "synth:llama-1b:Q4_0" "synth:smollm2-135m:Q4_1"; do
    for sw in 0 256:ATT_TC=0 0 256:ATT_TC=0; do
      [ $(( $(date +%s) - T0 )) -lt ${C_LIMIT:-420} ] || break
      arm_run "$a switch=$sw" bench-switch64.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench $a -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-switch64.jsonl $OUT/ 2>/dev/null ;;
m)
  if [ "$DEV" = "NVIDIA H200" ]; then
    # the head-64 shapes' engine choices (STAGE c), held back until an H200 checks their launch cases: applied,
    # frozen, the cases the committed receipt lacks checked; the table, choices and receipt come back in $OUT
    cat research/2026-12-05-session36/c/engine-choices-pending.jsonl >> research/tune/engine-choices-nvidia-h200.jsonl  # (ran: applied since)
    freeze_show m
    link_models "kernel-check's launch set names them"
    KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
    mkdir -p $OUT/defaults && cp tune/defaults/nvidia-h200.json $OUT/defaults/ && \
      cp research/tune/engine-choices-nvidia-h200.jsonl $OUT/
  fi
  # MODEL|ARM A|ARM B (MEMRA_ATT_SWITCH values; empty: the table's)
  for p in "synth:llama3-8b:Q4_K_M||256:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=32" \
           "synth:llama-1b:Q4_0|256:ATT_TC=0|256:ATT_TC=0,ATT_MIN_CHUNK=64" \
           "synth:smollm2-135m:Q4_1|256:ATT_TC=0|256:ATT_TC=0,ATT_MIN_CHUNK=64"; do
    IFS='|' read -r a x y <<< "$p"
    for sw in "$x" "$y" "$x" "$y"; do
      [ $(( $(date +%s) - T0 )) -lt ${M_LIMIT:-330} ] || break
      arm_run "$a switch=${sw:-table}" bench-minchunk.jsonl env MEMRA_ATT_SWITCH=$sw python3 -m memra bench $a \
        -p 0 -n 128 -r 3
    done
  done
  cp $R/bench-minchunk.jsonl $OUT/ 2>/dev/null
  gpu_tests ${T_END:-585} ;;
d)
  depth_vs ;;
t)
  # on the H200 first the launch cases the committed receipt lacks (the head-64 entries' switch, session 36's STAGE c)
  if [ "$DEV" = "NVIDIA H200" ] && ! python3 -m memra kernel-check --status > /dev/null 2>&1; then
    link_models "kernel-check's launch set names them"
    KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
  fi
  gpu_tests ${T_END:-585} ;;
esac
tar czf $OUT/s36-$STAGE.tgz -C /tmp s36-$STAGE
