"""`memra bench`: llama-bench's cells on the GPU engine, one JSON receipt per cell.

Cell semantics are llama-bench's: `pp N` = prompt tokens per second of one prefill of N
tokens, `tg N` = generated tokens per second of N greedy decode steps (graph replays, the
engine's fast path: no host work between steps, the tokens read back once at the end; the
graphs decode_run takes, a chunk of 16 steps each: time_decode),
depth D = tokens already in the KV cache when the cell is timed (filled untimed). Each
cell runs once untimed (compiles, captures the graphs), then `reps` timed repetitions,
wall clock from the first launch to the device being idle, as llama-bench times.

Every tg figure comes with the bandwidth it implies: tok/s x bytes read per token
(`GPUEngine.bytes_per_token`, averaged over the cell's depths) as GB/s and as % of the
device's measured copy bandwidth. The argmax gate runs before any cell; its verdict
travels in every receipt, and a MISMATCH voids the figures (the CLI exits non-zero).

Models: a GGUF path, an alias, or `synth:SHAPE:QUANT` (e.g. `synth:llama3-8b:Q4_K_M`):
a synthetic GGUF made by memra.model.synth once and kept in $MEMRA_HOME/synth/.

`--vs llama.cpp` runs llama-bench (-ngl 99 -fa 1, the same cell and repetitions) on the
same file after each memra cell (A, B, A, B, ...) and writes its arm as receipts too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from memra.errors import MemraError
from memra.paths import receipts_dir, synth_dir

log = logging.getLogger("memra.bench")

SCHEMA = 1
SYNTH_PREFIX = "synth:"
GATE_PROMPT = "The capital of France is Paris. The capital of Germany is"
LLAMA_FLAGS = ("-ngl", "99", "-fa", "1")


class BenchError(MemraError):
    """A bench request that cannot run (bad cells, model spelling, llama-bench failure)."""


# -- cells and statistics --------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    n_parallel: int = 1  # tg cells: sequences decoded together (each n_gen tokens)

    @property
    def test(self) -> str:
        """llama-bench's name of the cell: 'pp512', 'tg128 @ d4096'; 'tg128 np64' for 64
        sequences decoded together."""
        s = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        s += f" np{self.n_parallel}" if self.n_parallel > 1 else ""
        return s + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def n_tokens(self) -> int:
        """Positions one sequence of the cell takes after its depth."""
        return self.n_prompt + self.n_gen

    @property
    def tokens_timed(self) -> int:
        """Tokens one timed run produces (all sequences)."""
        return (self.n_prompt + self.n_gen) * self.n_parallel


def parse_counts(values: str | Iterable[str] | None, flag: str, default: Sequence[int]) -> list[int]:
    """llama-bench's list arguments: '512,1024' or the flag repeated; each a count >= 0."""
    if values is None:
        return list(default)
    if isinstance(values, str):
        values = [values]
    out = []
    for item in values:
        for v in str(item).split(","):
            v = v.strip()
            if not v:
                continue
            try:
                k = int(v)
            except ValueError:
                raise BenchError(f"{flag} takes token counts (e.g. 512 or 512,1024), got {v!r}") from None
            if k < 0:
                raise BenchError(f"{flag} takes counts >= 0, got {k}")
            out.append(k)
    if not out:
        raise BenchError(f"{flag} is empty")
    return list(dict.fromkeys(out))  # repeated values measure once


def make_cells(prompts: Sequence[int], gens: Sequence[int], depths: Sequence[int],
               parallel: Sequence[int] = (1,)) -> list[Cell]:
    """Per depth: the pp cells, then the tg cells (0 skips that kind, as in llama-bench),
    each at every count of parallel sequences."""
    cells = [Cell(p, 0, d) for d in depths for p in prompts if p > 0]
    cells += [Cell(0, n, d, b) for d in depths for n in gens if n > 0 for b in parallel]
    if not cells:
        raise BenchError("nothing to measure: every -p and -n value is 0")
    return sorted(cells, key=lambda c: (c.n_depth, c.n_gen > 0))


def stats(samples_ts: Sequence[float]) -> dict:
    """llama-bench's figures of a cell: mean (avg_ts), the sample standard deviation
    (n - 1; 0 for a single sample) and the samples; plus the median."""
    x = [float(v) for v in samples_ts]
    if not x:
        raise BenchError("a cell without samples")
    n = len(x)
    mean = sum(x) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1)) if n > 1 else 0.0
    return {"avg_ts": mean, "median_ts": float(np.median(x)), "stddev_ts": sd, "samples_ts": x}


# -- models ---------------------------------------------------------------------------------

