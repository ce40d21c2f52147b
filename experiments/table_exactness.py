"""The exactness contract with the tuned table in force (the GPU tests use models whose shapes
the table does not cover): on synthetic models at the table's shapes, graph replay against
eager decode bit for bit, one sequence alone against the same prompt in a batch of 3, and the
argmax gate — with the device's table (auto) and, for comparison, built-in defaults.

Run on the device: python3 experiments/table_exactness.py > $OUT/table_exactness.jsonl
"""
import json
import sys
import time

import numpy as np

from memra.tune.bench import synth_model
from memra.gpu.engine import GPUEngine
from memra.gpu.gate import cross_check

CASES = [("llama-1b", "Q4_0"), ("smollm2-135m", "Q4_1"), ("gemma3-270m", "Q4_K_M")]
TOK = sys.argv[1] if len(sys.argv) > 1 else ".synthtok/smollm2-tokenizer.gguf"


def check(path, table):
    t0 = time.perf_counter()
    e = GPUEngine(str(path), n_ctx=256, tune_table=table)
    ids = [(7 * i + 3) % e.cfg.n_vocab for i in range(40)]
    gate, _ = cross_check(e, ids)
    toks = e.generate_greedy(ids, 24)
    e.reset()
    e.prefill(ids)
    eager = [e.decode(t, graph=False) for t in toks]
    e.reset()
    e.prefill(ids)
    graph_equal = all(np.array_equal(e.decode(t, graph=True), x) for t, x in zip(toks, eager))
    b = GPUEngine(str(path), n_ctx=256, batch=3, tune_table=table)
    batched = b.generate_greedy_batch([ids[:20], ids, ids[::-1]], 24)
    return {"table": e.tune_source, "gate": gate.verdict, "graph_equal_eager_24": graph_equal,
            "batch3_equal_alone_24": batched[1] == toks, "s": round(time.perf_counter() - t0, 1)}


for shape, quant in CASES:
    p = synth_model(shape, quant, TOK)
    for table in ("auto", "builtin"):
        try:
            rec = {"shape": shape, "quant": quant, **check(p, table)}
        except Exception as ex:  # report, keep going
            rec = {"shape": shape, "quant": quant, "table": table, "error": f"{type(ex).__name__}: {ex}"}
        print(json.dumps(rec), flush=True)
