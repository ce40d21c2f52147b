"""matvec on the GPU in one call: kernel-check for the family, then a timing sweep.

Run on the device:  source .whl/setup.sh && python3 experiments/gpu_matvec_check.py
Writes $OUT/matvec_kernelcheck.txt and $OUT/matvec_sweep.jsonl (one line per measurement:
type, shape, path, batch, config, median/p20/p80 us per launch, bytes, GB/s, % of 4.3 TB/s
and of the measured copy bandwidth, relative error vs a float32 reference), and prints the
best config per (type, shape, path) last.

Timing: a CUDA graph of LAUNCHES launches cycling through enough weight copies to exceed
2x L2 (capped), CUDA events around each replay, median over REPS replays, per-launch time
= replay time / LAUNCHES. Every config is checked against the reference before it is timed.

Options (env): PLAN=1|2|3 (which sweep: 1 = first config grid, 2 = prefetch/PDL grid,
3 = shared-memory activations vs defaults, the default), SWEEP=quick|full (plan 1),
DEADLINE_S (250).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memra.gpu import cuda  # noqa: E402
from memra.gpu.compile import compile_many, source_hash  # noqa: E402
from memra.gpu.ops import matvec as M  # noqa: E402

T0 = time.time()
DEADLINE = float(os.environ.get("DEADLINE_S", "250"))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
ROOF = 4.3e12
LAUNCHES, REPS = 20, 25
CHECK_ROWS = 256
OUT_ROWS = 128256
SWEEP = os.environ.get("SWEEP", "full")

# (label, rows, cols, glu): llama3-8b and llama-1b decode matrices (QKV stacked, gate+up stacked)
SHAPES_8B = [("8b.qkv", 6144, 4096, False), ("8b.o", 4096, 4096, False),
             ("8b.gateup", 2 * 14336, 4096, True), ("8b.down", 4096, 14336, False)]
SHAPES_1B = [("1b.qkv", 3072, 2048, False), ("1b.gateup", 2 * 8192, 2048, True),
             ("1b.down", 2048, 8192, False)]
SHAPES_SMALL = [("smol.gateup", 2 * 1536, 576, True), ("gemma.gateup", 2 * 2048, 640, True)]
MAIN_TYPES = ["Q4_K", "Q6_K", "Q4_0", "Q8_0"]
OTHER_TYPES = ["Q4_1", "Q5_0", "Q5_1", "Q5_K", "IQ4_XS", "F16", "BF16", "F32"]


def configs(level: str):
    """full: 36 configs + 8 load flavours; mid: 10 + 4; min: 4 (the default first)."""
    d = dict(MV_NWARPS=4, MV_ROWS=1, MV_KSPLIT=1, MV_UNROLL=1)
    if level == "full" or level == "mid":
        extra = [dict(c, MV_WLOAD=wl) for wl in (1, 2) for c in (
            d, dict(MV_NWARPS=8, MV_ROWS=2, MV_KSPLIT=1, MV_UNROLL=1),
            dict(MV_NWARPS=4, MV_ROWS=1, MV_KSPLIT=2, MV_UNROLL=2), dict(MV_NWARPS=8, MV_ROWS=2, MV_KSPLIT=2, MV_UNROLL=2))]
    if level == "full":
        out = [d] + extra
        for nw, r, ks, u in itertools.product((4, 8), (1, 2, 4), (1, 2, 4), (1, 2)):
            c = dict(MV_NWARPS=nw, MV_ROWS=r, MV_KSPLIT=ks, MV_UNROLL=u)
            if c != d:
                out.append(c)
        return out
    if level == "mid":
        return [d] + [dict(MV_NWARPS=nw, MV_ROWS=r, MV_KSPLIT=ks, MV_UNROLL=1)
                      for nw, r, ks in itertools.product((4, 8), (1, 2), (1, 2)) if (nw, r, ks) != (4, 1, 1)] + \
            [dict(MV_NWARPS=4, MV_ROWS=1, MV_KSPLIT=1, MV_UNROLL=2), dict(MV_NWARPS=8, MV_ROWS=2, MV_KSPLIT=2, MV_UNROLL=2)] + extra[:4]
    return [d, dict(MV_NWARPS=8, MV_ROWS=2, MV_KSPLIT=1, MV_UNROLL=1),
            dict(MV_NWARPS=4, MV_ROWS=1, MV_KSPLIT=2, MV_UNROLL=1), dict(MV_NWARPS=4, MV_ROWS=2, MV_KSPLIT=1, MV_UNROLL=2)]


def grid2(small: bool):
    """Second sweep: prefetch on/off over warps x rows x k-split (unroll 1)."""
    out = []
    for pf, nw, r, ks in itertools.product((1, 0), (4, 8), (1, 2, 4), (1, 2)):
        if small and (r == 4 or nw == 8 and ks == 2):
            continue
        out.append(dict(MV_NWARPS=nw, MV_ROWS=r, MV_KSPLIT=ks, MV_UNROLL=1, MV_PREFETCH=pf))
    return out


def plan2():
    plan = []
    for tn in MAIN_TYPES:
        for (label, rows, cols, glu) in SHAPES_8B + SHAPES_1B + SHAPES_SMALL:
            if M.TYPES[M.type_id(tn)][1] == 256 and cols % 256:
                continue
            for cfg in grid2(not label.startswith("8b")):
                plan.append((tn, label, rows, cols, glu, "q8", 1, cfg))
    for path in ("q8",):
        for cfg in grid2(True)[:6]:
            plan.append(("Q6_K", "8b.out", OUT_ROWS, 4096, False, path, 1, cfg))
    for tn in ("F16", "BF16", "F32"):
        for (label, rows, cols, glu) in SHAPES_8B:
            for pf, nw, r, ks in itertools.product((1, 0), (4, 8), (1, 2), (1,)):
                plan.append((tn, label, rows, cols, glu, "f32", 1,
                             dict(MV_NWARPS=nw, MV_ROWS=r, MV_KSPLIT=ks, MV_UNROLL=1, MV_PREFETCH=pf)))
    for (label, rows, cols, glu) in SHAPES_8B:
        for pf, r in itertools.product((1, 0), (1, 2)):
            plan.append(("Q4_K", label, rows, cols, glu, "f32", 1,
                         dict(MV_NWARPS=4, MV_ROWS=r, MV_KSPLIT=1, MV_UNROLL=1, MV_PREFETCH=pf)))
    for tn in ("Q4_K", "Q4_0", "Q8_0"):
        for (label, rows, cols, glu) in SHAPES_8B:
            for nb in (4, 8):
                for r in (2, 4, 8):
                    plan.append((tn, label, rows, cols, glu, "q8", nb,
                                 dict(MV_NWARPS=4, MV_ROWS=r, MV_KSPLIT=1, MV_UNROLL=1, MV_PREFETCH=1)))
    return plan


def plan3():
    """Third sweep: activations staged in shared memory (MV_XSMEM) against the built-in
    defaults, batch 1 and batched."""
    plan = []
    xs = [dict(MV_NWARPS=nw, MV_ROWS=r, MV_KSPLIT=1, MV_UNROLL=1, MV_XSMEM=1)
          for nw, r in ((4, 2), (8, 2), (8, 4), (16, 2), (16, 4))]
    for tn in MAIN_TYPES:
        t = M.type_id(tn)
        for (label, rows, cols, glu) in SHAPES_8B + SHAPES_1B + SHAPES_SMALL:
            if M.TYPES[t][1] == 256 and cols % 256:
                continue
            n = rows // 2 if glu else rows
            for nb in (1, 4, 8):
                if nb > 1 and not label.startswith("8b"):
                    continue
                base = M.default_config(t, "q8", n, cols, nb, glu)
                for cfg in [base, dict(base, MV_UNROLL=2)] + xs:
                    plan.append((tn, label, rows, cols, glu, "q8", nb, cfg))
    for cfg in xs[:3]:
        plan.append(("Q6_K", "8b.out", OUT_ROWS, 4096, False, "q8", 1, cfg))
    return plan


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def main():
    g = cuda.gpu()
    info = g.info
    bw = g.copy_bandwidth()
    sha = os.environ.get("MEMRA_GIT_SHA", "unknown")
    log(f"device {info.name} {info.arch} SMs={info.sm_count} L2={info.l2_bytes >> 20} MiB "
        f"copy={bw / 1e9:.0f} GB/s git={sha}")

    # --- the plan: (type, shape, path, batch, config) ------------------------------------
    plan = []
    quick = SWEEP != "full"
    for tn in MAIN_TYPES:
        for (label, rows, cols, glu) in SHAPES_8B + SHAPES_1B + SHAPES_SMALL:
            if M.TYPES[M.type_id(tn)][1] == 256 and cols % 256:
                continue
            for path in ("q8", "f32"):
                if quick:
                    level = "min"
                elif label.startswith("8b") and tn in ("Q4_K", "Q4_0") and path == "q8":
                    level = "full"
                elif label.startswith("8b"):
                    level = "mid"
                else:
                    level = "min"
                for cfg in configs(level):
                    plan.append((tn, label, rows, cols, glu, path, 1, cfg))
    # llama3-8b output projection (Q6_K in Q4_K_M), 128256 x 4096
    for path in ("q8", "f32"):
        for cfg in configs("mid" if not quick else "min"):
            plan.append(("Q6_K", "8b.out", OUT_ROWS, 4096, False, path, 1, cfg))
    for tn in ("Q4_K", "Q4_0", "Q8_0"):
        for (label, rows, cols, glu) in SHAPES_8B:
            for nb in (4, 8):
                for cfg in [dict(MV_NWARPS=4, MV_ROWS=r, MV_KSPLIT=1, MV_UNROLL=1) for r in (1, 2)]:
                    plan.append((tn, label, rows, cols, glu, "q8", nb, cfg))

    for tn in OTHER_TYPES:
        for (label, rows, cols, glu) in SHAPES_8B:
            for path in (("f32",) if M.type_id(tn) in M.FLOAT_TYPES else ("q8", "f32")):
                for cfg in configs("min")[:2]:
                    plan.append((tn, label, rows, cols, glu, path, 1, cfg))
    which = os.environ.get("PLAN", "3")
    if which == "2":
        plan = plan2()
    elif which == "3":
        plan = plan3()
    # --- compile everything first, in parallel ------------------------------------------
    jobs = {(M.KERNEL_FILE, info.arch, tuple(sorted({"MV_TYPE": M.type_id(p[0]), "MV_B": M.bucket(p[6]), **p[7]}.items())))
            for p in plan}
    jobs |= {(f, info.arch, tuple(sorted(d.items()))) for f, d in M.compile_variants()}
    jobs = [(f, a, dict(d)) for f, a, d in sorted(jobs)]
    log(f"compiling {len(jobs)} modules on {os.cpu_count()} cores")
    bad = [(j, lg) for j, lg, _ in compile_many(jobs) if lg is not None]
    for j, lg in bad:
        log("COMPILE FAIL", j, lg[:2000])
    log("compiled")

    # --- kernel-check -------------------------------------------------------------------
    from memra.tune.kernelcheck import run_kernel_check

    kc = list(run_kernel_check(only="matvec"))
    (OUT / "matvec_kernelcheck.txt").write_text("\n".join(kc) + "\n")
    for line in kc:
        if not line.startswith("PASS") or "canary" in line:
            print(line)
    log(kc[-1])

    # --- sweep --------------------------------------------------------------------------
    rng = np.random.default_rng(0)
    rotate = 3 * info.l2_bytes
    rows_out = []
    fout = open(OUT / "matvec_sweep.jsonl", "w")
    cur_key, weights, ref = None, None, None
    x = rng.standard_normal((8, 14336)).astype(np.float32)
    xd = g.to_device(x)
    xq = g.empty((8, 14336), np.int8)
    xs = g.empty((8, 14336 // 32), M.Q8_SCALE)
    for (tn, label, rows, cols, glu, path, nb, cfg) in plan:
        if time.time() - T0 > DEADLINE:
            log("deadline: sweep stopped")
            break
        t = M.type_id(tn)
        key = (tn, label)
        if key != cur_key:
            weights = None
            raw = M.random_weight(t, rows, cols, rng)
            w0 = M.upload_weight(g, raw, t)
            sets = min(32, max(2, -(-rotate // w0.nbytes)))
            weights = [w0] + [M.upload_weight(g, M.random_weight(t, rows, cols, rng), t) for _ in range(sets - 1)]
            # the check compares the first CHECK_ROWS outputs (rows are independent)
            n_out = rows // 2 if glu else rows
            cr = min(CHECK_ROWS, n_out)
            idx = np.r_[0:cr, n_out:n_out + cr] if glu else np.r_[0:cr]
            wf = M.dequant_rows(raw[idx], t)
            cur_key = key
            refs = {}
        xv = x[:nb, :cols]
        xdv = g.to_device(np.ascontiguousarray(xv))
        M.quantize_q8(g, xdv, xq, xs, nb)
        if (path, nb) not in refs:
            if path == "q8":
                q, s = M.quantize_q8_ref(xv)
                xin = (q.reshape(nb, -1, 32).astype(np.float32) * s["d"][..., None]).reshape(nb, cols)
            else:
                xin = xv
            yref = xin @ wf.T
            if glu:
                a = yref[:, :cr]
                with np.errstate(over="ignore"):
                    a = a / (1 + np.exp(-a))
                yref = a * yref[:, cr:]
            refs[(path, nb)] = yref.astype(np.float64)
        N = rows // 2 if glu else rows
        y = g.empty((nb, N), np.float32)
        xqv = xq.view(np.int8, (nb * cols,), 0)
        xsv = xs.view(M.Q8_SCALE, (nb * cols // 32,), 0)

        def launch(i, w=None):
            w = w or weights[i % len(weights)]
            if path == "q8":
                M.matvec(g, w, y, xq=xqv, xs=xsv, nb=nb, glu="silu" if glu else None, config=cfg)
            else:
                M.matvec(g, w, y, x=xdv, nb=nb, glu="silu" if glu else None, config=cfg)

        rec = {"schema": "memra.matvec.v1", "device": info.name, "cc": list(info.cc), "sms": info.sm_count,
               "git_sha": sha, "src_hash": source_hash(M.KERNEL_FILE), "type": tn, "shape": label,
               "rows": rows, "cols": cols, "glu": glu, "path": path, "batch": nb, "config": cfg,
               "sets": len(weights)}
        try:
            y.poison()
            launch(0, weights[0])
            g.sync()
            got = y.numpy().astype(np.float64)[:, :cr]
            r = refs[(path, nb)]
            err = float(np.linalg.norm(got - r) / np.linalg.norm(r)) if np.all(np.isfinite(got)) else float("inf")
            rec["rel_err"] = err
            rec["ok"] = err < 1e-4   # float32 reference here; kernel-check holds the tight tolerance
            if not rec["ok"]:
                raise RuntimeError(f"wrong result: rel err {err:.2e}")
            n = LAUNCHES - LAUNCHES % len(weights) if len(weights) <= LAUNCHES else len(weights)
            with g.capture() as graph:
                for i in range(n):
                    launch(i)
            graph.upload()
            ms = g.time_ms(graph.launch, reps=REPS, warmup=3)
            graph.close()
            us = ms * 1e3 / n
            p20, med, p80 = np.percentile(us, [20, 50, 80])
            nbytes = weights[0].nbytes + nb * (cols * (1.125 if path == "q8" else 4) + N * 4)
            rec.update(median_us=float(med), p20_us=float(p20), p80_us=float(p80), reps=REPS,
                       launches=n, bytes=int(nbytes), gbps=nbytes / med / 1e3,
                       pct_roof=100 * nbytes / med / 1e-6 / ROOF, pct_copy=100 * nbytes / med / 1e-6 / bw)
        except Exception as e:  # a failed config is recorded, never timed
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
        fout.write(json.dumps(rec) + "\n")
        fout.flush()
        rows_out.append(rec)
    fout.close()

    # --- PDL on a chain of 8b layer matvecs (best configs of this sweep) -------------------
    try:
        pdl_rows = pdl_experiment(g, rng, rows_out)
        with open(OUT / "matvec_sweep.jsonl", "a") as f:
            for r in pdl_rows:
                r.update(device=info.name, git_sha=sha)
                f.write(json.dumps(r) + "\n")
    except Exception as e:
        log("pdl experiment failed:", repr(e))

    # --- summary ------------------------------------------------------------------------
    best = {}
    for r in rows_out:
        if not r.get("ok") or "median_us" not in r:
            continue
        k = (r["type"], r["shape"], r["path"], r["batch"])
        if k not in best or r["median_us"] < best[k]["median_us"]:
            best[k] = r
    fails = [r for r in rows_out if not r.get("ok")]
    print(f"\n{len(rows_out)} measurements, {len(fails)} failed")
    for r in fails[:10]:
        print("  FAIL", r["type"], r["shape"], r["path"], r["batch"], r["config"], r.get("error"))
    print(f"{'type':7} {'shape':13} {'path':4} {'B':>2} {'us':>8} {'GB/s':>7} {'%4.3T':>6}  config")
    for k in sorted(best):
        r = best[k]
        c = r["config"]
        print(f"{r['type']:7} {r['shape']:13} {r['path']:4} {r['batch']:2d} {r['median_us']:8.2f} "
              f"{r['gbps']:7.0f} {r['pct_roof']:6.1f}  w{c['MV_NWARPS']} r{c['MV_ROWS']} "
              f"k{c['MV_KSPLIT']} u{c['MV_UNROLL']}")
    log("done")


LAYER_8B = [("Q4_K", "8b.qkv"), ("Q4_K", "8b.o"), ("Q4_K", "8b.gateup"), ("Q6_K", "8b.down")]


def pdl_experiment(g, rng, rows_out):
    """8 llama3-8b layers' matvecs (qkv, o, gate+up Q4_K; down Q6_K), each after its
    activation quantization, in one graph: PDL off/on x trigger early/at exit, ABAB."""
    best = {}
    for r in rows_out:
        if r.get("ok") and "median_us" in r and r["batch"] == 1 and r["path"] == "q8":
            k = (r["type"], r["shape"])
            if k not in best or r["median_us"] < best[k]["median_us"]:
                best[k] = r
    shapes = {lab: (r, c, glu) for (lab, r, c, glu) in SHAPES_8B}
    layers = []
    for _ in range(8):
        layers.append([(tn, lab, M.upload_weight(g, M.random_weight(M.type_id(tn), shapes[lab][0], shapes[lab][1], rng),
                                                  M.type_id(tn))) for tn, lab in LAYER_8B])
    x = g.to_device(rng.standard_normal((1, 14336)).astype(np.float32))
    xq, xs = g.empty((1, 14336), np.int8), g.empty((1, 14336 // 32), M.Q8_SCALE)
    ys = {lab: g.empty((1, r // 2 if glu else r), np.float32) for (lab, r, c, glu) in SHAPES_8B}
    total = sum(w.nbytes for ws in layers for _, _, w in ws)
    jobs = [(M.KERNEL_FILE, g.info.arch, {"MV_TYPE": M.type_id(tn), "MV_B": 1, **best[(tn, lab)]["config"],
                                          "MV_PDL_TRIGGER": trig})
            for tn, lab in LAYER_8B if (tn, lab) in best for trig in (0, 1)]
    list(compile_many(jobs))
    out = []
    variants = [(False, 1), (True, 1), (True, 0), (False, 1), (True, 1), (True, 0)]
    for pdl, trig in variants:
        def step():
            for ws in layers:
                for tn, lab, w in ws:
                    r, c, glu = shapes[lab]
                    cfg = dict(best[(tn, lab)]["config"]) if (tn, lab) in best else None
                    if cfg is not None:
                        cfg["MV_PDL_TRIGGER"] = trig
                    xv = x.view(np.float32, (c,), 0)
                    M.quantize_q8(g, xv, xq, xs, 1)
                    M.matvec(g, w, ys[lab], xq=xq.view(np.int8, (c,), 0), xs=xs.view(M.Q8_SCALE, (c // 32,), 0),
                             nb=1, glu="silu" if glu else None, pdl=pdl, config=cfg)
        step()
        g.sync()
        with g.capture() as graph:
            step()
        graph.upload()
        ms = g.time_ms(graph.launch, reps=30, warmup=3)
        graph.close()
        med = float(np.median(ms))
        out.append({"schema": "memra.matvec.pdl.v1", "pdl": pdl, "trigger": trig, "layers": 8,
                    "median_ms": med, "p20_ms": float(np.percentile(ms, 20)), "p80_ms": float(np.percentile(ms, 80)),
                    "bytes": int(total), "gbps": total / med / 1e6,
                    "configs": {f"{tn} {lab}": best.get((tn, lab), {}).get("config") for tn, lab in LAYER_8B}})
        log(f"pdl={pdl} trigger={trig}: 8 layers {med * 1e3:.1f} us, {total / med / 1e6:.0f} GB/s "
            f"({100 * total / med / 1e9 / ROOF * 1e3:.1f}% of 4.3 TB/s)")
    return out


if __name__ == "__main__":
    main()
