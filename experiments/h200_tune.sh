#!/usr/bin/env bash
# One device call (H200, under 9 minutes) for issue 4's campaign: tune the batch-1 decode
# kernels of SmolLM2-135M, Gemma-3-270M and the synthetic llama3-8b Q4_K_M / Q4_0 / Q8_0 and
# llama-1b Q4_0 (tune/campaigns/h200.toml: 561 jobs, cut at TUNE_LIMIT), freeze the winners
# into tune/defaults/<device>.json, then `memra bench` tg128 of the six models with the tuned
# table and with the built-in defaults (-r 3 each; ABBA when ROUNDS >= 2).
# Budget (one call < 540 s): ~10 s set-up + <= 240 s tune + ~20 s freeze/summary + 12 bench
# runs (~15 s each for the 8B files, ~6 s the small ones: ~125 s) = ~395 s; DEADLINE guards.
#
# Run on the device from the repository root, after the real models were shipped with
# experiments/ship_models.py (carry .whl, .synthtok and the last .models/ship-NN part):
#   bash .models/ship-05/take.sh && source .whl/setup.sh && MEMRA_GIT_SHA=<sha> bash experiments/h200_tune.sh
# Without /root/models/{smollm2,gemma3}.gguf their synthetic twins (same shapes and mixes)
# stand in, and the log says so. Knobs: TUNE_LIMIT (s, 240), ROUNDS (1), DEADLINE (s, 525:
# nothing starts that could end later), SKIP_TUNE=1 (bench an existing table only), MODELS.
#
# $OUT (6 files): h200_tune.log (what ran, each step's rc, the gain table), steps.txt (every
# command's output), h200-<device>.jsonl (the receipts: commit under research/tune/),
# <device>.json (the table: commit under tune/defaults/), bench-tuned-vs-builtin.jsonl
# (commit under research/), tune-summary.txt (tune show --json, research summarize).
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
START=$SECONDS
DEADLINE=${DEADLINE:-525}
TUNE_LIMIT=${TUNE_LIMIT:-270}
ROUNDS=${ROUNDS:-1}
LOG=$OUT/h200_tune.log
STEPS=$OUT/steps.txt
BENCH=$OUT/bench-tuned-vs-builtin.jsonl
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
left() { echo $((DEADLINE - (SECONDS - START))); }
source experiments/h200_common.sh
# step NAME LIMIT CMD...: run CMD with a time limit (cut to what is left), output to steps.txt
step() {
  local name=$1 limit=$2 rc
  shift 2
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -lt 10 ]; then log "$name: skipped (deadline)"; return 124; fi
  echo "===== $name (limit ${limit}s): $*" >> "$STEPS"
  timeout "$limit" "$@" >> "$STEPS" 2>&1
  rc=$?
  log "$name rc=$rc"
  return $rc
}

M=$HOME/.cache/memra/models
mkdir -p "$M"
TOK=.synthtok/smollm2-tokenizer.gguf
if [ -f /root/models/smollm2.gguf ] && [ -f /root/models/gemma3.gguf ]; then
  ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
  ln -sf /root/models/gemma3.gguf "$M/gemma-3-270m-q4_k_m.gguf"
  SMALL="smollm2-135m gemma3-270m"
  TWINS=""
else
  SMALL="synth:smollm2-135m:Q4_1 synth:gemma3-270m:Q4_K_M"
  TWINS="smollm2-135m:Q4_1 gemma3-270m:Q4_K_M"
  log "real models missing (/root/models): synthetic twins $SMALL stand in"
fi
synthtok "$TOK" 2>/dev/null || TOK=smollm2-135m
MODELS=${MODELS:-synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0 $SMALL}
log "git ${MEMRA_GIT_SHA:-?} · models: $MODELS · synth tokenizer $TOK"

DEV=$(python3 -c "from memra import cuda; print(cuda.gpu().info.name)" 2>> "$STEPS")
SLUG=$(python3 -c "import sys; from memra.tune.tables import device_slug; print(device_slug(sys.argv[1]))" "$DEV")
RECEIPTS=research/tune/h200-$SLUG.jsonl
TABLE=tune/defaults/$SLUG.json
log "device: $DEV → receipts $RECEIPTS, table $TABLE"

