#!/usr/bin/env bash
# Session 14's H200 landing of mvt.cu variant 7 (MVT_SB, the Q4_K / Q5_K super-block walk), after
# the six model-shipping calls (python3 experiments/ship_models.py 59; each call carries only its
# .models/ship-NN with research/ moved out of the tree: tree + part < 64 MiB). Then, each call
# carrying [".whl", ".synthtok", ".llamacpp"], back to back (llama.cpp's build and the models live
# in /root between calls):
#   STAGE=b  llama.cpp built in the background; the h200-mvt campaign (mvt.cu's hash changed: every
#            job re-runs, the two MVT_SB configurations among them), freeze; `memra tune dispatch`
#            until ~570 s (it resumes in STAGE=c), freeze; table and receipts to $OUT
#   STAGE=c  the rest of the dispatch, freeze; kernel-check (receipt to $OUT); GPU tests
#   STAGE=e  (the machine given back after c) the GPU tests while llama.cpp builds, then d's evidence
#   STAGE=d  experiments/h200_serve.sh STAGE=evidence (the serve GPU tests, `memra bench serve
#            --vs` llama-server at c = 1 / 8 / 32 / 64; issue 11's c = 8 floor is 3x)
# Between calls copy $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json and the
# receipts -> research/tune/, research/kernel-check/. Logs under /tmp/s14-$STAGE -> $OUT/s14-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s14
if [ "$STAGE" = b ]; then
  serve_build_start
  tune_campaign h200-mvt 240 $MALL
  freeze_show 1
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30
  dispatch_freeze $left 2
  cp research/tune/h200-mvt-nvidia-h200.jsonl research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  serve_build_wait
elif [ "$STAGE" = c ]; then
  dispatch_freeze 200 3
  grep -E "^│ (mvt|dispatch)" $R/show-3.txt | head -80 >> $R/log.txt
  cp research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  kernel_check
  gpu_tests 570
elif [ "$STAGE" = e ]; then   # a fresh machine after the ship calls: c's GPU tests beside d's build, then d
  serve_build_start
  gpu_tests 250
  serve_build_wait
  serve_evidence
elif [ "$STAGE" = d ]; then
  serve_evidence
fi
tar czf $OUT/s14-$STAGE.tgz -C /tmp s14-$STAGE
