#!/usr/bin/env bash
# gemm_tile2_q40 (experiments/gemm_tile2's pipelined tile GEMM for Q4_0 / Q8_0, README.md here) against
# float64, the exact float32 chain and memra's gemm (2,2,2,4,1,3,1,1 with GM_MINB 1, and the default):
# one H200 call, no models (synthetic weights), target <= 60 s:
#   source .whl/setup.sh && bash experiments/gemm_tile2_q40/ab.sh          (carry .whl; from the repo root)
# run.py: compiles the 6 modules (NVRTC, sm_90a; a spill fails the run) and memra's gemm modules in
# parallel, checks every configuration (glu and plain, partial batch tiles, one-stage K, split-K 2 / 3)
# against the float64 reference at TOL 1e-5 and (ks 1, plain) bit for bit against the CPU float32 chain,
# then the 8B shapes (Q4_0 and Q8_0: glu 2x14336x4096, 4096x14336, 6144x4096, 4096x4096) and the 1B's
# (Q4_0: glu 2x8192x2048, 2048x8192, 3072x2048) at 512, 128 and 64 rows: the reference on 768 outputs,
# the chain bits on rows 0..31 (plain, ks 1), batch invariance (rows of nb 128 / 64 bit-identical inside
# nb 512), CUDA-event medians (weights rotated over copies > 3x the L2) beside memra's gemm.
# $OUT/gemm-tile2-q40.jsonl, $OUT/gemm-tile2-q40.log; exit 1 on a failed check, 2 on an error, 124 on
# the timeout. Knobs: REPS (10), LIMIT_S (50), SHAPES (substrings of the shape names, comma-separated).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
rm -f "$OUT/gemm-tile2-q40.jsonl"
timeout -k 2 "${LIMIT_S:-50}" python3 experiments/gemm_tile2_q40/run.py --reps "${REPS:-10}" ${SHAPES:+--shapes "$SHAPES"} ${MOCK:+--mock} \
  ${RUN_ARGS:-} > "$OUT/gemm-tile2-q40.log" 2>&1
rc=$?
{ [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "run.py TIMED OUT after ${LIMIT_S:-50} s (partial results in the log / jsonl)"
grep -aE "^compiled|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/gemm-tile2-q40.log" | head -40
sed -n '/^shape  /,$p' "$OUT/gemm-tile2-q40.log"
[ $rc -ne 0 ] && tail -25 "$OUT/gemm-tile2-q40.log"
echo "rc=$rc"
exit $rc
