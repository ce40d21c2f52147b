"""The runner's batch-invariance receipt (issue 9): on each model, a sequence's greedy tokens
and logits alone vs among 63 co-runners at other positions with other sampling settings
(memra.tune.invariance.batch_invariance), and graph replay vs eager launches at every bucket
(graph_vs_eager); one JSON line per model and check, with device, commit and the engine's
matvec path and GEMM setting.

DEVICE: python3 experiments/runner_invariance.py OUT.jsonl [MODEL ...]
        (default models: smollm2-135m gemma3-270m synth:llama-1b:Q4_0)
"""
import json
import sys
import time

from memra.gpu import cuda
from memra.gpu.runner import Runner
from memra.model.gguf import open_gguf
from memra.text.tokenizer import Tokenizer
from memra.tune.bench import device_facts, resolve_model
from memra.tune.invariance import batch_invariance, graph_vs_eager
from memra.tune.receipts import git_sha, utc_now

PROMPT = "The capital of France is Paris. The capital of Germany is"
out = sys.argv[1]
models = sys.argv[2:] or ["smollm2-135m", "gemma3-270m", "synth:llama-1b:Q4_0"]
g = cuda.gpu()
for name in models:
    path = resolve_model(name, ".synthtok/smollm2-tokenizer.gguf")[1]
    ids = Tokenizer.from_gguf(open_gguf(path)).encode(PROMPT, add_special=True, parse_special=True)
    r = Runner(path, max_len=512, max_seqs=64)
    common = {"kind": "invariance", "model": name, "git_sha": git_sha(), "date": utc_now(), **device_facts(g),
              "matvec_path": r.path, "gemm": r.plan.use_gemm, "table": r.tune_source}
    for check, fn in (("alone_vs_63", lambda: batch_invariance(r, ids, n_steps=24, co=63)),
                      ("graph_vs_eager", lambda: graph_vs_eager(r, ids))):
        t0 = time.perf_counter()
        res = fn()
        row = {**common, "check": check, "seconds": round(time.perf_counter() - t0, 2),
               **{k: (v if k != "buckets" else {str(b): x for b, x in v.items()}) for k, v in res.items()}}
        with open(out, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print(name, check, "IDENTICAL" if res["identical"] else f"DIFFERS {res}", flush=True)
