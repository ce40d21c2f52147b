// mv_f16.cu — experiment (experiments/f16_decode/README.md): the prompt rows' f16 arithmetic for 1..8 activation
// rows, as a decode matvec. Same entries and arguments as kernels/gemm_f16.cu (mv_f16 ~ gemm_f16, mv_f16_glu ~
// gemm_f16_glu), nb <= 8.
//
// Arithmetic. W dequantized by DeqCvt<T>::deq (qtypes.cuh's T::deq values without I2F) and rounded to f16 once
// (cvt.rn.f16x2.f32), x in f16; mma.sync m16n8k16 f16 x f16 -> f32 over the k16 steps in increasing k, one chain
// an output per MF_CHAINS-th of K: chain c covers k in [c K / C, (c + 1) K / C); the output is the left fold
// ((p_0 + p_1) + p_2) + ... (__fadd_rn), then the epilogue (glu: __fmul_rn(act(gate), up); plain: __fadd_rn(res,
// y) with a residual). With MF_CHAINS 1 this is gemm_f16.cu's arithmetic exactly (same A values at the same k, same
// B, same instruction, same order: the same bits, and session 51's probe found wgmma's the same bits too); with
// C > 1 it is another arithmetic, a function of (K, C) only, that the prompt GEMM would have to share.
//
// Work. A warp owns one m16 weight tile (16 weight rows; glu: 8 gate rows n then the same 8 up rows N + n,
// gemm_f16.cu's wrow) and one chain; MF_WARPS warps a block take consecutive (tile, chain) pairs, the C chains
// of a tile in one block (MF_WARPS % C == 0) so they fold through shared memory in chain order. Per 128-element
// stage of its chain a warp's lane l loads unit 2 s + (l >> 4) of tile row l & 15 (T::load, registers), MF_DEPTH
// stages ahead in a register ring; dequantizes it into the warp's f16 tile in shared memory (16 rows x (128 + 8)
// halves, gemm_f16.cu's row stride, at T::goff's columns), then 8 k16 steps of ldmatrix.x4 (A) and mma (B, the
// activation rows as columns gid < nb, loaded straight from global memory). No block barrier in the K loop.
//
// Tunables: MV_TYPE (required), MF_WARPS (4), MF_CHAINS (1), MF_DEPTH (4: stages of weights in flight a lane),
// MF_H2 (0; 1: Q4_0 and Q8_0 dequantize in f16x2 arithmetic — 1024 + q by the f16 exponent trick, one exact
// subtraction, then d (q - 8) by mul.rn.f16x2 (Q4_0) or d q + 0 by fma.rn.f16x2 (Q8_0): the exact product rounded
// once, as the f32 path's exact product then cvt.rn gives, -0 made +0 where T::deq's `+ 0.f` does — measured: the
// same bits; 2: also Q4_K / Q6_K in f16x2 with the scales rounded to f16 first — another arithmetic, see Unit<>),
// MF_XP (0; 1: x in fragment order, probe.py's xperm), MF_DF (0; 1: no shared tile, v4; 2: the weights as mma's
// B operand, 8 rows a warp, v7), MF_PF (0; a bulk L2 prefetch distance in stages, v5), MF_MINB (0;
// __launch_bounds__'s minimum blocks, v6).
// Launch: grid (ceil(T C / MF_WARPS)), T = Nw / 16 tiles (MF_DF 2: Nw / 8; Nw weight rows: N, or 2N for glu), block
// 32 MF_WARPS, dynamic shared memory 0 (static: MF_WARPS x 16 x 136 halves unless MF_DF, + MF_WARPS x 32 x 4 floats).
// K a multiple of 128 C and of the type's block, (K / C) of 128; bulk / meta / x 16-byte aligned.
//
// Versions (numbers: research/2026-12-07-session52/f16/, NVIDIA H100, the 8B gate+up Q4_K at one row; mv_q8 25.0 µs):
//  v1 (session 51) 62.5 µs at its best (8 warps, 4 chains; 64.2 at one chain), ~760 instructions a stage.
//  v2 (session 52) the lane map l & 15 / l >> 4: conflict-free stores.
//  v3 a unit's Q4_K scales once and branch-free (416 a stage with MF_XP); 58.3 µs, with MF_XP 54.9, MF_H2 2 52.4.
//  v4 MF_DF 1: the same bits (the mma's sum is slot-invariant), 70.9 µs (4x the per-unit work, 128-193 registers).
//  v5 MF_PF: 57.3 / 63.3 µs at 8 / 16 (slower: not the DRAM pattern); with v4 + MF_H2 2 50.2, the best so far.
//  v6 MF_MINB, v7 MF_DF 2: built, not run (latency at 16 warps an SM is the fit; these raise it to 24-48).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "deq_cvt.cuh"
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"

