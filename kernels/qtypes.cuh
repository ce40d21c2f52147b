// qtypes.cuh — the quantized GGUF weight types as the q8 kernels see them (matvec.cu, gemm.cu).
//
// One struct per ggml type (TQ4_0 ... TIQ4_XS), over the "planes" layout of memra/ops/matvec.py
// (every block split into its bulk bytes, the quants, and its meta bytes, the scales; see
// matvec.cu's header). A unit is 64 consecutive-in-storage weights of one row, seen as 4
// groups of 16 elements (group g starts at element T::goff(u, g, nu) of the row); q8
// activations (q8.cuh: d, s per 32) multiply them. Per type:
//   BLK, BULK, META      elements / bulk bytes / meta bytes of one GGUF block
//   U                    one unit's weights in registers (quants and meta fields)
//   load(w, bulk, meta)  a row's unit u from global memory (bulk and meta row pointers)
//   moff(u), load_meta<L>(w, m, u)
//                        the meta part alone: m points at byte moff(u) of the row's meta, read
//                        through loader L (GLd: global, read-only; gemm.cu: shared memory)
//   NI, idots(w, x, ints) the unit's exact integer dot products with the activations x (4 x 16
//                        int8, group g = x[g]): NI = 2 sums of 32 elements (groups 0+1 and 2+3,
//                        one activation block each), Q6_K NI = 4 sums of 16 (one per group, each
//                        with its own weight scale). Integer sums are exact in any order, so a
//                        tensor-core kernel may compute the same ints with mma.
//   R, rowscal(w), accum_r(acc, r, ints, s), accum(acc, w, ints, s) = accum_r(acc, rowscal(w), ...)
//                        the float part: the running lane partial acc with this unit folded in
//                        (s[g]: the activation scale block of group g). rowscal extracts the
//                        unit's weight scalars (scales, mins as ints and floats: exact, or one
//                        explicit rounding for IQ4_XS), once per row, so a kernel holding many
//                        columns of one row reuses them; accum_r is the rest. Every float operation
//                        is an explicit-rounding intrinsic (__fmul_rn, __fadd_rn, __fmaf_rn):
//                        the compiler may neither contract nor reorder them, so every kernel
//                        that calls accum gets the same bits from the same ints. The roundings
//                        are the ones NVRTC compiled for matvec.cu's fused dot_q8 before the
//                        split (its FMA contractions, ptxas's included, written out), so the
//                        decode bits did not change.
//   deq(w, g, o)         group g as 16 floats (the f32 family of matvec.cu)
#pragma once
#include "common.cuh"
#include "q8.cuh"

#ifndef MV_WLOAD
#define MV_WLOAD 0
#endif
// 16-byte weight loads. MV_WLOAD 0: ld.global.nc; 1: ...L1::no_allocate (weights stream
// past L1, leaving it to the activations); 2: ld.global.cs (evict-first). A matvec.cu tunable.
MEMRA_DEVICE uint4 ld16(const uint8_t* p) {
#if MV_WLOAD == 1
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#elif MV_WLOAD == 2
    return __ldcs(reinterpret_cast<const uint4*>(p));
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}
MEMRA_DEVICE void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
MEMRA_DEVICE uint32_t ld4(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
MEMRA_DEVICE uint16_t ld2(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }
MEMRA_DEVICE uint32_t ld4u16(const uint8_t* p) {   // 4 bytes at a 2-byte aligned address
    return (uint32_t)ld2(p) | ((uint32_t)ld2(p + 2) << 16);
}
// The global read-only loader of the meta fields (what matvec.cu has always used).
struct GLd {
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return ld16(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return ld4(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return ld2(p); }
};
template <class L>
MEMRA_DEVICE uint32_t l4u16(const uint8_t* p) {   // 4 bytes at a 2-byte aligned address
    return L::l2(p) | (L::l2(p + 2) << 16);
}

MEMRA_DEVICE uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
MEMRA_DEVICE int lo4(uint32_t v) { return (int)(v & 0x0F0F0F0Fu); }
MEMRA_DEVICE int hi4(uint32_t v) { return (int)((v >> 4) & 0x0F0F0F0Fu); }
// four bits -> bit 4 of each byte (the 5th bit of Q5 quants)
MEMRA_DEVICE uint32_t spread4(uint32_t h) {
    return (((h & 1u)) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21)) << 4;
}
// per-byte v - k (bytes of v below 128, k below 128): no borrow crosses bytes
MEMRA_DEVICE int subb(uint32_t v, uint32_t k) { return (int)(((v | 0x80808080u) - k) ^ 0x80808080u); }
// int dot of 16 weights (4 words) with 16 activations
MEMRA_DEVICE int dot16(int a0, int a1, int a2, int a3, const int4& x, int acc) {
    acc = dp4a(a0, x.x, acc);
    acc = dp4a(a1, x.y, acc);
    acc = dp4a(a2, x.z, acc);
    return dp4a(a3, x.w, acc);
}
// 16 signed int8 in a uint4 -> floats
MEMRA_DEVICE void i8x16(const int* q, float* w, float scale, float mn) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[4 * i + j] = scale * (float)(int8_t)(q[i] >> (8 * j)) + mn;
    }
}

