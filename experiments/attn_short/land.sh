#!/usr/bin/env bash
# The CPU half of landing attn_short.cu in kernels/ and taking MV_TWIN's dead entry out of kernels/matvec.cu
# (session 49 had no device machine for the kernel-check either needs). Run at a session's start, commit, then the
# device call that ends with `kernel-check --add-to` (experiments/h200_session49.sh STAGE s) makes the receipt current.
#   bash experiments/attn_short/land.sh     (~4 min: the carry compiles matvec.cu's modules twice)
# After it, edit the two comments that say the kernel sits under experiments/ (memra/gpu/ops/attention.py above
# SHORT_FILE, docs/FLAGS.md's MEMRA_ATT_SWITCH0 row).
set -eu
cd "$(dirname "$0")/../.."
git diff --quiet HEAD -- kernels memra/gpu/ops/attention.py || { echo "land.sh: kernels/ or attention.py has uncommitted changes"; exit 1; }
git mv experiments/attn_short/attn_short.cu kernels/attn_short.cu
sed -i 's|^SHORT_FILE = "../experiments/attn_short/attn_short.cu"$|SHORT_FILE = "attn_short.cu"|' memra/gpu/ops/attention.py
grep -q '^SHORT_FILE = "attn_short.cu"$' memra/gpu/ops/attention.py || { echo "land.sh: SHORT_FILE not rewritten"; exit 1; }
git show 3a92430:kernels/matvec.cu > kernels/matvec.cu   # matvec.cu without mv_q8_glu_twin (78d4201cb5b5e40c)
python3 -m memra tune carry --from HEAD
python3 -m memra tune freeze --device "NVIDIA H200" --stand-in "NVIDIA H100 80GB HBM3" --out-dir tune/defaults --pdl > /dev/null
python3 -m memra tune show | grep -i stale
git diff --stat