#ifndef MF_WARPS
#define MF_WARPS 4
#endif
#ifndef MF_CHAINS
#define MF_CHAINS 1
#endif
#ifndef MF_DEPTH
#define MF_DEPTH 4
#endif
#ifndef MF_H2
#define MF_H2 0
#endif
#ifndef MF_XP
#define MF_XP 0
#endif
#ifndef MF_DF
#define MF_DF 0
#endif
#ifndef MF_MINB
#define MF_MINB 0   // v6: __launch_bounds__'s minimum resident blocks an SM (0: none) — a register budget for occupancy
#endif
#if MF_MINB
#define MF_BOUNDS __launch_bounds__(32 * MF_WARPS, MF_MINB)
#else
#define MF_BOUNDS __launch_bounds__(32 * MF_WARPS)
#endif
#ifndef MF_PF
#define MF_PF 0   // v5: every MF_PF stages a bulk L2 prefetch of each tile row's next MF_PF stages of weight bytes
#endif
#if MF_DF && (MV_TYPE != 2 && MV_TYPE != 8 && MV_TYPE != 12 && MV_TYPE != 14)
#error "mv_f16.cu: MF_DF has slices for Q4_0, Q8_0, Q4_K and Q6_K only"
#endif
#if MF_DF && MF_XP
#error "mv_f16.cu: MF_DF reads x in its natural order (MF_XP 0)"
#endif
#if MF_DF == 2 && MF_PF
#error "mv_f16.cu: MF_DF 2 has no MF_PF"
#endif
static_assert(MF_WARPS % MF_CHAINS == 0, "MF: a tile's chains must share a block");
static_assert(MF_DEPTH >= 1 && MF_DEPTH <= 8, "MF_DEPTH 1..8");

constexpr int LDS = 136;   // halves a staged row (272 bytes: ldmatrix conflict-free, gemm_f16.cu's)