// ints[k] = sum over block k (16 qs bytes q[k]) of its 32 nibbles (0..15) times x: low
// nibbles with x[2k] (elements 0..15), high nibbles with x[2k+1] (16..31). Q4_0 and Q4_1.
MEMRA_DEVICE void idots_nib(const uint4 (&q)[2], const int4* x, int* ints) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint4& v = q[k];
        const int acc = dot16(lo4(v.x), lo4(v.y), lo4(v.z), lo4(v.w), x[2 * k], 0);
        ints[k] = dot16(hi4(v.x), hi4(v.y), hi4(v.z), hi4(v.w), x[2 * k + 1], acc);
    }
}

// Q4_1 / Q5_1: per block k, w = q d + m: the float part, r += s.d (d * q.x + m * s.s)
struct RDM { float d[2], m[2]; };
MEMRA_DEVICE RDM dm_pair(uint32_t dm0, uint32_t dm1) {
    return {{f16_to_f32((uint16_t)dm0), f16_to_f32((uint16_t)dm1)},
            {f16_to_f32((uint16_t)(dm0 >> 16)), f16_to_f32((uint16_t)(dm1 >> 16))}};
}
MEMRA_DEVICE float accum_dm(float acc, const float* d, const float* m, const int* ints, const Q8Scale* s) {
    float r = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const float in = __fmaf_rn(d[k], (float)ints[k], __fmul_rn(m[k], (float)s[2 * k].s));
        r = __fmaf_rn(in, s[2 * k].d, r);
    }
    return __fadd_rn(acc, r);
}

// ---------------------------------------------------------------------------------
// Q4_0 (2): block 32 = d(f16) | qs[16]; w = (q - 8) d. Unit = 2 blocks.
struct TQ4_0 {
    static constexpr int BLK = 32, BULK = 16, META = 2, NI = 2;
    struct U { uint4 q[2]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 4 * u; }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int) { w.d = L::l4(m); }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) { idots_nib(w.q, x, ints); }
    struct R { float d[2]; };
    static MEMRA_DEVICE R rowscal(const U& w) { return {{f16_to_f32((uint16_t)w.d), f16_to_f32((uint16_t)(w.d >> 16))}}; }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k)
            r = __fmaf_rn(__fmul_rn(q.d[k], s[2 * k].d), (float)(ints[k] - 8 * s[2 * k].s), r);
        return __fadd_rn(acc, r);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (g & 1) ? hi4(word(v, i)) : lo4(word(v, i));
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((int)((b >> (8 * j)) & 0xFF) - 8);
        }
    }
};

