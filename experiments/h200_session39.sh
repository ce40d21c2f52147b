#!/usr/bin/env bash
# The next session's device calls (prepared in session 38, research/2026-12-05-session38).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=l bash experiments/h200_session39.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; ship the real models first (six calls,
# experiments/ship_models.py's .models/ship-0N: the kernel-check launch set reads SmolLM2 and Gemma-3, STAGE n and d
# run SmolLM2); STAGE d carries .llamacpp. Name the card of every receipt; compare arms only inside one call.
# STAGE l (an H200 only, ~8-10 min): as h200_session38.sh's l (experiments/switch129 landed first: git apply its
#  landing.patch, re-freeze with --out-dir tune/defaults, commit; then kernel-check --add-to and the switch's A/B).
# STAGE n (~9 min, any card): where SmolLM2's decode attention at depth 4,096 goes — the shape whose floor (tg128 @
#  d4096 2.5x, session 30 1.84x) attention alone could reach: 10.6 µs a layer (48 % of the step) for 3.1 MB of K/V.
#  (1) experiments/attn_tail/probe.py: the engine's launch at depth cut after each link (loop, partial, counter, the
#  merge's weights), and bit-neutral candidates (mlo, mj32, fence1, ring3, best) checked and timed, at 128-16,384
#  keys, also at a 16-split plan; (2) the engine A/B of `best` and `ring3` against kernels/ (attn_tail/ab.py),
#  tg128 @ d4096 SmolLM2, arms alternating; (3) experiments/attn_cluster/probe.py: the split merge through a
#  cluster's distributed shared memory (no partial round trip, fence or counter; at most 16 splits), bit for bit
#  against the global merge at 16 / 8 splits, timed beside the engine's layout; then, if it was exact, the engine
#  at MEMRA_ATT_SPLITS=16, global merge against cluster (attn_cluster/ab.py), arms alternating.
# STAGE m (~6 min, any card): (1) tune/campaigns/h200-attn-depth.toml (the plan's split count x heads a block at
#  1k / 4k / 16k keys, attention alone, an A/B campaign: receipts in $OUT only); (2) tg128 @ d4096 SmolLM2 at
#  MEMRA_ATT_SPLITS 88 (the plan's) / 16 / 8 / 24 (the bits change with the count, the decode rows' only: the gates
#  say MATCH or not); (3) ncu of the engine's attn_decode_rope at depth 4,096, SmolLM2 and the 8B
#  (experiments/h200_ncu.sh KIND=decode: stall reasons a SASS line). A count that wins lands as the attn_decode
#  entry's `splits` (an engine-choice record; kernel-check --add-to on an H200).
# STAGE g (~4 min, an H200 preferably): MEMRA_GRAPH_STEPS 1 against 16 as session 38 (H100: 1B +0.8 %, SmolLM2
#  shape +0.6 %, 8B +0.1 %), then the 16-step graph's capture time against the one-step graph's
#  (experiments/graph_steps_capture.py: what `memra run` would pay at each new split count).
# STAGE d (~9 min, carry .llamacpp): `--vs llama.cpp`, MODELS as h200_common.sh's depth_vs (the floors at HEAD).
# STAGE t (~9 min): the launch set precompiled, then the GPU tests whole (session 38, H100: 43 passed in 323 s once
#  compiled).
# Order within the 30 device minutes (ship ~3): on an H200 l, n, m, then d; on an H100 n, m, g, t (l must not run).
set -u
source experiments/h200_common.sh
stage_begin s39
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
# splits_ab JSONL LIMIT DEPTH "COUNTS" REPS MODEL...: tg128 at DEPTH of each model at each MEMRA_ATT_SPLITS value in
# COUNTS (plan: unset) in turn while less than LIMIT seconds have passed, receipts in $R/JSONL (copied to $OUT)
splits_ab() {
  local out=$1 lim=$2 d=$3 counts=$4 reps=$5 a sp
  shift 5
  for a in "$@"; do
    for sp in $counts; do
      [ $(( $(date +%s) - T0 )) -lt $lim ] || break
      [ $sp = plan ] && sp=
      arm_run "$a -d $d splits=${sp:-plan}" $out env MEMRA_ATT_SPLITS=$sp python3 -m memra bench $a -d $d -p 0 \
        -n 128 -r $reps
    done
  done
  cp $R/$out $OUT/ 2>/dev/null
}
case "$STAGE" in
l)
  STAGE=l bash experiments/h200_session38.sh; exit $? ;;
s)
  # rows of 129-512 keys: one split (no partial store, counter or merge) against the plan's 128-key splits, in the
  # engine (MEMRA_ATT_SPLITS=1 / 2: the bits change with the count, the gates say MATCH or not), arms alternating
  splits_ab bench-split1.jsonl ${R_LIMIT:-270} 128 "plan 1 plan 1" 3 smollm2-135m synth:llama-1b:Q4_0 \
    synth:llama3-8b:Q4_K_M gemma3-270m
  splits_ab bench-split1.jsonl ${S_LIMIT:-390} 384 "plan 1 2 plan" 3 smollm2-135m synth:llama3-8b:Q4_K_M ;;