MEMRA_DEVICE uint32_t pack_h2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
MEMRA_DEVICE void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
MEMRA_DEVICE uint32_t h2_sub(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
MEMRA_DEVICE uint32_t h2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// bytes 0, 1 (sel 0x4140) or 2, 3 (0x4342) of b as the low bytes of two f16 with high byte 0x64: 1024 + byte
MEMRA_DEVICE uint32_t pair64(uint32_t b, uint32_t sel) { return __byte_perm(b, 0x6464u, sel); }
MEMRA_DEVICE uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
MEMRA_DEVICE uint32_t h2_bcast(float v) { return pack_h2(v, v); }   // f16(v) in both halves, round to nearest

// qtypes.cuh's scale_min_k4 integers for sub-block i (0..7) without its branches: with the unit's runtime j its byte
// select compiled to ~50 ISETP / SEL / BRA a 128-element stage (session 52's SASS); here one shift per scale word and
// a select on i >= 4. k4_dm_bf: deq_cvt.cuh's k4_dm on it (the same floats).
MEMRA_DEVICE void scale_min_k4_bf(const uint4& m4, int i, int& sc, int& mn) {
    const int sh = 8 * (i & 3);
    const uint32_t y = m4.y >> sh, z = m4.z >> sh, w = m4.w >> sh;   // scales[i & 3], [4 + (i & 3)], [8 + (i & 3)]
    const bool hi = i >= 4;
    sc = (int)(hi ? ((w & 0xFu) | ((y >> 2) & 0x30u)) : (y & 63u));
    mn = (int)(hi ? (((w >> 4) & 0xFu) | ((z >> 2) & 0x30u)) : (z & 63u));
}
MEMRA_DEVICE void k4_dm_bf(const uint4& m4, int j, int g, float& d, float& m) {
    int sc, mn;
    scale_min_k4_bf(m4, 2 * j + (g >> 1), sc, mn);
    d = f16_to_f32((uint16_t)m4.x) * (float)sc;
    m = f16_to_f32((uint16_t)(m4.x >> 16)) * (float)mn;
}

// A unit's dequant, group g (16 elements) at a time as 8 f16x2 words (elements 2i, 2i + 1 in word i): Unit<TT>(w)
// computes what the unit's groups share once (v3: the K-quants' scales were recomputed per group), then group(g, o).
// The default: DeqCvt<TT>::deq and cvt.rn pairs.
template <class TT> struct Unit {
    const typename TT::U& w;
    MEMRA_DEVICE explicit Unit(const typename TT::U& w_) : w(w_) {}
    MEMRA_DEVICE void group(int g, uint32_t (&o)[8]) const {
        float f[16];
        DeqCvt<TT>::deq(w, g, f);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = pack_h2(f[2 * i], f[2 * i + 1]);
    }
};
// Q4_K: the two sub-blocks' d sc and dmin m once a unit. MF_H2 < 2: DeqCvt<TQ4_K>::deq's float ops (T::deq's
// value); MF_H2 2: f16x2 with pre-rounded scales — NOT T::deq's value: s = f16(d sc), mn = f16(dmin m) (each the
// exact f32 product rounded once), w = fma.rn.f16x2(q, s, -mn) (q exact): two roundings more than T::deq's f16(d sc
// q - dmin m); priced here, the prompt GEMM would have to share it
template <> struct Unit<TQ4_K> {
    const TQ4_K::U& w;
    float d[2], m[2];
    MEMRA_DEVICE explicit Unit(const TQ4_K::U& w_) : w(w_) {
        k4_dm_bf(w.m, w.j, 0, d[0], m[0]);
        k4_dm_bf(w.m, w.j, 2, d[1], m[1]);
    }
    MEMRA_DEVICE void group(int g, uint32_t (&o)[8]) const {
#if MF_H2 == 2
        const uint32_t s2 = h2_bcast(d[g >> 1]), m2 = h2_bcast(m[g >> 1]) ^ 0x80008000u;
        const uint4& v = w.q[g & 1];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = (g >> 1) ? hi4(word(v, i)) : lo4(word(v, i));
            o[2 * i] = h2_fma(h2_sub(pair64(b, 0x4140), 0x64006400u), s2, m2);
            o[2 * i + 1] = h2_fma(h2_sub(pair64(b, 0x4342), 0x64006400u), s2, m2);
        }
#else
        // DeqCvt<TQ4_K>::deq's arithmetic with the unit's d, m
        const uint4& v = w.q[g & 1];
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (g >> 1) ? hi4(word(v, i)) : lo4(word(v, i));
        const float dd = d[g >> 1], mm = m[g >> 1];
        float f[16];
        cvt16<0>(b, f, [dd, mm](float x) { return dd * x - mm; });
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = pack_h2(f[2 * i], f[2 * i + 1]);
#endif
    }
};
#if MF_H2 == 2
// Q6_K in f16x2: s = f16(d sc) (the exact f32 product rounded once), w = fma.rn.f16x2(q - 32, s, +0) (q - 32 exact
// by the exponent trick; + 0 turns a -0 into +0 as T::deq's does) — NOT T::deq's f16(d sc (q - 32)): one rounding more
template <> struct Unit<TQ6_K> {
    const TQ6_K::U& w;
    MEMRA_DEVICE explicit Unit(const TQ6_K::U& w_) : w(w_) {}
    MEMRA_DEVICE void group(int g, uint32_t (&o)[8]) const {
        const uint32_t s2 = h2_bcast(w.d * (float)(int8_t)(w.sc >> (8 * g)));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lq = word((g & 1) ? w.b : w.a, i), h = word(w.h, i);
            const uint32_t lo = (g >> 1) ? ((lq >> 4) & 0x0F0F0F0Fu) : (lq & 0x0F0F0F0Fu);
            const uint32_t u = lo | (((h >> (2 * g)) & 0x03030303u) << 4);
            o[2 * i] = h2_fma(h2_sub(pair64(u, 0x4140), 0x64206420u), s2, 0u);   // (1024 + u) - 1056 = q - 32
            o[2 * i + 1] = h2_fma(h2_sub(pair64(u, 0x4342), 0x64206420u), s2, 0u);
        }
    }
};
#endif
#if MF_H2 >= 1
// Q4_0 and Q8_0 in f16x2, T::deq's value: 1024 + q by the exponent trick, one exact subtraction, then d (q - 8) by
// mul.rn.f16x2 (Q4_0) or d q + 0 by fma.rn.f16x2 (Q8_0): the exact product rounded once, as cvt.rn of the f32 path's
// exact product gives (session 52's first run: the same bits as MF_H2 0)
template <> struct Unit<TQ4_0> {
    const TQ4_0::U& w;
    MEMRA_DEVICE explicit Unit(const TQ4_0::U& w_) : w(w_) {}
    MEMRA_DEVICE void group(int g, uint32_t (&o)[8]) const {
        const uint4& v = w.q[g >> 1];
        const uint32_t dh = (w.d >> (16 * (g >> 1))) & 0xFFFFu, d2 = dh | (dh << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = (g & 1) ? hi4(word(v, i)) : lo4(word(v, i));
            o[2 * i] = h2_mul(d2, h2_sub(pair64(b, 0x4140), 0x64086408u));       // (1024 + q) - 1032 = q - 8
            o[2 * i + 1] = h2_mul(d2, h2_sub(pair64(b, 0x4342), 0x64086408u));
        }
    }
};
template <> struct Unit<TQ8_0> {
    const TQ8_0::U& w;
    MEMRA_DEVICE explicit Unit(const TQ8_0::U& w_) : w(w_) {}
    MEMRA_DEVICE void group(int g, uint32_t (&o)[8]) const {
        const uint4& v = w.q[g];
        const uint32_t dh = (w.d >> (16 * (g >> 1))) & 0xFFFFu, d2 = dh | (dh << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = word(v, i) ^ 0x80808080u;                           // q + 128
            o[2 * i] = h2_fma(d2, h2_sub(pair64(b, 0x4140), 0x64806480u), 0u);   // (1024 + q + 128) - 1152 = q
            o[2 * i + 1] = h2_fma(d2, h2_sub(pair64(b, 0x4342), 0x64806480u), 0u);
        }
    }
};
#endif
// MF_DF: a lane's slice of a unit — word t of each of its 16-byte pieces in the .x of T::U's uint4s (the rest
// zero), its meta as T::load_meta loads it: Unit<T>(w).group(g, o) then gives elements 4 t .. 4 t + 3 of group g in
// o[0], o[1] (its other words are dead code). Types whose dequant indexes more per-element data by word (Q5_0's,
// Q5_1's high bits) have no slice.
template <class TT> struct Slice;
template <> struct Slice<TQ4_K> {
    static MEMRA_DEVICE void load(TQ4_K::U& w, const uint8_t* bulk, const uint8_t* meta, int u, int t) {
        w = TQ4_K::U{};
        w.q[0].x = ld4(bulk + 32 * u + 4 * t); w.q[1].x = ld4(bulk + 32 * u + 16 + 4 * t);
        TQ4_K::load_meta<GLd>(w, meta + TQ4_K::moff(u), u);
    }
};
template <> struct Slice<TQ4_0> {
    static MEMRA_DEVICE void load(TQ4_0::U& w, const uint8_t* bulk, const uint8_t* meta, int u, int t) {
        w = TQ4_0::U{};
        w.q[0].x = ld4(bulk + 32 * u + 4 * t); w.q[1].x = ld4(bulk + 32 * u + 16 + 4 * t);
        TQ4_0::load_meta<GLd>(w, meta + TQ4_0::moff(u), u);
    }
};
template <> struct Slice<TQ8_0> {
    static MEMRA_DEVICE void load(TQ8_0::U& w, const uint8_t* bulk, const uint8_t* meta, int u, int t) {
        w = TQ8_0::U{};
#pragma unroll
        for (int i = 0; i < 4; ++i) w.q[i].x = ld4(bulk + 64 * u + 16 * i + 4 * t);
        TQ8_0::load_meta<GLd>(w, meta + TQ8_0::moff(u), u);
    }
};
template <> struct Slice<TQ6_K> {
    static MEMRA_DEVICE void load(TQ6_K::U& w, const uint8_t* bulk, const uint8_t* meta, int u, int t) {
        w = TQ6_K::U{};
        const int j = u & 3, n = j >> 1, l0 = 16 * (j & 1) + 4 * t;
        const uint8_t* blk = bulk + 192 * (u >> 2);
        w.a.x = ld4(blk + 64 * n + l0); w.b.x = ld4(blk + 64 * n + 32 + l0); w.h.x = ld4(blk + 128 + 32 * n + l0);
        TQ6_K::load_meta<GLd>(w, meta + TQ6_K::moff(u), u);
    }
};
// the stage column (0..127) of group g of the stage's unit ui (u = 2 s + ui): T::goff(u, g) - 128 s, a constant
template <class TT> struct SCol { static MEMRA_DEVICE constexpr int at(int ui, int g) { return 64 * ui + 16 * g; } };
template <> struct SCol<TQ6_K> { static MEMRA_DEVICE constexpr int at(int ui, int g) { return 32 * g + 16 * ui; } };

