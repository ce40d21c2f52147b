#!/usr/bin/env python3
"""graph_ab.py — the K/V ring (ATT_RING) in the decode step: whole-step graphs and one layer's
QKV -> attention -> attn_output sub-graph, ring vs registers vs build/attention.cu's ATT_RING_MIN_TILES,
with and without PDL (README.md: hypotheses A and B).

    python3 experiments/ring_short/graph_ab.py --compile-only   # CPU: make.py + NVRTC every arm (regs, spills)
    python3 experiments/ring_short/graph_ab.py --mock           # CPU: compile table, arm swap, plan plumbing
    python3 experiments/ring_short/graph_ab.py                  # device (H200), via ab.sh

Arms (the attention module of every attention.cu launch, swapped by ArmGpu, a thin wrapper of the
device the runner launches through; what MEMRA_ATT_RING=0 / 2 select, without rebuilding the runner):
  reg   ATT_RING 0                      kernels/attention.cu (K/V through registers)
  ring  ATT_RING 2                      kernels/attention.cu (today's default)
  min2  ATT_RING 2, ATT_RING_MIN_TILES 2  build/attention.cu (make.py): splits of 1 tile on registers
  min3  ATT_RING 2, ATT_RING_MIN_TILES 3  build/attention.cu: splits of <= 2 tiles on registers
  min2b min2 with ATT_RING_MINB 3 (launch bounds: 3 blocks an SM, the ring's and the register path's
        occupancy at head 128 / one head a block; min2 alone takes 102 registers there: 2 blocks an SM)
One Runner (weights loaded once); per arm and PDL setting its own decode graphs (Runner._graphs swapped).
Steps: checks (memra's attention._check through ArmGpu: every min arm against the register path bit for
bit and memra's reference within 1e-5), then per depth (keys = depth + 1 at the first replay):
  step   the captured decode step, NSTEP replays a round, ROUNDS rounds alternating the configs
         (median of every replay, us; configs: each arm with PDL, reg and ring without)
  att    the layer's attention launch alone, 20 copies a graph (memra profile's way)
  chain  qkv matvec -> attention -> attn_output matvec of layer LAYER, 20 copies a graph
  mv     the same without attention (chain - mv: attention's cost inside the chain)
$OUT/ring-short.jsonl; exit 1 on a failed check or a spill, 2 on an error.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
import make  # noqa: E402
import tile as T  # noqa: E402  (compile_module, ptxas_info, jsonl_writer)
from memra.gpu.ops import attention as ATT  # noqa: E402

ARMS = {"reg": {"ATT_RING": 0}, "ring": {"ATT_RING": 2},
        "min2": {"ATT_RING": 2, "ATT_RING_MIN_TILES": 2}, "min3": {"ATT_RING": 2, "ATT_RING_MIN_TILES": 3},
        "min2b": {"ATT_RING": 2, "ATT_RING_MIN_TILES": 2, "ATT_RING_MINB": 3}}
# (arm, PDL, carveout): carveout None leaves every kernel's preferred shared-memory carveout alone; 100
# sets it to the maximum shared memory on every kernel of the step while that config is captured and
# replayed (hypothesis B's carveout mechanism: README.md), -1 (the default) again afterwards
# Session 17's run had min2 / min3 / min2b and carveout 100 (research/2026-12-02-session17 section 8: the
# variants lost, 100 % halved the gap and slowed the step 10 %); the default now sweeps the carveouts that
# hold 2 (~59 %) or 3 (~88 %) ring blocks an SM at head 128 while leaving the matvecs some L1.
# CONFIGS env: "arm:pdl:carveout,..." (pdl 1/0, carveout a percent or -), e.g. "reg:1:-,ring:1:-,min2:1:-".
_DEFAULT_CONFIGS = "reg:1:-,ring:1:-,ring:1:60,reg:1:60,ring:1:90,reg:1:90,reg:0:-,ring:0:-"


def _configs(spec: str) -> tuple:
    out = []
    for item in spec.split(","):
        arm, pdl, crv = item.strip().split(":")
        if arm not in ARMS:
            raise SystemExit(f"CONFIGS: unknown arm {arm!r} ({', '.join(ARMS)})")
        out.append((arm, pdl == "1", None if crv == "-" else int(crv)))
    return tuple(out)


CONFIGS = _configs(os.environ.get("CONFIGS", _DEFAULT_CONFIGS))
# compile table: (label, HEAD_DIM, N_GQA): the 8B (32 q / 8 KV heads, head 128), the 1B (32 / 8, head 64),
# SmolLM2 (9 / 3, head 64), one head a block (the tables' hpb 1) and the whole group
SHAPES = (("8B hpb1", 128, 1), ("8B group", 128, 4), ("1B/Smol hpb1", 64, 1), ("1B group", 64, 4),
          ("SmolLM2 group", 64, 3))
TUNE = {"ATT_WARPS": 8, "ATT_TILE": 64}
FNS = ("attn_decode_rope", "attn_decode", "attn_split")
# check cases, attention._check's (head_dim, n_gqa, n_kv, window, softcap, n_splits, T, hpb): the engine
# shapes at 9 splits (the 8B's) and 88 (SmolLM2's), T tokens at random positions of 1,100 (1..9 tiles a split)
CHECKS = ((128, 4, 8, 0, 0.0, 9, 8, 1), (128, 4, 8, 0, 0.0, 9, 8, 4), (64, 4, 8, 0, 0.0, 9, 8, 1),
          (64, 3, 3, 0, 0.0, 88, 8, 1), (64, 3, 3, 0, 0.0, 88, 8, 3), (128, 4, 2, 37, 0.0, 9, 8, 1))
# cached tokens (keys = depth + 1 at the first replay): 41 = 1 tile; 65..128 = 2 tiles in one split; in this
# order (the short contexts and 4,096 first; the sequence is rewound for 512 and 1,024)
DEPTHS = tuple(int(x) for x in os.environ.get("DEPTHS", "40,64,4096,512,1024").split(","))
NSTEP, ROUNDS, SUBREPS = 16, int(os.environ.get("ROUNDS", "5")), 20


def arm_defines(head_dim: int, n_gqa: int, arm: str, kv_block: int = 16) -> dict:
    """The -D set memra's module_defines gives (table tunables TUNE) with the arm's ATT_RING laid over."""
    a = ARMS[arm]
    d = ATT.module_defines(head_dim, n_gqa, {**TUNE, "ATT_RING": a["ATT_RING"]}, kv_block)
    return {**d, **a}


def key(d: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in d.items()))


def _src(d: dict) -> Path:
    return make.OUT if "ATT_RING_MIN_TILES" in d else ROOT / "kernels" / "attention.cu"


def _compile(d: dict):
    cub, log = T.compile_module(d, _src(d))
    info = {}
    for fn in FNS:
        if f"Compiling entry function '{fn}'" not in (log or ""):   # no ptxas -v log (the device's NVRTC)
            info[fn] = (-1, -1, -1)
            continue
        r, sp = T.ptxas_info(log, fn)
        part = log.split(f"Compiling entry function '{fn}'")[1]
        smem = part.split("bytes smem")[0].rsplit(",", 1)[-1].strip() if "bytes smem" in part.split("Compiling")[0] else "0"
        info[fn] = (r, sp, int(smem))
    return key(d), cub, info


def compile_all(jsonl, table: bool = True, extra=()) -> dict:
    """make.py, then (table) every arm of every SHAPES entry and the extra defines dicts through NVRTC in
    processes (before any CUDA context); prints the compile table. {key: cubin}. Spills are reported, not
    fatal: kernels/attention.cu's own register build spills 4 bytes at head 128 (see the table)."""
    make.main()
    names, mods = {}, []
    for lab, D, G in (SHAPES if table else ()):
        for arm in ARMS:
            d = arm_defines(D, G, arm)
            names.setdefault(key(d), (lab, arm))
            if d not in mods:
                mods.append(d)
    mods += [d for d in extra if d not in mods]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max(1, min(len(mods), os.cpu_count() or 1))) as ex:
        res = list(ex.map(_compile, mods))
    print(f"compiled {len(mods)} attention modules in {time.perf_counter() - t0:.1f} s")
    print(f"{'shape':14s} {'arm':5s} " + "  ".join(f"{fn + ' regs/spill/smem':>30s}" for fn in FNS) + "  cubin KB")
    cubs = {}
    for d, (k, cub, info) in zip(mods, res):
        cubs[k] = cub
        sp = sum(v[1] for v in info.values())
        arm = next((a for a, v in ARMS.items() if all(d.get(x) == y for x, y in v.items())
                    and ("ATT_RING_MIN_TILES" in v) == ("ATT_RING_MIN_TILES" in d)
                    and ("ATT_RING_MINB" in v) == ("ATT_RING_MINB" in d)), "?")
        lab = names.get(k, (f"D{d['HEAD_DIM']} G{d['N_GQA']}", arm))[0]
        print(f"{lab:14s} {arm:5s} " + "  ".join(f"{'%d / %d / %d' % v:>30s}" for v in info.values())
              + f"  {len(cub) / 1024:8.1f}" + ("   SPILL" if sp else ""))
        jsonl({"kind": "compile", "shape": lab, "arm": arm, "defines": d, "ptxas": info, "cubin_bytes": len(cub)})
    return cubs


