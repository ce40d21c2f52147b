#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 30; research/2026-12-04-session30 "Next").
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<commit> && STAGE=a bash experiments/h200_session31.sh
# .whl from experiments/h200_wheels.sh; carry .whl and .synthtok; no real model needed for STAGE a.
# STAGE a (~5 min): the tensor-core attention body (experiments/attn_tc) at the engine's own configuration.
#  1. probe.py (attn_decode_rope alone, checked against the float64 reference): kernels/ against ATT_TC 1 at the
#     shipped 8 warps / 64-key tiles (a warp pair a 16-key slice), 64 .. 16,384 keys, and key counts that leave a
#     partial last tile (100, 4,100), hpb 1 (the table's short-context choice) and the whole group; the head-64
#     shapes also at 128-key tiles (a warp a slice). Predicted (experiments/attn_tc/README): 8B 18.2 -> ~15-16 µs
#     at 4,096 keys, 39.6 -> ~25-28 at 16,384, about 8.2 at 64.
#     The switch build (ATT_TC 2: the CUDA-core body below 256 keys a row, the TC body from there) on the same cases.
#  2. the engine (experiments/attn_tc/ab.py on the shipped table): tg128 at depth 0 and 4,096 on the 8B Q4_K_M,
#     the 1B and the SmolLM2 shape, arms ship / tc / sw (the switch) twice, the gates printed first (prefill =
#     decode bit for bit within each arithmetic; the teacher-forced gate on the small shapes).
#  3. attention.cu v10 against v9 at depth 0 (experiments/attn_merge/v9.py; session 30's --vs read the 8B at
#     487.8 t/s against 490.9-491.3 before the landing, where no depth-0 row reaches the merge).
# STAGE l / t / d (if STAGE a says the body wins): the landing's campaign + freeze + kernel-check (~7 min, models
#  shipped), the GPU tests (~5 min, models), `--vs llama.cpp` (~9 min; carry .llamacpp; 5 cells fit one call).
set -u
source experiments/h200_common.sh
stage_begin s31
case "$STAGE" in
a)
  P="python3 experiments/attn_depth/probe.py --out $R/attn-tc3.jsonl"
  SHIP=8B:64:8:64:1:33,8B:100:8:64:1:33,8B:1024:8:64:4:33,8B:4096:8:64:4:33,8B:4100:8:64:4:33,8B:16384:8:64:4:33
  SHIP=$SHIP,1B:64:8:64:1:33,1B:4096:8:64:4:33,SmolLM2:64:8:64:1:88,SmolLM2:100:8:64:1:88,SmolLM2:4096:8:64:3:88
  T128=1B:64:8:128:1:33,1B:4096:8:128:4:33,SmolLM2:100:8:128:1:88,SmolLM2:4096:8:128:3:88
  timeout 80 $P --cases $SHIP 2>&1 | grep -v "^--" | tee -a $R/log.txt
  timeout 80 $P --arm attn_tc:ATT_TC=1 --cases $SHIP,$T128 2>&1 | grep -v "^--" | tee -a $R/log.txt
  timeout 80 $P --arm attn_tc:ATT_TC=2 --cases $SHIP 2>&1 | grep -v "^--" | tee -a $R/log.txt
  cp $R/attn-tc3.jsonl $OUT/
  for m in synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 synth:smollm2-135m:Q4_1; do
    for d in 0 4096; do
      for arm in ship tc sw ship tc sw; do
        [ $(( $(date +%s) - T0 )) -lt ${A_LIMIT:-480} ] || break
        case $arm in
          ship) set -- python3 -m memra ;;
          tc) set -- env ATT_TC=1 python3 experiments/attn_tc/ab.py ;;
          sw) set -- env ATT_TC=2 python3 experiments/attn_tc/ab.py ;;   # TC from 256 keys a row (ATT_TC_MIN)
        esac
        arm_run "attn_tc $arm $m d$d" bench-tc.jsonl "$@" bench $m -p 0 -n 128 -d $d -r 3
      done
    done
  done
  cp $R/bench-tc.jsonl $OUT/
  for v in v10 v9 v9 v10; do
    arm_run "attention.cu $v" bench-v9.jsonl env MERGE=$v python3 experiments/attn_merge/v9.py bench \
      synth:llama3-8b:Q4_K_M -p 0 -n 128 -r 3
  done
  cp $R/bench-v9.jsonl $OUT/ ;;
l)
  # after `python3 experiments/attn_tc/landing.py . && git apply experiments/attn_tc/host.patch` is committed
  # (models shipped): the attn_decode campaign
  # (every entry stale: the kernel changed), freeze --pdl, kernel-check --add-to (the attention family's bits all
  # change with ATT_TC 1, so its cases are new)
  attn_land l 300 ;;
t)
  gpu_tests 585 ;;
c)
  # (models shipped) after STAGE l froze v11's campaign: the 8B's attn_decode entry went to ATT_TILE 32 (the
  # CUDA-core body, 6.65 µs at 64 keys) from 64 (the tensor cores, 7.42), measured at 64 keys only. One
  # configuration serves every depth (it sets a row's bits), so the engine A/B chooses it on both depth cells:
  # tg128 at depth 0 and 4,096, arms frozen / t64h1 / t64h2 twice; the winner by the two cells' summed step time
  # goes to $MEMRA_HOME/tables (the launch set then includes it) for kernel-check --add-to and the GPU tests.
  link_models
  python3 experiments/attn_tc/choice.py tables /tmp t64h1 t64h2   # (ran as an inline copy of this at fb2abe0)
  cp tune/defaults/nvidia-h200.json /tmp/frozen.json
  for d in 0 4096; do
    for arm in frozen t64h1 t64h2 frozen t64h1 t64h2; do
      arm_run "attn table $arm d$d" bench-choice.jsonl python3 -m memra bench synth:llama3-8b:Q4_K_M -p 0 -n 128 \
        -d $d -r 3 --tune-table /tmp/$arm.json
    done
  done
  cp $R/bench-choice.jsonl $OUT/
  W=$(python3 experiments/attn_tc/choice.py winner $R/bench-choice.jsonl)
  log "winner by the summed step time at depth 0 + 4096: $W"
  H=$(python3 -c "from memra.tune.tables import home_tables_dir; print(home_tables_dir())")
  mkdir -p $H; [ "$W" = frozen ] || cp /tmp/$W.json $H/nvidia-h200.json
  KC_ADD=research/kernel-check/nvidia-h200.json KC_LIMIT=150 kernel_check
  gpu_tests 585 ;;
d)
  depth_vs ;;   # llama.cpp built in the call (carry .llamacpp)
esac
tar czf $OUT/s31-$STAGE.tgz -C /tmp s31-$STAGE
