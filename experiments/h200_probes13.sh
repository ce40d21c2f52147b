#!/usr/bin/env bash
# The four prepared probes that need no shipped model, one H200 call (~8 min), prepared in
# session 12:
#   source .whl/setup.sh && bash experiments/h200_probes13.sh        (carry .whl)
#   experiments/attn_walk/check.py  a prefill row's splits walked by one block: exact, and fast
#                                   enough at the whole group's split count? ($OUT/attn-walk.jsonl)
#   experiments/attn_rows2/check.py several rows a block with decode's bits ($OUT/attn-rows2.jsonl)
#   experiments/persist/probe.py    a launch boundary against a grid barrier ($OUT/persist.jsonl)
#   experiments/gemm_ablate/ab.sh   gemm.cu with parts of a unit's work taken out ($OUT/ablate-*)
#   ncu of one decode row's attention at depth 4096 (8B, SmolLM2; attn_prefill_probe --rows 1)
#                                   outside any graph ($OUT/ncu-attn-*.txt, per-line counters .src.csv.gz)
set -u
: "${OUT:?}"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/probes.log; }
timeout 150 python3 experiments/attn_walk/check.py > $OUT/attn-walk.jsonl 2> $OUT/attn-walk.err
log "attn_walk rc=$? exact $(grep -c '"exact": true' $OUT/attn-walk.jsonl) of $(wc -l < $OUT/attn-walk.jsonl)"
timeout 60 python3 experiments/persist/probe.py > $OUT/persist.jsonl 2> $OUT/persist.err
log "persist rc=$? $(wc -l < $OUT/persist.jsonl) lines"
timeout 200 python3 experiments/attn_rows2/check.py > $OUT/attn-rows2.jsonl 2> $OUT/attn-rows2.err
log "attn_rows2 rc=$? exact $(grep -c '"exact": true' $OUT/attn-rows2.jsonl) of $(wc -l < $OUT/attn-rows2.jsonl)"
bash experiments/gemm_ablate/ab.sh 2>&1 | tee -a $OUT/probes.log
for m in llama3-8b smollm2; do
  timeout 90 ncu --clock-control none -k regex:attn_decode --launch-count 1 --set full --import-source no \
    -o /tmp/ncu-$m python3 experiments/attn_prefill_probe.py $m --rows 1 --depth 4096 --hpb 1 --once > /dev/null 2>&1
  ncu --import /tmp/ncu-$m.ncu-rep --page details > $OUT/ncu-attn-$m.txt 2>&1
  ncu --import /tmp/ncu-$m.ncu-rep --page source --csv 2>/dev/null | gzip > $OUT/ncu-attn-$m.src.csv.gz
  log "ncu attention $m: $(grep -E 'Duration|DRAM Throughput' $OUT/ncu-attn-$m.txt | tr -s ' ' | tr '\n' ' ')"
done
tail -n 3 $OUT/*.err | tee -a $OUT/probes.log
# a call returns at most 8 files: everything in one archive, the log beside it
( cd $OUT && tar czf /tmp/probes13.tgz --exclude probes13.tgz . ) && find $OUT -mindepth 1 -delete \
  && mv /tmp/probes13.tgz $OUT/ && tar xzf $OUT/probes13.tgz -C $OUT ./probes.log
