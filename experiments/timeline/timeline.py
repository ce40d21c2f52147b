#!/usr/bin/env python3
"""timeline.py — where a decode step's time goes inside its CUDA graph, launch by launch, with PDL as the engine runs it.

`memra profile` times each launch alone (a graph of copies of it); a step's launches overlap under PDL (a kernel's
pre-wait work runs while its predecessor finishes), so those times sum to more or less than the step and do not say
which launch is on the critical path (docs/PERFORMANCE.md, session 34's fold: "the next attempt needs a timeline of
the graph, not per-kernel replays"). This probe records one in the graph itself.

A copy of kernels/ (a temporary folder; kernels/ untouched) whose MEMRA_PDL_WAIT() (common.cuh) also has thread 0 of
block (0, 0, 0) read %globaltimer before and after `griddepcontrol.wait` and append (t_pre, t_post, site, smid) to a
buffer (a `__constant__` pointer each module holds; null = off). Its slot comes from an atomicAdd issued before the
wait, so the atomic's round trip overlaps the wait and the stores after it do not stall (a launch that starts late,
its wait returning at once, still pays it: the probe-on / probe-off step times bound what the probe costs). Every
memra kernel waits before it reads its predecessor's output and lets its dependants launch only after its own wait
(common.cuh's PDL contract), so the slots follow launch order, one a kernel. Per launch i of a step, medians over the
replays:

- crit = t_post[i+1] - t_post[i]: from the moment launch i's predecessors were complete to the moment its own
  were (its dependant's wait returned): the launch's share of the critical path; the crits sum to the step;
- wait = t_post[i] - t_pre[i]: how long block 0 sat at the wait (its pre-wait work and launch were hidden);
- lag = t_pre[i] - t_post[i-1]: from the predecessor's wait returning to this block reaching its own wait.

The step is the engine's decode graph (memra.gpu.runner decode_prepare, as `memra profile` takes it: `rows` sequences
filled to `depth` tokens, greedy); it is timed with the buffer set and with it null (the probe's own cost), and the
launches are labelled from the plan (memra.tune.profile's recorder: each plan launch's kernel launches).

    python3 experiments/timeline/timeline.py --compile-only                      # CPU: the copy builds (sm_90a)
    source .whl/setup.sh && python3 experiments/timeline/timeline.py synth:smollm2-135m:Q4_1 -d 64 --out tl.jsonl
    python3 experiments/timeline/timeline.py --summarize tl.jsonl --profile profile.jsonl   # by group, with alone µs

One JSON line per launch (kind timeline-launch) and one per step (kind timeline-step: step µs with the probe on and
off, the events' span, the timer's tick, crit summed by group).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MAX_EVENTS = 1 << 16
WORDS = 4  # an event: t_pre, t_post, site (file id << 20 | line), smid

# replaces common.cuh's sm_90 MEMRA_PDL_WAIT (one line there); the pointer is defined for every arch
PROBE = r'''#define MEMRA_TL_MAX @MAX@
#define MEMRA_PDL_WAIT() do {                                                                              \
    const bool b0_ = (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;  \
    unsigned long long* tl_ = b0_ ? memra_tl : 0;                                                           \
    unsigned long long t0_ = 0, t1_ = 0, i_ = 0;                                                            \
    if (tl_) {                                                                                              \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0_));                                            \
        i_ = atomicAdd(tl_, 1ull);                                                                          \
    }                                                                                                       \
    asm volatile("griddepcontrol.wait;" ::: "memory");                                                      \
    if (tl_) {                                                                                              \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1_));                                             \
        if (i_ < MEMRA_TL_MAX) {                                                                            \
            unsigned sm_;                                                                                   \
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                                                \
            tl_[1 + 4 * i_] = t0_; tl_[2 + 4 * i_] = t1_;                                                   \
            tl_[3 + 4 * i_] = ((unsigned long long)MEMRA_TL_FILE << 20) | __LINE__; tl_[4 + 4 * i_] = sm_;  \
        }                                                                                                   \
    }                                                                                                       \
} while (0)'''.replace("@MAX@", str(MAX_EVENTS))
# the pointer: constant memory of each module (the host sets it through cuLibraryGetGlobal; null = off)
POINTER = 'extern "C" { __constant__ unsigned long long* memra_tl = 0; }  // timeline probe (experiments/timeline)\n'
WAIT_LINE = '#define MEMRA_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")'


def build(dst: Path, arm: str = "base") -> dict[int, str]:
    """The probe's copy of kernels/ in dst (with experiments/pdl_early's `arm` edits first); returns {file id: file
    name} (the ids the sites carry)."""
    sys.path.insert(0, str(ROOT / "experiments" / "pdl_early"))
    from make import transform

    src = ROOT / "kernels"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    files = {}
    for p in sorted(src.iterdir()):
        if p.suffix not in (".cu", ".cuh"):
            continue
        text = transform(p.name, p.read_text(), arm)
        if p.name == "common.cuh":
            if text.count(WAIT_LINE) != 1 or "#pragma once\n" not in text:
                raise SystemExit("common.cuh: MEMRA_PDL_WAIT's sm_90 line (or #pragma once) not found once")
            text = text.replace(WAIT_LINE, PROBE).replace("#pragma once\n", "#pragma once\n" + POINTER, 1)
        elif p.suffix == ".cu":
            fid = len(files) + 1
            files[fid] = p.name
            # the file's id for the sites, then #line so __LINE__ is the original file's
            text = f'#define MEMRA_TL_FILE {fid}\n#line 1 "{p.name}"\n' + text
        (dst / p.name).write_text(text)
    return files


def use(dst: Path) -> None:
    """From now on every module this process compiles comes from dst (the cubin cache keys on the sources)."""
    import memra.gpu.compile as C

    C.kernel_dir = lambda: dst


def _worker_init(dst: str) -> None:
    use(Path(dst))


def prebuild(path, dst: Path, arch: str) -> int:
    """Compile the model's modules (memra warmup's list: its launch set over every table) from the probe's copy into
    the cubin cache, in parallel processes that compile from dst too; returns how many."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from memra.gpu.compile import _compile_job
    from memra.model.gguf import open_gguf
    from memra.tune.warmup import model_modules

    jobs = [(f, arch, d) for _, f, d in model_modules(open_gguf(path))]
    with ProcessPoolExecutor(max_workers=min(os.cpu_count() or 1, 16), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(str(dst),)) as ex:
        logs = [log for log, _ in ex.map(_compile_job, jobs)]
    bad = [j for j, log in zip(jobs, logs) if log]
    if bad:
        raise SystemExit(f"timeline: {len(bad)} probe modules failed to compile, first {bad[0]}")
    return len(jobs)


