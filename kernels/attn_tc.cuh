// attn_tc.cuh — attention.cu's split body on the tensor cores (ATT_TC; included by attention.cu after attn_ring.cuh).
#pragma once
// ---- ATT_TC: split_body's keys on the tensor cores (experiments/attn_tc; inlined into its build copy) ----
// Slice c of every ring tile, keys [16 c, 16 c + 16), belongs to warp c (ATT_TILE = 16 ATT_WARPS) or to the warp
// pair c, c + TC_SL (ATT_TILE = 8 ATT_WARPS: both compute the slice's scores, the same instructions on the same
// operands, and each accumulates half of the output's D rows); a slice keeps its own online softmax (m, l) and
// output for the block's G <= 8 heads, and the slices are merged at the end in slice order. So the pair layout
// gives the same bits as a warp a slice at the same tile.
//   scores, transposed: S^T (16 keys x 8 heads) = K (16 x D, the ring's f16 rows, ldmatrix) . Q^T (D x 8, the
//     roped f32 query as f16 hi + lo: two mma m16n8k16 a k-step, so q is carried to ~22 bits; K is f16 exactly)
//   P^T = exp(S^T - m) as f16 hi + lo, moved to the B layout by movmatrix.trans (no shared memory)
//   O^T (D x 8 heads) += V^T (D x 16 keys, ldmatrix.trans of the ring's V rows) . P^T, two mma a D/16 tile
// fp32 accumulation throughout; the result differs from the CUDA-core body's in the last bits (a new order,
// per row still fixed: batch-, graph- and chunk-invariant) and is checked against the float64 reference at TOL.
#if ATT_TC
#ifndef ATT_TC_MIN  // ATT_TC 2: the fewest keys a row has for the tensor cores (fewer: the CUDA-core body)
#define ATT_TC_MIN 256
#endif
static_assert(ATT_TC == 1 || ATT_TC == 2, "ATT_TC: 0, 1 (every row) or 2 (rows of ATT_TC_MIN keys or more)");
static_assert(ATT_RING >= 2 && !KV_ANY_Q8, "ATT_TC: f16 K/V through the ring");
constexpr int TC_SL = ATT_TILE / 16;         // 16-key slices of a tile: a warp's keys (TC_PAIR warps a slice)
constexpr int TC_PAIR = ATT_WARPS / TC_SL;    // 1, or 2: the slice's two warps share its scores and split D
static_assert(TC_SL * 16 == ATT_TILE && (TC_PAIR == 1 || TC_PAIR == 2) && TC_PAIR * TC_SL == ATT_WARPS,
              "ATT_TC: ATT_TILE = 16 ATT_WARPS (a warp a 16-key slice) or 8 ATT_WARPS (a warp pair a slice)");
static_assert(G <= 8 && D % 64 == 0 && D <= 128, "ATT_TC: up to 8 heads a block, head size 64 or 128");
static_assert(RING_BYTES >= TC_SL * 8 * D * 4, "ATT_TC: the slices' outputs are merged in the ring");
constexpr int TC_KS = D / 16;          // k-steps of the scores = 16-row tiles of the output
constexpr int TC_MT = TC_KS / TC_PAIR; // the output's 16-row tiles a warp accumulates

static __device__ __forceinline__ void tc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void tc_ldsm4t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ uint32_t tc_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
// (x0, x1) as f16 pairs hi = f16(x), lo = f16(x - hi), the lower element in the low half
static __device__ __forceinline__ void tc_split(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    const uint16_t h0 = f32_to_f16(x0), h1 = f32_to_f16(x1);
    const uint16_t l0 = f32_to_f16(x0 - f16_to_f32(h0)), l1 = f32_to_f16(x1 - f16_to_f32(h1));
    hi = (uint32_t)h0 | ((uint32_t)h1 << 16);
    lo = (uint32_t)l0 | ((uint32_t)l1 << 16);
}
#endif
