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
#include "smem_stage.cuh"

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

#ifndef CM_NCW
#define CM_NCW 1
#endif
#if CM_CHAINS > 32 * CM_NCW
#error "CM_CR * CM_B must be <= 32 CM_NCW (one chain a lane of the chain warps)"
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

#ifndef CM_V2
#define CM_V2 0
#endif

#if CM_V2
// ================= v2: a persistent (grid-strided) block over row groups, deeper prefetch, glu =================
// The same chain, the same per-(row, unit) arithmetic (fast_unit), the same P / X tile layout and
// one __syncthreads a tile. What changes is WHO does it and WHEN:
//  - group g = CM_CRO output rows; block b walks groups b, b + gridDim.x, ... and flattens (group,
//    tile) into one stream s = 0 .. ns - 1, so the loaders' prefetch runs across group boundaries:
//    a block's next group's first tile is in flight while its chain warp finishes the previous group
//    (no per-wave prologue / epilogue; the host picks gridDim.x = min(groups, CM_GPS x SMs)).
//  - CM_PF tiles of weights in flight (registers, CM_PF + 1 buffers used in place: the loop is
//    unrolled by CM_PF + 1, so no register rotation MOV waits on a load).
//  - CM_ASYNC 1: the weights go global -> shared memory by cp.async (a CM_PF + 1 stage ring, dynamic
//    shared memory CM_NBUF x CM_NW x CM_RPW x 1536 B; each lane copies and later reads back only its own
//    48 B a row: no barrier for the ring) instead of registers: CM_PF tiles in flight cost no registers.
//  - CM_XS 1 (batches): the activation tile of the next step (CM_B x 32 units x 64 q8, lane stride 80 B:
//    conflict-free LDS.128) cp.async'd into shared memory once a block (every loader thread a share)
//    instead of every loader lane re-reading its unit's 64 B a column and row from L1 / L2: per step
//    the groups are committed [x(s + 1)] then [w(s + PF)], and cp.async.wait_group 1 before the step's
//    barrier completes x(s + 1) (and w(s + PF - 1): CM_PF >= 2 keeps one weight step in flight).
//  - CM_NCW chain warps (chains <= 32 CM_NCW; chain c on warp NW + c / 32, lane c % 32).
//  - Shared memory (v2): all dynamic: P, X double buffers | CM_XS activation tiles | CM_ASYNC ring.
//  - CM_MINB: __launch_bounds__ min blocks per SM (registers capped so CM_MINB blocks fit).
//  - CM_GLU 1: group = CM_CR / 2 gate rows (o) and their up rows (o + N), chain lanes c < CR/2 B gate,
//    the rest up; after both chains are final y[o] = silu(gate) up (memra's mv_q8_glu epilogue:
//    __fmul_rn(silu_f32(gate), up)). CM_GLU 2: the same data flow, both raw chains stored
//    (y[b, 2N] = [gate rows | up rows]: the plain product of the 2N weight rows) for the bit check.
// Entry as v1; N = output rows (the weight has 2N rows under CM_GLU).
#ifndef CM_MINB
#define CM_MINB 1
#endif
#ifndef CM_GLU
#define CM_GLU 0
#endif
#ifndef CM_ASYNC
#define CM_ASYNC 0
#endif
#ifndef CM_XS
#define CM_XS 0
#endif
#define CM_NBUF (CM_PF + 1)
#if CM_XS && !(CM_ASYNC && CM_PF >= 2)
#error "CM_XS needs CM_ASYNC and CM_PF >= 2"
#endif
#if CM_GLU && CM_NCW > 1
#error "CM_GLU: one chain warp (the gate / up pairing is a shuffle)"
#endif
#define CM_CRO (CM_GLU ? CM_CR / 2 : CM_CR)    // output rows a group
#if CM_PF < 1
#error "CM_V2 needs CM_PF >= 1"
#endif
#if CM_GLU && (CM_CR % 2)
#error "CM_GLU needs an even CM_CR"
#endif

// weight row of block row rr (< CM_CR; larger: an unused loader row, clamped) in group g
MEMRA_DEVICE int v2_row(int g, int rr, int N) {
#if CM_GLU
    const int o = min(g * CM_CRO + rr % CM_CRO, N - 1);
    return rr % CM_CR >= CM_CRO ? o + N : o;
#else
    return min(g * CM_CRO + min(rr, CM_CR - 1), N - 1);
#endif
}

#define CM_XSTRIDE 80                         // CM_XS: bytes a lane's unit (64 q8 + 16 pad)