// v5 (MF_PF): the row's bulk bytes of stages [sp, sp + MF_PF) (whole blocks: K-quants hold 2 stages a block) as one
// cp.async.bulk.prefetch.L2 — one DRAM stream per row instead of the ring's 64-byte pieces of 16 rows a warp (session
// 52's second run: v3's 8B gate+up at 1.26 TB/s whatever its instruction count). 16-byte aligned and sized, inside
// the row (bulk rows are whole blocks: BULK a multiple of 16 for every type here)
MEMRA_DEVICE void prefetch_row(const uint8_t* row, int sp, int K) {
#if MF_PF
    const int b0 = (128 * sp) / T::BLK, b1 = min((128 * (sp + MF_PF) + T::BLK - 1) / T::BLK, K / T::BLK);
    if (b1 <= b0) return;
    const uint32_t o0 = (uint32_t)(b0 * T::BULK) & ~15u, o1 = ((uint32_t)(b1 * T::BULK) + 15u) & ~15u;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(row + o0), "r"(o1 - o0) : "memory");
#endif
}

// MF_DF 1 / 2: stage s's activation words of lane group tig in v4's permuted slots — per k16 step kk, elements k0 +
// 4 tig, + 1 (word 0) and k0 + 4 tig + 2, + 3 (word 1), one 8-byte load (zero where the lane's row is past nb)
MEMRA_DEVICE void x_slots(const uint16_t* xr, bool xcol, int s, int tig, uint32_t (&b)[8][2]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const uint2 v = xcol ? __ldg(reinterpret_cast<const uint2*>(xr + 128 * s + 16 * kk + 4 * tig))
                             : make_uint2(0u, 0u);
        b[kk][0] = v.x; b[kk][1] = v.y;
    }
}

