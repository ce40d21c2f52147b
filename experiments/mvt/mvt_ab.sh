#!/usr/bin/env bash
# mvt.cu against a variant of it (MVT_SRC=<file>, its headers from kernels/) on the H200, in one call:
# experiments/mvt/mvt_check.py times kernels/mvt.cu's configurations OLDCFGS (no bit checks: the
# committed kernel is kernel-checked), then checks the variant bit for bit against mv_q8 (every
# check case, and every timed configuration NEWCFGS on the timing shapes) and times it.
#   source .whl/setup.sh && MVT_SRC=<file> bash experiments/mvt/mvt_ab.sh
# $OUT/mvt-{old,new}.{jsonl,log}
set -u
: "${OUT:?}"
SRC=${MVT_SRC:?the variant of mvt.cu to compare, e.g. one restored with git show e4151ee:experiments/mvt/v5/mvt.cu}
TYPES=${TYPES:-Q4_K,Q6_K,Q4_0,Q8_0}
NBS=${NBS:-2,4,8,16}
OLDCFGS=${OLDCFGS:-"1,8,1,2,0,2,1"}
NEWCFGS=${NEWCFGS:-"1,8,1,2,0,2,1,0;1,8,1,2,0,2,1,1;1,8,1,3,0,2,1,0;1,8,1,1,0,2,1,0"}
run() {  # tag, extra args...
  local tag=$1; shift
  mkdir -p "$OUT/tmp-$tag"
  OUT=$OUT/tmp-$tag timeout 250 python3 experiments/mvt/mvt_check.py --no-gemm --types "$TYPES" --nbs "$NBS" \
    --reps "${REPS:-25}" "$@" > "$OUT/mvt-$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "passed|FAIL|glu|Q6_K 4096|Q4_0 4096|Q8_0 4096|Q4_K 4096|qkv" "$OUT/mvt-$tag.log" | tail -40
  [ -f "$OUT/tmp-$tag/mvt-check.jsonl" ] && mv "$OUT/tmp-$tag/mvt-check.jsonl" "$OUT/mvt-$tag.jsonl"
  rm -rf "$OUT/tmp-$tag"
}
run old --no-checks --configs "$OLDCFGS"
export MVT_SRC=$SRC
run new --configs "$NEWCFGS"
