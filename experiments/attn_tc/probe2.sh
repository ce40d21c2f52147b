#!/usr/bin/env bash
# One H200 call (~3 min, no models; session 30): the tensor-core body (ATT_TC 1, 4 warps) and kernels/' body against
# the grid that feeds them: ATT_MIN_CHUNK 64 (64-key splits: twice the blocks at 4,096 keys, where 128-key chunks
# leave the 8B 256 blocks and SmolLM2 96) and more splits at 16,384 keys. Each case checked against the float64
# reference (ok / max_err), µs from experiments/attn_depth/probe.py.
#   source .whl/setup.sh && OUT=... bash experiments/attn_tc/probe2.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
P="python3 experiments/attn_depth/probe.py --out $OUT/attn-tc2.jsonl"
SHIP=8B:64:8:64:4:33,8B:4096:8:64:4:33,8B:16384:8:64:4:33,8B:16384:8:64:4:66,1B:4096:4:64:4:33,SmolLM2:4096:8:64:3:88
SHIP64=8B:4096:8:64:4:66,8B:16384:8:64:4:66,1B:4096:4:64:4:66,SmolLM2:4096:8:64:3:88
TC=8B:64:4:64:4:33,8B:4096:4:64:4:33,8B:16384:4:64:4:33,8B:16384:4:64:4:50,8B:16384:4:64:4:66,1B:4096:4:64:4:33,SmolLM2:4096:4:64:3:88
TC64=8B:1024:4:64:4:33,8B:4096:4:64:4:50,8B:4096:4:64:4:66,8B:16384:4:64:4:66,1B:4096:4:64:4:66,SmolLM2:4096:4:64:3:88
for r in 1 2; do
  timeout 80 $P --cases $SHIP 2>&1 | grep -v "^--"
  timeout 80 $P --arm attn_tc:ATT_TC=0,ATT_MIN_CHUNK=64 --cases $SHIP64 2>&1 | grep -v "^--"
  timeout 80 $P --arm attn_tc:ATT_TC=1 --cases $TC 2>&1 | grep -v "^--"
  timeout 80 $P --arm attn_tc:ATT_TC=1,ATT_MIN_CHUNK=64 --cases $TC64 2>&1 | grep -v "^--"
done
