"""The prefix cache: full KV blocks shared between requests by hash chain.

    pc = PrefixCache(kv)                          # kv: memra.gpu.kv.PagedKV (or the CPU engine's)
    blocks = pc.lookup(ns, prompt, limit=len(prompt) - 1)  # cached blocks of the longest prefix
    kv.adopt(slot, blocks); seq.n = len(blocks) * kv.block # the request computes only the rest
    ...
    pc.register(ns, tokens, slot, n_done)         # the slot's full blocks over tokens[:n_done]

Only full blocks are cached. Block j's hash is H(hash of block j-1, the block's token ids);
the chain starts from H(namespace), the tenant's API key and `cache_salt`, so nothing is
ever shared across namespaces. The block keeps its token ids and a hit compares them
(a hash collision is never a hit). A cached block that no sequence uses sits in the KV
allocator's free queue with its contents (least recently freed first); when the allocator
hands it out again it tells `_evict`, which forgets it. A hit on such a block takes it
back out of the queue (memra.gpu.kv.BlockAllocator.take).

A full hit still recomputes the last prompt token (its logits are needed): callers pass
`limit = len(prompt) - 1`. The engines make a row's bits a function of its own tokens and
positions (the exactness contract), so a hit gives the tokens a recomputation would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


def _h(parent: bytes, tokens) -> bytes:
    return hashlib.blake2b(parent + np.asarray(tokens, np.int32).tobytes(), digest_size=16).digest()


def root_hash(namespace: str) -> bytes:
    """The chain's start for a tenant namespace (mixed into the first block only). A
    cache_salt may hold lone surrogates (JSON's \\ud800): surrogatepass encodes any str."""
    return hashlib.blake2b(b"memra-prefix-v1\0" + namespace.encode("utf-8", "surrogatepass"),
                           digest_size=16).digest()


@dataclass
class _Entry:
    block: int
    tokens: tuple[int, ...]


class PrefixCache:
    def __init__(self, kv):
        self.kv = kv
        self.block = int(kv.block)
        self.by_hash: dict[bytes, _Entry] = {}
        self.hash_of: dict[int, bytes] = {}  # block id -> its hash, while cached
        kv.alloc.on_evict = self._evict
        self.queries = 0  # prompt tokens looked up
        self.hits = 0     # of them found cached

    def __len__(self) -> int:
        return len(self.by_hash)

    def _evict(self, b: int) -> None:
        h = self.hash_of.pop(b, None)
        if h is not None:
            self.by_hash.pop(h, None)

    def chain(self, namespace: str, tokens, n_blocks: int) -> list[bytes]:
        """The hashes of the first n_blocks full blocks of tokens."""
        out, h, B = [], root_hash(namespace), self.block
        for j in range(n_blocks):
            h = _h(h, tokens[j * B:(j + 1) * B])
            out.append(h)
        return out

    def lookup(self, namespace: str, tokens, limit: int | None = None, count: bool = True) -> list[int]:
        """Block ids holding the longest cached prefix of tokens (whole blocks, at most
        `limit` tokens). count: add to the query/hit statistics."""
        n = len(tokens) if limit is None else min(len(tokens), max(0, int(limit)))
        B = self.block
        blocks = []
        for j, h in enumerate(self.chain(namespace, tokens, n // B)):
            e = self.by_hash.get(h)
            if e is None or e.tokens != tuple(int(t) for t in tokens[j * B:(j + 1) * B]):
                break
            blocks.append(e.block)
        if count:
            self.queries += len(tokens)
            self.hits += len(blocks) * B
        return blocks

    def free_among(self, blocks) -> int:
        """How many of these blocks sit in the free queue (adopting them takes them out)."""
        return sum(1 for b in blocks if self.kv.alloc.ref[int(b)] == 0)

    def register(self, namespace: str, tokens, slot: int, n_done: int, start: int = 0) -> int:
        """Remember the slot's full blocks over tokens[:n_done] (their K/V written), from
        block `start` on; returns the number of full blocks now covered (the next start).
        A hash already cached under another block keeps that block."""
        B = self.block
        full = min(int(n_done), len(tokens)) // B
        if full <= start:
            return max(start, full)
        hashes = self.chain(namespace, tokens, full)
        for j in range(start, full):
            h = hashes[j]
            b = int(self.kv.table[slot, j])
            if h in self.by_hash or b < 0 or b in self.hash_of:
                continue
            self.by_hash[h] = _Entry(b, tuple(int(t) for t in tokens[j * B:(j + 1) * B]))
            self.hash_of[b] = h
        return full
