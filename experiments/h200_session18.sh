#!/usr/bin/env bash
# STAGE a: the next session's first H200 call (prepared in session 17), carry [".whl", ".synthtok"], ~2.5 min:
#   experiments/ring_short/ab.sh   the ring's short-context loss (research/2026-12-02-session17 section 8):
#                                  registers vs ring at shared-memory carveouts 60 / 90 %, with and without
#                                  PDL, on the synthetic 8B's whole decode step and its one-layer chain
# STAGE b: matvec.cu variant 6 (MV_L2PF) campaign on the synthetic models, freeze, tg128 table A/B (~7 min)
# STAGE c: MV_L2PF engine A/B (table override), attn_fa vs attn_decode per launch, pp512 @ d4096 profiles (~4 min)
# STAGE d: MEMRA_ATTN=hybrid vs decode (8B, 1B: pp512 / tg128 at d0 / d4096), kernel-check (~7 min)
# STAGE e (models shipped first): hybrid vs decode on every benchmark model, kernel-check, GPU tests (~9.5 min)
# STAGE f (models shipped first): the serve / runner GPU tests with MEMRA_ATTN=hybrid (~1.5 min)
# Logs under /tmp/s18-$STAGE -> $OUT/s18-$STAGE.tgz; the JSONL to $OUT.
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session18.sh
set -u
source experiments/h200_common.sh
stage_begin s18
case "$STAGE" in
a)
  OUT=$R LIMIT_S=110 timeout 120 bash experiments/ring_short/ab.sh > $R/ring-short-ab.txt 2>&1
  log "ring_short rc=$? $(el)"; tail -70 $R/ring-short-ab.txt | tee -a $R/log.txt
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
b)
  # matvec.cu variant 6 (MV_L2PF): the h200 campaign's matvec jobs on the synthetic models (the
  # new axis beside the old grid), a summary of the best MV_L2PF 0 against the best overall per
  # shape, a freeze, and tg128 with the new table against the one before (same machine, alternating)
  cp tune/defaults/nvidia-h200.json $R/table-before.json
  SYN="-m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0"
  tune_campaign h200 ${LIMIT_S:-330} -k matvec,matvec_glu $SYN
  python3 experiments/mv_l2pf/summary.py research/tune/h200-nvidia-h200.jsonl | tee $R/l2pf-summary.txt | tee -a $R/log.txt
  freeze_show b
  cp tune/defaults/nvidia-h200.json $R/table-after.json
  for mt in synth:llama3-8b:Q4_K_M:after synth:llama3-8b:Q4_K_M:before synth:llama-1b:Q4_0:after \
            synth:llama-1b:Q4_0:before synth:llama3-8b:Q4_K_M:after synth:llama3-8b:Q4_K_M:before; do
    m=${mt%:*}; t=${mt##*:}; {
      timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
        --tune-table $R/table-$t.json --out $R/bench-l2pf.jsonl > $R/bench-$t.txt 2>&1
      log "bench $m $t rc=$? $(grep -E 'tg128' $R/bench-$t.txt | tail -1) $(el)"
    }
  done
  cp research/tune/h200-nvidia-h200.jsonl $R/bench-l2pf.jsonl $R/table-after.json $OUT/ 2>/dev/null ;;
