#!/usr/bin/env bash
# gemm_tile2 (the pipelined successor of the gemm_tile prototype, experiments/gemm_tile2/README.md)
# against float64, gemm_tile "2,4,3 tcm" and memra's gemm (2,2,2,4,1,3,1,1, GM_MINB 1): one H200 call,
# no models (synthetic weights), target <= 90 s:
#   source .whl/setup.sh && bash experiments/gemm_tile2/ab.sh          (carry .whl; from the repo root)
# tile2.py: compiles the 8 modules (NVRTC, sm_90a; a spill fails the run), checks every configuration
# (glu and plain, partial batch tiles, one-stage K, split-K for GT_FORM 0 / gemm_tile) against the
# float64 reference at TOL 1e-5, then on the 8B shapes (Q4_K glu 2x14336x4096; Q4_K 4096x14336 with
# split-K 1 and 4) at 512, 128 and 64 rows: the reference on 768 output rows, batch invariance (rows of
# nb 64 and 128 bit-identical inside nb 512), CUDA-event medians with the weights rotated over copies
# > 3x the L2, beside memra's gemm on the same weights / activations.
# $OUT/gemm-tile2.jsonl, $OUT/gemm-tile2.log; exit 1 on a failed check, 2 on an error, 124 on the timeout.
# Knobs: REPS (20), LIMIT_S (85), SHAPES ("glu" / "4096x14336": a subset of the 8B shapes).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
rm -f "$OUT/gemm-tile2.jsonl"
timeout -k 5 "${LIMIT_S:-85}" python3 experiments/gemm_tile2/tile2.py --reps "${REPS:-20}" ${SHAPES:+--shapes "$SHAPES"} ${MOCK:+--mock} \
  ${TILE2_ARGS:-} > "$OUT/gemm-tile2.log" 2>&1
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "tile2.py TIMED OUT after ${LIMIT_S:-85} s (partial results in the log / jsonl)"
grep -aE "^compiled|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/gemm-tile2.log" | head -40
sed -n '/^shape  /,$p' "$OUT/gemm-tile2.log"
[ $rc -ne 0 ] && tail -25 "$OUT/gemm-tile2.log"
echo "rc=$rc"
exit $rc