// Q4_1 (3): d, m (f16) | qs[16]; w = q d + m.
struct TQ4_1 {
    static constexpr int BLK = 32, BULK = 16, META = 4, NI = 2;
    struct U { uint4 q[2]; uint4 dm; };   // dm: d0 m0 d1 m1 as two words
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 8 * u; }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int) {
        w.dm.x = L::l4(m); w.dm.y = L::l4(m + 4);
    }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) { idots_nib(w.q, x, ints); }
    typedef RDM R;
    static MEMRA_DEVICE R rowscal(const U& w) { return dm_pair(w.dm.x, w.dm.y); }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        return accum_dm(acc, q.d, q.m, ints, s);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const uint32_t dm = (g >> 1) ? w.dm.y : w.dm.x;
        const float d = f16_to_f32((uint16_t)dm), m = f16_to_f32((uint16_t)(dm >> 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (g & 1) ? hi4(word(v, i)) : lo4(word(v, i));
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((b >> (8 * j)) & 0xFF) + m;
        }
    }
};

// Q5_0 (6): d | qh[4] | qs[16]; q = nibble | bit << 4 (bit e of qh for element e); w = (q - 16) d.
// Meta (d, qh) is 6 bytes: 2-byte aligned loads.
struct TQ5_0 {
    static constexpr int BLK = 32, BULK = 16, META = 6, NI = 2;
    struct U { uint4 q[2]; uint32_t h[2]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 12 * u; }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int) {
        w.d = L::l2(m) | (L::l2(m + 6) << 16);
        w.h[0] = l4u16<L>(m + 2); w.h[1] = l4u16<L>(m + 8);
    }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    // word i (0..3) of a block's qs: low (hi = 0, elements 4i..4i+3) or high nibbles
    // (hi = 1, elements 16 + 4i..) with their 5th bits from the block's qh word h
    static MEMRA_DEVICE int q5(uint32_t v, uint32_t h, int i, int hi) {
        return (hi ? hi4(v) : lo4(v)) | (int)spread4(h >> (16 * hi + 4 * i));
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            const uint32_t h = w.h[k];
            const int acc = dot16(q5(v.x, h, 0, 0), q5(v.y, h, 1, 0), q5(v.z, h, 2, 0), q5(v.w, h, 3, 0), x[2 * k], 0);
            ints[k] = dot16(q5(v.x, h, 0, 1), q5(v.y, h, 1, 1), q5(v.z, h, 2, 1), q5(v.w, h, 3, 1), x[2 * k + 1], acc);
        }
    }
    struct R { float d[2]; };
    static MEMRA_DEVICE R rowscal(const U& w) { return {{f16_to_f32((uint16_t)w.d), f16_to_f32((uint16_t)(w.d >> 16))}}; }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k)
            r = __fmaf_rn(__fmul_rn(q.d[k], s[2 * k].d), (float)(ints[k] - 16 * s[2 * k].s), r);
        return __fadd_rn(acc, r);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const int k = g >> 1;
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * k)));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (uint32_t)q5(word(w.q[k], i), w.h[k], i, g & 1);
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((int)((b >> (8 * j)) & 0xFF) - 16);
        }
    }
};

// Q5_1 (7): d, m | qh[4] | qs[16]; w = q d + m. Meta 8 bytes.
struct TQ5_1 {
    static constexpr int BLK = 32, BULK = 16, META = 8, NI = 2;
    struct U { uint4 q[2]; uint4 mh; };   // d0m0, qh0, d1m1, qh1
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 16 * u; }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int) { w.mh = L::l16(m); }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            const uint32_t h = k ? w.mh.w : w.mh.y;
            const int acc = dot16(TQ5_0::q5(v.x, h, 0, 0), TQ5_0::q5(v.y, h, 1, 0), TQ5_0::q5(v.z, h, 2, 0),
                                  TQ5_0::q5(v.w, h, 3, 0), x[2 * k], 0);
            ints[k] = dot16(TQ5_0::q5(v.x, h, 0, 1), TQ5_0::q5(v.y, h, 1, 1), TQ5_0::q5(v.z, h, 2, 1),
                            TQ5_0::q5(v.w, h, 3, 1), x[2 * k + 1], acc);
        }
    }
    typedef RDM R;
    static MEMRA_DEVICE R rowscal(const U& w) { return dm_pair(w.mh.x, w.mh.z); }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        return accum_dm(acc, q.d, q.m, ints, s);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const int k = g >> 1;
        const uint32_t h = k ? w.mh.w : w.mh.y;
        const uint32_t dm = k ? w.mh.z : w.mh.x;
        const float d = f16_to_f32((uint16_t)dm), m = f16_to_f32((uint16_t)(dm >> 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (uint32_t)TQ5_0::q5(word(w.q[k], i), h, i, g & 1);
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((b >> (8 * j)) & 0xFF) + m;
        }
    }
};