s2)
  # STAGE s cut to what a short call holds: the synthetic SmolLM2 and 1B shapes at depth 128, plan against one split
  splits_ab bench-split1.jsonl ${R_LIMIT:-120} 128 "plan 1 plan 1" 3 synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 ;;
s3)
  # one split at 385-512 keys (the SmolLM2 shape, the plan's 4 against 1 and 2), then the 8B at depth 128
  splits_ab bench-split384.jsonl 45 384 "plan 1 2 plan 1 2" 3 synth:smollm2-135m:Q4_1
  splits_ab bench-split384.jsonl 75 128 "plan 1" 2 synth:llama3-8b:Q4_K_M ;;
k)
  # switch129 landed (session 39): the launch cases the H200 receipt lacks, on any sm_90a part with 132 SMs
  # running the H200 table (kernel-check's receipt stands for the table's device)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-560} kernel_check ;;
n)
  timeout 300 python3 experiments/attn_tail/probe.py > $OUT/attn-tail.jsonl 2> $R/attn-tail.txt
  log "attn_tail rc=$? $(el)"; tail -3 $R/attn-tail.txt | tee -a $R/log.txt
  for arm in kernels best ring3 kernels best ring3; do   # the engine A/B of the probe's candidates
    [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-420} ] || break
    arm_run "smollm2-135m -d 4096 attn_tail=$arm" bench-attn-tail.jsonl python3 experiments/attn_tail/ab.py $arm \
      bench smollm2-135m -d 4096 -p 0 -n 128 -r 3
  done
  cp $R/bench-attn-tail.jsonl $OUT/ 2>/dev/null
  # last: a wrong cluster barrier would hang (the timeout bounds it)
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -lt 120 ] || left=120; [ $left -gt 20 ] || left=20
  timeout $left python3 experiments/attn_cluster/probe.py > $OUT/attn-cluster.jsonl 2> $R/attn-cluster.txt
  rc=$?; log "attn_cluster rc=$rc $(el)"; tail -3 $R/attn-cluster.txt | tee -a $R/log.txt
  # the engine at 16 splits, the global merge against the cluster's (the same bits), if the probe came back
  [ $rc = 0 ] && grep -q '"s16_exact": true' $OUT/attn-cluster.jsonl && for arm in global cluster global cluster; do
    [ $(( $(date +%s) - T0 )) -lt ${C_LIMIT:-530} ] || break
    if [ $arm = global ]; then cmd="python3 -m memra"; else cmd="python3 experiments/attn_cluster/ab.py"; fi
    arm_run "smollm2-135m -d 4096 splits=16 $arm" bench-attn-cluster.jsonl env MEMRA_ATT_SPLITS=16 $cmd bench \
      smollm2-135m -d 4096 -p 0 -n 128 -r 3
  done
  cp $R/bench-attn-cluster.jsonl $OUT/ 2>/dev/null ;;
m)
  TUNE_OUT=$OUT/h200-attn-depth-nvidia-h200.jsonl tune_campaign h200-attn-depth 150 -m synth:smollm2-135m:Q4_1 \
    -m synth:llama-1b:Q4_0 -m synth:llama3-8b:Q4_K_M
  for sp in "" 16 8 24 ""; do   # at 4,097-4,224 keys 33 and up give the plan's layout (128-key splits)
    [ $(( $(date +%s) - T0 )) -lt ${R_LIMIT:-330} ] || break
    arm_run "smollm2-135m -d 4096 splits=${sp:-plan}" bench-splits.jsonl env MEMRA_ATT_SPLITS=$sp python3 -m memra \
      bench smollm2-135m -d 4096 -p 0 -n 128 -r 3
  done
  cp $R/bench-splits.jsonl $OUT/ 2>/dev/null
  left=$(( 575 - ($(date +%s) - T0) )); [ $left -gt 30 ] || left=30   # the call's 600 s bound the two ncu cases
  TOK=$TOK KIND=decode CASES="smollm2-135m/attn_decode_rope/4096 synth:llama3-8b:Q4_K_M/attn_decode_rope/4096" \
    timeout $left bash experiments/h200_ncu.sh > $R/ncu.txt 2>&1
  log "ncu rc=$? $(el)"; tail -8 $R/ncu.txt | tee -a $R/log.txt ;;
g)
  STAGE=g R_LIMIT=${R_LIMIT:-330} bash experiments/h200_session38.sh   # its A/B, receipts in $OUT
  timeout 120 python3 experiments/graph_steps_capture.py synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 \
    synth:llama3-8b:Q4_K_M --synth-tokenizer $TOK > $OUT/graph-capture.jsonl 2> $R/capture.txt
  log "capture rc=$? $(el)"; cat $OUT/graph-capture.jsonl | tee -a $R/log.txt ;;
d)
  depth_vs ;;
t)
  # the launch set's modules compiled first on the call's 16 cores (session 38's first test call spent most of its
  # 560 s compiling: 31 tests, against 43 in 323 s once compiled)
  timeout 150 python3 -m memra kernel-check --compile-only --arch sm_90a > $R/precompile.txt 2>&1; log "precompile rc=$? $(el)"
  gpu_tests ${T_END:-560} ;;
esac
tar czf $OUT/s39-$STAGE.tgz -C /tmp s39-$STAGE
