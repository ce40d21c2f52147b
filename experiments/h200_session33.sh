#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 31, research/2026-12-04-session31 "Next"; session 32 had no
# device and added STAGE n).
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session33.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; STAGE a and t need the real models shipped.
# STAGE a (~8 min): 1. the GPU tests at HEAD (session 31's ran out of its call: 27 passed, none failed, of 43);
#  2. why the tensor-core body loses 2 µs a layer at depth 0 in the engine (0.77 alone): the ring's shared memory
#     (64 KiB at 64-key tiles, head 128) against the neighbours' early blocks under PDL. tg128 of the 8B at depth 0
#     and 4,096, arms (each table differs from the frozen one in the 8B's attn_decode entry only):
#       frozen  64-key tiles, 8 warps, tensor cores (a warp pair a slice)         session 31: 482.1 / 430.1
#       c32     32-key tiles, 8 warps, CUDA-core body (the campaign's pick)        session 31: 497.2 / 417.3
#       p32     32-key tiles, 4 warps, tensor cores (a pair a slice, 32 KiB ring)  new
#       q32     32-key tiles, 8 warps, tensor cores (experiments/attn_quad: a quad a slice, 32 KiB ring)  new
#     Predicted if shared memory is the cause: q32 ~495 at depth 0 and ~428 at 4,096 (4 tiles a block instead of
#     2); p32 between (4 warps: half the latency hiding). If q32 is no better than frozen at depth 0, the cause is
#     the tensor-core body's own fixed cost (the slices' merge through shared memory, 16 chained mma a tile).
# STAGE p (~3 min; the norm probe also at the end of STAGE a when time is left): experiments/norm_pro/probe.py. Predicted: SAME
#  everywhere (the prologue emulates norm.cu's order); the fused launch saves most of a launch hop on the small
#  shapes (SmolLM2 ~1-1.5 µs a pair) and less on the 8B, whose 768 / 3,584 blocks each re-read the 16 KiB row.
#  Then attn_quad's ATT_TC_CHAINS 1 / 2 / 4 alone (probe.py): at one tile a block the 16 chained mma of the scores
#  (~30 cycles each) may be most of the TC body's extra 0.9 µs at 64 keys; predicted -0.2 µs at 4 chains. Then
#  SmolLM2's attention at 4,096 / 16,384 keys by split count alone (22..256; 88 the engine's): whether its depth
#  cost (10.6 µs a layer at 4,096 against ~3.5 at depth 0, for 3 MB of K/V) is the split layout's (one 64-key tile a
#  block and a 64-way merge) or a block's fixed path.
# STAGE l / t (if q32 wins at depth 0 and holds at 4,096): the landing's campaign + freeze + kernel-check (~5 min,
#  models shipped), the GPU tests (~5 min); then the 8B's entry by the engine on both cells again if the campaign
#  (64 keys only) picks otherwise (experiments/attn_tc/choice.py).
# STAGE n (~9 min): the norms folded into the decode matvecs in the engine (MEMRA_NORM_PRO, experiments/norm_pro/ab.py:
#  the build copy's mv_q8n): tg128 of the SmolLM2 shape, Gemma-3's (its add_rmsnorm with post-norms folded) and the
#  1B, arms off / all / off / all / norms (qkv, gate_up, output) / down (the quantize before it); then
#  MODELS=synth:llama3-8b:Q4_K_M in a second call. The gate line must stay MATCH with the same max |dlogit| as off
#  (the folded launches give the pairs' bits). Predicted: SmolLM2 shape +15-25 % (~60 of its ~90 norm + quantize
#  hops gone at ~1.2-1.7 us, less the prologue's own ~0.5-1 us a launch), Gemma-3 +8-12 %, the 1B +5-10 %, the 8B
#  +-2 % (its 768 / 3,584-block readers each re-read the 16 KiB row); down alone less than norms on every shape.
#  If the fold wins, it lands on the CPU without a campaign (experiments/norm_pro/landing.py, `memra tune carry
#  --from HEAD~1`, `memra tune freeze ... --pdl`: research/2026-12-04-session32 section 4); then STAGE t (the GPU tests)
#  and a kernel-check --add-to (KC_ADD) on the device.
# STAGE d (~9 min; carry .llamacpp): `--vs llama.cpp` of v11 on the 8B, the 8B at depth 4,096, SmolLM2 at 4,096
#  and at 0, the 1B (MODELS overrides).
# Run in session 33 (research/2026-12-05-session33): STAGE n twice (the fold v1, v2: both lose), STAGE q (the
# carveout arms, the probe, the attention arms: q32 no winner). Left for the next session: STAGE t (the GPU tests,
# models shipped: not run since session 31) and STAGE d (--vs llama.cpp).
set -u
source experiments/h200_common.sh
stage_begin s33
# norm_probe: experiments/norm_pro/probe.py (the RMSNorm in the matvec's prologue: bits against rmsnorm + mv_q8,
# and µs of the pair against the fused launch, at six norm -> matvec, two add_rmsnorm -> matvec and three quantize ->
# down pairs; ~2 min); then kernel-check's matvec family with every fold on (each folded launch of the benchmark
# models' launch set against its pair, bit for bit; no receipt with --only)
norm_probe() {
  timeout 200 python3 experiments/norm_pro/probe.py --out $R/norm-pro.jsonl --nb 1,4 2>&1 | grep -v "^/work" \
    | tee -a $R/log.txt
  cp $R/norm-pro.jsonl $OUT/ 2>/dev/null
  MEMRA_NORM_PRO=all timeout 240 python3 experiments/norm_pro/ab.py kernel-check --only matvec > $R/kc-fold.txt 2>&1
  log "fold kernel-check rc=$? $(tail -1 $R/kc-fold.txt)"
  grep -E "^FAIL|mv_q8n.*(differ|FAIL)" $R/kc-fold.txt | head -20 | tee -a $R/log.txt
}
# attn_arms "DEPTHS" LIMIT_S: tg128 of the 8B at each depth by the four attn_decode tables (frozen c32 p32 q32)
attn_arms() {
  local depths=$1 lim=$2   # set -- below replaces $1 $2
  python3 experiments/attn_tc/choice.py tables /tmp t32h1 t32w4h1 t32h1r2   # c32, p32, q32's tables
  cp tune/defaults/nvidia-h200.json /tmp/frozen.json
  for d in $depths; do   # a call cut short loses the second round, not a depth
    for arm in frozen c32 p32 q32; do
      [ $(( $(date +%s) - T0 )) -lt $lim ] || break
      case $arm in
        q32) set -- python3 experiments/attn_quad/ab.py; T=t32h1r2 ;;   # the quad needs the ring named
        c32) set -- python3 -m memra; T=t32h1 ;;
        p32) set -- python3 -m memra; T=t32w4h1 ;;
        *) set -- python3 -m memra; T=frozen ;;
      esac
      arm_run "attn table $arm d$d" bench-quad.jsonl "$@" bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -d $d -r 3 \
        --tune-table /tmp/$T.json
    done
  done
  cp $R/bench-quad.jsonl $OUT/
}
case "$STAGE" in
a)
  link_models "the GPU tests need them"
  gpu_tests 330
  attn_arms "0 4096 0 4096" 570
  [ $(( $(date +%s) - T0 )) -lt 540 ] && norm_probe ;;
