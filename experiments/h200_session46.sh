#!/usr/bin/env bash
# Session 46's device calls (prepared in session 45, research/2026-12-06-session45; T, P and Q ran in session 46 on an
# H100, research/2026-12-06-session46: T at 04cef5a, P at 771dbd6 — its base arm is q8.cu before the landing; on a
# later tree base = q8 — and Q at b372449, whose GPU tests ran out of time in the attention family's compile).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=T bash experiments/h200_session46.sh
# carry .whl and .synthtok (STAGE d and e also .llamacpp; d, e and k need the real models shipped first:
# experiments/ship_models.py's .models/ship-0N, six calls). Any sm_90a part with 132 SMs runs the H200 table; the
# `--vs` runs measure llama.cpp in the same call, so their ratios stand on the lent card (say which). At most 8 files
# come back from $OUT: each stage leaves its receipts and one tgz of its folder.
# STAGE T (~4-6 min, no models): experiments/timeline — a decode step's time inside its graph, launch by launch
#  (crit / wait / lag a launch, experiments/timeline/README.md), with `memra profile` (each launch alone) beside it:
#  synthetic SmolLM2 (Q4_1, the real file's shape) and Gemma-3 270M, the 1B Q4_0 and the 8B Q4_K_M at depth 64, and the
#  8B's 64-row step at depth 128 (issue 11's c = 64), SmolLM2 at depth 4,096. $OUT: timeline.jsonl, profile.jsonl,
#  s46-T.tgz. Read with `python3 experiments/timeline/timeline.py --summarize timeline.jsonl --profile profile.jsonl`.
# STAGE Q (models shipped; ~6-9 min): quantize_q8's PDL trigger landed: the h200 campaign's quantize_q8 jobs (and the
#  PDL-timed 1B ones), freeze, kernel-check --add-to (the matvec family whole), then the GPU tests in what is left.
#  $OUT: tune/, defaults/, nvidia-h200.json (kernel-check receipt), kernel-check.txt.gz, s46-Q.tgz.
# STAGE P (~8 min, no models): experiments/pdl_early's arms (base, nq, early: where kernels trigger their PDL
#  dependants; at 771dbd6 also q8, since landed), tg128 of the synthetic SmolLM2 / 1B / 8B, arms alternating, $OUT/bench-pdl.jsonl; then the
#  timeline of SmolLM2 under the early and nq arms ($OUT/timeline.jsonl).
#  STAGE T first (~30 s): experiments/persist/probe.py --cluster ($OUT/persist-cluster.jsonl): one thread-block cluster's
#  persistent launch, phases split by the cluster barrier, against PDL launch boundaries.
# STAGE d / e (~6 / ~2 min, .llamacpp): `--vs llama.cpp` of the floors' models (h200_session44.sh's, tag s46): the
#  first with gemm_f16_wg v2 (the producer without I2F: pp512 +0-3 %, pp128 +9-11 % in session 45's A/B).
# Issue 11's serve cells: experiments/h200_serve.sh STAGE=build, then STAGE=evidence (~3 min after the build, which
#  needs llama.cpp's: ~5 min; .llamacpp; session 45: c = 64 4.04x on an H100).
set -u
case "$STAGE" in T|P|Q) ;; *) SESSION_TAG=s46 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s46
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tl() {  # tl LIMIT MODEL [args]: one timeline run, its JSON lines to $OUT/timeline.jsonl
  local lim=$1; shift
  [ $(( $(date +%s) - T0 )) -lt ${T_END:-500} ] || { log "skipped (time): $*"; return; }
  timeout "$lim" python3 experiments/timeline/timeline.py "$@" --synth-tokenizer "$TOK" --out $OUT/timeline.jsonl \
    >> $R/timeline.txt 2>&1
  log "timeline $* rc=$? $(el)"; tail -25 $R/timeline.txt | grep -A20 "events a replay" | head -22 | tee -a $R/log.txt
}
if [ "$STAGE" = Q ]; then   # quantize_q8's trigger landed (kernels/q8.cu): its entries re-timed, frozen, checked
  # the 1B's PDL-timed quantize_q8 entries first, so one freeze (attn_land's) makes the table kernel-check checks
  TUNE_OUT=research/tune/h200-pdl-nvidia-h200.jsonl tune_campaign h200 60 --pdl -m synth:llama-1b:Q4_0 --kernels quantize_q8
  LAND_KERNELS=quantize_q8 attn_land q8 300
  cp research/tune/h200-pdl-nvidia-h200.jsonl $OUT/tune/
  python3 -m memra kernel-check --status | tail -1 | tee -a $R/log.txt
  gpu_tests ${G_END:-560}
  tar czf $OUT/s46-$STAGE.tgz -C /tmp s46-$STAGE
  exit 0
fi
if [ "$STAGE" = P ]; then
  for spec in synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    q=${spec#synth:}; f=$(synth ${q%%:*} ${q##*:} "$TOK" | tail -1)
    for a in base nq early; do   # one build folder for every arm: only the files an arm edits compile again
      PDL_ARM=$a timeout 150 python3 experiments/pdl_early/ab.py warmup "$f" > /dev/null 2>> $R/warm.txt
      log "warmup $a $spec rc=$? $(el)"
    done
    for a in base nq early early nq base; do
      [ $(( $(date +%s) - T0 )) -lt ${P_END:-430} ] || break
      arm_run "$spec pdl=$a" bench-pdl.jsonl env PDL_ARM=$a python3 experiments/pdl_early/ab.py bench "$spec" \
        -p 0 -n 128 -r 3
    done
    cp $R/bench-pdl.jsonl $OUT/
  done
  T_END=${T_END:-540}
  tl 70 synth:smollm2-135m:Q4_1 -d 64 --reps 200 --arm early
  tl 70 synth:smollm2-135m:Q4_1 -d 64 --reps 200 --arm nq
  tar czf $OUT/s46-$STAGE.tgz -C /tmp s46-$STAGE
  exit 0
fi
timeout 60 python3 experiments/persist/probe.py --cluster --sizes 4,8,16 --bytes 0,65536,262144,1048576 \
  > $OUT/persist-cluster.jsonl 2>> $R/log.txt; log "persist --cluster rc=$? $(el)"
tl 150 synth:smollm2-135m:Q4_1 -d 64 --reps 200
tl 120 synth:gemma3-270m:Q4_K_M -d 64 --reps 200
tl 120 synth:llama-1b:Q4_0 -d 64 --reps 200
tl 240 synth:llama3-8b:Q4_K_M -d 64 --reps 100   # the first 8B run makes the synthetic file
tl 150 synth:llama3-8b:Q4_K_M -d 128 --rows 64 --reps 24
tl 90 synth:smollm2-135m:Q4_1 -d 4096 --reps 100   # issue 14's SmolLM2 @ d4096 cell: the attention at depth
for m in synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0; do
  [ $(( $(date +%s) - T0 )) -lt ${P_END:-540} ] || break
  q=${m#synth:}; f=$(synth ${q%%:*} ${q##*:} "$TOK" | tail -1)   # the file memra profile resolves the spec to
  timeout 60 python3 -m memra warmup "$f" > /dev/null 2>> $R/profile.txt   # the engine's own modules, in parallel
  timeout 60 python3 -m memra profile $m --depth 64 --synth-tokenizer "$TOK" --json >> $OUT/profile.jsonl 2>> $R/profile.txt
  log "profile $m rc=$? $(el)"
done
tar czf $OUT/s46-$STAGE.tgz -C /tmp s46-$STAGE
