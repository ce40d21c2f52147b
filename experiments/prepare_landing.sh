#!/usr/bin/env bash
# The CPU half of a kernel edit's landing that an experiment prepared (its device half: the session driver's stage):
# DIR/land.py's kernels/ edits, DIR/carry-nvidia-h200.jsonl's carry records when every file they name hashes in this
# tree to their to_hash (a rehearsal made them from the commit land.py ran on), else a fresh `memra tune carry --from
# HEAD` (minutes: every measured module of a changed file compiled twice), then the freeze and `tune show` stale none.
# Leaves the tree ready to commit; the kernel-check receipt is stale until the device's.
#   bash experiments/prepare_landing.sh experiments/glu_twin     # (session 47's pdl_early landed this way)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?an experiment folder with land.py (and carry-nvidia-h200.jsonl)}
rev=$(git rev-parse HEAD)
python3 "$dir/land.py"
records="$dir/carry-nvidia-h200.jsonl"
ok=no
if [ -f "$records" ]; then
  ok=$(python3 -c "
import json, sys
from memra.gpu.compile import source_hash
recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print('yes' if recs and all(source_hash(r['src']) == r['to_hash'] for r in recs) else 'no')" "$records")
fi
if [ "$ok" = yes ]; then
  cat "$records" >> research/tune/carry-nvidia-h200.jsonl
  echo "carry: $records (every file at its to_hash)"
else
  echo "carry: no prepared records for this tree: memra tune carry --from $rev"
  python3 -m memra tune carry --from "$rev" --device "NVIDIA H200"
fi
python3 -m memra tune freeze --device "NVIDIA H200" --stand-in "NVIDIA H100 80GB HBM3" --out-dir tune/defaults --pdl \
  > /tmp/prepare-freeze.txt 2>&1 || { tail -20 /tmp/prepare-freeze.txt; exit 1; }
python3 -m memra tune show 2>&1 | grep -i "stale" | tee /tmp/prepare-stale.txt
grep -q "stale: none" /tmp/prepare-stale.txt || { echo "entries went stale: not ready"; exit 1; }
git diff --stat
echo "ready: commit, then the driver's device stage"