MEMRA_DEVICE int wrow(int r, int n0, int N, bool glu) {
    if (!glu) return n0 + r;
    const int n = n0 + 8 * (r >> 4) + (r & 7);
    return (r & 8) ? N + n : n;
}

template <bool GLU>
MEMRA_DEVICE void mv_f16_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                              const uint16_t* __restrict__ x, float* y, const float* res, int N, int K, int nb,
                              int act) {
#if !MF_DF
    __shared__ __align__(16) uint16_t Ws[MF_WARPS][16 * LDS];
#endif
    __shared__ float part[MF_WARPS][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pair = blockIdx.x * MF_WARPS + warp;
    constexpr int TR = MF_DF == 2 ? 8 : 16;                       // weight rows a warp (v7: 8, the B operand's)
    const int tiles = (GLU ? 2 * N : N) / TR;
    const bool live = pair < tiles * MF_CHAINS;
    const int tile = live ? pair / MF_CHAINS : 0, chain = pair % MF_CHAINS;
    const int n0 = tile * (GLU ? TR / 2 : TR);
    const int KC = K / MF_CHAINS, S = KC / 128, s0 = chain * S;   // this chain's stages s0 .. s0 + S - 1
    const size_t bulk_row = (size_t)(K / T::BLK) * T::BULK, meta_row = (size_t)(K / T::BLK) * T::META;
#if MF_PF && MF_DF != 2
    if (live && lane < 16) prefetch_row(bulk + wrow(lane, n0, N, GLU) * bulk_row, s0, 128 * (s0 + S));
#endif
#if !MF_DF
    const int ur = lane & 15, uu = lane >> 4;   // v2: a store phase's 8 lanes on 8 rows, 8 bank groups
    const int gr = wrow(ur, n0, N, GLU);
    const uint8_t* ub = bulk + gr * bulk_row;
    const uint8_t* um = meta + gr * meta_row;
#endif
    const int gid = lane >> 2, tig = lane & 3;
    const bool xcol = gid < nb;
    const uint16_t* xr = x + (size_t)(xcol ? gid : 0) * K;
#if !MF_DF
    uint16_t* wt = Ws[warp];
    const uint32_t wt_s = (uint32_t)__cvta_generic_to_shared(wt);
#endif

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#if MF_DF == 2
    // v7 (MF_DF 2): the weights as mma's B operand (k16 x n8: 8 weight rows a warp, twice v4's warps), the activation
    // rows as A (16 x k16: rows gid < nb, rows gid + 8 zero). Lane (gid, tig) holds B's column gid = weight row
    // wrow8(gid) — its slice of the stage's two units, elements 4 tig .. 4 tig + 3 of each group in slots 2 tig, + 1
    // (b0) and 2 tig + 8, + 9 (b1), v4's permutation — and A's row gid: x[gid][k0 + 4 tig .. + 3] in the same slots
    // (a0, a2; a1 = a3 = 0). D[m][n] = sum_k x[m][k] w[n][k]: the same 16 exact products a step as W-as-A (the same
    // bits if the sum is the set's, as perm_probe.py's swap check asks). glu: weight rows 2 t / 2 t + 1 are the gate
    // / up rows of output n0 + t, so one lane holds both.
    const int wr = GLU ? ((gid & 1) ? N + n0 + (gid >> 1) : n0 + (gid >> 1)) : n0 + gid;
    const uint8_t* db = bulk + wr * bulk_row;
    const uint8_t* dm = meta + wr * meta_row;
    typename T::U ring[MF_DEPTH][2];
#pragma unroll
    for (int i = 0; i < MF_DEPTH; ++i)
#pragma unroll
        for (int ui = 0; ui < 2; ++ui)
            if (live && i < S) Slice<T>::load(ring[i][ui], db, dm, 2 * (s0 + i) + ui, tig);
    MEMRA_PDL_WAIT();
    auto stage = [&](int s, typename T::U (&w)[2]) {
        uint32_t xa[8][2];
        x_slots(xr, xcol, s, tig, xa);
        uint32_t bw[8][2];
#pragma unroll
        for (int ui = 0; ui < 2; ++ui) {
            const Unit<T> un(w[ui]);
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                uint32_t o[8];
                un.group(g, o);
                const int kk = SCol<T>::at(ui, g) / 16;
                bw[kk][0] = o[0];
                bw[kk][1] = o[1];
            }
        }
        if (s + MF_DEPTH < s0 + S) {
#pragma unroll
            for (int ui = 0; ui < 2; ++ui) Slice<T>::load(w[ui], db, dm, 2 * (s + MF_DEPTH) + ui, tig);
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const uint32_t a[4] = {xa[kk][0], 0u, xa[kk][1], 0u};
            mma_f16(acc, a, bw[kk][0], bw[kk][1]);
        }
    };
#elif MF_DF
    // v4 (MF_DF): no shared tile. Lane (gid, tig) dequantizes, of tile rows gid and gid + 8, its slice (word tig of
    // every 16-byte piece) of the stage's two units: elements 4 tig .. 4 tig + 3 of each group, straight into its A
    // fragment, slots 2 tig, 2 tig + 1 (elements 4 tig, + 1) and 2 tig + 8, 2 tig + 9 (4 tig + 2, + 3): a permutation of
    // k inside each k16 step, the B fragment loaded alike (x[k0 + 4 tig .. + 3], 8 bytes). The same bits as the tile
    // version only if the mma's sum does not depend on the slots (perm_probe.py)
    const uint8_t* db[2];
    const uint8_t* dm[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int gr2 = wrow(gid + 8 * r, n0, N, GLU);
        db[r] = bulk + gr2 * bulk_row;
        dm[r] = meta + gr2 * meta_row;
    }
    typename T::U ring[MF_DEPTH][2][2];
#pragma unroll
    for (int i = 0; i < MF_DEPTH; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int ui = 0; ui < 2; ++ui)
                if (live && i < S) Slice<T>::load(ring[i][r][ui], db[r], dm[r], 2 * (s0 + i) + ui, tig);
    MEMRA_PDL_WAIT();
    auto stage = [&](int s, typename T::U (&w)[2][2]) {
#if MF_PF
        if (lane < 16 && (s - s0) % MF_PF == 0 && s + MF_PF < s0 + S)
            prefetch_row(bulk + wrow(lane, n0, N, GLU) * bulk_row, s + MF_PF, 128 * (s0 + S));
#endif
        uint32_t b[8][2];
        x_slots(xr, xcol, s, tig, b);
        uint32_t a[8][4];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int ui = 0; ui < 2; ++ui) {
                const Unit<T> un(w[r][ui]);
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    uint32_t o[8];
                    un.group(g, o);
                    const int kk = SCol<T>::at(ui, g) / 16;
                    a[kk][r] = o[0];
                    a[kk][2 + r] = o[1];
                }
            }
        if (s + MF_DEPTH < s0 + S) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int ui = 0; ui < 2; ++ui) Slice<T>::load(w[r][ui], db[r], dm[r], 2 * (s + MF_DEPTH) + ui, tig);
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) mma_f16(acc, a[kk], b[kk][0], b[kk][1]);
    };
