#!/usr/bin/env bash
# STAGE a: the first H200 call (prepared in session 16), model-free, carry [".whl"], ~4 min:
#   experiments/tile_land/ab.sh    the tile GEMM landing candidate again, now with its built-in
#                                  configuration per row count (2 x 2 warps up to 64 rows): checks,
#                                  canary, the 8B shapes at 64 / 512 rows against gemm.cu
#   experiments/chain_mv/prof.sh   ncu of chain_mv nw8 and mv_q8 on Q4_K 4096 x 4096 at batch 1
#                                  (why the chain matvec runs at 0.8-0.9x: the order question of
#                                  experiments/tile_land/README.md waits on it)
#   experiments/attn_ring/ab.sh    (if it exists) the decode attention with K/V tiles staged by
#                                  cp.async, against attn_decode_rope bit for bit and timed
# Logs under /tmp/s17-$STAGE -> $OUT/s17-$STAGE.tgz; JSONL and ncu archives to $OUT (<= 8 files).
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session17.sh
set -u
source experiments/h200_common.sh
stage_begin s17
case "$STAGE" in
a)
  OUT=$R TILE_S=110 timeout 120 bash experiments/tile_land/ab.sh > $R/tile-land-ab.txt 2>&1
  log "tile_land rc=$? $(el)"; tail -32 $R/tile-land-ab.txt | tee -a $R/log.txt
  OUT=$R timeout 150 bash experiments/chain_mv/prof.sh > $R/chain-mv-prof.txt 2>&1
  log "chain_mv prof rc=$? $(el)"; cat $R/chain-mv-prof.txt | tee -a $R/log.txt
  if [ -f experiments/attn_ring/ab.sh ]; then
    OUT=$R CHECK_S=85 timeout 95 bash experiments/attn_ring/ab.sh > $R/attn-ring-ab.txt 2>&1
    log "attn_ring rc=$? $(el)"; tail -30 $R/attn-ring-ab.txt | tee -a $R/log.txt
  fi
  cp $R/*.jsonl $R/*.tgz $OUT/ 2>/dev/null ;;
b)  # the slot order (experiments/slot_order): what it costs decode (mv) and prefill (tile); GPU tests
  OUT=$R LIMIT_S=85 timeout 95 bash experiments/slot_order/mv/ab.sh > $R/slot-mv-ab.txt 2>&1
  log "slot mv rc=$? $(el)"; tail -40 $R/slot-mv-ab.txt | tee -a $R/log.txt
  OUT=$R SLOT_S=100 timeout 110 bash experiments/slot_order/tile/ab.sh > $R/slot-tile-ab.txt 2>&1
  log "slot tile rc=$? $(el)"; tail -40 $R/slot-tile-ab.txt | tee -a $R/log.txt
  gpu_tests 420
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
r1) # ATT_RING landed (kernels/attention.cu v7): kernel-check, the GPU tests, the 8B at depth 0 / 4096
    # with the ring and without (MEMRA_ATT_RING=0), arms alternating (models shipped first)
  kernel_check
  gpu_tests 380
  for d in 0 4096; do
    for ring in 2 0; do
      MEMRA_ATT_RING=$ring timeout 60 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 512 -n 128 -d $d -r 3 \
        --synth-tokenizer $TOK --out $R/ring-bench.jsonl > $R/bench-8b-d$d-ring$ring.txt 2>&1
      log "bench 8B d$d ring$ring rc=$? $(grep -E 'tg128|pp512' $R/bench-8b-d$d-ring$ring.txt | grep memra | tr -s ' ' | tr '\n' ' ') $(el)"
    done
  done
  cp $R/ring-bench.jsonl $OUT/ 2>/dev/null ;;
r2) # the campaign of the changed kernel (attn_decode), freeze, SmolLM2 at depth 0 / 4096 with and without
  tune_campaign h200 200 $MALL --kernels attn_decode
  freeze_show r2
  cp research/tune/h200-nvidia-h200.jsonl $OUT/; cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  for d in 0 4096; do
    for ring in 2 0; do
      MEMRA_ATT_RING=$ring timeout 40 python3 -m memra bench smollm2-135m -p 512 -n 128 -d $d -r 3 \
        --out $R/ring-bench.jsonl > $R/bench-smol-d$d-ring$ring.txt 2>&1
      log "bench smollm2 d$d ring$ring rc=$? $(grep -E 'tg128|pp512' $R/bench-smol-d$d-ring$ring.txt | grep memra | tr -s ' ' | tr '\n' ' ') $(el)"
    done
  done
  cp $R/ring-bench.jsonl $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s17-$STAGE.tgz -C /tmp s17-$STAGE
