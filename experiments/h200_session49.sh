#!/usr/bin/env bash
# The next session's device calls (prepared in session 48, research/2026-12-06-session48).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit>[+label] && STAGE=X bash experiments/h200_session49.sh
# carry .whl and .synthtok (+ .llamacpp, and .llamacpp-bin once a call has packed it, for STAGE v).
#
# STAGE a (~30 s, no models): experiments/attn_short/probe.py — v3 (a warp's p shuffled) against the engine's
#   launch per shape and depth (PROBE_CTX=160,192: those key counts instead); $OUT/attn-short.jsonl ->
#   research/<date>-session49/a/. If Gemma-3 / the 8B keep their 64-key gains and the crossover stays near 96-128
#   keys, the engine module is the next CPU work
#   (experiments/attn_short/README.md "Next").
# STAGE v (~9 min, the models shipped first): `memra bench --vs llama.cpp` of SmolLM2, Gemma-3, the 1B and the 8B
#   Q4_K_M with the tables as committed (depth 0), then the 8B Q4_0 / Q8_0 while the call's time lasts.
#   experiments/llamacpp_bin.sh builds llama.cpp once and packs its binaries into $OUT/llama-bin.tar.xz.NN: copy
#   those pieces into .llamacpp-bin/ here (git-ignored), and every later call carries them instead of building
#   (~5 min of device time saved a call). On an H200, this is issue 14's board.
# STAGE d / e / k: h200_session44.sh's (tag s49): `--vs llama.cpp` at depth, the other synthetic 8Bs, kernel-check.
# STAGE s (~8 min, models shipped): kernels/attn_short.cu in the engine (ATT_KERNEL 1), tg128 arms alternating
#   against the table: Gemma-3 with the switch's first module (MEMRA_ATT_SWITCH0=193: rows of up to 192 keys on
#   attn_short, the table's 2049-key switch above) at depth 0 and 128,
#   the 8B with attn_short as its switch's short module (MEMRA_ATT_SWITCH=129:ATT_KERNEL=1, 8 warps; 16 with
#   S_8B16=1); first
#   the device's _check_short of every candidate (attn_short against the float64 reference, fused = unfused).
#   Then experiments/attn_short/choose.py writes the winners' engine-choice records, the freeze, and kernel-check's
#   new launch cases (KC_ADD) in the same call; $OUT: bench-short.jsonl, defaults/, tune/, the kernel-check receipt.
# STAGE t (~4 min): the same for SmolLM2 and the 1B (MEMRA_ATT_SWITCH0=65 at 8 warps, SHORT_KB 2: the probe's
#   one-key gain, nothing past 64 keys).
# STAGE m (~2 min, no models): experiments/f16_decode/probe.py --mv (mv_f16.cu against mv_q8 / mvt at 1 and 8 rows,
#   its bits against gemm_f16), then --wgc (the chained wgmma GEMM against gemm.cu at 16 / 64 rows, its bits against
#   mv_f16 at the same chains); $OUT/mv-f16.jsonl, $OUT/wgc.jsonl -> research/<date>-sessionN/f16/. Session 52 put
#   perm_probe.py first ($OUT/perm.jsonl, ~10 s) and, with KC=1, the whole kernel-check before it (~1.5 min);
#   WGC=0 skips --wgc; NCU=1 adds ncu's stall reasons of one launch per NCU_CFGS configuration and of mv_q8 (~1 min).
# STAGE g (~2.5 min, no models shipped): the short form for a session with little device time: the device's
#   _check_short of SHORT_CASES and Gemma-3's 193-key candidate, then tg128 of the synthetic Gemma-3-270M
#   (plan()'s real types; the padded smollm2 tokenizer) with and without MEMRA_ATT_SWITCH0=193, alternating.
# STAGE p (~3 min, no models; session 53): ncu's full set on the q8 kernels the engine runs (probe.py --one SHAPE q8
#   --nb NB; PROF_CASES "model:op:nb ..."): per case $OUT/prof-<model>-<op>-<nb>.txt (the details page and the
#   pipes' utilization) and .csv (the source page: every SASS instruction's executions and stall samples), packed
#   into $OUT/prof.tgz.
# STAGE x (~2 min, no models; session 53): experiments/mv_stream/mvs.py — the bulk-copy streamed one-row matvec
#   against mv_q8 (bits and µs) on the 8B / 1B shapes; $OUT/mvs.jsonl. NCU=1 adds ncu's full set of one mvs launch
#   (MVS_NCU="model op W,R,S,CPS") beside mv_q8, packed into $OUT/prof.tgz.
# STAGE y (~1.5 min, no models; session 53): experiments/mv_k4bf/ab.py — the engine's mv_q8 / mvt against a copy of
#   kernels/ with the branch-free rowscal_k4, the 8B's Q4_K shapes at 1 and 8 rows, alternating; $OUT/k4bf.jsonl.
# STAGE q (~1.5 min, no models; session 53): experiments/f16_decode/qf_probe.py — mv_qf.cu (v8 / v9, the qf
#   arithmetic) against mv_q8 / mvt on the 8B's Q4_K shapes at 1 and 8 rows; $OUT/qf.jsonl. NCU=1 adds ncu's full set
#   of one v9 launch (QF_NCU "W,C,A,WA") on the 8B gate+up at one row, packed into $OUT/prof.tgz.
set -u
case "$STAGE" in a|v|s|t|g|m|p|x|y|q) ;; *) SESSION_TAG=s49 exec bash experiments/h200_session44.sh ;; esac
source experiments/h200_common.sh
stage_begin s49
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$STAGE" = a ]; then
  timeout 200 python3 experiments/attn_short/probe.py > $OUT/attn-short.jsonl 2> $R/attn-short.err
  log "attn_short probe rc=$? $(el)"; tail -5 $R/attn-short.err | tee -a $R/log.txt
  cat $OUT/attn-short.jsonl | cut -c1-220 | tee -a $R/log.txt
  exit 0
