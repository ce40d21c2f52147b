#!/usr/bin/env bash
# Session 55's device calls: kernels/qf.cu landed behind MEMRA_DECODE=qf (memra.gpu.ops.qf, the planner's generated
# rows), its kernel-check and GPU tests, and the serve A/B that decides it. The real models no longer travel (the
# tracked tree is 44 MB of the 64 MiB a call carries): kernel-check builds their launch cases from their exported
# specs (here: python3 -m memra kernel-check --export-specs .models/specs.json; MEMRA_MODEL_SPECS).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && RES_DIR=<date>-session55 STAGE=C \
#     bash experiments/h200_session55.sh                  (carry .whl, .synthtok, .models/specs.json)
# STAGE C (~6 min): the synthetic 8B made in the background (for STAGE A), kernel-check --add-to the committed
#   receipt (the qf family whole: a new kernel source; every other family's new launch cases), then the qf GPU
#   tests (tests/test_qf.py: the GPU suite's other files need the real models); $OUT: the receipt (nvidia-h200.json), kernel-check.txt.gz, gpu-tests.txt, log.txt.
# STAGE CA: C then A in one call (A's arms in what is left of A_END = 560 s); C_TESTS=0 leaves the GPU tests out.
# STAGE A (~6 min, the machine still warm: the 8B made there is reused): `memra bench serve` of the synthetic 8B
#   Q4_K_M at c = 1, 8, 64 (~100-token prompts, 128 tokens) with MEMRA_DECODE=q8 then qf (A_ARMS), receipts tagged
#   by arm in $OUT/serve-ab.jsonl, the cells summarized in log.txt.
set -u
source experiments/h200_common.sh
stage_begin s55
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$STAGE" = C ] || [ "$STAGE" = CA ]; then
  export MEMRA_MODEL_SPECS=.models/specs.json
  ( nice -n 10 bash -c "source experiments/h200_common.sh; synth llama3-8b Q4_K_M $TOK" > /root/synth-8b.txt 2>&1 ) &
  # (h200_common's kernel_check, without its --status: that fetches the real models, which this machine cannot)
  mkdir -p $R/kernel-check
  timeout ${KC_LIMIT:-300} python3 -m memra kernel-check --out $R/kernel-check/ \
    --add-to research/kernel-check/nvidia-h200.json > $R/kernel-check.txt 2>&1
  log "kernel-check rc=$? $(tail -1 $R/kernel-check.txt) $(el)"
  grep -E "^FAIL|^NOTE|not caught|^incremental" $R/kernel-check.txt | head -20 | cut -c1-300 | tee -a $R/log.txt
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null
  gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  if [ "${C_TESTS:-1}" = 1 ]; then
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_qf.py > $R/gpu-tests.txt 2>&1
    log "qf gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
    cp $R/gpu-tests.txt $OUT/
  fi
  cp $R/log.txt $OUT/
  wait
  [ "$STAGE" = CA ] || exit 0
fi
if [ "$STAGE" = A ] || [ "$STAGE" = CA ]; then
  link_models
  log "synth: $(synth llama3-8b Q4_K_M $TOK | tail -1) $(el)"
  set -- ${A_ARMS:-q8 qf}
  for arm in "$@"; do
    # an arm's share of what is left of A_END seconds since the stage began (STAGE CA: one call for both)
    lim=$(( (${A_END:-560} - ($(date +%s) - T0)) / $# )); shift
    [ $lim -gt 60 ] || { log "serve $arm: no time left"; continue; }
    MEMRA_DECODE=$arm timeout $lim python3 -m memra bench serve synth:llama3-8b:Q4_K_M --device gpu \
      --synth-tokenizer $TOK -c ${A_C:-1,8,64} --prompt-tokens 100 --max-tokens 128 \
      --out $OUT/serve-ab.jsonl --tag "s55 MEMRA_DECODE=$arm" > $R/serve-$arm.txt 2>&1
    log "serve $arm rc=$? $(el)"; tail -6 $R/serve-$arm.txt | cut -c1-200 | tee -a $R/log.txt
  done
  python3 - $OUT/serve-ab.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("tag"), r.get("engine"), "c=%s" % r.get("concurrency"), "agg %.1f t/s" % r.get("agg_tok_s", 0),
          "TPOT p50 %s" % r.get("tpot_p50_s"), "TTFT p95 %s" % r.get("ttft_p95_s"), r.get("seams"))
PY
  cp $R/log.txt $OUT/
  exit 0
fi
echo "unknown STAGE $STAGE"; exit 2
