// attn_ring.cuh — attention.cu's ATT_RING: split_body's K/V tiles staged into shared memory by
// cp.async, a ring of ATT_RING stages (a stage: one ATT_TILE-key tile of K and of V, f16),
// included by attention.cu after its constants (experiments/attn_ring: the prototype, its CPU
// evidence and the device A/B). Tile t + ATT_RING - 1 is issued at
// the head of tile t (after the barrier that ends every reader of its stage, tile t - 1), and
// the block-table entries of tile t + ATT_RING are looked up then too, into registers, so the
// next issue does not wait on them: while tile t's scores / softmax / V sums run, ATT_RING - 1
// tiles are in flight, held in shared memory, not registers. The arithmetic is split_body's:
// only where a K/V chunk is read from changes (K_SRC / V_SRC), so the bits are attn_decode's.
//
// Compile-time: ATT_RING (0: attention.cu as it is; 2..4: stages). Launch: dynamic shared
// memory RING_BYTES = ATT_RING * 2 * ATT_TILE * HEAD_DIM * 2 (host: memra.gpu.ops.attention's
// ring_bytes). f16 KV only (q8_0 planes refused).
#pragma once
#ifndef ATT_RING
#define ATT_RING 0
#endif
#ifndef ATT_TC
#define ATT_TC 0
#endif
#if ATT_TC  // a ring row's 16-byte chunk c lies at c ^ (row % 8)
#define RING_SWZ(r) ((r) & 7)
#else
#define RING_SWZ(r) 0
#endif
#define RING_COL(r, d) (((((d) >> 3) ^ RING_SWZ(r)) << 3) | ((d) & 7))

// attn_decode / attn_decode_rope's launch bounds: ATT_RING_MINB blocks an SM when non-zero. Left
// to itself ptxas gave the ring at 2 heads a block 80 registers and 8 spilled bytes (HEAD_DIM 128
// ring 2, HEAD_DIM 64 with 8 warps ring 3; cpu.py); a minimum of 2 blocks (what attention.cu's
// registers give there) lets it take 91-96 without spills. ATT_EARLY too: left to itself ptxas
// gave attn_decode_rope at 4 heads a block, HEAD_DIM 128, 154 registers (one 8-warp block an SM,
// 127 without it); at 2 blocks 128, no spill (experiments/attn_early).
#ifndef ATT_RING_MINB
#if ATT_RING && (N_GQA == 2 || ATT_EARLY)
#define ATT_RING_MINB 2
#else
#define ATT_RING_MINB 0
#endif
#endif
#if ATT_RING_MINB
#define RING_LB __launch_bounds__(NT, ATT_RING_MINB)
#else
#define RING_LB __launch_bounds__(NT)
#endif

#if ATT_RING
static_assert(!KV_ANY_Q8, "ATT_RING: f16 K/V only (q8_0 planes are not staged; build with ATT_RING 0)");
static_assert(ATT_RING >= 2 && ATT_RING <= 4, "ATT_RING: 2..4 stages");
static_assert(NT % NCH == 0, "attn_ring: the block's threads must cover whole rows");
constexpr int RSTEP = NT / NCH;                       // rows one pass of the block copies
constexpr int RPT = (ATT_TILE + RSTEP - 1) / RSTEP;   // rows per thread per tile (K and V each)
constexpr int RING_STAGE = 2 * ATT_TILE * D;          // halves a stage: K tile, then V tile
constexpr int RING_BYTES = ATT_RING * RING_STAGE * 2;
static_assert(RING_BYTES >= RED_R * G * D * 4, "attn_ring: the key-group sum's red must fit in the ring");

extern __shared__ __align__(16) uint16_t attn_ring_smem[];

// The raw table entries of this thread's rows (r_row + j * RSTEP) of the tile at tile0 (rows past
// k1: left as they are, never used). Raw: kv_block's clamp to >= 0 is applied where the entry is
// used (ring_issue), so nothing here waits on the load: the entries stay in flight in RPT
// registers through a tile's compute.
static __device__ __forceinline__ void ring_lookup(const int* __restrict__ bt, int tile0, int k1, int r_row,
                                                   int (&blk)[RPT]) {
#pragma unroll
    for (int j = 0; j < RPT; j++) {
        const int r = r_row + j * RSTEP, key = tile0 + r;
        if (r < ATT_TILE && key < k1) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 2
            blk[j] = key / KV_BLOCK;  // kv.cuh's canary: the block table ignored
#else
            blk[j] = __ldg(bt + key / KV_BLOCK);
#endif
        }
    }
}

