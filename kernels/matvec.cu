// matvec.cu — decode matrix-vector products on quantized GGUF weights.
//
// Computes y[b, n] = sum_k W[n, k] * x[b, k] for a small batch b < nb <= MV_B (decode), W in
// one GGUF type (MV_TYPE, one module per type), each weight byte read once per launch.
//
// Weight layout ("planes", a byte-exact re-layout made at load by memra/ops/matvec.py):
// every GGUF block is split into its bulk bytes (quants: qs/qh/ql, a multiple of 16 bytes)
// and its meta bytes (d, m, scales: the rest, in block order). The bulk plane holds
// rows x blocks x BULK bytes, the meta plane rows x blocks x META bytes. Bulk rows are
// 16-byte aligned, so the quants stream in with 16-byte loads.
//
// A lane's unit of work is 64 consecutive-in-storage weights of one row, seen as 4 groups
// of 16 elements (group g starts at element T::goff(u, g, nu) of the row). Lanes of a warp take
// units lane, lane+32, ... of the row(s) the warp owns; the warp sum gives the row.
//
// Two families, same weights:
//  mv_q8*   activations quantized to int8 per 32 (q8.cu/q8.cuh: d = amax/127,
//           q = rint(x/d), s = sum q) and integer dot products (dp4a). Reference: float64
//           dequant(W) @ (d*q), matching to float rounding.
//  mv_f32*  activations in f32, weights dequantized in registers, f32 FMAs. Reference:
//           float64 dequant(W) @ x. Float weights (F16/BF16/F32) use only this family.
// Entry points per module: mv_q8, mv_q8_glu, mv_f32, mv_f32_glu; float types have no mv_q8*,
// quantized types have mv_f32* only at MV_B = 1 (at batch the f32 family is ALU-bound:
// every dequantized weight feeds B FMAs; the q8 family is the batch path).
// Variants: MV_B (batch bucket, 1/4/8) with a run-time nb <= MV_B; _glu: W holds 2N rows
// [gate; up] and y[b, n] = act(gate_n . x) * (up_n . x), act 1 = SiLU, 2 = GELU-tanh.
// res (nullable): y = res + W x (residual add; res may alias y).
// Batch invariance: a row's reduction order depends only on K and MV_KSPLIT (lane units,
// fixed butterfly, KSPLIT partials summed in order), never on nb, MV_B or MV_ROWS.
//
// Tunables (-D): MV_TYPE (ggml type id, required), MV_B (1), MV_NWARPS warps per block (4),
// MV_ROWS rows per warp (1), MV_KSPLIT warps sharing one row (1; divides MV_NWARPS),
// MV_UNROLL unroll of the unit loop (1), MV_WLOAD weight load flavour (0; see ld16),
// MV_PREFETCH (0) loads the next unit's weights before using the current ones (more
// registers; MV_UNROLL 2 lets the compiler hoist the same loads),
// MV_PDL_TRIGGER (1) lets the next PDL-launched kernel start once every block is running
// (before MEMRA_PDL_WAIT the first unit's weights are loaded, or with MV_PREFETCH 0
// prefetched into L2: weights are never written by kernels),
// MEMRA_CANARY=1 drops unit 1 of every row (a deliberately wrong variant that kernel-check
// must catch).
// MV_XSMEM (0; q8 family) stages the block's activations in shared memory, tile-interleaved
// (the strided activation loads, not DRAM, bound the plain q8 kernel: see research/matvec.md).
// Launch: grid = ceil(N / (MV_ROWS * MV_NWARPS / MV_KSPLIT)), block = 32 * MV_NWARPS,
// dynamic shared memory 0, or with MV_XSMEM nb * ceil(K / 2048) * 3072 bytes.
// K must be a multiple of 64 (and of the type's block size).
#include "common.cuh"
#include "q8.cuh"

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id) must be defined"
#endif
#ifndef MV_NWARPS
#define MV_NWARPS 4
#endif
#ifndef MV_ROWS
#define MV_ROWS 1
#endif
#ifndef MV_KSPLIT
#define MV_KSPLIT 1
#endif
#ifndef MV_UNROLL
#define MV_UNROLL 1
#endif
#ifndef MV_PREFETCH
#define MV_PREFETCH 0
#endif
#ifndef MV_XSMEM
#define MV_XSMEM 0
#endif
#ifndef MV_PDL_TRIGGER
#define MV_PDL_TRIGGER 1
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif

