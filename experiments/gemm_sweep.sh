#!/usr/bin/env bash
# gemm.cu config sweep on the H200: today's kernels and, with OLD=<folder in the tree holding an
# earlier gemm.cu / mma_frag.cuh> (e.g. made before the call with
#   mkdir -p .old && git show <rev>:kernels/gemm.cu > .old/gemm.cu && git show <rev>:kernels/mma_frag.cuh > .old/mma_frag.cuh
# and carried), those in a copy of the tree, timed in the same call. Bits are checked by
# gemm_check (every timed config against mv_q8). $OUT/sweep-{new,old}.{jsonl,log}
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
mkdir -p "$OUT/tmp-new" "$OUT/tmp-old"
if [ -n "${OLD:-}" ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -r kernels experiments /tmp/old/ && cp "$OLD"/* /tmp/old/kernels/
  run /tmp/old old
fi
run . new
for t in new old; do [ -f "$OUT/tmp-$t/gemm-check.jsonl" ] && mv "$OUT/tmp-$t/gemm-check.jsonl" "$OUT/sweep-$t.jsonl"; done
rm -rf "$OUT"/tmp-*
