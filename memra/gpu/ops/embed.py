"""Token embedding rows gathered from a quantized table (kernels/embed.cu).

`embed(g, table, ggml_type, tok, out, scale)` writes out[t] = dequant(table[tok[t]]) * scale.
The reference is memra.model.quants.dequantize_rows (itself checked against gguf.quants), and the
kernel evaluates ggml's float expressions without FMA contraction, so the check is exact.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.model import quants as Q
from memra.errors import MemraError, UnsupportedModelError
from memra.model.gguf import block_info, type_name

KERNEL_FILE = "embed.cu"
THREADS = 256

KERNELS = {
    Q.F32: "embed_f32", Q.F16: "embed_f16", Q.BF16: "embed_bf16",
    Q.Q4_0: "embed_q4_0", Q.Q4_1: "embed_q4_1", Q.Q5_0: "embed_q5_0", Q.Q5_1: "embed_q5_1",
    Q.Q8_0: "embed_q8_0", Q.Q4_K: "embed_q4_k", Q.Q5_K: "embed_q5_k", Q.Q6_K: "embed_q6_k",
    Q.IQ4_XS: "embed_iq4_xs",
}


def kernel_name(ggml_type: int) -> str:
    try:
        return KERNELS[ggml_type]
    except KeyError:
        raise UnsupportedModelError(
            f"token embeddings of type {type_name(ggml_type)} are not supported on the GPU "
            f"(supported: {', '.join(type_name(t) for t in KERNELS)})") from None


def row_bytes(ggml_type: int, n_embd: int) -> int:
    bs, ts = block_info(ggml_type)
    if n_embd % bs:
        raise MemraError(f"{type_name(ggml_type)} row of {n_embd} is not a multiple of the block size {bs}")
    return n_embd // bs * ts


def embed(g, table, ggml_type: int, n_vocab: int, n_embd: int, tok, out, scale: float = 1.0,
          n_tokens: int | None = None, pdl: bool = False, canary: bool = False,
          config: dict | None = None) -> None:
    """out[t, :] = dequant(table row tok[t]) * scale for t < n_tokens (default: len(tok)).
    config: {"EMBED_THREADS": n} (a tuning table's choice; default THREADS)."""
    n = tok.size if n_tokens is None else n_tokens
    if tok.dtype != np.int32 or out.dtype != np.float32 or table.dtype != np.uint8:
        raise MemraError("embed: tok must be int32, out float32, table uint8")
    if out.size < n * n_embd or table.nbytes < n_vocab * row_bytes(ggml_type, n_embd):
        raise MemraError("embed: output or table too small")
    threads = int((config or {}).get("EMBED_THREADS", THREADS))
    if threads < 32 or threads > 1024 or threads % 32:
        raise MemraError(f"embed: EMBED_THREADS must be a multiple of 32 in 32..1024, got {threads}")
    defines = {"EMBED_THREADS": threads}
    if canary:
        defines["MEMRA_CANARY"] = 1
    k = g.module(KERNEL_FILE, defines).kernel(kernel_name(ggml_type))
    g.launch(k, (n,), (threads,), (table, tok, out, np.int32(n_vocab), np.int32(n_embd),
                                   np.int64(row_bytes(ggml_type, n_embd)), np.float32(scale)), pdl=pdl)


def reference(table: np.ndarray, ggml_type: int, n_embd: int, tok: np.ndarray, scale: float) -> np.ndarray:
    rb = row_bytes(ggml_type, n_embd)
    rows = table.reshape(-1, rb)[np.asarray(tok, np.int64)]
    x = Q.dequantize(rows, ggml_type, (len(tok), n_embd))
    return x * np.float32(scale) if scale != 1.0 else x


# -- kernel-check ------------------------------------------------------------------------

def random_table(rng: np.random.Generator, ggml_type: int, n_rows: int, n_embd: int) -> np.ndarray:
    """Random but valid rows: quantized values random, scales finite and moderate."""
    from memra.model.synth import random_blocks

    try:
        from gguf.constants import GGMLQuantizationType as T

        return random_blocks(T(ggml_type), n_rows * n_embd, 0.5, int(rng.integers(1 << 31)))
    except KeyError:  # a type synth does not make (IQ4_XS): random bytes, then fix the f16 d
        bs, ts = block_info(ggml_type)
        raw = rng.integers(0, 256, n_rows * n_embd // bs * ts, dtype=np.uint8).reshape(-1, ts)
        d = (rng.uniform(0.002, 0.02, raw.shape[0])).astype("<f2").view(np.uint8).reshape(-1, 2)
        raw[:, 0:2] = d
        return raw.reshape(-1)


def compile_variants():
    return [(KERNEL_FILE, {"EMBED_THREADS": THREADS}),
            (KERNEL_FILE, {"EMBED_THREADS": THREADS, "MEMRA_CANARY": 1})]


def _check(g, rng, ggml_type: int, canary: bool = False):
    from memra.gpu.compare import compare

    n_vocab, n_embd, n_tok = 300, 512, 7
    table = random_table(rng, ggml_type, n_vocab, n_embd)
    tok = rng.integers(0, n_vocab, n_tok).astype(np.int32)
    scale = float(rng.uniform(1.0, 30.0))
    d_table, d_tok = g.to_device(table), g.to_device(tok)
    out = g.empty((n_tok, n_embd), np.float32)
    out.poison()
    embed(g, d_table, ggml_type, n_vocab, n_embd, d_tok, out, scale, canary=canary)
    ref = reference(table, ggml_type, n_embd, tok, scale)
    return compare(f"embed {type_name(ggml_type)} n_embd={n_embd} scale={scale:.2f}", out.numpy(), ref, 0,
                   kind="exact")


def checks(g, rng: np.random.Generator) -> Iterator:
    for t in KERNELS:
        yield _check(g, rng, t)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, Q.Q4_K, canary=True)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "embed": the gather of the table's type, the table's EMBED_THREADS."""
    t, n, rows = _type_id(L.shape["type"]), int(L.shape["n"]), int(L.rows)
    b = 1 if rows <= 1 else 2 if rows <= 2 else 4 if rows <= 4 else 8
    threads = int((L.config or {}).get("EMBED_THREADS", THREADS))
    return [{"file": KERNEL_FILE, "entry": kernel_name(t), "defines": {"EMBED_THREADS": threads}, "bucket": b,
             "tag": f"n{n}", "params": {"type": t, "n": n, "rows": b, "config": dict(L.config or {}) or None}}]


def check_launch(g, rng, case):
    """The gather of `rows` random token ids from a 300-row table of the case's type and row
    length (the kernel reads one row a block: the vocabulary size only bounds the ids),
    bit-exact against memra.model.quants."""
    from memra.gpu.compare import compare

    p = case["params"]
    t, n_embd, rows, n_vocab = p["type"], p["n"], p["rows"], 300
    table = random_table(rng, t, n_vocab, n_embd)
    tok = rng.integers(0, n_vocab, rows).astype(np.int32)
    scale = float(rng.uniform(1.0, 30.0))
    out = g.empty((rows, n_embd), np.float32)
    out.poison()
    embed(g, g.to_device(table), t, n_vocab, n_embd, g.to_device(tok), out, scale, config=p["config"])
    return compare(f"embed {type_name(t)} rows={rows} n_embd={n_embd} {case['defines']}", out.numpy(),
                   reference(table, t, n_embd, tok, scale), 0, kind="exact")


# -- tune hook (memra/tune/measure.py): kernel "embed", variant "default", shape {type, n}, batch rows

_TUNE_SETS = 32  # token-id sets; each launch gathers its own random rows of the big table


# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"embed": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"embed tune: unknown kernel/variant {kernel}/{variant}")
    t = _type_id(shape["type"])
    kernel_name(t)  # raises for a type the gather does not read
    return _TuneCase(g, dict(config or {}), t, int(shape["n"]), int(shape.get("batch", 1)), rng, rotate_bytes)


def _type_id(name: str) -> int:
    for t in KERNELS:
        if type_name(t) == str(name).upper():
            return t
    raise UnsupportedModelError(f"embed: unknown type {name!r}")


class _TuneCase:
    """A table larger than `rotate_bytes` (a random block of rows repeated) and `sets` arrays
    of random token ids: each launch gathers rows that are not in L2, like the first layer
    of a decode step."""

    def __init__(self, g, config, t, n_embd, rows, rng, rotate_bytes):
        self.g, self.config, self.t, self.n_embd, self.rows = g, config, t, n_embd, rows
        rb = row_bytes(t, n_embd)
        base = min(4096, max(1, rotate_bytes // rb))
        block = random_table(rng, t, base, n_embd).reshape(base, rb)
        self.n_vocab = base * max(1, -(-rotate_bytes // (base * rb)))
        self.table = np.tile(block, (self.n_vocab // base, 1))
        self.d_table = g.to_device(self.table)
        self.sets = _TUNE_SETS
        self.toks = rng.integers(0, self.n_vocab, (self.sets, rows)).astype(np.int32)
        self.d_toks = g.to_device(self.toks)
        self.out = g.empty((rows, n_embd), np.float32)
        self.scale = float(rng.uniform(1.0, 30.0))
        self.bytes = rows * (rb + 4 * n_embd + 4)
        # a bad EMBED_THREADS raises here (a failed configuration, never timed)
        self._embed(self.d_toks.view(np.int32, (rows,), 0))

    def _embed(self, tok) -> None:
        embed(self.g, self.d_table, self.t, self.n_vocab, self.n_embd, tok, self.out, self.scale,
              config=self.config)

    def launch(self, i: int) -> None:
        self._embed(self.d_toks.view(np.int32, (self.rows,), 4 * self.rows * i))

    def check(self):
        from memra.gpu.compare import compare

        self.out.poison()
        self.launch(0)
        self.g.sync()
        ref = reference(self.table, self.t, self.n_embd, self.toks[0], self.scale)
        o = compare("embed", self.out.numpy(), ref, 0, kind="exact")
        return o.ok, 0.0 if o.ok else float("inf"), o.detail