#if MV_NWARPS % MV_KSPLIT != 0
#error "MV_KSPLIT must divide MV_NWARPS"
#endif


#ifndef MV_WLOAD
#define MV_WLOAD 0
#endif
// 16-byte weight loads. MV_WLOAD 0: ld.global.nc; 1: ...L1::no_allocate (weights stream
// past L1, leaving it to the activations); 2: ld.global.cs (evict-first).
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

// ---------------------------------------------------------------------------------
// Q4_0 (2): block 32 = d(f16) | qs[16]; w = (q - 8) d. Unit = 2 blocks.
struct TQ4_0 {
    static constexpr int BLK = 32, BULK = 16, META = 2;
    struct U { uint4 q[2]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        w.d = ld4(meta + 4 * u);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            int acc = dot16(lo4(v.x), lo4(v.y), lo4(v.z), lo4(v.w), x[2 * k], 0);
            acc = dot16(hi4(v.x), hi4(v.y), hi4(v.z), hi4(v.w), x[2 * k + 1], acc);
            acc -= 8 * s[2 * k].s;
            r += f16_to_f32((uint16_t)(w.d >> (16 * k))) * s[2 * k].d * (float)acc;
        }
        return r;
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
    static constexpr int BLK = 32, BULK = 16, META = 4;
    struct U { uint4 q[2]; uint4 dm; };   // dm: d0 m0 d1 m1 as two words
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        w.dm.x = ld4(meta + 8 * u); w.dm.y = ld4(meta + 8 * u + 4);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            int acc = dot16(lo4(v.x), lo4(v.y), lo4(v.z), lo4(v.w), x[2 * k], 0);
            acc = dot16(hi4(v.x), hi4(v.y), hi4(v.z), hi4(v.w), x[2 * k + 1], acc);
            const uint32_t dm = k ? w.dm.y : w.dm.x;
            r += s[2 * k].d * (f16_to_f32((uint16_t)dm) * (float)acc
                               + f16_to_f32((uint16_t)(dm >> 16)) * (float)s[2 * k].s);
        }
        return r;
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
    static constexpr int BLK = 32, BULK = 16, META = 6;
    struct U { uint4 q[2]; uint32_t h[2]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        const uint8_t* m = meta + 12 * u;
        w.d = (uint32_t)ld2(m) | ((uint32_t)ld2(m + 6) << 16);
        w.h[0] = ld4u16(m + 2); w.h[1] = ld4u16(m + 8);
    }
    static MEMRA_DEVICE int q5(uint32_t v, uint32_t h, int i, int hi) {
        return (hi ? hi4(v) : lo4(v)) | (int)spread4(h >> (16 * hi + 4 * i));
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            const uint32_t h = w.h[k];
            int acc = dot16(q5(v.x, h, 0, 0), q5(v.y, h, 1, 0), q5(v.z, h, 2, 0), q5(v.w, h, 3, 0), x[2 * k], 0);
            acc = dot16(q5(v.x, h, 0, 1), q5(v.y, h, 1, 1), q5(v.z, h, 2, 1), q5(v.w, h, 3, 1), x[2 * k + 1], acc);
            acc -= 16 * s[2 * k].s;
            r += f16_to_f32((uint16_t)(w.d >> (16 * k))) * s[2 * k].d * (float)acc;
        }
        return r;
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
    static constexpr int BLK = 32, BULK = 16, META = 8;
    struct U { uint4 q[2]; uint4 mh; };   // d0m0, qh0, d1m1, qh1
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        w.mh = ld16(meta + 16 * u);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            const uint32_t h = k ? w.mh.w : w.mh.y;
            const uint32_t dm = k ? w.mh.z : w.mh.x;
            int acc = dot16(TQ5_0::q5(v.x, h, 0, 0), TQ5_0::q5(v.y, h, 1, 0), TQ5_0::q5(v.z, h, 2, 0),
                            TQ5_0::q5(v.w, h, 3, 0), x[2 * k], 0);
            acc = dot16(TQ5_0::q5(v.x, h, 0, 1), TQ5_0::q5(v.y, h, 1, 1), TQ5_0::q5(v.z, h, 2, 1),
                        TQ5_0::q5(v.w, h, 3, 1), x[2 * k + 1], acc);
            r += s[2 * k].d * (f16_to_f32((uint16_t)dm) * (float)acc
                               + f16_to_f32((uint16_t)(dm >> 16)) * (float)s[2 * k].s);
        }
        return r;
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
    static constexpr int BLK = 32, BULK = 32, META = 2;
    struct U { uint4 q[4]; uint32_t d; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w.q[i] = ld16(bulk + 64 * u + 16 * i);
        w.d = ld4(meta + 4 * u);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& a = w.q[2 * k];
            const uint4& b = w.q[2 * k + 1];
            int acc = dot16((int)a.x, (int)a.y, (int)a.z, (int)a.w, x[2 * k], 0);
            acc = dot16((int)b.x, (int)b.y, (int)b.z, (int)b.w, x[2 * k + 1], acc);
            r += f16_to_f32((uint16_t)(w.d >> (16 * k))) * s[2 * k].d * (float)acc;
        }
        return r;
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

