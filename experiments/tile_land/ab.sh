#!/usr/bin/env bash
# One H200 call (~1 min, no models): the landing candidate's checks, canary and the 8B shapes timed
# against memra's gemm. ON THE DEVICE ONLY: copies gemm_tile.cu into the call's kernels/ (that copy
# of the tree is discarded after the call).
#   source .whl/setup.sh && OUT=... bash experiments/tile_land/ab.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
command -v nvidia-smi > /dev/null || { echo "tile_land/ab.sh: a GPU machine only (it copies gemm_tile.cu into kernels/)"; exit 2; }
[ -e kernels/gemm_tile.cu ] && { echo "tile_land/ab.sh: kernels/gemm_tile.cu exists already (landed?): run check.py directly"; exit 2; }
cp experiments/tile_land/gemm_tile.cu kernels/
trap 'rm -f kernels/gemm_tile.cu' EXIT   # the copy never outlives the call
timeout ${TILE_S:-120} python3 experiments/tile_land/check.py --out "$OUT/tile-land.jsonl" > "$OUT/tile-land.txt" 2>&1
echo "tile_land rc=$?"; grep -E "^FAIL|^time|passed|FAILED" "$OUT/tile-land.txt" | tail -40
