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
sys.path.insert(0, str(ROOT))
from memra.model.aliases import sha256_file  # noqa: E402
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

def _reference_tokens(path: Path, prompt_ids: list[int], n: int, numerics: str = "q8") -> dict:
    """The CPU reference's greedy tokens under the numerics of the engine path they check
    (the default q8 path: numerics="q8")."""
    from memra.model.gguf import open_gguf
    from memra.cpu.reference import ReferenceModel, greedy_with_margins

    _, out, margins = greedy_with_margins(ReferenceModel(open_gguf(path), numerics=numerics), prompt_ids, n)
    return {"tokens": out, "margins": margins, "numerics": numerics}


def prepare(args) -> None:
    from memra.model.aliases import resolve
    from memra.model.gguf import open_gguf
    from memra.model.synth import synth
    from memra.text.tokenizer import Tokenizer

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
        fixtures[name] = {"file": p.name if name.startswith("tiny") else None, "prompt_ids": ids,
                          "sha256": sha256_file(p) if name.startswith("tiny") else None, **ref}
        print(f"{name}: {len(ids)} prompt ids, reference in {time.time() - t0:.1f} s, "
              f"min margin {min(ref['margins']):.3f}", flush=True)
        fx_path.write_text(json.dumps(fixtures))  # after each model: a slow one may be cut off


# -- run (device) ---------------------------------------------------------------------------

def run_kernel_check(families: str) -> bool:
    from memra.tune.kernelcheck import run_kernel_check as rkc

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
    from memra.gpu.engine import GPUEngine
    from memra.gpu.gate import cross_check

    rec = {"kind": "engine", "model": name}
    try:
        t0 = time.perf_counter()
        # the engine path whose oracle made the fixture (fixtures before q8 became the default: f32)
        e = GPUEngine(path, n_ctx=1024, matvec_path=fx.get("numerics", "f32"))
        rec["load_s"] = round(time.perf_counter() - t0, 2)
        rec["weight_mb"] = round(e.weight_bytes / 1e6, 1)
        ids = fx["prompt_ids"]
        gate, _ = cross_check(e, ids)
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
        e._first_token("greedy")
        gr = e._graph("greedy")
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


def _synth(name: str, arch: str | None, shape: str, quant: str, seed: int = 1) -> Path:
    from memra.model.synth import synth

    d = Path(os.environ.get("MEMRA_SYNTH_DIR", "/tmp/memra-synth"))
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    if not p.exists():
        synth(p, arch, shape, quant, seed=seed, tokenizer_from=str(ROOT / ".synthtok" / "smollm2-tokenizer.gguf"))
    return p


def step_tiny(args) -> None:
    """Tiny synthetic models (regenerated here, byte-identical to the prepared ones: the
    sha256 is compared) against the CPU reference's tokens in fixtures.json."""
    fixtures = json.loads((FIX / "fixtures.json").read_text())
    for arch, quant in TINY:
        name = f"tiny-{arch}"
        fx = fixtures.get(name)
        if fx is None:
            continue
        p = _synth(f"tiny-{arch}-{quant}.gguf", arch, "tiny", quant)
        if fx.get("sha256") and sha256_file(p) != fx["sha256"]:
            emit({"kind": "engine", "model": name, "error": "synthetic file differs from the prepared one"})
            continue
        check_model(name, str(p), fx, bench=False)
    for name in ("smollm2", "gemma3"):
        if name in fixtures and Path(REAL[name]).exists():
            check_model(name, REAL[name], fixtures[name], bench=True)


BENCH = (  # (file, arch, shape, mix)
    ("smollm2-shape-Q4_1.gguf", "llama", "smollm2-135m", "Q4_1"),
    ("gemma3-270m-shape-Q4_K_M.gguf", "gemma3", "gemma3-270m", "Q4_K_M"),
    ("llama-1b-Q4_0.gguf", "llama", "llama-1b", "Q4_0"),
    ("llama3-8b-Q4_K_M.gguf", "llama", "llama3-8b", "Q4_K_M"),
    ("llama3-8b-Q4_0.gguf", "llama", "llama3-8b", "Q4_0"),
    ("llama3-8b-Q8_0.gguf", "llama", "llama3-8b", "Q8_0"),
)


