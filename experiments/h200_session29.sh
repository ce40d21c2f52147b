#!/usr/bin/env bash
# The next session's first H200 call (prepared in session 28; research/2026-12-04-session28 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session29.sh
# Ship the real models first (research/ moved away, the six .models/ship-0N calls), carry .whl and .synthtok.
# STAGE a (~6 min): MV_EARLY 0 (experiments/mv_early/make.py's build copy of kernels/matvec.cu; every arm runs
#  through experiments/mv_early/ab.py, the shipped table being the control) on the K-quant entries outside the
#  4096-wide mid-size matvecs (experiments/mv_early/tables.py kbig: gate+up, ffn_down, the Q6_K heads, Gemma-3's
#  Q4_K / Q6_K matvecs): session 28's 8B Q4_K_M gained +0.7 % with every entry at 0 and lost 1.3 % with the
#  mid-size ones alone, so kbig is predicted ~+2 % there; the 1B (its Q6_K head only) and Gemma-3 (real file)
#  beside it; u2 (one entry's unroll, below) on the Q4_K_M too. tg128, tables alternating; the kbig shapes' bits
#  and 64 greedy ids of the Q4_K_M compared. A win of >= 1 % in every pair: MV_EARLY into kernels/matvec.cu
#  (make.py's edit; default 1 keeps the SASS) and a rule for those shapes in memra/gpu/ops/matvec.py (an isolated
#  campaign cannot see what a launch's early loads cost its predecessor: the A/B's receipts are its basis), then
#  kernel-check --add-to and the GPU tests.
# STAGE b (~6 min, no models): experiments/engine_tune on the 8B Q4_K_M's and Q8_0's mid-size matvec entries (the
#  2 runner-up configurations of each shape timed alone, each in the engine's tg128 against the shipped table).
#  A candidate >= 1 % faster in both passes: its bench receipts into research/, `tune.py choice OUT NAME
#  research/tune/engine-choices-nvidia-h200.jsonl BENCH` (an engine-choice record), freeze --pdl (which lays it
#  over the entry), kernel-check --add-to, then the model's --vs run.
# STAGE c / d (a winner's landing, once its table is re-frozen here and committed): c = kernel-check --add-to and
#  the GPU tests (models shipped; ~7 min), d = llama.cpp's build and `--vs llama.cpp` of the models it touches
#  (carry .llamacpp; MODELS overrides the three 8B files and the 8B Q4_K_M at depth 4096).
set -u
source experiments/h200_common.sh
stage_begin s29
case "$STAGE" in
a)
  python3 experiments/mv_early/tables.py $R/t > $R/tables.txt 2>&1; log "tables rc=$?"
  timeout 150 python3 experiments/mv_bits.py experiments/mv_early/tables.py kbig experiments/mv_early/make.py \
    > $R/bits.jsonl 2> $R/bits.err; log "bits rc=$? $(tail -1 $R/bits.err) $(el)"
  # u2: the uniform 6,144-row Q4_K QKV at MV_UNROLL 2 (the table's 1: 6.98 against 7.70 µs timed alone, yet in
  # session 23's profile 6.94 µs against 4.95 for the 5,120-row Q+K at 2, 20 % fewer bytes)
  python3 experiments/mv_tables.py $R/t u2 'matvec cols=4096,rows=6144,type=Q4_K' MV_UNROLL=2 >> $R/tables.txt 2>&1
  ship=tune/defaults/nvidia-h200.json
  for m in synth:llama3-8b:Q4_K_M gemma3-270m synth:llama-1b:Q4_0; do
    arms="ship kbig kbig ship"; [ $m = synth:llama3-8b:Q4_K_M ] && arms="ship kbig u2 u2 kbig ship"
    for arm in $arms; do
      tb=$ship; [ $arm != ship ] && tb=$R/t/$arm/nvidia-h200.json
      timeout 90 python3 experiments/mv_early/ab.py bench $m -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $R/bench-early-$arm.jsonl > $R/bench.txt 2>&1
      log "$m $arm rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
  done
  cat $R/bench-early-*.jsonl > $OUT/bench-early-kbig.jsonl
  greedy_ids_arms MEMRA_TUNE_TABLE "$ship $R/t/kbig/nvidia-h200.json" experiments/mv_early/ab.py llama3-8b Q4_K_M ;;
b)
  # experiments/engine_tune: the 8B's mid-size matvec entries chosen by tg128 (no models needed). For each shape
  # the 2 fastest other configurations its campaign timed alone, one candidate table each (the shipped table with
  # that entry replaced), runs in the order shipped, c0.., shipped, ..c0 (bit-neutral: greedy ids of the best).
  et=experiments/engine_tune/tune.py ship=tune/defaults/nvidia-h200.json
  python3 $et tables $R/et -k 2 'matvec cols=4096,rows=4096,type=Q4_K' 'matvec cols=4096,rows=5120,type=Q4_K' \
    'matvec cols=4096,rows=6144,type=Q4_K' 'matvec cols=4096,rows=1024,type=Q6_K' > $R/et-tables.txt 2>&1
  python3 $et tables $R/et8 -k 2 'matvec cols=4096,rows=4096,type=Q8_0' 'matvec cols=4096,rows=6144,type=Q8_0' \
    >> $R/et-tables.txt 2>&1; log "tables rc=$?"
  for m in Q4_K_M Q8_0; do
    d=$R/et; [ $m = Q8_0 ] && d=$R/et8
    cands=$(ls -d $d/c* | sort -V | xargs -n1 basename)
    for arm in ship $cands ship $(echo $cands | tr ' ' '\n' | tac); do
      tb=$ship; [ $arm != ship ] && tb=$d/$arm/nvidia-h200.json
      timeout 60 python3 -m memra bench synth:llama3-8b:$m -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $R/bench-et.jsonl > $R/bench.txt 2>&1
      log "8B $m $arm rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
    python3 $et report $d $R/bench-et.jsonl | grep "$m" | tee -a $R/log.txt
  done
  cp $R/bench-et.jsonl $R/et-tables.txt $OUT/ ;;
c)
  # landing, after a winner's table is frozen here (CPU) and committed: the launch cases the committed kernel-check
  # receipt lacks (models shipped), then the GPU tests
  KC_ADD=research/kernel-check/nvidia-h200.json kernel_check
  gpu_tests 560 ;;
d)
  # landing: llama.cpp built in the call (carry .llamacpp), then `--vs llama.cpp` of the models the new entries
  # touch (MODELS: a space-separated list of models, no arguments; default the three 8B files and the 8B Q4_K_M
  # at depth 4096)
  if [ -n "${MODELS:-}" ]; then llamacpp_vs $MODELS
  else llamacpp_vs synth:llama3-8b:Q4_K_M synth:llama3-8b:Q8_0 synth:llama3-8b:Q4_0 "synth:llama3-8b:Q4_K_M -d 4096"; fi ;;
esac
tar czf $OUT/s29-$STAGE.tgz -C /tmp s29-$STAGE
