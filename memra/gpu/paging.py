"""The paged KV cache's addressing on the host (kernels/kv.cuh is its device side): block
tables, pool rows, and the logical [sequence, position] view of a pool. Shared by the
kernel checks, the test emulator and memra.gpu.kv.

A pool is [n_blocks, block, row] (row = n_kv * head_dim f16 values); a block table is int32
[n_seq, max_blocks], entry j of sequence s naming the pool block of its positions
[j * block, (j + 1) * block), -1 where nothing is mapped.
"""

from __future__ import annotations

import numpy as np


def pool_row(table: np.ndarray, s: int, p: int, block: int) -> int:
    """The pool row (block * block_size + offset) of position p of sequence s."""
    return int(table[s, p // block]) * block + p % block


def random_table(rng: np.random.Generator, n_seq: int, n_pos: int, block: int, spare: int = 2):
    """A block table mapping positions [0, n_pos) of n_seq sequences onto pool blocks in a
    shuffled order (so a kernel that ignored the table would read the wrong rows), with
    `spare` pool blocks left unmapped; returns (table, n_blocks)."""
    per = -(-n_pos // block)
    n_blocks = n_seq * per + spare
    order = rng.permutation(n_blocks)[:n_seq * per].astype(np.int32)
    return order.reshape(n_seq, per), n_blocks


def logical(pool: np.ndarray, table: np.ndarray, n_pos: int, block: int) -> np.ndarray:
    """[n_seq, n_pos, ...] view (a copy) of a pool [n_blocks, block, ...] through table."""
    p = np.arange(n_pos)
    return pool[table[:, p // block], p % block]


def scatter(logical_kv: np.ndarray, table: np.ndarray, n_blocks: int, block: int, fill=0) -> np.ndarray:
    """The pool holding logical_kv [n_seq, n_pos, ...] through table (other rows = fill)."""
    n_seq, n_pos = logical_kv.shape[:2]
    pool = np.full((n_blocks, block) + logical_kv.shape[2:], fill, logical_kv.dtype)
    p = np.arange(n_pos)
    for s in range(n_seq):
        pool[table[s, p // block], p % block] = logical_kv[s]
    return pool
