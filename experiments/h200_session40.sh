#!/usr/bin/env bash
# The next session's device calls (prepared in session 39, research/2026-12-05-session39; session 40 was lent no
# device, so they are still the next calls; STAGE l's GPU tests now include tests/test_serve_gpu.py's n = 8 and echo tests).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session40.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; ship the real models first (six calls,
# experiments/ship_models.py's .models/ship-0N); STAGE d carries .llamacpp. Any sm_90a part with 132 SMs (an H100
# SXM or the H200: kernel-check's receipt stands for the table's device). Compare arms only inside one call.
# STAGE a (~8 min): one split for rows of 129-256 keys. Session 39 (H100, synthetic shapes, tg128 at depth 128, arms
#  alternating, gates MATCH): MEMRA_ATT_SPLITS=1 against the plan's 128-key splits +11.0 % on the SmolLM2 shape
#  (1,699 -> 1,886 t/s), +5.1 % on the 1B (1,731 -> 1,820); at depth 384 (385-512 keys) the plan's 4 splits win
#  (1,665 against 1 split 1,574, 2 splits 1,516). MEMRA_ATT_SPLITS=1 is a global knob (every depth one split); the
#  landable form needs no kernel change: the switch's short module with ATT_MIN_CHUNK 256 (rows of up to 256 keys
#  one split) and the switch at 257 — MEMRA_ATT_SWITCH="257:ATT_TC=0,ATT_MIN_CHUNK=256" (the head-64 shapes' short
#  module is the CUDA-core body at their 64-key tiles), "257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=256" on the 8B, and
#  "257:ATT_MIN_CHUNK=256" (the entry's own body) for Gemma-3 (no switch in its entry) and as the TC arm on the
#  head-64 shapes. Arms at depth 128 (keys 129-256): the table, the switch arm(s), MEMRA_ATT_SPLITS=1 (the bound);
#  at depth 0 (keys 1-128: the same layout, another module build) the table against the switch arm.
# STAGE v (~8 min): the serve bench (8B, c = 8 and 64; rows of 100-228 keys) with the table and with the switch arm.
# STAGE l (~8 min): after the winners are written into the table (entries' `short` / `switch`, engine-choice records,
#  `memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults --pdl`, committed): kernel-check --add-to (the
#  short modules at ATT_MIN_CHUNK 256 are new cases), then the GPU tests in what is left.
# STAGE d (~9 min, carry .llamacpp): `--vs llama.cpp`, the depth set.
set -u
source experiments/h200_common.sh
stage_begin s40
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
ab() {   # ab MODEL DEPTH LIMIT ARM...: tg128 at DEPTH, each arm twice, alternating (h200_common.sh's env_arms)
  local m=$1 d=$2 lim=$3
  shift 3
  env_arms bench-one-split.jsonl $lim "$m -d $d -p 0 -n 128 -r 3" "$@"
}
case "$STAGE" in
a)
  S64="MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_MIN_CHUNK=256"
  TC="MEMRA_ATT_SWITCH=257:ATT_MIN_CHUNK=256"
  ab smollm2-135m 128 110 table "$S64" "$TC" MEMRA_ATT_SPLITS=1
  ab synth:llama-1b:Q4_0 128 200 table "$S64" "$TC" MEMRA_ATT_SPLITS=1
  ab synth:llama3-8b:Q4_K_M 128 300 table "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=256" \
    MEMRA_ATT_SPLITS=1
  ab gemma3-270m 128 360 table "$TC" MEMRA_ATT_SPLITS=1
  ab smollm2-135m 0 400 table "$S64"
  ab synth:llama3-8b:Q4_K_M 0 440 table "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=256" ;;
v)
  # the serve bench's rows (100-token prompts + 128 generated: 100-228 keys) on the 8B, the table against the switch arm
  # at 257 (one split up to 256 keys), c = 8 and 64, twice alternating (`memra bench serve` alone: no llama-server)
  for a in table "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=256" table \
      "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=256"; do
    [ $(( $(date +%s) - T0 )) -lt 420 ] || break
    e=; [ "$a" = table ] || e=$a
    timeout 150 env $e python3 -m memra bench serve synth:llama3-8b:Q4_K_M --device gpu --synth-tokenizer $TOK \
      -c 8,64 --prompt-tokens 100 --max-tokens 128 --out $R/serve-one-split.jsonl --tag "serve $a" > $R/serve.txt 2>&1
    log "serve $a rc=$? $(el)"; tail -4 $R/serve.txt | tee -a $R/log.txt
  done
  cp $R/serve-one-split.jsonl $OUT/ 2>/dev/null ;;
t)
  # the GPU tests alone (session 40's serve features: tests/test_serve_gpu.py's n = 8 and echo log-probs)
  gpu_tests ${T_END:-585} ;;
l)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-300} kernel_check
  gpu_tests ${T_END:-585} ;;
d)
  depth_vs ;;
esac
tar czf $OUT/s40-$STAGE.tgz -C /tmp s40-$STAGE
