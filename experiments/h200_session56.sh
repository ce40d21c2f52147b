#!/usr/bin/env bash
# Session 56's device calls: issue 11's serve table against llama-server in one session, with MEMRA_DECODE=qf (the
# two-chain gate+up) and q8 as arms of the same call, and the GPU tests of the server and of qf.
# Here, once: bash ../shared/device/llamacpp.sh (.llamacpp) and the tokenizers of experiments/h200_serve.sh:
#   python3 -m memra synth .synthtok/smollm2-tokenizer.gguf --tokenizer-only
#   python3 -m memra synth .synthtok/smollm2-utf8-tokenizer.gguf --tokenizer-only --utf8-safe
# Then two calls back to back (llama.cpp's build lasts only while the machine is warm), carrying
# [".whl", ".llamacpp", ".synthtok", ".models/specs.json"]:
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<sha> && STAGE=build bash experiments/h200_session56.sh
#   source .whl/setup.sh >/dev/null && export MEMRA_GIT_SHA=<sha> && STAGE=evidence bash experiments/h200_session56.sh
# build (~9 min): llama.cpp's llama-server in the background; kernel-check --add-to the committed receipt (carry
#   .models/specs.json too) and the qf GPU tests; the synthetic 8B (UTF-8-safe tokenizer, as h200_serve.sh says why)
#   and 1B Q4_K_M; `memra profile` of the 8B's decode step at 64 and 1 rows at both arms; memra warmup of the 8B at
#   both arms; the server's GPU tests with qf (on the Q4_K_M 1B: qf reaches its Q4_K and Q6_K weights).
# evidence (~6 min): `memra bench serve ... --vs llama-server` at c = 1, 8, 32, 64 for each arm of E_ARMS
#   (default "qf q8"), receipts in $OUT/serve-bench.jsonl tagged by arm; the floors summarized in log.txt.
# all (one call, ~9 min, carrying the four; the way when device time is short): kernel-check (seconds where the
#   receipt is current), the qf GPU tests and the server's with qf (the Q4_K_M 1B) while llama.cpp builds and both
#   arms' kernels compile (memra warmup), then `memra bench serve --vs llama-server` for each arm of E_ARMS while
#   E_END seconds allow (E_C the cells, in that order; receipts appended cell by cell), and the floors' summary.
#   (Session 56 got no machine for it: 16 tries found none; its one machine ran h200_session55.sh's STAGE CA.)
# Session 57 (no machine lent): arms are q8, qf or qfh (qf with MEMRA_QF_HEAD=1, the head on qf too); check_qf's
#   kernel-check runs with MEMRA_QF_HEAD=1 so the head's 6 qf launch cases join the receipt; TAG names the receipts'
#   session. STAGE=tune (~8 min, carrying .whl, .synthtok, .models/specs.json): qf's campaign (tune/campaigns/
#   h200-qf.toml, with the head), its freeze and kernel-check --add-to on the device. The next session's calls:
#   TAG=s58 STAGE=tune; commit its receipts, table and kernel-check receipt; then TAG=s58 E_ARMS="qfh q8"
#   E_C=64,1,8 STAGE=all (c = 32 last if time is left); with one call only, STAGE=all with E_ARMS="qfh qf q8".
# Session 58: TUNE_FIRST=1 (STAGE=all) runs the qf campaign (its qf_gemm candidates at 1-8 rows are new) and the
#   freeze first, so kernel-check and both benches take the tuned table (its copy in $OUT/defaults/). An arm
#   ARM@N runs the server with a step's token budget of N (--max-num-batched-tokens): E_ARMS="qfh@8192 qfh q8@8192".
#   More than 8 files in $OUT come back as $OUT/out.tgz (h200_common.sh's pack_out). E_ROUNDS=N: each cell N times,
#   the servers interleaved (llama-server's c = 64 moved 880-1,022 t/s between calls). STAGE=probe (~4 min,
#   carrying .whl and .synthtok): the server's and runner's GPU tests (the warm-up's prompt grids), served prompts'
#   prefill against pp512's (experiments/serve_host/prefill_probe.py) and the prefill chunk's profile.
#   (Session 57's STAGE=v17, qf_gemm v17's A/B, went with the losing copy: `git show 2edb892:experiments/h200_session56.sh`.)
#   STAGE=ab (~3 min, carrying .whl and .synthtok): the serve A/B of E_ARMS alone, without llama-server, for a short
#   device window.
set -u
source experiments/h200_common.sh
stage_begin s56
TOKS=.synthtok/smollm2-utf8-tokenizer.gguf
TAG=${TAG:-s56}
# an arm's environment: q8, qf, or qfh (qf with the head on qf too: MEMRA_QF_HEAD=1, session 57)
# (session 58) ARM@N: that arm with a scheduler step's token budget of N (MEMRA_MAX_NUM_BATCHED_TOKENS)
arm_env() {
  local a=${1%@*} b=""
  [ "$a" != "$1" ] && b=" MEMRA_MAX_NUM_BATCHED_TOKENS=${1#*@}"
  case $a in qfh) echo "MEMRA_DECODE=qf MEMRA_QF_HEAD=1$b" ;; *) echo "MEMRA_DECODE=$a$b" ;; esac
}
BIN=/root/llama.cpp/build/bin
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }   # under $1 seconds of the call spent
log "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tune_qf() {   # tune_qf LIMIT_S: qf's campaign (--resume: only what this device lacks) with the head, its freeze; the
  # receipts, the table (under $OUT/defaults: the kernel-check receipt takes $OUT/nvidia-h200.json) and logs to $OUT
  ( export MEMRA_QF_HEAD=1; tune_campaign h200-qf $1 -m synth:llama3-8b:Q4_K_M )
  freeze_show $TAG; mkdir -p $OUT/defaults; cp tune/defaults/nvidia-h200.json $OUT/defaults/
  cp research/tune/h200-qf-nvidia-h200.jsonl $R/tune-h200-qf.txt $R/freeze-$TAG.txt $R/show-$TAG.txt $OUT/ 2>/dev/null
}
check_qf() {   # kernel-check --add-to the committed receipt (seconds where it is current), from the real models'
  # exported specs (carry .models/specs.json), its receipt to $OUT first; then the qf GPU tests
  mkdir -p $R/kernel-check
  # MEMRA_QF_HEAD=1: the launch set holds the head's qf cases too (a run without the flag reads a superset as current)
  MEMRA_QF_HEAD=1 MEMRA_MODEL_SPECS=.models/specs.json timeout ${KC_LIMIT:-220} python3 -m memra kernel-check --out $R/kernel-check/ \
    --add-to research/kernel-check/nvidia-h200.json > $R/kernel-check.txt 2>&1
  log "kernel-check rc=$? $(tail -1 $R/kernel-check.txt) $(el)"
  grep -E "^FAIL|^NOTE|not caught|^incremental" $R/kernel-check.txt | head -20 | cut -c1-300 | tee -a $R/log.txt
  cp $R/kernel-check/nvidia-h200.json $OUT/ 2>/dev/null; gzip -c $R/kernel-check.txt > $OUT/kernel-check.txt.gz
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_qf.py > $R/gpu-tests-qf.txt 2>&1
  log "qf gpu tests rc=$? $(tail -1 $R/gpu-tests-qf.txt) $(el)"
}
summary() {   # issue 11's floors from $OUT/serve-bench.jsonl, a line a cell with both servers
  [ -f $OUT/serve-bench.jsonl ] || return 0
  python3 - $OUT/serve-bench.jsonl <<'PY' | tee -a $R/log.txt
import json, sys
floors = {1: 1.5, 8: 3.0, 64: 5.0}
rows = [json.loads(l) for l in open(sys.argv[1])]
cells = {}
for r in rows:   # every round of a cell (E_ROUNDS): the medians
    cells.setdefault((r.get("tag"), r["concurrency"]), {}).setdefault(r["engine"], []).append(r)
med = lambda rs, k: sorted(x[k] for x in rs)[len(rs) // 2]
for (tag, c), e in cells.items():
    m, l = e.get("memra"), e.get("llama-server")
    if not (m and l):
        continue
    mt, lt = med(m, "agg_tok_s"), med(l, "agg_tok_s")
    x, f = mt / lt, floors.get(c)
    print(f"{tag}  c={c:>2}  memra {mt:8.1f} t/s (TPOT p50 {med(m, 'tpot_p50_s')}, TTFT p95 "
          f"{med(m, 'ttft_p95_s'):.3f} s)  llama-server {lt:7.1f} t/s  {x:5.2f}x  floor {f or '-'}  "
          f"{'MET' if f is None or x >= f else 'MISSED'}  (rounds {len(m)})")
PY
}
case "$STAGE" in
build)
  ( timeout 480 bash experiments/llamacpp_bin.sh > $R/build.txt 2>&1; echo "rc=$?" >> $R/build.txt ) &
  B=$!
  check_qf
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1); M1=$(synth llama-1b Q4_K_M "$TOK" | tail -1)
  log "synth: $M8 $M1 $(el)"
  # where a 64-row and a one-row decode step's time goes at each arm (Q6_K in qf: the downs, the v's)
  for np in 64 1; do
    for arm in q8 qf qfh; do
      left 420 || break
      env MEMRA_ATTN=hybrid $(arm_env $arm) timeout 90 python3 -m memra profile "$M8" -np $np --json \
        > $R/profile-$arm-$np.json 2> $R/profile-$arm-$np.err
      log "profile $arm np=$np rc=$? $(el)"; cp $R/profile-$arm-$np.json $OUT/ 2>/dev/null
    done
  done
  for arm in qfh qf q8; do
    left 500 || break
    env $(arm_env $arm) timeout 100 python3 -m memra warmup "$M8" > $R/warmup-$arm.txt 2>&1
    log "warmup $arm rc=$? $(tail -1 $R/warmup-$arm.txt | cut -c1-200) $(el)"
  done
  if left 450; then
    MEMRA_DECODE=qf MEMRA_SERVE_TEST_MODEL=$M1 timeout 120 python3 -m pytest -q -p no:cacheprovider \
      tests/test_serve_gpu.py > $R/gpu-tests-serve-qf.txt 2>&1
    log "serve gpu tests (qf) rc=$? $(tail -1 $R/gpu-tests-serve-qf.txt) $(el)"
  fi
  grep -hE "^(FAILED|ERROR)" $R/gpu-tests-*.txt | head -20 | tee -a $R/log.txt
  wait $B; log "llama.cpp: $(tail -3 $R/build.txt | tr '\n' ' ') $(el)"
  cp $R/*.txt $OUT/ ;;
evidence)
  [ -x $BIN/llama-server ] || { log "no llama-server: run STAGE=build in the call just before"; cp $R/log.txt $OUT/; exit 1; }
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1)
  $BIN/llama-server -m "$M8" -ngl 99 -fa on -np 64 -c 131072 --port 8081 --host 127.0.0.1 > $R/llama-server.log 2>&1 &
  LS=$!
  for _ in $(seq 240); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 0.5; done
  log "llama-server: $(curl -s http://127.0.0.1:8081/health) $(el)"
  for arm in ${E_ARMS:-qf q8}; do
    env $(arm_env $arm) timeout ${E_LIMIT:-240} python3 -m memra bench serve synth:llama3-8b:Q4_K_M --device gpu \
      --synth-tokenizer "$TOKS" --vs http://127.0.0.1:8081 -c ${E_C:-1,8,32,64} --prompt-tokens 100 \
      --max-tokens 128 --out $OUT/serve-bench.jsonl --tag "$TAG $(arm_env $arm)" > $R/bench-$arm.txt 2>&1
    log "bench serve $arm rc=$? $(el)"; tail -12 $R/bench-$arm.txt | cut -c1-200 | tee -a $R/log.txt
  done
  kill $LS; wait $LS 2>/dev/null
  summary
  cp $R/log.txt $R/llama-server.log $R/bench-*.txt $OUT/ ;;
all)
  # one call for what matters most when device time is short: kernel-check, the qf GPU tests, and issue 11's table
  # with qf against llama-server (built meanwhile), then the q8 arm and the profiles as time allows
  # (OUT= : no packed binaries in $OUT, 47 MB that cannot travel back here anyway)
  ( OUT= timeout 420 bash experiments/llamacpp_bin.sh > $R/build.txt 2>&1; echo "rc=$?" >> $R/build.txt ) &
  B=$!
  if [ -n "${TUNE_FIRST:-}" ]; then   # session 58: the qf campaign's new jobs (qf_gemm at 1-8 rows; all of it on an
    # H200, whose receipts it lacks) and the freeze before anything reads the table; check_qf then runs its new cases
    tune_qf ${TUNE_LIMIT:-150}
  fi
  # both arms' servers compile their modules here, not inside the bench (a cold qf server outlasted 66 s in session
  # 56's first call)
  ( M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1)
    for arm in ${E_ARMS:-qf q8}; do
      env $(arm_env $arm) nice -n 5 python3 -m memra warmup "$M8" > $R/warmup-$arm.txt 2>&1
    done ) &
  W=$!
  check_qf; cp $R/log.txt $R/gpu-tests-qf.txt $OUT/
  M1=$(synth llama-1b Q4_K_M "$TOK" | tail -1)
  MEMRA_DECODE=qf MEMRA_SERVE_TEST_MODEL=$M1 timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_serve_gpu.py > $R/gpu-tests-serve-qf.txt 2>&1
  log "serve gpu tests (qf, $M1) rc=$? $(tail -1 $R/gpu-tests-serve-qf.txt) $(el)"; cp $R/gpu-tests-serve-qf.txt $OUT/
  wait $W; for arm in ${E_ARMS:-qf q8}; do log "warmup $arm: $(tail -1 $R/warmup-$arm.txt | cut -c1-200) $(el)"; done
  wait $B; log "llama.cpp: $(tail -2 $R/build.txt | tr '\n' ' ') $(el)"
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1)
  VS=""
  if [ -x $BIN/llama-server ]; then
    $BIN/llama-server -m "$M8" -ngl 99 -fa on -np 64 -c 131072 --port 8081 --host 127.0.0.1 > $R/llama-server.log 2>&1 &
    LS=$!
    for _ in $(seq 240); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 0.5; done
    log "llama-server: $(curl -s http://127.0.0.1:8081/health) $(el)"; VS="--vs http://127.0.0.1:8081"
  fi
  for arm in ${E_ARMS:-qf q8}; do
    left ${E_END:-470} || { log "bench $arm: no time left"; break; }
    env $(arm_env $arm) timeout $(( ${CALL_LIMIT:-585} - ($(date +%s) - T0) )) python3 -m memra bench serve synth:llama3-8b:Q4_K_M \
      --device gpu --synth-tokenizer "$TOKS" $VS -c ${E_C:-64,8,1,32} --rounds ${E_ROUNDS:-1} --prompt-tokens 100 --max-tokens 128 \
      --out $OUT/serve-bench.jsonl --tag "$TAG $(arm_env $arm)" > $R/bench-$arm.txt 2>&1
    log "bench serve $arm rc=$? $(el)"; tail -12 $R/bench-$arm.txt | cut -c1-200 | tee -a $R/log.txt
  done
  [ -n "${LS:-}" ] && kill $LS
  summary
  cp $R/log.txt $R/bench-*.txt $R/build.txt $R/llama-server.log $OUT/ 2>/dev/null ;;
tune)
  # qf's first campaign (tune/campaigns/h200-qf.toml, session 57: its tune hooks), the head's shape too (--resume
  # continues a cut one: its receipts are research/tune/h200-qf-nvidia-h200.jsonl), the freeze (freeze_show: the
  # shipped table's --pdl freeze, the qf entries joining it), then check_qf: kernel-check --add-to runs the new
  # entries' launch cases and the head's, and the qf GPU tests. To $OUT: the receipts, the table, the kernel-check
  # receipt (commit all three); then STAGE=all measures the tuned arms.
  tune_qf ${TUNE_LIMIT:-330}
  grep -E "^│ qf" $R/freeze-$TAG.txt | head -60 | cut -c1-220 > $OUT/qf-entries.txt
  check_qf
  cp $R/log.txt $OUT/ ;;
ab)
  # a short call: `memra bench serve` of the synthetic 8B for each arm of E_ARMS (default "qfh q8"), memra alone (no
  # llama-server: its build does not fit), cells E_C (default 64,8,1); the runner compiles its plan's modules ahead
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1); log "synth $M8 $(el)"
  for arm in ${E_ARMS:-qfh q8}; do
      left ${E_END:-400} || { log "bench $arm: no time left"; break; }
    env $(arm_env $arm) timeout $(( ${CALL_LIMIT:-540} - ($(date +%s) - T0) )) python3 -m memra bench serve \
      synth:llama3-8b:Q4_K_M --device gpu --synth-tokenizer "$TOKS" -c ${E_C:-64,8,1} --prompt-tokens 100 \
      --max-tokens 128 --out $OUT/serve-ab.jsonl --tag "$TAG $(arm_env $arm)" > $R/bench-$arm.txt 2>&1
    log "bench serve $arm rc=$? $(el)"; tail -8 $R/bench-$arm.txt | cut -c1-200 | tee -a $R/log.txt
  done
  cp $R/log.txt $R/bench-*.txt $OUT/ 2>/dev/null ;;
probe)
  # (session 58, ~4 min, carrying .whl and .synthtok) why served prompts run at ~12k tokens/s where pp512 reads
  # ~18k (experiments/serve_host): the runner's step() over a scheduler step's prompts against one 512-token prompt
  # at each arm of E_ARMS (default "qfh q8"), and memra profile of a 512-row prefill chunk (one sequence): where its
  # time goes
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1); M1=$(synth llama-1b Q4_K_M "$TOK" | tail -1); log "synth $M8 $(el)"
  # session 58's warm-up change (every attn_fa prompt grid captured) on the device: the server's GPU tests
  MEMRA_SERVE_TEST_MODEL=$M1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_serve_gpu.py \
    tests/test_gpu_runner.py > $R/gpu-tests-serve.txt 2>&1
  log "serve + runner gpu tests rc=$? $(tail -1 $R/gpu-tests-serve.txt) $(el)"
  for arm in ${E_ARMS:-qfh q8}; do
    env MEMRA_ATTN=hybrid $(arm_env $arm) timeout 200 python3 experiments/serve_host/prefill_probe.py "$M8" \
      --out $R/prefill-probe-$arm.jsonl > $R/prefill-probe-$arm.txt 2>&1
    log "prefill probe $arm rc=$? $(el)"; grep '^{' $R/prefill-probe-$arm.txt | tee -a $R/log.txt
    env MEMRA_ATTN=hybrid $(arm_env $arm) timeout 90 python3 -m memra profile "$M8" -np 512 --prefill --json \
      > $R/profile-prefill-$arm.json 2> $R/profile-prefill-$arm.err
    log "profile prefill $arm rc=$? $(el)"
  done
  cp $R/log.txt $R/gpu-tests-serve.txt $R/prefill-probe-*.jsonl $R/profile-prefill-*.json $OUT/ 2>/dev/null ;;
*) echo "unknown STAGE $STAGE"; exit 2 ;;
esac
