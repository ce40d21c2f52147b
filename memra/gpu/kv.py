"""The paged KV cache: a pool of fixed-size blocks per layer, a block table per sequence,
and reference counts for blocks shared read-only between sequences.

    kv = PagedKV(g, cfg, n_blocks=4096, block=16, max_seqs=64, max_len=8192)
    s = kv.open()                  # a block-table row (a "slot") for a new sequence
    kv.reserve(s, 700)             # map blocks for positions [0, 700)
    kv.fork(s, t, 512)             # t shares s's first 512 positions (full blocks, read-only)
    kv.close(s)                    # its blocks go back to the pool (shared ones when unused)
    kv.sync()                      # upload the block table if it changed (before a launch)

Device layout (kernels/kv.cuh): per layer, K and V pools [n_blocks][block][n_kv * head_dim]
f16, and one int32 block table [max_seqs][max_blocks]: entry j of a sequence's row is the
pool block holding its positions [j * block, (j + 1) * block), the same block id in every
layer; unmapped entries are -1 (kernels never write there). A block with a reference
count above one is read-only: writing a position inside it first copies it
(copy-on-write), so a shared prefix is never changed by the sequences that share it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from memra.errors import MemraError


class KVFullError(MemraError):
    """The pool has no free block left (the request needs fewer tokens, or more --kv-memory)."""


def bytes_per_block(cfg, block: int) -> int:
    """Device bytes one block takes over all layers (K and V, f16)."""
    return 2 * cfg.n_layer * block * cfg.kv_dim * 2


class BlockAllocator:
    """Host-side bookkeeping of the pool: free list and reference counts (no device work)."""

    def __init__(self, n_blocks: int):
        if n_blocks < 1:
            raise MemraError(f"the KV cache needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.ref = np.zeros(n_blocks, np.int32)
        self.free = deque(range(n_blocks))

    @property
    def n_free(self) -> int:
        return len(self.free)

    def alloc(self) -> int:
        if not self.free:
            raise KVFullError(f"the KV cache is full ({self.n_blocks} blocks in use)")
        b = self.free.popleft()
        self.ref[b] = 1
        return b

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
            self.free.append(b)


class PagedKV:
    def __init__(self, g, cfg, *, n_blocks: int, block: int = 16, max_seqs: int = 64, max_len: int = 4096):
        if block < 1 or block & (block - 1):
            raise MemraError(f"KV block size must be a power of two, got {block}")
        self.g, self.cfg, self.block = g, cfg, int(block)
        self.max_seqs, self.max_len = int(max_seqs), int(max_len)
        self.max_blocks = -(-self.max_len // self.block)
        self.alloc = BlockAllocator(int(n_blocks))
        shape = (self.alloc.n_blocks, self.block, cfg.kv_dim)
        self.k = [g.empty(shape, np.uint16) for _ in range(cfg.n_layer)]
        self.v = [g.empty(shape, np.uint16) for _ in range(cfg.n_layer)]
        self.table = np.full((self.max_seqs, self.max_blocks), -1, np.int32)
        self.d_table = g.to_device(self.table)
        self.n_mapped = np.zeros(self.max_seqs, np.int32)  # blocks mapped per slot
        self.free_slots = deque(range(self.max_seqs))
        self.dirty = False

    @property
    def nbytes(self) -> int:
        return self.alloc.n_blocks * bytes_per_block(self.cfg, self.block)

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

    def writable(self, slot: int, start: int, end: int) -> None:
        """Make positions [start, end) of the slot writable: blocks shared with another
        sequence are copied first (copy-on-write, every layer's K and V)."""
        for j in range(int(start) // self.block, self.blocks_for(end)):
            b = int(self.table[slot, j])
            if b >= 0 and self.alloc.ref[b] > 1:
                nb = self.alloc.alloc()
                nbytes = self.block * self.cfg.kv_dim * 2
                for pool in (*self.k, *self.v):
                    self.g.copy(pool.view(offset=nb * nbytes, shape=(nbytes // 2,)),
                                pool.view(offset=b * nbytes, shape=(nbytes // 2,)), nbytes)
                self.alloc.release(b)
                self.table[slot, j] = nb
                self.dirty = True

    def sync(self) -> None:
        """Upload the block table if it changed (never inside a graph capture)."""
        if self.dirty:
            self.d_table.upload(self.table)
            self.dirty = False
