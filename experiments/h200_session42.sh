#!/usr/bin/env bash
# Session 42's device calls (research/2026-12-06-session42).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=x bash experiments/h200_session42.sh
# carry .whl and .synthtok; real models shipped first (experiments/ship_models.py's .models/ship-0N).
# STAGE l (~6 min): Gemma-3's switch at 2049 landed in the table: kernel-check --add-to, then the table against
#  MEMRA_ATT_SWITCH=0 at depths 1920 and 0.
# STAGE y (~3 min): the same short module for Gemma-3 rows of up to 8,192 keys, at depths 1024 and 4096.
# STAGE x (~4 min): Gemma-3's short module smaller still (session 42's STAGE g of h200_session41.sh: 32-key tiles and
#  chunks for rows of up to 256 keys +14.9 % at depth 128, +6.1 % at depth 0 on an H100), 16-key tiles, the switch at
#  513 (rows of up to 512 keys) at depth 384; and SmolLM2's (head 64, the CUDA-core body) at 32-key chunks.
set -u
source experiments/h200_common.sh
stage_begin s42
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
x)
  S32="MEMRA_ATT_SWITCH=257:ATT_TILE=32,ATT_MIN_CHUNK=32"
  env_arms bench-gemma-short.jsonl ${T1:-90} "gemma3-270m -d 128 -p 0 -n 128 -r 3" "$S32" \
    "MEMRA_ATT_SWITCH=257:ATT_TILE=16,ATT_MIN_CHUNK=16" "MEMRA_ATT_SWITCH=257:ATT_TILE=32,ATT_MIN_CHUNK=64,ATT_WARPS=4"
  env_arms bench-gemma-short.jsonl ${T2:-170} "gemma3-270m -d 384 -p 0 -n 128 -r 3" table "$S32" \
    "MEMRA_ATT_SWITCH=513:ATT_TILE=32,ATT_MIN_CHUNK=32"
  env_arms bench-smollm2-short.jsonl ${T3:-250} "smollm2-135m -d 128 -p 0 -n 128 -r 3" table \
    "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=32"
  env_arms bench-smollm2-short.jsonl ${T4:-300} "smollm2-135m -d 0 -p 0 -n 128 -r 3" table \
    "MEMRA_ATT_SWITCH=257:ATT_TC=0,ATT_TILE=32,ATT_MIN_CHUNK=32" ;;
y)
  # Gemma-3's 32-key short module deeper: the switch at 8193 (every row of up to 8,192 keys) at depths 1024 and 4096
  S="MEMRA_ATT_SWITCH=8193:ATT_TILE=32,ATT_MIN_CHUNK=32"
  env_arms bench-gemma-short.jsonl ${T1:-80} "gemma3-270m -d 1024 -p 0 -n 128 -r 3" table "$S"
  env_arms bench-gemma-short.jsonl ${T2:-170} "gemma3-270m -d 4096 -p 0 -n 128 -r 3" table "$S" ;;
l)
  # Gemma-3's switch at 2049 (the table after the engine choice): kernel-check's new cases, then the table against the
  # entry alone (MEMRA_ATT_SWITCH=0) at depth 1920 (rows of 1,921-2,048 keys: the short module's deepest) and depth 0
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-200} kernel_check
  env_arms bench-gemma-landing.jsonl ${T1:-330} "gemma3-270m -d 1920 -p 0 -n 128 -r 3" table MEMRA_ATT_SWITCH=0
  env_arms bench-gemma-landing.jsonl ${T2:-400} "gemma3-270m -d 0 -p 0 -n 128 -r 3" table MEMRA_ATT_SWITCH=0 ;;
esac
tar czf $OUT/s42-$STAGE.tgz -C /tmp s42-$STAGE
