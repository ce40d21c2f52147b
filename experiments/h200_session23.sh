#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 22; research/2026-12-03-session22 §7-§9).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=<x> bash experiments/h200_session23.sh
# Order for one 30-minute budget (~1,300 s with a cold start): n, e, c (no models), then ship the
# models (experiments/ship_models.py's six calls) and m, then experiments/h200_session21.sh STAGE t in the same lease.
# STAGE n (carry .whl + .synthtok; ~4 min, no shipped models): ncu with per-instruction stall samples of
#   (1) attn_decode_rope in a decode step at depth 0 and 64, the 8B and SmolLM2's shape: 4.7-5.7 µs at ONE
#   key against 1.7 for a RMSNorm launch (§9) — which of the two dependent global round trips, the
#   ~10 barriers, the one-warp softmax or the q8 twin holds it; and (2) gemm.cu's 64-row gate+up
#   (gemm_glu, 154 µs a layer at 3-5 % of the int8 peak and 7-12 % of the bandwidth: c = 64's TPOT, §7).
# STAGE c (carry .whl; ~1 min): experiments/chain_mv's v2 (never run on a device): can the decode matvec
#   produce the tile's chain order at mv_q8's speed (issue 10 item 3's one reduction order)?
# STAGE e (carry .whl + .synthtok; ~1.5 min): experiments/attn_early (attention.cu v8, ATT_EARLY: the ring
#   prologue before the PDL wait) A/B at 1-512 keys, patch applied in the device's copy only.
# STAGE m (carry .whl + .synthtok; ~6 min; models shipped for the --add-to): the decode matvec's
#   MV_PREFETCH beside the table's axes (tune/campaigns/h200-mv-prefetch.toml, 340 jobs; the 8B's Q6_K
#   down runs at 52 % of the bandwidth, §7), the freeze, kernel-check --add-to for the new entries, then
#   tg128 of the 8B and the 1B with the old table (a copy) and the new one alternating.
# STAGE t (carry .whl + .synthtok; ~7 min; models shipped for the --add-to): the tile campaign (360 jobs,
#   never run), the freeze, and kernel-check --add-to for the new table entries: experiments/h200_session21.sh
#   STAGE t as written there.
set -u
source experiments/h200_common.sh
stage_begin s23
case "$STAGE" in
n)
  OUT=$R KIND=decode TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/attn_decode_rope/0 synth:llama3-8b:Q4_K_M/attn_decode_rope/64 \
    synth:smollm2-135m:Q8_0/attn_decode_rope/0 synth:smollm2-135m:Q8_0/attn_decode_rope/64" \
    timeout 400 bash experiments/h200_ncu.sh > $R/ncu-attn.txt 2>&1
  log "ncu attention rc=$? $(el)"; mv $R/ncu.tgz $OUT/ncu-attn.tgz 2>/dev/null
  OUT=$R KIND=decode ROWS=64 TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/gemm_glu/128" \
    timeout 150 bash experiments/h200_ncu.sh > $R/ncu-gemm64.txt 2>&1
  log "ncu gemm_glu 64 rows rc=$? $(el)"; mv $R/ncu.tgz $OUT/ncu-gemm64.tgz 2>/dev/null ;;
e)
  git apply experiments/attn_early/early.patch && log "early.patch applied" || { log "early.patch does not apply"; exit 1; }
  TUNE_OUT=$OUT/h200-attn-early-nvidia-h200.jsonl tune_campaign h200-attn-early 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  python3 -m memra research summarize $OUT/h200-attn-early-nvidia-h200.jsonl --by shape_key,config.ATT_EARLY \
    2>&1 | tee -a $R/log.txt
  git apply -R experiments/attn_early/early.patch; log "early.patch reverted" ;;
m)
  cp tune/defaults/nvidia-h200.json $R/table-before.json
  tune_campaign h200-mv-prefetch 240 -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama-1b:Q4_0 \
    -m synth:smollm2-135m:Q8_0
  freeze_show mv
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-mv-prefetch-nvidia-h200.jsonl $OUT/tune/ 2>/dev/null; cp tune/defaults/*.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=120 kernel_check
  for tb in $R/table-before.json auto $R/table-before.json auto; do
    for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
      timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $OUT/bench-mv-prefetch.jsonl > $R/bench.txt 2>&1
      log "$m table $(basename $tb) rc=$? $(grep tg128 $R/bench.txt | tail -1)"
    done
  done ;;
c)
  OUT=$R bash experiments/chain_mv/ab.sh > $R/chain-mv.txt 2>&1; log "chain_mv rc=$? $(el)"
  cp $R/chain-mv.jsonl $R/chain-mv.log $OUT/ 2>/dev/null; tail -30 $R/chain-mv.txt | tee -a $R/log.txt ;;
esac
tar czf $OUT/s23-$STAGE.tgz -C /tmp s23-$STAGE
