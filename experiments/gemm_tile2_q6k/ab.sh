#!/usr/bin/env bash
# gemm_tile2_q6k (gemm_tile2's design for Q6_K, experiments/gemm_tile2_q6k/README.md) against float64,
# its exact float32 chains and memra's gemm (2,2,2,4,1,3,1,1 with GM_MINB 1, and the default): one H200
# call, no models (synthetic weights), target <= 60 s:
#   source .whl/setup.sh && bash experiments/gemm_tile2_q6k/ab.sh          (carry .whl; from the repo root)
# run.py: compiles the 7 modules (NVRTC, sm_90a; a spill fails the run) and, beside them, memra's gemm modules, checks every configuration
# (partial batch tiles, split-K 2 / 4 for GT_FORM 0) against the float64 reference at TOL 1e-5 and every
# ks = 1 configuration bit for bit against its CPU chain, then on the 8B Q6_K shapes (4096x14336,
# 4096x4096, 1024x4096; split-K 1 / 4 (/ 8)) at 512, 128 and 64 rows: the reference on 768 output rows,
# the chain bits on rows 0..31, batch invariance (nb 64 and 128 inside nb 512), CUDA-event medians with
# the weights rotated over copies > 3x the L2, beside memra's gemm on the same weights / activations.
# $OUT/gemm-tile2-q6k.jsonl, $OUT/gemm-tile2-q6k.log; exit 1 on a failed check, 2 on an error, 124 on the
# timeout. Knobs: REPS (20), LIMIT_S (55), SHAPES ("14336" / "4096x4096" / "1024": a subset), RUN_ARGS.
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
rm -f "$OUT/gemm-tile2-q6k.jsonl"
timeout -k 5 "${LIMIT_S:-55}" python3 experiments/gemm_tile2_q6k/run.py --reps "${REPS:-20}" ${SHAPES:+--shapes "$SHAPES"} ${MOCK:+--mock} \
  ${RUN_ARGS:-} > "$OUT/gemm-tile2-q6k.log" 2>&1
rc=$?
{ [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "run.py TIMED OUT after ${LIMIT_S:-55} s (partial results in the log / jsonl)"
grep -aE "^compiled|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/gemm-tile2-q6k.log" | head -40
sed -n '/^shape  /,$p' "$OUT/gemm-tile2-q6k.log"
[ $rc -ne 0 ] && tail -25 "$OUT/gemm-tile2-q6k.log"
echo "rc=$rc"
exit $rc
