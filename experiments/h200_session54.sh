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
if [ "$STAGE" = G ]; then
  if [ "${NCU:-0}" = 1 ]; then
    f=$OUT/prof-gq
    GQ_ONLY="${GQ_NCU:-1 4 8 2}" GQ_NBS=64 QF_OPS=gate_up timeout 200 ncu --clock-control none --set full \
      --import-source no -k regex:gm_qf -s 1 -c 1 -f -o $f \
      python3 experiments/f16_decode/gq_probe.py --out /dev/null --reps 3 > $f.log 2>&1
    log "ncu gq rc=$? $(el)"
    ncu -i $f.ncu-rep --page details > $f.txt 2>&1
    ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
    rm -f $f.ncu-rep; (cd $OUT && tar czf prof.tgz prof-gq.* && rm -f prof-gq.*)
  fi
  timeout 400 python3 experiments/f16_decode/gq_probe.py --out $OUT/gq.jsonl > $R/gq.txt 2>&1
  log "gq rc=$? $(el)"; tail -3 $R/gq.txt | cut -c1-300 | tee -a $R/log.txt
  python3 - $OUT/gq.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "time":
        c = r.get("config") or {}
        print(r["op"], r["nb"], r["kernel"], tuple(c.values()) if r["kernel"] != "gemm" and c else "",
              r.get("us"), r.get("gbps"), r.get("rel"), r.get("differ"), r.get("error", "")[:160])
PY
  cp $R/log.txt $OUT/log.txt
  exit 0
fi
if [ "$STAGE" = Q ]; then
  if [ "${NCU:-0}" = 1 ]; then
    f=$OUT/prof-q2
    Q2_ONLY="${Q2_NCU:-1 4 8 2 0}" Q2_NBS=64 QF_OPS=gate_up timeout 200 ncu --clock-control none --set full \
      --import-source no -k regex:qf_gemm -s 1 -c 1 -f -o $f \
      python3 experiments/f16_decode/qf2_probe.py --out /dev/null --reps 3 > $f.log 2>&1
    log "ncu q2 rc=$? $(el)"
    ncu -i $f.ncu-rep --page details > $f.txt 2>&1
    ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
    rm -f $f.ncu-rep
    f=$OUT/prof-q2mv   # the one-row kernel (a reference launch of the gate+up at one row, chains Q2_NCU_MV)
    Q2_ONLY="${Q2_NCU_MV:-2 4 1 2 0}" Q2_NBS=1 QF_OPS=gate_up timeout 200 ncu --clock-control none --set full \
      --import-source no -k regex:qf_mv -s 1 -c 1 -f -o $f \
      python3 experiments/f16_decode/qf2_probe.py --out /dev/null --reps 3 > $f.log 2>&1
    log "ncu q2mv rc=$? $(el)"
    ncu -i $f.ncu-rep --page details > $f.txt 2>&1
    ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
    rm -f $f.ncu-rep; (cd $OUT && tar czf prof.tgz prof-q2* && rm -f prof-q2*)
  fi
  timeout 480 python3 experiments/f16_decode/qf2_probe.py --out $OUT/q2.jsonl > $R/q2.txt 2>&1
  log "q2 rc=$? $(el)"; tail -3 $R/q2.txt | cut -c1-300 | tee -a $R/log.txt
  python3 - $OUT/q2.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "time":
        c = r.get("config") or {}
        print(r["op"], r["nb"], r["kernel"], tuple(c.values()) if r["kernel"] not in ("gemm", "mvt", "matvec") and c
              else "", r.get("us"), r.get("gbps"), r.get("rel"), r.get("differ"), r.get("error", "")[:160])
PY
  cp $R/log.txt $OUT/log.txt
  exit 0
fi
echo "unknown STAGE $STAGE"; exit 2
