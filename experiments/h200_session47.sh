#!/usr/bin/env bash
# The next session's device calls (prepared in session 46, research/2026-12-06-session46).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=E bash experiments/h200_session47.sh
# carry .whl and .synthtok; the real models shipped first (experiments/ship_models.py's .models/ship-0N, six calls).
#
# STAGE E (~5-7 min, models shipped): the early PDL trigger as per-shape engine choices. Before the call, on the CPU:
#   bash experiments/prepare_landing.sh experiments/pdl_early   # land.py (MV_PDL_TRIGGER 2, NORM_PDL_TRIGGER in kernels/), session
#       # 46's carry records (matvec.cu: 164 modules identical, 1,247 receipts; norm.cu: 12, 48) or a fresh carry when
#       # kernels/ moved, the freeze, `tune show` stale none (rehearsed at 3f3edcc: 18 s); then commit (the
#       # kernel-check receipt is stale until this call's)
# On the device: for SmolLM2 and Gemma-3 (the real files), overlay candidate tables (experiments/engine_tune overlay):
# "early" = every matvec / matvec_glu, rmsnorm / add_rmsnorm and quantize_q8 entry of the model's decode step with its
# trigger before the wait, "mv" = the matvecs only; tg128 -r 3 ABCCBA against the shipped table; each model's better
# candidate that gains in every pass becomes a group of engine-choice records (each naming the device that timed its
# entry, the A/B's card in its objective; evidence: the bench receipts, copied under research/<date>-session47/E/
# first), frozen; the 1B and the 8B: the FFN quantize's early trigger alone (ABBA). $OUT: bench-early.jsonl,
# tune/engine-choices-nvidia-h200.jsonl, defaults/nvidia-h200.json, s47-E.tgz: copy them in (the bench receipts to
# research/<date>-session47/E/, where the records' evidence points), commit, then
# STAGE k (~3-5 min, the machine still warm with the models): kernel-check --add-to (matvec and norm whole: their
# sources changed; the chosen modules are new launch cases) — h200_session44.sh's stage k, tag s47.
# Session 46's A/B (synthetic files, kernels/ copies): SmolLM2 early +7.7 %, the 1B -1.2 %, the 8B -0.8 %. Note: a
# table entry is per shape, not per model: Gemma-3's quantize_q8 n = 2048 entry is also the 1B's head-row quantize
# (its prompt path), so a Gemma group reaches that launch too (bit-neutral; say so if it lands).
# STAGE d / e: `--vs llama.cpp` (h200_session44.sh's, tag s47; .llamacpp); issue 11's serve: h200_serve.sh.
set -u
case "$STAGE" in E) ;; *) SESSION_TAG=s47 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s47
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
link_models "the overlays and kernel-check's launch set need them"
grep -q "MV_PDL_TRIGGER == 2" kernels/matvec.cu || { log "kernels/matvec.cu has no MV_PDL_TRIGGER 2: run land.py first"; exit 1; }
RES=research/$(date +%F)-session47/E; mkdir -p $RES
OV=$R/ov
RULES=("matvec,matvec_glu:MV_PDL_TRIGGER=2" "rmsnorm,add_rmsnorm:NORM_PDL_TRIGGER=2" "quantize_q8:Q8_PDL_TRIGGER=2")
for m in smollm2-135m gemma3-270m; do
  overlay early $m "${RULES[@]}"
  overlay mv $m "${RULES[0]}"
done
# the 1B and the 8B: the FFN quantize's trigger before its wait alone (their down matvec loads its first unit before
# its own wait; session 46's nq / early arms lost there as a whole, the quantize's part unmeasured)
for m in synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
  overlay q8e $m "${RULES[2]}"
done
choice_ab bench-early ${E_END:-480} "smollm2-135m=shipped early mv mv early shipped" \
  "gemma3-270m=shipped early mv mv early shipped" "synth:llama-1b:Q4_0=shipped q8e q8e shipped" \
  "synth:llama3-8b:Q4_K_M=shipped q8e q8e shipped"
tar czf $OUT/s47-E.tgz -C /tmp s47-E
