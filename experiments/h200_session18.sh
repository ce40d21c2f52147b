#!/usr/bin/env bash
# STAGE a: the next session's first H200 call (prepared in session 17), carry [".whl", ".synthtok"], ~2.5 min:
#   experiments/ring_short/ab.sh   the ring's short-context loss (research/2026-12-02-session17 section 8):
#                                  registers vs ring at shared-memory carveouts 60 / 90 %, with and without
#                                  PDL, on the synthetic 8B's whole decode step and its one-layer chain
# Logs under /tmp/s18-$STAGE -> $OUT/s18-$STAGE.tgz; the JSONL to $OUT.
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session18.sh
set -u
source experiments/h200_common.sh
stage_begin s18
case "$STAGE" in
a)
  OUT=$R LIMIT_S=110 timeout 120 bash experiments/ring_short/ab.sh > $R/ring-short-ab.txt 2>&1
  log "ring_short rc=$? $(el)"; tail -70 $R/ring-short-ab.txt | tee -a $R/log.txt
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s18-$STAGE.tgz -C /tmp s18-$STAGE
