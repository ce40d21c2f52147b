#!/usr/bin/env bash
# One H200 call (~1 min, no models): attn_decode_rope at 64 .. 16,384 keys through experiments/attn_depth/probe.py —
# the engine's configuration from kernels/ (8 warps), the tensor-core body (ATT_TC 1: 4 warps, 64-key tiles) and its
# control (ATT_TC 0 at 4 warps: kernels/' code), each checked against the float64 reference (ok / max_err).
#   source .whl/setup.sh && OUT=... bash experiments/attn_tc/probe.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
E=8B:64:8:64:4:33,8B:1024:8:64:4:33,8B:4096:8:64:4:33,8B:16384:8:64:4:33,1B:4096:4:64:4:33,SmolLM2:64:8:64:3:88,SmolLM2:4096:8:64:3:88
F=8B:64:4:64:4:33,8B:1024:4:64:4:33,8B:4096:4:64:4:33,8B:16384:4:64:4:33,1B:4096:4:64:4:33,SmolLM2:64:4:64:3:88,SmolLM2:4096:4:64:3:88
for arm in ship tc1 tc0 tc1 ship; do
  case $arm in ship) a="--cases $E" ;; tc1) a="--arm attn_tc:ATT_TC=1 --cases $F" ;; tc0) a="--arm attn_tc:ATT_TC=0 --cases $F" ;; esac
  timeout 90 python3 experiments/attn_depth/probe.py $a --out "$OUT/attn-tc.jsonl" 2>&1 | grep -v "^--" | tail -8
done
