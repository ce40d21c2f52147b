#!/usr/bin/env bash
# mvt variant 7 (kernels/mvt.cu + mvt.patch, MVT_SB=1: the Q4_K / Q5_K super-block walk) A/B on the H200, one call,
# no models (synthetic weights), at most ~150 s:
#   source .whl/setup.sh && bash experiments/mvt/v7/ab.sh
# experiments/mvt/v7/ab.py: compiles only its modules (mvt arms L0 / SB / L1 / L1s6 for Q4_K, SB for
# Q5_K, the canary, mv_q8's chunks, q8), bit-checks every arm against mv_q8 (exit 1 on a mismatch or an
# uncaught canary), then times the arms interleaved (median of REPS, best of ROUNDS rounds) on the
# 8B's Q4_K shapes at 4 and 8 rows. $OUT/mvt-q4k-ab.jsonl (every check and timing), $OUT/mvt-q4k-ab.log.
set -u
: "${OUT:?}"
cd "$(dirname "$0")/../../.." || exit 2
# kernels/mvt.cu on main is the kernel-checked one: the variant lives in mvt.patch, applied to a
# copy of the tree (memra compiles the checkout's kernels/, so the copy's are the patched ones)
rm -rf /tmp/v7tree && mkdir -p /tmp/v7tree && cp -r kernels memra experiments tune pyproject.toml /tmp/v7tree/ \
  && (cd /tmp/v7tree && patch -s -p1 < experiments/mvt/v7/mvt.patch) && cd /tmp/v7tree || exit 2
timeout -k 5 ${LIMIT_S:-140} python3 experiments/mvt/v7/ab.py --reps "${REPS:-50}" --rounds "${ROUNDS:-2}" \
  ${AB_ARGS:-} > "$OUT/mvt-q4k-ab.log" 2>&1
rc=$?
[ $rc -eq 124 ] && echo "ab.py TIMED OUT after ${LIMIT_S:-140} s (partial results in the log / jsonl)"
grep -aE "^compiled|regs spill|FAIL|canary|checks:|small-shape" "$OUT/mvt-q4k-ab.log" | head -40
grep -aE "nb=[48]: " "$OUT/mvt-q4k-ab.log"
sed -n '/^shape /,$p' "$OUT/mvt-q4k-ab.log"
echo "rc=$rc"
exit $rc
