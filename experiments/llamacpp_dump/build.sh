#!/bin/sh
# Builds libdump.so against the llama.cpp headers in xllamacpp's sdist (the source of the
# installed wheel) and links it to the wheel's own xllamacpp.abi3.so.
#   XSRC=/tmp/xsrc/xllamacpp-2026.10.11549 sh experiments/llamacpp_dump/build.sh
set -e
here=$(cd "$(dirname "$0")" && pwd)
XSRC=${XSRC:-/tmp/xsrc/xllamacpp-2026.10.11549}
LC=$XSRC/thirdparty/llama.cpp
SO=$(python -c "import xllamacpp, os; print(os.path.dirname(xllamacpp.__file__))")
gcc -O1 -shared -fPIC -I"$LC/include" -I"$LC/ggml/include" "$here/dump.c" \
    -L"$SO" -l:xllamacpp.abi3.so -Wl,-rpath,"$SO" -Wl,--allow-shlib-undefined -o "$here/libdump.so"
echo "$here/libdump.so"
