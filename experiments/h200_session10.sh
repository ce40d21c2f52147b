#!/usr/bin/env bash
# Session 10 (2026-12-02) H200 calls: the tuning the table still lacked (mvt never campaigned,
# the 512-row prefill bucket, the row-count dispatch), then the evidence on the new table.
# Each call carries [".whl", ".synthtok", ".llamacpp"] and starts with `source .whl/setup.sh`;
# the seven .models/ship-NN/take.sh calls come first. Copy $OUT's table and receipts into the
# tree between calls (the device's copy of the tree is replaced by this machine's each call):
# $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json, $OUT/nvidia-h200.json (kernel-check's
# receipt) -> research/kernel-check/, the campaign receipts -> research/tune/.
#   STAGE=tune1  in the background llama.cpp (llama-bench, llama-server) and the synthetic models
#                (experiments/h200_serve.sh STAGE=build; the 8B's three mixes and the 1B),
#                meanwhile the h200-mvt campaign (4- and 8-row buckets), the gemm campaigns'
#                512-row jobs (--resume: the rest is measured), freeze, show
#   STAGE=tune2  `memra tune dispatch` (mv_q8 / mvt / GEMM per shape and row bucket, with the
#                table's configurations), freeze, show, kernel-check on the new launch set, GPU tests
#   STAGE=bench  `memra bench --vs llama.cpp` per model, `memra bench -np` of the 8B and the 1B,
#                `memra profile` of the 8B at 8 rows, then experiments/h200_serve.sh STAGE=evidence
# Results under /tmp/s10-$STAGE, tarred into $OUT/s10-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s10
LB=/root/llama.cpp/build/bin/llama-bench
M8="-m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
MALL="-m smollm2-135m -m gemma3-270m $M8"
if [ "$STAGE" = tune1 ]; then
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  ( for q in Q4_K_M Q4_0 Q8_0; do synth llama3-8b $q $TOK; done; synth llama-1b Q4_0 $TOK ) > $R/synth.txt 2>&1 &
  SYN=$!
  timeout 280 python3 -m memra tune run h200-mvt $MALL --resume \
    --out research/tune/h200-mvt-nvidia-h200.jsonl > $R/tune-mvt.txt 2>&1
  log "tune mvt rc=$? $(tail -1 $R/tune-mvt.txt) $(el)"
  timeout 100 python3 -m memra tune run h200-gemm-small -m smollm2-135m -m gemma3-270m --resume \
    --out research/tune/h200-gemm-small-nvidia-h200.jsonl > $R/tune-small.txt 2>&1
  log "tune gemm-small rc=$? $(tail -1 $R/tune-small.txt) $(el)"
  left=$(( 480 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30
  timeout $left python3 -m memra tune run h200-gemm $M8 --resume \
    --out research/tune/h200-gemm-nvidia-h200.jsonl > $R/tune-gemm.txt 2>&1
  log "tune gemm rc=$? $(tail -1 $R/tune-gemm.txt) $(el)"
  freeze_show 1
  cp research/tune/h200-mvt-nvidia-h200.jsonl research/tune/h200-gemm-small-nvidia-h200.jsonl \
    research/tune/h200-gemm-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  wait $SYN; log "synth: $(tail -4 $R/synth.txt | tr '\n' ' ') $(el)"
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls /root/llama.cpp/build/bin/ | grep -E "llama-(bench|server)" | tee -a $R/log.txt
elif [ "$STAGE" = tune2 ]; then
  timeout 260 python3 -m memra tune dispatch $MALL --resume \
    --out research/tune/h200-dispatch-nvidia-h200.jsonl > $R/tune-dispatch.txt 2>&1
  log "tune dispatch rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  freeze_show 2
  grep -E "^│ (mvt|dispatch)" $R/show-2.txt | head -80 >> $R/log.txt
  cp research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/
  # the table under its own name: kernel-check's receipt below is also nvidia-h200.json (in session
  # 10 it overwrote the table in $OUT; the table was re-frozen here from the dispatch receipts)
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt $OUT/ 2>/dev/null
  gpu_tests 585
elif [ "$STAGE" = bench ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=tune1 builds it"
  bench_vs_llamacpp "$LB"
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    f=$(echo $m | tr : _)
    timeout 90 python3 -m memra bench $m -p 0 -n 128 -np 1,2,4,8,16,32,64 -r 3 --synth-tokenizer $TOK \
      --out $R/bench-np.jsonl > $R/bench-np-$f.txt 2>&1
    log "bench -np $m rc=$? $(el)"; grep -E "np|tg128" $R/bench-np-$f.txt | tail -8 | tee -a $R/log.txt
  done
  cp $R/bench-np.jsonl $OUT/ 2>/dev/null
  timeout 60 python3 -m memra profile synth:llama3-8b:Q4_K_M --rows 8 --depth 64 --synth-tokenizer $TOK --json \
    > $R/profile-8b-rows8.json 2> $R/profile.err; log "profile rc=$? $(el)"
  cp $R/profile-8b-rows8.json $OUT/ 2>/dev/null
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
fi
tar czf $OUT/s10-$STAGE.tgz -C /tmp s10-$STAGE
