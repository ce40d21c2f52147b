#!/usr/bin/env bash
# Session 23's H200 calls.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=<x> bash experiments/h200_session23.sh
# First lease (no models): n, e, c. Second lease: ship the models (experiments/ship_models.py's six
# calls), then a, m, b, each call's receipts, table and kernel-check receipt copied into this tree
# before the next (a call runs on a fresh copy of the tree's tracked files).
# STAGE n (carry .whl + .synthtok; ~2 min): ncu with per-instruction stall samples of attn_decode_rope
#   in a decode step at depth 0 and 64, the 8B and SmolLM2's shape (4.7-5.7 µs at ONE key against 1.7
#   for a RMSNorm launch), and gemm.cu's 64-row gate+up (session 23's run named the kernel gemm_glu, the
#   profile's op name, and caught nothing: its CUDA name is gemm_q8_glu, fixed since).
# STAGE e (carry .whl + .synthtok; ~1 min): ATT_EARLY 0 / 1 at 1-512 keys (tune/campaigns/h200-attn-early.toml;
#   run with session 22's experiments/attn_early/early.patch applied in the device's copy, since landed).
# STAGE c (carry .whl; ~20 s): experiments/chain_mv's v2 (never run on a device before).
# STAGE a (models shipped; ~7 min): the h200 campaign's attn_decode jobs again (attention.cu changed:
#   its table entries' source hash), the freeze, kernel-check --add-to (the attention family whole),
#   the GPU tests but the serve ones.
# STAGE m (models shipped; ~6 min): the decode matvec's MV_PREFETCH beside the table's axes
#   (tune/campaigns/h200-mv-prefetch.toml; the 8B's Q6_K down runs at 52 % of the bandwidth), the
#   freeze, kernel-check --add-to for the new entries.
# STAGE b (models shipped; ~4 min): tg128 of session 22's engine (its committed table, MEMRA_ATT_EARLY=0)
#   and this one's, alternating, on every benchmark model; the 8B and SmolLM2 at depth 4096; profiles of
#   SmolLM2 and the 8B Q8_0 decode step.
# STAGE v (~3 min): tg128 with the table after a against m's; SmolLM2 @ d4096 with MEMRA_ATT_EARLY 0 / 1.
# STAGE p (~1 min): profiles with m's table, the serve GPU tests, gemm_q8_glu at 64 rows under ncu.
# STAGE t (~2 min a model): the prompt tile's campaign on MODELS, the freeze, kernel-check --add-to,
#   pp128 / pp512 of the 8B before / after. (Session 23 ran v, p and t's steps as separate commands
#   of the same lease, in the order b, m, v, p, t; their receipts: research/2026-12-03-session23.)
set -u
source experiments/h200_common.sh
stage_begin s23
case "$STAGE" in
n)
  OUT=$R KIND=decode TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/attn_decode_rope/0 synth:llama3-8b:Q4_K_M/attn_decode_rope/64 \
    synth:smollm2-135m:Q8_0/attn_decode_rope/0 synth:smollm2-135m:Q8_0/attn_decode_rope/64" \
    timeout 400 bash experiments/h200_ncu.sh > $R/ncu-attn.txt 2>&1
  log "ncu attention rc=$? $(el)"; mv $R/ncu.tgz $OUT/ncu-attn.tgz 2>/dev/null
  OUT=$R KIND=decode ROWS=64 TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/gemm_q8_glu/128" \
    timeout 150 bash experiments/h200_ncu.sh > $R/ncu-gemm64.txt 2>&1
  log "ncu gemm_glu 64 rows rc=$? $(el)"; mv $R/ncu.tgz $OUT/ncu-gemm64.tgz 2>/dev/null ;;
