// chain_mv.cu — a Q4_K x q8 matvec whose every output is ONE float chain over its k32 blocks,
// in increasing k (the order of experiments/gemm_tile's base formula), bit for bit:
//
//   acc = +0.0f
//   for each k32 block i of the row (sub-block j = i % 8 of super-block i / 8), i increasing:
//       p   = fl(I_i * dsc_j)            I_i = sum q qx over the 32 values (exact int), dsc = d sc_j (exact)
//       acc = fma(p, dx_i, acc)
//       acc = fma(ndmm_j, sx_i, acc)     ndmm = -(dmin m_j) (exact), sx_i = fl(dx_i S_i)
//   y = acc
//
// (every float operation an explicit-rounding intrinsic: NVRTC may not contract or reorder them).
//
// Structure (one block = CM_CR weight rows x CM_B activation columns = CHAINS <= 32 outputs):
//  - CM_NW loader warps + 1 chain warp. K advances in tiles of 32 units (64 weights a unit, 2048
//    weights, 64 k32 blocks a tile). In a tile, loader lane l owns unit u = 32 t + l of every row of
//    its warp (rows warp, warp + CM_NW, ...): the row's 32 qs bytes (2 x 16-byte loads, a warp reads
//    1 KB of one row contiguously) and its super-block's 16 meta bytes, the exact integer dots
//    I_{2u}, I_{2u+1} (16 dp4a a column, qtypes.cuh's TQ4_K::idots), the row scalars (rowscal_k4),
//    p = fl(I dsc) and ndmm; (p, ndmm) of both blocks go to shared memory, one float4 a lane, into
//    chain c = r CM_B + b's row of the tile's P buffer (row stride 132 floats: the chain warp's
//    LDS.128 are conflict-free). Loader warp 0 also writes the tile's (dx, fl(dx S)) per column.
//    With CM_PF the next tile's weights are loaded into registers before this tile is computed.
//  - P and X are double-buffered; one __syncthreads a tile. After barrier t the chain warp runs the
//    chain of tile t (lane c = chain c: 64 steps of 2 FFMA, 1 LDS.128 of P and 1 of X per 2 steps)
//    while the loaders compute tile t + 1; they overwrite buffer t % 2 only after barrier t + 1,
//    which the chain warp reaches after finishing tile t. After the last tile lane c stores y.
//  Each weight byte is read once per launch (per column tile of CM_B columns).
//
// Tunables (-D): CM_NW loader warps (8), CM_CR weight rows a block (32 / CM_B), CM_B columns (1;
// run-time nb <= CM_B), CM_PF register prefetch of the next tile (1).
// Launch: grid = ceil(N / CM_CR), block = 32 (CM_NW + 1), static shared memory only.
// K must be a multiple of 256. Entry: chain_mv(bulk, meta, xq, xs, y, N, K, nb): y[b, n], b < nb.
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"

#ifndef CM_NW
#define CM_NW 8
#endif
#ifndef CM_B
#define CM_B 1
#endif
#ifndef CM_CR
#define CM_CR (32 / CM_B)
#endif
#ifndef CM_PF
#define CM_PF 1
#endif

#define CM_CHAINS (CM_CR * CM_B)
#define CM_RPW ((CM_CR + CM_NW - 1) / CM_NW)   // weight rows a loader warp
#define CM_TU 32                              // units a tile
#define CM_TB 64                              // k32 blocks a tile
#define CM_PS (2 * CM_TB + 4)                 // P / X row stride, floats (528 bytes)

#ifndef CM_FAST
#define CM_FAST 1
#endif

#if CM_CHAINS > 32
#error "CM_CR * CM_B must be <= 32 (one chain a lane of the chain warp)"
#endif

