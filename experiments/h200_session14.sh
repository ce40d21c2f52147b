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
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  timeout 240 python3 -m memra tune run h200-mvt $MALL --resume \
    --out research/tune/h200-mvt-nvidia-h200.jsonl > $R/tune-mvt.txt 2>&1
  log "tune mvt rc=$? $(tail -1 $R/tune-mvt.txt) $(el)"
  freeze_show 1
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30
  dispatch_freeze $left 2
  cp research/tune/h200-mvt-nvidia-h200.jsonl research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
elif [ "$STAGE" = c ]; then
  dispatch_freeze 200 3
  grep -E "^│ (mvt|dispatch)" $R/show-3.txt | head -80 >> $R/log.txt
  cp research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null
  gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  gpu_tests 570
elif [ "$STAGE" = e ]; then   # a fresh machine after the ship calls: c's GPU tests beside d's build, then d
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  gpu_tests 250
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
elif [ "$STAGE" = d ]; then
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
fi
tar czf $OUT/s14-$STAGE.tgz -C /tmp s14-$STAGE
