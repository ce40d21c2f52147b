#!/usr/bin/env bash
# Session 7 (2026-12-01) H200 calls, after SmolLM2 was shipped (bash .models/sm-a/take.sh and
# .models/sm-b/take.sh, one call each; .whl and .synthtok carried by this one).
#   STAGE=prefill  pp512 with the prefill graphs and with MEMRA_PREFILL_GRAPH=0 (SmolLM2, the 1B
#                  Q4_0, the 8B Q4_K_M), then memra profile --prefill of a 128-row chunk at depth
#                  384 (the last chunk of pp512) of each
#   STAGE=tune     (after the seven .models/ship-NN/take.sh calls) the h200-gemm-small campaign
#                  (SmolLM2 and Gemma-3 shapes), memra tune freeze into tune/defaults, memra tune
#                  show, kernel-check over the new launch set with its receipt and --status; the
#                  campaign's receipts also kept in /tmp/s7-keep for STAGE=bench
#   STAGE=bench    the same freeze again from /tmp/s7-keep (the tree's copy of the table is the
#                  committed one), pp512 (SmolLM2, Gemma-3, the 1B, the 8B Q4_K_M / Q4_0 / Q8_0),
#                  tg128 batch 1 (the same six), memra profile --prefill of SmolLM2 and Gemma-3,
#                  every GPU test
#   STAGE=fa       experiments/attn_mma/fa_check.py (the tensor-core attention experiment: bits of
#                  prefill packing = decode packing, values, timing against attn_decode), then
#                  pp512 + tg128 of the 1B and the 8B Q4_K_M on this tree
# Results tarred into $OUT/s7-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s7
if [ "$STAGE" = prefill ]; then
  for m in smollm2-135m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    f=$(echo $m | tr : _)
    for pg in 1 0; do
      MEMRA_PREFILL_GRAPH=$pg timeout 150 python3 -m memra bench $m -p 512 -n 0 --synth-tokenizer $TOK \
        --tag MEMRA_PREFILL_GRAPH=$pg --out $R/bench-pp512.jsonl > $R/pp512-$f-$pg.txt 2>&1
      log "pp512 $m graph=$pg rc=$? $(el)"; grep pp512 $R/pp512-$f-$pg.txt | tail -1 | tee -a $R/log.txt
    done
    timeout 120 python3 -m memra profile $m --prefill --rows 128 --depth 384 --synth-tokenizer $TOK --json \
      >> $R/profile-prefill.jsonl 2> $R/profile-prefill-$f.txt
    log "profile prefill $m rc=$? $(el)"; tail -30 $R/profile-prefill-$f.txt | tee -a $R/log.txt
  done
elif [ "$STAGE" = tune ]; then
  mkdir -p /tmp/s7-keep
  timeout 360 python3 -m memra tune run h200-gemm-small -m smollm2-135m -m gemma3-270m \
    --out research/tune/h200-gemm-small-nvidia-h200.jsonl > $R/tune.txt 2>&1
  log "tune rc=$? $(tail -1 $R/tune.txt) $(el)"
  cp research/tune/h200-gemm-small-nvidia-h200.jsonl /tmp/s7-keep/
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  cp research/tune/h200-gemm-small-nvidia-h200.jsonl tune/defaults/nvidia-h200.json $R/
  kernel_check
elif [ "$STAGE" = fa ]; then
  OUT=$R timeout 300 python3 experiments/attn_mma/fa_check.py > $R/fa-check.txt 2>&1
  log "fa_check rc=$? $(tail -1 $R/fa-check.txt) $(el)"; grep -v '^{' $R/fa-check.txt | tail -20 | tee -a $R/log.txt
  python3 - $R/fa-check.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print({k: r[k] for k in r if k not in ("kind",)})
PY
  for m in synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M; do
    f=$(echo $m | tr : _)
    timeout 150 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK --out $R/bench.jsonl > $R/bench-$f.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "pp512|tg128" $R/bench-$f.txt | tail -2 | tee -a $R/log.txt
  done
elif [ "$STAGE" = bench ]; then
  cp /tmp/s7-keep/h200-gemm-small-nvidia-h200.jsonl research/tune/
  python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults > $R/freeze.txt 2>&1; log "freeze rc=$? $(tail -1 $R/freeze.txt)"
  python3 -m memra tune show > $R/show.txt 2>&1; log "show: $(grep -i stale $R/show.txt | head -3)"
  for m in smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0; do
    f=$(echo $m | tr : _)
    timeout 150 python3 -m memra bench $m -p 512 -n 128 --synth-tokenizer $TOK --out $R/bench.jsonl > $R/bench-$f.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "pp512|tg128" $R/bench-$f.txt | tail -2 | tee -a $R/log.txt
  done
  for m in smollm2-135m gemma3-270m; do
    f=$(echo $m | tr : _)
    timeout 120 python3 -m memra profile $m --prefill --rows 128 --depth 384 --synth-tokenizer $TOK --json \
      >> $R/profile-prefill.jsonl 2> $R/profile-prefill-$f.txt
    log "profile prefill $m rc=$? $(el)"; tail -14 $R/profile-prefill-$f.txt | tee -a $R/log.txt
  done
  timeout $(( 580 - ($(date +%s) - T0) )) python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
fi
tar czf $OUT/s7-$STAGE.tgz -C /tmp s7-$STAGE
