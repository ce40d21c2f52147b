"""Does `memra serve`'s host path keep up with the device at c = 64? (session 58)

On the H100 the 8B Q4_K_M's 64-row decode step with MEMRA_DECODE=qf MEMRA_QF_HEAD=1 profiles at 9.84 ms of device
time (research/2026-12-08-session58/profile), yet the served c = 64 cell's TPOT p50 is 11.1-11.5 ms
(research/2026-12-08-session58/budget). This harness runs the real server — uvicorn, the API, the scheduler, the
text pipeline — over a null engine whose calls cost emulated device time and compute nothing, and drives it with
`memra bench serve`'s client from another process (as on the device). Whatever TPOT exceeds the emulated step is
the host's or the schedule's; on exit the server prints the emulated device's busy time and idle gaps (README.md:
the host keeps up; the served cell is the device's work).

The null engine is memra.serve.cpu_engine.CpuRunner's KV bookkeeping with:
  step(rows): sleeps prefill tokens x PREFILL_S + (decode rows ? step_s(rows) : 0); every sampled row gets TOKEN;
  decode_run: the GPU runner's contract (memra.gpu.runner.Runner.decode_run): a chunk of m steps is queued, ends
    m x step_s(k) after the later of its queueing and the previous chunk's end, its tokens are read back when it
    ends (a sleep until then; --hold-gil: a spin, as a device copy that kept the GIL would), and the next chunk
    (--ahead N: up to N chunks) is queued before they are yielded.
step_s(rows) is linear through the H100 profiles: 2.97 ms at one row, 9.84 at 64.

    python3 experiments/serve_host/host_bench.py [-c 64,8,1] [--budget 2048] [--ahead 1] [--step-scale 1.0]
    HOST_BENCH_STEP64=8.5 HOST_BENCH_PREFILL=12000 python3 experiments/serve_host/host_bench.py -c 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# H100, qf + head, profile step_us at 1 and 64 rows, depth 160 (HOST_BENCH_STEP64: another 64-row step, ms)
STEP_1, STEP_64 = 2.97e-3, float(os.environ.get("HOST_BENCH_STEP64", "9.84")) * 1e-3
# s a prompt token (pp512 of the 8B Q4_K_M on the H100: ~18k t/s; HOST_BENCH_PREFILL: another rate, t/s)
PREFILL_S = 1 / float(os.environ.get("HOST_BENCH_PREFILL", "18000"))


def step_s(rows: int, scale: float) -> float:
    return scale * (STEP_1 + (STEP_64 - STEP_1) * (rows - 1) / 63)


def _wait_until(t: float, hold_gil: bool) -> None:
    if hold_gil:   # a blocking call that keeps the GIL: spin
        while time.perf_counter() < t:
            pass
    else:
        d = t - time.perf_counter()
        if d > 0:
            time.sleep(d)


def null_runner_class():
    import numpy as np

    from memra.gpu.runner import RowOut
    from memra.serve.cpu_engine import CpuRunner

    class NullRunner(CpuRunner):
        """CpuRunner's sequences and KV bookkeeping; no arithmetic; emulated device time."""

        token = 0
        scale = 1.0
        hold_gil = False
        ahead = 1   # chunks queued beyond the one being read back (the runner's: 1)

        def warm_up(self) -> None:
            pass

        def _row(self, r, toks):
            seq = r.seq
            end = seq.n + len(toks)
            self.kv.writable(seq.slot, seq.n, end)
            self.loaded[seq.slot] = end
            seq.n = end
            out = RowOut()
            if r.logits in ("last", "all"):
                lg = np.zeros(self.cfg.n_vocab, np.float32)
                lg[self.token] = 1.0
                out.logits = lg if r.logits == "last" else np.stack([lg] * len(toks))
            if r.sample is not None:
                out.token = self.token
            return out

        busy: list = []   # emulated device (start, end, kind)
        stats = {"step_calls": 0, "step_dec_rows": 0, "step_pre_tokens": 0, "step_s": 0.0, "runs": 0,
                 "run_steps": 0, "run_dev_s": 0.0}

        def step(self, rows, graph: bool = True, fill=None):
            t0 = time.perf_counter()
            st = self.stats
            out = super().step(rows, graph, fill)
            dec = sum(1 for r in rows if len(r.tokens) == 1)
            pre = sum(len(r.tokens) for r in rows if len(r.tokens) > 1)
            dev = pre * PREFILL_S + (step_s(dec, self.scale) if dec else 0.0)
            self.busy.append((t0, t0 + dev, f"step dec={dec} pre={pre}"))
            _wait_until(t0 + dev, self.hold_gil)
            st["step_calls"] += 1
            st["step_dec_rows"] += dec
            st["step_pre_tokens"] += pre
            st["step_s"] += dev
            return out

        def decode_run(self, seqs, first, n, sampling, chunk: int = 8, more=None):
            if n <= 0 or not seqs:
                return
            k = len(seqs)
            for s in seqs:
                self.kv.reserve(s.slot, s.n + n)
                self.kv.writable(s.slot, s.n, s.n + n)
            dt = step_s(k, self.scale)
            left, end = n, time.perf_counter()
            ends = []   # the queued chunks' (steps, end time), oldest first
            self.stats["runs"] += 1

            def push() -> None:   # queue the next chunk: it ends m x dt after the later of now and the last one's end
                nonlocal left, end
                m = min(chunk, left)
                left -= m
                self.stats["run_steps"] += m
                self.stats["run_dev_s"] += m * dt
                t = max(end, time.perf_counter())
                end = t + m * dt
                self.busy.append((t, end, f"chunk k={k} m={m}"))
                ends.append((m, end))

            push()
            while ends:
                m, t = ends.pop(0)
                _wait_until(t, self.hold_gil)   # the read-back of the oldest chunk
                while left and len(ends) < self.ahead and (more is None or more()):
                    push()
                for _ in range(m):
                    for s in seqs:
                        s.n += 1
                    yield [self.token] * k

    return NullRunner


