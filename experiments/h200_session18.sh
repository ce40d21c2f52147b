#!/usr/bin/env bash
# STAGE a: the next session's first H200 call (prepared in session 17), carry [".whl", ".synthtok"], ~2.5 min:
#   experiments/ring_short/ab.sh   the ring's short-context loss (research/2026-12-02-session17 section 8):
#                                  registers vs ring at shared-memory carveouts 60 / 90 %, with and without
#                                  PDL, on the synthetic 8B's whole decode step and its one-layer chain
# STAGE b: matvec.cu variant 6 (MV_L2PF) campaign on the synthetic models, freeze, tg128 table A/B (~7 min)
# Logs under /tmp/s18-$STAGE -> $OUT/s18-$STAGE.tgz; the JSONL to $OUT.
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session18.sh
set -u
source experiments/h200_common.sh
stage_begin s18
case "$STAGE" in
a)
  OUT=$R LIMIT_S=110 timeout 120 bash experiments/ring_short/ab.sh > $R/ring-short-ab.txt 2>&1
  log "ring_short rc=$? $(el)"; tail -70 $R/ring-short-ab.txt | tee -a $R/log.txt
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
b)
  # matvec.cu variant 6 (MV_L2PF): the h200 campaign's matvec jobs on the synthetic models (the
  # new axis beside the old grid), a summary of the best MV_L2PF 0 against the best overall per
  # shape, a freeze, and tg128 with the new table against the one before (same machine, alternating)
  cp tune/defaults/nvidia-h200.json $R/table-before.json
  SYN="-m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
  tune_campaign h200 ${LIMIT_S:-330} -k matvec,matvec_glu $SYN
  python3 experiments/mv_l2pf/summary.py research/tune/h200-nvidia-h200.jsonl | tee $R/l2pf-summary.txt | tee -a $R/log.txt
  freeze_show b
  cp tune/defaults/nvidia-h200.json $R/table-after.json
  for mt in synth:llama3-8b:Q4_K_M:after synth:llama3-8b:Q4_K_M:before synth:llama-1b:Q4_0:after \
            synth:llama-1b:Q4_0:before synth:llama3-8b:Q4_K_M:after synth:llama3-8b:Q4_K_M:before; do
    m=${mt%:*}; t=${mt##*:}; {
      timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
        --tune-table $R/table-$t.json --out $R/bench-l2pf.jsonl > $R/bench-$t.txt 2>&1
      log "bench $m $t rc=$? $(grep -E 'tg128' $R/bench-$t.txt | tail -1) $(el)"
    }
  done
  cp research/tune/h200-nvidia-h200.jsonl $R/bench-l2pf.jsonl $R/table-after.json $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s18-$STAGE.tgz -C /tmp s18-$STAGE
