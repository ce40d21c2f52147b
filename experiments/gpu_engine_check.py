"""GPU engine check: kernel families, the engine's greedy tokens vs the CPU reference,
graph replay vs eager decode, the argmax gate, and decode speed — one device call.

Here (no GPU):   python experiments/gpu_engine_check.py prepare
    writes .gpucheck/: tiny synthetic models (llama, qwen2, qwen3, gemma3) and, for every
    model, prompt ids and the CPU reference's greedy tokens (memra.reference, float32) —
    the oracle the device run compares against.
On the device:   python experiments/gpu_engine_check.py run [--models a,b] [--bench ...]
    appends JSON lines to $OUT/gpu_engine_check.jsonl and prints a table last.

What it showed is recorded in the commit that adds its receipts under research/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / ".gpucheck"
N_TOKENS = 64
PROMPT = "The capital of France is Paris. The capital of Germany is"
TINY = (("llama", "Q4_K_M"), ("qwen2", "Q8_0"), ("qwen3", "Q4_0"), ("gemma3", "Q4_K_M"))
REAL = {"smollm2": "/root/models/smollm2.gguf", "gemma3": "/root/models/gemma3.gguf"}


def _out() -> Path:
    p = Path(os.environ.get("OUT") or ROOT / ".gpucheck" / "out")
    p.mkdir(parents=True, exist_ok=True)
    return p


def emit(rec: dict) -> None:
    rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S"), **rec}
    with open(_out() / "gpu_engine_check.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)


# -- prepare (CPU) ------------------------------------------------------------------------

def _reference_tokens(path: Path, prompt_ids: list[int], n: int) -> dict:
    from memra.gguf_file import open_gguf
    from memra.reference import ReferenceModel

    m = ReferenceModel(open_gguf(path))
    cache = m.new_cache(len(prompt_ids) + n)
    logits = m.forward(prompt_ids, cache)
    out, margins = [], []
    for _ in range(n):
        top = np.partition(logits, -2)[-2:]
        margins.append(float(top[1] - top[0]))
        t = int(np.argmax(logits))
        out.append(t)
        logits = m.forward([t], cache)
    return {"tokens": out, "margins": margins}


def prepare(args) -> None:
    from memra.aliases import resolve
    from memra.gguf_file import open_gguf
    from memra.synth import synth
    from memra.tokenizer import Tokenizer

    FIX.mkdir(exist_ok=True)
    models = {}
    tokfrom = str(ROOT / ".synthtok" / "smollm2-tokenizer.gguf")
    for arch, quant in TINY:
        p = FIX / f"tiny-{arch}-{quant}.gguf"
        if not p.exists():
            synth(p, arch, "tiny", quant, seed=1, tokenizer_from=tokfrom)
        models[f"tiny-{arch}"] = p
    models["smollm2"] = Path(resolve("smollm2-135m"))
    models["gemma3"] = Path(resolve("gemma3-270m"))
    fx_path = FIX / "fixtures.json"
    fixtures = json.loads(fx_path.read_text()) if fx_path.exists() else {}
    only = set(args.models.split(",")) if args.models else None
    for name, p in models.items():
        if (only and name not in only) or (not only and name in fixtures):
            continue
        t0 = time.time()
        g = open_gguf(p)
        ids = Tokenizer.from_gguf(g).encode(PROMPT, add_special=True, parse_special=True)
        ref = _reference_tokens(p, ids, N_TOKENS)
        fixtures[name] = {"file": p.name if name.startswith("tiny") else None, "prompt_ids": ids, **ref}
        print(f"{name}: {len(ids)} prompt ids, reference in {time.time() - t0:.1f} s, "
              f"min margin {min(ref['margins']):.3f}", flush=True)
        fx_path.write_text(json.dumps(fixtures))  # after each model: a slow one may be cut off


# -- run (device) ---------------------------------------------------------------------------

def run_kernel_check(families: str) -> bool:
    from memra.kernelcheck import run_kernel_check as rkc

    lines = []
    for line in rkc(only=families):
        lines.append(line)
        print(line, flush=True)
    fails = [l for l in lines if l.startswith("FAIL")]
    emit({"kind": "kernel-check", "families": families, "last": lines[-1], "failures": fails,
          "lines": len(lines)})
    return lines[-1].startswith("ALL GREEN")


def _first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_model(name: str, path: str, fx: dict, bench: bool) -> None:
    from memra.engine import GPUEngine, argmax_gate

    rec = {"kind": "engine", "model": name}
    try:
        t0 = time.perf_counter()
        e = GPUEngine(path, n_ctx=1024)
        rec["load_s"] = round(time.perf_counter() - t0, 2)
        rec["weight_mb"] = round(e.weight_bytes / 1e6, 1)
        ids = fx["prompt_ids"]
        gate = argmax_gate(e, ids)
        rec["gate"] = gate.line()
        t0 = time.perf_counter()
        toks = e.generate_greedy(ids, N_TOKENS)
        rec["first_gen_s"] = round(time.perf_counter() - t0, 3)
        ref = fx["tokens"]
        div = _first_divergence(toks, ref)
        rec["tokens_equal"] = div is None
        rec["first_divergence"] = div
        if div is not None:
            rec["ref_margin_at_divergence"] = fx["margins"][div]
            rec["gpu_tokens"] = toks
            rec["ref_tokens"] = ref
        # graph replay vs eager decode, bit for bit
        e.reset()
        e.prefill(ids)
        eager = [e.decode(t, graph=False) for t in ref[:8]]
        e.reset()
        e.prefill(ids)
        graphed = [e.decode(t, graph=True) for t in ref[:8]]
        rec["graph_vs_eager_identical"] = bool(all(np.array_equal(a, b) for a, b in zip(eager, graphed)))
        # sampled generation is reproducible under a seed
        s1 = e.generate(ids, 32, temperature=0.8, seed=7)
        s2 = e.generate(ids, 32, temperature=0.8, seed=7)
        rec["sample_reproducible"] = s1 == s2
        rec["sample_tokens"] = s1[:8]
        if bench:
            rec.update(bench_decode(e, ids))
    except Exception as ex:
        rec["error"] = f"{type(ex).__name__}: {ex}"
        rec["trace"] = traceback.format_exc()[-3000:]
    emit(rec)


def bench_decode(e, ids, n=128, reps=5) -> dict:
    """tg128 the llama-bench way: time n greedy graph replays after the prompt."""
    g = e.g
    rates = []
    for _ in range(reps):
        e.reset()
        e.prefill(ids)
        e.d_pos.upload(np.asarray(e.pos, np.int32))
        e.d_step.upload(np.zeros(e.batch, np.int32))
        e._ensure_hist(n + 1)
        gr = e._graph("greedy")
        e._first_token("greedy")
        g.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            gr.launch()
        g.sync()
        rates.append(n / (time.perf_counter() - t0))
    med = float(np.median(rates))
    wb = e.weight_bytes
    bw = g.copy_bandwidth()
    return {"tg_tok_s": round(med, 1), "tg_samples": [round(r, 1) for r in rates],
            "gb_s": round(wb * med / 1e9, 1), "pct_bw": round(100 * wb * med / bw, 1),
            "copy_bw_gb_s": round(bw / 1e9, 1)}


def run(args) -> None:
    from memra.cuda import gpu

    g = gpu()
    emit({"kind": "device", "name": g.info.name, "arch": g.info.arch, "sms": g.info.sm_count})
    if args.kernels:
        run_kernel_check(args.kernels)
    fixtures = json.loads((FIX / "fixtures.json").read_text())
    names = args.models.split(",") if args.models else list(fixtures)
    for name in names:
        fx = fixtures[name]
        path = str(FIX / fx["file"]) if fx.get("file") else REAL.get(name)
        if not path or not Path(path).exists():
            emit({"kind": "engine", "model": name, "skipped": f"{path} not present"})
            continue
        check_model(name, path, fx, bench=args.bench)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["prepare", "run"])
    ap.add_argument("--models", default="")
    ap.add_argument("--kernels", default="embed,norm,rope,attention,act,sample")
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    (prepare if args.mode == "prepare" else run)(args)


if __name__ == "__main__":
    main()
