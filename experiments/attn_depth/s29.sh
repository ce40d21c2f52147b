#!/usr/bin/env bash
# Session 29's probe of the engine's own decode-attention configuration at depth (one H200 call, ~2 min,
# no models): the 8B (whole GQA group a block, 33 splits) and SmolLM2 (hpb 3, 88 splits) at 64 .. 16,384
# keys through probe.py --cases, then ncu's stall summary of the 8B at 4,096 keys.
#   source .whl/setup.sh && OUT=... bash experiments/attn_depth/s29.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
C=8B:64:8:64:4:33,8B:1024:8:64:4:33,8B:4096:8:64:4:33,8B:4096:8:64:4:66,8B:4096:4:64:4:33,8B:16384:8:64:4:33
C=$C,SmolLM2:64:8:64:3:88,SmolLM2:1024:8:64:3:88,SmolLM2:4096:8:64:3:88,SmolLM2:4096:4:64:3:88
timeout 150 python3 experiments/attn_depth/probe.py --cases $C --out "$OUT/attn-depth-s29.jsonl" 2>&1 | tail -12
SECS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
timeout 100 ncu --clock-control none -k regex:attn_decode --launch-skip 2 --launch-count 1 $SECS \
  python3 experiments/attn_depth/probe.py --ncu-one 4096:8:64:4:33 > "$OUT/attn-ncu-s29.txt" 2>&1
echo "ncu rc=$?"
grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|No Eligible|Issued Ipc|Stall|Waves|Block Limit" "$OUT/attn-ncu-s29.txt" | head -30
