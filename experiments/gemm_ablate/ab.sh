#!/usr/bin/env bash
# gemm.cu ablations (make.py) against gemm.cu itself, one H200 call (~3 min), synthetic weights:
#   source .whl/setup.sh && bash experiments/gemm_ablate/ab.sh          (carry .whl)
# Each arm is a copy of kernels/ and experiments/ under /tmp with its gemm.cu; gemm_check times
# the 8B's Q4_K glu, Q6_K down and Q4_0 4096 x 4096 shapes at 128 and 512 rows on the table's two
# prefill configurations (--no-checks: the ablations' bits differ by design). $OUT/ablate-<arm>.{jsonl,log}
# ARMS="base no-merge free skeleton" runs only those arms (make.py names them).
set -u
: "${OUT:?}"
CFGS=${CFGS:-"2,2,2,4,1,3,1,1;2,1,2,4,2,3,1,2"}
python3 experiments/gemm_ablate/make.py /tmp/ablate > /tmp/ablate.names || exit 1
for arm in ${ARMS:-base $(cat /tmp/ablate.names)}; do
  rm -rf /tmp/arm && mkdir -p /tmp/arm && cp -r kernels experiments /tmp/arm/
  [ "$arm" = base ] || cp /tmp/ablate/$arm/gemm.cu /tmp/arm/kernels/gemm.cu
  mkdir -p $OUT/tmp-$arm
  OUT=$OUT/tmp-$arm timeout 150 python3 /tmp/arm/experiments/gemm_check.py --types Q4_K,Q6_K,Q4_0 --no-legacy \
    --no-checks --configs "$CFGS" --nbs 128,512 --shapes "glu,Q6_K 4096x14336,Q4_0" --reps 15 > $OUT/ablate-$arm.log 2>&1
  echo "$arm rc=$?"; grep -A12 "best config" $OUT/ablate-$arm.log | tail -7
  mv $OUT/tmp-$arm/gemm-check.jsonl $OUT/ablate-$arm.jsonl 2>/dev/null; rm -rf $OUT/tmp-$arm
done