// Q8_0 (8): d | qs[32] int8; w = q d.
struct TQ8_0 {
    static constexpr int BLK = 32, BULK = 32, META = 2, NI = 2;
    struct U { uint4 q[4]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 4 * u; }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int) { w.d = L::l4(m); }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w.q[i] = ld16(bulk + 64 * u + 16 * i);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& a = w.q[2 * k];
            const uint4& b = w.q[2 * k + 1];
            const int acc = dot16((int)a.x, (int)a.y, (int)a.z, (int)a.w, x[2 * k], 0);
            ints[k] = dot16((int)b.x, (int)b.y, (int)b.z, (int)b.w, x[2 * k + 1], acc);
        }
    }
    struct R { float d[2]; };
    static MEMRA_DEVICE R rowscal(const U& w) { return {{f16_to_f32((uint16_t)w.d), f16_to_f32((uint16_t)(w.d >> 16))}}; }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) r = __fmaf_rn(__fmul_rn(q.d[k], s[2 * k].d), (float)ints[k], r);
        return __fadd_rn(acc, r);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
        const uint4& v = w.q[g];
        int q[4] = {(int)v.x, (int)v.y, (int)v.z, (int)v.w};
        i8x16(q, o, d, 0.f);
    }
};

// byte k of a 16-byte register value (run-time k; selects, no local memory)
MEMRA_DEVICE uint32_t byte_of(const uint4& v, int k) { return (word(v, k >> 2) >> (8 * (k & 3))) & 0xFFu; }

// K-quant 6-bit scale/min pair j of a Q4_K/Q5_K block (scales[12] at byte 4 of the meta)
MEMRA_DEVICE void scale_min_k4(const uint4& meta, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = byte_of(meta, 4 + j) & 63;
        mn = byte_of(meta, 8 + j) & 63;
    } else {
        const uint32_t a = byte_of(meta, 8 + j), lo = byte_of(meta, j), hi = byte_of(meta, 4 + j);
        sc = (a & 0xF) | ((lo >> 6) << 4);
        mn = (a >> 4) | ((hi >> 6) << 4);
    }
}

// The row scalars and float part of Q4_K and Q5_K: sub-blocks 2j (ints[0]) and 2j+1
// (ints[1]), w = d sc q - dmin m; ptxas contracted d * X - dmin * Y to fma(d, X, -(dmin * Y)).
struct RK4 { int sc0, m0, sc1, m1; float d, dmin; };
MEMRA_DEVICE RK4 rowscal_k4(const uint4& meta, int j) {
    RK4 q;
    scale_min_k4(meta, 2 * j, q.sc0, q.m0);
    scale_min_k4(meta, 2 * j + 1, q.sc1, q.m1);
    q.d = f16_to_f32((uint16_t)meta.x);
    q.dmin = f16_to_f32((uint16_t)(meta.x >> 16));
    return q;
}
MEMRA_DEVICE float accum_k4(float acc, const RK4& q, const int* ints, const Q8Scale* s) {
    const float a = __fmaf_rn(q.d, (float)(q.sc0 * ints[0]), -__fmul_rn(q.dmin, (float)(q.m0 * s[0].s)));
    const float b = __fmaf_rn(q.d, (float)(q.sc1 * ints[1]), -__fmul_rn(q.dmin, (float)(q.m1 * s[2].s)));
    return __fadd_rn(acc, __fmaf_rn(a, s[0].d, __fmul_rn(b, s[2].d)));
}