p)
  norm_probe
  # attn_quad's ATT_TC_CHAINS (the scores' mma in 1 / 2 / 4 independent accumulators), alone: the 8B at the pair's
  # 64-key tiles and the quad's 32, 64 and 4,096 keys (name:ctx:warps:tile:hpb:splits)
  C=8B:64:8:64:1:33,8B:4096:8:64:4:33,8B:64:8:32:1:33,8B:4096:8:32:4:33,SmolLM2:64:8:64:1:88,SmolLM2:4096:8:64:3:88
  for ch in 1 2 4; do
    timeout 60 python3 experiments/attn_depth/probe.py --out $R/attn-chains.jsonl --arm attn_quad:ATT_TC=1,ATT_TC_CHAINS=$ch \
      --cases $C 2>&1 | grep -v "^--\|^/work" | tee -a $R/log.txt
  done
  # SmolLM2's attention at depth (its tg128 @ d4096 floor, 2.5x, is the farthest after Gemma-3's): the split count
  # alone, tensor-core body (the table's 8 warps, 64-key tiles, whole group a block): 88 is the engine's
  C=$(for c in 4096:22 4096:44 4096:88 4096:132 16384:88 16384:176 16384:256; do echo -n "SmolLM2:${c%%:*}:8:64:3:${c##*:},"; done)
  timeout 60 python3 experiments/attn_depth/probe.py --out $R/attn-splits.jsonl --cases ${C%,} 2>&1 \
    | grep -v "^--\|^/work" | tee -a $R/log.txt
  cp $R/attn-chains.jsonl $R/attn-splits.jsonl $OUT/ ;;