extern "C" __global__ void __launch_bounds__(32 * (CM_NW + CM_NCW), CM_MINB)
chain_mv(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
         const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
         float* __restrict__ y, int N, int K, int nb) {
    extern __shared__ __align__(16) uint8_t smem[];
    float* const sP = reinterpret_cast<float*>(smem);                 // [2][CM_CHAINS * CM_PS]
    float* const sX = sP + 2 * CM_CHAINS * CM_PS;                       // [2][CM_B * CM_PS]
    uint8_t* const sXq = reinterpret_cast<uint8_t*>(sX + 2 * CM_B * CM_PS);   // CM_XS: [2][CM_B][32][80]
    uint8_t* const sW = sXq + (CM_XS ? 2 * CM_B * 32 * CM_XSTRIDE : 0);      // CM_ASYNC: [NBUF][NW][RPW][32][48]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nu = K >> 6, nt = (nu + CM_TU - 1) / CM_TU;
    const int ng = (N + CM_CRO - 1) / CM_CRO;
    const int ngb = (int)blockIdx.x < ng ? (ng - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int ns = ngb * nt;                       // (group, tile) steps of this block
    if (warp < CM_NW) {
        // ---------------- loaders ----------------
        const size_t brs = (size_t)nu * 32, mrs = (size_t)(K >> 8) * 16;
        const bool hij = (lane & 2) != 0;
#if CM_ASYNC
        // stage k of this lane: row r at sW + ((k NW + warp) RPW + r) 1536 + 48 lane (qs 32 B | meta 16 B;
        // 48-byte lane stride: the LDS.128 are conflict-free). Only this lane reads what it copied.
        const uint32_t sw0 = smem_u32(sW) + (uint32_t)(warp * CM_RPW * 1536 + 48 * lane);
        int lg = (int)blockIdx.x, lt = 0;       // (group, tile) of the next step to load (no divisions)
        auto load = [&](int k, int s) {
            if (s < ns) {
                const int g = lg, t = lt;
                if (++lt == nt) { lt = 0; lg += (int)gridDim.x; }
                const int u = min(CM_TU * t + lane, nu - 1);
#pragma unroll
                for (int r = 0; r < CM_RPW; ++r) {
                    const size_t row = (size_t)v2_row(g, warp + CM_NW * r, N);
                    const uint32_t d = sw0 + (uint32_t)((k * CM_NW * CM_RPW + r) * 1536);
                    const uint8_t* qb = bulk + row * brs + 32 * u;
                    cp16(d, qb);
                    cp16(d + 16, qb + 16);
                    cpn<16>(d + 32, meta + row * mrs + 16 * (u >> 2));
                }
            }
            cp_commit();                        // one group a step (empty past the end: the count stays uniform)
        };
#if CM_XS
        // x tile of step s into buffer s & 1: chunk q = (b, lane', 16 B piece g), every loader thread a share
        int xt = 0;                             // tile of the next x load
        auto xload = [&](int s) {
            if (s < ns) {
                const int t = xt;
                if (++xt == nt) xt = 0;
                const uint32_t xb = smem_u32(sXq) + (uint32_t)((s & 1) * CM_B * 32 * CM_XSTRIDE);
#pragma unroll
                for (int i = 0; i < (CM_B * 128 + 32 * CM_NW - 1) / (32 * CM_NW); ++i) {
                    const int q = (int)threadIdx.x + 32 * CM_NW * i;
                    if (q < CM_B * 128) {
                        const int b = q >> 7, l = (q >> 2) & 31, gq = q & 3;
                        const int u = min(CM_TU * t + l, nu - 1);
                        cp16(xb + (uint32_t)((b * 32 + l) * CM_XSTRIDE + 16 * gq), xq + (size_t)b * K + 64 * u + 16 * gq);
                    }
                }
            }
            cp_commit();
        };
        xload(0);
#endif
#pragma unroll
        for (int k = 0; k < CM_PF; ++k) load(k, k);
#if CM_XS
        cp_wait<CM_PF - 1>();                   // x(0) and w(0) of this thread
        if (ns > 0) __syncthreads();            // x(0) of every thread (the chain warps pass it too)
#endif
#else
        TQ4_K::U w[CM_NBUF][CM_RPW];
        int lg = (int)blockIdx.x, lt = 0;       // (group, tile) of the next step to load (no divisions)
        auto load = [&](TQ4_K::U (&wr)[CM_RPW], int s) {
            const int g = lg, t = lt;
            if (++lt == nt) { lt = 0; lg += (int)gridDim.x; }
            const int u = min(CM_TU * t + lane, nu - 1);
#pragma unroll
            for (int r = 0; r < CM_RPW; ++r) {
                const size_t row = (size_t)v2_row(g, warp + CM_NW * r, N);
                TQ4_K::load(wr[r], bulk + row * brs, meta + row * mrs, u, nu);
            }
        };
#pragma unroll
        for (int k = 0; k < CM_PF; ++k)
            if (k < ns) load(w[k], k);
#endif
        int ct = 0;                             // tile of the step being computed
        for (int s0 = 0; s0 < ns; s0 += CM_NBUF) {
#pragma unroll
            for (int k = 0; k < CM_NBUF; ++k) {
                const int s = s0 + k;
                if (s < ns) {
#if CM_ASYNC
                    // stage (k + PF) % NBUF = the one this lane read in step s - 1 (its values consumed then)
#if CM_XS
                    xload(s + 1);                      // groups [x(s + 1)], [w(s + PF)]: w(s) landed at the last step's wait
                    load((k + CM_PF) % CM_NBUF, s + CM_PF);
#else
                    load((k + CM_PF) % CM_NBUF, s + CM_PF);
                    cp_wait<CM_PF>();                  // this lane's copies of step s have landed
#endif
                    TQ4_K::U wk[CM_RPW];
#pragma unroll
                    for (int r = 0; r < CM_RPW; ++r) {
                        const uint4* p = reinterpret_cast<const uint4*>(sW + ((k * CM_NW + warp) * CM_RPW + r) * 1536 + 48 * lane);
                        wk[r].q[0] = p[0];
                        wk[r].q[1] = p[1];
                        wk[r].m = p[2];
                    }
#else
                    if (s + CM_PF < ns) load(w[(k + CM_PF) % CM_NBUF], s + CM_PF);
                    TQ4_K::U (&wk)[CM_RPW] = w[k];
#endif
                    const int t = ct;
                    if (++ct == nt) ct = 0;
                    const int u = CM_TU * t + lane;
                    float* P = sP + (s & 1) * (CM_CHAINS * CM_PS);
                    if (u < nu) {
                        RowF rf[CM_RPW];
#pragma unroll
                        for (int r = 0; r < CM_RPW; ++r) rf[r] = fast_rowscal(wk[r].m, hij);
#pragma unroll
                        for (int b = 0; b < CM_B; ++b) {
                            if (b < nb) {
                                int4 xv[4];
#if CM_XS
                                const int4* xsm = reinterpret_cast<const int4*>(sXq + (((s & 1) * CM_B + b) * 32 + lane) * CM_XSTRIDE);
#pragma unroll
                                for (int q = 0; q < 4; ++q) xv[q] = xsm[q];
#else
#pragma unroll
                                for (int q = 0; q < 4; ++q)
                                    xv[q] = __ldg(reinterpret_cast<const int4*>(xq + (size_t)b * K + 64 * u + 16 * q));
#endif
                                if (warp == 0) {
                                    const int4 sc = __ldg(reinterpret_cast<const int4*>(xs + (size_t)b * (K >> 5) + 2 * u));
                                    const float d0 = __int_as_float(sc.x), d1 = __int_as_float(sc.z);
                                    *reinterpret_cast<float4*>(sX + (s & 1) * (CM_B * CM_PS) + b * CM_PS + 4 * lane) =
                                        make_float4(d0, __fmul_rn(d0, (float)sc.y), d1, __fmul_rn(d1, (float)sc.w));
                                }
#pragma unroll
                                for (int r = 0; r < CM_RPW; ++r) {
                                    const int rr = warp + CM_NW * r;
                                    if (rr < CM_CR)
                                        *reinterpret_cast<float4*>(P + (rr * CM_B + b) * CM_PS + 4 * lane) =
                                            fast_unit(wk[r], xv, rf[r]);
                                }
                            }
                        }
                    }
#if CM_XS
                    cp_wait<1>();                      // all but w(s + PF): x(s + 1) (and w(s + 1)) landed
#endif
                    __syncthreads();
                }
            }
        }
    } else {
        // ---------------- the chain warp: lane c = chain c (block row c / CM_B, column c % CM_B) ----------------
        const int cl = 32 * (warp - CM_NW) + lane;            // this lane's chain
        const int c = cl < CM_CHAINS ? cl : CM_CHAINS - 1;
        const float* Pc = sP + c * CM_PS;
        const int xo = (c % CM_B) * CM_PS;
        float acc = 0.f;
#if CM_XS
        if (ns > 0) __syncthreads();            // the loaders' prologue barrier (x(0))
#endif
        int t = -1, g = (int)blockIdx.x - (int)gridDim.x;   // (tile, group) cursor
        for (int s = 0; s < ns; ++s) {
            __syncthreads();
            if (++t == nt || s == 0) { t = 0; g += (int)gridDim.x; }
            if (t == 0) acc = 0.f;
            const float* P = Pc + (s & 1) * (CM_CHAINS * CM_PS);
            const float* X = sX + (s & 1) * (CM_B * CM_PS) + xo;
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
            if (t == nt - 1) {                     // the group's chains are final
                const int rr = cl / CM_B, b = cl % CM_B;
#if CM_GLU == 1
                const float up = __shfl_down_sync(0xffffffffu, acc, CM_CRO * CM_B);
                const int o = g * CM_CRO + rr;
                if (cl < CM_CRO * CM_B && o < N && b < nb) y[(size_t)b * N + o] = __fmul_rn(silu_f32(acc), up);
#elif CM_GLU == 2
                const int o = g * CM_CRO + rr % CM_CRO;
                if (cl < CM_CHAINS && o < N && b < nb) y[(size_t)b * 2 * N + (rr >= CM_CRO ? N : 0) + o] = acc;
#else
                const int o = g * CM_CRO + rr;
                if (cl < CM_CHAINS && o < N && b < nb) y[(size_t)b * N + o] = acc;
#endif
            }
        }
    }
}

#else   // ================= v1 (the session-15 kernel, unchanged) =================
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
#endif   // CM_V2