#else
    typename T::U ring[MF_DEPTH];
    // weights are never written by kernels: the ring fills before the PDL wait
#pragma unroll
    for (int i = 0; i < MF_DEPTH; ++i)
        if (live && i < S) T::load(ring[i], ub, um, 2 * (s0 + i) + uu, K / 64);
    MEMRA_PDL_WAIT();

    // one stage: dequantize ring slot i (stage s), refill it with stage s + MF_DEPTH, run the 8 k16 steps
    auto stage = [&](int s, typename T::U& w) {
#if MF_PF
        if (lane < 16 && (s - s0) % MF_PF == 0 && s + MF_PF < s0 + S)   // the next MF_PF stages after these
            prefetch_row(bulk + wrow(lane, n0, N, GLU) * bulk_row, s + MF_PF, 128 * (s0 + S));
#endif
        // the activation words of the stage first (their latency under the dequant)
        uint32_t b[8][2];
#if MF_XP
        // x in fragment order (probe.py's xperm): lane tig's 16 words of stage s are 64 contiguous bytes
        const uint4* xq = reinterpret_cast<const uint4*>(xr + 128 * s + 32 * tig);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 q = xcol ? __ldg(xq + i) : make_uint4(0u, 0u, 0u, 0u);
            b[2 * i][0] = q.x; b[2 * i][1] = q.y; b[2 * i + 1][0] = q.z; b[2 * i + 1][1] = q.w;
        }
