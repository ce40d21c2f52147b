#!/usr/bin/env bash
# The next session's H200 plan (prepared in session 14): land gemm.cu variant 9 (GM_STATIC=1 the
# default, exact, -5..-12 % at 37-512 rows on the H200: research/2026-12-02-session14/) and measure
# what it buys: issue 11's c = 8 (2.98x, 0.7 % short of 3x: a c = 8 round is ~20 % GEMM prefill) and
# issue 10's pp512. Device time ~27 min of the 30:
#   0. HERE: bash experiments/h200_wheels.sh (the test extras), python3 experiments/ship_models.py 59,
#      python3 -m memra synth .synthtok/smollm2-tokenizer.gguf --tokenizer-only and
#      .synthtok/smollm2-utf8-tokenizer.gguf --tokenizer-only --utf8-safe, bash ../shared/device/llamacpp.sh;
#      bash experiments/gemm_v9/land.sh; python3 -m memra kernel-check --compile-only --arch sm_90a --only
#      gemm; commit (the receipt is stale until STAGE=d).
#   1. The six .models/ship-NN calls (research/ moved out of the tree while they run), back to back.
#   2. Each call carrying [".whl", ".synthtok", ".llamacpp"], back to back, starting `source .whl/setup.sh`:
#      STAGE=b  llama.cpp built in the background; h200-gemm-small and h200-gemm (gemm.cu's hash moved:
#               every job re-runs; ~240 + ~200 s), freeze; `memra tune dispatch --resume` to ~570 s
#      STAGE=c  the rest of the dispatch (this first run under per-path receipts re-times all 825
#               jobs, ~590 s in all; later gemm.cu / mvt.cu changes re-time about a fifth), freeze,
#               then kernel-check if the dispatch left ~150 s
#      STAGE=d  kernel-check (unless c did it), the GPU tests, then the serve evidence (c = 1 / 8 / 32 /
#               64 vs llama-server)
#      Between calls copy $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json and the
#      receipts -> research/tune/, research/kernel-check/.
#   First, one model-free call (carry [".whl"]):
#      STAGE=a  gemm.cu variant 10's A/B (experiments/gemm_v10/: base / v9 / v10a / v10, bit-checked,
#               ~150 s) and the free-order tile prototype's (experiments/gemm_tile/: its ceiling
#               against gemm.cu at 128 / 512 rows, ~90 s). If v10 beats v9 with 0 mismatches, land
#               experiments/gemm_v10/gemm.patch (it contains v9) with GM_STATIC / GM_RSS / GM_XSF / GM_AOFF
#               made the defaults (gemm.py's _KEYS if they stay tunables) instead of
#               experiments/gemm_v9/land.sh; then 1. and 2. as below.
#   Budget: a ~240 s + the ship calls ~130 s (with the cold start) + b ~570 + c ~560 + d ~280:
#   ~1,780 s — no slack; drop the tile A/B or the serve evidence if a call runs long.
# Logs under /tmp/s15-$STAGE -> $OUT/s15-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s15
M8="-m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
case "$STAGE" in
a)
  OUT=$R timeout 170 bash experiments/gemm_v10/ab.sh > $R/gemm-v10-ab.txt 2>&1
  log "gemm v10 ab rc=$? $(el)"; tail -40 $R/gemm-v10-ab.txt | tee -a $R/log.txt
  OUT=$R timeout 120 bash experiments/gemm_tile/ab.sh > $R/gemm-tile-ab.txt 2>&1
  log "gemm tile ab rc=$? $(el)"; tail -40 $R/gemm-tile-ab.txt | tee -a $R/log.txt
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
b)
  serve_build_start
  tune_campaign h200-gemm-small 260 -m smollm2-135m -m gemma3-270m
  left=$(( 500 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30
  tune_campaign h200-gemm $left $M8
  freeze_show 1
  left=$(( 565 - ($(date +%s) - T0) )); [ $left -gt 20 ] && dispatch_freeze $left 2
  cp research/tune/h200-gemm-small-nvidia-h200.jsonl research/tune/h200-gemm-nvidia-h200.jsonl \
    research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  serve_build_wait ;;
c)
  dispatch_freeze 450 3
  cp research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  if [ $(( $(date +%s) - T0 )) -lt 430 ]; then
    kernel_check
  fi ;;
d)
  if ! python3 -m memra kernel-check --status > /dev/null 2>&1; then   # exit 1 unless the receipt covers HEAD
    kernel_check
  fi
  gpu_tests 400
  serve_evidence ;;
esac
tar czf $OUT/s15-$STAGE.tgz -C /tmp s15-$STAGE
