#!/usr/bin/env bash
# slot_order/mv on one H200, <= 90 s, synthetic weights (README.md):
#   source .whl/setup.sh && OUT=$OUT bash experiments/slot_order/mv/ab.sh        (carry .whl; from the repo root)
# $OUT/slot-mv.jsonl, $OUT/slot-mv.log; exit 1 on a failed check / spill, 2 on an error, 124 on the timeout.
# Knobs: REPS (80: 20 graph replays), LIMIT_S (85), MOCK=1 (CPU: mock device, small shapes).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../../.." || exit 2
mkdir -p "$OUT" && rm -f "$OUT/slot-mv.jsonl"
timeout -k 3 "${LIMIT_S:-85}" python3 experiments/slot_order/mv/run.py --reps "${REPS:-80}" ${MOCK:+--mock} > "$OUT/slot-mv.log" 2>&1
rc=$?
{ [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "run.py TIMED OUT after ${LIMIT_S:-85} s (partial results in the log / jsonl)"
grep -aE "^compiled|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/slot-mv.log" | head -40
sed -n '/^shape  /,$p' "$OUT/slot-mv.log"
[ $rc -ne 0 ] && tail -25 "$OUT/slot-mv.log"
echo "rc=$rc"
exit $rc