def synth_model(shape: str, quant: str, tokenizer_from: str = "smollm2-135m") -> Path:
    """The synthetic GGUF of a shape and quant mix, written once into $MEMRA_HOME/synth/
    (atomically: an interrupted write leaves no file that looks complete)."""
    from memra.model.synth import QUANTS, resolve_shape, synth

    if shape == "tiny":  # the file is named by shape: say which tiny one
        raise BenchError("synth:tiny names no architecture: say synth:tiny-llama:…, tiny-qwen2, "
                         "tiny-qwen3 or tiny-gemma3")
    resolve_shape(shape, None)  # raises for an unknown shape
    if quant not in QUANTS:
        raise BenchError(f"unknown quant mix {quant!r} (known: {', '.join(QUANTS)})")
    tok = Path(str(tokenizer_from)).name.removesuffix(".gguf")
    folder = synth_dir()
    path = folder / f"{shape}-{quant}-{tok}.gguf"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.tmp{os.getpid()}"
    t0 = time.perf_counter()
    try:
        synth(tmp, None, shape, quant, seed=0, tokenizer_from=tokenizer_from)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("synthetic %s %s written to %s in %.1f s", shape, quant, path, time.perf_counter() - t0)
    return path


def resolve_model(spec: str, tokenizer_from: str = "smollm2-135m") -> tuple[str, Path]:
    """(the name receipts carry, the GGUF path) of a path, an alias or synth:SHAPE:QUANT."""
    from memra.model.aliases import ALIASES, resolve

    if spec.startswith(SYNTH_PREFIX):
        parts = spec[len(SYNTH_PREFIX):].split(":")
        if len(parts) != 2 or not all(parts):
            raise BenchError(f"{spec!r}: a synthetic model is spelled synth:SHAPE:QUANT "
                             f"(e.g. synth:llama3-8b:Q4_K_M)")
        shape, quant = parts
        return f"synthetic {shape} {quant}", synth_model(shape, quant, tokenizer_from)
    path = resolve(spec)
    return (spec if spec in ALIASES else path.name), path


def model_facts(g) -> dict:
    """Size (all tensor bytes, as llama-bench's model_size), parameters and the quant mix
    (each tensor type's share of the bytes) of an open GGUF."""
    by = Counter()
    for t in g.tensors.values():
        by[t.type_name] += t.n_bytes
    total = sum(by.values())
    mix = " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in by.most_common() if 200 * v >= total)
    return {"model_size": int(total), "model_params": int(sum(t.n_elements for t in g.tensors.values())),
            "quant_mix": mix}


# -- measuring ------------------------------------------------------------------------------

def fill(engine, tokens: Sequence[int]) -> None:
    """Reset the cache and prefill `tokens` (untimed): the depth of the cells that follow."""
    engine.reset()
    if len(tokens):
        engine.prefill(tokens)


def time_prefill(engine, depth: int, tokens: Sequence[int]) -> int:
    """Nanoseconds of one prefill of `tokens` after the first `depth` cached tokens."""
    engine.rewind(engine.seqs[0], depth)  # positions past `depth` are rewritten
    engine.g.sync()
    t0 = time.perf_counter_ns()
    engine.prefill(tokens)  # returns the last logits: the device is idle after it
    return time.perf_counter_ns() - t0


def time_decode(engine, depth: int, first: int, n: int, rows: int = 1) -> tuple[int, list[int]]:
    """Nanoseconds of n greedy decode steps of `rows` sequences replayed from the runner's
    captured graphs, each sequence starting with token `first` at position `depth`, and the n
    tokens the first sequence chose. Each replay forwards one token per sequence and writes
    the argmax as the next, on the device (memra.gpu.runner.Runner.decode_prepare). The steps
    run in decode_run's chunks, each on its own graph (its deepest step's split count, its rows'
    attention kind: Runner.decode_chunks), every graph captured before the clock starts: the
    steps `memra run` and `memra serve` take."""
    from memra.gpu.runner import DECODE_CHUNK, Sampling

    e = engine
    seqs = e.seqs[:rows]
    for s in seqs:
        e.rewind(s, depth)
    sampling = [Sampling(0.0)] * rows
    chunks = e.decode_chunks(depth, depth, n, DECODE_CHUNK)
    e.decode_prepare(seqs, [first] * rows, n, sampling, hist=n, last=chunks[0][0] - 1)
    runs = [r for c in chunks for r in e.chunk_launches(rows, sampling, c)]
    e.g.sync()
    t0 = time.perf_counter_ns()
    for gr, m in runs:
        for _ in range(m):
            gr.launch()
    e.g.sync()
    ns = time.perf_counter_ns() - t0
    for s in seqs:
        s.n = depth + n
    return ns, [int(t) for t in e.r_hist.numpy()[0, :n]]


