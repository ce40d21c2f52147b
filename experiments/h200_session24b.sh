#!/usr/bin/env bash
# Session 24's second lease (research/2026-12-03-session24). Its first call (h200_session24.sh STAGE k)
# brought back eight files of nine: the call returns at most 8 files from $OUT, and the prompt tile's
# campaign receipts were the ninth. Its dispatch receipts came back (committed); so:
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=<x> bash experiments/h200_session24b.sh
# STAGE r (models shipped first): the tile campaign on the 8B Q4_0 / Q8_0 and the 1B again, the freeze,
#   kernel-check --add-to; the 8B's prefill chunk of 512 rows profiled (Q4_K_M, Q4_0, Q8_0: where pp512's
#   time goes against issue 10's 1.2x); then the two probes of STAGE e (attn_fixed, persist --tail).
# STAGE p: h200_session24.sh's STAGE p (the matvec and attention campaigns timed with PDL).
# Everything but the receipts the tree needs goes into one tarball ($OUT holds at most 8 files).
set -u
source experiments/h200_common.sh
stage_begin s24b
case "$STAGE" in
r)
  link_models "kernel-check's launch set needs them"
  tune_campaign h200-gemm-tile 200 -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0
  mkdir -p $OUT/defaults; cp research/tune/h200-gemm-tile-nvidia-h200.jsonl $OUT/
  freeze_show tile; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
  for q in Q4_K_M Q4_0 Q8_0; do
    timeout 60 python3 -m memra profile synth:llama3-8b:$q --prefill -np 512 -d 0 --synth-tokenizer $TOK \
      > $R/profile-8b-$q-pp512.txt 2>&1; log "profile 8B $q pp512 rc=$? $(el)"; tail -1 $R/profile-8b-$q-pp512.txt | tee -a $R/log.txt
  done
  timeout 150 python3 experiments/attn_fixed/probe.py > $R/attn-fixed.jsonl 2> $R/attn-fixed.err
  log "attn_fixed rc=$? $(el)"; cat $R/attn-fixed.jsonl | tee -a $R/log.txt
  timeout 120 python3 experiments/persist/probe.py --tail --bytes 0,524288 --blocks 132,264 --rows 576,4096 \
    > $R/persist-tail.jsonl 2> $R/persist-tail.err; log "persist --tail rc=$? $(el)"
  cat $R/persist-tail.jsonl | tee -a $R/log.txt ;;
p)
  STAGE=p bash experiments/h200_session24.sh; cp /tmp/s24-p/log.txt $R/p-log.txt 2>/dev/null ;;
esac
tar czf $OUT/s24b-$STAGE.tgz -C /tmp s24b-$STAGE
# STAGE q (models shipped first; ~8 min): the batch-1 decode families timed with PDL over the six
#   models (tune/campaigns/h200-pdl.toml, 916 jobs), `memra tune freeze --pdl` (those receipts where a
#   kernel, shape and batch have them, the plain ones elsewhere) into tune/defaults, kernel-check
#   --add-to, then tg128 of every model (and the 8B and SmolLM2 at depth 4096) with the plain-timed
#   table and the PDL-timed one, arms alternating, twice while time allows. Run in session 24: the
#   campaign hit its 240 s limit at 868 jobs, the second pass did not fit, the PDL-timed table lost
#   on six of eight cells and was not adopted (research/2026-12-03-session24 §5).
if [ "$STAGE" = q ]; then
  link_models "the real models' shapes and bench cells need them"
  cp tune/defaults/nvidia-h200.json $R/table-plain.json
  tune_campaign h200-pdl 240 --pdl $MALL
  cp research/tune/h200-pdl-nvidia-h200.jsonl $OUT/
  python3 -m memra tune freeze --pdl --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze-pdl.txt 2>&1
  log "freeze --pdl rc=$? $(grep -E 'entries|left to the rule' $R/freeze-pdl.txt | cut -c1-300)"
  python3 -m memra tune show > $R/show-pdl.txt 2>&1; log "show: $(grep -i stale $R/show-pdl.txt | head -3)"
  mkdir -p $OUT/defaults; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
  for pass in 1 2; do
    [ $pass = 2 ] && [ $(( $(date +%s) - T0 )) -gt 400 ] && { log "pass 2 skipped $(el)"; break; }
    for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 \
             synth:llama3-8b:Q8_0 synth:llama3-8b:Q4_K_M@4096 smollm2-135m@4096; do
      d=0; case $m in *@4096) d=4096; m=${m%@4096} ;; esac
      tabs="$R/table-plain.json auto"; [ $pass = 2 ] && tabs="auto $R/table-plain.json"
      for tb in $tabs; do
        timeout 60 python3 -m memra bench $m -p 0 -n 128 -d $d -r 3 --tune-table $tb --synth-tokenizer $TOK \
          --out $R/bench-pdl-table.jsonl > $R/bench.txt 2>&1
        log "$m d$d $(basename $tb) rc=$? $(grep -E 'gate|tg128' $R/bench.txt | grep -E 'gate|memra' | tr -s ' ' | cut -c1-110 | tr '\n' ' ')"
      done
    done
    cp $R/bench-pdl-table.jsonl $OUT/
  done
  tar czf $OUT/s24b-$STAGE.tgz -C /tmp s24b-$STAGE
fi
