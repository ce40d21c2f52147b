#!/usr/bin/env bash
# gemm.cu variant 9 (GM_STATIC=1: the static slot structure, experiments/gemm_v9/gemm.patch) A/B on the
# H200, one call, no models (synthetic weights), target <= 120 s:
#   source .whl/setup.sh && bash experiments/gemm_v9/ab.sh          (carry .whl)
# The tree (kernels memra experiments tune pyproject.toml) is copied to /tmp/v9tree and the patch applied
# there (kernels/gemm.cu on the branch is main's, kernel-checked); experiments/gemm_check.py of the copy
# compiles the copy's kernels/. One gemm_check run:
#  - checks (GEMM_DEFS=GM_STATIC=1: its two check configurations, 2,4,2,2,1,3,1,2 -> variant 9 and
#    1,2,4,1,4,3,5,1 -> WK 4, the slot walk, plus the canary): Q4_K / Q6_K / Q4_0, plain and glu, nu = 40
#    (uneven slots) and nu = 12 (empty slots), nb 1..512 and dead columns, bits against mv_q8;
#  - timing on the 8B shapes (Q4_K glu 2x14336x4096, Q6_K 4096x14336, Q4_0 4096x4096, Q4_K 6144x4096) at
#    16 / 37 / 64 / 128 / 512 rows, the 512-row configuration 2,2,2,4,1,3,1,1 base and :GM_STATIC=1 (same
#    weights, activations and mv_q8 reference; each timing's output is bit-checked against mv_q8).
# $OUT/gemm-v9-ab.jsonl (every check and timing), $OUT/gemm-v9-ab.log. Exit 1 on any mismatch.
set -u
: "${OUT:?}"
cd "$(dirname "$0")/../.." || exit 2
rm -rf /tmp/v9tree && mkdir -p /tmp/v9tree && cp -r kernels memra experiments tune pyproject.toml /tmp/v9tree/ \
  && (cd /tmp/v9tree && patch -s -p1 < experiments/gemm_v9/gemm.patch) && cd /tmp/v9tree || exit 2
grep -q GM_STATIC_ON kernels/gemm.cu || { echo "patch not applied"; exit 2; }
CFGS=${CFGS:-"2,2,2,4,1,3,1,1;2,2,2,4,1,3,1,1:GM_STATIC=1"}
rm -f "$OUT/gemm-check.jsonl"
GEMM_DEFS=GM_STATIC=1 timeout -k 5 ${LIMIT_S:-115} python3 experiments/gemm_check.py --types Q4_K,Q6_K,Q4_0 \
  --no-legacy --configs "$CFGS" --nbs ${NBS:-16,37,64,128,512} --shapes "glu,Q6_K 4096x14336,Q4_0,qkv" \
  --reps ${REPS:-10} > "$OUT/gemm-v9-ab.log" 2>&1
rc=$?
mv "$OUT/gemm-check.jsonl" "$OUT/gemm-v9-ab.jsonl" 2>/dev/null
[ $rc -eq 124 ] && echo "gemm_check TIMED OUT after ${LIMIT_S:-115} s (partial results in the log / jsonl)"
grep -aE "^compiled|FAIL|canary|checks done|passed" "$OUT/gemm-v9-ab.log" | head -30
sed -n '/^timing/,$p' "$OUT/gemm-v9-ab.log" | grep -v "^PASS" | head -60
# base vs variant per shape and nb, from the jsonl
python3 - "$OUT/gemm-v9-ab.jsonl" <<'PY'
import json, sys
t = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("kind") == "time":
        t[(r["shape"], r["nb"], r["gemm_cfg"].get("GM_STATIC", "0"))] = (r["gemm_us"], r["exact"])
print(f"{'shape':26s} {'nb':>4s} {'base us':>9s} {'v9 us':>9s} {'v9/base':>8s} exact")
for (s, nb, st), (us, ex) in sorted(t.items()):
    if st == "0" and (s, nb, "1") in t:
        us9, ex9 = t[(s, nb, "1")]
        print(f"{s:26s} {nb:4d} {us:9.1f} {us9:9.1f} {us9 / us:8.3f} {ex and ex9}")
PY
echo "rc=$rc"
exit $rc
