#!/usr/bin/env bash
# Session 53's landing attempt of MV_K4BF (kernels/qtypes.cuh: the Q4_K / Q5_K row scalars without branches, a
# matvec.cu tunable defaulting to the old code, so every tabled module compiled as before and `memra tune carry`
# carried all receipts; experiments/mv_k4bf: the same bits, the 8B's Q4_K matvecs -0.9 .. -5.6 % alone), chosen the
# way the matvec PDL triggers were (sessions 47-48): by the engine's own tg128, as an engine-choice group. Ran at
# f12efb3 (H100): -0.19 %, nothing chosen, the edit withdrawn (experiments/mv_k4bf/README.md); kept for the next
# candidate of this shape (the kernel edit must be in the tree; ship the real models first, or kernel-check's
# launch set cannot be built and its receipt is not ALL GREEN).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=K bash experiments/h200_session53.sh
# carry .whl and .synthtok. STAGE K (~6 min, no shipped models): the synthetic 8B Q4_K_M made first; a candidate
# table "k4" = the shipped table with MV_K4BF=1 on every batch-1 matvec / matvec_glu entry the 8B's decode step
# launches (experiments/engine_tune overlay; on its Q6_K entries the define compiles to the same code); tg128 arms
# alternating (K_ARMS); the candidate, if it gains in every pass, becomes engine-choice records (evidence: the bench
# receipts under research/<RES_DIR>/K/), frozen on the device; then kernel-check --add-to for the chosen modules'
# new launch cases. $OUT: bench-k4bf.jsonl, defaults/nvidia-h200.json, tune/engine-choices-nvidia-h200.jsonl, the
# kernel-check receipt, s53-K.tgz — copy them in and commit.
# STAGE L (not run; written before MV_K4BF was a tunable): the campaign form of the same landing (re-measure the
# K-quant matvec entries, dispatch, freeze, whole kernel-check) for an edit that changes tabled modules.
set -u
source experiments/h200_common.sh
stage_begin s53
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$STAGE" = K ]; then
  RES=research/${RES_DIR:-2026-12-07-session53}/K; mkdir -p $RES
  OV=$R/ov
  m=synth:llama3-8b:Q4_K_M
  log "synth: $(synth llama3-8b Q4_K_M $TOK | tail -1) $(el)"
  overlay k4 $m "matvec,matvec_glu:MV_K4BF=1"
  choice_ab bench-k4bf ${K_END:-360} "$m=${K_ARMS:-shipped k4 k4 shipped shipped k4}"
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-150} kernel_check
  cp $R/kernel-check/nvidia-h200.json $OUT/kernel-check-nvidia-h200.json 2>/dev/null
  tar czf $OUT/s53-K.tgz -C /tmp s53-K
  exit 0
fi
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
