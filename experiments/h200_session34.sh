#!/usr/bin/env bash
# Session 34's device calls (prepared in session 33; run at 79aeec7 on an H100: research/2026-12-05-session34). STAGE n's
# fold (experiments/norm_pro) was withdrawn after it, with h200_common.sh's norm_pro_arms; the next calls are
# experiments/h200_session35.sh.
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=c bash experiments/h200_session34.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; STAGE t needs the real models shipped, STAGE d
# carries .llamacpp.
# STAGE c (~6 min, no models): the SMs' L1 / shared split. Session 33 found a folded matvec's 5 KB of dynamic shared
#  memory costing 2.8 us a launch in the engine and 0.16 with one carveout for every kernel (MEMRA_SMEM_CARVEOUT=100),
#  while 100 cost the 8B 5.8 % (L1 down to ~28 KB: the matvecs' loads in flight need it). The decode step's one
#  kernel with dynamic shared memory is attention (the ring: 64 KiB a block on the 8B), so every layer may re-split
#  an SM twice. Arms, tg128 at depth 0, two rounds: the driver's choice, and carveouts 28 / 58 / 100 % (~64 / 132 /
#  228 KB of shared memory: 58 holds two of the 8B's 64 KiB rings an SM, 28 one). Predicted if re-splits cost ~2 us
#  each: 58 % beats the driver's on every model (the 8B +3-6 %, SmolLM2's step +5-10 %) while keeping ~96 KB of L1;
#  28 % between. If 58 wins everywhere it is a default (a fixed preference for every kernel) after the GPU tests.
#  Then the fold under that carveout (SmolLM2 shape, MEMRA_NORM_PRO all / down) through experiments/norm_pro/ab.py.
# STAGE n (~8 min, no models): the fold's v3 (experiments/norm_pro: no shared memory, no barrier; session 33's v1 / v2
#  lost -7..-45 %), tg128 arms off / all / off / all / norms / down through ab.py on the SmolLM2, Gemma-3 and 1B shapes,
#  then the probe (the pair against the fused launch alone, six shapes) and the fold's kernel-check. Predicted: alone
#  -0.5..-1.5 us a pair on the small qkv / gate_up shapes (the hop gone, no barrier), the same in the engine (no
#  launch re-splits an SM): SmolLM2 shape +5-10 %, 1B +3-6 %; the down's fold worst (32 divisions a value block in
#  each lane that reads it). The gates must stay MATCH.
# STAGE t (~6 min, models shipped): the GPU tests (not run since session 31).
# STAGE d (~9 min; carry .llamacpp): `--vs llama.cpp` on the 8B, the 8B at depth 4,096, SmolLM2 at 4,096 and at 0,
#  the 1B (MODELS overrides).
set -u
source experiments/h200_common.sh
stage_begin s34
case "$STAGE" in
c)
  for round in 1 2; do
    for m in synth:llama3-8b:Q4_K_M synth:smollm2-135m:Q4_1 synth:llama-1b:Q4_0; do
      for c in driver 28 58 100; do
        [ $(( $(date +%s) - T0 )) -lt 420 ] || break
        v=$c; [ $c = driver ] && v=
        arm_run "$m carveout=$c" bench-carveout.jsonl env MEMRA_SMEM_CARVEOUT=$v python3 -m memra bench $m \
          -p 0 -n 128 -r 3
      done
    done
  done
  cp $R/bench-carveout.jsonl $OUT/ ;;
n)
  norm_pro_arms bench-norm-pro.jsonl "norm_pro v3" 240
  timeout $(( 420 - ($(date +%s) - T0) )) python3 experiments/norm_pro/probe.py --out $R/norm-pro.jsonl --nb 1 \
    --only "SmolLM2 qkv,SmolLM2 down,Gemma-3 qkv,1B qkv,1B down,SmolLM2 gate_up" 2>&1 | grep -v "^/work" | tee -a $R/log.txt
  cp $R/norm-pro.jsonl $OUT/ 2>/dev/null
  MEMRA_NORM_PRO=all timeout $(( 570 - ($(date +%s) - T0) )) python3 experiments/norm_pro/ab.py kernel-check \
    --only matvec > $R/kc-fold.txt 2>&1
  log "fold kernel-check rc=$? $(tail -1 $R/kc-fold.txt)"
  grep -E "^FAIL|mv_q8n.*(differ|FAIL)" $R/kc-fold.txt | grep -v "launch set: model" | head -20 | tee -a $R/log.txt
  cp $R/kc-fold.txt $OUT/ ;;
t)
  gpu_tests 585 ;;
d)
  depth_vs ;;   # llama.cpp built in the call (carry .llamacpp)
esac
tar czf $OUT/s34-$STAGE.tgz -C /tmp s34-$STAGE