def breakdown(e, reps_per_graph: int = 20) -> list[dict]:
    """Where one decode step's time goes: every launch of an eager step is recorded, then
    each distinct launch (kernel, grid, scalar arguments) is timed as a graph of
    `reps_per_graph` copies of itself (so node overheads count as in the real graph)."""
    g = e.g
    rec = []
    orig = g.launch

    def spy(kernel, grid, block, args, shmem=0, pdl=False):
        rec.append((kernel, grid, block, tuple(args), shmem, pdl))
        orig(kernel, grid, block, args, shmem, pdl)

    g.launch = spy
    try:
        e._decode_step("none")
    finally:
        del g.launch
    g.sync()
    groups: dict = {}
    for k, grid, block, args, shmem, pdl in rec:
        scalars = tuple(a.item() for a in args if isinstance(a, np.generic) and not isinstance(a, np.uint64))
        key = (k.module.kernel_file, tuple(sorted(k.module.defines.items())), k.name, str(grid), str(block), scalars)
        groups.setdefault(key, [k, grid, block, args, shmem, pdl, 0])[-1] += 1
    out = []
    for key, (k, grid, block, args, shmem, pdl, count) in groups.items():
        with g.capture() as gr:
            for _ in range(reps_per_graph):
                orig(k, grid, block, args, shmem, pdl)
        gr.upload()
        ms = g.time_ms(gr.launch, reps=8, warmup=2)
        us = float(np.median(ms)) * 1e3 / reps_per_graph
        gr.close()
        row = {"file": key[0], "kernel": k.name, "defines": dict(key[1]), "grid": key[3], "count": count,
               "us": round(us, 2), "total_us": round(us * count, 1)}
        if k.name.startswith("mv_"):
            from memra.gpu.ops.matvec import TYPES

            t = int(k.module.defines["MV_TYPE"])
            N, K = key[5][0], key[5][1]
            rows = 2 * N if k.name.endswith("_glu") else N
            nbytes = rows * K // TYPES[t][1] * TYPES[t][2]
            row.update({"type": TYPES[t][0], "N": N, "K": K, "gb_s": round(nbytes / (us * 1e-6) / 1e9, 1)})
        out.append(row)
    out.sort(key=lambda r: -r["total_us"])
    return out


def step_bench(args) -> None:
    """tg128 on synthetic models at real shapes (speed does not depend on the weights'
    values), for matvec path x PDL, plus a per-kernel breakdown of one decode step."""
    from memra.gpu.engine import GPUEngine

    t_start = time.perf_counter()
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]  # path:pdl
    for fname, arch, shape, quant in BENCH:
        if args.only_bench and not {shape, f"{shape}:{quant}"} & set(args.only_bench.split(",")):
            continue
        if time.perf_counter() - t_start > args.bench_budget:
            emit({"kind": "bench", "shape": shape, "skipped": "time budget"})
            continue
        try:
            t0 = time.perf_counter()
            p = _synth(fname, arch, shape, quant)
            synth_s = time.perf_counter() - t0
            for path, pdl in configs:
                t0 = time.perf_counter()
                e = GPUEngine(str(p), n_ctx=1024, matvec_path=path, pdl=pdl == "pdl")
                load_s = time.perf_counter() - t0
                ids = [1, 450, 7483, 310, 3444, 338, 3681, 29889, 450, 7483, 310, 9556]
                ids = [i % e.cfg.n_vocab for i in ids]
                rec = {"kind": "bench", "shape": shape, "quant": quant, "path": path, "pdl": pdl == "pdl",
                       "synth_s": round(synth_s, 1), "load_s": round(load_s, 1),
                       "weight_mb": round(e.weight_bytes / 1e6, 1)}
                rec.update(bench_decode(e, ids))
                t0 = time.perf_counter()
                e.reset()
                long_prompt = [(7 * i + 3) % e.cfg.n_vocab for i in range(512)]
                e.prefill(long_prompt)
                e.g.sync()
                rec["pp512_tok_s"] = round(512 / (time.perf_counter() - t0), 1)
                if args.breakdown and (path, pdl) == configs[0]:
                    e.reset()
                    # the step at a context of breakdown_depth tokens (tg128's mean is 64)
                    ids = [(7 * i + 3) % e.cfg.n_vocab for i in range(args.breakdown_depth)]
                    e.prefill(ids)
                    e.d_tok.upload(np.array([ids[-1]] * e.batch, np.int32))
                    e.d_pos.upload(np.asarray(e.pos, np.int32))
                    rec["breakdown_depth"] = args.breakdown_depth
                    rec["breakdown"] = breakdown(e)
                    rec["breakdown_sum_us"] = round(sum(r["total_us"] for r in rec["breakdown"]), 1)
                emit(rec)
                del e
        except Exception as ex:
            emit({"kind": "bench", "shape": shape, "error": f"{type(ex).__name__}: {ex}",
                  "trace": traceback.format_exc()[-2000:]})


