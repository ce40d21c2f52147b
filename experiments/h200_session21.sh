#!/usr/bin/env bash
# Session 21 ran k, v, x, g, h (research/2026-12-03-session21). Stages v and h built attn_fa v7 / v8 from
# session 20's experiments/attn_fa_v7/attn_fa.patch (`git show 34339ce:experiments/attn_fa_v7/attn_fa.patch`),
# since replaced by landing.patch (v8 only): rerunning them now times v8 in both arms.
# The next session's H200 calls (prepared in session 20; research/2026-12-03-session20 section 7).
# Before any call: land experiments/s21/defaults.patch on this checkout as its README says (git apply,
# docs/FLAGS.md's default column), run the CPU tests, ship the models (experiments/ship_models.py), then:
# STAGE k (carry .whl + .synthtok; ~6 min): the launch cases the committed kernel-check receipt lacks
#   (memra kernel-check --add-to: 40 attn_fa cases with the patch; the kernel sources unchanged), then
#   every GPU test, one after the other (session 20 ran them side by side: neither finished). Copy
#   $OUT/nvidia-h200.json to research/kernel-check/ and commit it with the patch's files.
# STAGE v (carry .whl + .synthtok + .llamacpp, same lease; ~8 min): llama.cpp built in the background;
#   meanwhile ncu of attn_fa's prefill packing (512 rows of the 8B at depth 4096 and 0, split 4096, 8
#   warps: where its ~310 µs a layer at depth 4096 go, against ~144 µs for llama.cpp's extra), ncu of
#   the tile's gate+up in the engine (experiments/h200_ncu.sh KIND=engine), and
#   fa_check's timing of the split x warps grid at 512 rows and of attn_fa v7 against the stock kernel
#   (experiments/attn_fa_v7: bits and times); then `memra bench --vs llama.cpp` of
#   every model with the new defaults (the floors' receipts).
# STAGE t (carry .whl + .synthtok; ~7 min): the tile campaign (360 jobs), freeze, then kernel-check
#   --add-to for the new table entries (the sources unchanged: only the new cases run).
# STAGE x (carry .whl + .synthtok; ~3 min): MEMRA_ATT_SPLITS 33 / 66 / 132 at depth 4096 with the patch's
#   ATT_DEPTH (the 8B's tg128 @ d4096 is 16.9 % below depth 0; issue 14's floor is 15 %).
# STAGE l / s: experiments/h200_session20.sh's (long prompts; serve evidence against llama-server).
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=k bash experiments/h200_session21.sh
set -u
source experiments/h200_common.sh
stage_begin s21
case "$STAGE" in
k)
  link_models "kernel-check and the GPU tests need them"
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-200} kernel_check
  gpu_tests 570 ;;
v)
  link_models "the real models' bench cells need them"
  serve_build_start
  OUT=$R KIND=fa ROWS=512 CASES="llama3-8b:4096:4096:8 llama3-8b:0:4096:8 llama3-8b:4096:256:4" \
    bash experiments/h200_ncu.sh > $R/ncu.txt 2>&1
  log "ncu attn_fa rc=$? $(el)"; cp $R/ncu.tgz $OUT/ncu-fa.tgz 2>/dev/null
  # the prompt tile's gate+up in the engine (its 165 int8 TOPS: 42.8 % of the 8B's chunk)
  OUT=$R KIND=engine ROWS=512 TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/gemm_tile_glu/0" \
    bash experiments/h200_ncu.sh > $R/ncu-tile.txt 2>&1
  log "ncu gemm_tile_glu rc=$? $(el)"; cp $R/ncu.tgz $OUT/ncu-tile.tgz 2>/dev/null
  for cfg in "256 4" "4096 4" "4096 8" "2048 8"; do
    set -- $cfg
    OUT=$R timeout 60 python3 experiments/attn_mma/fa_check.py --no-checks --shapes llama3-8b,llama-1b,smollm2 \
      --modes prefill:0,prefill:4096 --rows 512 --split $1 --warps $2 >> $R/fa-time.txt 2>&1
    log "fa_check split $1 warps $2 rc=$? $(el)"
  done
  # attn_fa v7 (experiments/attn_fa_v7: the prefill packing's instructions a tile halved): bits against the
  # stock kernel, times alternating
  # and v8 (the same file with -DFA_V8=1: v7 + one barrier a tile + Q in registers)
  bash experiments/attn_fa_v7/make.sh $R/attn_fa_v7.cu
  for v in 0 1; do
    OUT=$R timeout 120 python3 experiments/attn_mma/fa_check.py --src $R/attn_fa_v7.cu \
      --define FA_V8=$v --shapes llama3-8b,llama-1b,smollm2 --modes prefill:0,prefill:4096 --rows 512 \
      --split 4096 --warps 8 >> $R/fa-v7.txt 2>&1
    log "fa_check FA_V8=$v rc=$? $(tail -1 $R/fa-v7.txt) $(el)"
    OUT=$R timeout 60 python3 experiments/attn_mma/fa_check.py --src $R/attn_fa_v7.cu \
      --define FA_V8=$v --shapes gemma3-global,gemma3-swa --modes prefill:0,prefill:4096 --rows 512 \
      --split 4096 --warps 4 >> $R/fa-v7.txt 2>&1
    log "fa_check FA_V8=$v gemma rc=$? $(tail -1 $R/fa-v7.txt) $(el)"
  done
  cp $R/fa-check.jsonl $OUT/ 2>/dev/null; grep -h fa-time $R/fa-time.txt $R/fa-v7.txt | cut -c1-230 | tee -a $R/log.txt
  serve_build_wait
  bench_vs_llamacpp /root/llama.cpp/build/bin/llama-bench ;;