class ArmGpu:
    """The device, except that an attention.cu module is the current arm's: reg / ring force ATT_RING 0 /
    2; a min arm turns a ring module (ATT_RING > 0) into build/attention.cu's with its
    ATT_RING_MIN_TILES and leaves an explicit ATT_RING 0 module alone (attention._check's second launch).
    attention() sizes the dynamic shared memory from the returned module's defines (ring_bytes)."""

    def __init__(self, g, cubs, mock=False):
        self.g, self.cubs, self.mock, self.mods, self.arm = g, cubs, mock, {}, "ring"
        self.seen = {}   # every kernel launched through this wrapper (for the carveout configs)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self.seen.setdefault(id(kernel), kernel)
        return self.g.launch(kernel, grid, block, args, shmem, pdl)

    def carveout(self, value: int) -> None:
        """CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (percent of the maximum shared memory, -1:
        no preference, the default) on every kernel seen so far."""
        from cuda.bindings import driver
        from memra.gpu.cuda import _drv
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        dev = driver.CUdevice(self.g.info.index)
        for k in self.seen.values():
            h = k._k.handle
            h = h if isinstance(h, driver.CUkernel) else driver.CUkernel(int(h))
            _drv(driver.cuKernelSetAttribute(attr, int(value), h, dev), "cuKernelSetAttribute")

    def module(self, file, defines=None):
        d = dict(defines or {})
        if file != ATT.KERNEL_FILE or "MEMRA_CANARY" in d or any(k.startswith("KV_") and k != "KV_BLOCK" and int(v)
                                                                 for k, v in d.items()):
            return self.g.module(file, d)
        a = ARMS[self.arm]
        if "ATT_RING_MIN_TILES" not in a:
            return self.g.module(file, {**d, "ATT_RING": a["ATT_RING"]})
        if not int(d.get("ATT_RING", 0)):
            return self.g.module(file, d)
        d.update(a)
        k = key(d)
        return T.prebuilt_module(self.g, self.mods, k, file, d,
                                 lambda: self.cubs[k] if k in self.cubs else _compile(d)[1], self.mock)

    def __getattr__(self, n):
        return getattr(self.g, n)