// Q4_K (12): block 256 = d, dmin (f16) | scales[12] | qs[128]. Sub-block i (32) has a 6-bit
// scale sc and min m: w = d sc q - dmin m. qs[32j..32j+31]: low nibbles = sub-block 2j,
// high = 2j+1. Unit u = block u/4, j = u%4: 32 bytes of qs, 64 contiguous elements.
struct TQ4_K {
    static constexpr int BLK = 256, BULK = 128, META = 16;
    struct U { uint4 q[2]; uint4 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        w.m = ld16(meta + 16 * (u >> 2));
        w.j = u & 3;
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        const uint4& a = w.q[0];
        const uint4& b = w.q[1];
        int accA = dot16(lo4(a.x), lo4(a.y), lo4(a.z), lo4(a.w), x[0], 0);
        accA = dot16(lo4(b.x), lo4(b.y), lo4(b.z), lo4(b.w), x[1], accA);
        int accB = dot16(hi4(a.x), hi4(a.y), hi4(a.z), hi4(a.w), x[2], 0);
        accB = dot16(hi4(b.x), hi4(b.y), hi4(b.z), hi4(b.w), x[3], accB);
        int sc0, m0, sc1, m1;
        scale_min_k4(w.m, 2 * w.j, sc0, m0);
        scale_min_k4(w.m, 2 * w.j + 1, sc1, m1);
        const float d = f16_to_f32((uint16_t)w.m.x), dmin = f16_to_f32((uint16_t)(w.m.x >> 16));
        return s[0].d * (d * (float)(sc0 * accA) - dmin * (float)(m0 * s[0].s))
             + s[2].d * (d * (float)(sc1 * accB) - dmin * (float)(m1 * s[2].s));
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
    static constexpr int BLK = 256, BULK = 160, META = 16;
    struct U { uint4 q[2]; uint4 h[2]; uint4 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        const uint8_t* blk = bulk + 160 * (u >> 2);
        w.j = u & 3;
        w.q[0] = ld16(blk + 32 + 32 * w.j); w.q[1] = ld16(blk + 48 + 32 * w.j);
        w.h[0] = ld16(blk); w.h[1] = ld16(blk + 16);
        w.m = ld16(meta + 16 * (u >> 2));
    }
    static MEMRA_DEVICE int q5(const U& w, int i, int hi) {   // word i (0..7) of the unit
        const uint32_t v = word(w.q[i >> 2], i & 3), h = word(w.h[i >> 2], i & 3);
        return (hi ? hi4(v) : lo4(v)) | (int)(((h >> (2 * w.j + hi)) & 0x01010101u) << 4);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        int accA = dot16(q5(w, 0, 0), q5(w, 1, 0), q5(w, 2, 0), q5(w, 3, 0), x[0], 0);
        accA = dot16(q5(w, 4, 0), q5(w, 5, 0), q5(w, 6, 0), q5(w, 7, 0), x[1], accA);
        int accB = dot16(q5(w, 0, 1), q5(w, 1, 1), q5(w, 2, 1), q5(w, 3, 1), x[2], 0);
        accB = dot16(q5(w, 4, 1), q5(w, 5, 1), q5(w, 6, 1), q5(w, 7, 1), x[3], accB);
        int sc0, m0, sc1, m1;
        scale_min_k4(w.m, 2 * w.j, sc0, m0);
        scale_min_k4(w.m, 2 * w.j + 1, sc1, m1);
        const float d = f16_to_f32((uint16_t)w.m.x), dmin = f16_to_f32((uint16_t)(w.m.x >> 16));
        return s[0].d * (d * (float)(sc0 * accA) - dmin * (float)(m0 * s[0].s))
             + s[2].d * (d * (float)(sc1 * accB) - dmin * (float)(m1 * s[2].s));
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
    static constexpr int BLK = 256, BULK = 192, META = 18;
    struct U { uint4 a, b, h; int sc; float d; };
    static MEMRA_DEVICE int goff(int u, int g, int) {
        const int j = u & 3;
        return 256 * (u >> 2) + 128 * (j >> 1) + 32 * g + 16 * (j & 1);
    }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        const int j = u & 3, n = j >> 1, l0 = 16 * (j & 1);
        const uint8_t* blk = bulk + 192 * (u >> 2);
        w.a = ld16(blk + 64 * n + l0);
        w.b = ld16(blk + 64 * n + 32 + l0);
        w.h = ld16(blk + 128 + 32 * n + l0);
        // scales[8n + (j&1) + 2g], g = 0..3: bytes (j&1) of the four 2-byte words from base
        const uint8_t* base = meta + 18 * (u >> 2) + 8 * n;
        const int sh = 8 * (j & 1);
        w.sc = (int)(((ld2(base) >> sh) & 0xFFu) | (((ld2(base + 2) >> sh) & 0xFFu) << 8) |
                     (((ld2(base + 4) >> sh) & 0xFFu) << 16) | (((ld2(base + 6) >> sh) & 0xFFu) << 24));
        w.d = f16_to_f32(ld2(meta + 18 * (u >> 2) + 16));
    }
    static MEMRA_DEVICE int q6(const U& w, int g, int i) {
        const uint32_t lq = word((g & 1) ? w.b : w.a, i);
        const uint32_t h = word(w.h, i);
        const uint32_t lo = (g >> 1) ? ((lq >> 4) & 0x0F0F0F0Fu) : (lq & 0x0F0F0F0Fu);
        const uint32_t hb = ((h >> (2 * g)) & 0x03030303u) << 4;
        return subb(lo | hb, 0x20202020u);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int acc = dot16(q6(w, g, 0), q6(w, g, 1), q6(w, g, 2), q6(w, g, 3), x[g], 0);
            r += s[g].d * (float)((int)(int8_t)(w.sc >> (8 * g)) * acc);
        }
        return w.d * r;
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
    static constexpr int BLK = 256, BULK = 128, META = 8;
    struct U { uint4 q[2]; uint2 m; int j; };
    static MEMRA_DEVICE int goff(int u, int g, int) { return 64 * u + 16 * g; }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t* meta, int u, int) {
        w.q[0] = ld16(bulk + 32 * u); w.q[1] = ld16(bulk + 32 * u + 16);
        w.m = __ldg(reinterpret_cast<const uint2*>(meta + 8 * (u >> 2)));
        w.j = u & 3;
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
        return f16_to_f32((uint16_t)w.m.x) * (float)((int)(sl | (sh << 4)) - 32);
    }
    static MEMRA_DEVICE float dot_q8(const U& w, const int4* x, const Q8Scale* s) {
        float r = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4& v = w.q[k];
            int acc = dot16(lut(v.x), lut(v.y), lut(v.z), lut(v.w), x[2 * k], 0);
            acc = dot16(lut(v.x >> 4), lut(v.y >> 4), lut(v.z >> 4), lut(v.w >> 4), x[2 * k + 1], acc);
            r += dl(w, 2 * w.j + k) * s[2 * k].d * (float)acc;
        }
        return r;
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const int sh = 4 * (g & 1);
        int q[4] = {lut(v.x >> sh), lut(v.y >> sh), lut(v.z >> sh), lut(v.w >> sh)};
        i8x16(q, o, dl(w, 2 * w.j + (g >> 1)), 0.f);
    }
};

