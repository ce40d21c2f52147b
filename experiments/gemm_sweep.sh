#!/usr/bin/env bash
# gemm.cu config sweep on the H200, today's kernels and (V6=1) the previous gemm.cu/mma_frag.cuh
# from experiments/gemm_v6/ in a copy of the tree, timed in the same call. Bits are checked by
# gemm_check (every timed config against mv_q8). $OUT/sweep-{new,v6}.{jsonl,log}
set -u
: "${OUT:?}"
CFGS=${CFGS:-"2,2,2,2,2,3,1,2"}
NBS=${NBS:-64}
SHAPES=${SHAPES:-"glu,4096x14336,Q4_K 4096x4096,qkv"}
run() {  # root tag
  OUT=$OUT/tmp-$2 timeout 280 python3 "$1/experiments/gemm_check.py" --types Q4_K,Q6_K --no-legacy \
    --configs "$CFGS" --nbs "$NBS" --shapes "$SHAPES" --reps "${REPS:-25}" ${EXTRA:-} > "$OUT/sweep-$2.log" 2>&1
  echo "$2 rc=$?"; tail -4 "$OUT/sweep-$2.log"
}
mkdir -p "$OUT/tmp-new" "$OUT/tmp-v6"
if [ "${V6:-0}" = 1 ]; then
  rm -rf /tmp/v6 && mkdir -p /tmp/v6 && cp -r kernels experiments /tmp/v6/ && cp experiments/gemm_v6/*.cu* /tmp/v6/kernels/
  run /tmp/v6 v6
fi
run . new
for t in new v6; do [ -f "$OUT/tmp-$t/gemm-check.jsonl" ] && mv "$OUT/tmp-$t/gemm-check.jsonl" "$OUT/sweep-$t.jsonl"; done
rm -rf "$OUT"/tmp-*
