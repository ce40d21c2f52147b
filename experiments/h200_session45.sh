#!/usr/bin/env bash
# Session 45's device calls (prepared in session 44, research/2026-12-06-session44; ran in session 45,
# research/2026-12-06-session45: STAGE L landed cvt, so STAGE L and cvt.py --land do not apply to the tree any more).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=c bash experiments/h200_session45.sh
# carry .whl and .synthtok (STAGE d and e also .llamacpp); STAGE d, e and k need the real models shipped first
# (experiments/ship_models.py's .models/ship-0N: six calls). Any sm_90a part with 132 SMs runs the H200 table; the
# device tool lends an H100 as often as an H200 and says to re-run the baseline on it: `--vs` runs measure llama.cpp
# in the same call, so their ratios stand on either card (say which). Compare arms only inside one call.
# STAGE c (~2-3 min, no models): experiments/gemm_f16/wg/cvt.py — the wgmma producer's dequant without I2F
#  (deq_cvt.cuh) against the kernel as it is: same bits on every type, and the time (Q6_K / Q8_0 / IQ4_XS lose their
#  per-value I2F.S8; the 4-bit types' I2FP and extraction shrink). STAGE L does the same and lands it in one call.
# STAGE L (~8-9 min, models shipped: kernel-check's launch set needs them): STAGE c, then, if every launch had the
#  same bits, the landing in this call's copy: `cvt.py --land $OUT/wg-cvt.jsonl` (kernels/ edited), kernel-check
#  --add-to (the changed family runs whole), the gemm_f16 campaign, freeze_show, and pp512 / pp128 on the 8B with the
#  landed kernel and table against the checkout as it came (/tmp/old), arms alternating. Back on the CPU: the same
#  `cvt.py --land` from the committed receipts gives the same bytes; commit it with $OUT's kernel-check receipt,
#  campaign receipts and table.
# STAGE d (~6 min with the build, .llamacpp) / e (~2 min after d on a warm machine): `--vs llama.cpp` as session 44.
# STAGE t (~2 min, no models): the gemm_f16 tune campaign into $OUT/h200-gemm-f16-nvidia-h200.jsonl (research/tune/
#  after; freeze with --stand-in, tune/defaults/README.md).
# STAGE k (~3-5 min, models shipped): kernel-check --add-to, then pp512/pp128 8B table against ARMS (VAR=value).
# STAGE d, e, t, k, s, w, l: experiments/h200_session44.sh's (s: short prompts f16 vs tile, w: wg diag, l: long prompts),
#  run from here under the tag s45.
# Issue 11's serve cells: experiments/h200_serve.sh STAGE=build then STAGE=evidence (~14 min, .llamacpp), the first
#  serve run with the f16 prompt GEMM (the last: c = 64 3.52x with the int8 tile).
set -u
[ "$STAGE" = L ] && { echo "STAGE L landed cvt in session 45 (8e1c94b): nothing left to land" >&2; exit 1; }
# every stage but c and L is session 44's script's, run under this session's tag
case "$STAGE" in c|L) ;; *) SESSION_TAG=s45 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s45
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 400 python3 experiments/gemm_f16/wg/cvt.py --out $OUT/wg-cvt.jsonl > $R/cvt.txt 2>&1
log "wg cvt rc=$? $(el)"; grep -E "ALL SAME|DIFFER" $R/cvt.txt | tee -a $R/log.txt
python3 - $OUT/wg-cvt.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['shape']:11s} {r['type']:6s} nb {r['nb']:3d} {r['config']}: {r['us_i2f']:8.1f} -> {r['us_cvt']:8.1f} us "
          f"({100 * r['gain']:+.1f} %) same bits {r['same_bits']}")
PY
if [ "$STAGE" = L ] && grep -q "ALL SAME BITS" $R/cvt.txt; then
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -a memra kernels tune pyproject.toml .synthtok /tmp/old/
  printf '#!/bin/bash\ncd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old exec "$@"\n' > /tmp/old.sh && chmod +x /tmp/old.sh
  python3 experiments/gemm_f16/wg/cvt.py --land $OUT/wg-cvt.jsonl 2>&1 | tee -a $R/log.txt
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-200} kernel_check
  tune_campaign h200-gemm-f16 ${T_LIMIT:-150} -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 \
    -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0
  freeze_show L
  # the landed kernels, the campaign's receipt and the table as one file: the device returns at most 8 files a call
  # (session 45's run made 10 and lost the campaign receipt)
  tar czf $OUT/land.tgz kernels/gemm_f16_wg.cu kernels/gemm_f16.cu kernels/deq_cvt.cuh \
    research/tune/h200-gemm-f16-nvidia-h200.jsonl tune/defaults/nvidia-h200.json
  for cmd in "synth:llama3-8b:Q4_K_M -p 512 -n 0 -r 5" "synth:llama3-8b:Q8_0 -p 512 -n 0 -r 5" \
             "synth:llama3-8b:Q4_K_M -p 128 -n 0 -r 5"; do
    for a in new old new old; do
      [ $(( $(date +%s) - T0 )) -lt ${AB_LIMIT:-520} ] || break 2
      if [ $a = new ]; then arm_run "$cmd landed" bench-land.jsonl python3 -m memra bench $cmd
      else arm_run "$cmd before" bench-land.jsonl /tmp/old.sh python3 -m memra bench $cmd; fi
      cp $R/bench-land.jsonl $OUT/ 2>/dev/null   # after each arm: a call cut at its limit keeps what ran
    done
  done
elif [ "$STAGE" = L ]; then
  log "not landing: a launch's bits differ (or the probe failed)"
fi
tar czf $OUT/s45-$STAGE.tgz -C /tmp s45-$STAGE