fi
# short_checks LIMIT N: on the device, _check_short of attn_short.cu's SHORT_CASES and the first N candidates below
# (Gemma-3's first, then the 8B's, SmolLM2's and the 1B's), logged, $OUT/short-check.txt
short_checks() {
  timeout $1 python3 - $2 > $R/short-check.txt 2>&1 <<'PY'
import sys
from numpy.random import default_rng
from memra.gpu.cuda import gpu
from memra.gpu.ops import attention as ATT
g, rng = gpu(), default_rng(0)
cands = [((256, 4, 1, 1, 0, 256, True, True, False), 193, {"ATT_KERNEL": 1}),
         ((256, 4, 1, 1, 0, 256, True, True, False), 193, {"ATT_KERNEL": 1, "SHORT_KB": 12, "SHORT_VB": 12}),
         ((256, 4, 1, 1, 0, 256, True, True, False), 257, {"ATT_KERNEL": 1}),
         ((128, 4, 8, 1, 0, 128, False, False, False), 129, {"ATT_KERNEL": 1}),
         ((128, 4, 8, 1, 0, 128, False, False, False), 129, {"ATT_KERNEL": 1, "ATT_WARPS": 8}),
         ((64, 3, 3, 1, 0, 64, False, False, False), 65, {"ATT_KERNEL": 1, "ATT_WARPS": 8, "SHORT_KB": 2}),
         ((64, 4, 8, 1, 0, 64, False, False, False), 65, {"ATT_KERNEL": 1, "ATT_WARPS": 8, "SHORT_KB": 2})]
for case, keys, cfg in list(ATT.SHORT_CASES) + cands[:int(sys.argv[1])]:
    o = ATT._check_short(g, rng, case, keys, cfg, T=8)
    print("OK " if o.ok else "FAIL", o.name, "|", o.detail, flush=True)
PY
  log "short checks rc=$? $(grep -c '^OK' $R/short-check.txt) ok, $(grep -c '^FAIL' $R/short-check.txt) failed"
  cut -c1-230 $R/short-check.txt | tee -a $R/log.txt; cp $R/short-check.txt $OUT/
}
if [ "$STAGE" = m ]; then
  # KC=1: first the whole kernel-check at this tree (a kernels/ edit staled the receipt; --add-to cannot extend it)
  [ "${KC:-0}" = 1 ] && KC_LIMIT=${KC_LIMIT:-200} kernel_check
  timeout 90 python3 experiments/f16_decode/perm_probe.py --out $OUT/perm.jsonl > $R/perm.txt 2>&1
  log "perm probe rc=$? $(el)"; cut -c1-260 $R/perm.txt | tail -14 | tee -a $R/log.txt
  timeout 330 python3 experiments/f16_decode/probe.py --mv --reps ${MV_REPS:-20} --out $OUT/mv-f16.jsonl \
    --limit ${MV_LIMIT:-240} > $R/mv-f16.txt 2>&1
  log "mv_f16 probe rc=$? $(el)"; grep -v '"kind": "time"' $R/mv-f16.txt | cut -c1-300 | tail -15 | tee -a $R/log.txt
  # NCU=1: ncu's warp-state, scheduler, occupancy and memory sections of one mv_f16 launch per configuration in
  # NCU_CFGS and of mv_q8 (the 8B gate+up at one row; probe.py --one), text in $OUT/ncu.txt
  if [ "${NCU:-0}" = 1 ]; then
    local_q8=mv_q8   # mv_q8 once, beside the first configuration
    for cfg in ${NCU_CFGS:-4,1,4,0,1,0,0,0 4,1,2,0,0,2,0,0}; do
      for k in mv_f16 $local_q8; do
        echo "=== $k ($cfg)" >> $OUT/ncu.txt
        timeout 120 ncu --clock-control none --section LaunchStats --section Occupancy --section SchedulerStats \
          --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:$k -s 1 -c 1 \
          python3 experiments/f16_decode/probe.py --out /dev/null --reps 3 --one 8B gate_up $cfg >> $OUT/ncu.txt 2>&1
      done
      local_q8=
    done
    log "ncu rc=$? $(el)"; grep -E "Stall|Occupancy|Issued|Eligible|Registers" $OUT/ncu.txt | head -30 | tee -a $R/log.txt
  fi
  if [ "${WGC:-1}" = 1 ]; then
    timeout 250 python3 experiments/f16_decode/probe.py --wgc --reps ${MV_REPS:-20} --out $OUT/wgc.jsonl \
      --limit ${WGC_LIMIT:-200} > $R/wgc.txt 2>&1
    log "wgc probe rc=$? $(el)"; grep -v '"kind": "time"' $R/wgc.txt | cut -c1-300 | tail -15 | tee -a $R/log.txt
  fi
  exit 0
