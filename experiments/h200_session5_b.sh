#!/usr/bin/env bash
# Session 5 (2026-12-01) H200 call B: the kernel-check receipt again (to bring it back), every
# GPU test, then issue 12's spec-check stage (experiments/h200_spec.sh STAGE=check); results
# tarred into $OUT (a call brings back at most 8 files).
export PYTHONUNBUFFERED=1 COLUMNS=200
R=/tmp/s5b; mkdir -p $R/kernel-check; S=$(date +%s)
timeout 120 python3 -m memra kernel-check --out $R/kernel-check/ > $R/kernel-check.txt 2>&1; echo "kernel-check rc=$? $(tail -1 $R/kernel-check.txt) $(( $(date +%s) - S ))s"
python3 -m memra kernel-check --status --out $R/kernel-check/nvidia-h200.json | tail -1
S=$(date +%s); timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(( $(date +%s) - S ))s"; grep -E "^(FAILED|ERROR)|^E   Mod" $R/gpu-tests.txt | sort | uniq | head
S=$(date +%s); OUT=$R STAGE=check MEMRA_GIT_SHA=$MEMRA_GIT_SHA timeout 300 bash experiments/h200_spec.sh > /dev/null 2>&1; echo "spec check $(( $(date +%s) - S ))s"; grep -E "rc=" $R/spec.log
tar czf $OUT/s5b.tgz -C $R .
