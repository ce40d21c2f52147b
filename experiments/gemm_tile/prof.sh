#!/usr/bin/env bash
# One H200 call (carry .whl; `source .whl/setup.sh` first): ncu counters (--set full, stall reasons,
# per-SASS-instruction samples) of the tile prototype and kernels/gemm.cu's glu GEMM (prof.py), then
# the GT_ABL ablations' timings. Outputs under $OUT: ncu-details.txt, ncu-sass-*.csv.gz, ablate.txt.
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.." || exit 2
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 150 "$NCU" --clock-control none --profile-from-start off --set full --import-source no \
  -o /tmp/gemm-prof -f python3 experiments/gemm_tile/prof.py > $OUT/ncu-run.txt 2>&1
echo "ncu rc=$?"; tail -5 $OUT/ncu-run.txt
"$NCU" -i /tmp/gemm-prof.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
"$NCU" -i /tmp/gemm-prof.ncu-rep --page raw --csv 2>/dev/null | gzip > $OUT/ncu-raw.csv.gz
for i in 1 2 3 4; do
  "$NCU" -i /tmp/gemm-prof.ncu-rep --page source --csv --print-source sass --launch-skip $((i - 1)) --launch-count 1 \
    2>&1 | gzip > $OUT/ncu-sass-$i.csv.gz
done
ls -la $OUT
grep -E "^  [a-z_]+.*\(|Duration|Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers Per|Stall|No Eligible|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu-details.txt | head -80
timeout 120 python3 experiments/gemm_tile/prof.py --ablate > $OUT/ablate.txt 2>&1
echo "ablate rc=$?"; cat $OUT/ablate.txt | tail -12