l)
  # after `python3 experiments/attn_quad/landing.py . && git apply experiments/attn_quad/host.patch` is committed
  # (models shipped): the attn_decode campaign, freeze --pdl, kernel-check --add-to
  attn_land l 300 ;;
n)
  # MODELS / ARMS override (a call holds ~20 bench runs)
  norm_pro_arms bench-norm-pro.jsonl "norm_pro" 560
  # then the folded launches' bits against their pairs, and the probe's µs by shape, as time allows
  if [ $(( $(date +%s) - T0 )) -lt 300 ]; then
    MEMRA_NORM_PRO=all timeout 200 python3 experiments/norm_pro/ab.py kernel-check --only matvec > $R/kc-fold.txt 2>&1
    log "fold kernel-check rc=$? $(tail -1 $R/kc-fold.txt)"
    grep -E "^FAIL|mv_q8n.*(differ|FAIL)" $R/kc-fold.txt | head -20 | tee -a $R/log.txt
  fi
  left=$(( 570 - ($(date +%s) - T0) ))
  [ $left -gt 30 ] && timeout $left python3 experiments/norm_pro/probe.py --out $R/norm-pro.jsonl --nb 1 2>&1 \
    | grep -v "^/work" | tee -a $R/log.txt
  cp $R/norm-pro.jsonl $OUT/ 2>/dev/null ;;
q)
  # the fold (v2) lost in the engine (STAGE n) and a folded down alone lost more than every fold together: whether the
  # SMs' L1 / shared split switching between launches is the cost (MEMRA_SMEM_CARVEOUT, one carveout for every
  # kernel): SmolLM2 shape, arms off / down / all, with and without; then the norm probe on six shapes (the pair
  # against the fused launch alone: what the kernel costs apart from its neighbours); then STAGE a's attention arms
  for arm in off down all c100:off c100:down c100:all off down; do
    [ $(( $(date +%s) - T0 )) -lt 200 ] || break
    case $arm in c100:*) c=100; v=${arm#c100:} ;; *) c=; v=$arm ;; esac
    case $v in off) v= ;; esac
    arm_run "smollm2 norm_pro $arm" bench-carveout.jsonl env MEMRA_SMEM_CARVEOUT=$c MEMRA_NORM_PRO=$v \
      python3 experiments/norm_pro/ab.py bench synth:smollm2-135m:Q4_1 -p 0 -n 128 -r 3
  done
  cp $R/bench-carveout.jsonl $OUT/
  left=$(( 330 - ($(date +%s) - T0) ))
  timeout $left python3 experiments/norm_pro/probe.py --out $R/norm-pro.jsonl --nb 1 \
    --only "SmolLM2 qkv,SmolLM2 down,Gemma-3 qkv,1B qkv,1B down,SmolLM2 gate_up" 2>&1 | grep -v "^/work" | tee -a $R/log.txt
  cp $R/norm-pro.jsonl $OUT/ 2>/dev/null
  attn_arms "0 4096" 420 ;;
t)
  gpu_tests 585 ;;
d)
  depth_vs ;;   # llama.cpp built in the call (carry .llamacpp)
esac
tar czf $OUT/s33-$STAGE.tgz -C /tmp s33-$STAGE