// ---- CM_FAST: the same values with fewer instructions (bit-identical to the plain path) ----
// Magic conversions: for 0 <= v < 2^22, the float with bits 0x4B000000 | v is 8388608 + v, and
// 0x4B400000 + I (|I| < 2^22) read as a float is 12582912 + I, so
//   fma(8388608 + sc, d, -8388608 d) = sc d        (exact: <= 17 significant bits; one rounding of an exact value)
//   fma(12582912 + I, s, -12582912 s) = fl(I s)   (the FFMA's product is exact; -12582912 s is exact for s = d sc)
// The high nibbles are dotted in place (bytes & 0xF0: 16 q) with dp4a.u32.s32: 16 I, |16 I| < 2^20,
// paired with s / 16 (a power-of-two scaling: exact), so fl(16 I s / 16) = fl(I s) bit for bit.
struct RowF { float dsc0, mb0, dsc1h, mb1h, n0, n1; };
MEMRA_DEVICE int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
MEMRA_DEVICE float fmagic(uint32_t v) { return __uint_as_float(0x4B000000u | v); }
// sub-blocks 2j, 2j + 1 of a Q4_K super-block's meta (d | dmin | scales[12]), j = lane % 4 fixed:
// the 6-bit scale / min pairs branch-free (scale_min_k4 for two adjacent sub-blocks at once)
MEMRA_DEVICE RowF fast_rowscal(const uint4& m, bool hij) {
    const int sh = (threadIdx.x & 1) << 4;                 // j odd: bytes 2, 3 of each word
    const uint32_t lo = (m.y >> sh) & 0xFFFFu, hi = (m.z >> sh) & 0xFFFFu, a = (m.w >> sh) & 0xFFFFu;
    const uint32_t sc = hij ? ((a & 0x0F0Fu) | ((lo >> 2) & 0x3030u)) : (lo & 0x3F3Fu);
    const uint32_t mn = hij ? (((a >> 4) & 0x0F0Fu) | ((hi >> 2) & 0x3030u)) : (hi & 0x3F3Fu);
    const float d = f16_to_f32((uint16_t)m.x), dmin = f16_to_f32((uint16_t)(m.x >> 16));
    const float d16 = __fmul_rn(d, 0.0625f);
    RowF r;
    r.dsc0 = __fmaf_rn(fmagic(sc & 0xFFu), d, __fmul_rn(-8388608.0f, d));          // d sc_2j
    r.dsc1h = __fmaf_rn(fmagic(sc >> 8), d16, __fmul_rn(-8388608.0f, d16));       // d sc_2j+1 / 16
    r.n0 = __fmaf_rn(fmagic(mn & 0xFFu), -dmin, __fmul_rn(8388608.0f, dmin));      // -(dmin m_2j)
    r.n1 = __fmaf_rn(fmagic(mn >> 8), -dmin, __fmul_rn(8388608.0f, dmin));         // -(dmin m_2j+1)
    r.mb0 = __fmul_rn(-12582912.0f, r.dsc0);
    r.mb1h = __fmul_rn(-12582912.0f, r.dsc1h);
    return r;
}
// (p_2u, ndmm, p_2u+1, ndmm) of one row and unit: 16 dp4a from the magic start, 2 FFMA
MEMRA_DEVICE float4 fast_unit(const TQ4_K::U& w, const int4* x, const RowF& f) {
    const uint4& a = w.q[0];
    const uint4& b = w.q[1];
    int i0 = 0x4B400000, i1 = 0x4B400000;
    i0 = dp4a_us(a.x & 0x0F0F0F0Fu, x[0].x, i0); i0 = dp4a_us(a.y & 0x0F0F0F0Fu, x[0].y, i0);
    i0 = dp4a_us(a.z & 0x0F0F0F0Fu, x[0].z, i0); i0 = dp4a_us(a.w & 0x0F0F0F0Fu, x[0].w, i0);
    i0 = dp4a_us(b.x & 0x0F0F0F0Fu, x[1].x, i0); i0 = dp4a_us(b.y & 0x0F0F0F0Fu, x[1].y, i0);
    i0 = dp4a_us(b.z & 0x0F0F0F0Fu, x[1].z, i0); i0 = dp4a_us(b.w & 0x0F0F0F0Fu, x[1].w, i0);
    i1 = dp4a_us(a.x & 0xF0F0F0F0u, x[2].x, i1); i1 = dp4a_us(a.y & 0xF0F0F0F0u, x[2].y, i1);
    i1 = dp4a_us(a.z & 0xF0F0F0F0u, x[2].z, i1); i1 = dp4a_us(a.w & 0xF0F0F0F0u, x[2].w, i1);
    i1 = dp4a_us(b.x & 0xF0F0F0F0u, x[3].x, i1); i1 = dp4a_us(b.y & 0xF0F0F0F0u, x[3].y, i1);
    i1 = dp4a_us(b.z & 0xF0F0F0F0u, x[3].z, i1); i1 = dp4a_us(b.w & 0xF0F0F0F0u, x[3].w, i1);
    return make_float4(__fmaf_rn(__int_as_float(i0), f.dsc0, f.mb0), f.n0,
                       __fmaf_rn(__int_as_float(i1), f.dsc1h, f.mb1h), f.n1);
}