@dataclass
class Measured:
    cell: Cell
    samples_ns: list[int]
    bytes_per_token: float | None  # tg cells: mean over the cell's steps

    @property
    def samples_ts(self) -> list[float]:
        return [self.cell.tokens_timed * 1e9 / ns for ns in self.samples_ns]


def measure(engine, cells: Sequence[Cell], reps: int, seed: int = 0) -> Iterator[Measured]:
    """Each cell: one untimed warm-up, then `reps` timed runs. The cache is filled once per
    depth with random ids (speed does not depend on them) and rewound before every run."""
    if reps < 1:
        raise BenchError(f"-r must be at least 1, got {reps}")
    rng = np.random.default_rng(seed)
    n_vocab = engine.cfg.n_vocab
    depth = None
    for cell in cells:
        if cell.n_depth != depth:
            depth = cell.n_depth
            fill(engine, rng.integers(0, n_vocab, depth).tolist())
        samples = []
        if cell.n_prompt:
            toks = rng.integers(0, n_vocab, cell.n_prompt).tolist()
            for i in range(reps + 1):
                ns = time_prefill(engine, depth, toks)
                if i:
                    samples.append(ns)
            bpt = None
        else:
            first = int(rng.integers(0, n_vocab))
            for i in range(reps + 1):
                ns, _ = time_decode(engine, depth, first, cell.n_gen, rows=cell.n_parallel)
                if i:
                    samples.append(ns)
            # bytes per token produced: a step reads the weights once and every row's K/V
            B = cell.n_parallel
            bpt = sum(engine.bytes_per_step(depth + k, B) for k in range(cell.n_gen)) / cell.n_gen / B
        yield Measured(cell, samples, bpt)


# -- receipts -------------------------------------------------------------------------------

def common_fields(name: str, path: Path, engine, table_label: str, tag: str | None) -> dict:
    """The fields every receipt of one run shares: what ran, where, on which code."""
    from memra.tune.receipts import git_sha

    return {"model": name, "model_file": Path(path).name, **model_facts(engine.gguf),
            **device_facts(engine.g), "git_sha": git_sha(), "table": table_label,
            "matvec_path": engine.path, "pdl": bool(engine.pdl), "tag": tag, "seams": seams()}


# the rollback seams of docs/FLAGS.md: a run with one of them set is not the default engine
SEAMS = {"MEMRA_MATVEC_PATH": "q8", "MEMRA_PDL": "1", "MEMRA_FUSED_ROPE": "1", "MEMRA_GEMM": "1", "MEMRA_MVT": "1",
         "MEMRA_TILE": "1", "MEMRA_FA_GRID": "trim",
         "MEMRA_ATT_GROUP_ROWS": "16", "MEMRA_MASK_OVERLAP": "1", "MEMRA_FORCED": "1",
         "MEMRA_PREFILL_GRAPH": "1", "MEMRA_PREFILL_CHUNK": "512", "MEMRA_PREFILL_SPLITS": "auto",
         "MEMRA_DECODE_AHEAD": "1", "MEMRA_ATT_RING": "2", "MEMRA_ATT_EARLY": "1", "MEMRA_ATT_TC": "1",
         "MEMRA_PROMPT_GEMM": "f16", "MEMRA_QF_Q6K": "1"}


# runtime parameters that choose another engine path than the default (docs/FLAGS.md)
ENGINE_PATHS = {"MEMRA_ATTN": "hybrid", "MEMRA_ATT_SPLITS": "", "MEMRA_ATT_DEPTH": "",   # "": any value set counts
                "MEMRA_FA_SPLIT": "", "MEMRA_TILE_MIN": "", "MEMRA_FA_WARPS": "",
                "MEMRA_SMEM_CARVEOUT": "", "MEMRA_ATT_SWITCH": "", "MEMRA_ATT_SWITCH0": "", "MEMRA_GRAPH_STEPS": "1",
                "MEMRA_DECODE": "q8", "MEMRA_QF_HEAD": "0"}


def seams() -> dict:
    """The rollback seams (and engine-path parameters) this run moved off their defaults ({}
    on the default paths); `memra research board` leaves such runs off the boards."""
    return {k: os.environ[k] for k, default in {**SEAMS, **ENGINE_PATHS}.items()
            if os.environ.get(k) and os.environ[k].strip().lower() != default}


def device_facts(g) -> dict:
    from memra.gpu.compile import nvrtc_version
    from memra.tune.receipts import normalize_cc

    i = g.info
    dv = int(getattr(i, "driver_version", 0) or 0)
    return {"device": i.name, "cc": normalize_cc(i.cc), "sms": int(i.sm_count),
            "driver": f"{dv // 1000}.{dv % 1000 // 10}" if dv else None,
            "nvrtc": "%d.%d" % nvrtc_version()}