e)
  # session 23 ran this with experiments/attn_early/early.patch applied here; attention.cu v8 has it
  TUNE_OUT=$OUT/h200-attn-early-nvidia-h200.jsonl tune_campaign h200-attn-early 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  python3 -m memra research summarize $OUT/h200-attn-early-nvidia-h200.jsonl --by shape_key,config.ATT_EARLY \
    2>&1 | tee -a $R/log.txt
  ;;
a)
  link_models "kernel-check's launch set, the campaign's and the GPU tests' real models need them"
  tune_campaign h200 200 -m smollm2-135m -m gemma3-270m -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 \
    -m synth:llama3-8b:Q8_0 -m synth:llama-1b:Q4_0 --kernels attn_decode
  freeze_show a
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-nvidia-h200.jsonl $OUT/tune/; cp tune/defaults/*.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=200 kernel_check
  GPU_TESTS_EXTRA="--ignore=tests/test_serve_gpu.py" gpu_tests 585 ;;
m)
  link_models "kernel-check's launch set covers the real models"
  tune_campaign h200-mv-prefetch 300 -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0 \
    -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  freeze_show mv
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-mv-prefetch-nvidia-h200.jsonl $OUT/tune/ 2>/dev/null; cp tune/defaults/*.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=120 kernel_check ;;
b)
  link_models "the real models' cells need them"
  git show ${BASE:-5012084}:tune/defaults/nvidia-h200.json > $R/table-s22.json
  for m in smollm2-135m synth:llama-1b:Q4_0 synth:llama3-8b:Q4_K_M gemma3-270m synth:llama3-8b:Q8_0; do
    for arm in s22 s23 s22 s23; do
      if [ $arm = s22 ]; then tb=$R/table-s22.json; early=0; else tb=auto; early=1; fi
      MEMRA_ATT_EARLY=$early timeout 60 python3 -m memra bench $m -p 0 -n 128 -r 3 --tune-table $tb \
        --synth-tokenizer $TOK --out $OUT/bench-s22-s23.jsonl > $R/bench.txt 2>&1
      log "$m $arm rc=$? $(grep tg128 $R/bench.txt | grep memra | tr -s ' ' | cut -c1-140) $(el)"
    done
  done
  for m in synth:llama3-8b:Q4_K_M smollm2-135m; do
    for arm in s22 s23; do
      if [ $arm = s22 ]; then tb=$R/table-s22.json; early=0; else tb=auto; early=1; fi
      MEMRA_ATT_EARLY=$early timeout 60 python3 -m memra bench $m -p 0 -n 128 -d 4096 -r 3 --tune-table $tb \
        --synth-tokenizer $TOK --out $OUT/bench-s22-s23.jsonl > $R/bench.txt 2>&1
      log "$m d4096 $arm rc=$? $(grep tg128 $R/bench.txt | grep memra | tr -s ' ' | cut -c1-140) $(el)"
    done
  done
  for m in smollm2-135m synth:llama3-8b:Q8_0 synth:llama3-8b:Q4_K_M; do
    f=profile-$(echo $m | tr : _).txt
    timeout 60 python3 -m memra profile $m -np 1 -d 64 --synth-tokenizer $TOK > $R/$f 2>&1
    log "profile $m rc=$? $(el)"; cp $R/$f $OUT/
  done ;;
v)
  # run after m as one call (the table after STAGE a carried as research/2026-12-03-session23/a/table-after-a.json):
  # tg128 with it and with m's, alternating; SmolLM2 @ d4096 with MEMRA_ATT_EARLY 0 / 1 on one table
  link_models "SmolLM2's cells"
  A=research/2026-12-03-session23/a/table-after-a.json; [ -f $A ] || { gunzip -k $A.gz 2>/dev/null; }
  for m in synth:llama3-8b:Q4_K_M synth:llama3-8b:Q8_0 synth:llama3-8b:Q4_0 synth:llama-1b:Q4_0 smollm2-135m; do
    for tb in $A auto $A auto; do
      timeout 40 python3 -m memra bench $m -p 0 -n 128 -r 3 --tune-table $tb --synth-tokenizer $TOK \
        --out $OUT/bench-mv-table.jsonl > $R/bench.txt 2>&1
      log "$m $(basename $tb) rc=$? $(grep tg128 $R/bench.txt | grep memra | tr -s ' ' | cut -c1-120)"
    done
  done
  for e in 0 1 0 1; do
    MEMRA_ATT_EARLY=$e timeout 40 python3 -m memra bench smollm2-135m -p 0 -n 128 -d 4096 -r 3 \
      --out $OUT/bench-early-d4096.jsonl > $R/bench.txt 2>&1
    log "smollm2 d4096 early=$e rc=$? $(grep tg128 $R/bench.txt | grep memra | tr -s ' ' | cut -c1-120)"
  done ;;
p)
  # the 8B / 1B decode step's profile with m's table, the serve GPU tests, then gemm_q8_glu at 64 rows under ncu
  link_models "the serve GPU tests' SmolLM2"
  for m in synth:llama3-8b:Q4_K_M synth:llama3-8b:Q4_0 synth:llama-1b:Q4_0; do
    f=profile-$(echo $m | tr : _)-np1-d128.txt
    timeout 50 python3 -m memra profile $m -np 1 -d 128 --synth-tokenizer $TOK > $OUT/$f 2>&1; log "profile $m rc=$?"
  done
  timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serve_gpu.py > $OUT/serve-gpu-tests.txt 2>&1
  log "serve gpu tests rc=$? $(tail -1 $OUT/serve-gpu-tests.txt)"
  OUT=$R KIND=decode ROWS=64 TOK=$TOK CASES="synth:llama3-8b:Q4_K_M/gemm_q8_glu/128" \
    timeout 170 bash experiments/h200_ncu.sh > $R/ncu-gemm64.txt 2>&1
  log "ncu gemm_q8_glu 64 rows rc=$?"; mv $R/ncu.tgz $OUT/ncu-gemm64.tgz 2>/dev/null ;;
t)
  # the prompt tile's campaign (tune/campaigns/h200-gemm-tile.toml) on MODELS (session 23: the 8B Q4_K_M
  # alone, 144 jobs, 54 s; next: synth:llama3-8b:Q4_0 synth:llama3-8b:Q8_0 synth:llama-1b:Q4_0), the
  # freeze, kernel-check --add-to, then pp128 / pp512 of the 8B with the table before (a copy) and after
  link_models "kernel-check's launch set covers the real models"
  cp tune/defaults/nvidia-h200.json $R/table-before.json
  tune_campaign h200-gemm-tile 300 $(for m in ${MODELS:-synth:llama3-8b:Q4_K_M}; do echo -m $m; done)
  freeze_show tile
  mkdir -p $OUT/tune $OUT/defaults
  cp research/tune/h200-gemm-tile-nvidia-h200.jsonl $OUT/tune/; cp tune/defaults/*.json $OUT/defaults/
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=140 kernel_check
  for tb in $R/table-before.json auto $R/table-before.json auto; do
    timeout 40 python3 -m memra bench synth:llama3-8b:Q4_K_M -p 128,512 -n 0 -r 3 --tune-table $tb \
      --synth-tokenizer $TOK --out $OUT/bench-tile-table.jsonl > $R/bench.txt 2>&1
    log "$(basename $tb) rc=$? $(grep -E 'pp128|pp512' $R/bench.txt | grep memra | tr -s ' ' | cut -c1-100 | tr '\n' ' ')"
  done ;;
c)
  OUT=$R bash experiments/chain_mv/ab.sh > $R/chain-mv.txt 2>&1; log "chain_mv rc=$? $(el)"
  cp $R/chain-mv.jsonl $R/chain-mv.log $OUT/ 2>/dev/null; tail -30 $R/chain-mv.txt | tee -a $R/log.txt ;;
esac
tar czf $OUT/s23-$STAGE.tgz -C /tmp s23-$STAGE
