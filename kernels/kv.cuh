// kv.cuh — the paged KV cache's addressing, shared by every kernel that appends or reads
// K/V (rope.cu's rope_norm_kv, attention.cu's attn_split / attn_decode / attn_decode_rope, attn_fa.cu).
//
// Layout (per layer, K and V alike): a pool of blocks [n_blocks][KV_BLOCK][n_kv * HEAD_DIM]
// f16. A sequence owns a row of the block table, bt[slot * max_blocks + j] = the pool block
// holding its positions [j * KV_BLOCK, (j + 1) * KV_BLOCK); the same block id is used in
// every layer's pool (memra/gpu/kv.py allocates, frees and shares them). Entries past the
// sequence's length are never read: the host maps every block a launch touches before it.
// A position p is inside the table when 0 <= p < max_blocks * KV_BLOCK and its entry is
// >= 0; appends to any other position are dropped (padded rows carry p = -1).
//
// Compile-time: KV_BLOCK (positions per block, a power of two; default 16); MEMRA_CANARY 2:
// a wrong variant that ignores the block table, which kernel-check must catch.
#pragma once
#include "common.cuh"

#ifndef KV_BLOCK
#define KV_BLOCK 16
#endif
static_assert((KV_BLOCK & (KV_BLOCK - 1)) == 0 && KV_BLOCK >= 1, "KV_BLOCK must be a power of two");

// The pool row (block * KV_BLOCK + offset) of position p in the sequence whose table row is bt.
MEMRA_DEVICE size_t kv_slot(const int* __restrict__ bt, int p) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 2
    return (size_t)p;  // kernel-check canary: the block table ignored (pool rows in position order)
#else
    // an unmapped entry (-1: a host bug) reads block 0 rather than memory before the pool
    return (size_t)max(__ldg(bt + p / KV_BLOCK), 0) * KV_BLOCK + (p % KV_BLOCK);
#endif
}

// The pool block of table entry j of row bt (kv_slot's lookup, for kernels that stage a row's
// entries once: the pool row of position p is kv_block(bt, p / KV_BLOCK) * KV_BLOCK + p % KV_BLOCK).
MEMRA_DEVICE int kv_block(const int* __restrict__ bt, int j) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 2
    return j;  // the canary above: pool rows in position order
#else
    return max(__ldg(bt + j), 0);
#endif
}

// Whether position p of table row bt may be written (see above).
MEMRA_DEVICE bool kv_writable(const int* __restrict__ bt, int max_blocks, int p) {
    return p >= 0 && p < max_blocks * KV_BLOCK && __ldg(bt + p / KV_BLOCK) >= 0;
}
