#!/usr/bin/env bash
# The two A/Bs prepared in session 10, in one H200 call (~6 min; no models needed):
#   source .whl/setup.sh && bash experiments/h200_ab11.sh
# 1. experiments/gemm_free/ab.sh — what the matvec's reduction order costs the GEMM (gemm.cu
#    against the same kernel in plain K order), the table's 512- and 128-row configurations,
#    the 8B's GEMM shapes at 128 / 512 rows; $OUT/sweep-{new,old}.*: old = free order.
# 2. experiments/mvt/v6/ab.sh — mvt variant 6 (stages in shared memory, plain K order, a
#    partial per slot) against kernels/mvt.cu at 4 / 8 / 16 rows, with every bit check;
#    $OUT/mvt-{old,v6u1,v6u2}.*.
# Commit both outputs under research/ with the decision: the free-order number decides the GEMM's
# next design (issue 10 item 3's 15 % rule), v6's decides whether mvt moves to it (then the mvt
# campaign, `memra tune dispatch`, kernel-check).
set -u
: "${OUT:?}"
T0=$(date +%s)
echo "== gemm_free"; timeout 270 bash experiments/gemm_free/ab.sh 2>&1 | tail -30
echo "== mvt v6 ($(( $(date +%s) - T0 )) s)"; timeout 310 bash experiments/mvt/v6/ab.sh 2>&1 | tail -60
echo "== done ($(( $(date +%s) - T0 )) s)"