g)
  # the prompt tile's loader (kernels/gemm_tile.cu GT_LD, default 1): A/B at 512 rows (28 jobs, each
  # checked against the chain's bits), then the whole kernel-check of the changed sources
  TUNE_OUT=$OUT/h200-gemm-tile-ld-nvidia-h200.jsonl tune_campaign h200-gemm-tile-ld 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0
  grep -E "GT_LD|µs" $R/tune-h200-gemm-tile-ld.txt | tail -30 | cut -c1-200 | tee -a $R/log.txt
  KC_LIMIT=300 kernel_check ;;
h)
  # the GPU tests of the engine, runner, serve and tune (the kernel-check families ran in stage g),
  # then attn_fa v8's times (experiments/attn_fa_v7 with -DFA_V8=1; its bits checked in stage v)
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests/test_gpu_engine.py \
    tests/test_gpu_runner.py tests/test_serve_gpu.py tests/test_tune_gpu.py tests/test_structured_gpu.py > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
  bash experiments/attn_fa_v7/make.sh $R/attn_fa_v7.cu
  for cfg in "1 8" "0 4" "1 4"; do
    set -- $cfg
    OUT=$R timeout 45 python3 experiments/attn_mma/fa_check.py --no-checks --src $R/attn_fa_v7.cu --define FA_V8=$1 \
      --shapes llama3-8b,smollm2,gemma3-global --modes prefill:0,prefill:4096 --rows 512 --split 4096 --warps $2 \
      >> $R/fa-v8.txt 2>&1
    log "fa_check FA_V8=$1 warps $2 rc=$? $(el)"
  done
  cp $R/fa-check.jsonl $OUT/ 2>/dev/null; grep -h fa-time $R/fa-v8.txt | cut -c1-260 | tee -a $R/log.txt ;;
x)
  # issue 14's depth cell with MEMRA_ATT_DEPTH on (the patch): the decode split count at depth 4096
  # (the default 33 on the 8B and 1B: 2 x 132 SMs / 8 KV heads), arms alternating; part of the decode
  # rows' bits (kernel-check covers the default only)
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    for sp in 33 66 132 33 66 132; do
      MEMRA_ATT_SPLITS=$sp timeout 60 python3 -m memra bench $m -p 0 -n 128 -d 0,4096 -r 3 --synth-tokenizer $TOK \
        --out $R/bench-att-splits.jsonl > $R/bench.txt 2>&1
      log "$m ATT_SPLITS=$sp rc=$? $(el)"; grep -E "tg128" $R/bench.txt | cut -c1-150 | tee -a $R/log.txt
    done
  done
  cp $R/bench-att-splits.jsonl $OUT/ ;;
t)
  tune_campaign h200-gemm-tile 400 -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 \
    -m synth:llama-1b:Q4_0
  freeze_show tile
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-gemm-tile-nvidia-h200.jsonl $OUT/tune/ 2>/dev/null; cp tune/defaults/*.json $OUT/defaults/
  link_models "kernel-check's launch set covers the real models"
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check ;;
esac
tar czf $OUT/s21-$STAGE.tgz -C /tmp s21-$STAGE
