# Sourced by the H200 drivers (experiments/h200_*.sh); needs their log function and $OUT.
# link_models [WHY]: the real models shipped to /root/models (experiments/ship_models.py:
# smollm2.gguf, gemma3.gguf) under the cache names their aliases resolve to, so nothing is
# fetched; with WHY, a missing one is logged as a warning saying what it breaks.
link_models() {
  local M=$HOME/.cache/memra/models f
  mkdir -p "$M"
  [ -f /root/models/smollm2.gguf ] && ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f /root/models/gemma3.gguf ] && ln -sf /root/models/gemma3.gguf "$M/gemma-3-270m-q4_k_m.gguf"
  [ -n "${1:-}" ] || return 0
  for f in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
    [ -f "$M/$f" ] || log "WARNING: $M/$f missing: $1 (ship the models first)"
  done
}
# synthtok FILE: make the tokenizer-only GGUF that synthetic models copy (SmolLM2's tokenizer,
# no tensors) unless it is there; made on this machine before a device call with
#   python3 -m memra synth .synthtok/smollm2-tokenizer.gguf --tokenizer-only
# and carried (.synthtok), or made on the device when the smollm2-135m alias is cached there.
synthtok() {
  [ -f "$1" ] && return 0
  mkdir -p "$(dirname "$1")"
  python3 -m memra synth "$1" --tokenizer-only --tokenizer-from smollm2-135m > /dev/null
}
# breakdown MODELS LIMIT LOGFILE: `memra profile` (the launch plan's per-kernel breakdown) of
# one decode step at a 64-token context for each comma-separated model — llama-1b and
# llama3-8b name their synthetic Q4_0 / Q4_K_M files, others are aliases — its JSON appended
# to $OUT/profile.jsonl and its table to LOGFILE.
breakdown() {
  local models=$1 limit=$2 logfile=$3 spec
  for m in ${models//,/ }; do
    case $m in llama-1b) spec=synth:llama-1b:Q4_0 ;; llama3-8b) spec=synth:llama3-8b:Q4_K_M ;; *) spec=$m ;; esac
    log "profile $spec"
    timeout "$limit" python3 -m memra profile "$spec" --depth 64 --synth-tokenizer "${TOK:-smollm2-135m}" --json \
      >> "$OUT/profile.jsonl" 2>> "$logfile"
    log "profile rc=$?"
  done
}
# stage_begin PREFIX: a session driver's prelude after `source`: checks OUT and STAGE, makes the
# stage folder R=/tmp/PREFIX-$STAGE, defines log (to R/log.txt) and el (seconds since the
# start), links the shipped models and sets TOK (the synthetic models' tokenizer GGUF)
stage_begin() {
  export PYTHONUNBUFFERED=1 COLUMNS=200
  : "${OUT:?}" "${STAGE:?}"
  R=/tmp/$1-$STAGE; mkdir -p "$R"
  log() { echo "[$(date +%T)] $*" | tee -a "$R/log.txt"; }
  T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
  link_models
  TOK=.synthtok/smollm2-tokenizer.gguf
  trap pack_out EXIT
}
# pack_out: at most 8 files come back from $OUT (the device tool's limit; session 58 lost a call's serve receipts,
# kernel-check receipt and table to it): more are packed into $OUT/out.tgz (unpack it here) when the stage exits
pack_out() {
  [ "$(find "$OUT" -type f | wc -l)" -le 8 ] && return 0
  tar -C "$OUT" -czf /tmp/out-pack.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/out-pack.tgz "$OUT/out.tgz"
}
# kernel_check: memra kernel-check over the launch set at this tree, its receipt under
# $R/kernel-check/ (and $OUT/), the failures and missed canaries and `--status` of that receipt logged
kernel_check() {
  mkdir -p "$R/kernel-check"
  # KC_ADD=<receipt>: only the launch cases that receipt lacks (memra kernel-check --add-to; the
  # kernel sources unchanged since it)
  timeout ${KC_LIMIT:-200} python3 -m memra kernel-check --out "$R/kernel-check/" ${KC_ADD:+--add-to "$KC_ADD"} \
    > "$R/kernel-check.txt" 2>&1
  log "kernel-check rc=$? $(tail -1 "$R/kernel-check.txt") $(el)"
  grep -E "^FAIL|MISSED|canary.*not caught" "$R/kernel-check.txt" | head -20 | tee -a "$R/log.txt"
  python3 -m memra kernel-check --status --out "$R/kernel-check/nvidia-h200.json" | tail -2 | tee -a "$R/log.txt"   # the status, and a warning of table entries no launch runs
  cp "$R/kernel-check/nvidia-h200.json" "$OUT/" 2>/dev/null   # the receipt and the log come back
  gzip -c "$R/kernel-check.txt" > "$OUT/kernel-check.txt.gz"
}
# gpu_tests END: the GPU tests (pytest -m gpu) in what is left of END seconds since the stage
# began (at least 20), their summary, failures and 15 slowest tests logged (the suite takes
# ~190 s, a tenth of a session's device time: the durations say where)
gpu_tests() {
  local left=$(( $1 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  # GPU_TESTS_EXTRA: more pytest arguments (e.g. --ignore of a file a serve_evidence call already ran)
  timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${GPU_TESTS_EXTRA:-} tests > $R/gpu-tests.txt 2>&1
  log "gpu tests rc=$? $(tail -1 $R/gpu-tests.txt) $(el)"; grep -E "^(FAILED|ERROR)" $R/gpu-tests.txt | head | tee -a $R/log.txt
}
# vs_runs LLAMA_BENCH "MODEL [ARGS]"...: `memra bench MODEL ARGS -p 512 -n 128 --vs llama.cpp` of each (an item's
# words after the model are its own arguments, e.g. "synth:llama3-8b:Q4_K_M -d 4096"); receipts in $R/bench-vs.jsonl
# (copied to $OUT after each), one log per item, the gate and the cells in $R/log.txt
vs_runs() {
  local lb=$1 m f
  shift
  for m in "$@"; do
    f=$(echo "$m" | tr ': ' '__')
    timeout 170 python3 -m memra bench $m -p 512 -n 128 --vs llama.cpp --llama-bench "$lb" --synth-tokenizer $TOK \
      --out $R/bench-vs.jsonl > $R/bench-$f.txt 2>&1
    log "bench $m rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-$f.txt | tail -8 | tee -a $R/log.txt
    cp $R/bench-vs.jsonl $OUT/ 2>/dev/null
  done
}
# bench_vs_llamacpp LLAMA_BENCH: vs_runs of every benchmark model, then the 8B Q4_K_M and SmolLM2 at depth 4096
bench_vs_llamacpp() {
  vs_runs "$1" smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 \
    synth:llama3-8b:Q8_0 "synth:llama3-8b:Q4_K_M -d 4096" "smollm2-135m -d 4096"
}
# llamacpp_vs "MODEL [ARGS]"...: llama.cpp built in the call (carry .llamacpp; experiments/llamacpp_bin.sh unpacks
# .llamacpp-bin instead when an earlier call packed the binaries, and packs them into $OUT when it builds), then
# vs_runs of the items
llamacpp_vs() {
  timeout 360 bash experiments/llamacpp_bin.sh > $R/llamacpp-build.txt 2>&1
  log "llama.cpp build rc=$? $(el)"; tail -1 $R/llamacpp-build.txt | tee -a $R/log.txt
  vs_runs /root/llama.cpp/build/bin/llama-bench "$@"
}
# depth_vs: llamacpp_vs of issue 14's decode cells at and beside depth (the 8B at 0 and 4,096, SmolLM2 at 4,096 and
# 0, the 1B), or of $MODELS when set; five cells fit one call with the build
depth_vs() {
  if [ -n "${MODELS:-}" ]; then llamacpp_vs $MODELS
  else llamacpp_vs synth:llama3-8b:Q4_K_M "synth:llama3-8b:Q4_K_M -d 4096" "smollm2-135m -d 4096" smollm2-135m \
    synth:llama-1b:Q4_0; fi
}
# arm_run TAG JSONL CMD...: one run of CMD (`python3 -m memra bench ...`, an experiment's ab.py bench ...) with
# the synthetic tokenizer, TAG and receipts in $R/JSONL; its pp / tg lines and gates logged, a failure's log kept
# in $OUT (session 30 lost one: the arms shared a log file)
arm_run() {
  local tag=$1 out=$2 rc
  shift 2
  timeout 90 "$@" --synth-tokenizer $TOK --tag "$tag" --out "$R/$out" > $R/arm.txt 2>&1
  rc=$?; log "$tag rc=$rc $(el)"
  grep -E "^gate|^memra .*(pp512|tg128)" $R/arm.txt | cut -c1-160 | tee -a $R/log.txt
  [ $rc = 0 ] || { tail -25 $R/arm.txt | tee -a $R/log.txt; cp $R/arm.txt "$OUT/fail-$(echo "$tag" | tr ' :/' '___').txt"; }
}
# bench_arms VAR "V1 V2 .." JSONL MODEL.. -- BENCH-ARGS..: arm_run of `memra bench` of each model with VAR set to
# each value in turn (arms alternating when the list repeats), receipts in $R/JSONL (copied to $OUT)
bench_arms() {
  local var=$1 vals=$2 out=$3 m v models=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=("$1"); shift; done
  shift
  for m in "${models[@]}"; do
    for v in $vals; do arm_run "$m $var=$v" "$out" env "$var=$v" python3 -m memra bench "$m" "$@"; done
  done
  cp "$R/$out" $OUT/
}
# env_arms JSONL LIMIT "MODEL BENCH-ARGS.." ARM..: arm_run of `memra bench MODEL BENCH-ARGS` once per ARM (VAR=VALUE
# set for that run, or "table": nothing set), the list twice over (arms alternating), while less than LIMIT seconds
# have passed since the stage began; receipts in $R/JSONL (copied to $OUT)
env_arms() {
  local out=$1 lim=$2 cmd=$3 a
  shift 3
  for a in "$@" "$@"; do
    [ $(( $(date +%s) - T0 )) -lt $lim ] || break
    if [ "$a" = table ]; then arm_run "$cmd table" "$out" python3 -m memra bench $cmd
    else arm_run "$cmd $a" "$out" env "$a" python3 -m memra bench $cmd; fi
  done
  cp "$R/$out" $OUT/ 2>/dev/null
}
# freeze_show TAG: `memra tune freeze --pdl` of the H200 receipts into tune/defaults, then `memra tune
# show`; their output in $R/freeze-TAG.txt and $R/show-TAG.txt, the stale list logged
# tune_campaign NAME LIMIT_S MODEL-ARGS...: `memra tune run NAME --resume` within LIMIT_S seconds,
# receipts appended to research/tune/NAME-nvidia-h200.jsonl (TUNE_OUT=<file>: there instead, e.g. an
# A/B that is not a table's campaign), its output in $R/tune-NAME.txt
tune_campaign() {
  local name=$1 lim=$2; shift 2
  timeout $lim python3 -m memra tune run $name "$@" --resume \
    --out "${TUNE_OUT:-research/tune/$name-nvidia-h200.jsonl}" > $R/tune-$name.txt 2>&1
  log "tune $name rc=$? $(tail -1 $R/tune-$name.txt) $(el)"
}
# attn_land TAG KC_LIMIT: an attention.cu change's landing after the kernel edit is committed (models shipped): the h200
# campaign's attn_decode jobs (LAND_KERNELS=k1,k2: those kernels' jobs instead) (the table's entries went stale with the source), freeze_show TAG, the new
# receipts and table to $OUT, then the kernel-check cases the committed receipt lacks
attn_land() {
  link_models "kernel-check's launch set and the campaign's real models need them"
  tune_campaign h200 200 -m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 \
    --kernels ${LAND_KERNELS:-attn_decode}
  freeze_show $1
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-nvidia-h200.jsonl $OUT/tune/; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=$2 kernel_check
}
# serve_build_start / serve_build_wait: llama.cpp (llama-server) and the served 8B built in the
# background (experiments/h200_serve.sh STAGE=build) while the call does other work
serve_build_start() {
  ( OUT=$R STAGE=build nice -n 10 bash experiments/h200_serve.sh > $R/serve-build.txt 2>&1 ) &
  BUILD=$!
}
serve_build_wait() {
  wait $BUILD; log "serve build: $(tail -2 $R/serve-build.log 2>/dev/null | tr '\n' ' ') $(el)"
}
# serve_evidence: experiments/h200_serve.sh STAGE=evidence (the serve GPU tests, `memra bench serve
# --vs` llama-server at c = 1 / 8 / 32 / 64; needs serve_build in this call or the one before)
serve_evidence() {
  OUT=$R STAGE=evidence bash experiments/h200_serve.sh > $R/serve-evidence.txt 2>&1
  log "serve evidence rc=$? $(el)"; tail -8 $R/serve-evidence.log | tee -a $R/log.txt
  cp $R/serve-bench.jsonl $OUT/ 2>/dev/null
}
# synth SHAPE QUANT TOKENIZER: the path of the synthetic model (memra.tune.bench.synth_model; made once)
synth() { python3 -c "import sys; from memra.tune.bench import synth_model; print(synth_model(sys.argv[1], sys.argv[2], sys.argv[3]))" "$@"; }
# greedy_ids_arms VAR "V0 V1" RUNNER SHAPE QUANT: 64 greedy ids of the synthetic SHAPE QUANT model from
# `python3 RUNNER run` (an experiment's ab.py, or "-m memra") with VAR set to V0, then V1 (values may be paths:
# the files are named by the arm's index), compared (SAME / DIFFER) in the log
greedy_ids_arms() {
  local var=$1 vals=$2 runner=$3 m v i=0
  m=$(synth "$4" "$5" "$TOK" | tail -1)
  for v in $vals; do
    env "$var=$v" timeout 60 python3 $runner run "$m" -p "The history of the" -n 64 --temp 0 --ignore-eos --json \
      2> "$R/run-$var-$i.err" | tail -1 > "$R/run-$var-$i.json"
    i=$((i + 1))
  done
  log "$var $vals, 64 greedy ids: $(python3 -c "import json,sys; a,b=(json.load(open(f))['tokens'] for f in sys.argv[1:]); print('SAME' if a==b and len(a)==64 else 'DIFFER', len(a), len(b))" "$R/run-$var-0.json" "$R/run-$var-1.json" 2>&1 | tail -1)"
}
# the benchmark models of the campaigns and the dispatch (memra tune run / dispatch -m ...)
MALL="-m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
# dispatch_freeze LIMIT_S N: `memra tune dispatch --resume` of $MALL within LIMIT_S seconds (appending to
# research/tune/h200-dispatch-nvidia-h200.jsonl; a later call resumes it), then freeze_show N
dispatch_freeze() {
  timeout $1 python3 -m memra tune dispatch $MALL --resume \
    --out research/tune/h200-dispatch-nvidia-h200.jsonl >> $R/tune-dispatch.txt 2>&1
  log "tune dispatch rc=$? $(tail -1 $R/tune-dispatch.txt) $(el)"
  freeze_show $2
}
# overlay NAME MODEL RULE...: experiments/engine_tune's candidate table $OV/NAME-<model>/ (the rules' defines over the
# model's decode-step entries), logged
overlay() {
  local name=$1 m=$2
  shift 2
  python3 experiments/engine_tune/tune.py overlay $OV $name-${m//:/_} $m "$@" 2>&1 | tee -a $R/log.txt
}
# choice_ab NAME END "MODEL=ARMS"...: engine choices by the engine's own tg128 (experiments/engine_tune): each
# model's arms in turn (shipped: the shipped table; else $OV/<arm>-<model>/nvidia-h200.json, an overlay candidate;
# a repeated list alternates them), `memra bench MODEL -p 0 -n 128 -r 3` each, until END seconds into the stage;
# receipts in $R/NAME.jsonl, copied to $RES/ (the records' evidence) and $OUT/; then each model's best candidate that
# gains in every pass becomes engine-choice records, the freeze, and the table and the records to $OUT/.
choice_ab() {
  local name=$1 end=$2 spec m a best cands
  shift 2
  for spec in "$@"; do
    m=${spec%%=*}
    for a in ${spec#*=}; do
      [ $(( $(date +%s) - T0 )) -lt $end ] || break
      if [ $a = shipped ]; then arm_run "$m shipped" $name.jsonl python3 -m memra bench $m -p 0 -n 128 -r 3
      else arm_run "$m $a" $name.jsonl python3 -m memra bench $m -p 0 -n 128 -r 3 \
        --tune-table $OV/$a-${m//:/_}/nvidia-h200.json
      fi
    done
  done
  cp $R/$name.jsonl $RES/ && cp $R/$name.jsonl $OUT/
  python3 experiments/engine_tune/tune.py report $OV $RES/$name.jsonl | tee -a $R/log.txt
  for spec in "$@"; do
    m=${spec%%=*}
    cands=$(for a in ${spec#*=}; do [ $a = shipped ] || echo "$a-${m//:/_}"; done | sort -u)
    best=$(python3 experiments/engine_tune/tune.py best $OV $RES/$name.jsonl $cands)
    log "$m: best candidate '${best:-none}'"
    [ -n "$best" ] && python3 experiments/engine_tune/tune.py choice $OV $best \
      research/tune/engine-choices-nvidia-h200.jsonl $RES/$name.jsonl 2>&1 | tee -a $R/log.txt
  done
  freeze_show $name
  mkdir -p $OUT/defaults $OUT/tune; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  cp research/tune/engine-choices-nvidia-h200.jsonl $OUT/tune/
}
freeze_show() {
  # --pdl: the shipped table adopts the PDL-timed receipts of research/tune/ (tune/defaults/README.md)
  python3 -m memra tune freeze --device "NVIDIA H200" --stand-in "NVIDIA H100 80GB HBM3" --out-dir tune/defaults --pdl > "$R/freeze-$1.txt" 2>&1; log "freeze rc=$?"
  python3 -m memra tune show > "$R/show-$1.txt" 2>&1; log "show: $(grep -i stale "$R/show-$1.txt" | head -3)"
}
