#!/usr/bin/env bash
# The next session's device calls (prepared in session 44, research/2026-12-06-session44).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=c bash experiments/h200_session45.sh
# carry .whl and .synthtok (STAGE d and e also .llamacpp); STAGE d, e and k need the real models shipped first
# (experiments/ship_models.py's .models/ship-0N: six calls). Any sm_90a part with 132 SMs runs the H200 table; the
# device tool lends an H100 as often as an H200 and says to re-run the baseline on it: `--vs` runs measure llama.cpp
# in the same call, so their ratios stand on either card (say which). Compare arms only inside one call.
# STAGE c (~2-3 min, no models): experiments/gemm_f16/wg/cvt.py — the wgmma producer's dequant without I2F
#  (deq_cvt.cuh) against the kernel as it is: same bits on every type, and the time (Q6_K / Q8_0 / IQ4_XS lose their
#  per-value I2F.S8; the 4-bit types' I2FP and extraction shrink). If it wins: land it (kernels/deq_cvt.cuh, the one
#  call in gemm_f16_wg.cu; experiments/gemm_f16/wg/README.md "Landing cvt"), then STAGE t (the campaign again: every
#  gemm_f16 entry is stale with the source), freeze on the CPU, STAGE k (kernel-check runs the changed family whole).
# STAGE d (~6 min with the build, .llamacpp) / e (~2 min after d on a warm machine): `--vs llama.cpp` as session 44.
# STAGE t (~2 min, no models): the gemm_f16 tune campaign into $OUT/h200-gemm-f16-nvidia-h200.jsonl (research/tune/
#  after; freeze with --stand-in, tune/defaults/README.md).
# STAGE k (~3-5 min, models shipped): kernel-check --add-to, then pp512/pp128 8B table against ARMS (VAR=value).
# STAGE s, w, l: as in experiments/h200_session44.sh (short prompts f16 vs tile, wg diag, the long-prompt cells).
# Issue 11's serve cells: experiments/h200_serve.sh STAGE=build then STAGE=evidence (~14 min, .llamacpp), the first
#  serve run with the f16 prompt GEMM (the last: c = 64 3.52x with the int8 tile).
set -u
source experiments/h200_common.sh
stage_begin s45
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$STAGE" in
c)
  timeout 400 python3 experiments/gemm_f16/wg/cvt.py --out $OUT/wg-cvt.jsonl > $R/cvt.txt 2>&1
  log "wg cvt rc=$? $(el)"; grep -E "ALL SAME|DIFFER" $R/cvt.txt | tee -a $R/log.txt
  python3 - $OUT/wg-cvt.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['shape']:11s} {r['type']:6s} nb {r['nb']:3d} {r['config']}: {r['us_i2f']:8.1f} -> {r['us_cvt']:8.1f} us "
          f"({100 * r['gain']:+.1f} %) same bits {r['same_bits']}")
PY
  ;;
d)
  depth_vs ;;
e)
  MODELS="synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 gemma3-270m" depth_vs ;;
t)
  TUNE_OUT=$OUT/h200-gemm-f16-nvidia-h200.jsonl tune_campaign h200-gemm-f16 ${T_LIMIT:-540} -m synth:llama3-8b:Q4_K_M \
    -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 ;;
k)
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-240} kernel_check
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T1:-420} "synth:llama3-8b:Q4_K_M -p 512 -n 0 -r 5" table "$ARMS"
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T2:-560} "synth:llama3-8b:Q4_0 -p 512 -n 0 -r 5" table "$ARMS"
  [ -n "${ARMS:-}" ] && env_arms bench-landing.jsonl ${T3:-0} "synth:llama3-8b:Q4_K_M -p 128 -n 0 -r 5" table "$ARMS" ;;
s)
  env_arms bench-short.jsonl ${T1:-200} "synth:llama3-8b:Q4_K_M -p 64 -n 0 -r 5" table MEMRA_PROMPT_GEMM=tile
  env_arms bench-short.jsonl ${T2:-400} "synth:llama3-8b:Q4_K_M -p 128 -n 0 -r 5" table MEMRA_PROMPT_GEMM=tile ;;
w)
  timeout 300 python3 experiments/gemm_f16/wg/diag.py --out $OUT/wg-diag.jsonl > $R/diag.txt 2>&1
  log "wg diag rc=$? $(el)"; tail -20 $R/diag.txt | cut -c1-200 | tee -a $R/log.txt ;;
l)
  bash experiments/h200_long.sh ;;
esac
tar czf $OUT/s45-$STAGE.tgz -C /tmp s45-$STAGE
