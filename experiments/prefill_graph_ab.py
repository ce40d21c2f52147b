"""Why does a captured prefill graph slow the decode graph (SmolLM2 tg128 2081 -> 1905 t/s
on the H200)? One runner per process, argv: MODEL MODE; a 20-token prompt, then 128
decode-graph replays timed from position 0 (as memra bench's tg128), median of 5. MODE:
  eager        the prompt launched eagerly (MEMRA_PREFILL_GRAPH=0's way)
  graph        the prompt as its bucket's prefill graph (captured, not replayed)
  eager+cap    eager, then the same launches captured into a graph that is never launched
  eager+tiny   eager, then one embed launch captured into a graph
  decodefirst  the decode graph captured before the prompt, the prompt as a prefill graph
  graph+sync   graph, then a device sync and the prefill graph closed
  graph-noup   graph, the prefill graph not uploaded (Graph.upload a no-op until the decode)
  eager+capup  eager+cap, the never-launched graph uploaded before it is closed
  graph-noup2  graph-noup, then a second 20-token prompt (the prefill graph launched)
  graph2       graph, then a second 20-token prompt (the prefill graph launched)"""
import sys
import time

import numpy as np

from memra.gpu.runner import Row, Runner, Sampling
from memra.tune.bench import resolve_model

name, path = resolve_model(sys.argv[1], None)
mode = sys.argv[2]
from memra.gpu import cuda as C

up = C.Graph.upload
if mode in ("graph-noup", "graph-noup2"):
    C.Graph.upload = lambda self: None
r = Runner(path, max_seqs=1, prefill_graph=mode in ("graph", "decodefirst", "graph+sync", "graph-noup", "graph-noup2", "graph2"))
s = r.open()
if mode == "decodefirst":
    r.decode_prepare([s], [5], 128, [Sampling(0.0)], hist=128)
    r.rewind(s, 0)
r.step([Row(s, list(range(1, 21)), logits="last")])
if mode.endswith("2"):
    r.step([Row(s, list(range(21, 41)), logits="last")])
C.Graph.upload = up
if mode in ("eager+cap", "eager+tiny", "eager+capup"):
    launches = r.plan.step(32, decode=False)
    if mode == "eager+tiny":
        launches = launches[:1]
    with r.g.capture() as gr:
        r._run(launches, 32, *r.step_rows(32))
    if mode == "eager+capup":
        gr.upload()
    gr.close()
if mode == "graph+sync":
    r.g.sync()
    for k in [k for k in r._graphs if k[0] == "prefill"]:
        r._graphs.pop(k).close()
v = []
for _ in range(6):
    r.rewind(s, 0)
    gr = r.decode_prepare([s], [5], 128, [Sampling(0.0)], hist=128)
    r.g.sync()
    t0 = time.perf_counter_ns()
    for _ in range(128):
        gr.launch()
    r.g.sync()
    v.append(128e9 / (time.perf_counter_ns() - t0))
print(f"{name} {mode}: tg128 {np.median(v[1:]):.1f} t/s ({', '.join(f'{x:.0f}' for x in v)})")
