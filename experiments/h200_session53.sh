#!/usr/bin/env bash
# Session 53's landing call (research/2026-12-07-session53/README.md): kernels/qtypes.cuh's branch-free rowscal_k4
# (experiments/mv_k4bf: the same integers, mv_q8 on the 8B's Q4_K shapes -0.9 .. -5.6 %) staled the table entries
# whose modules it changes (`memra tune carry --from <before>` carried the rest on the CPU). This call re-measures
# them and checks every kernel:
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=L bash experiments/h200_session53.sh
# carry .whl and .synthtok. STAGE L (~6 min, no shipped models): the h200 campaign's matvec / matvec_glu jobs and the
# h200-mvt campaign's (LAND_MVT=0: not) on the synthetic 8B Q4_K_M (the only benchmark model with Q4_K / Q5_K
# weights: SmolLM2's and Gemma-3's K-quant fallbacks are not), the dispatch measurements of that model, the freeze
# (H100 standing in for the H200, as session 45's), `memra tune show`, then the whole kernel-check; $OUT: the
# receipts files, the table, the kernel-check receipt, the call's log.
set -u
source experiments/h200_common.sh
stage_begin s53
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$STAGE" = L ]; then
  M8="-m synth:llama3-8b:Q4_K_M"
  tune_campaign h200 200 $M8 --kernels matvec,matvec_glu
  [ "${LAND_MVT:-1}" = 1 ] && tune_campaign h200-mvt 150 $M8
  timeout 200 python3 -m memra tune dispatch $M8 --resume --out research/tune/h200-dispatch-nvidia-h200.jsonl \
    > $R/tune-dispatch.txt 2>&1
  log "tune dispatch rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  freeze_show L
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-nvidia-h200.jsonl research/tune/h200-mvt-nvidia-h200.jsonl \
    research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/tune/
  cp tune/defaults/nvidia-h200.json $OUT/defaults/
  KC_LIMIT=${KC_LIMIT:-200} kernel_check
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null
  tar czf $OUT/s53-L.tgz -C /tmp s53-L
  exit 0
fi
echo "unknown STAGE $STAGE"; exit 2
