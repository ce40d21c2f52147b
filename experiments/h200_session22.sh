#!/usr/bin/env bash
# The next session's H200 calls (prepared in session 21; research/2026-12-03-session21).
# Ran in session 22 (research/2026-12-03-session22): r and f on 7f34f72 with session 21's attn_fa v8
# landing patch and experiments/gemm_tile_rpad's patch applied, then (both landed as 2b66c2d, GT_LDA
# removed) k, s, t; the models shipped (experiments/ship_models.py) before k.
# STAGE k (carry .whl + .synthtok + .llamacpp; ~8 min): llama.cpp built in the background while the
#   whole kernel-check runs (kernels/attn_fa.cu changed: ~220 s), then `memra bench --vs llama.cpp` of
#   every model (the floors' receipts: issue 10's 8B @ d4096 cell is predicted ~0.98x with v8).
#   Copy $OUT/nvidia-h200.json to research/kernel-check/ and commit it with the patch. A whole run: the
#   committed receipt predates the kernel files each family records; from that receipt on, a change
#   to one family's sources is `memra kernel-check --add-to` (that family whole, the rest standing).
# STAGE r (carry .whl + .synthtok; ~1.5 min; first, with experiments/gemm_tile_rpad/rpad.patch applied
#   too): the tile's row-record padding x loader addressing (GT_RPAD, GT_LDA 0 / 1, 56 jobs); keep
#   each default only if it wins (a lost one: its default 0 in the patch before STAGE k),
#   then STAGE k checks the final sources.
# STAGE t (carry .whl + .synthtok; ~6 min): every GPU test.
# Then, with k's receipt committed: experiments/h200_session21.sh STAGE t, the tile campaign (never run:
#   360 jobs; e.g. the 8B QKV shapes' 160-192 blocks are 1.2-1.5 waves of 132 SMs at the built-in 2 x 4
#   tile), the freeze and kernel-check --add-to for the new table entries (~7 min).
# Then, same lease as k (llama-bench built there): experiments/h200_session20.sh STAGE l (issue 10's 4k
#   prompt TTFT beside llama.cpp, the 32k prompt, the impossible context; last run in session 9)
#   and STAGE s (issue 11's serve evidence against llama-server; last run in session 15).
# STAGE f (carry .whl + .synthtok; ~3 min): attn_fa v8's times at 4 and 8 warps on the engine's grid (fa_check
#   now trims grid x to the groups as the runner does; sessions 20-21 timed one block a row along x,
#   512 for 16-32 groups, the rest exiting at once: the same overhead in both arms, but not the
#   engine's µs, and biased between 4 and 8 warps), then the engine's pp512 @ d0 / d4096 with
#   MEMRA_FA_WARPS 4 / 8 alternating on the 8B and the 1B (the landing patch's 4 rests on the biased
#   timing: keep it only if the engine agrees).
#   source .whl/setup.sh && export MEMRA_GIT_SHA=<commit> && STAGE=k bash experiments/h200_session22.sh
set -u
source experiments/h200_common.sh
stage_begin s22
case "$STAGE" in
k)
  link_models "kernel-check's launch set and the real models' bench cells need them"
  serve_build_start
  KC_LIMIT=300 kernel_check
  serve_build_wait
  bench_vs_llamacpp /root/llama.cpp/build/bin/llama-bench
  # where an 8B decode step goes now, one sequence (issue 14) and 64 (issue 11's c = 64 is 64-row steps)
  for np in 1 64; do
    timeout 60 python3 -m memra profile synth:llama3-8b:Q4_K_M -np $np -d 128 --synth-tokenizer $TOK \
      > $R/profile-8b-np$np.txt 2>&1; log "profile 8B np$np rc=$? $(el)"; cp $R/profile-8b-np$np.txt $OUT/
  done ;;
r)
  TUNE_OUT=$OUT/h200-gemm-tile-rpad-nvidia-h200.jsonl tune_campaign h200-gemm-tile-rpad 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama3-8b:Q4_0 -m synth:llama3-8b:Q8_0
  python3 - $OUT/h200-gemm-tile-rpad-nvidia-h200.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    c = r["config"]
    by.setdefault((r["kernel"], json.dumps(r["shape"], sort_keys=True)), {})[(c.get("GT_RPAD"), c.get("GT_LDA"))] = r
for (k, sh), d in sorted(by.items()):
    base = d.get((0, 0))
    if base and base["ok"]:
        arms = "  ".join(f"rpad {a} lda {b} {r['median_us']:.1f} ({r['median_us'] / base['median_us'] - 1:+.1%})"
                         for (a, b), r in sorted(d.items()) if r["ok"])
        print(f"{k} {sh}: {arms}")
PY
  ;;
t)
  link_models "the GPU tests need them"
  gpu_tests 500 ;;
a)
  # decode attention at 1-512 keys, warps x tile x ring (tune/campaigns/h200-attn-short.toml; 96 jobs)
  TUNE_OUT=$OUT/h200-attn-short-nvidia-h200.jsonl tune_campaign h200-attn-short 150 \
    -m synth:llama3-8b:Q4_K_M -m synth:llama-1b:Q4_0 -m synth:smollm2-135m:Q8_0
  python3 -m memra research summarize $OUT/h200-attn-short-nvidia-h200.jsonl \
    --by shape_key,config.ATT_WARPS,config.ATT_TILE,config.ATT_RING 2>&1 | tee -a $R/log.txt
  ;;
s)
  # issue 11's serve evidence (tests/test_serve_gpu.py, then `memra bench serve --vs` llama-server),
  # in STAGE k's lease (llama-server built there); STAGE t then runs with
  # GPU_TESTS_EXTRA="--ignore=tests/test_serve_gpu.py"
  serve_evidence ;;
f)
  for w in 4 8; do
    OUT=$R timeout 60 python3 experiments/attn_mma/fa_check.py --no-checks --shapes llama3-8b,llama-1b,smollm2,gemma3-global \
      --modes prefill:0,prefill:4096 --rows 512 --split 4096 --warps $w >> $R/fa-time.txt 2>&1
    log "fa_check warps $w rc=$? $(el)"
  done
  cp $R/fa-check.jsonl $OUT/ 2>/dev/null; grep -h fa-time $R/fa-time.txt | cut -c1-230 | tee -a $R/log.txt
  bench_arms MEMRA_FA_WARPS "4 8 4 8" bench-fa-warps.jsonl synth:llama3-8b:Q4_K_M synth:llama-1b:Q4_0 -- \
    -p 512 -n 0 -d 0,4096 -r 3 ;;
esac
tar czf $OUT/s22-$STAGE.tgz -C /tmp s22-$STAGE