// F32 (0), F16 (1), BF16 (30): plain row-major rows; float family only. Units are
// interleaved across the warp by groups so that one 16-byte load instruction of the warp
// covers a contiguous span: tile t = u / 32 holds 32 units (W = 32, fewer in a last partial
// tile) of 64 elements, group-major: group g of unit u starts at element
// 2048 t + (g W + u % 32) 16.
MEMRA_DEVICE int goff_tiled(int u, int g, int nu) {
    const int t = u >> 5;
    const int W = min(32, nu - 32 * t);
    return 2048 * t + (g * W + (u & 31)) * 16;
}

struct TF32 {
    static constexpr int BLK = 1, BULK = 4, META = 0;
    struct U { uint4 q[16]; };
    static MEMRA_DEVICE int goff(int u, int g, int nu) { return goff_tiled(u, g, nu); }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t*, int u, int nu) {
#pragma unroll
        for (int g = 0; g < 4; ++g)
#pragma unroll
            for (int i = 0; i < 4; ++i) w.q[4 * g + i] = ld16(bulk + 4 * goff(u, g, nu) + 16 * i);
    }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4& v = w.q[4 * g + i];
            o[4 * i] = __uint_as_float(v.x); o[4 * i + 1] = __uint_as_float(v.y);
            o[4 * i + 2] = __uint_as_float(v.z); o[4 * i + 3] = __uint_as_float(v.w);
        }
    }
};

