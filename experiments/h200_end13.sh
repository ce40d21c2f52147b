#!/usr/bin/env bash
# Session 13's last device minutes (~3 min budget, cold machine): the GEMM's slot structure and
# skeleton ablations (experiments/gemm_ablate: no-merge, free, skeleton beside base), then mvt
# variant 7's Q4_K A/B if it is in the tree (experiments/mvt/v7/ab.sh), each under a hard limit.
#   source .whl/setup.sh && bash experiments/h200_end13.sh        (carry .whl)
set -u
: "${OUT:?}"
T0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/end13.log; }
ARMS="base no-merge free skeleton" CFGS="2,2,2,4,1,3,1,1" timeout 75 bash experiments/gemm_ablate/ab.sh 2>&1 | tee -a $OUT/end13.log
log "gemm ablate rc=${PIPESTATUS[0]}"
if [ -f experiments/mvt/v7/ab.sh ]; then
  left=$(( 170 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  timeout $left bash experiments/mvt/v7/ab.sh 2>&1 | tail -40 | tee -a $OUT/end13.log
  log "mvt v7 ab rc=${PIPESTATUS[0]}"
fi
