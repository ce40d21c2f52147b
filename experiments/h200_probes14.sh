#!/usr/bin/env bash
# The next session's first, model-free call (~7 min; prepared in session 13, whose device time ran
# out first): the GEMM's slot-structure and skeleton ablations (experiments/gemm_ablate: no-merge,
# free, skeleton beside base; what experiments/gemm_plan's exact-order steps can buy), then mvt
# variant 7's Q4_K A/B (experiments/mvt/v7/ab.sh: the 8-row gate+up, issue 11's c = 8), each
# under a hard limit, then gemm.cu variant 9 (experiments/gemm_v9/ab.sh). ~7 min in all. Outputs:
# $OUT/probes14.log, ablate-*.jsonl, mvt-q4k-ab.{jsonl,log}, gemm-v9-ab.jsonl.
#   source .whl/setup.sh && bash experiments/h200_probes14.sh        (carry .whl)
set -u
: "${OUT:?}"
T0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/probes14.log; }
ARMS="base no-merge free skeleton" CFGS="2,2,2,4,1,3,1,1" timeout 100 bash experiments/gemm_ablate/ab.sh 2>&1 | tee -a $OUT/probes14.log
log "gemm ablate rc=${PIPESTATUS[0]}"
if [ -f experiments/mvt/v7/ab.sh ]; then
  left=$(( 230 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  LIMIT_S=$(( left - 10 )) timeout $left bash experiments/mvt/v7/ab.sh 2>&1 | tail -40 | tee -a $OUT/probes14.log
  log "mvt v7 ab rc=${PIPESTATUS[0]}"
fi
if [ -f experiments/gemm_v9/ab.sh ]; then   # gemm.cu variant 9 (GM_STATIC), ~2 min
  timeout 150 bash experiments/gemm_v9/ab.sh 2>&1 | tail -30 | tee -a $OUT/probes14.log
  log "gemm v9 ab rc=${PIPESTATUS[0]}"
fi
