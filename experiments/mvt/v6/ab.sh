#!/usr/bin/env bash
# mvt variant 6 (experiments/mvt/v6/mvt.cu: stages in shared memory, plain K order, a partial per
# slot) against kernels/mvt.cu on the H200, in one call (~4 min):
#   source .whl/setup.sh && bash experiments/mvt/v6/ab.sh
# arms: old = kernels/mvt.cu's built-in (timing only: the committed kernel is kernel-checked);
# v6u1 = v6 with one unit a warp per stage, 3 stages (every check case and every timed
# configuration bit-checked against mv_q8, the canary); v6u2 = two units a warp per stage.
# $OUT/mvt-{old,v6u1,v6u2}.{jsonl,log}
set -u
: "${OUT:?}"
TYPES=${TYPES:-Q4_K,Q6_K,Q4_0,Q8_0}
NBS=${NBS:-4,8,16}
arm() {  # tag, then mvt_check arguments; the environment picks the source
  local tag=$1; shift
  mkdir -p "$OUT/tmp-$tag"
  OUT=$OUT/tmp-$tag timeout 280 python3 experiments/mvt/mvt_check.py --no-gemm --types "$TYPES" --nbs "$NBS" \
    --reps "${REPS:-25}" "$@" > "$OUT/mvt-$tag.log" 2>&1
  echo "$tag rc=$?"; grep -aE "passed|FAIL|COMPILE" "$OUT/mvt-$tag.log" | head -12
  sed -n '/^best exact/,$p' "$OUT/mvt-$tag.log" | head -40
  [ -f "$OUT/tmp-$tag/mvt-check.jsonl" ] && mv "$OUT/tmp-$tag/mvt-check.jsonl" "$OUT/mvt-$tag.jsonl"
  rm -rf "$OUT/tmp-$tag"
}
( unset MVT_SRC MVT_SMEM MVT_DEFS MVT_CHECK_CFGS; arm old --no-checks --configs "1,8,1,2,0,2,1" )
export MVT_SRC=experiments/mvt/v6/mvt.cu MVT_SMEM=v6 MVT_CHECK_CFGS="1,8,1,2,0,2;1,4,2,2,0,2;2,8,1,2,0,1"
MVT_DEFS="MVT_UPW=1,MVT_STAGES=3" arm v6u1 --configs "1,8,1,2,0,2;1,8,1,2,0,3;1,4,2,2,0,2;1,4,1,2,0,4"
MVT_DEFS="MVT_UPW=2,MVT_STAGES=3" arm v6u2 --no-checks --configs "1,8,1,2,0,2;1,4,1,2,0,4"
