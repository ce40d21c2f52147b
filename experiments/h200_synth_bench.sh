# Sourced by the model-free `memra bench` drivers (h200_depth12.sh, h200_hpb12.sh, h200_depth13.sh)
# after `NAME=...` on its own line: checks OUT, defines log (to $OUT/$NAME.log) and bench TAG MODEL ARGS... (one
# `memra bench` of a synthetic file, receipts appended to $OUT/$NAME.jsonl, its cells logged).
set -u
: "${OUT:?}" "${NAME:?}"
export PYTHONUNBUFFERED=1 COLUMNS=200
TOK=.synthtok/smollm2-tokenizer.gguf
T0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/$NAME.log; }
bench() {
  local tag=$1 m=$2; shift 2
  timeout 100 python3 -m memra bench $m --synth-tokenizer $TOK --out $OUT/$NAME.jsonl "$@" > /tmp/cur.txt 2>&1
  log "$tag $m rc=$? $(grep -aE 'pp512|tg128' /tmp/cur.txt | tr -s ' ' | cut -d' ' -f2- | tr '\n' ' ')"
}
