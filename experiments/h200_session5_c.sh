#!/usr/bin/env bash
# Session 5 (2026-12-01) H200 call C: issue 12's lookup benchmark (h200_spec.sh STAGE=bench,
# REPS=2) and issue 13's constrained-vs-free speed (h200_structured.sh, 3 reps of 64 steps),
# results tarred into $OUT.
export PYTHONUNBUFFERED=1 COLUMNS=200
R=/tmp/s5c; mkdir -p $R; S=$(date +%s)
OUT=$R STAGE=bench REPS=2 MEMRA_GIT_SHA=$MEMRA_GIT_SHA timeout 240 bash experiments/h200_spec.sh > /dev/null 2>&1; echo "spec bench $(( $(date +%s) - S ))s"; grep -hE "summary|median_ratio" $R/spec-bench.jsonl 2>/dev/null | cut -c1-400; grep -E "rc=" $R/spec.log | tail -6
S=$(date +%s); OUT=$R REPS=3 STEPS=64 timeout 240 bash experiments/h200_structured.sh > /dev/null 2>&1; echo "structured $(( $(date +%s) - S ))s"; grep -E "SUMMARY|rc=" $R/structured.log | cut -c1-300
tar czf $OUT/s5c.tgz -C $R .