#else
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const int k = 128 * s + 16 * kk + 2 * tig;
            b[kk][0] = xcol ? __ldg(reinterpret_cast<const unsigned int*>(xr + k)) : 0u;
            b[kk][1] = xcol ? __ldg(reinterpret_cast<const unsigned int*>(xr + k + 8)) : 0u;
        }
#endif
        const int u = 2 * s + uu;
        uint16_t* row = wt + ur * LDS;
        const Unit<T> un(w);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int c = T::goff(u, g, K / 64) - 128 * s;   // 0..127, a multiple of 16
            uint4 lo, hi;
            uint32_t h[8];
            un.group(g, h);
            lo.x = h[0]; lo.y = h[1]; lo.z = h[2]; lo.w = h[3];
            hi.x = h[4]; hi.y = h[5]; hi.z = h[6]; hi.w = h[7];
            *reinterpret_cast<uint4*>(row + c) = lo;
            *reinterpret_cast<uint4*>(row + c + 8) = hi;
        }
        if (s + MF_DEPTH < s0 + S) T::load(w, ub, um, 2 * (s + MF_DEPTH) + uu, K / 64);
        __syncwarp();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            uint32_t a[4];
            ldsm_x4(a, wt_s + 2 * ((lane & 15) * LDS + 16 * kk + 8 * (lane >> 4)));
            mma_f16(acc, a, b[kk][0], b[kk][1]);
        }
        __syncwarp();   // the tile is rewritten by the next stage
    };