c)
  # (1) matvec.cu variant 6 in the engine: tg128 with the table as frozen against the same table
  # with MV_L2PF 1 on the two shapes that gained alone (1B down, 8B attn_v); (2) attn_fa against
  # attn_decode per launch (decode 64 / 1,024 / 4,096 keys, a 128-row prefill chunk at 4,096);
  # (3) where a 512-row prefill chunk at depth 4,096 goes on the 8B, MEMRA_ATTN decode and fa
  python3 experiments/mv_l2pf/table_pf.py tune/defaults/nvidia-h200.json $R/table-pf.json | tee -a $R/log.txt
  cp tune/defaults/nvidia-h200.json $R/table-base.json
  for mt in synth:llama-1b:Q4_0:pf synth:llama-1b:Q4_0:base synth:llama-1b:Q4_0:pf synth:llama-1b:Q4_0:base \
            synth:llama3-8b:Q4_K_M:pf synth:llama3-8b:Q4_K_M:base; do
    m=${mt%:*}; t=${mt##*:}
    timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --synth-tokenizer $TOK \
      --tune-table $R/table-$t.json --out $R/bench-pf.jsonl > $R/bench-$t.txt 2>&1
    log "bench $m $t rc=$? $(grep -E 'tg128' $R/bench-$t.txt | tail -1) $(el)"
  done
  OUT=$R timeout 150 python3 experiments/attn_mma/fa_check.py --no-checks --shapes llama3-8b,llama-1b,smollm2 \
    --modes decode:64,decode:1024,decode:4096,decode:16384,prefill:4096 > $R/fa-time.txt 2>&1
  log "fa_check rc=$? $(el)"; grep fa-time $R/fa-time.txt | tee -a $R/log.txt
  for a in decode fa; do
    MEMRA_ATTN=$a timeout 120 python3 -m memra profile synth:llama3-8b:Q4_K_M --prefill -np 512 -d 4096 \
      --synth-tokenizer $TOK > $R/profile-pp512-d4096-$a.txt 2>&1
    log "profile $a rc=$? $(el)"; head -40 $R/profile-pp512-d4096-$a.txt | tee -a $R/log.txt
  done
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
d)
  # MEMRA_ATTN=hybrid against decode (the 8B and the 1B: pp512 and tg128 at depth 0 and 4096,
  # the two arms alternating on one machine), then kernel-check over the new launch set
  for mt in synth:llama3-8b:Q4_K_M:hybrid synth:llama3-8b:Q4_K_M:decode synth:llama-1b:Q4_0:hybrid \
            synth:llama-1b:Q4_0:decode; do
    m=${mt%:*}; a=${mt##*:}
    MEMRA_ATTN=$a timeout 150 python3 -m memra bench $m -p 512 -n 128 -d 0,4096 -r 3 --synth-tokenizer $TOK \
      --out $R/bench-hybrid.jsonl > $R/bench-$a.txt 2>&1
    log "bench $m $a rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-$a.txt | cut -c1-160 | tee -a $R/log.txt
  done
  kernel_check
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
e)
  # after the models are shipped: MEMRA_ATTN hybrid against decode (every benchmark model, pp512
  # and tg128 at depth 0 and 4096; the 8B and SmolLM2 at 4096), kernel-check, the GPU tests
  link_models "kernel-check and the GPU tests need them"
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 smollm2-135m gemma3-270m; do
    for a in hybrid decode; do
      f=$(echo $m | tr : _)-$a; d=0,4096; [ $m = gemma3-270m ] && d=0
      MEMRA_ATTN=$a timeout 100 python3 -m memra bench $m -p 512 -n 128 -d $d -r 3 --synth-tokenizer $TOK \
        --out $R/bench-hybrid.jsonl > $R/bench-$f.txt 2>&1
      log "bench $m $a rc=$? $(el)"; grep -E "gate|pp512|tg128" $R/bench-$f.txt | cut -c1-170 | tee -a $R/log.txt
    done
  done
  cp $R/bench-hybrid.jsonl $OUT/
  kernel_check
  gpu_tests 470
  # the GPU tests of the gates, the runner and the server with MEMRA_ATTN=hybrid, in what is left
  left=$(( 590 - ($(date +%s) - T0) )); [ $left -gt 20 ] || left=20
  MEMRA_ATTN=hybrid timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py \
    tests/test_gpu_runner.py tests/test_serve_gpu.py > $R/gpu-tests-hybrid.txt 2>&1
  log "gpu tests (hybrid) rc=$? $(tail -1 $R/gpu-tests-hybrid.txt) $(el)"
  grep -E "^(FAILED|ERROR)" $R/gpu-tests-hybrid.txt | head | tee -a $R/log.txt
  cp $R/*.jsonl $OUT/ 2>/dev/null ;;
f)
  # the hybrid's prefix-cache fix on the GPU: the server and runner GPU tests with MEMRA_ATTN=hybrid
  # (models shipped in the same warm lease, else they skip)
  link_models "the serve tests need them"
  MEMRA_ATTN=hybrid timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serve_gpu.py \
    tests/test_gpu_runner.py > $R/gpu-tests-hybrid.txt 2>&1
  log "gpu tests (hybrid) rc=$? $(tail -1 $R/gpu-tests-hybrid.txt) $(el)"
  grep -E "^(FAILED|ERROR)" $R/gpu-tests-hybrid.txt | head | tee -a $R/log.txt ;;
esac
tar czf $OUT/s18-$STAGE.tgz -C /tmp s18-$STAGE
