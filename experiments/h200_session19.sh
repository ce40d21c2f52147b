#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 18).
# STAGE d (session 19's second half; ship the models, carry .whl + .synthtok + .llamacpp): kernel-check and
#   the GPU tests with the prompt tile, llama.cpp built in the background; then STAGE c, ATTN unset.
# STAGE a (ship the models first: experiments/ship_models.py, .models/ship-0N/take.sh; carry .whl +
#   .synthtok, ~5 min): every GPU test with MEMRA_ATTN=hybrid (prompt rows on attn_fa, generated rows
#   on attn_decode; research/2026-12-03-session18 section 4), the two-arithmetic gate over the real
#   models' longer sequences included; then the default's GPU tests once more. If both pass, the
#   default can flip to hybrid (memra/gpu/runner.py's MEMRA_ATTN default, docs/FLAGS.md, bench's
#   ENGINE_PATHS) and a `memra bench --vs llama.cpp` run per model measures the floors.
# STAGE a carries .llamacpp too (llama.cpp built in the background for STAGE c).
# STAGE c (right after a, same lease; carry .whl + .synthtok): `memra bench --vs llama.cpp` per model,
#   ATTN=hybrid once the default has flipped (or to measure it as the opt-in).
# STAGE b (carry .whl + .synthtok; no models needed): MEMRA_FA_SPLIT 256 / 512 / 1024 / 2048 with hybrid,
#   pp512 at depth 0 and 4096 on the 8B and the 1B.
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session19.sh
set -u
source experiments/h200_common.sh
stage_begin s19
case "$STAGE" in
d)
  # the prompt tile (kernels/gemm_tile.cu for hybrid's prompt rows): kernel-check over the grown
  # launch set (its chain references on the CPU: ~1 min more), every GPU test; llama.cpp built
  # in the background for STAGE c
  link_models "kernel-check and the GPU tests need them"
  serve_build_start
  KC_LIMIT=400 kernel_check
  gpu_tests 560
  serve_build_wait ;;
a)
  link_models "the GPU tests need them"
  serve_build_start  # llama.cpp (llama-bench, llama-server) in the background, for STAGE c
  MEMRA_ATTN=hybrid timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests \
    > $R/gpu-tests-hybrid.txt 2>&1
  log "gpu tests (hybrid) rc=$? $(tail -1 $R/gpu-tests-hybrid.txt) $(el)"
  grep -E "^(FAILED|ERROR)" $R/gpu-tests-hybrid.txt | head -20 | tee -a $R/log.txt
  gpu_tests 560
  serve_build_wait ;;
b)
  # attn_fa's split size for prompt rows (MEMRA_ATTN=hybrid; MEMRA_FA_SPLIT, docs/FLAGS.md): pp512 at
  # depth 0 and 4096 per size (split partials written and merged against parallelism), ~4 min
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    for sp in 256 512 1024 2048 256; do
      MEMRA_ATTN=hybrid MEMRA_FA_SPLIT=$sp timeout 80 python3 -m memra bench $m -p 512 -n 0 -d 0,4096 -r 3 \
        --synth-tokenizer $TOK --out $R/bench-fa-split.jsonl > $R/bench.txt 2>&1
      log "bench $m split $sp rc=$? $(el)"; grep -E "gate|pp512" $R/bench.txt | cut -c1-170 | tee -a $R/log.txt
    done
  done
  cp $R/bench-fa-split.jsonl $OUT/
  # where a 512-row prompt chunk's time goes with hybrid (d0 for both, d4096 for the 1B)
  for spec in "synth:llama3-8b:Q4_K_M 0" "synth:llama-1b:Q4_0 0" "synth:llama-1b:Q4_0 4096"; do
    set -- $spec
    MEMRA_ATTN=hybrid timeout 90 python3 -m memra profile $1 --prefill -np 512 -d $2 --synth-tokenizer $TOK \
      > $R/profile-$(echo $1 | tr : _)-d$2.txt 2>&1
    log "profile $1 d$2 rc=$?"; cp $R/profile-*.txt $OUT/
  done ;;
c)
  # `memra bench --vs llama.cpp` of every benchmark model (pp512 + tg128, then the 8B and SmolLM2 at
  # depth 4096) in the same warm lease as STAGE a / d (their llama.cpp build); MEMRA_ATTN=$ATTN when
  # ATTN is set, else the engine's default (session 19's first STAGE c after the flip ran with
  # MEMRA_ATTN=decode because this line once defaulted to it: c2/bench-vs-decode.jsonl)
  LB=/root/llama.cpp/build/bin/llama-bench
  [ -x $LB ] || log "no llama-bench: STAGE=a builds it (same lease)"
  if [ -n "${ATTN:-}" ]; then export MEMRA_ATTN=$ATTN; else unset MEMRA_ATTN; fi
  bench_vs_llamacpp "$LB" ;;
esac
tar czf $OUT/s19-$STAGE.tgz -C /tmp s19-$STAGE