def step_kernels(args) -> None:
    from memra.gpu.cuda import gpu

    g = gpu()
    emit({"kind": "device", "name": g.info.name, "arch": g.info.arch, "sms": g.info.sm_count})
    run_kernel_check(args.kernels)


STEPS = {"kernels": step_kernels, "tiny": step_tiny, "bench": step_bench}


def run(args) -> None:
    """Each step in its own process (a kernel fault poisons only that step's context),
    each with a wall-clock limit; the JSON lines land in $OUT as they are made."""
    import subprocess

    limits = dict(kv.split("=") for kv in args.limits.split(",")) if args.limits else {}
    for step in args.steps.split(","):
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "step", "--step", step, "--kernels", args.kernels,
               "--bench-budget", str(args.bench_budget), "--only-bench", args.only_bench,
               "--configs", args.configs, "--breakdown-depth", str(args.breakdown_depth)] + \
            (["--breakdown"] if args.breakdown else [])
        try:
            r = subprocess.run(cmd, timeout=float(limits.get(step, 120)))
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        emit({"kind": "step", "step": step, "rc": rc, "s": round(time.perf_counter() - t0, 1)})
    table()


def table() -> None:
    path = _out() / "gpu_engine_check.jsonl"
    if not path.exists():
        return
    print("\n== summary")
    for line in path.read_text().splitlines():
        r = json.loads(line)
        k = r.get("kind")
        if k == "kernel-check":
            print(f"kernel-check {r['families']}: {r['last']}")
            for f in r["failures"][:20]:
                print("   ", f[:200])
        elif k == "engine":
            print(f"engine {r['model']}: tokens_equal={r.get('tokens_equal')} div={r.get('first_divergence')} "
                  f"graph==eager={r.get('graph_vs_eager_identical')} sample_repro={r.get('sample_reproducible')} "
                  f"{r.get('gate', '')} {r.get('error', '')} tg={r.get('tg_tok_s', '')}")
        elif k == "bench":
            print(f"bench {r.get('shape')} {r.get('quant', '')} {r.get('path', '')} pdl={r.get('pdl')}: tg "
                  f"{r.get('tg_tok_s')} tok/s {r.get('gb_s')} GB/s ({r.get('pct_bw')} %) pp512 {r.get('pp512_tok_s')} "
                  f"load {r.get('load_s')} s {r.get('error', '')} {r.get('skipped', '')}")
            if r.get("breakdown"):
                print(f"   breakdown: sum {r['breakdown_sum_us']} us/step vs {1e6 / r['tg_tok_s']:.0f} measured")
                for b in r["breakdown"][:12]:
                    print(f"   {b['kernel']:<22} x{b['count']:<4} {b['us']:>8.2f} us {b['total_us']:>9.1f} us "
                          f"{b.get('type', '')} {b.get('N', '')}x{b.get('K', '')} {b.get('gb_s', '')}")
        elif k == "step":
            print(f"step {r['step']}: rc={r['rc']} in {r['s']} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["prepare", "run", "step", "table"])
    ap.add_argument("--models", default="")
    ap.add_argument("--step", default="")
    ap.add_argument("--steps", default="kernels,tiny,bench")
    ap.add_argument("--limits", default="kernels=90,tiny=90,bench=110")
    ap.add_argument("--kernels", default="embed,norm,rope,attention,act,sample")
    ap.add_argument("--bench-budget", type=float, default=80.0)
    ap.add_argument("--only-bench", default="")
    ap.add_argument("--configs", default="q8:pdl,q8:nopdl,f32:pdl")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--breakdown-depth", type=int, default=64)
    args = ap.parse_args()
    if args.mode == "prepare":
        prepare(args)
    elif args.mode == "run":
        run(args)
    elif args.mode == "table":
        table()
    else:
        STEPS[args.step](args)


if __name__ == "__main__":
    main()
