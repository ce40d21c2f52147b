#!/usr/bin/env bash
# The next session's device calls (prepared in session 47, research/2026-12-06-session47). Ran in session 48 (H100):
# N, T, k as below; results in research/2026-12-06-session48/README.md.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=N bash experiments/h200_session48.sh
# carry .whl and .synthtok; the real models shipped first (experiments/ship_models.py's .models/ship-0N, six calls).
# Order (one machine, ~25 min of device time): on the CPU `bash experiments/prepare_landing.sh experiments/glu_twin`
# and commit (STAGE T's kernel; nothing chooses it yet); ship; N; copy in + commit; T; copy in + commit; k (one
# kernel-check for both: matvec.cu's family whole and the chosen modules' new cases); d / e if time is left.
#
# STAGE N (~5-7 min, models shipped): the norms' and the FFN quantize's PDL trigger before their wait, as engine
# choices. Session 47's STAGE E measured it as a no-op: the launchers built Q8_WARPS / NORM_THREADS only and dropped
# the trigger defines (fixed in 1a78cc5; experiments/engine_tune overlay now refuses a rule the engine's launch
# cases would drop), so what landed is the matvecs' trigger alone (SmolLM2 +1.83 %, Gemma-3 +0.36 %). Candidates
# over the shipped table (which holds those matvec groups): "nq" = rmsnorm / add_rmsnorm and quantize_q8, "q8e" =
# quantize_q8 alone; for the 1B and the 8B also "mv" (their matvecs, never measured alone: session 46's all-trigger
# arm lost 1.2 / 0.8 %) and "all" (mv + nq). SmolLM2 and Gemma-3 ABCCBA, the 1B and the 8B ABCDEEDCBA (~8 min with
# the compiles: N_END bounds it); each model's best candidate that
# gains in every pass becomes a group of engine-choice records (evidence: the bench receipts under
# research/<date>-session48/N/), frozen on the device. $OUT: bench-nq.jsonl, tune/engine-choices-nvidia-h200.jsonl,
# defaults/nvidia-h200.json, profile.jsonl, s48-N.tgz: copy them in (the bench receipts to research/<date>-session48/N/), commit,
# then at once (the machine warm, the models there) STAGE k: kernel-check --add-to (q8.cu and norm.cu are unchanged:
# only the chosen modules' new launch cases run) — h200_session44.sh's stage k, tag s48. A chosen group's quantize
# entry is per shape: Gemma-3's quantize_q8 n = 2048 is also the 1B's head-row quantize (say so if it lands).
# STAGE T (~5-7 min, after N's table is committed): the gate+up matvec writing down's q8 input (MV_TWIN,
# experiments/glu_twin), as engine choices. Before the call, on the CPU: `bash experiments/prepare_landing.sh
# experiments/glu_twin` (land.py, the carry record, the freeze, stale none), commit (rehearsed: README there). Candidates
# tw8x4 / tw32x1 on SmolLM2 and Gemma-3, tw16x2 / tw8x4 on the 1B and the 8B; $OUT: bench-twin.jsonl, the records, the table,
# s48-T.tgz; then STAGE k (matvec.cu changed: its family runs whole, ~2-3 min).
# STAGE d / e: `--vs llama.cpp` (h200_session44.sh's, tag s48; .llamacpp); issue 11's serve: h200_serve.sh.
set -u
case "$STAGE" in N|T) ;; *) SESSION_TAG=s48 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s48
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
link_models "the overlays and kernel-check's launch set need them"
RES=research/$(date +%F)-session48/$STAGE; mkdir -p $RES
OV=$R/ov
if [ "$STAGE" = T ]; then
  grep -q mv_q8_glu_twin kernels/matvec.cu || { log "kernels/matvec.cu has no mv_q8_glu_twin: run glu_twin/land.py first"; exit 1; }
  for m in smollm2-135m gemma3-270m; do
    overlay tw8x4 $m "matvec_glu:MV_TWIN=1,MV_NWARPS=8,MV_ROWS=4"
    overlay tw32x1 $m "matvec_glu:MV_TWIN=1,MV_NWARPS=32,MV_ROWS=1"
  done
  for m in synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    overlay tw16x2 $m "matvec_glu:MV_TWIN=1,MV_NWARPS=16,MV_ROWS=2"
    overlay tw8x4 $m "matvec_glu:MV_TWIN=1,MV_NWARPS=8,MV_ROWS=4"
  done
  choice_ab bench-twin ${T_END:-480} "smollm2-135m=shipped tw8x4 tw32x1 tw32x1 tw8x4 shipped" \
    "gemma3-270m=shipped tw8x4 tw32x1 tw32x1 tw8x4 shipped" "synth:llama-1b:Q4_0=shipped tw16x2 tw8x4 tw8x4 tw16x2 shipped" \
    "synth:llama3-8b:Q4_K_M=shipped tw16x2 tw8x4 tw8x4 tw16x2 shipped"
  tar czf $OUT/s48-T.tgz -C /tmp s48-T
  exit 0
fi
MV="matvec,matvec_glu:MV_PDL_TRIGGER=2"
NQ=("rmsnorm,add_rmsnorm:NORM_PDL_TRIGGER=2" "quantize_q8:Q8_PDL_TRIGGER=2")
for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
  overlay nq $m "${NQ[@]}"
  overlay q8e $m "${NQ[1]}"
done
for m in synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do   # their matvecs' trigger, never measured alone
  overlay mv $m "$MV"
  overlay all $m "$MV" "${NQ[@]}"
done
choice_ab bench-nq ${N_END:-480} "smollm2-135m=shipped nq q8e q8e nq shipped" \
  "gemma3-270m=shipped nq q8e q8e nq shipped" "synth:llama-1b:Q4_0=shipped mv nq q8e all all q8e nq mv shipped" \
  "synth:llama3-8b:Q4_K_M=shipped mv nq q8e all all q8e nq mv shipped"
# session 47's SmolLM2 profile read ~4 µs alone for launches that take 1.5-2 (sum 900 µs, step 461; Gemma-3's right
# after it was normal): twice more, after the benches warmed the device, to see whether it repeats
breakdown smollm2-135m,smollm2-135m,gemma3-270m 60 $R/profile.log
tar czf $OUT/s48-N.tgz -C /tmp s48-N
