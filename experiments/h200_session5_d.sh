#!/usr/bin/env bash
# Session 5 (2026-12-01) H200 call D, after .models/smollm2-00/take.sh: the kernel-check
# receipt at the final kernel sources, the served GPU tests (tests/test_serve_gpu.py) with
# the engine thread's context fix, results tarred into $OUT.
export PYTHONUNBUFFERED=1 COLUMNS=200
bash .models/smollm2-01/take.sh > /dev/null && echo smollm2 ok
M=$HOME/.cache/memra/models; mkdir -p "$M"; ln -sf /root/models/smollm2.gguf "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
R=/tmp/s5d; mkdir -p $R/kernel-check; S=$(date +%s)
timeout 150 python3 -m memra kernel-check --out $R/kernel-check/ > $R/kernel-check.txt 2>&1; echo "kernel-check rc=$? $(tail -1 $R/kernel-check.txt) $(( $(date +%s) - S ))s"
python3 -m memra kernel-check --status --json --out $R/kernel-check/nvidia-h200.json > $R/kernel-check-status.json; python3 -m memra kernel-check --status --out $R/kernel-check/nvidia-h200.json | tail -1
S=$(date +%s); timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_serve_gpu.py tests/test_gpu_runner.py > $R/gpu-tests-serve.txt 2>&1; echo "gpu tests rc=$? $(tail -1 $R/gpu-tests-serve.txt) $(( $(date +%s) - S ))s"; grep -E "^(FAILED|ERROR)" $R/gpu-tests-serve.txt | head
tar czf $OUT/s5d.tgz -C $R .
