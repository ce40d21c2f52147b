#!/usr/bin/env bash
# The next session's device calls (prepared in session 43, research/2026-12-06-session43).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=d bash experiments/h200_session44.sh
# carry .whl and .synthtok (STAGE d and e also .llamacpp); STAGE d, e and k need the real models shipped first
# (experiments/ship_models.py's .models/ship-0N: six calls). Any sm_90a part with 132 SMs runs the H200 table; only
# an H200's `--vs` runs are the issues' floors. Compare arms only inside one call.
# STAGE d (~9 min, .llamacpp): `--vs llama.cpp` of the depth set (the 8B Q4_K_M at 0 and 4,096, SmolLM2 at 4,096 and 0,
#  the 1B): the first board run with the f16 prompt GEMM the default (pp512 on an H100: the 8B +40-70 %).
# STAGE e (~8 min, .llamacpp): `--vs llama.cpp` of the rest of the floors' models: the 8B Q4_0, Q8_0, Gemma-3.
# STAGE t (~8 min, no models): the gemm_f16 tune campaign (tune/campaigns/h200-gemm-f16.toml, when it has landed),
#  receipts into research/tune/h200-gemm-f16-nvidia-h200.jsonl; then on the CPU `memra tune freeze --device
#  "NVIDIA H200" --out-dir tune/defaults --pdl`, and STAGE k with the new entries' launch cases.
# STAGE k (~4 min, models shipped): kernel-check --add-to (a table change's new launch cases), then pp512 on the 8B
#  Q4_K_M and Q4_0, the table against ARMS (one VAR=value: the second arm, e.g. MEMRA_TUNE_TABLE=<the old table>).
# STAGE s (~4 min, no models): short prompts, the f16 default against MEMRA_PROMPT_GEMM=tile on the 8B Q4_K_M at
#  64 and 128 tokens (a 4,096-row weight fills 32 blocks there: does the default cost a short prompt's TTFT?).
# STAGE w (~1-2 min, no models): experiments/gemm_f16/wg/diag.py — the wgmma GEMM with its dequant, its x copies or
#  its wgmma taken out, timed: which one bounds a stage (wg/README.md "Next").
# STAGE l (~8 min): experiments/h200_long.sh (issue 10's 4k-prompt TTFT beside llama.cpp, the 32k prompt, an
#  impossible context; needs llama-bench built in this machine's earlier call).
set -u
source experiments/h200_common.sh
stage_begin ${SESSION_TAG:-s44}   # h200_session45.sh runs these stages as s45
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
d)
  depth_vs ;;
e)
  MODELS="synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 gemma3-270m" depth_vs ;;
t)
  TUNE_OUT=$OUT/h200-gemm-f16-nvidia-h200.jsonl tune_campaign h200-gemm-f16 ${T_LIMIT:-540} -m synth:llama3-8b:Q4_K_M \
    -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 ;;
k)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-240} kernel_check
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T1:-420} "synth:llama3-8b:Q4_K_M -p 512 -n 0 -r 5" table "$ARMS"
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T2:-560} "synth:llama3-8b:Q4_0 -p 512 -n 0 -r 5" table "$ARMS"
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T3:-0} "synth:llama3-8b:Q4_K_M -p 128 -n 0 -r 5" table "$ARMS" ;;
s)
  env_arms bench-short.jsonl ${T1:-200} "synth:llama3-8b:Q4_K_M -p 64 -n 0 -r 5" table MEMRA_PROMPT_GEMM=tile
  env_arms bench-short.jsonl ${T2:-400} "synth:llama3-8b:Q4_K_M -p 128 -n 0 -r 5" table MEMRA_PROMPT_GEMM=tile ;;
w)
  timeout 300 python3 experiments/gemm_f16/wg/diag.py --out $OUT/wg-diag.jsonl > $R/diag.txt 2>&1
  log "wg diag rc=$? $(el)"; tail -20 $R/diag.txt | cut -c1-200 | tee -a $R/log.txt ;;
l)
  bash experiments/h200_long.sh ;;
esac
tar czf $OUT/${SESSION_TAG:-s44}-$STAGE.tgz -C /tmp ${SESSION_TAG:-s44}-$STAGE
