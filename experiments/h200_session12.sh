#!/usr/bin/env bash
# Session 12's warm H200 stretch (after the seven .models/ship-NN/take.sh calls, each carrying
# only its folder, with two research/ folders moved out of the tree while they ran: tree + part
# must stay under 64 MiB); each call carries [".whl", ".synthtok", ".llamacpp"] and starts with
# `source .whl/setup.sh`. Between the calls $OUT's table and receipts were copied into the tree:
# $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json, $OUT/nvidia-h200.json
# (kernel-check's receipt) -> research/kernel-check/, $OUT/h200-nvidia-h200.jsonl -> research/tune/.
#   STAGE=a  in the background llama.cpp and the synthetic models (h200_serve.sh STAGE=build);
#            meanwhile the attention and RoPE entries re-measured on the current sources (the
#            h200 campaign, --kernels attn_decode,rope_norm_kv: the table's stale list empty
#            again), freeze, show, kernel-check on the launch set, the GPU tests
#   STAGE=c  `memra bench --vs llama.cpp` per model (the same-run board), with the 8B and SmolLM2
#            at depth 4096
# Results under /tmp/s12-$STAGE, tarred into $OUT/s12-$STAGE.tgz. (What a decode step's empty
# split blocks cost was measured before, by experiments/h200_depth12.sh.)
set -u
source experiments/h200_common.sh
stage_begin s12
LB=/root/llama.cpp/build/bin/llama-bench
MALL="-m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
if [ "$STAGE" = a ]; then
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  timeout 200 python3 -m memra tune run h200 $MALL --kernels attn_decode,rope_norm_kv \
    --out research/tune/h200-nvidia-h200.jsonl > $R/tune-att.txt 2>&1
  log "tune attention/rope rc=$? $(tail -1 $R/tune-att.txt) $(el)"
  freeze_show a
  cp research/tune/h200-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null
  gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  gpu_tests 540
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls /root/llama.cpp/build/bin/ | grep -E "llama-(bench|server)" | tee -a $R/log.txt
elif [ "$STAGE" = c ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=a builds it"
  bench_vs_llamacpp "$LB"
fi
tar czf $OUT/s12-$STAGE.tgz -C /tmp s12-$STAGE
