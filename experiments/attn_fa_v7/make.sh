#!/usr/bin/env bash
# make.sh OUT: kernels/attn_fa.cu with landing.patch's kernel part applied (attn_fa v8), written to OUT
# (a .cu file outside kernels/: fa_check --src / sass_loops.py take it; its includes resolve to kernels/).
# Landing it instead: git apply experiments/attn_fa_v7/landing.patch (then a full kernel-check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels" && cp "$root/kernels/attn_fa.cu" "$tmp/kernels/"
(cd "$tmp" && git apply --include=kernels/attn_fa.cu "$here/landing.patch")
cp "$tmp/kernels/attn_fa.cu" "${1:?usage: make.sh OUT.cu}"
