#!/usr/bin/env bash
# kernels/matvec.cu before MV_PRELOAD, for ab.py's control arm (build/ is git-ignored: the device call carries it)
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p build
git show 9ae5df0:kernels/matvec.cu > build/matvec_base.cu
