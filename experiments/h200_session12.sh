#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 11). Ship the models first (the seven
# .models/ship-NN/take.sh calls, each carrying only its folder, with research/ of the session
# moved out of the tree while they run: tree + part must stay under 64 MiB); then each call
# carries [".whl", ".synthtok", ".llamacpp"] and starts with `source .whl/setup.sh`. Copy $OUT's
# table and receipts into the tree between calls:
# $OUT/table-nvidia-h200.json -> tune/defaults/nvidia-h200.json, $OUT/nvidia-h200.json (kernel-check's
# receipt) -> research/kernel-check/, $OUT/h200-nvidia-h200.jsonl -> research/tune/.
#   STAGE=a  in the background llama.cpp and the synthetic models (h200_serve.sh STAGE=build);
#            meanwhile the attention and RoPE entries re-measured on the current sources (the
#            h200 campaign, --kernels attn_decode,rope_norm_kv: the table's stale list empty
#            again), freeze, show; then experiments/attn_rows2/check.py (multi-row prefill
#            attention with decode's bits)
#   STAGE=b  kernel-check on the launch set (the re-frozen attention entries may change it), GPU tests
#   STAGE=c  `memra bench --vs llama.cpp` per model (the same-run board: the split-count gain),
#            then experiments/h200_serve.sh STAGE=evidence, then tg128 on 2 attention splits
#            against the plan's (what a decode step's empty split blocks cost)
# Results under /tmp/s12-$STAGE, tarred into $OUT/s12-$STAGE.tgz.
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
  timeout 200 python3 experiments/attn_rows2/check.py > $OUT/attn-rows2.jsonl 2> $R/attn-rows2.err
  log "attn_rows2 rc=$? $(el)"; tail -3 $R/attn-rows2.err | tee -a $R/log.txt
  grep -c '"exact": true' $OUT/attn-rows2.jsonl | tee -a $R/log.txt
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls /root/llama.cpp/build/bin/ | grep -E "llama-(bench|server)" | tee -a $R/log.txt
elif [ "$STAGE" = b ]; then
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt $OUT/ 2>/dev/null
  gpu_tests 585
elif [ "$STAGE" = c ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=a builds it"
  bench_vs_llamacpp "$LB"
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
  # what a decode step's empty split blocks cost: tg128 from depth 0 (at most 129 keys a row: one
  # 128-key split, the same bits with 2 splits as with the plan's 33-88) on the plan's grid and
  # on 2 splits (MEMRA_ATT_SPLITS; receipts carry the seam). A gain says: key decode graphs by
  # the deepest row's split count too.
  for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    for sp in "" 2; do
      MEMRA_ATT_SPLITS=$sp timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
        --out $R/decode-splits.jsonl > $R/cur.txt 2>&1
      log "tg128 $m splits=${sp:-plan} rc=$? $(grep -aE "tg128" $R/cur.txt | tail -1) $(el)"
    done
  done
  cp $R/decode-splits.jsonl $OUT/ 2>/dev/null
fi
tar czf $OUT/s12-$STAGE.tgz -C /tmp s12-$STAGE
