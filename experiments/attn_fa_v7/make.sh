#!/usr/bin/env bash
# make.sh OUT: kernels/attn_fa.cu with attn_fa.patch applied (v7; -DFA_V8=1 selects v8), written to OUT
# (a .cu file outside kernels/: fa_check --src / sass_loops.py take it; its includes resolve to kernels/).
# Landing it instead: git apply experiments/attn_fa_v7/attn_fa.patch (then a full kernel-check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels" && cp "$root/kernels/attn_fa.cu" "$tmp/kernels/"
(cd "$tmp" && git apply "$here/attn_fa.patch")
cp "$tmp/kernels/attn_fa.cu" "${1:?usage: make.sh OUT.cu}"