// Q4_K (12): block 256 = d, dmin (f16) | scales[12] | qs[128]. Sub-block i (32) has a 6-bit
// scale sc and min m: w = d sc q - dmin m. qs[32j..32j+31]: low nibbles = sub-block 2j,
// high = 2j+1. Unit u = block u/4, j = u%4: 32 bytes of qs, 64 contiguous elements.
struct TQ4_K {
    static constexpr int BLK = 256, BULK = 128, META = 16, NI = 2;
    struct U { uint4 q[2]; uint4 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 16 * (u >> 2); }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int u) { w.m = L::l16(m); w.j = u & 3; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
        const uint4& a = w.q[0];
        const uint4& b = w.q[1];
        const int accA = dot16(lo4(a.x), lo4(a.y), lo4(a.z), lo4(a.w), x[0], 0);
        ints[0] = dot16(lo4(b.x), lo4(b.y), lo4(b.z), lo4(b.w), x[1], accA);
        const int accB = dot16(hi4(a.x), hi4(a.y), hi4(a.z), hi4(a.w), x[2], 0);
        ints[1] = dot16(hi4(b.x), hi4(b.y), hi4(b.z), hi4(b.w), x[3], accB);
    }
    typedef RK4 R;
    static MEMRA_DEVICE R rowscal(const U& w) { return rowscal_k4(w.m, w.j); }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        return accum_k4(acc, q, ints, s);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        int sc, mn;
        scale_min_k4(w.m, 2 * w.j + (g >> 1), sc, mn);
        const float d = f16_to_f32((uint16_t)w.m.x) * (float)sc;
        const float m = f16_to_f32((uint16_t)(w.m.x >> 16)) * (float)mn;
        const uint4& v = w.q[g & 1];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (g >> 1) ? hi4(word(v, i)) : lo4(word(v, i));
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((b >> (8 * j)) & 0xFF) - m;
        }
    }
};

// Q5_K (13): d, dmin | scales[12] | qh[32] | qs[128]; bulk = qh + qs (160). qh[l] bit 2j /
// 2j+1 is the 5th bit of element l of sub-block 2j / 2j+1. w = d sc q - dmin m.
struct TQ5_K {
    static constexpr int BLK = 256, BULK = 160, META = 16, NI = 2;
    struct U { uint4 q[2]; uint4 h[2]; uint4 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 16 * (u >> 2); }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int u) { w.m = L::l16(m); w.j = u & 3; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        const uint8_t* blk = bulk + 160 * (u >> 2);
        w.j = u & 3;
        w.q[0] = ld16(blk + 32 + 32 * w.j); w.q[1] = ld16(blk + 48 + 32 * w.j);
        w.h[0] = ld16(blk); w.h[1] = ld16(blk + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    static MEMRA_DEVICE int q5(const U& w, int i, int hi) {   // word i (0..7) of the unit
        const uint32_t v = word(w.q[i >> 2], i & 3), h = word(w.h[i >> 2], i & 3);
        return (hi ? hi4(v) : lo4(v)) | (int)(((h >> (2 * w.j + hi)) & 0x01010101u) << 4);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
        const int accA = dot16(q5(w, 0, 0), q5(w, 1, 0), q5(w, 2, 0), q5(w, 3, 0), x[0], 0);
        ints[0] = dot16(q5(w, 4, 0), q5(w, 5, 0), q5(w, 6, 0), q5(w, 7, 0), x[1], accA);
        const int accB = dot16(q5(w, 0, 1), q5(w, 1, 1), q5(w, 2, 1), q5(w, 3, 1), x[2], 0);
        ints[1] = dot16(q5(w, 4, 1), q5(w, 5, 1), q5(w, 6, 1), q5(w, 7, 1), x[3], accB);
    }
    typedef RK4 R;
    static MEMRA_DEVICE R rowscal(const U& w) { return rowscal_k4(w.m, w.j); }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        return accum_k4(acc, q, ints, s);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        int sc, mn;
        scale_min_k4(w.m, 2 * w.j + (g >> 1), sc, mn);
        const float d = f16_to_f32((uint16_t)w.m.x) * (float)sc;
        const float m = f16_to_f32((uint16_t)(w.m.x >> 16)) * (float)mn;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t b = (uint32_t)q5(w, 4 * (g & 1) + i, g >> 1);
#pragma unroll
            for (int j = 0; j < 4; ++j) o[4 * i + j] = d * (float)((b >> (8 * j)) & 0xFF) - m;
        }
    }
};