extern "C" __global__ void __launch_bounds__(32 * (CM_NW + 1))
chain_mv(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
         const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
         float* __restrict__ y, int N, int K, int nb) {
    __shared__ __align__(16) float sP[2][CM_CHAINS * CM_PS];
    __shared__ __align__(16) float sX[2][CM_B * CM_PS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * CM_CR;
    const int nu = K >> 6, nt = (nu + CM_TU - 1) / CM_TU;
    if (warp < CM_NW) {
        // ---------------- loaders ----------------
        const size_t brs = (size_t)nu * 32, mrs = (size_t)(K >> 8) * 16;
        const uint8_t* wb[CM_RPW];
        const uint8_t* wm[CM_RPW];
#pragma unroll
        for (int r = 0; r < CM_RPW; ++r) {
            const int rr = warp + CM_NW * r;                 // block row (may be >= CM_CR: unused)
            const int row = min(row0 + min(rr, CM_CR - 1), N - 1);
            wb[r] = bulk + (size_t)row * brs;
            wm[r] = meta + (size_t)row * mrs;
        }
        const bool hij = (lane & 2) != 0;   // the lane's sub-block pair j = u % 4 = lane % 4 (fixed): j >= 2
        TQ4_K::U w[CM_RPW];
        {
            const int u = min(lane, nu - 1);
#pragma unroll
            for (int r = 0; r < CM_RPW; ++r) TQ4_K::load(w[r], wb[r], wm[r], u, nu);
        }
        for (int t = 0; t < nt; ++t) {
            const int u = CM_TU * t + lane;
            const bool valid = u < nu;
            float* P = sP[t & 1];
#if CM_PF
            TQ4_K::U wn[CM_RPW];
            if (t + 1 < nt) {
                const int un = min(u + CM_TU, nu - 1);
#pragma unroll
                for (int r = 0; r < CM_RPW; ++r) TQ4_K::load(wn[r], wb[r], wm[r], un, nu);
            }
#endif
            if (valid) {
#if CM_FAST
                RowF rf[CM_RPW];
#pragma unroll
                for (int r = 0; r < CM_RPW; ++r) rf[r] = fast_rowscal(w[r].m, hij);
#else
                RK4 rk[CM_RPW];
#pragma unroll
                for (int r = 0; r < CM_RPW; ++r) rk[r] = TQ4_K::rowscal(w[r]);
#endif
#pragma unroll
                for (int b = 0; b < CM_B; ++b) {
                    if (b < nb) {
                        int4 xv[4];
#pragma unroll
                        for (int g = 0; g < 4; ++g)
                            xv[g] = __ldg(reinterpret_cast<const int4*>(xq + (size_t)b * K + 64 * u + 16 * g));
                        const int4 sc = __ldg(reinterpret_cast<const int4*>(xs + (size_t)b * (K >> 5) + 2 * u));
                        if (warp == 0) {   // the column scalars of blocks 2u, 2u + 1: (dx, fl(dx S))
                            const float d0 = __int_as_float(sc.x), d1 = __int_as_float(sc.z);
                            *reinterpret_cast<float4*>(sX[t & 1] + b * CM_PS + 4 * lane) =
                                make_float4(d0, __fmul_rn(d0, (float)sc.y), d1, __fmul_rn(d1, (float)sc.w));
                        }
#pragma unroll
                        for (int r = 0; r < CM_RPW; ++r) {
                            const int rr = warp + CM_NW * r;
                            if (rr < CM_CR) {
#if CM_FAST
                                const float4 v = fast_unit(w[r], xv, rf[r]);
#else
                                int ints[2];
                                TQ4_K::idots(w[r], xv, ints);
                                const RK4& q = rk[r];
                                const float4 v = make_float4(
                                    __fmul_rn((float)ints[0], __fmul_rn(q.d, (float)q.sc0)), -__fmul_rn(q.dmin, (float)q.m0),
                                    __fmul_rn((float)ints[1], __fmul_rn(q.d, (float)q.sc1)), -__fmul_rn(q.dmin, (float)q.m1));
#endif
                                *reinterpret_cast<float4*>(P + (rr * CM_B + b) * CM_PS + 4 * lane) = v;
                            }
                        }
                    }
                }
            }
            __syncthreads();
#if CM_PF
#pragma unroll
            for (int r = 0; r < CM_RPW; ++r) w[r] = wn[r];
#else
            if (t + 1 < nt) {
                const int un = min(u + CM_TU, nu - 1);
#pragma unroll
                for (int r = 0; r < CM_RPW; ++r) TQ4_K::load(w[r], wb[r], wm[r], un, nu);
            }
#endif
        }
    } else {
        // ---------------- the chain warp: lane c = chain c (row c / CM_B, column c % CM_B) ----------------
        const int c = lane < CM_CHAINS ? lane : CM_CHAINS - 1;
        const float* Pc = &sP[0][0] + c * CM_PS;
        const int xo = (c % CM_B) * CM_PS;
        float acc = 0.f;
        for (int t = 0; t < nt; ++t) {
            __syncthreads();
            const float* P = Pc + (t & 1) * (CM_CHAINS * CM_PS);
            const float* X = sX[t & 1] + xo;
            const int nbk = 2 * min(CM_TU, nu - CM_TU * t);
            if (nbk == CM_TB) {
#pragma unroll 8
                for (int i = 0; i < CM_TB; i += 2) {
                    const float4 p = *reinterpret_cast<const float4*>(P + 2 * i);
                    const float4 x = *reinterpret_cast<const float4*>(X + 2 * i);
                    acc = __fmaf_rn(p.x, x.x, acc);
                    acc = __fmaf_rn(p.y, x.y, acc);
                    acc = __fmaf_rn(p.z, x.z, acc);
                    acc = __fmaf_rn(p.w, x.w, acc);
                }
            } else {
                for (int i = 0; i < nbk; i += 2) {
                    const float4 p = *reinterpret_cast<const float4*>(P + 2 * i);
                    const float4 x = *reinterpret_cast<const float4*>(X + 2 * i);
                    acc = __fmaf_rn(p.x, x.x, acc);
                    acc = __fmaf_rn(p.y, x.y, acc);
                    acc = __fmaf_rn(p.z, x.z, acc);
                    acc = __fmaf_rn(p.w, x.w, acc);
                }
            }
        }
        const int row = row0 + lane / CM_B, b = lane % CM_B;
        if (lane < CM_CHAINS && row < N && b < nb) y[(size_t)b * N + row] = acc;
    }
}