template <bool BF>
struct THalf {
    static constexpr int BLK = 1, BULK = 2, META = 0;
    struct U { uint4 q[8]; };
    static MEMRA_DEVICE int goff(int u, int g, int nu) { return goff_tiled(u, g, nu); }
    static MEMRA_DEVICE void load(U& w, const uint8_t* bulk, const uint8_t*, int u, int nu) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            w.q[2 * g] = ld16(bulk + 2 * goff(u, g, nu));
            w.q[2 * g + 1] = ld16(bulk + 2 * goff(u, g, nu) + 16);
        }
    }
    static MEMRA_DEVICE float cvt(uint32_t h) { return BF ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h); }
    static MEMRA_DEVICE void deq(const U& w, int g, float* o) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t v = word(w.q[2 * g + (i >> 2)], i & 3);
            o[2 * i] = cvt(v & 0xFFFFu);
            o[2 * i + 1] = cvt(v >> 16);
        }
    }
};

#if MV_TYPE == 0
typedef TF32 T;
#define MV_FLOAT_ONLY 1
#elif MV_TYPE == 1
typedef THalf<false> T;
#define MV_FLOAT_ONLY 1
#elif MV_TYPE == 30
typedef THalf<true> T;
#define MV_FLOAT_ONLY 1
#elif MV_TYPE == 2
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
#error "unsupported MV_TYPE"
#endif

#ifndef MV_FLOAT_ONLY
#define MV_FLOAT_ONLY 0
#endif

// ---------------------------------------------------------------------------------
// The shared driver: row mapping, unit loop, reductions, epilogue.
template <int B, bool GLU>
struct Rows {
    static constexpr int NR = GLU ? 2 * MV_ROWS : MV_ROWS;   // weight rows loaded per warp
};

template <int B, bool GLU>
MEMRA_DEVICE void finish(float (&acc)[Rows<B, GLU>::NR][B], float* y, const float* res,
                         int row0, int N, int nb, int act) {
    constexpr int NR = Rows<B, GLU>::NR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = warp_sum(acc[r][b]);
#if MV_KSPLIT > 1
    __shared__ float part[MV_NWARPS][NR][B];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int b = 0; b < B; ++b) part[warp][r][b] = acc[r][b];
    }
    __syncthreads();
    if (warp % MV_KSPLIT != 0) return;
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) {
            float v = part[warp][r][b];
            for (int k = 1; k < MV_KSPLIT; ++k) v += part[warp + k][r][b];
            acc[r][b] = v;
        }
#endif
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
        const int row = row0 + r;
        if (row >= N) break;
#pragma unroll
        for (int b = 0; b < B; ++b) {
            if (b >= nb) break;
            float v = acc[r][b];
            if (GLU) {
                const float gte = acc[r][b], up = acc[MV_ROWS + r][b];
                v = (act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte)) * up;
            }
            const size_t o = (size_t)b * N + row;
            if (res) v += res[o];
            y[o] = v;
        }
    }
}

MEMRA_DEVICE int weight_row(int r, int row0, int N) {
    // rows [0, MV_ROWS) of the warp are output rows; [MV_ROWS, 2 MV_ROWS) their GLU "up" rows
    // (N further down). Rows past N are clamped: loaded and computed, never stored.
    const int base = r < MV_ROWS ? row0 + r : row0 + r - MV_ROWS;
    const int rr = base < N ? base : N - 1;
    return r < MV_ROWS ? rr : rr + N;
}

