# Sourced by the H200 drivers (experiments/h200_*.sh); needs their log function and $OUT.
# synthtok FILE: make the tokenizer-only GGUF that synthetic models copy (SmolLM2's tokenizer,
# no tensors) unless it is there; made on this machine before a device call with
#   python3 -m memra synth .synthtok/smollm2-tokenizer.gguf --tokenizer-only
# and carried (.synthtok), or made on the device when the smollm2-135m alias is cached there.
synthtok() {
  [ -f "$1" ] && return 0
  mkdir -p "$(dirname "$1")"
  python3 -m memra synth "$1" --tokenizer-only --tokenizer-from smollm2-135m > /dev/null
}
# breakdown MODELS LIMIT LOGFILE TAIL: per-kernel breakdown of one decode step at a 64-token
# context for the comma-separated MODELS (experiments/gpu_engine_check.py), its table's last
# TAIL lines appended to LOGFILE.
breakdown() {
  local models=$1 limit=$2 logfile=$3 tail=$4
  log "breakdown $models"
  timeout "$limit" python3 experiments/gpu_engine_check.py run --steps bench --limits bench="$limit" \
    --bench-budget $((limit - 25)) --only-bench "$models" --configs q8:pdl --breakdown --breakdown-depth 64 \
    > /dev/null 2>&1
  log "breakdown rc=$?"
  python3 experiments/gpu_engine_check.py table 2>&1 | tail -"$tail" >> "$logfile"
}
