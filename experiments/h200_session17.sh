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
esac
tar czf $OUT/s17-$STAGE.tgz -C /tmp s17-$STAGE