#if !MV_FLOAT_ONLY
template <int B, bool GLU>
MEMRA_DEVICE void mv_q8_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                        float* y, const float* res, int N, int K, int nb, int act) {
    constexpr int NR = Rows<B, GLU>::NR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * (MV_NWARPS / MV_KSPLIT) + warp / MV_KSPLIT) * MV_ROWS;
    const int nblk = K / T::BLK;
    const size_t brs = (size_t)nblk * T::BULK, mrs = (size_t)nblk * T::META;
    const uint8_t* wb[NR];
    const uint8_t* wm[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const int row = weight_row(r, row0, N);
        wb[r] = bulk + row * brs;
        wm[r] = meta + row * mrs;
    }
    float acc[NR][B];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = 0.f;
    const int nu = K / 64, ustep = 32 * MV_KSPLIT;
    int u = (warp % MV_KSPLIT) * 32 + lane;
    // Weights are never written by kernels, so they may be touched before the PDL wait:
    // the first unit is loaded (MV_PREFETCH) or its lines prefetched into L2.
#if MV_PREFETCH
    typename T::U w[NR];
    if (u < nu) {
#pragma unroll
        for (int r = 0; r < NR; ++r) T::load(w[r], wb[r], wm[r], u, nu);
    }
#else
    if (u < nu) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            prefetch_l2(wb[r] + (size_t)u * 64 * T::BULK / T::BLK);
            if (T::META) prefetch_l2(wm[r] + (size_t)u * 64 * T::META / T::BLK);
        }
    }
#endif
    MEMRA_PDL_WAIT();
#if MV_PDL_TRIGGER
    MEMRA_PDL_LAUNCH();
#endif
#if MV_XSMEM
    // Stage x in shared memory, tile-interleaved: the 16 values of unit u, group g sit at
    // chunk (u / 32) * 128 + g * 32 + u % 32, so a warp's read of one group is 512
    // contiguous bytes (no bank conflicts, 4 wavefronts) instead of 16 strided lines.
    extern __shared__ __align__(16) uint8_t mv_smem[];
    const int ntile = (nu + 31) >> 5;
    int8_t* sxq = reinterpret_cast<int8_t*>(mv_smem);                      // nb x ntile x 2048 B
    int2* sxs = reinterpret_cast<int2*>(mv_smem + (size_t)nb * ntile * 2048); // nb x ntile x 128 x 8 B
    for (int i = threadIdx.x; i < nb * nu * 4; i += blockDim.x) {
        const int b = i / (nu * 4), ug = i - b * nu * 4, uu = ug >> 2, g = ug & 3;
        const int e = T::goff(uu, g, nu);
        const int c = (uu >> 5) * 128 + g * 32 + (uu & 31);
        reinterpret_cast<int4*>(sxq)[(size_t)b * ntile * 128 + c] =
            __ldg(reinterpret_cast<const int4*>(xq + (size_t)b * K + e));
        sxs[(size_t)b * ntile * 128 + c] = __ldg(reinterpret_cast<const int2*>(xs + (size_t)b * (K / 32) + e / 32));
    }
    __syncthreads();
#endif
#pragma unroll MV_UNROLL
    for (; u < nu; u += ustep) {
#if MV_PREFETCH
        typename T::U wn[NR];
        if (u + ustep < nu) {
#pragma unroll
            for (int r = 0; r < NR; ++r) T::load(wn[r], wb[r], wm[r], u + ustep, nu);
        }
#else
        typename T::U w[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) T::load(w[r], wb[r], wm[r], u, nu);
#endif
        if (!(MEMRA_CANARY == 1 && u == 1)) {
#pragma unroll
        for (int b = 0; b < B; ++b) {
            if (b < nb) {
                int4 xv[4];
                Q8Scale sv[4];
#pragma unroll
                for (int g = 0; g < 4; ++g) {
#if MV_XSMEM
                    const size_t c = (size_t)b * ntile * 128 + (u >> 5) * 128 + g * 32 + (u & 31);
                    xv[g] = reinterpret_cast<const int4*>(sxq)[c];
                    const int2 t = sxs[c];
#else
                    const int e = T::goff(u, g, nu);
                    xv[g] = __ldg(reinterpret_cast<const int4*>(xq + (size_t)b * K + e));
                    const int2 t = __ldg(reinterpret_cast<const int2*>(xs + (size_t)b * (K / 32) + e / 32));
#endif
                    sv[g].d = __int_as_float(t.x); sv[g].s = t.y;
                }
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r][b] += T::dot_q8(w[r], xv, sv);
            }
        }
        }
