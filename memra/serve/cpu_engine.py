"""The CPU engine: the GPU runner's interface (`open`, `close`, `rewind`, `step(rows)`, a
paged KV cache's bookkeeping) over the CPU reference, so `memra serve --device cpu` runs the
whole HTTP and scheduler surface without a GPU (CI, laptops).

    eng = CpuRunner(gguf, max_len=2048, max_seqs=4)
    s = eng.open()
    out = eng.step([Row(s, prompt_ids, sample=Sampling(temperature=0))])   # out[0].token

The model is memra.cpu.reference.ReferenceModel in the "llamacpp" numerics (what `memra run
--device cpu` uses: llama.cpp CPU's roundings, an f16 KV cache). Each sequence computes one
position at a time, whatever the rows' shapes: the reference's batched kernels pick their
summation order by the batch (llama.cpp's repacked and tiled matmuls, its attention tiles),
so one position at a time is what makes a row's logits a function of its own tokens alone —
the GPU runner's batch-invariance contract, which the server's isolation and prefix-cache
guarantees rest on. (On SmolLM2 a batched prompt costs about as much per token on a small
machine anyway.)

Sampling is the device sampler's rule, `memra.gpu.ops.sample.reference_sample` (greedy =
argmax): a token is a function of (logits, seed, position), as on the GPU. A row with a `mask`
(a constrained request) has its disallowed logits set to -inf first, as kernels/mask.cu does.

The KV cache: `HostKV` is memra.gpu.kv.PagedKV's bookkeeping (slots, block tables,
reference counts, copy-on-write, the free queue the prefix cache keeps blocks in) over host
pools in f16 (the llamacpp numerics round K and V to f16, so nothing is lost), or for a q8_0
side (`cache_type_k` / `cache_type_v`, --cache-type-k / -v) its blocks as llama.cpp lays them
out in bytes: int8 codes plus one f16 scale per 32 values, 34 bytes per 32 against f16's 64,
so --kv-memory holds 64/34 = 1.88x the positions (bytes_per_block counts them so). Each slot
also keeps a contiguous working cache for the reference's forward pass; new K/V rows are
written through to the pool blocks, and positions the slot adopted (a prefix-cache hit)
are copied from the pool into the working cache before its next forward.
"""

from __future__ import annotations

import numpy as np

from memra.cpu.llamacpp import q8_0_dequantize
from memra.cpu.reference import KVCache, ReferenceModel, available_memory, kv_cache_bytes
from memra.errors import ContextOverflowError, MemraError
from memra.gpu.kv import PagedKV, bytes_per_block
from memra.gpu.ops.sample import reference_sample
from memra.gpu.runner import KV_BLOCK, LATER, MAX_ROWS, Row, RowOut, Seq
from memra.model.config import read_config
from memra.text.grammar import masked


