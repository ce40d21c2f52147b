#!/usr/bin/env bash
# One H200 call (~2 min, no models): attn_decode_rope at depth through experiments/attn_depth/probe.py, the
# control (the build copy at ATT_MERGE_MJ 0: kernels/attention.cu's SASS) and ATT_MERGE_MJ 16 alternating;
# the check's output bits compared case by case (same seed, same order).
#   source .whl/setup.sh && OUT=... bash experiments/attn_merge/ab.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
C=${CASES:-8B:1024:8:64:4:33,8B:4096:8:64:4:33,8B:16384:8:64:4:33,1B:4096:4:64:4:33,SmolLM2:1024:8:64:3:88,SmolLM2:4096:8:64:3:88}
for mj in ${ARMS:-0 16 0 16}; do
  timeout 60 python3 experiments/attn_depth/probe.py --arm attn_merge:ATT_MERGE_MJ=$mj --cases $C --out "$OUT/attn-merge.jsonl" 2>&1 | grep -v "^--" | tail -8
done
python3 - "$OUT/attn-merge.jsonl" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault((r["shape"], r["ctx"], r["ATT_WARPS"], r["hpb"], r["splits"]), {}).setdefault(r.get("ATT_MERGE_MJ", r.get("merge_mj")), []).append(r)
for k, arms in by.items():
    a = arms.get(0, [])
    for mj, b in sorted(arms.items()):
        if mj and a and b:
            ua, ub = statistics.median(x["us"] for x in a), statistics.median(x["us"] for x in b)
            same = len({x["out_sha"] for x in a + b}) == 1
            print(f"{k} MJ {mj}: {ua:.2f} -> {ub:.2f} us ({100 * (ub / ua - 1):+.1f} %) bits {'SAME' if same else 'DIFFER'} "
                  f"ok {all(x['ok'] for x in a + b)}")
PY
