#!/usr/bin/env bash
# chain_mv (experiments/chain_mv/README.md) on one H200, <= 60 s, no models (synthetic weights):
#   source .whl/setup.sh && bash experiments/chain_mv/ab.sh          (carry .whl; from the repo root)
# run.py: compiles the configurations (a spill fails the run), checks each bit-exactly against the numpy
# chain reference (and float64 at 1e-5) on small shapes and on a row subset of the 8B shapes, times them
# at batch 1 (CM_B = 1 configurations) / nb = CM_B beside memra's matvec (the H200 table's configuration).
# $OUT/chain-mv.jsonl, $OUT/chain-mv.log; exit 1 on a failed check, 2 on an error, 124 on the timeout.
# Knobs: REPS (30), LIMIT_S (55).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
mkdir -p "$OUT" && rm -f "$OUT/chain-mv.jsonl"
timeout -k 3 "${LIMIT_S:-55}" python3 experiments/chain_mv/run.py --reps "${REPS:-30}" ${MOCK:+--mock} > "$OUT/chain-mv.log" 2>&1
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "run.py TIMED OUT after ${LIMIT_S:-55} s (partial results in the log / jsonl)"
grep -aE "^compiled|^time|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/chain-mv.log" | head -40
sed -n '/^shape  /,$p' "$OUT/chain-mv.log"
[ $rc -ne 0 ] && tail -25 "$OUT/chain-mv.log"
echo "rc=$rc"
exit $rc
