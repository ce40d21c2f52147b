#!/usr/bin/env bash
# The next session's first H200 call (prepared in session 27; research/2026-12-04-session27 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session28.sh
# Carry .whl and .synthtok (no real models needed).
# STAGE a (~7 min): the 8B's tg128 was Q8_0 1.49x / Q4_0 1.74x / Q4_K_M 1.85x llama.cpp in session 27 (issue 14's
#  floors 1.5x / 1.9x / 2.1x). experiments/pdl_8b/make_table.sh: the shipped table with the 8B's batch-1 matvec
#  entries from session 24's PDL-timed campaign (16 entries differ, mostly the mid-size matvecs; session 24's whole
#  PDL table: Q8_0 +0.4 %, Q4_K_M -0.8 %, Q4_0 -3.0 %, one pass; the 1B's matvec entries alone: +3.3 %, adopted in
#  session 25). tg128 of each 8B model with the tables alternating (shipped, candidate, candidate, shipped), then
#  64 greedy ids of the Q8_0 under each (the entries are bit-neutral: the same ids). A win of >= 1 % in both
#  pairs is frozen as the 1B's was (research/tune/h200-pdl-nvidia-h200.jsonl gains those receipts; freeze --pdl;
#  kernel-check --add-to; the GPU tests) and the model gets its --vs run.
# STAGE b (~7 min; the real models shipped first, carry .llamacpp too: ../shared/device/llamacpp.sh here):
#  llama.cpp's build, then `memra bench --vs llama.cpp` of SmolLM2 and Gemma-3 (the models v9 moved most: +2.4 /
#  +1.3 % on their synthetic shapes; issue 14's floor 3x, 2.37x / 2.15x in session 24) and SmolLM2 at depth
#  4096 (floor 2.5x, 1.73x).
set -u
source experiments/h200_common.sh
stage_begin s28
case "$STAGE" in
a)
  bash experiments/pdl_8b/make_table.sh $R/cand > $R/make-table.txt 2>&1; log "candidate table rc=$?"
  for q in Q8_0 Q4_0 Q4_K_M; do
    for tb in tune/defaults/nvidia-h200.json $R/cand/nvidia-h200.json $R/cand/nvidia-h200.json tune/defaults/nvidia-h200.json; do
      timeout 60 python3 -m memra bench synth:llama3-8b:$q -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $R/bench-pdl-8b.jsonl > $R/bench.txt 2>&1
      log "8B $q $(dirname $tb | xargs basename) rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
  done
  cp $R/bench-pdl-8b.jsonl $OUT/
  greedy_ids_arms MEMRA_TUNE_TABLE "tune/defaults/nvidia-h200.json $R/cand/nvidia-h200.json" "-m memra" llama3-8b Q8_0 ;;
b)
  link_models "the real models' benchmarks need them"
  timeout 330 bash .llamacpp/build.sh > $R/llamacpp-build.txt 2>&1
  log "llama.cpp build rc=$? $(el)"; tail -1 $R/llamacpp-build.txt | tee -a $R/log.txt
  for m in smollm2-135m gemma3-270m "smollm2-135m -d 4096"; do
    timeout 150 python3 -m memra bench $m -p 512 -n 128 --vs llama.cpp --llama-bench /root/llama.cpp/build/bin/llama-bench \
      --out $R/bench-vs.jsonl > $R/bench.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench.txt | tail -6 | tee -a $R/log.txt
  done
  cp $R/bench-vs.jsonl $OUT/ 2>/dev/null ;;
c)
  # MV_PRELOAD (kernels/matvec.cu: the lane's first n units loaded before the PDL wait; carry
  # experiments/mv_preload/build too). Arms per model: base (matvec.cu before MV_PRELOAD, shipped table), new
  # (this tree, shipped table), mid / all (experiments/mv_preload/tables.py), ABBA.
  # (as run: kernels/matvec.cu with experiments/mv_preload/preload.patch applied, and its bits.py, since
  # generalized as experiments/mv_bits.py)
  python3 experiments/mv_preload/tables.py $R/t > $R/tables.txt 2>&1; log "tables rc=$?"
  timeout 200 python3 experiments/mv_bits.py experiments/mv_preload/tables.py all > $R/bits.jsonl 2> $R/bits.err; log "bits rc=$? $(tail -1 $R/bits.err) $(el)"
  timeout 200 python3 -m memra kernel-check --only matvec > $R/kc-matvec.txt 2>&1
  log "kernel-check matvec rc=$? $(tail -1 $R/kc-matvec.txt) $(grep -c PRELOAD $R/kc-matvec.txt) PRELOAD lines $(el)"
  ship=tune/defaults/nvidia-h200.json
  for q in Q8_0 Q4_K_M Q4_0; do
    arms="new mid all all mid new"; [ $q = Q8_0 ] && arms="base $arms base"
    for arm in $arms; do
      case $arm in base) run="experiments/mv_preload/ab.py"; tb=$ship ;; new) run="-m memra"; tb=$ship ;;
        *) run="-m memra"; tb=$R/t/$arm/nvidia-h200.json ;; esac
      timeout 90 python3 $run bench synth:llama3-8b:$q -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $R/bench-preload-$arm.jsonl > $R/bench.txt 2>&1
      log "8B $q $arm rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
  done
  cat $R/bench-preload-*.jsonl > $OUT/bench-preload.jsonl
  greedy_ids_arms MEMRA_TUNE_TABLE "$ship $R/t/all/nvidia-h200.json" "-m memra" llama3-8b Q8_0
  greedy_ids_arms MEMRA_TUNE_TABLE "$ship $R/t/all/nvidia-h200.json" "-m memra" llama3-8b Q4_K_M ;;
d)
  # MV_EARLY 0 (as run at 6b53429, in kernels/matvec.cu; since then experiments/mv_early/make.py's copy: nothing issued before the PDL wait; session 28's STAGE c found more weights
  # before the wait slower, -3 %): the shipped table against mid / all (experiments/mv_early/tables.py).
  python3 experiments/mv_early/tables.py $R/t > $R/tables.txt 2>&1; log "tables rc=$?"
  timeout 120 python3 experiments/mv_bits.py experiments/mv_early/tables.py mid > $R/bits.jsonl 2> $R/bits.err
  log "bits rc=$? $(tail -1 $R/bits.err) $(el)"
  ship=tune/defaults/nvidia-h200.json
  for m in llama3-8b:Q8_0 llama3-8b:Q4_K_M llama3-8b:Q4_0 llama-1b:Q4_0; do
    arms="ship mid all all mid ship"; case $m in *Q4_0) arms="ship all mid ship" ;; esac
    for arm in $arms; do
      tb=$ship; [ $arm != ship ] && tb=$R/t/$arm/nvidia-h200.json
      timeout 90 python3 -m memra bench synth:$m -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $R/bench-early-$arm.jsonl > $R/bench.txt 2>&1
      log "$m $arm rc=$? $(grep -E 'tg128' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-110)"
    done
  done
  cat $R/bench-early-*.jsonl > $OUT/bench-early.jsonl
  greedy_ids_arms MEMRA_TUNE_TABLE "$ship $R/t/all/nvidia-h200.json" "-m memra" llama3-8b Q8_0 ;;
esac
tar czf $OUT/s28-$STAGE.tgz -C /tmp s28-$STAGE