// Q6_K (14): ql[128] | qh[64] | scales[16] (int8) | d; bulk = ql + qh (192), meta = scales +
// d (18 bytes, 2-byte aligned). Element 128n + 32g + l (n half, g quarter, l < 32):
// low 4 bits from ql[64n + l + 32(g&1)] (low nibble for g < 2, high for g >= 2), top 2 bits
// from qh[32n + l] bits 2g..2g+1; w = d scales[8n + l/16 + 2g] (q - 32).
// Unit u: block u/4, j = u%4 -> n = j/2, l in [16(j%2), 16(j%2) + 16): 48 bulk bytes,
// groups g = the four quarters (elements 128n + 32g + l0 + [0, 16)).
struct TQ6_K {
    static constexpr int BLK = 256, BULK = 192, META = 18, NI = 4;
    struct U { uint4 a, b, h; int sc; float d; };
    static MEMRA_DEVICE int goff(int u, int g, int) {
        const int j = u & 3;
        return 256 * (u >> 2) + 128 * (j >> 1) + 32 * g + 16 * (j & 1);
    }
    static MEMRA_DEVICE int moff(int u) { return 18 * (u >> 2); }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int u) {
        // scales[8n + (j&1) + 2g], g = 0..3: bytes (j&1) of the four 2-byte words from base
        const int j = u & 3, n = j >> 1;
        const uint8_t* base = m + 8 * n;
        const int sh = 8 * (j & 1);
        w.sc = (int)(((L::l2(base) >> sh) & 0xFFu) | (((L::l2(base + 2) >> sh) & 0xFFu) << 8) |
                     (((L::l2(base + 4) >> sh) & 0xFFu) << 16) | (((L::l2(base + 6) >> sh) & 0xFFu) << 24));
        w.d = f16_to_f32((uint16_t)L::l2(m + 16));
    }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        const int j = u & 3, n = j >> 1, l0 = 16 * (j & 1);
        const uint8_t* blk = bulk + 192 * (u >> 2);
        w.a = ld16(blk + 64 * n + l0);
        w.b = ld16(blk + 64 * n + 32 + l0);
        w.h = ld16(blk + 128 + 32 * n + l0);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    // word i of group g's 16 quants, q - 32 as signed bytes, from ql words lq and qh word h
    static MEMRA_DEVICE int q6w(uint32_t lq, uint32_t h, int g) {
        const uint32_t lo = (g >> 1) ? ((lq >> 4) & 0x0F0F0F0Fu) : (lq & 0x0F0F0F0Fu);
        const uint32_t hb = ((h >> (2 * g)) & 0x03030303u) << 4;
        return subb(lo | hb, 0x20202020u);
    }
    static MEMRA_DEVICE int q6(const U& w, int g, int i) {
        return q6w(word((g & 1) ? w.b : w.a, i), word(w.h, i), g);
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
#pragma unroll
        for (int g = 0; g < 4; ++g) ints[g] = dot16(q6(w, g, 0), q6(w, g, 1), q6(w, g, 2), q6(w, g, 3), x[g], 0);
    }
    struct R { int sc[4]; float d; };
    static MEMRA_DEVICE R rowscal(const U& w) {
        R q;
#pragma unroll
        for (int g = 0; g < 4; ++g) q.sc[g] = (int)(int8_t)(w.sc >> (8 * g));
        q.d = w.d;
        return q;
    }
    // NVRTC folded d into the lane partial: acc = fma(d, r, acc)
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int g = 0; g < 4; ++g) r = __fmaf_rn(s[g].d, (float)(q.sc[g] * ints[g]), r);
        return __fmaf_rn(q.d, r, acc);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        int q[4] = {q6(w, g, 0), q6(w, g, 1), q6(w, g, 2), q6(w, g, 3)};
        i8x16(q, o, w.d * (float)(int8_t)(w.sc >> (8 * g)), 0.f);
    }
};

