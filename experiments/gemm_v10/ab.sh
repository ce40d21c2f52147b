#!/usr/bin/env bash
# gemm.cu variant 10 (GM_RSS=1: row scalars staged once per block row; GM_XSF=1: Q4_K / Q5_K's
# activation sums as floats once per block column; GM_AOFF=1: Q4_0 / Q5_0's activation offset inside
# the integer dot; on top of variant 9's GM_STATIC=1) A/B on the H200,
# one call, no models (synthetic weights), target <= 150 s:
#   source .whl/setup.sh && bash experiments/gemm_v10/ab.sh          (carry .whl)
# The tree (kernels memra experiments tune pyproject.toml) is copied to /tmp/v10tree and
# experiments/gemm_v10/gemm.patch (a diff against main's kernels/gemm.cu: variant 9 + 10) applied
# there, unless the tree's gemm.cu already has GM_RSS (the wt-gemm10 branch: then used as is).
# One experiments/gemm_check.py run of the copy:
#  - checks with GEMM_DEFS=GM_STATIC=1,GM_RSS=1,GM_XSF=1,GM_AOFF=1 (its two check configurations:
#    2,4,2,2,1,3,1,2 -> static loop + RSS (+ XSF) + AOFF, 1,2,4,1,4,3,5,1 -> WK 4: slot walk + AOFF;
#    the canary): Q4_K / Q5_K (RSS + XSF), IQ4_XS (RSS), Q4_0 / Q5_0 (AOFF), Q6_K (none), plain and glu, K 2560
#    and 768 (uneven / empty slots), nb 1..512 and dead columns, bits against mv_q8;
#  - timing on the 8B shapes (Q4_K glu 2x14336x4096, Q6_K 4096x14336, Q4_0 4096x4096, Q4_K
#    6144x4096) at 16 / 128 / 512 rows, configuration 2,2,2,4,1,3,1,1 four ways: base, v9
#    (:GM_STATIC=1), v10a (:GM_STATIC=1,GM_RSS=1,GM_AOFF=1) and v10 (v10a + GM_XSF=1), same weights,
#    activations and mv_q8 reference; every timing output bit-checked against mv_q8.
# $OUT/gemm-v10-ab.jsonl (every check and timing), $OUT/gemm-v10-ab.log. Exit 1 on any mismatch.
# Knobs: CFGS, NBS (16,128,512), REPS (10), LIMIT_S (140), TYPES.
set -u
: "${OUT:?}"
cd "$(dirname "$0")/../.." || exit 2
rm -rf /tmp/v10tree && mkdir -p /tmp/v10tree && cp -r kernels memra experiments tune pyproject.toml /tmp/v10tree/ \
  && cd /tmp/v10tree || exit 2
if ! grep -q GM_RSS kernels/gemm.cu; then
  patch -s -p1 < experiments/gemm_v10/gemm.patch || { echo "patch failed"; exit 2; }
fi
grep -q GM_RSS kernels/gemm.cu || { echo "patch not applied"; exit 2; }
V9=GM_STATIC=1
V10A=GM_STATIC=1,GM_RSS=1,GM_AOFF=1
V10=GM_STATIC=1,GM_RSS=1,GM_XSF=1,GM_AOFF=1
C=2,2,2,4,1,3,1,1
CFGS=${CFGS:-"$C;$C:$V9;$C:$V10A;$C:$V10"}
rm -f "$OUT/gemm-check.jsonl"
GEMM_DEFS=$V10 timeout -k 5 ${LIMIT_S:-140} python3 experiments/gemm_check.py \
  --types ${TYPES:-Q4_K,Q5_K,IQ4_XS,Q4_0,Q5_0,Q6_K} --no-legacy --configs "$CFGS" --nbs ${NBS:-16,128,512} \
  --shapes "glu,Q6_K 4096x14336,Q4_0,qkv" --reps ${REPS:-10} > "$OUT/gemm-v10-ab.log" 2>&1
rc=$?
mv "$OUT/gemm-check.jsonl" "$OUT/gemm-v10-ab.jsonl" 2>/dev/null
[ $rc -eq 124 ] && echo "gemm_check TIMED OUT after ${LIMIT_S:-140} s (partial results in the log / jsonl)"
grep -aE "^compiled|FAIL|canary|checks done|passed" "$OUT/gemm-v10-ab.log" | head -30
sed -n '/^timing/,$p' "$OUT/gemm-v10-ab.log" | grep -v "^PASS" | head -80
# base / v9 / v10 per shape and nb, from the jsonl
python3 - "$OUT/gemm-v10-ab.jsonl" <<'PY'
import json, sys
t = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("kind") == "time":
        c = r["gemm_cfg"]
        on = lambda k: str(c.get(k, "0")) == "1"
        v = ("v10" if on("GM_XSF") else "v10a") if on("GM_RSS") else "v9" if on("GM_STATIC") else "base"
        t[(r["shape"], r["nb"], v)] = (r["gemm_us"], r["exact"])
print("v10a = GM_STATIC=1,GM_RSS=1,GM_AOFF=1; v10 = v10a + GM_XSF=1 (us; ratios against base and v9)")
print(f"{'shape':26s} {'nb':>4s} {'base':>8s} {'v9':>8s} {'v10a':>8s} {'v10':>8s} {'v9/b':>6s} {'v10/b':>6s} "
      f"{'v10a/v9':>7s} {'v10/v9':>7s} exact")
for (s, nb) in sorted({(s, nb) for s, nb, _ in t}):
    g = lambda v: t.get((s, nb, v), (float("nan"), None))
    (b, eb), (a9, e9), (aa, ea), (a10, e10) = g("base"), g("v9"), g("v10a"), g("v10")
    print(f"{s:26s} {nb:4d} {b:8.1f} {a9:8.1f} {aa:8.1f} {a10:8.1f} {a9 / b:6.3f} {a10 / b:6.3f} {aa / a9:7.3f} "
          f"{a10 / a9:7.3f} {all(e is not False for e in (eb, e9, ea, e10))}")
PY
echo "rc=$rc"
exit $rc