def serve(port: int, model: str, scale: float, hold_gil: bool, budget: int, ahead: int) -> None:
    """The server process: memra serve's State and Server over the null engine."""
    import memra.serve.api as API
    from memra.model.config import read_config
    from memra.model.gguf import open_gguf
    from memra.text.tokenizer import Tokenizer

    cls = null_runner_class()
    tok = Tokenizer.from_gguf(open_gguf(model))
    cls.token = tok.encode(" time")[-1]   # a whole word: its text is sent as it comes
    cls.scale, cls.hold_gil, cls.ahead = scale, hold_gil, ahead

    def open_engine(gguf, cfg, device, *, ctx, parallel, kv_memory=None, cache_type_k="f16", cache_type_v="f16"):
        return cls(gguf, cfg or read_config(gguf), max_len=ctx, max_seqs=parallel, kv_memory=kv_memory)

    API.open_engine = open_engine
    import atexit

    def report():
        print("null engine:", json.dumps({k: round(v, 3) for k, v in cls.stats.items()}), file=sys.stderr)
        b = sorted(cls.busy)
        gaps = [(b[i + 1][0] - b[i][1], b[i][2], b[i + 1][2]) for i in range(len(b) - 1)]
        big = [g for g in gaps if g[0] > 1e-3]
        span = b[-1][1] - b[0][0] if b else 0
        print(f"device span {span:.3f} s, busy {sum(e - s for s, e, _ in b):.3f} s, gaps > 1 ms: {len(big)} "
              f"summing {sum(g[0] for g in big):.3f} s", file=sys.stderr)
        kinds = {}
        for g, a, c in big:
            key = (a.split()[0], c.split()[0])
            n, tot = kinds.get(key, (0, 0.0))
            kinds[key] = (n + 1, tot + g)
        for key, (n, tot) in sorted(kinds.items(), key=lambda x: -x[1][1]):
            print(f"  after {key[0]:5} before {key[1]:5}: {n:4} gaps, {tot * 1e3:8.1f} ms", file=sys.stderr)
        for g, a, c in sorted(big, reverse=True)[:12]:
            print(f"  {g * 1e3:7.1f} ms  after {a:24} before {c}", file=sys.stderr)
        sys.stderr.flush()

    atexit.register(report)
    cfg = API.ServeConfig(model=model, port=port, device="cpu", parallel=64, ctx_size=292, max_queue=4096,
                          max_batched_tokens=budget)
    API.Server(cfg).run()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", default="64,8,1")
    ap.add_argument("--step-scale", type=float, default=1.0, help="the emulated device times x this")
    ap.add_argument("--hold-gil", action="store_true", help="the emulated device waits keep the GIL (spin)")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--ahead", type=int, default=1, help="chunks the emulated decode_run queues ahead")
    ap.add_argument("--out", default=None)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve is not None:
        serve(a.serve, a.model, a.step_scale, a.hold_gil, a.budget, a.ahead)
        return
    from memra.model.synth import synth
    from memra.serve.bench import free_port, run_bench

    tmp = Path(tempfile.mkdtemp())
    tokz = ROOT / ".synthtok" / "smollm2-utf8-tokenizer.gguf"
    model = synth(tmp / "null.gguf", "llama", "tiny", "Q4_0", 0, str(tokz) if tokz.exists() else "smollm2-135m")
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--model", str(model), "--step-scale", str(a.step_scale),
           "--budget", str(a.budget), "--ahead", str(a.ahead)] + (["--hold-gil"] if a.hold_gil else [])
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        import httpx

        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/readyz", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        out = Path(a.out) if a.out else tmp / "host.jsonl"
        rows = run_bench(url, vs=None, concurrency=[int(c) for c in a.c.split(",")], requests=a.requests,
                         prompt_tokens=100, max_tokens=128, out=out,
                         tag=f"null engine step x{a.step_scale} budget {a.budget}{' hold-gil' if a.hold_gil else ''}")
        for r in rows:
            c = r["concurrency"]
            print(json.dumps({"c": c, "tok_s": r["agg_tok_s"], "tpot_p50_ms": round(1e3 * r["tpot_p50_s"], 2),
                              "emulated_step_ms": round(1e3 * step_s(c, a.step_scale), 2),
                              "ttft_p50_ms": round(1e3 * r["ttft_p50_s"], 1),
                              "ttft_p95_ms": round(1e3 * r["ttft_p95_s"], 1)}))
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
