#!/usr/bin/env bash
# The dispatch table on the H200 (issue 10 item 4): `memra tune dispatch` over the benchmark
# models (every q8 matvec shape, the three paths at rows 1..64 and 128, each with the table's
# configuration), freeze into tune/defaults, `memra tune show`; the receipts and the table to
# $OUT (copy both into the tree before the next call: the launch set follows the table, so
# kernel-check must run on it next, e.g. experiments/h200_session9.sh STAGE=kc). Carries .whl
# (and .models/ship-NN done before: the real models' shapes are read from their files).
#   source .whl/setup.sh && bash experiments/h200_dispatch.sh
set -u
: "${OUT:?}"
STAGE=dispatch
source experiments/h200_common.sh
stage_begin dispatch
timeout 480 python3 -m memra tune dispatch -m smollm2-135m -m gemma3-270m -m synth:llama-1b:Q4_0 \
  -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 \
  --out research/tune/h200-dispatch-nvidia-h200.jsonl > $R/dispatch.txt 2>&1
log "dispatch rc=$? $(tail -1 $R/dispatch.txt) $(el)"
python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$?"
python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
grep -E "dispatch" $R/show.txt | head -40 | tee -a $R/log.txt
cp research/tune/h200-dispatch-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $OUT/
tar czf $OUT/dispatch.tgz -C /tmp dispatch-dispatch
