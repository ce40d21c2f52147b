#!/usr/bin/env bash
# attn_fa's prefill packing with the next tile's scores under this tile's softmax (FA_PIPE), on the H200:
# bits against the stock kernel (fa_check: every shape, split 256 and 4096), then timing alternating
# with the stock file (512 rows, depth 0 and 4096, the engine's split 4096 and 4 warps; also 8 warps),
# and ncu of both at depth 4096 on the 8B shape.
#   source .whl/setup.sh >/dev/null && bash experiments/attn_fa_pipe/run.sh     # $OUT set
set -u
: "${OUT:?set OUT}"
R=/tmp/fa-pipe; mkdir -p $R
cd "$(dirname "$0")/../.."
V=experiments/attn_fa_pipe/build/attn_fa_pipe.cu   # kernels/attn_fa.cu + attn_fa_pipe.patch
python3 experiments/kernel_edit.py attn_fa.cu experiments/attn_fa_pipe/attn_fa_pipe.patch $V || exit 1
for sp in 256 4096; do
  timeout 150 python3 experiments/attn_mma/fa_check.py --src $V --split $sp --no-timing > $R/check-$sp.txt 2>&1
  echo "check split $sp rc=$? $(tail -1 $R/check-$sp.txt)"
done
for w in 4 8; do
  OUT=$R timeout 200 python3 experiments/attn_mma/fa_check.py --src $V --split 4096 --warps $w --rows 512 --no-checks \
    --shapes llama3-8b,llama-1b,smollm2 --modes prefill:0,prefill:4096 > $R/time-w$w.txt 2>&1
  echo "timing warps $w rc=$?"; grep fa-time $R/time-w$w.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(' ', r['shape'], r['depth'], 'stock', r['us_stock'], 'pipe', r['us_variant'], 'x', r['speedup_vs_stock'])"
done
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
mkdir -p $R/ncu
for arm in stock pipe; do
  src=""; [ $arm = pipe ] && src="--src $V"
  timeout 200 ncu --clock-control none -k regex:'^attn_fa$' --launch-count 1 $SECS -o $R/ncu/$arm -f \
    python3 experiments/attn_mma/fa_check.py $src --no-checks --once --shapes llama3-8b --modes prefill:4096 \
    --split 4096 --warps 4 --rows 512 > $R/ncu/$arm.run.txt 2>&1
  echo "ncu $arm rc=$?"
  ncu --import $R/ncu/$arm.ncu-rep --page details > $R/ncu/$arm.txt 2>&1; rm -f $R/ncu/$arm.ncu-rep
  grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|L2 Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|No Eligible|Active Warps Per Scheduler|Eligible Warps" $R/ncu/$arm.txt | head -14
done
cp $R/time-w*.txt $OUT/ 2>/dev/null
tar czf $OUT/fa-pipe.tgz -C /tmp fa-pipe