def split_facts(depth: int, n_splits: int, tile: int = 64) -> dict:
    """keys, chunk, non-empty splits and tiles per split at the first replay of a depth (key_range)."""
    n = depth + 1
    chunk = max(128, -(-(-(-n // n_splits)) // tile) * tile)
    act = -(-n // chunk)
    tiles = [-(-min(chunk, n - j * chunk) // tile) for j in range(act)]
    return {"keys": n, "chunk": chunk, "active": act, "tiles": tiles}


def time_graph(g, calls, copies: int, replays: int = 15) -> float:
    """us of one copy of `calls` (recorded launches, pdl as recorded): a graph of `copies` copies, median of replays."""
    with g.capture() as gr:
        for _ in range(copies):
            for k, grid, block, args, shmem, pdl in calls:
                g.launch(k, grid, block, args, shmem, pdl)
    gr.upload()
    ms = g.time_ms(gr.launch, reps=replays, warmup=2)
    gr.close()
    return float(np.median(ms)) * 1e3 / copies


def layer_launches(plan, layer: int):
    """(qkv launches, attention launch, attn_output launches) of one layer of the decode step (1 row)."""
    from memra.gpu import plan as PLAN
    ls = [L for L in plan.step(PLAN.graph_bucket(1), decode=True, sampler="greedy") if L.layer == layer]
    qkv = [L for L in ls if L.group == "qkv"]
    att = [L for L in ls if L.op.startswith("attention")]
    ao = [L for L in ls if L.group == "attn_output"]
    if len(att) != 1 or not qkv or not ao:
        raise RuntimeError(f"layer {layer}: unexpected plan launches {[L.label() for L in ls]}")
    return qkv, att[0], ao


def model_path(spec: str, tok: str) -> Path:
    from memra.tune import bench as B
    return B.resolve_model(spec, tok)[1]


def mock_main(args, jsonl) -> int:
    """CPU: the compile table, ArmGpu's swap and shared-memory sizing on gemm_tile's MockGpu (attention
    launches recorded, not emulated), the plan's layer launches and the split layout per depth."""
    from mock_gpu import MockGpu, MockModule
    from memra.gpu import plan as PLAN
    from memra.gpu.plan import ModelSpec
    from memra.model.gguf import open_gguf
    from memra.tune import tables as TABLES

    cubs = compile_all(jsonl)

    class Mock(MockGpu):
        def module(self, file, defines=None):
            return MockModule(file, defines) if file == ATT.KERNEL_FILE else super().module(file, defines)

        def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
            self.emulate = False
            super().launch(kernel, grid, block, args, shmem, pdl)

    m = Mock()
    bg = ArmGpu(m, cubs, mock=True)
    D, G, nkv, S = 128, 4, 8, 9
    nh = nkv * G
    for arm in ARMS:
        bg.arm = arm
        po, pml = ATT.scratch_shapes(1, nh, S, D)
        kc = m.empty((4, 16, nkv * D), np.uint16)
        ATT.attention(bg, m.empty((1, nh * D), np.float32), kc, m.empty((4, 16, nkv * D), np.uint16),
                      m.empty((1, nh * D), np.float32), m.empty(po, np.float32), m.empty(pml, np.float32),
                      m.to_device(np.array([40], np.int32)), None, m.to_device(np.arange(4, dtype=np.int32)[None]), 4,
                      n_tokens=1, n_kv=nkv, n_gqa=G, head_dim=D, window=0, scale=D ** -0.5, n_splits=S,
                      counters=m.to_device(np.zeros(nh, np.int32)), hpb=1, config=TUNE, pdl=True)
        name, grid, block, shmem = m.launches[-1]
        mod = bg.module(ATT.KERNEL_FILE, ATT.module_defines(D, 1, TUNE, 16))
        print(f"mock  arm {arm:4s}: {name} grid {grid} block {block} dynamic smem {shmem} B; module "
              f"ATT_RING={mod.defines.get('ATT_RING')} MIN_TILES={mod.defines.get('ATT_RING_MIN_TILES', '-')}")
        jsonl({"kind": "mock_launch", "arm": arm, "kernel": name, "grid": grid, "shmem": shmem})
    for arm in ("min2", "min3", "min2b"):   # the device's checks, as plumbing (no emulation: the compare fails)
        bg.arm = arm
        m.launches.clear()
        o = ATT._check(bg, np.random.default_rng(1), CHECKS[0], fused=True, config=TUNE)
        print(f"mock  check plumbing {arm}: {o.name}: launches {[(x[0], x[3]) for x in m.launches]} "
              f"(compare {'passed' if o.ok else 'failed, as it must without emulation'})")
    path = model_path(args.model, args.tok)
    spec = ModelSpec.from_gguf(open_gguf(path))
    table, _ = TABLES.resolve_table("auto", "NVIDIA H200", (9, 0), sms=132)
    plan = PLAN.Planner(spec, table, sms=132)
    layer = spec.cfg.n_layer // 2
    qkv, att, ao = layer_launches(plan, layer)
    print(f"plan  {args.model}: layer {layer}: " + " -> ".join(L.label() for L in [*qkv, att, *ao]))
    print(f"plan  attention config {dict(att.config or {})}, {plan.n_splits} splits a head block (at 1 row)")
    for d in DEPTHS:
        f = split_facts(d, plan.n_splits)
        uses = {a: ["ring" if t >= ARMS[a].get("ATT_RING_MIN_TILES", 1) and ARMS[a]["ATT_RING"] else "reg"
                    for t in f["tiles"]] for a in ARMS}
        print(f"depth {d:5d}: {f['keys']} keys, chunk {f['chunk']}, {f['active']} active splits, tiles "
              f"{f['tiles']}; per split: " + "  ".join(f"{a} {'/'.join(sorted(set(u)))}" for a, u in uses.items()))
        jsonl({"kind": "split_facts", "depth": d, **f})
    print("mock done")
    return 0


def device_main(args, jsonl) -> int:
    from memra.gpu import plan as PLAN
    from memra.gpu.cuda import gpu
    from memra.model.gguf import open_gguf
    from memra.tune.profile import _Recorder
    from memra.tune.warmup import model_modules, warmup

    t0 = time.perf_counter()
    el = lambda: f"{time.perf_counter() - t0:.1f} s"   # noqa: E731
    path = model_path(args.model, args.tok)
    print(f"model {args.model} at {path} ({el()})", flush=True)
    mods = model_modules(open_gguf(path))
    checks = [ATT.module_defines(c[0], h, TUNE, 16) for c in CHECKS for h in {1, c[7]}]
    regs = [(f, fi, {**d, "ATT_RING": 0}) for f, fi, d in mods if fi == ATT.KERNEL_FILE and int(d.get("ATT_RING", 0))]
    regs += [("attention", ATT.KERNEL_FILE, {**d, "ATT_RING": 0}) for d in checks]   # the checks' register launches
    done = list(warmup(mods + regs, [T.ARCH]))
    for w in done:
        if w["error"]:
            print(f"ERROR compiling {w['file']} {w['defines']}: {str(w['error'])[-400:]}")
    print(f"memra modules: {len(done)}, {sum(not w['cached'] for w in done)} compiled, "
          f"{sum(bool(w['error']) for w in done)} failed ({el()})", flush=True)
    used = {c[0] for c in CONFIGS}
    mins = [a for a in ARMS if "ATT_RING_MIN_TILES" in ARMS[a] and a in used]   # only the variants timed
    base = [d for _, fi, d in mods if fi == ATT.KERNEL_FILE and int(d.get("ATT_RING", 0))]
    base += checks
    cubs = compile_all(jsonl, table=False, extra=[{**d, **ARMS[a]} for d in base for a in mins])
    g = gpu(0)
    bg = ArmGpu(g, cubs)
    print(f"device {g.info.name} ({el()})", flush=True)
    jsonl({"kind": "run", "device": g.info.name, "model": args.model, "time": time.strftime("%Y-%m-%d %H:%M:%S")})

    fails = 0
    rng = np.random.default_rng(4242)
    for arm in mins:
        bg.arm = arm
        for case in CHECKS:
            for fused in ((True, False) if arm != "min3" else (True,)):   # min3: min2 with another threshold
                o = ATT._check(bg, rng, case, fused=fused, config=TUNE)
                fails += not o.ok
                print(f"{'PASS' if o.ok else 'FAIL'}  {arm}: {o.name}: {o.detail}", flush=True)
                jsonl({"kind": "check", "arm": arm, "name": o.name, "ok": bool(o.ok), "detail": o.detail})
    print(f"checks done ({el()})", flush=True)

    from memra.gpu.runner import Row, Runner, Sampling
    top = max(DEPTHS) + NSTEP + 64
    bg.arm = "reg"
    r = Runner(path, max_len=top, max_seqs=1, kv_tokens=top + 32, gpu=bg)
    r._ensure_hist(NSTEP)   # before any capture (a larger history drops the graphs)
    print(f"runner ({el()}); tune table {r.tune_source}", flush=True)
    graphs = {c: {} for c in CONFIGS}
    carved = set()
    fill = {}
    s = r.open()
    V = r.cfg.n_vocab
    toks = rng.integers(0, V, max(DEPTHS) + 1).tolist()
    layer = r.cfg.n_layer // 2
    greedy = [Sampling(0.0)]
    bucket = PLAN.graph_bucket(1)
    results = []
    for depth in DEPTHS:
        bg.arm, r.pdl, r._graphs = "reg", True, fill
        if s.n > depth:
            r.rewind(s, depth)
        elif s.n < depth:
            r.step([Row(s, toks[s.n:depth])])
        first = [toks[depth]]
        step = {c: [] for c in CONFIGS}

        def use(c):
            bg.arm, r.pdl, r._graphs = c[0], c[1], graphs[c]
            if c[2] is not None:
                if (c, r._dec_splits_for(depth + NSTEP - 1)) not in carved:
                    # its kernels loaded (seen) by a first capture, then captured again under the carveout
                    # (in case a graph keeps the attributes of its capture)
                    r.decode_prepare([s], first, NSTEP, greedy, hist=NSTEP)
                    bg.carveout(c[2])
                    r._drop_graphs()
                    graphs[c] = r._graphs
                    carved.add((c, r._dec_splits_for(depth + NSTEP - 1)))
                bg.carveout(c[2])
            return r.decode_prepare([s], first, NSTEP, greedy, hist=NSTEP)   # positions back to the depth

        for rnd in range(ROUNDS):
            for c in (CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]):
                gr = use(c)
                step[c] += list(g.time_ms(gr.launch, reps=NSTEP - 2, warmup=2) * 1e3)
                if c[2] is not None:
                    g.sync()
                    bg.carveout(-1)
        sub = {}
        qkv, att, ao = layer_launches(r.plan, layer)
        for c in CONFIGS:
            use(c)
            rec = []
            for group in (qkv, [att], ao):
                rc = _Recorder(bg)
                r._run(group, bucket, r.r_tok, r.r_pos, r.r_seq, r._state(1), g=rc)
                rec.append(rc.calls)
            g.sync()
            sub[c] = {"att": time_graph(g, rec[1], SUBREPS), "chain": time_graph(g, rec[0] + rec[1] + rec[2], SUBREPS),
                      "mv": time_graph(g, rec[0] + rec[2], SUBREPS), "shmem": rec[1][0][4]}
            if c[2] is not None:
                g.sync()
                bg.carveout(-1)
        f = split_facts(depth, r.dec_splits)
        base = float(np.median(step[CONFIGS[0]]))
        print(f"\ndepth {depth} ({f['keys']} keys, splits {r.dec_splits}, tiles {f['tiles']}) ({el()})")
        print(f"  {'arm':5s} {'pdl':3s} {'crv':>3s} {'step us':>9s} {'/reg':>7s} {'p10-p90':>13s} {'att us':>7s} {'chain us':>8s} "
              f"{'mv us':>7s} {'chain-mv':>8s} {'smem':>6s}")
        for c in CONFIGS:
            x = np.array(step[c])
            m = float(np.median(x))
            su = sub[c]
            print(f"  {c[0]:5s} {int(c[1]):3d} {'-' if c[2] is None else c[2]:>3} {m:9.2f} {m / base:7.4f} {np.percentile(x, 10):6.1f}-{np.percentile(x, 90):6.1f} "
                  f"{su['att']:7.2f} {su['chain']:8.2f} {su['mv']:7.2f} {su['chain'] - su['mv']:8.2f} {su['shmem']:6d}")
            rec = {"kind": "time", "depth": depth, "arm": c[0], "pdl": c[1], "carveout": c[2], "step_us": m, "ratio": m / base,
                   "step_n": len(x), "step_p10": float(np.percentile(x, 10)), "step_p90": float(np.percentile(x, 90)),
                   **{k: v for k, v in su.items()}, "splits": r.dec_splits, **f}
            results.append(rec)
            jsonl(rec)
    r.close(s)
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {el()}")
    jsonl({"kind": "summary", "failed": fails})
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--mock", action="store_true")
    ap.add_argument("--model", default=os.environ.get("MODEL", "synth:llama3-8b:Q4_K_M"))
    ap.add_argument("--tok", default=os.environ.get("TOK", str(ROOT / ".synthtok" / "smollm2-tokenizer.gguf")))
    args = ap.parse_args()
    jsonl = T.jsonl_writer("ring-short.jsonl")
    try:
        if args.compile_only:
            compile_all(jsonl)
            return 0
        return mock_main(args, jsonl) if args.mock else device_main(args, jsonl)
    except Exception:   # noqa: BLE001
        traceback.print_exc()
        print("ERROR (see the traceback above)", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