// cp.async of this thread's chunks of the tile at tile0 (if any keys) into `stage`; one
// commit group whether or not anything was copied (the wait counts groups)
static __device__ __forceinline__ void ring_issue(const uint16_t* __restrict__ kbase,
                                                  const uint16_t* __restrict__ vbase, size_t row_stride,
                                                  int tile0, int k1, int kz, int stage, int r_row, int r_ch,
                                                  const int (&blk)[RPT]) {
    if (tile0 < (ATT_TC ? kz : k1)) {
        uint16_t* ks = attn_ring_smem + stage * RING_STAGE;
        uint16_t* vs = ks + ATT_TILE * D;
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            const int r = r_row + j * RSTEP, key = tile0 + r;
            if (r < ATT_TILE && key < k1) {
                // kv_slot's row: max(entry, 0) * KV_BLOCK + key % KV_BLOCK (kv.cuh)
                const size_t off = ((size_t)max(blk[j], 0) * KV_BLOCK + (key % KV_BLOCK)) * row_stride + r_ch * 8;
                cp16(smem_u32(ks + r * D + ((r_ch ^ RING_SWZ(r)) << 3)), kbase + off);
                cp16(smem_u32(vs + r * D + ((r_ch ^ RING_SWZ(r)) << 3)), vbase + off);
            }
#if ATT_TC
            else if (r < ATT_TILE && key >= kz)  // past the split's keys: P = 0 meets zeros
                *(uint4*)(vs + r * D + ((r_ch ^ RING_SWZ(r)) << 3)) = make_uint4(0u, 0u, 0u, 0u);
#endif
        }
    }
    cp_commit();
}

// The prologue's copies: tiles 0 .. ATT_RING - 2 of [k0, k1) into stages 0 .. ATT_RING - 2, keys
// below k1c only (ATT_EARLY: attn_decode_rope issues them before the PDL wait with k1c = its own
// position, whose row it writes into the stage itself); blk ends holding tile ATT_RING - 1's entries.
static __device__ __forceinline__ void ring_prologue(const int* __restrict__ bt, const uint16_t* __restrict__ kbase,
                                                     const uint16_t* __restrict__ vbase, size_t row_stride, int k0,
                                                     int k1, int k1c, int r_row, int r_ch, int (&blk)[RPT]) {
    ring_lookup(bt, k0, k1, r_row, blk);
#pragma unroll
    for (int s_ = 0; s_ < ATT_RING - 1; s_++) {
        ring_issue(kbase, vbase, row_stride, k0 + s_ * ATT_TILE, k1c, k1, s_, r_row, r_ch, blk);
        ring_lookup(bt, k0 + (s_ + 1) * ATT_TILE, k1, r_row, blk);
    }
}

#define RING_RED float(*red)[G * D] = reinterpret_cast<float(*)[G * D]>(attn_ring_smem)
#define RING_PROLOGUE                                                                                 \
    const int r_ch = tid % NCH, r_row = tid / NCH;                                                    \
    int r_blk[RPT] = {};                                                                              \
    if (pre_blk) {  /* ATT_EARLY: issued before the wait by attn_decode_rope */                      \
        _Pragma("unroll") for (int j_ = 0; j_ < RPT; j_++) r_blk[j_] = pre_blk[j_];                   \
    } else {                                                                                          \
        ring_prologue(bt, kbase, vbase, row_stride, k0, k1, k1, r_row, r_ch, r_blk);                  \
    }                                                                                                 \
    int r_t = 0
#define RING_TILE_HEAD                                                                                \
    cp_wait<ATT_RING - 2>();                                                                          \
    __syncthreads(); /* tile t landed for every thread; every reader of tile t - 1 done */           \
    ring_issue(kbase, vbase, row_stride, tile0 + (ATT_RING - 1) * ATT_TILE, k1, k1,                   \
               (r_t + ATT_RING - 1) % ATT_RING, r_row, r_ch, r_blk);                                  \
    ring_lookup(bt, tile0 + ATT_RING * ATT_TILE, k1, r_row, r_blk);                                   \
    const uint16_t* r_k = attn_ring_smem + (r_t % ATT_RING) * RING_STAGE;                            \
    const uint16_t* r_v = r_k + ATT_TILE * D
#define RING_TILE_TAIL r_t++
#define RING_AFTER_LOOP __syncthreads() /* the ring becomes red: every reader of the last tile done */
#define K_SRC(key, ch) (*(const uint4*)(r_k + (key) * D + ((ch) ^ RING_SWZ(key)) * 8))
#define V_SRC(k, ch) (*(const uint4*)(r_v + (k) * D + ((ch) ^ RING_SWZ(k)) * 8))
#else
constexpr int RING_BYTES = 0;
#define RING_RED __shared__ __align__(16) float red[RED_R][G * D]
#define RING_PROLOGUE do {} while (0)
#define RING_TILE_HEAD do {} while (0)
#define RING_TILE_TAIL __syncthreads()
#define RING_AFTER_LOOP do {} while (0)
#define K_SRC(key, ch) K_LD(kv_slot(bt, tile0 + key), ch)
#define V_SRC(k, ch) V_LD(kv_slot(bt, tile0 + k), ch)
#endif
