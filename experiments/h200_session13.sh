#!/usr/bin/env bash
# The next session's H200 plan (prepared in session 12). Device time is the limit: ~30 min.
#  1. One model-free call:  bash experiments/h200_probes13.sh   (~8 min; attn_walk, persist,
#     attn_rows2, gemm_ablate, ncu of decode attention at depth)  — and, in a second call,
#     bash experiments/h200_depth13.sh (~3 min; MEMRA_ATT_DEPTH against the default).
#  2. Locally: `git apply experiments/mvt/landing.patch` (mvt v6 as kernels/mvt.cu's layout 1;
#     experiments/mvt/README.md), and experiments/attn_walk's landing if its probe held.
#  3. The seven .models/ship-NN calls (each carrying only its folder; move two research/ session
#     folders out of the tree while they run: tree + part < 64 MiB), then, carrying [".whl",
#     ".synthtok", ".llamacpp"], each call starting with `source .whl/setup.sh`:
#       STAGE=b  llama.cpp built in the background; the h200-mvt campaign (mvt.cu's hash changed:
#                every job re-runs, the v6 configurations among them), freeze; `memra tune
#                dispatch` (the mvt column now has both layouts), freeze; table and receipts to $OUT
#       STAGE=c  kernel-check (receipt to $OUT), GPU tests (~8 min together)
#       STAGE=d  experiments/h200_serve.sh STAGE=evidence (~4 min: the serve GPU tests and `memra
#                bench serve --vs` llama-server at c = 1 / 8 / 32 / 64: the chain queued ahead and
#                mvt v6 together; issue 11's c = 8 floor is 3x)
#     Between calls copy $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json and the
#     receipts -> research/tune/, research/kernel-check/.
# Results under /tmp/s13-$STAGE, tarred into $OUT/s13-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s13
MALL="-m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
if [ "$STAGE" = b ]; then
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  timeout 240 python3 -m memra tune run h200-mvt $MALL --resume \
    --out research/tune/h200-mvt-nvidia-h200.jsonl > $R/tune-mvt.txt 2>&1
  log "tune mvt rc=$? $(tail -1 $R/tune-mvt.txt) $(el)"
  freeze_show 1
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30
  timeout $left python3 -m memra tune dispatch $MALL --resume \
    --out research/tune/h200-dispatch-nvidia-h200.jsonl > $R/tune-dispatch.txt 2>&1
  log "tune dispatch rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  freeze_show 2
  grep -E "^│ (mvt|dispatch)" $R/show-2.txt | head -80 >> $R/log.txt
  cp research/tune/h200-mvt-nvidia-h200.jsonl research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
elif [ "$STAGE" = c ]; then
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null
  gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  gpu_tests 560
elif [ "$STAGE" = d ]; then
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
fi
tar czf $OUT/s13-$STAGE.tgz -C /tmp s13-$STAGE
