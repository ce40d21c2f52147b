#!/usr/bin/env bash
# One H200 call (<= 100 s, no models): GT_ORDER 1 (slot order) bit checks against slot_chain, GT_ORDER 0
# against the chain, the canary, and the 8B shapes at 64 / 512 rows: order 0, order 1, gemm.cu.
# ON THE DEVICE ONLY: writes the kernel (experiments/tile_land/gemm_tile.cu + gemm_tile.patch) into the call's
# kernels/gemm_tile.cu (removed on exit).
#   source .whl/setup.sh && OUT=$OUT bash experiments/slot_order/tile/ab.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../../.."
command -v nvidia-smi > /dev/null || { echo "slot_order/tile/ab.sh: a GPU machine only (it copies gemm_tile.cu into kernels/)"; exit 2; }
[ -e kernels/gemm_tile.cu ] && { echo "slot_order/tile/ab.sh: kernels/gemm_tile.cu exists already (landed?)"; exit 2; }
patch -s -o kernels/gemm_tile.cu experiments/tile_land/gemm_tile.cu experiments/slot_order/tile/gemm_tile.patch || exit 2
trap 'rm -f kernels/gemm_tile.cu' EXIT   # the copy never outlives the call
timeout ${SLOT_S:-95} python3 experiments/slot_order/tile/check.py --out "$OUT/slot-tile.jsonl" > "$OUT/slot-tile.txt" 2>&1
rc=$?
echo "slot_tile rc=$rc"; grep -E "^FAIL|^COMPILE|compiled|checks done|passed|FAILED" "$OUT/slot-tile.txt" | tail -30
sed -n '/^shape /,$p' "$OUT/slot-tile.txt"
[ $rc -ne 0 ] && tail -20 "$OUT/slot-tile.txt"
exit $rc
