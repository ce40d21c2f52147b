#!/usr/bin/env bash
# The 2..128-row matvec paths on the H200 (issue 10 item 4, issue 11's c = 8), two calls, each
# carrying .whl after the real models are shipped (.models/ship-NN: their shapes are read from
# their files); copy $OUT's receipts and table into the tree between the calls (the second
# reads the first's table) and after them (the launch set follows the table: kernel-check
# must run on it next, e.g. experiments/h200_session9.sh STAGE=kc):
#   source .whl/setup.sh && STAGE=mvt bash experiments/h200_dispatch.sh        # ~4 min
#   source .whl/setup.sh && STAGE=dispatch bash experiments/h200_dispatch.sh   # ~4 min
# mvt: the h200-mvt campaign (tune/campaigns/h200-mvt.toml), freeze; dispatch: `memra tune
# dispatch` (mv_q8 / mvt / GEMM per shape at rows 1..64 and 128, each with the table's
# configuration), freeze, `memra tune show`.
set -u
: "${OUT:?}" "${STAGE:?}"
source experiments/h200_common.sh
stage_begin h200d
MODELS="-m smollm2-135m -m gemma3-270m -m synth:llama-1b:Q4_0 -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0"
if [ "$STAGE" = mvt ]; then
  F=research/tune/h200-mvt-nvidia-h200.jsonl
  timeout 500 python3 -m memra tune run h200-mvt $MODELS --resume --out $F > $R/tune.txt 2>&1
else
  F=research/tune/h200-dispatch-nvidia-h200.jsonl
  timeout 500 python3 -m memra tune dispatch $MODELS --resume --out $F > $R/tune.txt 2>&1
fi
log "$STAGE rc=$? $(tail -1 $R/tune.txt) $(el)"
freeze_show "$STAGE"
grep -E "^│ (mvt|dispatch)" "$R/show-$STAGE.txt" | head -60 >> $R/log.txt
cp $F tune/defaults/nvidia-h200.json $OUT/
tar czf $OUT/h200d-$STAGE.tgz -C /tmp h200d-$STAGE