fi
if [ "$STAGE" = p ]; then
  for case in ${PROF_CASES:-8B:gate_up:64 8B:down:64 8B:gate_up:1 8B:down:1}; do
    IFS=: read -r model op nb <<< "$case"; f=$OUT/prof-$model-$op-$nb
    timeout 150 ncu --clock-control none --set full --import-source no -k regex:'gemm|matvec|mvt|mv_q8' -s 1 -c 1 \
      --metrics regex:'sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active' -f -o $f \
      python3 experiments/f16_decode/probe.py --out /dev/null --reps 3 --one $model $op q8 --nb $nb > $f.log 2>&1
    log "ncu $case rc=$? $(el)"; tail -3 $f.log | tee -a $R/log.txt
    ncu -i $f.ncu-rep --page details > $f.txt 2>&1
    ncu -i $f.ncu-rep --page raw --csv --metrics regex:'sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active' \
      > $f-pipes.csv 2>&1
    ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
    log "$case: $(wc -c < $f.txt) / $(wc -c < $f.csv) bytes"; rm -f $f.ncu-rep
  done
  (cd $OUT && tar czf prof.tgz prof-* && rm -f prof-*.txt prof-*.csv prof-*.log)
  exit 0
fi
if [ "$STAGE" = q ]; then
  if [ "${NCU:-0}" = 1 ]; then
    f=$OUT/prof-qf
    QF_CONFIGS="${QF_NCU:-4,4,1,1,0,0,0}" QF_OPS=gate_up timeout 200 ncu --clock-control none --set full \
      --import-source no -k regex:mv_qf -s 1 -c 1 -f -o $f \
      python3 experiments/f16_decode/qf_probe.py --out /dev/null --reps 3 > $f.log 2>&1
    log "ncu qf rc=$? $(el)"
    ncu -i $f.ncu-rep --page details > $f.txt 2>&1
    ncu -i $f.ncu-rep --page source --csv --print-source sass > $f.csv 2>&1
    rm -f $f.ncu-rep; (cd $OUT && tar czf prof.tgz prof-qf.* && rm -f prof-qf.*)
  fi
  timeout 300 python3 experiments/f16_decode/qf_probe.py --out $OUT/qf.jsonl > $R/qf.txt 2>&1   # QF_SET=3: the third run
  log "qf rc=$? $(el)"
  python3 - $OUT/qf.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "time":
        print(r["op"], r["nb"], r["kernel"], tuple(r["config"].values()) if r["kernel"] == "mv_qf" else "",
              r.get("us"), r.get("rel"), r.get("differ"), r.get("differ_wa"), r.get("error", "")[:120])
PY
  exit 0
fi
if [ "$STAGE" = y ]; then
  timeout 300 python3 experiments/mv_k4bf/ab.py --out $OUT/k4bf.jsonl > $R/k4bf.txt 2>&1
  log "k4bf rc=$? $(el)"; cut -c1-300 $R/k4bf.txt | tail -12 | tee -a $R/log.txt
  exit 0