def set_pointer(g, ptr: int) -> int:
    """Every loaded module's memra_tl := ptr (0: off); returns how many modules hold it."""
    from cuda.bindings import driver

    n = 0
    val = np.array([ptr], np.uint64)
    for m in g._modules.values():
        err, dptr, size = driver.cuLibraryGetGlobal(m._obj.handle, b"memra_tl")
        if err != driver.CUresult.CUDA_SUCCESS or size != 8:
            continue  # a module none of whose kernels wait (the pointer optimized out)
        (err,) = driver.cuMemcpyHtoD(dptr, val.ctypes.data, 8)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"cuMemcpyHtoD of {m.kernel_file}'s memra_tl failed: {err!r}")
        n += 1
    return n


def analyse(ev: np.ndarray, reps: int) -> dict:
    """ev: (n, 4) events of `reps` back-to-back replays of one step. Per launch position: medians (ns) of crit, wait,
    lag; the span (first to last wait's return) per replay; the timer's tick (smallest nonzero step seen)."""
    n = len(ev)
    if reps < 1 or n % reps or n == 0:
        raise ValueError(f"{n} events do not split into {reps} replays")
    E = n // reps
    t = ev[:, :2].astype(np.int64).reshape(reps, E, 2)
    pre, post = t[:, :, 0], t[:, :, 1]
    crit = np.full((reps, E), np.nan)
    crit[:, :-1] = post[:, 1:] - post[:, :-1]
    lag = np.full((reps, E), np.nan)
    lag[:, 1:] = pre[:, 1:] - post[:, :-1]
    steps = np.diff(np.unique(ev[:, :2].astype(np.int64).ravel()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the all-NaN first lag / last crit
        crit_m, lag_m = np.nanmedian(crit, axis=0), np.nanmedian(lag, axis=0)
    return {"events": E, "crit_ns": crit_m, "wait_ns": np.median((post - pre).astype(float), axis=0),
            "lag_ns": lag_m, "span_ns": float(np.median(post[:, -1] - post[:, 0])),
            "tick_ns": int(steps[steps > 0].min()) if (steps > 0).any() else None,
            "sites": ev[:E, 2].astype(np.int64), "smid": ev[:E, 3].astype(np.int64)}


def read_events(buf) -> np.ndarray:
    """The events the probe wrote since the buffer's counter was zeroed, (n, WORDS)."""
    cnt = int(buf.view(shape=(1,)).numpy()[0])
    if cnt > MAX_EVENTS:
        raise SystemExit(f"{cnt} events over the buffer's {MAX_EVENTS}: fewer --chunk")
    return buf.view(shape=(WORDS * cnt,), offset=8).numpy().reshape(cnt, WORDS) if cnt else np.zeros((0, WORDS), np.uint64)


def reset_events(buf) -> None:
    """Zero the buffer's event counter (before a chunk of replays)."""
    buf.view(shape=(1,)).upload(np.zeros(1, np.uint64))


def positions(chunk: int) -> int:
    """Positions a sequence's step advances between resets: a chunk of replays, or a timing's 10, and 2 spare."""
    return max(chunk, 10) + 2


def record(r, rows: int, depth: int, reps: int, chunk: int, seed: int = 0):
    """The step of `rows` sequences at `depth` (as memra profile takes it), its kernel launches labelled from the plan
    [(plan launch, kernel name)], its time with the probe off and on (µs), and the events of `reps` replays recorded
    in chunks of `chunk` (the positions put back before each chunk). The runner must run the probe's kernel copy."""
    from memra.gpu import plan as PLAN
    from memra.gpu.runner import Row, Sampling
    from memra.tune.profile import _Recorder

    g = r.g
    span = positions(chunk)
    buf = g.empty((1 + WORDS * MAX_EVENTS,), np.uint64)
    rng = np.random.default_rng(seed)
    V = r.cfg.n_vocab
    seqs = [r.open() for _ in range(rows)]
    try:
        if depth:
            for s in seqs:
                r.step([Row(s, rng.integers(0, V, depth).tolist())])
        first = rng.integers(0, V, rows).tolist()
        greedy = [Sampling(0.0)] * rows

        def prepare():
            return r.decode_prepare(seqs, first, span, greedy)

        prepare()  # captures the step's graph; sets the step's attention kind
        bucket = PLAN.graph_bucket(rows)
        launches = r.plan.step(bucket, decode=True, sampler="greedy", att_kind=r.dec_kind)
        calls = []
        for L in launches:
            rec = _Recorder(g)
            r._run([L], bucket, r.r_tok, r.r_pos, r.r_seq, r._state(1), g=rec)
            calls += [(L, k.name) for k, *_ in rec.calls]
        g.sync()

        def timed():
            gr = prepare()
            return float(np.median(g.time_ms(gr.launch, reps=8, warmup=2))) * 1e3

        set_pointer(g, 0)
        off_us = timed()
        held = set_pointer(g, buf.ptr)
        on_us = timed()
        evs, done = [], 0
        while done < reps:
            k = min(chunk, reps - done)
            gr = prepare()
            reset_events(buf)
            for _ in range(k):
                gr.launch()
            g.sync()
            evs.append(read_events(buf))
            done += k
        set_pointer(g, 0)
    finally:
        for s in seqs:
            r.close(s)
    return calls, np.concatenate(evs), off_us, on_us, held


def report(calls, ev: np.ndarray, reps: int, files: dict[int, str], base: dict, off_us: float, on_us: float,
           held: int) -> list[dict]:
    """The JSON lines: one a kernel launch of the step (labelled from the plan when the events match its kernel
    launches one to one), then the step's."""
    a = analyse(ev, reps)
    ok = a["events"] == len(calls)
    out, groups = [], {}
    for i in range(a["events"]):
        site = int(a["sites"][i])
        rec = {"kind": "timeline-launch", **base, "i": i, "site": f"{files.get(site >> 20, '?')}:{site & 0xFFFFF}",
               "smid": int(a["smid"][i]),
               "crit_us": None if np.isnan(a["crit_ns"][i]) else round(float(a["crit_ns"][i]) / 1e3, 3),
               "wait_us": round(float(a["wait_ns"][i]) / 1e3, 3),
               "lag_us": None if np.isnan(a["lag_ns"][i]) else round(float(a["lag_ns"][i]) / 1e3, 3)}
        if ok:
            L, kname = calls[i]
            rec.update(kernel=kname, name=L.name, op=L.op, group=L.group or L.op, layer=L.layer,
                       shape=dict(L.shape), config=dict(L.config or {}))
            if rec["crit_us"] is not None:
                groups[rec["group"]] = groups.get(rec["group"], 0.0) + rec["crit_us"]
        out.append(rec)
    out.append({"kind": "timeline-step", **base, "events": a["events"], "kernel_launches": len(calls),
                "labelled": ok, "modules_probed": held, "step_us_probe_off": round(off_us, 2),
                "step_us_probe_on": round(on_us, 2), "span_us": round(a["span_ns"] / 1e3, 2),
                "tick_ns": a["tick_ns"],
                "crit_us_by_group": {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}})
    return out


def run(args) -> None:
    from memra.cli.bench import _open_table
    from memra.gpu import cuda
    from memra.gpu.runner import Runner
    from memra.tune import bench as B
    from memra.tune.receipts import git_sha, utc_now

    # one fixed folder: NVRTC's -I names it, so the cubin cache serves the next run's same sources
    tmp = Path(tempfile.gettempdir()) / "memra-timeline"
    files = build(tmp / "kernels", args.arm)
    use(tmp / "kernels")
    name, path = B.resolve_model(args.model, args.synth_tokenizer)
    g = cuda.gpu()
    t0 = time.perf_counter()
    n = prebuild(path, tmp / "kernels", g.info.arch)
    print(f"{name}: {n} probe modules ready in {time.perf_counter() - t0:.1f} s", flush=True)
    tbl, label = _open_table(None, g.info)
    span = positions(args.chunk)
    r = Runner(path, max_len=max(64, args.depth + span + 32), max_seqs=args.rows,
               kv_tokens=args.rows * (args.depth + span + 48), tune_table=tbl)
    calls, ev, off_us, on_us, held = record(r, args.rows, args.depth, args.reps, args.chunk, args.seed)
    base = {"model": name, "rows": args.rows, "depth": args.depth, "reps": args.reps, "device": g.info.name,
            "arm": args.arm,
            "table": label, "git_sha": git_sha(), "ts": utc_now()}
    out = report(calls, ev, args.reps, files, base, off_us, on_us, held)
    if args.out:
        with open(args.out, "a") as f:
            for rec in out:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
    step = out[-1]
    print(f"{name}: {args.rows} row(s) at depth {args.depth}: step {off_us:.1f} µs (probe off), {on_us:.1f} (on); "
          f"{step['events']} events a replay for {len(calls)} kernel launches"
          f"{'' if step['labelled'] else ' (NOT LABELLED)'}; span {step['span_us']:.1f} µs; "
          f"timer tick {step['tick_ns']} ns", flush=True)
    for k, v in step["crit_us_by_group"].items():
        print(f"  {k:24s} {v:9.1f} µs")


def summarize(timeline: Path, profile: Path | None = None) -> list[str]:
    """Per step in a timeline file: crit / wait / lag summed by group, beside each group's alone time from a
    `memra profile --json` file of the same model, rows and depth (matched by launch name, in order)."""
    recs = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    profs = [json.loads(line) for line in profile.read_text().splitlines() if line.strip()] if profile else []
    lines, cur = [], []
    for r in recs:
        if r["kind"] == "timeline-launch":
            cur.append(r)
            continue
        prof = next((p for p in profs if (p.get("model"), p.get("rows"), p.get("depth")) ==
                     (r["model"], r["rows"], r["depth"])), None)
        alone: dict[str, list[float]] = {}
        for x in (prof or {}).get("launches", []):
            alone.setdefault(x["name"], []).append(x["us"])
        groups: dict[str, list[float]] = {}
        for x in cur:
            g = groups.setdefault(x.get("group") or x["site"], [0.0, 0.0, 0.0, 0.0, 0])
            g[0] += x["crit_us"] or 0.0
            g[1] += x["wait_us"]
            g[2] += x["lag_us"] or 0.0
            g[4] += 1
        for name, us in alone.items():   # a plan launch's alone time once, under its group
            grp = next((x.get("group") for x in cur if x.get("name") == name), None)
            if grp in groups:
                groups[grp][3] += sum(us)
        lines.append(f"{r['model']}{'' if r.get('arm', 'base') == 'base' else ' [' + r['arm'] + ']'}: {r['rows']} "
                     f"row(s) at depth {r['depth']} on {r['device']}: step "
                     f"{r['step_us_probe_off']} µs (probe on {r['step_us_probe_on']}), span {r['span_us']} µs, "
                     f"{r['events']} launches{'' if r['labelled'] else ' (not labelled)'}, tick {r['tick_ns']} ns")
        lines.append(f"  {'group':24s} {'n':>4s} {'crit µs':>9s} {'alone µs':>9s} {'wait µs':>9s} {'lag µs':>9s}")
        for k, (c, w, lg, a, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"  {k:24s} {n:4d} {c:9.1f} {a if prof else float('nan'):9.1f} {w:9.1f} {lg:9.1f}")
        cur = []
    return lines


def compile_only(arch: str, model: str) -> None:
    """Build the copy and compile, for each kernel file, the first module the model's launch set (built-in table)
    loads, and the prefill path's: every file's probe compiles (the device run compiles the rest as the engine
    asks)."""
    from memra.gpu.compile import compile_cubin
    from memra.tune.launches import launch_modules, launch_set, model_specs

    tmp = Path(tempfile.mkdtemp(prefix="memra-timeline-"))
    build(tmp / "kernels")
    use(tmp / "kernels")
    specs, missing = model_specs([model])
    if missing:
        raise SystemExit(f"timeline: {missing[0]}")
    # the prefill path's files too (the run fills the depth through it)
    first: dict[str, dict] = {"gemm_f16_wg.cu": {"MV_TYPE": 12}, "gemm_f16.cu": {"MV_TYPE": 12}, "act.cu": {}}
    for f, d in launch_modules(launch_set(specs)):
        first.setdefault(f, d)
    for f, d in sorted(first.items()):
        cub = compile_cubin(f, arch, d, use_cache=False)
        assert cub[:4] == b"\x7fELF", f
    print(f"timeline probe: {len(first)} kernel files built for {arch} ({', '.join(sorted(first))})")
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="synth:smollm2-135m:Q4_1")
    ap.add_argument("-d", "--depth", type=int, default=64)
    ap.add_argument("--rows", "-np", type=int, default=1)
    ap.add_argument("--reps", type=int, default=200, help="replays recorded (medians over them)")
    ap.add_argument("--chunk", type=int, default=8, help="replays between resets of the positions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arm", default="base", help="experiments/pdl_early's arm (base, nq, early): where kernels "
                    "trigger their PDL dependants")
    ap.add_argument("--synth-tokenizer", default="smollm2-135m", help="alias or GGUF a synth: model's tokenizer "
                    "comes from (as memra profile)")
    ap.add_argument("--out", help="append the JSON lines here")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--summarize", type=Path, metavar="TIMELINE", help="print a timeline file's steps by group "
                    "(with --profile: each group's alone time from memra profile --json beside)")
    ap.add_argument("--profile", type=Path, help="with --summarize: memra profile --json lines")
    args = ap.parse_args(argv)
    if args.summarize:
        print("\n".join(summarize(args.summarize, args.profile)))
    elif args.compile_only:
        compile_only(args.arch, args.model)
    else:
        run(args)


if __name__ == "__main__":
    main()