def receipt(common: dict, engine_name: str, cell: Cell, samples_ts: Sequence[float],
            bytes_per_token: float | None, bw_bytes_s: float, gate: str | None) -> dict:
    """One cell's JSON line. `common`: the run's fields (model, device, git_sha, table, ...)."""
    from memra.tune.receipts import utc_now

    s = stats(samples_ts)
    gbps = pct = None
    if bytes_per_token is not None:
        gbps = s["median_ts"] * bytes_per_token / 1e9
        pct = 100.0 * gbps * 1e9 / bw_bytes_s
    return {
        "kind": "bench", "schema": SCHEMA, "engine": engine_name, **common,
        "test": cell.test, "n_prompt": cell.n_prompt, "n_gen": cell.n_gen, "n_depth": cell.n_depth,
        "n_parallel": cell.n_parallel,
        "avg_ts": round(s["avg_ts"], 3), "median_ts": round(s["median_ts"], 3),
        "stddev_ts": round(s["stddev_ts"], 3), "samples_ts": [round(v, 3) for v in s["samples_ts"]],
        "bytes_per_token": None if bytes_per_token is None else int(round(bytes_per_token)),
        "gbps": None if gbps is None else round(gbps, 1), "pct_bw": None if pct is None else round(pct, 1),
        "bw_gbps": round(bw_bytes_s / 1e9, 1), "gate": gate, "date": utc_now(),
    }


def default_out(device_name: str) -> Path:
    """$MEMRA_HOME/receipts/bench-<device>-<date>.jsonl: never the source tree unless --out names it."""
    from memra.tune.tables import device_slug

    return receipts_dir() / f"bench-{device_slug(device_name)}-{date.today().isoformat()}.jsonl"


def append(path: Path, row: dict) -> None:
    """Append one receipt line, flushed to disk (an interrupted run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- llama.cpp's arm ------------------------------------------------------------------------

def llama_bench_cmd(exe: str | os.PathLike, gguf: str | os.PathLike, cell: Cell, reps: int) -> list[str]:
    return [str(exe), "-m", str(gguf), *LLAMA_FLAGS, "-p", str(cell.n_prompt), "-n", str(cell.n_gen),
            "-d", str(cell.n_depth), "-r", str(reps), "-o", "jsonl"]


def parse_llama_bench(stdout: str, cell: Cell) -> dict:
    """The JSON line llama-bench (-o jsonl) wrote for this cell."""
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if (d.get("n_prompt"), d.get("n_gen"), d.get("n_depth", 0)) == (cell.n_prompt, cell.n_gen, cell.n_depth):
            if not d.get("samples_ts"):
                raise BenchError(f"llama-bench's line for {cell.test} has no samples_ts")
            return d
    raise BenchError(f"llama-bench printed no JSON line for {cell.test}")


def run_llama_bench(exe, gguf, cell: Cell, reps: int, timeout: float = 1800) -> dict:
    cmd = llama_bench_cmd(exe, gguf, cell, reps)
    log.info("running %s", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        raise BenchError(f"cannot run llama-bench {exe}: {e}") from e
    except subprocess.TimeoutExpired:
        raise BenchError(f"llama-bench took over {timeout:.0f} s on {cell.test}") from None
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError(f"llama-bench failed on {cell.test} (exit {p.returncode}): {tail}")
    return parse_llama_bench(p.stdout, cell)


# -- the whole run ----------------------------------------------------------------------------

def run(engine, *, common: dict, cells: Sequence[Cell], reps: int, bw_bytes_s: float, gate: str,
        out: Path, gguf: Path | None = None, llama_bench: str | None = None, seed: int = 0,
        on_receipt: Callable[[dict], None] = lambda r: None) -> list[dict]:
    """Measure every cell (and, with llama_bench, its llama.cpp twin right after), append
    each receipt to `out` as it comes, and hand it to on_receipt. Returns the receipts."""
    rows = []
    for m in measure(engine, cells, reps, seed):
        arms = [receipt(common, "memra", m.cell, m.samples_ts, m.bytes_per_token, bw_bytes_s, gate)]
        if llama_bench:
            d = run_llama_bench(llama_bench, gguf, m.cell, reps)
            lc = receipt(common, "llama.cpp", m.cell, d["samples_ts"], m.bytes_per_token, bw_bytes_s, None)
            lc.update(table=None, matvec_path=None, pdl=None, flags=" ".join(LLAMA_FLAGS),
                      llama_build=f"{d.get('build_commit', '?')} ({d.get('build_number', '?')})")
            arms.append(lc)
        for r in arms:
            append(out, r)
            on_receipt(r)
            rows.append(r)
    return rows
