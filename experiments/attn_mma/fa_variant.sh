#!/usr/bin/env bash
# A variant of attn_fa's prefill packing kept as experiments/attn_fa_NAME/attn_fa_NAME.patch (against
# kernels/attn_fa.cu; experiments/kernel_edit.py builds it), on the H200: bits against the stock kernel
# (fa_check: every shape, split 256 and 4096), timing alternating with the stock file (512 rows, depth 0
# and 4096, split 4096, WARPS warps: default 4), then ncu (stall reasons) of the stock kernel and the
# variant at the 8B's depth 4096. Arms: the variant as built, plus one per ARM=DEFINE[,DEFINE] argument.
#   source .whl/setup.sh >/dev/null && bash experiments/attn_mma/fa_variant.sh ilp ilpbts=FA_BTS=1   # $OUT set
# (session 25: pipe with WARPS="4 8", bts, ilp ilpbts=FA_BTS=1: research/2026-12-03-session25 §4)
set -u
: "${OUT:?set OUT}"
NAME=${1:?variant name}; shift
cd "$(dirname "$0")/../.."
R=/tmp/fa-$NAME; mkdir -p $R/ncu
V=experiments/attn_fa_$NAME/build/attn_fa_$NAME.cu
python3 experiments/kernel_edit.py attn_fa.cu experiments/attn_fa_$NAME/attn_fa_$NAME.patch $V || exit 1
for spec in "$NAME=" "$@"; do
  arm=${spec%%=*}; defs=${spec#*=}; def=""
  for d in ${defs//,/ }; do def="$def --define $d"; done
  for sp in 256 4096; do
    timeout 150 python3 experiments/attn_mma/fa_check.py --src $V $def --split $sp --no-timing > $R/check-$arm-$sp.txt 2>&1
    echo "$arm check split $sp rc=$? $(tail -1 $R/check-$arm-$sp.txt)"
  done
  for w in ${WARPS:-4}; do
    OUT=$R timeout 200 python3 experiments/attn_mma/fa_check.py --src $V $def --split 4096 --warps $w --rows 512 \
      --no-checks --shapes llama3-8b,llama-1b,smollm2 --modes prefill:0,prefill:4096 > $R/time-$arm-w$w.txt 2>&1
    echo "$arm timing warps $w rc=$?"; grep fa-time $R/time-$arm-w$w.txt | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); print(' ', r['shape'], r['depth'], 'stock', r['us_stock'], 'variant', r['us_variant'], 'x', r['speedup_vs_stock'])"
  done
done
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
for arm in stock $NAME; do
  src=""; [ $arm = stock ] || src="--src $V"
  timeout 200 ncu --clock-control none -k regex:'^attn_fa$' --launch-count 1 $SECS -o $R/ncu/$arm -f \
    python3 experiments/attn_mma/fa_check.py $src --no-checks --once --shapes llama3-8b --modes prefill:4096 \
    --split 4096 --warps 4 --rows 512 > $R/ncu/$arm.run.txt 2>&1
  echo "ncu $arm rc=$?"
  ncu --import $R/ncu/$arm.ncu-rep --page details > $R/ncu/$arm.txt 2>&1
  ncu --import $R/ncu/$arm.ncu-rep --page raw > $R/ncu/$arm.raw.txt 2>&1; rm -f $R/ncu/$arm.ncu-rep
  grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio " $R/ncu/$arm.raw.txt | sort -k3 -g -r | head -8
  grep -E "Duration|Issue Slots Busy|Executed Instructions  " $R/ncu/$arm.txt | head -6
done
tar czf $OUT/fa-$NAME.tgz -C /tmp fa-$NAME
