"""The paged KV cache: a pool of fixed-size blocks per layer, a block table per sequence,
and reference counts for blocks shared read-only between sequences.

    kv = PagedKV(g, cfg, n_blocks=4096, block=16, max_seqs=64, max_len=8192)
    s = kv.open()                  # a block-table row (a "slot") for a new sequence
    kv.reserve(s, 700)             # map blocks for positions [0, 700)
    kv.fork(s, t, 512)             # t shares s's first 512 positions (full blocks, read-only)
    kv.close(s)                    # its blocks go back to the pool (shared ones when unused)
    kv.sync()                      # upload the block table if it changed (before a launch)
    kv.adopt(t, [b0, b1])          # map given blocks (a prefix-cache hit) at t's first positions

Device layout (kernels/kv.cuh): per layer, K and V pools [n_blocks][block][n_kv * head_dim]
f16 (uint16 bits), or for a q8_0 side (cache_type_k / cache_type_v) int8 codes of that shape
and f16 scales [n_blocks][block][n_kv * head_dim / 32] (k_scale / v_scale, uint16 bits; None
for an f16 side), and one int32 block table [max_seqs][max_blocks]: entry j of a sequence's row is the
pool block holding its positions [j * block, (j + 1) * block), the same block id in every
layer; unmapped entries are -1 (kernels never write there). A block with a reference
count above one is read-only: writing a position inside it first copies it
(copy-on-write), so a shared prefix is never changed by the sequences that share it.

Free blocks queue least recently freed first. A block the prefix cache
(memra.serve.prefix_cache) remembers keeps its contents while free: `alloc` hands out the
oldest free block and first tells `on_evict(block)` that its contents are gone; `take(b)`
brings a free block back into use (a cache hit). The pool's storage sits behind two seams,
`_make_pools` and `_copy_block`, so the CPU engine (memra.serve.cpu_engine) keeps the same
bookkeeping over host arrays.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable

import numpy as np

from memra.errors import MemraError
from memra.model.kvtypes import check_cache_type, row_bytes


class KVFullError(MemraError):
    """The pool has no free block left (the request needs fewer tokens, or more --kv-memory)."""


# the KV cache's types and their bytes: memra.model.kvtypes (the CPU reference uses them too)
# the GPU kernels read and append both (kernels/kv.cuh's q8_0 planes; experiments/kvq8/README.md)
CACHE_TYPES_GPU = ("f16", "q8_0")


def check_cache_device(device: str, cache_type_k: str = "f16", cache_type_v: str = "f16") -> None:
    """Refuse a KV cache type the device cannot run, before any work."""
    for flag, t in (("--cache-type-k", cache_type_k), ("--cache-type-v", cache_type_v)):
        check_cache_type(t, flag)
        if device == "gpu" and t not in CACHE_TYPES_GPU:
            raise MemraError(f"{flag} {t}: the q8_0 KV cache runs on --device cpu only until the GPU "
                             f"kernels land (experiments/kvq8/README.md); use f16 on the GPU")


def bytes_per_block(cfg, block: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
    """Bytes one block takes over all layers (K and V, each f16 or q8_0)."""
    return cfg.n_layer * block * (row_bytes(cfg.kv_dim, cache_type_k) + row_bytes(cfg.kv_dim, cache_type_v))


class BlockAllocator:
    """Host-side bookkeeping of the pool: free blocks (least recently freed first) and
    reference counts (no device work). on_evict(b), when set, is called before a free block
    is handed out again (its contents are about to be overwritten)."""

    def __init__(self, n_blocks: int):
        if n_blocks < 1:
            raise MemraError(f"the KV cache needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.ref = np.zeros(n_blocks, np.int32)
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(n_blocks))
        self.on_evict: Callable[[int], None] | None = None

    @property
    def n_free(self) -> int:
        return len(self.free)

    def alloc(self) -> int:
        if not self.free:
            raise KVFullError(f"the KV cache is full ({self.n_blocks} blocks in use)")
        b, _ = self.free.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(b)
        self.ref[b] = 1
        return b

    def take(self, b: int) -> int:
        """Use block b again: a free one leaves the free queue with its contents (a
        prefix-cache hit), one in use is shared."""
        if self.ref[b] == 0:
            del self.free[b]
            self.ref[b] = 1
            return b
        return self.share(b)

    def share(self, b: int) -> int:
        if self.ref[b] <= 0:
            raise MemraError(f"KV block {b} is not in use: it cannot be shared")
        self.ref[b] += 1
        return b

    def release(self, b: int) -> None:
        if self.ref[b] <= 0:
            raise MemraError(f"KV block {b} released twice")
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free[b] = None


class PagedKV:
    # the cache types its pools hold (f16 or q8_0, each side on its own)
    cache_type_k = "f16"
    cache_type_v = "f16"
    k_scale = None  # per layer, the q8_0 scale planes (None for an f16 side)
    v_scale = None

    def __init__(self, g, cfg, *, n_blocks: int, block: int = 16, max_seqs: int = 64, max_len: int = 4096,
                 cache_type_k: str = "f16", cache_type_v: str = "f16"):
        self.cache_type_k = check_cache_type(cache_type_k, "--cache-type-k")
        self.cache_type_v = check_cache_type(cache_type_v, "--cache-type-v")
        if block < 1 or block & (block - 1):
            raise MemraError(f"KV block size must be a power of two, got {block}")
        self.g, self.cfg, self.block = g, cfg, int(block)
        self.max_seqs, self.max_len = int(max_seqs), int(max_len)
        self.max_blocks = -(-self.max_len // self.block)
        self.alloc = BlockAllocator(int(n_blocks))
        self.table = np.full((self.max_seqs, self.max_blocks), -1, np.int32)
        self._make_pools()
        self.n_mapped = np.zeros(self.max_seqs, np.int32)  # blocks mapped per slot
        self.free_slots = deque(range(self.max_seqs))
        self.dirty = False

    def _device_pools(self, cache_type: str):
        """One side's pools per layer: f16 bits (uint16), or q8_0 int8 codes and their uint16
        scale planes (kernels/kv.cuh)."""
        n, c = self.alloc.n_blocks, self.cfg
        if cache_type == "q8_0":
            if c.kv_dim % 32 or c.head_dim % 32:
                raise MemraError(f"a q8_0 KV cache needs a head size that is a multiple of 32, got {c.head_dim}")
            return ([self.g.empty((n, self.block, c.kv_dim), np.int8) for _ in range(c.n_layer)],
                    [self.g.empty((n, self.block, c.kv_dim // 32), np.uint16) for _ in range(c.n_layer)])
        return [self.g.empty((n, self.block, c.kv_dim), np.uint16) for _ in range(c.n_layer)], None

    def _make_pools(self) -> None:
        """The device's K and V pools per layer (by cache type) and the block table's device copy."""
        self.k, self.k_scale = self._device_pools(self.cache_type_k)
        self.v, self.v_scale = self._device_pools(self.cache_type_v)
        self.d_table = self.g.to_device(self.table)

    def _copy_block(self, dst: int, src: int) -> None:
        """Every layer's K and V rows (and q8_0 scales) of block src into block dst."""
        for pool in (*self.k, *self.v, *(self.k_scale or ()), *(self.v_scale or ())):
            nbytes = pool.nbytes // self.alloc.n_blocks
            n = nbytes // pool.dtype.itemsize
            self.g.copy(pool.view(offset=dst * nbytes, shape=(n,)), pool.view(offset=src * nbytes, shape=(n,)),
                        nbytes)

    @property
    def nbytes(self) -> int:
        return self.alloc.n_blocks * bytes_per_block(self.cfg, self.block, self.cache_type_k, self.cache_type_v)

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks in use."""
        return 1.0 - self.alloc.n_free / self.alloc.n_blocks

    def blocks_for(self, n_tokens: int) -> int:
        return -(-int(n_tokens) // self.block)

    # -- sequences ------------------------------------------------------------------------
    def open(self) -> int:
        if not self.free_slots:
            raise KVFullError(f"all {self.max_seqs} sequence slots of the KV cache are in use")
        return self.free_slots.popleft()

    def close(self, slot: int) -> None:
        self.truncate(slot, 0)
        self.free_slots.append(slot)

    def reserve(self, slot: int, n_tokens: int) -> None:
        """Map blocks so that positions [0, n_tokens) of the slot exist. Raises KVFullError
        (mapping nothing new) when the pool cannot hold them."""
        if n_tokens > self.max_len:
            raise MemraError(f"{n_tokens} positions exceed the KV cache's {self.max_len} per sequence")
        need = self.blocks_for(n_tokens) - int(self.n_mapped[slot])
        if need <= 0:
            return
        if need > self.alloc.n_free:
            raise KVFullError(f"the KV cache has {self.alloc.n_free} free blocks of {self.block} tokens, "
                              f"{need} more are needed")
        j0 = int(self.n_mapped[slot])
        for j in range(j0, j0 + need):
            self.table[slot, j] = self.alloc.alloc()
        self.n_mapped[slot] = j0 + need
        self.dirty = True

    def truncate(self, slot: int, n_tokens: int) -> None:
        """Keep positions [0, n_tokens) of the slot; blocks past them go back to the pool."""
        keep = self.blocks_for(n_tokens)
        for j in range(keep, int(self.n_mapped[slot])):
            self.alloc.release(int(self.table[slot, j]))
            self.table[slot, j] = -1
        self.n_mapped[slot] = min(keep, int(self.n_mapped[slot]))
        self.dirty = True

    def fork(self, src: int, dst: int, n_tokens: int) -> None:
        """Let slot dst (empty) share src's first n_tokens positions, whole blocks only: the
        shared blocks' reference counts go up. Positions of a partial last block are not
        shared (the caller recomputes them)."""
        if self.n_mapped[dst]:
            raise MemraError(f"KV slot {dst} is not empty")
        full = int(n_tokens) // self.block
        if full > self.n_mapped[src]:
            raise MemraError(f"KV slot {src} holds {int(self.n_mapped[src])} blocks, not {full}")
        for j in range(full):
            self.table[dst, j] = self.alloc.share(int(self.table[src, j]))
        self.n_mapped[dst] = full
        self.dirty = True

    def adopt(self, slot: int, blocks) -> None:
        """Map `blocks` (a cached prefix, in order) as the first blocks of the empty slot:
        each is taken from the free queue with its contents, or shared when in use."""
        if self.n_mapped[slot]:
            raise MemraError(f"KV slot {slot} is not empty")
        if len(blocks) > self.max_blocks:
            raise MemraError(f"{len(blocks)} blocks exceed the {self.max_blocks} of a sequence")
        for j, b in enumerate(blocks):
            self.table[slot, j] = self.alloc.take(int(b))
        self.n_mapped[slot] = len(blocks)
        self.dirty = True

    def writable(self, slot: int, start: int, end: int) -> None:
        """Make positions [start, end) of the slot writable: blocks shared with another
        sequence are copied first (copy-on-write, every layer's K and V)."""
        for j in range(int(start) // self.block, self.blocks_for(end)):
            b = int(self.table[slot, j])
            if b >= 0 and self.alloc.ref[b] > 1:
                nb = self.alloc.alloc()
                self._copy_block(nb, b)
                self.alloc.release(b)
                self.table[slot, j] = nb
                self.dirty = True

    def sync(self) -> None:
        """Upload the block table if it changed (never inside a graph capture)."""
        if self.dirty:
            self.d_table.upload(self.table)
            self.dirty = False
