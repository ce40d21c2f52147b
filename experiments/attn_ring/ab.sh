#!/usr/bin/env bash
# The one H200 call (~1 min, no models): attn_ring against the engine's attn_decode_rope, bit for
# bit and timed (check.py), 8B / 1B / SmolLM2 shapes at 64 / 1024 / 4096 / 16384 keys.
#   source .whl/setup.sh && OUT=... bash experiments/attn_ring/ab.sh
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/../.."
timeout ${CHECK_S:-240} python3 experiments/attn_ring/check.py > "$OUT/attn-ring.jsonl" 2> "$OUT/attn-ring.err"
rc=$?
echo "check rc=$rc"; tail -5 "$OUT/attn-ring.err"
python3 - "$OUT/attn-ring.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if "arm" in r and r["arm"] != "ref":
        print(f"{r['shape']:8s} ctx {r['ctx']:6d} w{r['warps']} hpb {r['hpb']} S {r['S']:3d} {r['arm']:5s} {r['us']:8.2f} us "
              f"(ref {r['ref_us']:8.2f}) x{r['speedup']:.3f} {'exact' if r['exact'] else 'DIFFERS'}")
    elif "arm" not in r:
        print(r)
PY
exit $rc
