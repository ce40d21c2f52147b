#!/usr/bin/env bash
# The next session's H200 plan (prepared in session 15). Device time ~22 of the 30 minutes:
#   STAGE=a  first, model-free (carry [".whl"]; `source .whl/setup.sh` first): the prototypes' A/Bs,
#            each its own script with its own time limit and checks (research/2026-12-02-session15/
#            says why these): experiments/gemm_tile2/ab.sh (Q4_K: fragments prefetched, raw weights
#            by cp.async, free and exact-chain formulas; <= 85 s), experiments/gemm_tile2_q6k/ab.sh
#            and experiments/gemm_tile2_q40/ab.sh (the same design for Q6_K, Q4_0 / Q8_0; <= 60 s
#            each, if they exist), experiments/chain_mv/ab.sh (a decode matvec in the chain order,
#            against mv_q8; <= 55 s). ~4-5 min. Their JSONL + the logs' tgz come back (<= 8 files).
#            (Rehearsed here on the mock device: MOCK=1 LIMIT_S=500 AB_LIMIT=600 OUT=/tmp/x STAGE=a: all
#            four rc 0, their JSONL back.) HERE: commit the JSONL under research/2026-12-NN-session16/ and compare with each
#            README's prediction before anything else; a second A/B round of a prototype fits.
#   Then the q8_0 KV cache (issue 14 item 4), whose GPU patch still applies (checked in session
#   15 at b2b31b4: tests/test_kvq8*.py, the emulated engine / runner / launch-set / split tests: 111 passed, only the receipt test red, as a kernel change makes it):
#      HERE: git apply experiments/kvq8/gpu.patch; python3 -m memra kernel-check --compile-only
#            --arch sm_90a --only attention,rope,attn_fa; the default pytest; commit.
#      The six .models/ship-NN calls (research/ moved out of the tree while they run).
#   STAGE=k  (carry [".whl", ".synthtok", ".llamacpp"]) llama.cpp built in the background; the h200
#            campaign --kernels attn_decode,rope_norm_kv (the entries the patch stales, ~20 s),
#            freeze (stale list empty), kernel-check (the q8_0 checks and canary 4 must run), the GPU
#            tests. ~6 min. HERE: copy $OUT's table / receipts into the tree, commit.
#   STAGE=m  the q8_0 gate and step 4's measurements: `memra run -ctk q8_0 -ctv q8_0` greedy on the
#            GPU against the CPU engine with the same cache types (tokens equal), `memra bench`
#            tg128 / pp512 at depth 0 / 4096 / 16384 (SmolLM2: 0 / 4096), f16 and q8_0, the 8B Q4_K_M and SmolLM2
#            ($OUT/kvq8-bench.jsonl). ~5 min.
# Logs under /tmp/s16-$STAGE -> $OUT/s16-$STAGE.tgz.
set -u
source experiments/h200_common.sh
stage_begin s16
case "$STAGE" in
a)
  for d in gemm_tile2 gemm_tile2_q6k gemm_tile2_q40 chain_mv; do
    [ -f experiments/$d/ab.sh ] || { log "$d: no ab.sh"; continue; }
    OUT=$R timeout ${AB_LIMIT:-100} bash experiments/$d/ab.sh > $R/$d-ab.txt 2>&1
    log "$d ab rc=$? $(el)"; tail -30 $R/$d-ab.txt | tee -a $R/log.txt
  done
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
k)
  tune_campaign h200 200 $MALL --kernels attn_decode,rope_norm_kv
  freeze_show k
  cp research/tune/h200-nvidia-h200.jsonl $OUT/
  cp tune/defaults/nvidia-h200.json $OUT/table-nvidia-h200.json
  kernel_check
  gpu_tests 480 ;;
m)
  for ct in f16 q8_0; do
    for dev in gpu cpu; do
      timeout 150 python3 -m memra run smollm2-135m --device $dev -ctk $ct -ctv $ct -n 32 --temp 0 --json \
        -p "The history of the printing press" 2> $R/run-$dev-$ct.err | tail -1 > $R/run-$dev-$ct.json
    done
    log "run $ct: greedy tokens gpu vs cpu $(python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print('EQUAL' if a['tokens']==b['tokens'] else 'DIFFER', a['tokens'][:8], b['tokens'][:8])" $R/run-gpu-$ct.json $R/run-cpu-$ct.json 2>&1)"
  done
  for m in synth:llama3-8b:Q4_K_M smollm2-135m; do
    ds="0 4096 16384"; [ $m = smollm2-135m ] && ds="0 4096"   # SmolLM2's context is 8192
    for d in $ds; do
      for ct in f16 q8_0; do
        timeout 150 python3 -m memra bench $m -p 512 -n 128 -d $d -r 3 -ctk $ct -ctv $ct --synth-tokenizer $TOK \
          --out $R/kvq8-bench.jsonl > $R/bench-$(echo $m | tr : _)-d$d-$ct.txt 2>&1
        log "bench $m d$d $ct rc=$? $(grep -E 'tg128|pp512' $R/bench-$(echo $m | tr : _)-d$d-$ct.txt | grep memra | tr -s ' ' | tr '\n' ' ') $(el)"
      done
    done
  done
  cp $R/kvq8-bench.jsonl $OUT/ ;;
z)   # the session's last call (carry [".whl"]): the tile landing candidate, chain_mv v2, attention at depth
  OUT=$R TILE_S=110 timeout 120 bash experiments/tile_land/ab.sh > $R/tile-land-ab.txt 2>&1
  log "tile_land rc=$? $(el)"; tail -32 $R/tile-land-ab.txt | tee -a $R/log.txt
  OUT=$R timeout 60 bash experiments/chain_mv/ab.sh > $R/chain_mv-ab.txt 2>&1
  log "chain_mv rc=$? $(el)"; grep -A60 "^shape" $R/chain_mv-ab.txt | tee -a $R/log.txt
  OUT=$R SWEEP_S=45 NCU_CASES="4096:8:64:1:9" timeout 95 bash experiments/attn_depth/ab.sh > $R/attn-depth-ab.txt 2>&1
  log "attn_depth rc=$? $(el)"; tail -20 $R/attn-depth-ab.txt | tee -a $R/log.txt
  cp $R/*.jsonl $R/attn-ncu.tgz $OUT/ 2>/dev/null ;;
esac
tar czf $OUT/s16-$STAGE.tgz -C /tmp s16-$STAGE