#endif
    if (live) {
        int s = s0;
        for (; s + MF_DEPTH <= s0 + S; s += MF_DEPTH) {
#pragma unroll
            for (int i = 0; i < MF_DEPTH; ++i) stage(s + i, ring[i]);
        }
#pragma unroll
        for (int i = 0; i < MF_DEPTH; ++i)
            if (s + i < s0 + S) stage(s + i, ring[i]);
    }
    MEMRA_PDL_LAUNCH();

    // the chains of a tile meet in chain order (warps chain 0 .. C - 1 of one block)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][lane][e] = acc[e];
    __syncthreads();
    if (!live || chain != 0) return;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        v[e] = part[warp][lane][e];
#pragma unroll
        for (int c = 1; c < MF_CHAINS; ++c) v[e] = __fadd_rn(v[e], part[warp + c][lane][e]);
    }
#if MF_DF == 2
    // D layout: activation row gid (e 0, 1; rows gid + 8 are the zero rows), weight rows 2 tig, 2 tig + 1 of the warp's 8
    if (gid >= nb) return;
    if (GLU) {
        y[(size_t)gid * N + n0 + tig] = __fmul_rn(act == 2 ? gelu_tanh_f32(v[0]) : silu_f32(v[0]), v[1]);
    } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const size_t o = (size_t)gid * N + n0 + 2 * tig + e;
            y[o] = res ? __fadd_rn(res[o], v[e]) : v[e];
        }
    }
    return;
#endif
    // C layout: rows gid (e 0, 1) and gid + 8 (e 2, 3) of the tile, columns (activation rows) 2 tig, 2 tig + 1
    const int m = 2 * tig;
    if (GLU) {
        const int n = n0 + gid;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if (m + e >= nb) continue;
            y[(size_t)(m + e) * N + n] = __fmul_rn(act == 2 ? gelu_tanh_f32(v[e]) : silu_f32(v[e]), v[2 + e]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int mm = m + (e & 1), nn = n0 + gid + 8 * (e >> 1);
            if (mm >= nb) continue;
            const size_t o = (size_t)mm * N + nn;
            y[o] = res ? __fadd_rn(res[o], v[e]) : v[e];
        }
    }
}

extern "C" __global__ void MF_BOUNDS
mv_f16(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
       float* y, const float* res, int N, int K, int nb) {
    mv_f16_body<false>(bulk, meta, x, y, res, N, K, nb, 0);
}

extern "C" __global__ void MF_BOUNDS
mv_f16_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
           float* y, int N, int K, int nb, int act) {
    mv_f16_body<true>(bulk, meta, x, y, nullptr, N, K, nb, act);
}
