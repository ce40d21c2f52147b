#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 19: the prompt tile landed, measured on the 8B
# Q4_K_M and 1B pp512 only; research/2026-12-03-session19 section 4).
# Ship the models first (experiments/ship_models.py; .models/ship-0N/take.sh, six calls), then:
# STAGE a (carry .whl + .synthtok + .llamacpp, ~10 min): llama.cpp (llama-bench, llama-server) and the
#   served 8B built in the background; `memra profile --prefill -np 512` of the 1B and the 8B (where a
#   prompt chunk goes with the tile), the 1B's pp512 with MEMRA_TILE_MIN 16 / 32 alternating (its
#   2,048-row weights on the tile or on gemm.cu), MEMRA_ATT_DEPTH 0 / 1 on the 8B and 1B (STAGE d's
#   question, while the build runs); then `memra bench --vs llama.cpp` of every model (the default
#   engine: hybrid + tile) once the build is done.
# STAGE s (right after a, same lease; carry .whl + .synthtok): the serve GPU tests and `memra bench
#   serve --vs` llama-server (issue 11's table) with the default engine.
# STAGE t (carry .whl + .synthtok; no models, ~6 min): the tile's campaign (tune/campaigns/h200-gemm-tile.toml,
#   360 jobs on the four synthetic models), freeze; the new table entries are launched by kernel-check, so
#   STAGE k follows (ship the models first; ~8 min): kernel-check, every GPU test. Between t and k copy
#   $OUT/defaults/*.json into tune/defaults/ and $OUT/tune/ into research/tune/ here (each call's tree is
#   this checkout's: a table frozen on the device and not copied back is gone) and commit them.
# STAGE l (after a, same lease): the 4k prompt's TTFT beside llama.cpp, the 32k prompt (experiments/h200_long.sh).
# STAGE d (models shipped; ~6 min): MEMRA_ATT_DEPTH 0 / 1 alternating with hybrid on all four models
#   (STAGE a runs the 8B and 1B half).
# Priority with 30 device minutes: a, then t + k (decide any flip measured in a before k: k's
# kernel-check must cover the launch set that lands), then l, d, s, b.
# STAGE b (carry .whl + .synthtok; no models, ~6 min): MEMRA_FA_SPLIT 256 / 1024 / 4096 x MEMRA_FA_WARPS 4 / 8
#   at pp512 depth 0 and 4096 on the 8B and the 1B (FA_WARPS 8's bits: kernel-check's prefill8 packing, STAGE k).
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session20.sh
set -u
source experiments/h200_common.sh
stage_begin s20
# att_depth_ab MODEL...: `memra bench -p 512 -n 128 -d 0,4096 -r 3` with MEMRA_ATT_DEPTH 0 / 1 / 0 / 1
att_depth_ab() {
  for m in "$@"; do
    for dep in 0 1 0 1; do
      MEMRA_ATT_DEPTH=$dep timeout 100 python3 -m memra bench $m -p 512 -n 128 -d 0,4096 -r 3 \
        --synth-tokenizer $TOK --out $R/bench-att-depth.jsonl > $R/bench.txt 2>&1
      log "$m ATT_DEPTH=$dep rc=$? $(el)"; grep -E "pp512|tg128" $R/bench.txt | cut -c1-150 | tee -a $R/log.txt
    done
  done
  cp $R/bench-att-depth.jsonl $OUT/
}
case "$STAGE" in
a)
  link_models "the real models' bench cells need them"
  serve_build_start
  for spec in "synth:llama-1b:Q4_0 0" "synth:llama3-8b:Q4_K_M 0" "synth:llama3-8b:Q4_K_M 4096"; do
    set -- $spec
    timeout 100 python3 -m memra profile $1 --prefill -np 512 -d $2 --synth-tokenizer $TOK \
      > $R/profile-$(echo $1 | tr : _)-d$2.txt 2>&1
    log "profile $1 d$2 rc=$? $(el)"; cp $R/profile-*.txt $OUT/
  done
  for mn in 16 32 16 32; do
    MEMRA_TILE_MIN=$mn timeout 60 python3 -m memra bench synth:llama-1b:Q4_0 -p 512 -n 0 -r 3 \
      --synth-tokenizer $TOK --out $R/bench-tile-min.jsonl > $R/bench.txt 2>&1
    log "1B MEMRA_TILE_MIN=$mn rc=$? $(el)"; grep -E "pp512" $R/bench.txt | cut -c1-150 | tee -a $R/log.txt
  done
  cp $R/bench-tile-min.jsonl $OUT/
  # while llama.cpp builds: MEMRA_ATT_DEPTH 0 / 1 alternating on the 8B and the 1B (STAGE d's question)
  att_depth_ab synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0
  serve_build_wait
  unset MEMRA_ATTN
  bench_vs_llamacpp /root/llama.cpp/build/bin/llama-bench ;;
s)
  serve_evidence ;;
