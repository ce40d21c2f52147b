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
// Exactly (MV_KSPLIT 1): lane l's partial P_l = T::accum(... T::accum(0, unit l), unit l+32 ...)
// (units in increasing u; qtypes.cuh: exact integer dots, then explicit-rounding float math),
// then warp_sum's butterfly, then act(gate) * up and + res, each one rounding. gemm.cu's
// tensor-core kernels reproduce exactly these operations, so both give the same bits.
//
// Tunables (-D): MV_TYPE (ggml type id, required), MV_B (1), MV_NWARPS warps per block (4),
// MV_ROWS rows per warp (1), MV_KSPLIT warps sharing one row (1; divides MV_NWARPS),
// MV_UNROLL unroll of the unit loop (1), MV_WLOAD weight load flavour (0; see ld16),
// MV_PREFETCH (0) loads the next unit's weights before using the current ones (more
// registers; MV_UNROLL 2 lets the compiler hoist the same loads),
// MV_PDL_TRIGGER (1) lets the next PDL-launched kernel start once every block is running
// (1: after this kernel's wait; 2: before it, so the dependant may start while this kernel's
// predecessor still runs: experiments/pdl_early, a per-shape engine choice; 0: never)
// (before MEMRA_PDL_WAIT the first unit's weights are loaded, or with MV_PREFETCH 0
// prefetched into L2: weights are never written by kernels),
// MEMRA_CANARY=1 drops unit 1 of every row (a deliberately wrong variant that kernel-check
// must catch).
// MV_XSMEM (0; q8 family) stages the block's activations in shared memory, tile-interleaved
// (the strided activation loads, not DRAM, bound the plain q8 kernel: see research/matvec.md).
// Launch: grid = ceil(N / (MV_ROWS * MV_NWARPS / MV_KSPLIT)), block = 32 * MV_NWARPS,
// dynamic shared memory 0, or with MV_XSMEM nb * ceil(K / 2048) * 3072 bytes.
// K must be a multiple of 64 (and of the type's block size).
//
// History:
//  1. planes layout; q8 (dp4a) and f32 families for 12 GGUF types; GLU and residual epilogues.
//  2. MV_WLOAD weight-load flavours.
//  3. first unit's weights before the PDL wait, early PDL trigger, MV_PREFETCH register
//     double buffer (off by default: the measured loop loads at the top of each unit).
//  4. MV_XSMEM: activations tile-interleaved in shared memory (the strided activation loads,
//     not DRAM, bound the q8 kernel). A fused mv_q8_glu_q8 (q8 twin of the output) was tried
//     twice and withdrawn, slower on the H200 (research/matvec.md).
//  5. combine split out to qtypes.cuh, roundings explicit: each type's dot_q8 became idots
//     (exact integer sums) + accum (float part written with __fmul_rn / __fadd_rn /
//     __fmaf_rn, pinned to the contractions NVRTC made before, so decode bits are unchanged)
//     and the epilogue's act * up and + res are explicit roundings too; gemm.cu calls the
//     same accum, so its results equal mv_q8's bit for bit.
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"

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


// The quantized types (TQ4_0 ... TIQ4_XS) and their helpers live in qtypes.cuh.

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
                v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
            }
            const size_t o = (size_t)b * N + row;
            if (res) v = __fadd_rn(v, res[o]);
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
#if MV_PDL_TRIGGER == 2
    MEMRA_PDL_LAUNCH();
#endif
    MEMRA_PDL_WAIT();
#if MV_PDL_TRIGGER == 1
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
                for (int r = 0; r < NR; ++r) {
                    int ints[T::NI];
                    T::idots(w[r], xv, ints);
                    acc[r][b] = T::accum(acc[r][b], w[r], ints, sv);
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
#if MV_PDL_TRIGGER == 2
    MEMRA_PDL_LAUNCH();
#endif
    MEMRA_PDL_WAIT();
#if MV_PDL_TRIGGER == 1
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
