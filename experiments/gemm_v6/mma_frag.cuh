// mma_frag.cuh — the per-type tensor-core fragment code shared by gemm.cu and mvt.cu: the weight
// type T of MV_TYPE, the mma.sync wrappers, G<T> (a unit's 16-byte bulk chunks, the A fragments
// built from the words a lane holds, the row scalars) and mma_unit. Moved out of gemm.cu
// unchanged, so both kernels unpack a unit's weights with the same code (mvt.cu's exactness
// argument leans on it: its integer sums are gemm.cu's and mv_q8's).
//
// Include after common.cuh, q8.cuh and qtypes.cuh, with MV_TYPE defined. MMA_FRAG_VOLATILE (1)
// makes the mma asm statements volatile: gemm.cu keeps them so (its code as measured); mvt.cu
// defines 0 before including (free to schedule: the statements have no side effects).
#pragma once

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id) must be defined"
#endif
#ifndef MMA_FRAG_VOLATILE
#define MMA_FRAG_VOLATILE 1
#endif
#if MMA_FRAG_VOLATILE
#define MMA_FRAG_ASM asm volatile
#else
#define MMA_FRAG_ASM asm
#endif

#if MV_TYPE == 2
typedef TQ4_0 T;
#elif MV_TYPE == 3
typedef TQ4_1 T;
#elif MV_TYPE == 6
typedef TQ5_0 T;
#elif MV_TYPE == 7
typedef TQ5_1 T;
#elif MV_TYPE == 8
typedef TQ8_0 T;
#elif MV_TYPE == 12
typedef TQ4_K T;
#elif MV_TYPE == 13
typedef TQ5_K T;
#elif MV_TYPE == 14
typedef TQ6_K T;
#elif MV_TYPE == 23
typedef TIQ4_XS T;
#else
#error "mma_frag.cuh: unsupported MV_TYPE (quantized types only)"
#endif

