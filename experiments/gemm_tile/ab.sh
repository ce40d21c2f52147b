#!/usr/bin/env bash
# gemm_tile (the free-order Q4_K tile prototype, experiments/gemm_tile/README.md) against float64 and
# memra's own GEMM, one H200 call, no models (synthetic weights), target <= 120 s:
#   source .whl/setup.sh && bash experiments/gemm_tile/ab.sh          (carry .whl; from the repo root)
# tile.py: compiles the prototype's 4 configurations (NVRTC, sm_90a; a spill fails the run), checks
# every configuration (glu and plain, partial batch tiles, split-K 2 / 3) against the float64
# reference, then on the 8B shapes (Q4_K glu 2x14336x4096; Q4_K 4096x14336 with split-K 1 and 4) at
# 128 and 512 rows: the reference on 768 output rows, batch independence (rows 0..127 bit-identical at
# nb 128 and 512), CUDA-event medians with the weights rotated over copies > 3x the L2, beside memra's
# gemm (2,2,2,4,1,3,1,1 and its built-in configuration for the batch) on the same weights / activations.
# $OUT/gemm-tile.jsonl, $OUT/gemm-tile.log; exit 1 on a failed check, 2 on an error, 124 on the timeout.
# Knobs: REPS (20), LIMIT_S (115), SHAPES ("glu" / "4096x14336": a subset of the 8B shapes).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
rm -f "$OUT/gemm-tile.jsonl"
timeout -k 5 "${LIMIT_S:-115}" python3 experiments/gemm_tile/tile.py --reps "${REPS:-20}" ${SHAPES:+--shapes "$SHAPES"} \
  > "$OUT/gemm-tile.log" 2>&1
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "tile.py TIMED OUT after ${LIMIT_S:-115} s (partial results in the log / jsonl)"
grep -aE "^compiled|^device|FAIL|ERROR|Traceback|done at|passed|FAILED" "$OUT/gemm-tile.log" | head -40
sed -n '/^shape  /,$p' "$OUT/gemm-tile.log"
[ $rc -ne 0 ] && tail -25 "$OUT/gemm-tile.log"
echo "rc=$rc"
exit $rc
