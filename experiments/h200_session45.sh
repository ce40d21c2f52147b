#!/usr/bin/env bash
# Session 45's device calls (prepared in session 44, research/2026-12-06-session44; ran in session 45,
# research/2026-12-06-session45).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=c bash experiments/h200_session45.sh
# carry .whl and .synthtok (STAGE d and e also .llamacpp); STAGE d, e and k need the real models shipped first
# (experiments/ship_models.py's .models/ship-0N: six calls). Any sm_90a part with 132 SMs runs the H200 table; the
# device tool lends an H100 as often as an H200 and says to re-run the baseline on it: `--vs` runs measure llama.cpp
# in the same call, so their ratios stand on either card (say which). Compare arms only inside one call.
# STAGE c (~2-3 min, no models): experiments/gemm_f16/wg/cvt.py — the landed producer (DeqCvt<T>) against the
#  T::deq it replaced: same bits on every type, and the time.
# STAGE L (ran in session 45: probe -> cvt.py --land -> kernel-check -> campaign -> A/B in one call) is at
#  `git show 3c097ca:experiments/h200_session45.sh`; it does not apply to the landed tree.
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
# every stage but c is session 44's script's, run under this session's tag
case "$STAGE" in c) ;; *) SESSION_TAG=s45 exec bash experiments/h200_session44.sh ;; esac
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
tar czf $OUT/s45-$STAGE.tgz -C /tmp s45-$STAGE
