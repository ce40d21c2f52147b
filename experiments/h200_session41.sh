#!/usr/bin/env bash
# Session 41's device calls, run in session 42: the one-split landing (its patch, since removed: landed as 60acf19; applied to the working tree
# before the call and committed with the receipt when green: the head-64 shapes' attn_decode entries at switch 257,
# short module ATT_TC 0 at ATT_MIN_CHUNK 256; research/2026-12-06-session41/a).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=k bash experiments/h200_session41.sh
# carry .whl and .synthtok; ship the real models first (experiments/ship_models.py's .models/ship-0N).
# STAGE k (~5 min): kernel-check --add-to (the short modules at ATT_MIN_CHUNK 256 are 200 new launch cases), then the
#  landing's confirmation in what is left: the table against the entry it replaced (MEMRA_ATT_SWITCH=129:ATT_TC=0,
#  the previous switch and short module) at depth 0 on the 1B shape (not measured in STAGE a) and at depth 128 on
#  SmolLM2, two pairs alternating.
# STAGE g (~3 min, models shipped): Gemma-3's decode attention in more splits at short depths. One split at depth 128
#  lost 9.4 % (STAGE a of session 40's plan: one KV head for four query heads, so its splits are its parallelism);
#  the switch's short module at 64- and 32-key chunks for rows of up to 256 keys, and MEMRA_ATT_SPLITS=4, against the
#  table at depths 0 and 128 (the 8B and 1B shapes lost 1.1 / 2.9 % with smaller short-module chunks in session 36).
# STAGE f (~5 min, no models needed): experiments/gemm_f16/probe.py — the prompt rows' GEMM on f16 tensor cores against
#  numpy and against the engine's prompt tile on the 8B's shapes at 512 rows (experiments/gemm_f16/README.md).
set -u
source experiments/h200_common.sh
stage_begin s41
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
k)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-260} kernel_check
  OLD="MEMRA_ATT_SWITCH=129:ATT_TC=0"
  env_arms bench-landing.jsonl ${T_END:-430} "synth:llama-1b:Q4_0 -d 0 -p 0 -n 128 -r 3" table "$OLD"
  env_arms bench-landing.jsonl ${T_END:-430} "smollm2-135m -d 128 -p 0 -n 128 -r 3" table "$OLD" ;;
g)
  env_arms bench-gemma-splits.jsonl ${T_END:-170} "gemma3-270m -d 128 -p 0 -n 128 -r 3" table \
    "MEMRA_ATT_SWITCH=257:ATT_MIN_CHUNK=64" "MEMRA_ATT_SWITCH=257:ATT_TILE=32,ATT_MIN_CHUNK=32" MEMRA_ATT_SPLITS=4
  env_arms bench-gemma-splits.jsonl ${T_END2:-300} "gemma3-270m -d 0 -p 0 -n 128 -r 3" table \
    "MEMRA_ATT_SWITCH=257:ATT_MIN_CHUNK=64" "MEMRA_ATT_SWITCH=257:ATT_TILE=32,ATT_MIN_CHUNK=32" ;;
f)
  timeout ${F_LIMIT:-500} python3 experiments/gemm_f16/probe.py --out $OUT/gemm-f16.jsonl --limit ${F_SHAPES:-380} \
    > $R/probe.txt 2>&1
  log "gemm_f16 probe rc=$? $(el)"; tail -30 $R/probe.txt | cut -c1-400 | tee -a $R/log.txt ;;
esac
tar czf $OUT/s41-$STAGE.tgz -C /tmp s41-$STAGE
