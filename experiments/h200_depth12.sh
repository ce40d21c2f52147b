#!/usr/bin/env bash
# Decode attention at depth, before changing it (issue 14 item 3), on synthetic files only (no
# shipped models): what the split count and the heads per block buy, one call.
#   source .whl/setup.sh && bash experiments/h200_depth12.sh      (carry .whl, .synthtok)
# Per model: tg128 from depth 0 on the plan's grid and on MEMRA_ATT_SPLITS=1 (the same bits:
# tg128 from depth 0 never passes 128 keys, one split), then pp512 + tg128 at depth 4096 on
#   plan   the table (hpb 1) and its split count default_splits(n_head / 1)
#   S      hpb 1, MEMRA_ATT_SPLITS = default_splits(n_kv) (the whole group's count)
#   group  a copy of the table whose attn_decode entries take the whole GQA group (hpb =
#          n_gqa), which gives that split count by itself
# Receipts (each with its seam) in $OUT/depth.jsonl, log in $OUT/depth.log.
NAME=depth
source experiments/h200_synth_bench.sh
python3 - <<'PY'
import json
t = json.load(open("tune/defaults/nvidia-h200.json"))
for k, v in t["entries"]["attn_decode"].items():
    kv = dict(x.split("=") for x in k.split(","))
    for e in v.values():
        e["config"]["hpb"] = int(kv["n_head"]) // int(kv["n_head_kv"])
json.dump(t, open("/tmp/t-group.json", "w"))
PY
for spec in "synth:llama3-8b:Q4_K_M 33" "synth:smollm2-135m:Q4_1 88" "synth:llama-1b:Q4_0 33" "synth:gemma3-270m:Q4_K_M 256"; do
  set -- $spec; m=$1; S=$2
  bench d0-plan $m -p 0 -n 128 -r 3
  MEMRA_ATT_SPLITS=1 bench d0-S1 $m -p 0 -n 128 -r 3
  bench d4096-plan $m -p 512 -n 128 -d 4096 -r 3
  MEMRA_ATT_SPLITS=$S bench d4096-S$S $m -p 512 -n 128 -d 4096 -r 3
  bench d4096-group $m -p 512 -n 128 -d 4096 -r 3 --table /tmp/t-group.json
done
log done
