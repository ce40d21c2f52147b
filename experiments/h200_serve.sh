#!/usr/bin/env bash
# The server issue's evidence on the H200 (issue 11): `memra serve --device gpu` under the
# openai client (64-way isolation, prefix cache hit = miss, cross-salt, across turns) and
# `memra bench serve` against llama-server in one session (issue 11's table: synthetic
# llama3-8b Q4_K_M, ~100-token prompts, 128 tokens each, streaming, c = 1, 8, 32, 64;
# llama-server with -np 64 -fa on -ngl 99 -c 131072 as ../shared/reference/llama-server-h200.jsonl).
#
# Here, once, from the repository root (what the device image lacks, llama.cpp's source, the
# tokenizer the synthetic model copies):
#   bash ../shared/device/wheels.sh && bash ../shared/device/llamacpp.sh
#   python3 -m memra synth .synthtok/smollm2-tokenizer.gguf --tokenizer-only
#   python3 -m memra synth .synthtok/smollm2-utf8-tokenizer.gguf --tokenizer-only --utf8-safe
# The served 8B copies the UTF-8-safe tokenizer (its byte-level pieces of multi-byte characters
# renamed <0xHEX>): with SmolLM2's own, the random model's text held invalid UTF-8 in 64 of
# 212 streams, and llama-server b10605's content parser threw on each, ending the stream with
# an error event (research/2026-12-01-session8/README.md), so its throughput was not comparable.
# Then two device calls back to back (llama.cpp's build lasts only while the machine is warm),
# each carrying [".whl", ".llamacpp", ".synthtok"]:
#   source .whl/setup.sh && STAGE=build MEMRA_GIT_SHA=<sha> bash experiments/h200_serve.sh
#   source .whl/setup.sh && STAGE=evidence MEMRA_GIT_SHA=<sha> bash experiments/h200_serve.sh
# build (~6 min): llama.cpp's llama-server, the synthetic 8B (and the 1B the GPU tests fall
#   back to without SmolLM2 at /root/models/smollm2.gguf), memra's kernels for sm_90a.
# evidence (~8 min): tests/test_serve_gpu.py, then `memra bench serve` of the 8B vs
#   llama-server; $OUT holds serve-bench.jsonl (commit it under research/), the logs, and
#   serve-<stage>.log's table.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=200
START=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$OUT/serve-$STAGE.log"; }
source experiments/h200_common.sh
link_models
TOK=.synthtok/smollm2-tokenizer.gguf
TOKS=.synthtok/smollm2-utf8-tokenizer.gguf   # the served 8B's (see above)
BIN=/root/llama.cpp/build/bin

case "$STAGE" in
build)
  ( synth llama3-8b Q4_K_M "$TOKS" > /root/synth-8b.txt 2>&1; synth llama-1b Q4_0 "$TOK" > /root/synth-1b.txt 2>&1
    python3 -m memra warmup "$(tail -1 /root/synth-8b.txt)" > /root/warmup.txt 2>&1; echo done > /root/synth-done ) &
  log "llama.cpp build"
  timeout 480 bash experiments/llamacpp_bin.sh >> "$OUT/serve-$STAGE.log" 2>&1; log "build rc=$?"
  wait; log "synth: $(tail -1 /root/synth-8b.txt) $(tail -1 /root/synth-1b.txt)"
  tail -2 /root/warmup.txt | tee -a "$OUT/serve-$STAGE.log" ;;
evidence)
  [ -x $BIN/llama-server ] || { log "no llama-server: run STAGE=build in the call just before"; exit 1; }
  M8=$(synth llama3-8b Q4_K_M "$TOKS" | tail -1)
  if [ -f /root/models/smollm2.gguf ]; then TM=smollm2-135m; else TM=$(synth llama-1b Q4_0 "$TOK" | tail -1); fi
  log "GPU serve tests on $TM"
  MEMRA_SERVE_TEST_MODEL=$TM timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_serve_gpu.py \
    > "$OUT/serve-gpu-tests.txt" 2>&1; log "serve gpu tests rc=$? $(tail -1 "$OUT/serve-gpu-tests.txt")"
  grep -E "^(FAILED|ERROR)|assert" "$OUT/serve-gpu-tests.txt" | head -20 | tee -a "$OUT/serve-$STAGE.log"
  log "llama-server on $M8"
  $BIN/llama-server -m "$M8" -ngl 99 -fa on -np 64 -c 131072 --port 8081 --host 127.0.0.1 \
    > "$OUT/llama-server.log" 2>&1 &
  LS=$!
  for _ in $(seq 240); do curl -sf http://127.0.0.1:8081/health > /dev/null && break; sleep 0.5; done
  log "llama-server: $(curl -s http://127.0.0.1:8081/health)"
  timeout 360 python3 -m memra bench serve synth:llama3-8b:Q4_K_M --device gpu --synth-tokenizer "$TOKS" \
    --vs http://127.0.0.1:8081 -c 1,8,32,64 --prompt-tokens 100 --max-tokens 128 \
    --out "$OUT/serve-bench.jsonl" --tag issue11-h200 >> "$OUT/serve-$STAGE.log" 2>&1
  log "bench serve rc=$?"
  kill $LS; wait $LS 2>/dev/null
  python3 - "$OUT/serve-bench.jsonl" <<'PY' | tee -a "$OUT/serve-$STAGE.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["concurrency"], {})[r["engine"]] = r
floors = {1: 1.5, 8: 3.0, 32: None, 64: 5.0}
for c in sorted(by):
    m, l = by[c].get("memra"), by[c].get("llama-server")
    if not (m and l):
        continue
    x = m["agg_tok_s"] / l["agg_tok_s"]
    f = floors.get(c)
    print(f"c={c:>2}  memra {m['agg_tok_s']:8.1f} t/s (TTFT p95 {m['ttft_p95_s']:.3f} s)  llama-server "
          f"{l['agg_tok_s']:7.1f} t/s  ratio {x:5.2f}x  floor {f or '-'}  {'MET' if f is None or x >= f else 'MISSED'}")
PY
  ;;
esac
log "done"
