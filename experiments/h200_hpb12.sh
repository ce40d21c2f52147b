#!/usr/bin/env bash
# Decode attention at depth 4096 with the heads per block changed and the split count held (the
# plan's, so every row's bits are the plan's): does a bit-neutral, depth-chosen hpb pay?
#   source .whl/setup.sh && bash experiments/h200_hpb12.sh      (carry .whl, .synthtok)
# Per model, pp512 + tg128 at depth 4096 (-r 3): plan (the table: one head a block), then tables
# whose attn_decode entries take hpb heads, with MEMRA_ATT_SPLITS = the plan's count (9 for the
# 8B and 1B, 30 for SmolLM2). Receipts in $OUT/hpb.jsonl, log $OUT/hpb.log.
NAME=hpb
source experiments/h200_synth_bench.sh
for h in 2 3 4; do
  python3 - "$h" <<'PY'
import json, sys
h = int(sys.argv[1])
t = json.load(open("tune/defaults/nvidia-h200.json"))
for e in t["entries"]["attn_decode"].values():
    for v in e.values():
        v["config"]["hpb"] = h
json.dump(t, open(f"/tmp/t-hpb{h}.json", "w"))
PY
done
for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0; do
  bench plan $m -p 512 -n 128 -d 4096 -r 3
  MEMRA_ATT_SPLITS=9 bench hpb2-S9 $m -p 512 -n 128 -d 4096 -r 3 --table /tmp/t-hpb2.json
  MEMRA_ATT_SPLITS=9 bench hpb4-S9 $m -p 512 -n 128 -d 4096 -r 3 --table /tmp/t-hpb4.json
done
bench plan synth:smollm2-135m:Q4_1 -p 512 -n 128 -d 4096 -r 3
MEMRA_ATT_SPLITS=30 bench hpb3-S30 synth:smollm2-135m:Q4_1 -p 512 -n 128 -d 4096 -r 3 --table /tmp/t-hpb3.json
log done
