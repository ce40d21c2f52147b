#!/usr/bin/env bash
# Hardware counters of gemm.cu (or with KIND=mvt, mvt.cu) on the H200 (ncu, --clock-control none):
# one launch per case of experiments/gemm_check.py's (experiments/mvt/mvt_check.py's) timing,
# with the stall reasons per SASS line (SourceCounters).
#   source .whl/setup.sh && CASES="glu:64:2,2,2,2,2,3,1,2:Q4_K 4096x14336:64:...:Q6_K" bash experiments/h200_ncu.sh
#   source .whl/setup.sh && KIND=mvt CASES="glu:8:1,8,1,2,0,2,1:Q4_K" bash experiments/h200_ncu.sh
#   source .whl/setup.sh && KIND=fa CASES="llama3-8b:4096:4096:8" bash experiments/h200_ncu.sh
# (KIND=fa: attn_fa's prefill packing over a chunk of ROWS (512) rows, experiments/attn_mma/fa_check.py;
#  a case: its shape, the chunk's depth, FA_SPLIT, the warps a block)
#   source .whl/setup.sh && KIND=engine CASES="synth:llama3-8b:Q4_K_M/gemm_tile_glu/0" bash experiments/h200_ncu.sh
# (KIND=engine: the first launch of a kernel (a regex) in `memra profile MODEL --prefill -np ROWS -d DEPTH`,
#  the engine's own module and launch; a case: MODEL/KERNEL/DEPTH; TOK: a synthetic model's tokenizer;
#  KIND=decode: the same in a decode step of ROWS rows (default 1), `memra profile MODEL -np ROWS -d DEPTH`)
#   source .whl/setup.sh && KIND=decode CASES="synth:llama3-8b:Q4_K_M/attn_decode_rope/64" bash experiments/h200_ncu.sh
# (a case: a substring of a timing shape's name, nb, the config, the type)
# Writes $OUT/ncu/<n>.{txt,src.csv} (details page; source page with per-instruction samples).
set -u
: "${OUT:?set OUT}"
mkdir -p "$OUT/ncu"
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters"
n=0
for c in ${CASES:?}; do
  if [ "${KIND:-gemm}" = engine ] || [ "${KIND:-gemm}" = decode ]; then
    IFS=/ read -r model kern depth <<< "$c"
    n=$((n+1))
    if [ "$KIND" = engine ]; then pre=--prefill; rows=${ROWS:-512}; else pre=; rows=${ROWS:-1}; fi
    echo "== $n: $model kernel $kern depth $depth rows $rows ${pre:-decode}"
    # NCU_SKIP: matching launches to pass over first. A decode case at depth D fills the depth with prefill-path
    # steps that may launch attn_decode_rope too (no decode row: its blocks leave at once; session 39's profiled
    # launch, 3.4 µs at 0.5 % of DRAM, grid 3 x 64, looks like one): skip ceil(D / 512) x n_layer of them to reach the decode step's
    timeout 300 ncu --clock-control none -k "regex:^${kern}\$" --launch-skip ${NCU_SKIP:-0} --launch-count 1 $SECS \
      --import-source yes \
      -o "$OUT/ncu/$n" -f python3 -m memra profile "$model" $pre -np "$rows" -d "$depth" --reps 1 \
      ${TOK:+--synth-tokenizer "$TOK"} > "$OUT/ncu/$n.run.txt" 2>&1
    echo "rc=$?"; tail -3 "$OUT/ncu/$n.run.txt"
    ncu --import "$OUT/ncu/$n.ncu-rep" --page details > "$OUT/ncu/$n.txt" 2>&1
    ncu --import "$OUT/ncu/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/$n.src.csv" 2>&1
    rm -f "$OUT/ncu/$n.ncu-rep"
    continue
  fi
  IFS=: read -r shape nb cfg ty <<< "$c"
  n=$((n+1))
  echo "== $n: shape '$shape' nb $nb cfg $cfg type $ty"
  if [ "${KIND:-gemm}" = fa ]; then
    # nb: the depth, cfg: the split, ty: the warps
    timeout 240 ncu --clock-control none -k regex:'^attn_fa$' --launch-count 1 $SECS --import-source yes \
      -o "$OUT/ncu/$n" -f python3 experiments/attn_mma/fa_check.py --no-checks --once --shapes "$shape" \
      --modes "prefill:$nb" --split "$cfg" --warps "$ty" --rows "${ROWS:-512}" > "$OUT/ncu/$n.run.txt" 2>&1
    echo "rc=$?"; tail -3 "$OUT/ncu/$n.run.txt"
    ncu --import "$OUT/ncu/$n.ncu-rep" --page details > "$OUT/ncu/$n.txt" 2>&1
    ncu --import "$OUT/ncu/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/$n.src.csv" 2>&1
    rm -f "$OUT/ncu/$n.ncu-rep"
    continue
  fi
  if [ "${KIND:-gemm}" = mvt ]; then
    K=mvt_q8; CMD="experiments/mvt/mvt_check.py --no-checks --no-gemm"
  else
    K=gemm_q8; CMD="experiments/gemm_check.py --no-checks --no-legacy"
  fi
  timeout 240 ncu --clock-control none -k regex:$K --launch-count 1 $SECS --import-source yes \
    -o "$OUT/ncu/$n" -f python3 $CMD --types "$ty" \
    --shapes "$shape" --nbs "$nb" --configs "$cfg" --reps 1 > "$OUT/ncu/$n.run.txt" 2>&1
  echo "rc=$?"; tail -3 "$OUT/ncu/$n.run.txt"
  ncu --import "$OUT/ncu/$n.ncu-rep" --page details > "$OUT/ncu/$n.txt" 2>&1
  ncu --import "$OUT/ncu/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/$n.src.csv" 2>&1
  rm -f "$OUT/ncu/$n.ncu-rep"
done
cd "$OUT" && tar czf ncu.tgz ncu && rm -rf ncu
