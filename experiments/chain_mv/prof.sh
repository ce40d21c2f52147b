#!/usr/bin/env bash
# ncu of chain_mv (CONFIG, default nw8) and mv_q8 on SHAPE (default 4096x4096), one launch each,
# per-instruction stall samples; ~1 min on the H200, no models.
#   source .whl/setup.sh && OUT=... bash experiments/chain_mv/prof.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
mkdir -p /tmp/cm-ncu
SECS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters"
for k in chain_mv mv_q8; do
  n=${CONFIG:-nw8}-${SHAPE:-4096x4096}-$k
  timeout 120 ncu --clock-control none -k regex:"^$k\$" --launch-skip 2 --launch-count 1 $SECS --import-source yes \
    -o /tmp/cm-ncu/$n -f python3 experiments/chain_mv/prof.py --config ${CONFIG:-nw8} --shape ${SHAPE:-4096x4096} \
    > /tmp/cm-ncu/$n.run.txt 2>&1
  echo "ncu $k rc=$?"; tail -2 /tmp/cm-ncu/$n.run.txt
  ncu --import /tmp/cm-ncu/$n.ncu-rep --page details > /tmp/cm-ncu/$n.txt 2>&1
  ncu --import /tmp/cm-ncu/$n.ncu-rep --page source --csv --print-source sass > /tmp/cm-ncu/$n.src.csv 2>&1
  rm -f /tmp/cm-ncu/$n.ncu-rep
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Issued Ipc|Waves Per SM" /tmp/cm-ncu/$n.txt | head -10
done
tar czf "$OUT/chain-mv-ncu.tgz" -C /tmp cm-ncu
