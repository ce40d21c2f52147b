#!/usr/bin/env bash
# The next session's device calls (prepared in session 48, research/2026-12-06-session48).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=X bash experiments/h200_session49.sh
# carry .whl and .synthtok (+ .llamacpp, and .llamacpp-bin once a call has packed it, for STAGE v).
#
# STAGE a (~30 s, no models): experiments/attn_short/probe.py — v3 (a warp's p shuffled) against the engine's
#   launch per shape and depth; $OUT/attn-short.jsonl -> research/<date>-session49/a/. If Gemma-3 / the 8B keep
#   their 64-key gains and the crossover stays near 96-128 keys, the engine module is the next CPU work
#   (experiments/attn_short/README.md "Next").
# STAGE v (~9 min, the models shipped first): `memra bench --vs llama.cpp` of SmolLM2, Gemma-3, the 1B and the 8B
#   Q4_K_M with the tables as committed (depth 0), then the 8B Q4_0 / Q8_0 while the call's time lasts.
#   experiments/llamacpp_bin.sh builds llama.cpp once and packs its binaries into $OUT/llama-bin.tar.xz.NN: copy
#   those pieces into .llamacpp-bin/ here (git-ignored), and every later call carries them instead of building
#   (~5 min of device time saved a call). On an H200, this is issue 14's board.
# STAGE d / e / k: h200_session44.sh's (tag s49): `--vs llama.cpp` at depth, the other synthetic 8Bs, kernel-check.
set -u
case "$STAGE" in a|v) ;; *) SESSION_TAG=s49 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s49
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$STAGE" = a ]; then
  timeout 200 python3 experiments/attn_short/probe.py > $OUT/attn-short.jsonl 2> $R/attn-short.err
  log "attn_short probe rc=$? $(el)"; tail -5 $R/attn-short.err | tee -a $R/log.txt
  cat $OUT/attn-short.jsonl | cut -c1-220 | tee -a $R/log.txt
  exit 0
fi
link_models "the real models' cells need them"
llamacpp_vs smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M
[ $(( $(date +%s) - T0 )) -lt 420 ] && vs_runs /root/llama.cpp/build/bin/llama-bench synth:llama3-8b:Q4_0
[ $(( $(date +%s) - T0 )) -lt 480 ] && vs_runs /root/llama.cpp/build/bin/llama-bench synth:llama3-8b:Q8_0
tar czf $OUT/s49-v.tgz -C /tmp s49-v