#if MV_PREFETCH
#pragma unroll
        for (int r = 0; r < NR; ++r) w[r] = wn[r];
#endif
    }
    finish<B, GLU>(acc, y, res, row0, N, nb, act);
}
#endif

template <int B, bool GLU>
MEMRA_DEVICE void mv_f32_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                         const float* __restrict__ x, float* y, const float* res,
                         int N, int K, int nb, int act) {
    constexpr int NR = Rows<B, GLU>::NR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * (MV_NWARPS / MV_KSPLIT) + warp / MV_KSPLIT) * MV_ROWS;
    const int nblk = K / T::BLK;
    const size_t brs = (size_t)nblk * T::BULK, mrs = (size_t)nblk * T::META;
    const uint8_t* wb[NR];
    const uint8_t* wm[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const int row = weight_row(r, row0, N);
        wb[r] = bulk + row * brs;
        wm[r] = meta + row * mrs;
    }
    float acc[NR][B];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = 0.f;
    const int nu = K / 64, ustep = 32 * MV_KSPLIT;
    int u = (warp % MV_KSPLIT) * 32 + lane;
    // Weights are never written by kernels, so they may be touched before the PDL wait:
    // the first unit is loaded (MV_PREFETCH) or its lines prefetched into L2.
#if MV_PREFETCH
    typename T::U w[NR];
    if (u < nu) {
#pragma unroll
        for (int r = 0; r < NR; ++r) T::load(w[r], wb[r], wm[r], u, nu);
    }
#else
    if (u < nu) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            prefetch_l2(wb[r] + (size_t)u * 64 * T::BULK / T::BLK);
            if (T::META) prefetch_l2(wm[r] + (size_t)u * 64 * T::META / T::BLK);
        }
    }
#endif
    MEMRA_PDL_WAIT();
#if MV_PDL_TRIGGER
    MEMRA_PDL_LAUNCH();
#endif
#pragma unroll MV_UNROLL
    for (; u < nu; u += ustep) {
#if MV_PREFETCH
        typename T::U wn[NR];
        if (u + ustep < nu) {
#pragma unroll
            for (int r = 0; r < NR; ++r) T::load(wn[r], wb[r], wm[r], u + ustep, nu);
        }
#else
        typename T::U w[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) T::load(w[r], wb[r], wm[r], u, nu);
#endif
        if (!(MEMRA_CANARY == 1 && u == 1)) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int e = T::goff(u, g, nu);
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                float wf[16];
                T::deq(w[r], g, wf);
#pragma unroll
                for (int b = 0; b < B; ++b) {
                    if (b < nb) {
                        const float4* xp = reinterpret_cast<const float4*>(x + (size_t)b * K + e);
                        float a = acc[r][b];
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const float4 xv = __ldg(xp + i);
                            a = fmaf(wf[4 * i], xv.x, a);
                            a = fmaf(wf[4 * i + 1], xv.y, a);
                            a = fmaf(wf[4 * i + 2], xv.z, a);
                            a = fmaf(wf[4 * i + 3], xv.w, a);
                        }
                        acc[r][b] = a;
                    }
                }
            }
        }
        }
#if MV_PREFETCH
#pragma unroll
        for (int r = 0; r < NR; ++r) w[r] = wn[r];
#endif
    }
    finish<B, GLU>(acc, y, res, row0, N, nb, act);
}

#ifndef MV_B
#define MV_B 1
#endif

#if MV_FLOAT_ONLY || MV_B == 1
extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_f32(const uint8_t* bulk, const uint8_t* meta, const float* x, float* y, const float* res,
       int N, int K, int nb, int act) {
    mv_f32_body<MV_B, false>(bulk, meta, x, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_f32_glu(const uint8_t* bulk, const uint8_t* meta, const float* x, float* y, const float* res,
           int N, int K, int nb, int act) {
    mv_f32_body<MV_B, true>(bulk, meta, x, y, res, N, K, nb, act);
}
#endif
#if !MV_FLOAT_ONLY
extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
      const float* res, int N, int K, int nb, int act) {
    mv_q8_body<MV_B, false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
          const float* res, int N, int K, int nb, int act) {
    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
#endif
