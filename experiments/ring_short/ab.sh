#!/usr/bin/env bash
# ring_short on one H200, <= 90 s, synthetic 8B Q4_K_M (README.md):
#   source .whl/setup.sh && OUT=$OUT bash experiments/ring_short/ab.sh     (carry .whl and .synthtok; repo root)
# $OUT/ring-short.jsonl, $OUT/ring-short.log; exit 1 on a failed check, 2 on an error, 124 on the timeout.
# Knobs: MODEL (synth:llama3-8b:Q4_K_M; synth:llama-1b:Q4_0 is ~5x smaller), DEPTHS (40,64,4096,512,1024), CONFIGS (graph_ab.py),
# ROUNDS (5), LIMIT_S (85), MOCK=1 (CPU: compile table, arm swap, plan plumbing).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
mkdir -p "$OUT" && rm -f "$OUT/ring-short.jsonl"
timeout -k 3 "${LIMIT_S:-85}" python3 experiments/ring_short/graph_ab.py ${MOCK:+--mock} \
  --tok .synthtok/smollm2-tokenizer.gguf > "$OUT/ring-short.log" 2>&1
rc=$?
{ [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "graph_ab.py TIMED OUT after ${LIMIT_S:-85} s (partial results in the log / jsonl)"
grep -aE "^model|^memra modules|^compiled|^device|^runner|FAIL|ERROR|Traceback|done|passed|FAILED" "$OUT/ring-short.log" | head -30
sed -n '/^depth /,$p' "$OUT/ring-short.log" | grep -v "^PASS"
[ $rc -ne 0 ] && tail -25 "$OUT/ring-short.log"
echo "rc=$rc"
exit $rc
