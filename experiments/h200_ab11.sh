#!/usr/bin/env bash
# The A/Bs prepared in session 10, for the next H200 calls (no models needed except STEPS=l2, which
# makes two synthetic ones; a call holds at most 600 s, so: STEPS="wg free" (~8 min), STEPS=mvt
# (~6 min), STEPS="rows attn" (~6 min), STEPS=l2 (~5 min) — about 25 min for all: pick by what
# the session will land; in expected value: wg + free, mvt, rows, l2, attn):
#   source .whl/setup.sh && STEPS="wg free" bash experiments/h200_ab11.sh
#   source .whl/setup.sh && STEPS=mvt bash experiments/h200_ab11.sh
# wg   experiments/gemm_wg/check.py — the wgmma warpgroup GEMM prototype: bit checks against
#      mv_q8 for both descriptor field orders, the canary, then timing against gemm.cu at 128 and
#      512 rows; $OUT/gemm-wg.jsonl, $OUT/gemm-wg.log.
# free experiments/gemm_free/ab.sh — what the matvec's reduction order costs the GEMM;
#      $OUT/sweep-{new,old}.*: old = free order.
# mvt  experiments/mvt/v6/ab.sh — mvt variant 6 against kernels/mvt.cu at 4 / 8 / 16 rows;
#      $OUT/mvt-{old,v6u1,v6u2}.*.
# attn experiments/attn_prefill_probe.py — the decode attention over a 512-row prefill chunk
#      (SmolLM2, 1B, 8B shapes; depth 0 and 4096), then ncu of SmolLM2's launch: what a multi-row
#      variant (docs/PERFORMANCE.md "Session 10") has to beat and what bounds it;
#      $OUT/attn-prefill.jsonl, $OUT/ncu-attn.txt.
# l2   experiments/mv_l2all/ab.sh — small matrices' weights all prefetched into L2 before the PDL
#      wait (tg128 of the 8B Q8_0 and the 1B, built-in configurations, before / after the edit);
#      needs .synthtok carried; $OUT/mv-l2all.jsonl.
# rows experiments/attn_rows/check.py — attn_decode with 2..16 token rows a block against the
#      one-row launch over the same 512-row chunk (bits and us); $OUT/attn-rows.jsonl.
# Commit the outputs under research/ with the decisions (experiments/gemm_wg/README.md,
# experiments/gemm_free/README.md, experiments/mvt/README.md say what each result decides).
set -u
: "${OUT:?}"
T0=$(date +%s)
for s in ${STEPS:-wg free}; do
  echo "== $s ($(( $(date +%s) - T0 )) s)"
  case $s in
    wg) timeout 240 python3 experiments/gemm_wg/check.py > "$OUT/gemm-wg.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|passed|ERR|compiled" "$OUT/gemm-wg.log" | head -30; sed -n '/wg us/,$p' "$OUT/gemm-wg.log" ;;
    free) timeout 280 bash experiments/gemm_free/ab.sh 2>&1 | tail -30 ;;
    mvt) timeout 420 bash experiments/mvt/v6/ab.sh 2>&1 | tail -60 ;;
    l2) timeout 330 bash experiments/mv_l2all/ab.sh ;;
    rows) timeout 200 python3 experiments/attn_rows/check.py > "$OUT/attn-rows.jsonl" 2> "$OUT/attn-rows.err"; echo "rc=$?"
          cat "$OUT/attn-rows.jsonl"; tail -5 "$OUT/attn-rows.err" ;;
    attn) for d in 0 4096; do timeout 90 python3 experiments/attn_prefill_probe.py --depth $d >> "$OUT/attn-prefill.jsonl"; done
          cat "$OUT/attn-prefill.jsonl"
          timeout 150 ncu --clock-control none -k regex:attn_decode --launch-count 1 --section SpeedOfLight \
            --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats \
            python3 experiments/attn_prefill_probe.py smollm2 --once > "$OUT/ncu-attn.txt" 2>&1
          grep -E "Duration|Issue Slots|Achieved Occupancy|L1/TEX Hit|L2 Hit|DRAM Through|Memory Through|Warp Cycles" "$OUT/ncu-attn.txt" ;;
  esac
done
echo "== done ($(( $(date +%s) - T0 )) s)"