class HostKV(PagedKV):
    """PagedKV's bookkeeping over host pools: [n_blocks, block, kv_dim] per layer (f16), or
    for a q8_0 side int8 codes [n_blocks, block, kv_dim] with f16 scales [n_blocks, block,
    kv_dim / 32] (k_scale / v_scale; None for an f16 side)."""

    dtype = np.float16

    def __init__(self, *args, cache_type_k: str = "f16", cache_type_v: str = "f16", **kw):
        super().__init__(*args, cache_type_k=cache_type_k, cache_type_v=cache_type_v, **kw)

    def _pools(self, dim: int, cache_type: str):
        c, n = self.cfg, self.alloc.n_blocks
        # np.zeros: pages are committed when first written
        if cache_type == "q8_0":
            return ([np.zeros((n, self.block, dim), np.int8) for _ in range(c.n_layer)],
                    [np.zeros((n, self.block, dim // 32), np.float16) for _ in range(c.n_layer)])
        return [np.zeros((n, self.block, dim), self.dtype) for _ in range(c.n_layer)], None

    def _make_pools(self) -> None:
        self.k, self.k_scale = self._pools(self.cfg.kv_dim, self.cache_type_k)
        self.v, self.v_scale = self._pools(self.cfg.v_dim, self.cache_type_v)
        self.d_table = None

    def _copy_block(self, dst: int, src: int) -> None:
        for pool in (*self.k, *self.v, *(self.k_scale or ()), *(self.v_scale or ())):
            pool[dst] = pool[src]

    def sync(self) -> None:
        self.dirty = False


def pool_blocks(cfg, max_len: int, max_seqs: int, *, kv_tokens: int | None = None, kv_memory: int | None = None,
                kv_block: int = KV_BLOCK, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
    """Blocks of CpuRunner's KV pool: kv_tokens positions, or kv_memory bytes, or every
    sequence at the full context."""
    if kv_tokens is not None:
        return -(-int(kv_tokens) // kv_block)
    if kv_memory is not None:
        return int(kv_memory) // bytes_per_block(cfg, kv_block, cache_type_k, cache_type_v)
    return int(max_seqs) * -(-int(max_len) // kv_block)


def check_memory(cfg, max_len: int, max_seqs: int, n_blocks: int, *, kv_block: int = KV_BLOCK,
                 cache_type_k: str = "f16", cache_type_v: str = "f16",
                 hint: str = "ask for fewer sequences or a smaller context") -> None:
    """ContextOverflowError, before anything is allocated, when the KV pool of n_blocks, the
    slots' block tables and one working cache of a full context (float32, as `memra run`'s
    KVCache checks) exceed the memory this machine has available: numpy's allocation would
    fail later with a bare MemoryError (or the pages would run the machine out of memory)."""
    pool = max(1, n_blocks) * bytes_per_block(cfg, kv_block, cache_type_k, cache_type_v)
    tables = int(max_seqs) * -(-int(max_len) // kv_block) * 4
    work = kv_cache_bytes(cfg, max_len, cache_type_k, cache_type_v)
    need, avail = pool + tables + work, available_memory()
    if avail is not None and need > avail:
        raise ContextOverflowError(
            f"{max_seqs} sequences of {max_len} positions need {need / 2**30:.2f} GiB of KV cache on the CPU "
            f"(a pool of {pool / 2**30:.2f} GiB, K {cache_type_k} / V {cache_type_v}, and a working cache of one "
            f"full context, float32, {work / 2**30:.2f} GiB) and this machine has {avail / 2**30:.2f} GiB "
            f"available: {hint}")


class CpuRunner:
    """max_len: positions per sequence; max_seqs: sequences open at once; the pool holds
    kv_tokens positions, or kv_memory bytes (K and V as cache_type_k / cache_type_v: f16 or
    q8_0), or max_seqs * max_len."""

    device = "cpu"

    def __init__(self, gguf, cfg=None, *, max_len: int, max_seqs: int = 4, kv_tokens: int | None = None,
                 kv_memory: int | None = None, kv_block: int = KV_BLOCK, numerics: str = "llamacpp",
                 cache_type_k: str = "f16", cache_type_v: str = "f16"):
        self.gguf = gguf
        self.cfg = cfg or read_config(gguf)
        self.model = ReferenceModel(gguf, self.cfg, numerics=numerics, cache_type_k=cache_type_k,
                                    cache_type_v=cache_type_v)
        self.max_len, self.max_seqs, self.kv_block = int(max_len), int(max_seqs), int(kv_block)
        n_blocks = pool_blocks(self.cfg, self.max_len, self.max_seqs, kv_tokens=kv_tokens, kv_memory=kv_memory,
                               kv_block=self.kv_block, cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        check_memory(self.cfg, self.max_len, self.max_seqs, n_blocks, kv_block=self.kv_block,
                     cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        if numerics == "f32":  # K and V are not f16-rounded: keep them whole
            kv_cls = type("HostKV32", (HostKV,), {"dtype": np.float32})
        else:
            kv_cls = HostKV
        self.kv = kv_cls(None, self.cfg, n_blocks=max(1, n_blocks), block=self.kv_block,
                         max_seqs=self.max_seqs, max_len=self.max_len, cache_type_k=cache_type_k,
                         cache_type_v=cache_type_v)
        self.caches: dict[int, KVCache] = {}   # slot -> working cache (kept for the slot's next sequence)
        self.loaded = np.zeros(self.max_seqs, np.int64)  # positions of the working cache that are valid

    def warm_up(self) -> None:
        """Compile the reference's numba kernels (a forward pass of two positions)."""
        s = self.open()
        try:
            self.step([Row(s, [min(1, self.cfg.n_vocab - 1)] * 2, logits="last")])
        finally:
            self.close(s)

    # -- sequences (memra.gpu.runner.Runner's) ------------------------------------------------
    def open(self) -> Seq:
        s = Seq(self.kv.open())
        self.loaded[s.slot] = 0
        return s

    def close(self, seq: Seq) -> None:
        self.kv.close(seq.slot)
        self.loaded[seq.slot] = 0
        seq.n = 0

    def rewind(self, seq: Seq, n: int) -> None:
        if not 0 <= n <= seq.n:
            raise MemraError(f"cannot rewind a sequence of {seq.n} positions to {n}")
        self.kv.truncate(seq.slot, n)
        self.loaded[seq.slot] = min(int(self.loaded[seq.slot]), n)
        seq.n = n

    # -- the working cache and the pool ---------------------------------------------------------
    def _cache(self, slot: int) -> KVCache:
        c = self.caches.get(slot)
        if c is None:
            c = self.caches[slot] = self.model.new_cache(self.max_len)
        return c

    def _pool_rows(self, slot: int, p0: int, p1: int):
        """(block, offset in it, start, end) pieces of positions [p0, p1) of the slot."""
        B = self.kv_block
        p = p0
        while p < p1:
            j, off = divmod(p, B)
            n = min(B - off, p1 - p)
            yield int(self.kv.table[slot, j]), off, p, p + n
            p += n

    def _sides(self, cache: KVCache, il: int):
        """Per side (K, V) of layer il: the working cache's values, q8_0 codes and scales
        (None for f16), the pool's values (codes) and scales (None for f16), the head size."""
        c, kv = self.cfg, self.kv
        return ((cache.k[il], cache.kq and cache.kq[il], cache.kd and cache.kd[il], kv.k[il],
                 kv.k_scale and kv.k_scale[il], c.head_dim),
                (cache.v[il], cache.vq and cache.vq[il], cache.vd and cache.vd[il], kv.v[il],
                 kv.v_scale and kv.v_scale[il], c.head_dim_v))

    def _load(self, seq: Seq) -> None:
        """Copy positions [loaded, seq.n) of the slot from the pool (an adopted prefix): f16
        values, or q8_0 codes and scales and their values d * q."""
        slot, c = seq.slot, self.cfg
        p0 = int(self.loaded[slot])
        if p0 >= seq.n:
            return
        cache = self._cache(slot)

        def heads(rows, n, dim):  # pool rows [n, n_head_kv * dim] -> [n_head_kv, n, dim]
            return rows.reshape(n, c.n_head_kv, dim).transpose(1, 0, 2)

        for b, off, a, e in self._pool_rows(slot, p0, seq.n):
            n = e - a
            for il in range(c.n_layer):
                for vals, codes, scales, pool, pool_scale, dim in self._sides(cache, il):
                    if codes is None:
                        vals[:, a:e] = heads(pool[b, off:off + n].astype(np.float32), n, dim)
                        continue
                    codes[:, a:e] = heads(pool[b, off:off + n], n, dim)
                    scales[:, a:e] = heads(pool_scale[b, off:off + n].astype(np.float32), n, dim // 32)
                    vals[:, a:e] = q8_0_dequantize(codes[:, a:e], scales[:, a:e])
        self.loaded[slot] = seq.n

    def _store(self, slot: int, p0: int, p1: int) -> None:
        """Write positions [p0, p1) of the working cache through to the pool blocks (a q8_0
        side: its codes and f16 scales)."""
        c, cache = self.cfg, self.caches[slot]

        def rows(x, n):  # [n_head_kv, n, dim] -> pool rows [n, n_head_kv * dim]
            return x.transpose(1, 0, 2).reshape(n, -1)

        for b, off, a, e in self._pool_rows(slot, p0, p1):
            n = e - a
            for il in range(c.n_layer):
                for vals, codes, scales, pool, pool_scale, _ in self._sides(cache, il):
                    if codes is None:
                        pool[b, off:off + n] = rows(vals[:, a:e], n)
                    else:
                        pool[b, off:off + n] = rows(codes[:, a:e], n)
                        pool_scale[b, off:off + n] = rows(scales[:, a:e], n)

    # -- stepping ---------------------------------------------------------------------------------
    def step(self, rows, graph: bool = True, fill=None) -> list[RowOut]:
        """Advance each row's sequence by its tokens (Runner.step's contract); `graph` is
        accepted for the interface and means nothing here. Rows whose mask is LATER get it
        from fill(masks) (an int32 [len(rows), words] array) before the step."""
        if not rows:
            return []
        later = [i for i, r in enumerate(rows) if isinstance(r.mask, str)]
        if later:
            if fill is None or any(rows[i].mask != LATER for i in later):
                raise MemraError("rows with mask LATER need step(..., fill=...)")
            buf = np.full((len(rows), (self.cfg.n_vocab + 31) // 32), -1, np.int32)
            fill(buf)
            rows = [Row(r.seq, r.tokens, r.logits, r.sample, buf[i] if i in later else r.mask, r.gen)
                    for i, r in enumerate(rows)]
        toks = []
        for r in rows:
            t = np.asarray(r.tokens)
            if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
                raise MemraError("tokens must be a non-empty 1-D sequence of integer ids")
            bad = (t < 0) | (t >= self.cfg.n_vocab)
            if bad.any():
                raise MemraError(f"token id {int(t[bad][0])} is outside the vocabulary [0, {self.cfg.n_vocab})")
            if r.logits not in ("none", "last", "all"):
                raise MemraError(f"row logits must be none, last or all, got {r.logits!r}")
            if r.seq.n + t.size > self.max_len:
                raise ContextOverflowError(f"{r.seq.n} cached + {t.size} new tokens exceed the context of "
                                           f"{self.max_len} tokens")
            toks.append([int(x) for x in t])
        for r, t in zip(rows, toks):  # map every row's blocks first: KVFullError changes nothing
            self.kv.reserve(r.seq.slot, r.seq.n + len(t))
        return [self._row(r, t) for r, t in zip(rows, toks)]

    def _row(self, r: Row, toks: list[int]) -> RowOut:
        seq = r.seq
        end = seq.n + len(toks)
        self.kv.writable(seq.slot, seq.n, end)
        self._load(seq)
        cache = self._cache(seq.slot)
        cache.pos = seq.n
        keep = []
        for i, t in enumerate(toks):
            lg = self.model.forward([t], cache)
            if r.logits == "all" or i == len(toks) - 1:
                keep.append(lg)
        self._store(seq.slot, seq.n, end)
        self.loaded[seq.slot] = end
        seq.n = end
        out = RowOut()
        if r.logits == "all":
            out.logits = np.stack(keep)
        elif r.logits == "last":
            out.logits = keep[-1]
        if r.sample is not None:
            s, lg = r.sample, keep[-1]
            if r.mask is not None:  # a constrained row: what kernels/mask.cu does on the GPU
                lg = masked(lg, r.mask)
            out.token = int(np.argmax(lg)) if s.greedy else \
                reference_sample(lg, s.temperature, s.top_k, s.top_p, s.min_p, s.seed & ((1 << 64) - 1), end)
        return out

    def verify(self, seq: Seq, tokens, sample=None, graph: bool = True, masks=None) -> list[int]:
        """Speculative verification (memra.gpu.runner.Runner.verify's contract): feed
        `tokens` (the last accepted token, then the draft) one position at a time and return
        the token chosen after each, drawn at its own position, under masks[i] when masks
        are given (row i's vocabulary mask, None or -1 words: every token). It stops early
        at the first choice that differs from the next draft token (every later one would be
        rejected): then len(out) < len(tokens) and only len(out) tokens were fed."""
        t = np.asarray(tokens)
        if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer) \
                or ((t < 0) | (t >= self.cfg.n_vocab)).any():
            raise MemraError("verify: tokens must be a non-empty 1-D sequence of ids in the vocabulary")
        if seq.n + t.size > self.max_len:
            raise ContextOverflowError(f"{seq.n} cached + {t.size} new tokens exceed the context of "
                                       f"{self.max_len} tokens")
        toks = [int(x) for x in t]
        if masks is not None and len(masks) != len(toks):
            raise MemraError(f"verify: {len(toks)} tokens need {len(toks)} mask rows, got {len(masks)}")
        n0 = seq.n
        self.kv.reserve(seq.slot, n0 + len(toks))
        self.kv.writable(seq.slot, n0, n0 + len(toks))
        self._load(seq)
        cache = self._cache(seq.slot)
        cache.pos = n0
        s = sample
        out: list[int] = []
        for i, tk in enumerate(toks):
            lg = self.model.forward([tk], cache)
            if masks is not None and masks[i] is not None:  # what kernels/mask.cu does on the GPU
                lg = masked(lg, masks[i])
            p = n0 + i + 1
            out.append(int(np.argmax(lg)) if s is None or s.greedy else
                       reference_sample(lg, s.temperature, s.top_k, s.top_p, s.min_p, s.seed & ((1 << 64) - 1), p))
            if i + 1 < len(toks) and out[-1] != toks[i + 1]:
                break
        end = n0 + len(out)
        self._store(seq.slot, n0, end)
        self.loaded[seq.slot] = end
        seq.n = end
        if end < n0 + len(toks):
            self.kv.truncate(seq.slot, end)
        return out

    @property
    def max_rows(self) -> int:
        return MAX_ROWS
