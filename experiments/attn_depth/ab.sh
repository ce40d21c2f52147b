#!/usr/bin/env bash
# One H200 call (~2-3 min, no models): the depth sweep (probe.py), then ncu on the 8B's
# attention at 4096 keys, one head a block (the table's config) and the whole group a block.
#   source .whl/setup.sh && OUT=... bash experiments/attn_depth/ab.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
timeout ${SWEEP_S:-150} python3 experiments/attn_depth/probe.py --out "$OUT/attn-depth.jsonl" > "$OUT/attn-depth.txt" 2>&1
echo "sweep rc=$?"; tail -4 "$OUT/attn-depth.txt"
mkdir -p /tmp/attn-ncu
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters"
for c in ${NCU_CASES:-4096:8:64:1:9 4096:8:64:4:9}; do
  n=$(echo $c | tr : _)
  timeout 120 ncu --clock-control none -k regex:attn_decode --launch-skip 2 --launch-count 1 $SECS --import-source yes \
    -o /tmp/attn-ncu/$n -f python3 experiments/attn_depth/probe.py --ncu-one $c > /tmp/attn-ncu/$n.run.txt 2>&1
  echo "ncu $c rc=$?"; tail -2 /tmp/attn-ncu/$n.run.txt
  ncu --import /tmp/attn-ncu/$n.ncu-rep --page details > /tmp/attn-ncu/$n.txt 2>&1
  ncu --import /tmp/attn-ncu/$n.ncu-rep --page source --csv --print-source sass > /tmp/attn-ncu/$n.src.csv 2>&1
  rm -f /tmp/attn-ncu/$n.ncu-rep
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Issued Ipc" /tmp/attn-ncu/$n.txt | head -12
done
tar czf "$OUT/attn-ncu.tgz" -C /tmp attn-ncu
