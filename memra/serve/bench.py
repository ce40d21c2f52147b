"""`memra bench serve`: a bounded load generator for OpenAI-compatible servers on this machine.

    rows = run_bench("http://127.0.0.1:8080", vs="http://127.0.0.1:8081", concurrency=[1, 8, 64],
                     prompt_tokens=100, max_tokens=128, out="serve.jsonl")

For each concurrency C (and each of --rounds, the servers interleaved A/B/A/B), C workers
send streamed /v1/completions requests (greedy, ignore_eos, max_tokens, each request its own
prompt of about --prompt-tokens tokens, measured with the server's own /tokenize) until
--requests are done. Per request: TTFT (send to the first streamed token), the gaps between
streamed chunks (ITL, pooled over every request), the latency and the output tokens (the
usage chunk's count, else one per chunk); TPOT = (latency - TTFT) / (output tokens - 1), as
`vllm bench serve` defines them; a request whose stream carries an error event or ends
without `data: [DONE]` failed (its tokens are not counted). Per cell: output tok/s and requests/s over the wall time,
p50/p95/p99 of TTFT, TPOT and ITL, one receipt (kind "serve-bench", memra.tune.receipts)
per server.

Only loopback addresses are driven: a load generator is no tool against other machines.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from memra.errors import MemraError
from memra.serve.auth import is_loopback
from memra.tune.receipts import check_line, git_sha, utc_now

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river garden window music engine forest letter market "
         "mountain island winter summer ocean silver paper stone bridge castle village doctor teacher planet "
         "signal pattern orange yellow purple history science theory answer question morning evening").split()


def check_url(url: str) -> str:
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise MemraError(f"{url!r} is not an http URL such as http://127.0.0.1:8080")
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(u.hostname, u.port or 80)}
    except OSError as e:
        raise MemraError(f"{url}: {e}") from None
    if not addrs or not all(is_loopback(a) for a in addrs):
        raise MemraError(f"{url}: memra bench serve drives loopback servers only (127.0.0.1, ::1, localhost)")
    return url.rstrip("/")


def append(path: Path, row: dict) -> None:
    """One receipt line, checked against its kind (memra.tune.receipts.KINDS["serve-bench"])."""
    _, problems = check_line(row)
    if problems:
        raise MemraError(f"serve-bench receipt for {path}: {'; '.join(problems)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n")


def cell_requests(concurrency: int) -> int:
    """Requests a cell sends by default: two waves of its concurrency, at least 16 (a c = 1 cell of 4 requests,
    the default before session 58, moved with a single slow request: one 1.0 s TTFT of llama-server's
    took its c = 1 rate from ~200 to 146.5 t/s)."""
    return max(2 * concurrency, 16)


def _pct(xs, q) -> float | None:
    return float(np.percentile(np.asarray(xs, np.float64), q)) if len(xs) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(concurrency: int, timeout: float):
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), trust_env=False,
                             limits=httpx.Limits(max_connections=concurrency + 8,
                                                 max_keepalive_connections=concurrency + 8))


async def _describe(url: str) -> dict:
    """engine (memra, llama-server or openai-compatible), model id, device."""
    import httpx

    try:
        return await _describe_at(url)
    except httpx.TransportError as e:  # nothing listening (connection refused), a timeout, a broken stream
        raise MemraError(f"{url}: no server answered ({type(e).__name__}: {e})") from None


async def _describe_at(url: str) -> dict:
    async with _client(1, 30) as c:
        model, engine, device = None, "openai-compatible", None
        r = await c.get(url + "/v1/models")
        if r.status_code == 200 and r.json().get("data"):
            model = r.json()["data"][0]["id"]
        h = await c.get(url + "/health")
        if h.status_code == 200 and isinstance(h.json(), dict) and "phase" in h.json():
            engine, device = "memra", h.json().get("device")
        else:
            p = await c.get(url + "/props")
            if p.status_code == 200:
                engine = "llama-server"
        return {"engine": engine, "model": model, "device": device}


async def _prompts(url: str, n: int, prompt_tokens: int, seed: int = 0) -> list[tuple[str, int]]:
    """n distinct texts of about prompt_tokens tokens each (the server's /tokenize counts)."""
    rng = random.Random(seed)
    out = []
    async with _client(1, 60) as c:
        async def count(text: str) -> int:
            r = await c.post(url + "/tokenize", json={"content": text})
            if r.status_code != 200:
                raise MemraError(f"{url}/tokenize answered {r.status_code}: {r.text[:200]}")
            return len(r.json()["tokens"])

        for i in range(n):
            words = [f"Request {i}:"] + [rng.choice(WORDS) for _ in range(prompt_tokens * 2)]
            lo, hi = 1, len(words)
            while lo < hi:  # the most words whose tokens fit
                mid = (lo + hi + 1) // 2
                if await count(" ".join(words[:mid])) <= prompt_tokens - 1:  # the server adds BOS
                    lo = mid
                else:
                    hi = mid - 1
            text = " ".join(words[:lo])
            out.append((text, await count(text) + 1))
    return out


async def _one(c, url: str, model: str | None, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    times, usage, err, done = [], None, None, False
    try:
        async with c.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                doc = json.loads(data)
                if doc.get("error"):  # a server that fails mid-stream sends its error as an event
                    e = doc["error"]
                    err = "stream error: " + str(e.get("message", e) if isinstance(e, dict) else e)[:200]
                    break
                if doc.get("usage"):
                    usage = doc["usage"]
                ch = doc.get("choices") or []
                if ch and ch[0].get("text"):
                    times.append(time.perf_counter())
    except Exception as e:  # the cell records it; the run goes on
        err = f"{type(e).__name__}: {e}"
    if not err and not done:
        err = "stream ended before data: [DONE]"
    if err or not times:
        return {"ok": False, "error": err or "no token streamed"}
    n_out = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else len(times)
    lat = times[-1] - t0
    ttft = times[0] - t0
    return {"ok": True, "ttft": ttft, "lat": lat, "n_out": n_out, "itl": list(np.diff(times)),
            "tpot": (lat - ttft) / (n_out - 1) if n_out > 1 else None}


async def run_cell(url: str, model: str | None, prompts: list[tuple[str, int]], concurrency: int,
                   max_tokens: int, timeout: float) -> dict:
    todo = list(range(len(prompts)))
    results: list[dict] = []

    async def worker(c):
        while todo:
            i = todo.pop(0)
            res = await _one(c, url, model, prompts[i][0], max_tokens)
            res["n_prompt"] = prompts[i][1]
            results.append(res)

    async with _client(concurrency, timeout) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    itl = [g for r in ok for g in r["itl"]]
    lat = [r["lat"] for r in ok]
    n_out = sum(r["n_out"] for r in ok)
    row = {"concurrency": concurrency, "requests": len(prompts), "completed": len(ok),
           "failed": len(results) - len(ok), "errors": sorted({r["error"] for r in results if not r["ok"]})[:3],
           "prompt_tokens": round(float(np.mean([p[1] for p in prompts])), 1), "max_tokens": max_tokens,
           "output_tokens": n_out, "wall_s": round(wall, 4),
           "agg_tok_s": round(n_out / wall, 2) if wall > 0 else 0.0,
           "req_s": round(len(ok) / wall, 3) if wall > 0 else 0.0}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("lat", lat)):
        for q in (50, 95, 99):
            v = _pct(xs, q)
            row[f"{name}_p{q}_s"] = None if v is None else round(v, 5)
        row[f"{name}_mean_s"] = None if not xs else round(float(np.mean(xs)), 5)
    return row


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    import httpx

    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            raise MemraError(f"memra serve exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/readyz", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise MemraError(f"{url} was not ready within {timeout:.0f} s")


def _sigterm_raises():
    """Make SIGTERM (`timeout`, `kill`) raise SystemExit in the main thread while a server started
    here runs, so the `finally` that stops it runs too (Python's default action ends the process at
    once, which left that `memra serve` running); returns the handler to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, _exit)


def start_server(path: str, alias: str, device: str, parallel: int, ctx: int, log=print,
                 cache_type_k: str = "f16", cache_type_v: str = "f16") -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "-m", "memra", "serve", str(path), "--alias", alias, "--device", device, "--port",
           str(port), "--parallel", str(parallel), "--ctx-size", str(ctx), "--max-queue", "4096",
           "--cache-type-k", cache_type_k, "--cache-type-v", cache_type_v]
    log("starting: " + " ".join(cmd))
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, 1800)
    except BaseException:
        proc.kill()
        raise
    return url, proc


def run_bench(target: str | None, *, vs: str | None, concurrency: list[int], requests: int | None,
              prompt_tokens: int, max_tokens: int, rounds: int = 1, device: str = "gpu", out=None,
              tag: str | None = None, model_path: str | None = None, timeout: float = 600.0,
              log=print, cache_type_k: str = "f16", cache_type_v: str = "f16", **_) -> list[dict]:
    """Every cell on memra (a URL, or `model_path` served here for the run, with KV cache types
    cache_type_k / cache_type_v, which its receipts record) and on `vs`."""
    from memra.paths import receipts_dir

    # everything that can be checked is, before a server is started or a cell is run
    vs_url = check_url(vs) if vs else None
    out = Path(out) if out else receipts_dir() / f"serve-bench-{time.strftime('%Y-%m-%d')}.jsonl"
    if out.is_dir():
        raise MemraError(f"--out {out} is a folder: give the receipts file (appended)")
    if out.parent.exists() and not out.parent.is_dir():
        raise MemraError(f"--out {out}: {out.parent} is not a folder")
    proc = restore = None
    if target and urlparse(target).scheme in ("http", "https"):
        url = check_url(target)
    else:
        if model_path is None:
            raise MemraError("give a loopback URL or a model")
        restore = _sigterm_raises()
        url, proc = start_server(model_path, target or "smollm2-135m", device, max(concurrency),
                                 prompt_tokens + max_tokens + 64, log, cache_type_k, cache_type_v)
    # the cache types of the server started here (another's are not known)
    served = {"cache_type_k": cache_type_k, "cache_type_v": cache_type_v} if proc is not None else {}
    arms = [url] + ([vs_url] if vs_url else [])
    rows: list[dict] = []
    try:
        info = {a: asyncio.run(_describe(a)) for a in arms}
        device_name = next((i["device"] for i in info.values() if i["device"]), None) or "unknown"
        n_max = max(requests or cell_requests(c) for c in concurrency)
        prompts = asyncio.run(_prompts(arms[0], n_max * rounds, prompt_tokens))
        sha = git_sha()
        for c in concurrency:
            n = requests or cell_requests(c)
            for rd in range(rounds):
                ps = prompts[rd * n_max: rd * n_max + n]
                for a in arms:
                    i = info[a]
                    log(f"{i['engine']} {a}: concurrency {c}, {n} requests (round {rd + 1}/{rounds})")
                    row = asyncio.run(run_cell(a, i["model"], ps, c, max_tokens, timeout))
                    row = {"schema": 1, "kind": "serve-bench", "ts": utc_now(), "date": time.strftime("%Y-%m-%d"),
                           "git_sha": sha, "engine": i["engine"], "url": a, "model": i["model"] or "?",
                           "device": device_name, "round": rd, "tag": tag, **(served if a == url else {}), **row}
                    append(out, row)
                    rows.append(row)
                    log(f"  {row['agg_tok_s']:.1f} tok/s, {row['req_s']:.2f} req/s, TTFT p50 "
                        f"{row['ttft_p50_s']} s p95 {row['ttft_p95_s']} s, TPOT p50 {row['tpot_p50_s']} s, "
                        f"failed {row['failed']}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
    log(f"{len(rows)} receipts appended to {out}")
    return rows


def print_table(rows: list[dict], console) -> None:
    from rich.table import Table

    t = Table("engine", "c", "req", "fail", "tok/s", "req/s", "TTFT p50", "p95", "p99", "TPOT p50", "p95",
              "ITL p50", "p95", "p99", box=None, pad_edge=False)

    def ms(v):
        return "-" if v is None else f"{1000 * v:.1f}"

    for r in rows:
        t.add_row(r["engine"], str(r["concurrency"]), str(r["requests"]), str(r["failed"]), f"{r['agg_tok_s']:.1f}",
                  f"{r['req_s']:.2f}", ms(r["ttft_p50_s"]), ms(r["ttft_p95_s"]), ms(r["ttft_p99_s"]),
                  ms(r["tpot_p50_s"]), ms(r["tpot_p95_s"]), ms(r["itl_p50_s"]), ms(r["itl_p95_s"]),
                  ms(r["itl_p99_s"]))
    console.print(t)
    console.print("times in ms; tok/s: output tokens over the cell's wall time")
