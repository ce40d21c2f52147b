#!/usr/bin/env bash
# Session 54's device calls: the qf arithmetic at 8..64 rows (experiments/f16_decode/mv_qf.cu's gm_qf, v13).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=G bash experiments/h200_session54.sh
# carry .whl. STAGE G (~2 min, no models): experiments/f16_decode/gq_probe.py — gm_qf against the engine's q8 kernel
#   (mvt at 8 rows, gemm.cu at 64) on the 8B's Q4_K shapes, its bits against mv_qf's one-row launches of every
#   activation row (GQ_NBS rows: 8,64); $OUT/gq.jsonl -> research/<date>-session54/gq/. NCU=1 adds ncu's full set of
#   one gm_qf launch (GQ_NCU "C W NT ST", the gate+up at 64 rows), packed into $OUT/prof.tgz.
# STAGE Q (~3 min, no models): experiments/f16_decode/qf2_probe.py — experiments/f16_decode/qf.cu (v14: one-row
#   and GEMM kernels) against the engine's q8 kernel at 1 / 8 / 64 rows (Q2_NBS) on the 8B's Q4_K shapes, bits against the
#   one-row launches; $OUT/q2.jsonl. NCU=1 adds ncu's full set of one qf_gemm launch (Q2_NCU "C W NT ST KS", the
#   gate+up at 64 rows) and of one qf_mv launch (Q2_NCU_MV, the gate+up at one row), packed into $OUT/prof.tgz.
set -u
source experiments/h200_common.sh
stage_begin s54
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
# ncu_probe NAME REGEX SCRIPT [VAR=VALUE ...]: ncu's full set of the first launch whose kernel matches REGEX in
# experiments/f16_decode/SCRIPT run with that environment: $OUT/NAME.txt (details), .csv (the source page), .log
ncu_probe() {
  local name=$1 re=$2 py=$3 f=$OUT/$1; shift 3
  env "$@" timeout 200 ncu --clock-control none --set full --import-source no -k regex:$re -s 1 -c 1 -f -o $f \
    python3 experiments/f16_decode/$py --out /dev/null --reps 3 > $f.log 2>&1
  log "ncu $name rc=$? $(el)"
  ncu -i $f.ncu-rep --page details > $f.txt 2>&1
  ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
  rm -f $f.ncu-rep
}
# probe_run SCRIPT NAME LIMIT: experiments/f16_decode/SCRIPT -> $OUT/NAME.jsonl, its time records summarized into
# the log (a configuration's values where the kernel is not one of the engine's), the log copied to $OUT
probe_run() {
  timeout $3 python3 experiments/f16_decode/$1 --out $OUT/$2.jsonl > $R/$2.txt 2>&1
  log "$2 rc=$? $(el)"; tail -3 $R/$2.txt | cut -c1-300 | tee -a $R/log.txt
  python3 - $OUT/$2.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "time":
        c = r.get("config") or {}
        print(r["op"], r["nb"], r["kernel"], tuple(c.values()) if r["kernel"] not in ("gemm", "mvt", "matvec") and c
              else "", r.get("us"), r.get("gbps"), r.get("rel"), r.get("differ"), r.get("error", "")[:160])
PY
  cp $R/log.txt $OUT/log.txt
}
if [ "$STAGE" = G ]; then
  if [ "${NCU:-0}" = 1 ]; then
    ncu_probe prof-gq gm_qf gq_probe.py GQ_ONLY="${GQ_NCU:-1 4 8 2}" GQ_NBS=64 QF_OPS=gate_up
    (cd $OUT && tar czf prof.tgz prof-gq.* && rm -f prof-gq.*)
  fi
  probe_run gq_probe.py gq 400
  exit 0
fi
if [ "$STAGE" = Q ]; then
  if [ "${NCU:-0}" = 1 ]; then
    ncu_probe prof-q2 qf_gemm qf2_probe.py Q2_ONLY="${Q2_NCU:-1 4 8 2 0}" Q2_NBS=64 QF_OPS=gate_up
    # the one-row kernel: a reference launch of the gate+up at one row (chains Q2_NCU_MV)
    ncu_probe prof-q2mv qf_mv qf2_probe.py Q2_ONLY="${Q2_NCU_MV:-2 4 1 2 0}" Q2_NBS=1 QF_OPS=gate_up
    (cd $OUT && tar czf prof.tgz prof-q2* && rm -f prof-q2*)
  fi
  probe_run qf2_probe.py q2 480
  exit 0
fi
echo "unknown STAGE $STAGE"; exit 2
