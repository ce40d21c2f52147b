#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 23; research/2026-12-03-session23). Run in session
# 24: STAGE k and STAGE p (p through h200_session24b.sh); STAGE e's probes ran in h200_session24b.sh STAGE
# r; STAGE s (the serve evidence) did not fit the device time and moved to h200_session25.sh STAGE s.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=<x> bash experiments/h200_session24.sh
# Here first: `bash ../shared/device/llamacpp.sh` (-> .llamacpp/). One lease: ship the models
# (experiments/ship_models.py's six calls, ~4 s each), then k, s, p, e; after k, its table, tile receipts
# and kernel-check receipt copied into this tree (a call runs on a fresh copy of the tree's tracked
# files). ~1,000 s with the cold start.
# STAGE k (carry .whl .synthtok .llamacpp; ~8 min): llama.cpp built in the background while the prompt
#   tile's campaign runs on the three models session 23 left out (the 8B Q4_0 and Q8_0, the 1B; session
#   23's 8B Q4_K_M shapes: 36-38 % faster at 128 rows off the built-in 2 x 4 tile), `memra tune dispatch
#   --resume` (the ten one-row choices session 23's freeze left to the rule), the freeze,
#   kernel-check --add-to and pp128 / pp512 of those models before (a copy) / after; then one `memra
#   bench --vs llama.cpp` run of every model (pp512 + tg128, the 8B and SmolLM2 at depth 4096): the
#   floors with session 23's tables (v8, MV_PREFETCH, the tile); the 8B's decode profile at 1 and 64 rows.
# STAGE p (~3 min): the decode matvec's and the attention's campaigns timed with PDL (memra tune run --pdl,
#   session 23: the harness timed every campaign with plain launches, the engine launches with PDL)
#   beside the plain receipts: whether the table's winners move (then --pdl campaigns and freeze --pdl).
# STAGE s (~2 min, in k's lease: llama-server built there): tests/test_serve_gpu.py, then `memra bench
#   serve --vs` llama-server at c = 1 / 8 / 32 / 64 (a ~100-token prompt is one 128-row tile chunk now).
# STAGE e (~3 min): experiments/attn_fixed/probe.py (the short-context attention's fixed cost: resources,
#   rope + append, the split's body, plain and PDL), experiments/persist/probe.py --tail (what a RMSNorm-shaped one-block op saves when its
#   producer's last block does it instead of its own PDL launch: the small models' next design, session
#   23 README "Next"), then ATT_EARLY 0 / 1 per launch at 1,024 and 4,096 keys
#   (tune/campaigns/h200-attn-early.toml): where SmolLM2's tg128 @ d4096 loses 0.8 % with v8.
set -u
source experiments/h200_common.sh
stage_begin s24
case "$STAGE" in
k)
  link_models "kernel-check's launch set and the real models' bench cells need them"
  serve_build_start
  cp tune/defaults/nvidia-h200.json $R/table-before.json
  tune_campaign h200-gemm-tile 240 -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0
  # the one-row dispatch choices session 23's MV_PREFETCH freeze left to the rule (their mv_q8 receipts
  # timed the replaced configurations): --resume times the jobs carrying the current ones
  dispatch_freeze 120 tile
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-gemm-tile-nvidia-h200.jsonl research/tune/h200-dispatch-nvidia-h200.jsonl $OUT/tune/
  cp tune/defaults/*.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=120 kernel_check
  for m in synth:llama3-8b:Q4_0 synth:llama-1b:Q4_0; do
    for tb in $R/table-before.json auto; do
      timeout 40 python3 -m memra bench $m -p 128,512 -n 0 -r 3 --tune-table $tb \
        --synth-tokenizer $TOK --out $OUT/bench-tile-table.jsonl > $R/bench.txt 2>&1
      log "$m $(basename $tb) rc=$? $(grep -E 'pp128|pp512' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-100 | tr '\n' ' ')"
    done
  done
  serve_build_wait
  bench_vs_llamacpp /root/llama.cpp/build/bin/llama-bench
  timeout 60 python3 -m memra profile synth:llama3-8b:Q4_K_M -np 64 -d 128 --synth-tokenizer $TOK \
    > $R/profile-8b-np64.txt 2>&1; log "profile 8B np64 rc=$? $(el)"; cp $R/profile-8b-np64.txt $OUT/ ;;
s)
  serve_evidence ;;
p)
  # the tune harness's timing as the engine launches (memra tune run --pdl): the decode matvec's and the
  # attention's campaigns timed with PDL beside session 23's plain receipts; do the winners move?
  TUNE_OUT=$OUT/h200-mv-prefetch-pdl-nvidia-h200.jsonl tune_campaign h200-mv-prefetch 200 --pdl \
    -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 \
    -m synth:smollm2-135m:Q8_0
  python3 -m memra research compare research/tune/h200-mv-prefetch-nvidia-h200.jsonl \
    $OUT/h200-mv-prefetch-pdl-nvidia-h200.jsonl > $R/compare-mv.txt 2>&1; tail -40 $R/compare-mv.txt | tee -a $R/log.txt
  TUNE_OUT=$OUT/h200-attn-early-pdl-nvidia-h200.jsonl tune_campaign h200-attn-early 120 --pdl \
    -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  python3 -m memra research summarize $OUT/h200-attn-early-pdl-nvidia-h200.jsonl --by shape_key,config.ATT_EARLY \
    2>&1 | tee -a $R/log.txt
  cp $R/compare-mv.txt $OUT/ ;;
e)
  # the short-context attention's fixed cost taken apart (experiments/attn_fixed)
  timeout 150 python3 experiments/attn_fixed/probe.py > $OUT/attn-fixed.jsonl 2> $R/attn-fixed.err
  log "attn_fixed rc=$? $(el)"; cat $OUT/attn-fixed.jsonl | tee -a $R/log.txt
  # a one-block RMSNorm-shaped op in its producer's tail against its own PDL launch (experiments/persist)
  timeout 120 python3 experiments/persist/probe.py --tail --bytes 0,524288 --blocks 132,264 --rows 576,4096 \
    > $OUT/persist-tail.jsonl 2> $R/persist-tail.err; log "persist --tail rc=$? $(el)"
  cat $OUT/persist-tail.jsonl | tee -a $R/log.txt
  TUNE_OUT=$OUT/h200-attn-early-nvidia-h200.jsonl tune_campaign h200-attn-early 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  python3 -m memra research summarize $OUT/h200-attn-early-nvidia-h200.jsonl --by shape_key,config.ATT_EARLY \
    2>&1 | tee -a $R/log.txt ;;
esac
tar czf $OUT/s24-$STAGE.tgz -C /tmp s24-$STAGE
