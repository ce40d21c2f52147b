#!/usr/bin/env bash
# MV_L2ALL on the H200 (experiments/mv_l2all/make.py): tg128 of the 8B Q8_0 and the 1B Q4_0 with
# kernels/matvec.cu as committed, then with the edit applied to this device copy of the tree,
# both arms on the built-in configurations (--tune-table builtin: the edit makes the table's
# matvec entries stale, so the tuned arm would not be comparable). ~4 min with the synthetic
# models' generation. $OUT/mv-l2all.jsonl (bench receipts marked with seams {experiment:
# mv_l2all}: they stay off the boards), $OUT/mv-l2all.log.
#   source .whl/setup.sh && bash experiments/mv_l2all/ab.sh
set -u
: "${OUT:?}"
TOK=.synthtok/smollm2-tokenizer.gguf
cp kernels/matvec.cu /tmp/matvec.cu.orig   # put back at the end: later steps of the call use it
for arm in base l2all; do
  [ $arm = l2all ] && python3 experiments/mv_l2all/make.py kernels/matvec.cu
  for m in synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0; do
    timeout 200 python3 -m memra bench $m -p 0 -n 128 -r 5 --tune-table builtin --synth-tokenizer $TOK \
      --tag mv_l2all-$arm --out $OUT/mv-l2all-raw.jsonl >> $OUT/mv-l2all.log 2>&1
    echo "$arm $m rc=$?"; grep -E "tg128" $OUT/mv-l2all.log | tail -1
  done
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "mv-l2all-raw.jsonl").read_text().splitlines() if l.strip()]
with (out / "mv-l2all.jsonl").open("w") as f:
    for r in rows:
        r["seams"] = {**(r.get("seams") or {}), "experiment": "mv_l2all", "tune_table": "builtin"}
        f.write(json.dumps(r) + "\n")
PY
rm -f $OUT/mv-l2all-raw.jsonl
cp /tmp/matvec.cu.orig kernels/matvec.cu
