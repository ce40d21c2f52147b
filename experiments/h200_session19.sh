#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 18).
# STAGE a (ship the models first: experiments/ship_models.py, .models/ship-0N/take.sh; carry .whl +
#   .synthtok, ~5 min): every GPU test with MEMRA_ATTN=hybrid (prompt rows on attn_fa, generated rows
#   on attn_decode; research/2026-12-03-session18 section 4), the two-arithmetic gate over the real
#   models' longer sequences included; then the default's GPU tests once more. If both pass, the
#   default can flip to hybrid (memra/gpu/runner.py's MEMRA_ATTN default, docs/FLAGS.md, bench's
#   ENGINE_PATHS) and a `memra bench --vs llama.cpp` run per model measures the floors.
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session19.sh
set -u
source experiments/h200_common.sh
stage_begin s19
case "$STAGE" in
a)
  link_models "the GPU tests need them"
  MEMRA_ATTN=hybrid timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests \
    > $R/gpu-tests-hybrid.txt 2>&1
  log "gpu tests (hybrid) rc=$? $(tail -1 $R/gpu-tests-hybrid.txt) $(el)"
  grep -E "^(FAILED|ERROR)" $R/gpu-tests-hybrid.txt | head -20 | tee -a $R/log.txt
  gpu_tests 580 ;;
esac
tar czf $OUT/s19-$STAGE.tgz -C /tmp s19-$STAGE