# The synthetic benchmark files (GBs of random blocks) are made in the background, at low
# priority, while the campaign runs: the campaign needs only their shapes.
nice -n 15 python3 - "$TOK" $TWINS llama3-8b:Q4_K_M llama3-8b:Q4_0 llama3-8b:Q8_0 llama-1b:Q4_0 >> "$STEPS" 2>&1 <<'EOF' &
import sys, time
from memra.tune.bench import synth_model
for spec in sys.argv[2:]:
    t0 = time.time()
    print("synth", spec, synth_model(*spec.split(":"), sys.argv[1]), f"{time.time() - t0:.1f} s", flush=True)
EOF
SYNTH_PID=$!

if [ -z "${SKIP_TUNE:-}" ]; then
  MARGS=""
  for m in $MODELS; do MARGS="$MARGS -m $m"; done
  # receipts are appended one by one: a run cut by its limit still freezes what it measured
  MEMRA_LOG=info step "tune run h200" "$TUNE_LIMIT" python3 -m memra tune run h200 $MARGS --out "$RECEIPTS"
  log "receipts: $(cat "$RECEIPTS" 2>/dev/null | wc -l) lines, $(cat "$RECEIPTS" 2>/dev/null | grep -c '"ok": false') failed"
  MEMRA_LOG=info step "tune freeze" 60 python3 -m memra tune freeze "$RECEIPTS" --device "$DEV" --out-dir tune/defaults
fi
cp "$RECEIPTS" "$OUT/" 2>/dev/null
cp "$TABLE" "$OUT/$SLUG.json" 2>/dev/null
{
  echo "== memra tune show --json"
  timeout 30 python3 -m memra tune show --json
  echo "== memra research summarize $RECEIPTS"
  timeout 60 python3 -m memra research summarize "$RECEIPTS"
} > "$OUT/tune-summary.txt" 2>&1
log "tune show/summarize rc=$? ($(grep -c . "$OUT/tune-summary.txt") lines)"
[ -f "$TABLE" ] || { log "no table $TABLE: nothing to compare"; TABLE=""; }

# wait for the synthetic files (bounded by the deadline)
while kill -0 "$SYNTH_PID" 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done
kill -0 "$SYNTH_PID" 2>/dev/null && log "synth still running at the deadline margin" || log "synth files ready"

bench() {  # bench MODEL TABLE-ARG TAG
  MEMRA_LOG=info step "bench $1 $3" 120 python3 -m memra bench "$1" -p 0 -n 128 -r 3 --tune-table "$2" \
    --synth-tokenizer "$TOK" --out "$BENCH" --tag "$3"
}
if [ -n "$TABLE" ]; then
  for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
      if [ $((r % 2)) -eq 1 ]; then bench "$m" "$TABLE" tuned; bench "$m" builtin builtin
      else bench "$m" builtin builtin; bench "$m" "$TABLE" tuned; fi
    done
  done
fi

python3 - "$BENCH" <<'EOF' 2>&1 | tee -a "$LOG"
import json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    sys.exit("no bench receipts")
by = {}
for r in rows:
    if r.get("engine") == "memra" and r["test"] == "tg128":
        by.setdefault(r["model"], {}).setdefault(r["tag"], []).append(r["median_ts"])
print(f"{'model':32s} {'builtin t/s':>12s} {'tuned t/s':>10s} {'gain':>7s}  runs")
for m, d in by.items():
    b, t = d.get("builtin", []), d.get("tuned", [])
    if b and t:
        mb, mt = statistics.median(b), statistics.median(t)
        print(f"{m:32s} {mb:12.1f} {mt:10.1f} {100 * (mt / mb - 1):+6.1f}%  {len(b)}+{len(t)}")
    else:
        print(f"{m:32s} builtin {b} tuned {t}")
EOF
log "done"
