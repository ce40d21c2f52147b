#!/usr/bin/env bash
# attn_fa's prefill packing with FA_ILP (the scores' mma issued k-step by k-step across the 8
# accumulators, the row maxima as trees), alone and with FA_BTS (experiments/attn_fa_bts), on the H200:
# bits against the stock kernel (fa_check: every shape, split 256 and 4096), timing alternating with
# the stock file (512 rows, depth 0 and 4096, split 4096, 4 warps), ncu (stall reasons) at depth 4096.
#   source .whl/setup.sh >/dev/null && bash experiments/attn_fa_ilp/run.sh     # $OUT set
set -u
: "${OUT:?set OUT}"
R=/tmp/fa-ilp; mkdir -p $R
cd "$(dirname "$0")/../.."
V=experiments/attn_fa_ilp/build/attn_fa_ilp.cu   # kernels/attn_fa.cu + attn_fa_ilp.patch
python3 experiments/kernel_edit.py attn_fa.cu experiments/attn_fa_ilp/attn_fa_ilp.patch $V || exit 1
for arm in ilp ilpbts; do
  def=""; [ $arm = ilpbts ] && def="--define FA_BTS=1"
  for sp in 256 4096; do
    timeout 150 python3 experiments/attn_mma/fa_check.py --src $V $def --split $sp --no-timing > $R/check-$arm-$sp.txt 2>&1
    echo "$arm check split $sp rc=$? $(tail -1 $R/check-$arm-$sp.txt)"
  done
  OUT=$R timeout 200 python3 experiments/attn_mma/fa_check.py --src $V $def --split 4096 --warps 4 --rows 512 --no-checks \
    --shapes llama3-8b,llama-1b,smollm2 --modes prefill:0,prefill:4096 > $R/time-$arm.txt 2>&1
  echo "$arm timing rc=$?"; grep fa-time $R/time-$arm.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(' ', r['shape'], r['depth'], 'stock', r['us_stock'], 'variant', r['us_variant'], 'x', r['speedup_vs_stock'])"
done
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
mkdir -p $R/ncu
for arm in ilp; do
  timeout 200 ncu --clock-control none -k regex:'^attn_fa$' --launch-count 1 $SECS -o $R/ncu/$arm -f \
    python3 experiments/attn_mma/fa_check.py --src $V --no-checks --once --shapes llama3-8b --modes prefill:4096 \
    --split 4096 --warps 4 --rows 512 > $R/ncu/$arm.run.txt 2>&1
  echo "ncu $arm rc=$?"
  ncu --import $R/ncu/$arm.ncu-rep --page details > $R/ncu/$arm.txt 2>&1
  ncu --import $R/ncu/$arm.ncu-rep --page raw > $R/ncu/$arm.raw.txt 2>&1; rm -f $R/ncu/$arm.ncu-rep
  grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio " $R/ncu/$arm.raw.txt | sort -k3 -g -r | head -8
  grep -E "Duration|Issue Slots Busy|Executed Instructions  " $R/ncu/$arm.txt | head -6
done
tar czf $OUT/fa-ilp.tgz -C /tmp fa-ilp
