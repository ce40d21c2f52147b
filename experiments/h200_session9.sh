#!/usr/bin/env bash
# Session 9 (2026-12-01) H200 calls. Each carries [".whl", ".synthtok", ".llamacpp"] and starts
# with `source .whl/setup.sh`; the seven .models/ship-NN/take.sh calls come before STAGE=prep.
#   STAGE=ab       gemm.cu variant 8 (row scalars once per quad) against variant 7 (.old/, made
#                  here before the call: git show <v7 rev>:kernels/gemm.cu > .old/gemm.cu, and
#                  mma_frag.cuh) in one call: experiments/gemm_sweep.sh, Q4_K and Q6_K, the
#                  8B's four GEMM shapes at 16 / 64 / 128 / 512 rows, the table's configurations,
#                  every timed launch bit-checked against mv_q8
#   STAGE=prep     llama.cpp (llama-bench, llama-server) and the synthetic models built in the
#                  background (experiments/h200_serve.sh STAGE=build, the 8B's three mixes),
#                  meanwhile the gemm campaigns on the changed gemm.cu (h200-gemm-small on the
#                  real models, then h200-gemm on the four synthetic ones' shapes), freeze, show; the
#                  table and receipts to $OUT (copy them into the tree before the next call)
#   STAGE=kc       kernel-check over the launch set (the new table, 512-row chunks), GPU tests
#   STAGE=bench    `memra bench --vs llama.cpp` per model (pp512 + tg128; the 8B Q4_K_M also at
#                  depth 4096), then memra alone with MEMRA_PREFILL_CHUNK=128 (the chunk before
#                  this session) and with MEMRA_ATTN=fa, interleaved with the default
#   STAGE=evidence experiments/h200_serve.sh STAGE=evidence (serve GPU tests, `memra bench serve`
#                  of the 8B against llama-server, c = 1, 8, 32, 64)
#   STAGE=chain    (a fresh machine, SmolLM2 shipped by .models/sm-a and sm-b) tests/test_serve_gpu.py,
#                  then `memra bench serve` of the 8B alone with MEMRA_SERVE_CHAIN=0 and 8
# Results under /tmp/s9-$STAGE, tarred into $OUT/s9-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s9
LB=/root/llama.cpp/build/bin/llama-bench
M8="-m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
if [ "$STAGE" = ab ]; then
  [ -f .old/gemm.cu ] || { log "no .old/gemm.cu"; exit 1; }
  OUT=$R OLD=.old CFGS="2,1,2,4,2,3,1,2;2,2,2,4,1,3,1,1;1,1,2,4,4,3,1,2;2,1,2,4,4,3,1,1;1,1,2,2,8,3,1,2" \
    NBS=16,64,128,512 REPS=25 bash experiments/gemm_sweep.sh 2>&1 | tee -a $R/log.txt
  cp $R/sweep-*.jsonl $OUT/ 2>/dev/null
elif [ "$STAGE" = prep ]; then
  ( OUT=$R STAGE=build bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
  ( for q in Q4_K_M Q4_0 Q8_0; do synth llama3-8b $q $TOK; done; synth llama-1b Q4_0 $TOK ) > $R/synth.txt 2>&1 &
  SYN=$!
  timeout 200 python3 -m memra tune run h200-gemm-small -m smollm2-135m -m gemma3-270m \
    --out research/tune/h200-gemm-small-nvidia-h200.jsonl > $R/tune-small.txt 2>&1
  log "tune gemm-small rc=$? $(tail -1 $R/tune-small.txt) $(el)"
  timeout 300 python3 -m memra tune run h200-gemm $M8 \
    --out research/tune/h200-gemm-nvidia-h200.jsonl > $R/tune-gemm.txt 2>&1
  log "tune gemm rc=$? $(tail -1 $R/tune-gemm.txt) $(el)"
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  cp research/tune/h200-gemm-small-nvidia-h200.jsonl research/tune/h200-gemm-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $OUT/
  wait $SYN; log "synth: $(tail -4 $R/synth.txt | tr '\n' ' ') $(el)"
  wait $BUILD; log "serve build: $(tail -3 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
  ls /root/llama.cpp/build/bin/ | grep -E "llama-(bench|server)" | tee -a $R/log.txt
elif [ "$STAGE" = kc ]; then
  if [ -n "${RESUME_SMALL:-}" ]; then   # the prep call's gemm-small campaign ran out of time
    timeout 150 python3 -m memra tune run h200-gemm-small -m smollm2-135m -m gemma3-270m --resume \
      --out research/tune/h200-gemm-small-nvidia-h200.jsonl > $R/tune-small.txt 2>&1
    log "tune gemm-small --resume rc=$? $(tail -1 $R/tune-small.txt) $(el)"
    python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$?"
    python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
    cp research/tune/h200-gemm-small-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $OUT/
  fi
  kernel_check
  cp $R/kernel-check/nvidia-h200.json $R/kernel-check.txt $OUT/ 2>/dev/null
  gpu_tests 585
elif [ "$STAGE" = bench ]; then
  [ -x $LB ] || log "no llama-bench: STAGE=prep builds it"
  bench_vs_llamacpp "$LB"
  # the chunk before this session and the opt-in attention, memra alone, beside the default
  for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    f=$(echo $m | tr : _)
    vs="MEMRA_PREFILL_CHUNK=128 default"; case $m in synth:*) ;; *) vs="$vs MEMRA_ATTN=fa" ;; esac
    for v in $vs; do
      ( [ $v = default ] || export "$v"; timeout 60 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK \
          --tag $v --out $R/bench-ab.jsonl > $R/bench-ab-$f-$v.txt 2>&1 )
      log "bench $m $v rc=$? $(el)"; grep -E "pp512|tg128" $R/bench-ab-$f-$v.txt | tail -2 | tee -a $R/log.txt
    done
    cp $R/bench-ab.jsonl $OUT/ 2>/dev/null
  done
elif [ "$STAGE" = evidence ]; then
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
elif [ "$STAGE" = chain ]; then
  # the scheduler's chained decode steps (MEMRA_SERVE_CHAIN), after the SmolLM2 parts
  # (.models/sm-a, sm-b) on a fresh machine: serve GPU tests, then memra alone, chain 0 / 8
  ( synth llama3-8b Q4_K_M .synthtok/smollm2-utf8-tokenizer.gguf ) > $R/synth.txt 2>&1 &
  SYN=$!
  MEMRA_SERVE_TEST_MODEL=smollm2-135m timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_serve_gpu.py \
    > $R/serve-gpu-tests.txt 2>&1; log "serve gpu tests rc=$? $(tail -1 $R/serve-gpu-tests.txt) $(el)"
  wait $SYN; log "synth $(tail -1 $R/synth.txt) $(el)"
  for ch in 0 8; do
    MEMRA_SERVE_CHAIN=$ch timeout 150 python3 -m memra bench serve synth:llama3-8b:Q4_K_M --device gpu \
      --synth-tokenizer .synthtok/smollm2-utf8-tokenizer.gguf -c 1,8,64 --prompt-tokens 100 --max-tokens 128 \
      --out $R/serve-chain.jsonl --tag MEMRA_SERVE_CHAIN=$ch > $R/serve-chain-$ch.txt 2>&1
    log "bench serve chain=$ch rc=$? $(el)"; grep -E "^memra " $R/serve-chain-$ch.txt | tee -a $R/log.txt
    cp $R/serve-chain.jsonl $OUT/ 2>/dev/null
  done
fi
tar czf $OUT/s9-$STAGE.tgz -C /tmp s9-$STAGE
