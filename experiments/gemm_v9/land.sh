#!/usr/bin/env bash
# Land gemm.cu variant 9 (run HERE, from the repository root, on a clean kernels/gemm.cu): the patch,
# GM_STATIC=1 made the default (every GM_WK 1 / GM_LREG >= 1 configuration; the others keep the slot
# walk), and the header's history entry given the H200 A/B of session 14
# (research/2026-12-02-session14/probes/probes14-tail.txt). Then: the gemm-small / gemm campaigns, the
# dispatch, freeze, kernel-check on the H200 (experiments/h200_session15.sh).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
patch -s -p1 < experiments/gemm_v9/gemm.patch
python3 - <<'PY'
from pathlib import Path
p = Path("kernels/gemm.cu"); s = p.read_text()
def sub(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)
sub("#ifndef GM_STATIC\n#define GM_STATIC 0\n", "#ifndef GM_STATIC\n#define GM_STATIC 1\n")
sub("configurations keep the slot walk; 0, the default, compiles exactly the slot walk)",
    "configurations keep the slot walk; the default since session 14's A/B; 0 compiles the slot walk)")
sub("//  9. (not measured yet; GM_STATIC=1, GM_WK 1 only) a static slot structure",
    "//  9. (GM_STATIC=1, the default; GM_WK 1 only) a static slot structure")
sub("""//     registers 251 -> 255, no spills: predicted -3 to -6 % at 512 rows (latency-bound).""",
    """//     registers 251 -> 255, no spills: predicted -3 to -6 % at 512 rows (latency-bound). H200
//     (session 14, research/2026-12-02-session14/probes/, 2,2,2,4,1,3,1,1 at 16 / 37 / 64 / 128 /
//     512 rows, every output bit-checked against mv_q8): v9 / base Q4_K glu 2 x 14336 x 4096
//     1.006 / 0.949 / 0.916 / 0.923 / 0.918 (512 rows 1249.2 -> 1146.7 us), Q4_K 6144 x 4096
//     0.931 / 0.947 / 0.875 / 0.920 / 0.919, Q6_K 4096 x 14336 0.951-0.955, Q4_0 4096 x 4096
//     0.887-0.950: more than predicted (the merge's MOVs and jumps were on the critical path).""")
p.write_text(s)
PY
grep -n "define GM_STATIC 1" kernels/gemm.cu
