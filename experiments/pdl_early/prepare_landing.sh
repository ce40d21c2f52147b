#!/usr/bin/env bash
# The CPU half of the early trigger's landing (experiments/h200_session47.sh STAGE E runs the device half):
# land.py's kernel edits, session 46's carry records (or a fresh `memra tune carry` when kernels/ moved since),
# the freeze, and the checks. Leaves the tree ready to commit; the kernel-check receipt is stale until STAGE E's.
#   bash experiments/pdl_early/prepare_landing.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=$(git rev-parse HEAD)
python3 experiments/pdl_early/land.py
want=$(python3 -c "import json; print(' '.join(json.loads(l)['src'] + '=' + json.loads(l)['to_hash'] for l in open('experiments/pdl_early/carry-nvidia-h200.jsonl')))")
have=$(python3 -c "
from memra.gpu.compile import source_hash
print(' '.join(f + '=' + source_hash(f) for f in ('matvec.cu', 'norm.cu')))")
if [ "$want" = "$have" ]; then
  cat experiments/pdl_early/carry-nvidia-h200.jsonl >> research/tune/carry-nvidia-h200.jsonl
  echo "carry: session 46's records ($have)"
else
  echo "carry: kernels/ moved since session 46 ($want -> $have): memra tune carry --from $rev"
  python3 -m memra tune carry --from "$rev" --device "NVIDIA H200"
fi
python3 -m memra tune freeze --device "NVIDIA H200" --stand-in "NVIDIA H100 80GB HBM3" --out-dir tune/defaults --pdl \
  > /tmp/prepare-freeze.txt 2>&1 || { tail -20 /tmp/prepare-freeze.txt; exit 1; }
python3 -m memra tune show 2>&1 | grep -i "stale" | tee /tmp/prepare-stale.txt
grep -q "stale: none" /tmp/prepare-stale.txt || { echo "entries went stale: not ready"; exit 1; }
git diff --stat
echo "ready: commit, then ship the models and run STAGE E"