fi
if [ "$STAGE" = x ]; then
  timeout 400 python3 experiments/mv_stream/mvs.py --out $OUT/mvs.jsonl ${MVS_ARGS:-} > $R/mvs.txt 2>&1
  log "mvs rc=$? $(el)"; grep -v '"kind": "time"' $R/mvs.txt | cut -c1-300 | tail -8 | tee -a $R/log.txt
  python3 - $OUT/mvs.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") != "time" or "us" not in r:
        continue
    k = (r["model"], r["op"])
    if r["kernel"] == "mv_q8":
        best.setdefault(k, {})["q8"] = r["us"]
    elif r.get("differ") == 0 and r["us"] < best.setdefault(k, {}).get("mvs", (1e9,))[0]:
        best[k]["mvs"] = (r["us"], tuple(r["config"].values()))
    elif r.get("differ"):
        print("DIFFER", k, r["config"], r["differ"])
for k, v in best.items():
    print(k, v)
PY
  exit 0
fi
if [ "$STAGE" = g ]; then
  short_checks 60 1
  env_arms bench-short.jsonl ${S_T1:-120} "synth:gemma3-270m:Q4_K_M -p 0 -n 128 -r 3" table MEMRA_ATT_SWITCH0=193
  cp $R/log.txt $OUT/
  exit 0
fi
link_models "the real models' cells need them"
if [ "$STAGE" = s ] || [ "$STAGE" = t ]; then
  # S_CHECK=0 skips the device's _check_short of the candidates (kernel-check below checks the chosen one's cases;
  # S_T1..3=0 skip a cell: a short call's form, e.g. S_CHECK=0 S_T1=110 S_T2=0 S_T3=0 for Gemma-3 at depth 0 alone)
  [ "${S_CHECK:-1}" = 1 ] && short_checks 120 7
  RES=research/${RES_DIR:-2026-12-06-session49}/$STAGE; mkdir -p $RES   # RES_DIR: a later session's folder
  if [ "$STAGE" = s ]; then
    # S_GEMMA: Gemma-3's arms (session 50 measured 193: +8.05 % at depth 0, -0.99 % at 128; 129 keeps the depth-128
    # cell's rows of 129-192 keys on the table's module)
    env_arms bench-short.jsonl ${S_T1:-150} "gemma3-270m -p 0 -n 128 -r 3" table ${S_GEMMA:-MEMRA_ATT_SWITCH0=193}
    env_arms bench-short.jsonl ${S_T2:-260} "gemma3-270m -p 0 -n 128 -d 128 -r 3" table ${S_GEMMA:-MEMRA_ATT_SWITCH0=193}
    env_arms bench-short.jsonl ${S_T3:-400} "synth:llama3-8b:Q4_K_M -p 0 -n 128 -r 3" table \
      MEMRA_ATT_SWITCH=129:ATT_KERNEL=1,ATT_WARPS=8 ${S_8B16:+MEMRA_ATT_SWITCH=129:ATT_KERNEL=1,ATT_WARPS=16}
  else
    env_arms bench-short.jsonl 130 "smollm2-135m -p 0 -n 128 -r 3" table \
      MEMRA_ATT_SWITCH0=65:ATT_WARPS=8,SHORT_KB=2
    env_arms bench-short.jsonl 260 "synth:llama-1b:Q4_0 -p 0 -n 128 -r 3" table \
      MEMRA_ATT_SWITCH0=65:ATT_WARPS=8,SHORT_KB=2
  fi
  # the winners (every run above the median table run, depth 128 too where measured) as engine-choice records,
  # the freeze, then kernel-check's new launch cases (attn_short's per configuration and switch; matvec.cu's family
  # whole: MV_TWIN withdrawn) in one call while the machine is warm
  cp $R/bench-short.jsonl $RES/
  python3 experiments/attn_short/choose.py $RES/bench-short.jsonl $RES/bench-short.jsonl \
    research/tune/engine-choices-nvidia-h200.jsonl 2>&1 | cut -c1-400 | tee -a $R/log.txt
  freeze_show $STAGE
  mkdir -p $OUT/defaults $OUT/tune; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  cp research/tune/engine-choices-nvidia-h200.jsonl $OUT/tune/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=${KC_LIMIT:-170} kernel_check
  tar czf $OUT/s49-$STAGE.tgz -C /tmp s49-$STAGE
  exit 0
fi
llamacpp_vs smollm2-135m gemma3-270m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M
[ $(( $(date +%s) - T0 )) -lt 420 ] && vs_runs /root/llama.cpp/build/bin/llama-bench synth:llama3-8b:Q4_0
[ $(( $(date +%s) - T0 )) -lt 480 ] && vs_runs /root/llama.cpp/build/bin/llama-bench synth:llama3-8b:Q8_0
tar czf $OUT/s49-v.tgz -C /tmp s49-v