d)
  # MEMRA_ATT_DEPTH=1 (decode attention laid out for long contexts) now that prompt rows run attn_fa:
  # session 12 measured tg128 @ d4096 +12.7 % (8B), +17.7 % (1B), +2 % (SmolLM2), -12.9 % (Gemma-3) but
  # pp512 @ d4096 -13 to -21 % from attn_decode's prompt rows, which hybrid no longer has. Arms alternating.
  link_models "the real models' cells need them"
  att_depth_ab smollm2-135m gemma3-270m synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 ;;
l)
  # issue 10's long prompts with the default engine (llama-bench from STAGE a's build, same lease):
  # the 4k prompt's TTFT beside llama.cpp's pp4096, the 32k prompt, the impossible context
  OUT=$R SPLITS=0 bash experiments/h200_long.sh > $R/long.txt 2>&1; log "long rc=$?"; cat $R/long/log.txt
  cp -r $R/long $OUT/ ;;
t)
  tune_campaign h200-gemm-tile 420 -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 \
    -m synth:llama-1b:Q4_0
  freeze_show tile
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-gemm-tile-nvidia-h200.jsonl $OUT/tune/ 2>/dev/null; cp tune/defaults/*.json $OUT/defaults/ ;;
f)
  # the defaults flipped after STAGE a / d / b (MEMRA_TILE_MIN 32, MEMRA_ATT_DEPTH 1, attn_fa's prefill
  # split 4096 and 8 warps with hybrid), kernel-check and the GPU tests side by side (bits only: neither
  # times anything). As run in session 20 neither finished in 480 s (kernel-check alone takes ~230 s,
  # the GPU tests ~300 s): experiments/h200_session21.sh runs them one after the other
  link_models "kernel-check and the GPU tests need them"
  # the dispatch's 512-row bucket (the table had none: a 512-row prompt step took the 128-row
  # entry's path, e.g. mvt for the 8B's Q6_K attn_v, 125 µs against gemm.cu's 63.7 at 512 rows):
  # the real models' shapes and the 8B Q4_K_M's QKV (its other weights run on the tile), then freeze
  timeout 100 python3 -m memra tune dispatch -m smollm2-135m -m gemma3-270m --rows 512 --resume \
    --out research/tune/h200-dispatch-nvidia-h200.jsonl > $R/tune-dispatch.txt 2>&1
  log "dispatch 512 (real models) rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  timeout 60 python3 -m memra tune dispatch -m synth:llama3-8b:Q4_K_M --ops qkv --rows 512 --resume \
    --out research/tune/h200-dispatch-nvidia-h200.jsonl >> $R/tune-dispatch.txt 2>&1
  log "dispatch 512 (8B qkv) rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  freeze_show d512
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/tune/; cp tune/defaults/*.json $OUT/defaults/
  cp $R/freeze-d512.txt $R/show-d512.txt $R/tune-dispatch.txt $OUT/ 2>/dev/null
  ( KC_LIMIT=${KC_LIMIT:-420} kernel_check ) &
  KC=$!
  gpu_tests ${GT_END:-430}
  wait $KC
  # what is left of the call: the defaults' pp512 / tg128 at depths 0 and 4096 (memra alone)
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    [ $(( $(date +%s) - T0 )) -lt ${BENCH_BEFORE:-440} ] || break
    timeout 40 python3 -m memra bench $m -p 512 -n 128 -d 0,4096 -r 3 --synth-tokenizer $TOK \
      --out $R/bench-defaults.jsonl > $R/bench.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "pp512|tg128" $R/bench.txt | cut -c1-150 | tee -a $R/log.txt
  done
  cp $R/bench-defaults.jsonl $OUT/ 2>/dev/null ;;
v)
  # after STAGE f in the same lease: its llama.cpp build, then `memra bench --vs llama.cpp` of every model
  link_models "the real models' bench cells need them"
  for i in $(seq 40); do [ -x /root/llama.cpp/build/bin/llama-bench ] && break; sleep 5; done
  bench_vs_llamacpp /root/llama.cpp/build/bin/llama-bench ;;
k)
  link_models "kernel-check and the GPU tests need them"
  KC_LIMIT=420 kernel_check
  gpu_tests 580 ;;
b)
  # attn_fa's prefill packing: split size (part of the prompt rows' bits) x warps a block (bit-neutral)
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
    for cfg in "256 4" "1024 4" "2048 4" "4096 4" "1024 8" "2048 8" "4096 8" "256 8" "256 4"; do
      set -- $cfg
      MEMRA_FA_SPLIT=$1 MEMRA_FA_WARPS=$2 timeout 60 python3 -m memra bench $m -p 512 -n 0 -d 0,4096 -r 3 \
        --synth-tokenizer $TOK --out $R/bench-fa-split.jsonl > $R/bench.txt 2>&1
      log "bench $m split $1 warps $2 rc=$? $(el)"; grep -E "gate|pp512" $R/bench.txt | cut -c1-170 | tee -a $R/log.txt
    done
  done
  cp $R/bench-fa-split.jsonl $OUT/ ;;
esac
tar czf $OUT/s20-$STAGE.tgz -C /tmp s20-$STAGE
