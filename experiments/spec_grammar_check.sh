#!/usr/bin/env bash
# Speculative decoding under a JSON schema on the GPU (issue 13): `memra run --spec lookup` with
# --json-schema must give plain constrained decoding's tokens, greedy and seeded; prints one
# line per case: identical?, the spec stats, and the two decode speeds. MODEL (default
# smollm2-135m).
set -u
M=${MODEL:-smollm2-135m}; D=$(mktemp -d)
python3 -c "import json,sys; sys.path.insert(0,'experiments'); from structured_speed import NESTED; json.dump(NESTED, open('$D/s.json','w'))"
for args in "--temp 0" "--temp 0.9 --seed 7"; do
  python3 -m memra run $M -p "Write one order as JSON:" -n 160 --json-schema $D/s.json $args --json > $D/a.json 2> $D/a.err
  python3 -m memra run $M -p "Write one order as JSON:" -n 160 --json-schema $D/s.json $args --spec lookup --json > $D/b.json 2> $D/b.err
  python3 - "$D" "$args" <<'PY'
import json, sys
d, args = sys.argv[1], sys.argv[2]
a, b = (json.load(open(f"{d}/{n}.json")) for n in "ab")
print(f"spec+schema [{args}]: identical={a['tokens'] == b['tokens']} n={len(a['tokens'])} spec={b['spec']} "
      f"decode tok/s plain {a['decode_tok_s']:.1f} spec {b['decode_tok_s']:.1f} n_forced {a.get('n_forced')}/{b.get('n_forced')}")
PY
done
