#!/usr/bin/env bash
# What the bit-identical reduction order costs the GEMM (issue 10 item 3), on the H200 in one call:
# experiments/gemm_sweep.sh with gemm.cu in plain K order (experiments/gemm_free/make.py, from
# kernels/gemm.cu) as the "old" arm (copied over kernels/gemm.cu in a copy of the tree) and
# kernels/gemm.cu as the "new" arm; the table's 512-row configuration and the 128-row one, Q4_K
# and Q6_K, the 8B's GEMM shapes at 128 / 512 rows.
#   source .whl/setup.sh && bash experiments/gemm_free/ab.sh
# $OUT/sweep-{new,old}.{jsonl,log}: old = free order (its bit checks fail, by design), new = exact.
set -u
: "${OUT:?}"
rm -rf .gemm_free_old && python3 experiments/gemm_free/make.py .gemm_free_old > /dev/null || exit 1
OLD=.gemm_free_old CFGS="${CFGS:-2,2,2,4,1,3,1,1;2,1,2,4,2,3,1,2}" NBS="${NBS:-128,512}" REPS="${REPS:-15}" \
  bash experiments/gemm_sweep.sh
rm -rf .gemm_free_old
