#!/usr/bin/env bash
# The next session's device calls (prepared in session 42, research/2026-12-06-session42).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=f bash experiments/h200_session43.sh
# carry .whl and .synthtok; STAGE k and p need the real models shipped first (experiments/ship_models.py's
# .models/ship-0N: six calls), STAGE d carries .llamacpp. Any sm_90a part with 132 SMs (an H100 SXM or the H200).
# Compare arms only inside one call.
# STAGE f (~5 min, no models): experiments/gemm_f16/probe.py — gemm_f16.cu's configurations (the two-blocks-an-SM 2 x 2
#  block and the 4 x 4 tile with the dequant between the mma added in session 42) and the warp-specialized wgmma
#  kernel (experiments/gemm_f16/wg: each configuration first smoke-run in its own process, a hang or fault dropping
#  only it), checked against numpy and timed against the int8 prompt tile on the 8B's shapes at 512 rows.
# STAGE k (~3 min, models shipped): Gemma-3's attention switch (experiments/gemma_switch/landing.patch applied to the
#  working tree first): kernel-check --add-to for its 200 cases. ALL GREEN: commit the receipt with the table.
# (STAGE p, the integration patch's own call, was not needed: the patch landed with the wg kernel as its built-in
#  and STAGE k ran its kernel-check, q and r its pp512 arms.)
# STAGE d (~9 min, carry .llamacpp): `--vs llama.cpp`, the depth set (h200_common.sh's depth_vs).
set -u
source experiments/h200_common.sh
stage_begin s43
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
f)
  timeout ${F_LIMIT:-540} python3 experiments/gemm_f16/probe.py --out $OUT/gemm-f16.jsonl --limit ${F_SHAPES:-380} \
    > $R/probe.txt 2>&1
  log "gemm_f16 probe rc=$? $(el)"; cp $R/probe.txt $OUT/; tail -30 $R/probe.txt | cut -c1-400 | tee -a $R/log.txt ;;
k)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-200} kernel_check ;;
q)
  # STAGE q (~9 min, after STAGE k's kernel-check of the integration): pp512, the table's tile against
  #  MEMRA_PROMPT_GEMM=f16 (gemm_f16_wg.cu), arms alternating, on the 8B Q4_K_M, Q4_0 and Q8_0
  env_arms bench-prompt-gemm.jsonl ${T1:-200} "synth:llama3-8b:Q4_K_M -p 512 -n 0 -r 5" table MEMRA_PROMPT_GEMM=f16
  env_arms bench-prompt-gemm.jsonl ${T2:-380} "synth:llama3-8b:Q4_0 -p 512 -n 0 -r 5" table MEMRA_PROMPT_GEMM=f16
  env_arms bench-prompt-gemm.jsonl ${T3:-540} "synth:llama3-8b:Q8_0 -p 512 -n 0 -r 5" table MEMRA_PROMPT_GEMM=f16 ;;
r)
  # STAGE r (~6 min, models shipped): the prompt rows' GEMM on the other models (gates first: MATCH / NEAR-TIE),
  #  table against MEMRA_PROMPT_GEMM=f16, then the GPU tests
  for m in "gemma3-270m -p 512 -n 0 -r 5" "smollm2-135m -p 512 -n 0 -r 5" "synth:llama-1b:Q4_0 -p 512 -n 0 -r 5"; do
    env_arms bench-prompt-gemm-r.jsonl ${T1:-240} "$m" table MEMRA_PROMPT_GEMM=f16
  done
  MEMRA_PROMPT_GEMM=f16 gpu_tests ${T2:-560} ;;
d)
  depth_vs ;;
esac
tar czf $OUT/s43-$STAGE.tgz -C /tmp s43-$STAGE