// ---------------------------------------------------------------------------------
// mma.sync wrappers
// D = A (16x32, row) . B (32x8, col), s8 inputs, s32 result (zero accumulator).
// A regs: {row gid k 4tig.., row gid+8 k 4tig.., row gid k 16+4tig.., row gid+8 k 16+4tig..};
// B regs: {k 4tig.., k 16+4tig..} of column gid; D: {(gid, 2tig), (gid, 2tig+1), (gid+8, 2tig),
// (gid+8, 2tig+1)}.
MEMRA_DEVICE void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int z = 0;
    MMA_FRAG_ASM("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(z));
}
// m16n8k16: A regs {row gid k 4tig.., row gid+8 k 4tig..}, B reg {k 4tig..}; D as above.
MEMRA_DEVICE void mma_k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b0) {
    const int z = 0;
    MMA_FRAG_ASM("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5}, {%6}, {%7, %7, %7, %7};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(z));
}

// ---------------------------------------------------------------------------------
// Per-type staging and fragment unpacking. For unit u of a row:
//  NCH 16-byte bulk chunks at byte chunk(u, c) of the row's bulk (staged as WB = 16 NCH
//  bytes; WBS = padded smem stride, an odd multiple of 16 so ldmatrix rows hit distinct
//  banks), a meta window of MW bytes at the 4-byte aligned start of moff(u) (copied in MCP
//  byte pieces; MWS smem stride), SB activation scale blocks per column.
//  NK mma k-chunks (2 of 32, or Q6_K 4 of 16) per unit; afrag builds chunk k's A registers
//  for rows gid (rh = 0) and gid + 8 (rh = 1) from q[c][rh] (ldmatrix: word tig of chunk c)
//  and the rows' meta w[rh]; B registers of chunk k are words tig of activation chunks
//  BX0(k) (and BX0(k) + 1 for k32) of column gid.
template <class TT> struct G;

// Q4_K / Q5_K row scalars for sub-blocks 2j, 2j+1 with j = u & 3, the same for the whole
// step: a uniform switch with constant byte positions (the integers equal scale_min_k4's;
// d, dmin are the same exact conversions), instead of run-time byte selects per row.
MEMRA_DEVICE RK4 rowscal_k4_uniform(const uint4& m, int j) {
    RK4 q;
    const uint32_t s0 = m.y, s1 = m.z, s2 = m.w;   // scales[0..3], [4..7], [8..11]
    switch (j) {
    case 0:
        q.sc0 = s0 & 63; q.m0 = s1 & 63; q.sc1 = (s0 >> 8) & 63; q.m1 = (s1 >> 8) & 63; break;
    case 1:
        q.sc0 = (s0 >> 16) & 63; q.m0 = (s1 >> 16) & 63; q.sc1 = (s0 >> 24) & 63; q.m1 = (s1 >> 24) & 63; break;
    case 2:   // sub-blocks 4, 5: a = scales[8 + i], lo = scales[i], hi = scales[4 + i], i = 0, 1
        q.sc0 = (s2 & 0xF) | (((s0 >> 6) & 3) << 4); q.m0 = ((s2 >> 4) & 0xF) | (((s1 >> 6) & 3) << 4);
        q.sc1 = ((s2 >> 8) & 0xF) | (((s0 >> 14) & 3) << 4); q.m1 = ((s2 >> 12) & 0xF) | (((s1 >> 14) & 3) << 4);
        break;
    default:  // sub-blocks 6, 7: i = 2, 3
        q.sc0 = ((s2 >> 16) & 0xF) | (((s0 >> 22) & 3) << 4); q.m0 = ((s2 >> 20) & 0xF) | (((s1 >> 22) & 3) << 4);
        q.sc1 = ((s2 >> 24) & 0xF) | (((s0 >> 30) & 3) << 4); q.m1 = ((s2 >> 28) & 0xF) | (((s1 >> 30) & 3) << 4);
        break;
    }
    q.d = f16_to_f32((uint16_t)m.x);
    q.dmin = f16_to_f32((uint16_t)(m.x >> 16));
    return q;
}
// G<T>::rowscal: the row scalars the gemm uses (T::rowscal unless a type has a faster form)
#define MMA_ROWSCAL_DEFAULT(TT) static MEMRA_DEVICE TT::R rowscal(const TT::U& w) { return TT::rowscal(w); }

template <> struct G<TQ4_0> {
    MMA_ROWSCAL_DEFAULT(TQ4_0)
    static constexpr int NCH = 2, WBS = 48, MW = 4, MCP = 4, MWS = 4, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    // block k = chunk k: low nibbles = elements 0..15, high = 16..31
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ4_0::U (&)[2], int, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = lo4(q[k][0]); a[k][1] = lo4(q[k][1]);
            a[k][2] = hi4(q[k][0]); a[k][3] = hi4(q[k][1]);
        }
    }
};
template <> struct G<TQ4_1> {
    MMA_ROWSCAL_DEFAULT(TQ4_1)
    static constexpr int NCH = 2, WBS = 48, MW = 8, MCP = 8, MWS = 8, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ4_1::U (&)[2], int, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = lo4(q[k][0]); a[k][1] = lo4(q[k][1]);
            a[k][2] = hi4(q[k][0]); a[k][3] = hi4(q[k][1]);
        }
    }
};
template <> struct G<TQ5_0> {
    MMA_ROWSCAL_DEFAULT(TQ5_0)
    static constexpr int NCH = 2, WBS = 48, MW = 12, MCP = 4, MWS = 12, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ5_0::U (&w)[2], int tig, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = TQ5_0::q5(q[k][0], w[0].h[k], tig, 0); a[k][1] = TQ5_0::q5(q[k][1], w[1].h[k], tig, 0);
            a[k][2] = TQ5_0::q5(q[k][0], w[0].h[k], tig, 1); a[k][3] = TQ5_0::q5(q[k][1], w[1].h[k], tig, 1);
        }
    }
};
template <> struct G<TQ5_1> {
    MMA_ROWSCAL_DEFAULT(TQ5_1)
    static constexpr int NCH = 2, WBS = 48, MW = 16, MCP = 16, MWS = 16, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ5_1::U (&w)[2], int tig, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint32_t h0 = k ? w[0].mh.w : w[0].mh.y, h1 = k ? w[1].mh.w : w[1].mh.y;
            a[k][0] = TQ5_0::q5(q[k][0], h0, tig, 0); a[k][1] = TQ5_0::q5(q[k][1], h1, tig, 0);
            a[k][2] = TQ5_0::q5(q[k][0], h0, tig, 1); a[k][3] = TQ5_0::q5(q[k][1], h1, tig, 1);
        }
    }
};
template <> struct G<TQ8_0> {
    MMA_ROWSCAL_DEFAULT(TQ8_0)
    static constexpr int NCH = 4, WBS = 80, MW = 4, MCP = 4, MWS = 4, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 64 * u + 16 * c; }
    // block k = chunks 2k (elements 0..15) and 2k+1 (16..31)
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ8_0::U (&)[2], int, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = q[2 * k][0]; a[k][1] = q[2 * k][1];
            a[k][2] = q[2 * k + 1][0]; a[k][3] = q[2 * k + 1][1];
        }
    }
};
template <> struct G<TQ4_K> {
    static MEMRA_DEVICE RK4 rowscal(const TQ4_K::U& w) { return rowscal_k4_uniform(w.m, w.j); }
    static constexpr int NCH = 2, WBS = 48, MW = 16, MCP = 16, MWS = 16, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    // sub-block 2j (k = 0): low nibbles of the unit's 32 bytes; 2j+1 (k = 1): high nibbles
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ4_K::U (&)[2], int, uint32_t (&a)[NK][4]) {
        a[0][0] = lo4(q[0][0]); a[0][1] = lo4(q[0][1]); a[0][2] = lo4(q[1][0]); a[0][3] = lo4(q[1][1]);
        a[1][0] = hi4(q[0][0]); a[1][1] = hi4(q[0][1]); a[1][2] = hi4(q[1][0]); a[1][3] = hi4(q[1][1]);
    }
};
template <> struct G<TQ5_K> {
    static MEMRA_DEVICE RK4 rowscal(const TQ5_K::U& w) { return rowscal_k4_uniform(w.m, w.j); }
    // chunks 0, 1: the unit's 32 qs bytes; 2, 3: the block's 32 qh bytes
    static constexpr int NCH = 4, WBS = 80, MW = 16, MCP = 16, MWS = 16, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) {
        return 160 * (u >> 2) + (c < 2 ? 32 + 32 * (u & 3) + 16 * c : 16 * (c - 2));
    }
    static MEMRA_DEVICE int q5(uint32_t v, uint32_t h, int sh, int hi) {
        return (hi ? hi4(v) : lo4(v)) | (int)(((h >> sh) & 0x01010101u) << 4);
    }
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ5_K::U (&w)[2], int, uint32_t (&a)[NK][4]) {
        const int j = w[0].j;   // u & 3, the same for every row
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = q5(q[0][0], q[2][0], 2 * j + k, k); a[k][1] = q5(q[0][1], q[2][1], 2 * j + k, k);
            a[k][2] = q5(q[1][0], q[3][0], 2 * j + k, k); a[k][3] = q5(q[1][1], q[3][1], 2 * j + k, k);
        }
    }
};
template <> struct G<TQ6_K> {
    MMA_ROWSCAL_DEFAULT(TQ6_K)
    // chunks: 0 = ql low half (a), 1 = ql high half (b), 2 = qh (h); k-chunk = group g (k16)
    static constexpr int NCH = 3, WBS = 48, MW = 20, MCP = 4, MWS = 20, SB = 4, NK = 4;
    static MEMRA_DEVICE int chunk(int u, int c) {
        const int j = u & 3, n = j >> 1, l0 = 16 * (j & 1);
        return 192 * (u >> 2) + (c == 0 ? 64 * n + l0 : c == 1 ? 64 * n + 32 + l0 : 128 + 32 * n + l0);
    }
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TQ6_K::U (&)[2], int, uint32_t (&a)[NK][2]) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            a[g][0] = TQ6_K::q6w(q[g & 1][0], q[2][0], g);
            a[g][1] = TQ6_K::q6w(q[g & 1][1], q[2][1], g);
        }
    }
};
template <> struct G<TIQ4_XS> {
    MMA_ROWSCAL_DEFAULT(TIQ4_XS)
    static constexpr int NCH = 2, WBS = 48, MW = 8, MCP = 8, MWS = 8, SB = 2, NK = 2;
    static MEMRA_DEVICE int chunk(int u, int c) { return 32 * u + 16 * c; }
    // sub-block 2j + k = chunk k: low nibbles = elements 0..15, high = 16..31
    static MEMRA_DEVICE void afrag(const uint32_t (&q)[NCH][2], const TIQ4_XS::U (&)[2], int, uint32_t (&a)[NK][4]) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            a[k][0] = TIQ4_XS::lut(q[k][0]); a[k][1] = TIQ4_XS::lut(q[k][1]);
            a[k][2] = TIQ4_XS::lut(q[k][0] >> 4); a[k][3] = TIQ4_XS::lut(q[k][1] >> 4);
        }
    }
};

typedef G<T> GT;
constexpr bool K16 = T::NI == 4;                 // Q6_K: one m16n8k16 per 16-element group
constexpr int AR = K16 ? 2 : 4;                  // A registers per k-chunk
static_assert(T::NI == GT::NK, "integer sums per unit");

// chunk k's products: m16n8k16 on group k (Q6_K), else m16n8k32 on activation chunks 2k, 2k+1
MEMRA_DEVICE void mma_unit(int (&d)[4], const uint32_t (&a)[2], const uint32_t (&x)[4], int k) { mma_k16(d, a, x[k]); }
MEMRA_DEVICE void mma_unit(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&x)[4], int k) {
    mma_k32(d, a, x[2 * k], x[2 * k + 1]);
}
