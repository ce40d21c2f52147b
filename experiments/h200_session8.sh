#!/usr/bin/env bash
# Session 8 (2026-12-01) H200 calls, after the seven .models/ship-NN/take.sh calls (the last one
# carrying .whl and .synthtok); each call carries [".whl", ".llamacpp", ".synthtok"].
#   STAGE=kc       kernel-check over the launch set with the attn_fa family (MEMRA_ATTN=fa, its
#                  receipt copied to $OUT at once) while experiments/h200_serve.sh STAGE=build
#                  builds llama.cpp (llama-bench, llama-server) and the synthetic 8B / 1B, and the
#                  8B's Q4_0 and Q8_0 mixes are written
#   STAGE=evidence experiments/h200_serve.sh STAGE=evidence: tests/test_serve_gpu.py on SmolLM2,
#                  then `memra bench serve` of the 8B Q4_K_M against llama-server, c = 1, 8, 32, 64
#   STAGE=bench    `memra bench --vs llama.cpp` (pp512 + tg128, one run per model: SmolLM2,
#                  Gemma-3, the 1B Q4_0, the 8B Q4_K_M / Q4_0 / Q8_0; the 8B Q4_K_M also at depth
#                  4096), then pp512 + tg128 with MEMRA_ATTN=fa of SmolLM2, Gemma-3 and the 8B
#                  Q4_K_M, then every GPU test in the time left
# Later, the matvec prologue (mv_q8p, MEMRA_FUSED_PRO) after the seven model parts again:
#   STAGE=tune     kernel-check --only matvec (mv_q8p's bits; stops here unless ALL GREEN), then
#                  the h200 campaign's matvec, matvec_glu, rmsnorm and add_rmsnorm jobs (the
#                  kernels whose sources changed: matvec.cu, norm.cu, rms.cuh), memra tune
#                  freeze and show; the receipts kept in /tmp/s8-keep for STAGE=pro
#   STAGE=pro      the same freeze again (the tree's copy of the table is the committed one),
#                  kernel-check over the launch set, pp512 + tg128 of SmolLM2 and Gemma-3 with
#                  MEMRA_FUSED_PRO=1 / 0 / 1 / 0 (interleaved) and of the 1B, every GPU test
# Results tarred into $OUT/s8-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s8
LB=/root/llama.cpp/build/bin/llama-bench
if [ "$STAGE" = kc ]; then
  ( OUT=$R STAGE=build bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  ( for q in Q4_0 Q8_0; do python3 -c "import sys; from memra.tune.bench import synth_model; synth_model('llama3-8b', sys.argv[1], sys.argv[2])" $q $TOK; done ) > $R/synth.txt 2>&1 &
  SYN=$!
  kernel_check
  grep -E "attn_fa" $R/kernel-check.txt | head -12 | tee -a $R/log.txt
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt $OUT/ 2>/dev/null
  wait $BUILD $SYN; log "serve build: $(tail -4 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls -la /root/llama.cpp/build/bin/ | grep llama | tee -a $R/log.txt
elif [ "$STAGE" = evidence ]; then
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
elif [ "$STAGE" = bench ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=kc builds it"
  bench_vs_llamacpp "$LB"
  for m in smollm2-135m gemma3-270m synth:llama3-8b:Q4_K_M; do
    f=$(echo $m | tr : _)
    MEMRA_ATTN=fa timeout 100 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK --tag MEMRA_ATTN=fa \
      --out $R/bench-fa.jsonl > $R/bench-fa-$f.txt 2>&1
    log "bench fa $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-fa-$f.txt | tail -3 | tee -a $R/log.txt
    cp $R/bench-fa.jsonl $OUT/ 2>/dev/null
  done
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
elif [ "$STAGE" = tune ]; then
  mkdir -p /tmp/s8-keep
  # mv_q8p's bits first (the matvec family: its checks, canaries and launch cases): a campaign
  # on sources that kernel-check then rejects would be thrown away
  timeout 150 python3 -m memra kernel-check --only matvec --out $R/kc-matvec/ > $R/kc-matvec.txt 2>&1
  rc=$?; log "kernel-check matvec rc=$rc $(tail -1 $R/kc-matvec.txt) $(el)"
  grep -E "^FAIL|MISSED|not caught" $R/kc-matvec.txt | head -20 | tee -a $R/log.txt
  grep -E "mv_q8p" $R/kc-matvec.txt | head -8 | tee -a $R/log.txt
  cp $R/kc-matvec.txt $OUT/
  if ! tail -3 $R/kc-matvec.txt | grep -q "ALL GREEN"; then log "matvec family not green: no campaign"; tar czf $OUT/s8-$STAGE.tgz -C /tmp s8-$STAGE; exit 1; fi
  timeout 330 python3 -m memra tune run h200 -m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M \
    -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 \
    -k matvec -k matvec_glu -k rmsnorm -k add_rmsnorm --out research/tune/h200-nvidia-h200.jsonl > $R/tune.txt 2>&1
  log "tune rc=$? $(tail -1 $R/tune.txt) $(el)"
  cp research/tune/h200-nvidia-h200.jsonl /tmp/s8-keep/
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  cp research/tune/h200-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $OUT/
elif [ "$STAGE" = pro ]; then
  cp /tmp/s8-keep/h200-nvidia-h200.jsonl research/tune/
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  ( python3 -c "import sys; from memra.tune.bench import synth_model; synth_model('llama-1b', 'Q4_0', sys.argv[1])" $TOK ) > $R/synth.txt 2>&1 &
  kernel_check
  grep -E "mv_q8p" $R/kernel-check.txt | head -12 | tee -a $R/log.txt
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt tune/defaults/nvidia-h200.json $OUT/ 2>/dev/null
  wait
  for pro in 1 0 1 0; do
    for m in smollm2-135m gemma3-270m; do
      MEMRA_FUSED_PRO=$pro timeout 60 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK \
        --tag MEMRA_FUSED_PRO=$pro --out $R/bench-pro.jsonl > $R/bench-$m-$pro.txt 2>&1
      log "bench $m pro=$pro rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-$m-$pro.txt | tail -3 | tee -a $R/log.txt
      cp $R/bench-pro.jsonl $OUT/ 2>/dev/null
    done
  done
  timeout 60 python3 -m memra bench synth:llama-1b:Q4_0 -p 512 -n 128 --synth-tokenizer $TOK --out $R/bench-pro.jsonl \
    > $R/bench-1b.txt 2>&1; log "bench 1b rc=$? $(el)"; grep -E "pp512|tg128" $R/bench-1b.txt | tail -2 | tee -a $R/log.txt
  cp $R/bench-pro.jsonl $OUT/ 2>/dev/null
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
fi
tar czf $OUT/s8-$STAGE.tgz -C /tmp s8-$STAGE
