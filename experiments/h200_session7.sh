#!/usr/bin/env bash
# Session 7 (2026-12-01) H200 calls, after SmolLM2 was shipped (bash .models/sm-a/take.sh and
# .models/sm-b/take.sh, one call each; .whl and .synthtok carried by this one).
#   STAGE=prefill  pp512 with the prefill graphs and with MEMRA_PREFILL_GRAPH=0 (SmolLM2, the 1B
#                  Q4_0, the 8B Q4_K_M), then memra profile --prefill of a 128-row chunk at depth
#                  384 (the last chunk of pp512) of each
# Results tarred into $OUT/s7-$STAGE.tgz.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
: "${OUT:?}" "${STAGE:?}"
R=/tmp/s7-$STAGE; mkdir -p $R
source experiments/h200_common.sh
log() { echo "[$(date +%T)] $*" | tee -a $R/log.txt; }
link_models
TOK=.synthtok/smollm2-tokenizer.gguf
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
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
fi
tar czf $OUT/s7-$STAGE.tgz -C /tmp s7-$STAGE
