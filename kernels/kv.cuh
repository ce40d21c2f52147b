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

// ---- q8_0 planes (a compile-time type per side: KV_K_Q8 / KV_V_Q8, 0 or 1, default 0 = f16) ----
// A q8_0 side's pool per layer is two planes: the int8 codes [n_blocks][KV_BLOCK][n_kv * HEAD_DIM]
// (addressed like the f16 pool, one byte a value) and the f16 scales [n_blocks][KV_BLOCK]
// [n_kv * HEAD_DIM / 32] (one per 32 consecutive values of a head row; HEAD_DIM % 32 == 0).
// Quantization is llama.cpp CPU's quantize_row_q8_0 (AVX2), memra/cpu/llamacpp.py q8_0_quantize:
//   amax = max |x| over the 32 values (fp32, exact: any order);  d = f16_rn(amax / 127);
//   id = amax != 0 ? 127 / amax : 0 (IEEE division from amax);  q = rint(fp32(x * id)), half to
//   even; a non-finite x * id (id overflowed: amax < 127 / FLT_MAX) stores -128 as the AVX2
//   conversion's saturation does. Dequantization d * q is exact in fp32.
// The scale pointers (kscale, vscale: null for an f16 side) are the last two parameters of the
// kernels of a module with either side q8_0; an f16-only module's parameters are unchanged.
// MEMRA_CANARY 4: the read ignores the scale plane (d = 1), which kernel-check must catch.
#ifndef KV_K_Q8
#define KV_K_Q8 0
#endif
#ifndef KV_V_Q8
#define KV_V_Q8 0
#endif
#define KV_ANY_Q8 (KV_K_Q8 || KV_V_Q8)
#if KV_K_Q8
typedef int8_t kv_k_t;
#else
typedef uint16_t kv_k_t;
#endif
#if KV_V_Q8
typedef int8_t kv_v_t;
#else
typedef uint16_t kv_v_t;
#endif
#if KV_ANY_Q8
#define KV_SCALE_PARAMS , uint16_t* __restrict__ kscale, uint16_t* __restrict__ vscale
#define KV_SCALE_ARGS , kscale, vscale
#else
#define KV_SCALE_PARAMS
#define KV_SCALE_ARGS
#endif

// One 32-value group, stored by a whole warp (every lane, converged): lane l holds value l of
// the group, x; q: the group's 32 codes, s: its scale. The max is exact whatever the shuffle
// order, so the stored bits are the CPU rule's whatever the thread layout.
MEMRA_DEVICE void kv_q8_store32(float x, int8_t* __restrict__ q, uint16_t* __restrict__ s) {
    const int lane = threadIdx.x % 32;
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    const float y = __fmul_rn(x, id);
    q[lane] = (int8_t)(isfinite(y) ? __float2int_rn(y) : -128);
    if (lane == 0) *s = f32_to_f16(__fdiv_rn(amax, 127.f));
}

// A head row of n values (n % 32 == 0) from src (+ add, when non-null, __fadd_rn as v_append),
// stored as q8_0 by a whole warp: codes q[0..n), scales s[0..n/32).
MEMRA_DEVICE void kv_q8_store_row(const float* __restrict__ src, const float* __restrict__ add, int n,
                                  int8_t* __restrict__ q, uint16_t* __restrict__ s) {
    const int lane = threadIdx.x % 32;
    for (int j = 0; j < n / 32; j++) {  // uniform trip count: every lane shuffles
        const int d = 32 * j + lane;
        kv_q8_store32(add ? __fadd_rn(src[d], add[d]) : src[d], q + 32 * j, s + j);
    }
}

// 8 codes (a 16-byte chunk's worth of values, ch: the chunk index in the head row, inside one
// 32-group) of a pool row: codes row qrow, scales row srow; packed as (codes, codes, scale bits, 0)
// so a caller keeps it in a uint4 like an f16 chunk.
MEMRA_DEVICE uint4 kv_q8_ld8(const int8_t* __restrict__ qrow, const uint16_t* __restrict__ srow, int ch) {
    const uint2 v = *(const uint2*)(qrow + ch * 8);
    // a plain load, not __ldg: attn_decode_rope reads the scales its own block just appended
    return make_uint4(v.x, v.y, (uint32_t)srow[ch / 4], 0u);
}

// kv_q8_ld8's chunk as 8 floats: d * q, exact.
MEMRA_DEVICE void kv_q8_unpack8(const uint4 u, float* f) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 4
    const float d = 1.f;  // kernel-check canary: the scale plane ignored
#else
    const float d = f16_to_f32((uint16_t)u.z);
#endif
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = __fmul_rn(d, (float)(int8_t)((u.x >> (8 * i)) & 0xffu));
        f[4 + i] = __fmul_rn(d, (float)(int8_t)((u.y >> (8 * i)) & 0xffu));
    }
}