// IQ4_XS (23): d | scales_h (u16) | scales_l[4] | qs[128]; sub-block ib (32): 6-bit scale
// ls = scales_l nibble ib | (scales_h bits 2ib..2ib+1) << 4, dl = d (ls - 32);
// w = dl kvalues[nibble], qs[16ib..16ib+15] low nibbles = elements 0..15, high = 16..31.
struct TIQ4_XS {
    static constexpr int BLK = 256, BULK = 128, META = 8, NI = 2;
    struct U { uint4 q[2]; uint2 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE int moff(int u) { return 8 * (u >> 2); }
    template <class L>
    static MEMRA_DEVICE void load_meta(U& w, const uint8_t* m, int u) { w.m = L::l8(m); w.j = u & 3; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        load_meta<GLd>(w, meta + moff(u), u);
    }
    // four nibbles (one per byte, low 4 bits) -> four table values (signed bytes); the table
    // {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113} sits in t0..t3 by bytes.
    static MEMRA_DEVICE int lut(uint32_t v) {
        const uint32_t t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
        const uint32_t x = v & 0x07070707u;
        const uint32_t t = x | (x >> 4);
        const uint32_t sel = (t & 0xFFu) | ((t >> 8) & 0xFF00u);
        const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
        const uint32_t m = ((v & 0x08080808u) >> 3) * 0xFFu;
        return (int)((hi & m) | (lo & ~m));
    }
    static MEMRA_DEVICE float dl(const U& w, int ib) {
        const uint32_t sl = (w.m.y >> (4 * ib)) & 0xFu;            // scales_l byte ib/2, nibble ib%2
        const uint32_t sh = ((w.m.x >> 16) >> (2 * ib)) & 3u;      // scales_h
        return __fmul_rn(f16_to_f32((uint16_t)w.m.x), (float)((int)(sl | (sh << 4)) - 32));
    }
    static MEMRA_DEVICE void idots(const U& w, const int4* x, int* ints) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            const int acc = dot16(lut(v.x), lut(v.y), lut(v.z), lut(v.w), x[2 * k], 0);
            ints[k] = dot16(lut(v.x >> 4), lut(v.y >> 4), lut(v.z >> 4), lut(v.w >> 4), x[2 * k + 1], acc);
        }
    }
    struct R { float dl[2]; };
    static MEMRA_DEVICE R rowscal(const U& w) { return {{dl(w, 2 * w.j), dl(w, 2 * w.j + 1)}}; }
    static MEMRA_DEVICE float accum_r(float acc, const R& q, const int* ints, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) r = __fmaf_rn(__fmul_rn(q.dl[k], s[2 * k].d), (float)ints[k], r);
        return __fadd_rn(acc, r);
    }
    static MEMRA_DEVICE float accum(float acc, const U& w, const int* ints, const Q8Scale* s) {
        return accum_r(acc, rowscal(w), ints, s);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const int sh = 4 * (g & 1);
        int q[4] = {lut(v.x >> sh), lut(v.y >> sh), lut(v.z >> sh), lut(v.w >> sh)};
        i8x16(q, o, dl(w, 2 * w.j + (g >> 1)), 0.f);
    }
};
