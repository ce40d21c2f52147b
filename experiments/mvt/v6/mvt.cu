// experiments/mvt/v6/mvt.cu — mvt variant 6 (experiment): kernels/mvt.cu's skinny tensor-core
// matvec for 2..32 rows with the weights, meta, activations and scales staged in shared memory
// by coalesced cp.async, a stage = SU consecutive units of the block's rows, and each warp's
// units walked in plain K order with one partial per slot. Same entry points, arguments,
// epilogues and grid as kernels/mvt.cu (plus dynamic shared memory), and the same
// bits as mv_q8 (below). Checked and timed by experiments/mvt/mvt_check.py with
// MVT_SRC=experiments/mvt/v6/mvt.cu MVT_SMEM=v6 (experiments/mvt/v6/ab.sh).
//
// Why (research/2026-12-02-session10/: ncu of variant 4 at 8 rows, and variant 5). Variant 4's
// lanes load their fragments straight from global memory: every load instruction touches 8
// different rows or columns (4-16 bytes each), ~8 instructions and ~56 L1 wavefronts a warp and
// unit, and the time follows the units, not the bytes (Q8_0 streams twice Q4_K's GB/s at the
// same µs) nor the prefetch depth. Here a stage's SU units of a row are one contiguous run of
// bytes in the planes layout (SU a multiple of 4, so K-quant super-blocks are whole), copied by
// 16-byte cp.async of consecutive threads (whole 128-byte lines); the warps then read their
// fragments with ldmatrix and shared-memory loads.
//
// Work split. A block owns MVT_WM m16 tiles (tile rows as kernels/mvt.cu: plain, weight rows ob
// .. ob + 15; _glu, gate rows ob .. ob + 7 and their up rows) and MVT_TN n8 column tiles; its
// MVT_WK warps of a tile split the units: unit u goes to warp u % WK (WK divides 32, so that is
// its slot's warp: slot u % 32, slots k, k + WK, ... belong to warp k), MVT_UPW units a warp per
// stage, SU = WK * UPW units a stage.
//
// What is computed, exactly. mv_q8 (MV_KSPLIT 1) gives output (n, b) as: lane slot l folds its
// units u = l, l + 32, ... in increasing u into P_l = T::accum(... T::accum(0, u = l) ...), then
// warp_sum's xor butterfly (offsets 16, 8, 4, 2, 1), then finish(). Here warp k keeps NS = 32 / WK
// partials, P[m] for slot k + WK m, and folds each of its units into its slot's partial with
// G<T>::accum (mma_frag.cuh, as kernels/mvt.cu and gemm.cu: exact integer sums from mma.sync,
// then the explicit-rounding float part): stages run in increasing u, so each slot's units are
// folded in increasing u, as lane l's are. At the end the warp adds its partials in the
// butterfly's levels whose offsets are multiples of WK (16, 8, .., WK: P[m] + P[m + h] for h =
// NS / 2 .. 1, slot offset WK h), and the WK warps' results meet in the last log2 WK levels
// through shared memory exactly as in kernels/mvt.cu. Slots without units (nu < 32) keep +0, as
// mv_q8's lanes without units do. The epilogue is finish()'s. Nothing depends on nb, TN, WM,
// UPW, the stage count or the grid.
//
// Tunables (-D): MV_TYPE (required), MVT_TN (1; 1 or 2), MVT_WK (8; 4, 8, 16), MVT_WM (1),
// MVT_UPW (1; 1, 2, 4), MVT_STAGES (3; >= 2), MVT_MINB (2), MVT_JFIX (1: the Q4_K / Q5_K loop
// compiled per warp-constant j = u & 3), MEMRA_CANARY=1 drops unit 1 of every row.
// Launch: grid = (ceil(N / (OBM MVT_WM)), ceil(nb / (8 MVT_TN))) with OBM = 16 (mvt_q8) or 8
// (mvt_q8_glu), block = 32 MVT_WM MVT_WK, dynamic shared memory MVT_STAGES * STAGE bytes, STAGE =
// 16 WM (SU BPU + 16) + 16 WM roundup16(MST + 4) + 8 TN (64 SU + 16) + 8 TN 16 SU, SU = WK UPW,
// BPU = 64 BULK / BLK, MST = 64 SU META / BLK (experiments/mvt/mvt_check.py's v6_smem).
// K a multiple of 256 for the K-quants (whole super-blocks), of 64 otherwise; planes and xq / xs
// 16-byte aligned.
// (The cp.async / ldmatrix wrappers and SLd below are gemm.cu's: if this variant lands in
// kernels/, they move to a header both include.)
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"

#ifndef MVT_TN
#define MVT_TN 1
#endif
#ifndef MVT_WK
#define MVT_WK 8
#endif
#ifndef MVT_WM
#define MVT_WM 1
#endif
#ifndef MVT_UPW
#define MVT_UPW 1
#endif
#ifndef MVT_STAGES
#define MVT_STAGES 3
#endif
#ifndef MVT_MINB
#define MVT_MINB 2
#endif
#ifndef MVT_JFIX
#define MVT_JFIX 1
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
#if MVT_WK != 4 && MVT_WK != 8 && MVT_WK != 16
#error "MVT_WK must be 4, 8 or 16"
#endif
#if MVT_UPW != 1 && MVT_UPW != 2 && MVT_UPW != 4
#error "MVT_UPW must be 1, 2 or 4"
#endif
#if MVT_TN < 1 || MVT_TN > 2
#error "MVT_TN must be 1 or 2"
#endif
#if MVT_STAGES < 2
#error "MVT_STAGES must be >= 2"
#endif

constexpr int NTHR = 32 * MVT_WM * MVT_WK;
constexpr int NS = 32 / MVT_WK;                 // slots (partials) a warp
constexpr int SU = MVT_WK * MVT_UPW;            // units a stage
constexpr int R = MVT_UPW >= NS ? 1 : NS / MVT_UPW;   // stages per trip: slot index static
constexpr int NO = MVT_TN * 4;                  // C values a thread
constexpr int BN = 8 * MVT_TN;                  // columns a block
constexpr int TR = 16 * MVT_WM;                 // weight rows a block
constexpr int BPU = T::BULK * 64 / T::BLK;      // bulk bytes a unit and row
constexpr int MST = SU * 64 / T::BLK * T::META; // meta bytes a stage and row
static_assert(SU % 4 == 0, "a stage holds whole K-quant super-blocks");
static_assert((SU * BPU) % 32 == 0, "stage rows: an even number of 16-byte pieces");
constexpr int WROW = SU * BPU + 16;             // smem stride of a weight row: odd multiple of 16
constexpr int MROW = (MST + 4 + 15) / 16 * 16;  // meta row: the 4-byte aligned window, +3 bytes slack
constexpr int XROW = SU * 64 + 16;              // activation row (column)
constexpr int SROW = SU * 2 * 8;                // a column's Q8Scale blocks
constexpr int OFF_M = TR * WROW;
constexpr int OFF_X = OFF_M + TR * MROW;
constexpr int OFF_S = OFF_X + BN * XROW;
constexpr int STAGE = OFF_S + BN * SROW;
static_assert(MVT_STAGES * STAGE <= 227 * 1024, "mvt v6: the stages exceed an SM's shared memory");
static_assert((MVT_WK - 1) * MVT_WM * NO * 32 * 4 <= MVT_STAGES * STAGE, "the warps' reduction fits the stages");
#ifdef MVT_EXPECT_SMEM   // the launcher's formula (mvt_check.py's v6_smem), checked at compile time
static_assert(MVT_STAGES * STAGE == MVT_EXPECT_SMEM, "mvt v6: the launcher's shared-memory size differs");
#endif
// every row's meta window starts 4-byte aligned (rows of whole 64-element units: Q5_0's 6-byte
// blocks come in pairs); only Q6_K's 18-byte super-block meta can start 2 bytes in
constexpr bool META4 = T::META % 4 == 0 || (T::BLK == 32 && (2 * T::META) % 4 == 0);
constexpr bool JFIX = MVT_JFIX && (MV_TYPE == 12 || MV_TYPE == 13) && MVT_WK % 4 == 0;

MEMRA_DEVICE uint32_t smem_u32(const void* p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
MEMRA_DEVICE void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
// 4-byte copy reading only n (1..4) source bytes, the rest zero-filled
MEMRA_DEVICE void cp4n(uint32_t dst, const void* src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
MEMRA_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
MEMRA_DEVICE void ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void ldsm2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
// meta fields read from shared memory (qtypes.cuh's load_meta through this loader)
struct SLd {
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};
template <class U> MEMRA_DEVICE void setj(U&, int) {}
MEMRA_DEVICE void setj(TQ4_K::U& w, int j) { w.j = j; }
MEMRA_DEVICE void setj(TQ5_K::U& w, int j) { w.j = j; }

// The weight row behind block row r (tile r / 16, tile row r % 16), clamped: computed, never stored.
template <bool GLU>
MEMRA_DEVICE int wrow_of(int r, int ob0, int N) {
    const int t = r >> 4, i = r & 15;
    if (GLU) {
        const int o = min(ob0 + 8 * t + (i & 7), N - 1);
        return i < 8 ? o : o + N;
    }
    return min(ob0 + 16 * t + i, N - 1);
}

struct Args {
    const uint8_t* bulk; const uint8_t* meta; const int8_t* xq; const Q8Scale* xs;
    int N, K, nb, nu, ob0, cb; size_t brs, mrs;
};

// Stage the weights and meta (part 0) or the activations and scales (part 1) of the stage
// starting at unit u0 into buffer st (shared address).
template <bool GLU>
MEMRA_DEVICE void produce_w(uint32_t st, int u0, const Args& a) {
    const int tid = threadIdx.x;
    constexpr int WP = SU * BPU / 16;                 // 16-byte pieces a row
    const int wlim = (a.nu - u0) * BPU;               // bytes of the row left from u0
#pragma unroll
    for (int i0 = 0; i0 < TR * WP; i0 += NTHR) {
        const int i = i0 + tid;
        if ((TR * WP) % NTHR == 0 || i < TR * WP) {
            const int r = i / WP, c = i % WP;
            if (16 * c < wlim)
                cp16(st + r * WROW + 16 * c, a.bulk + (size_t)wrow_of<GLU>(r, a.ob0, a.N) * a.brs + (size_t)u0 * BPU + 16 * c);
        }
    }
    constexpr int MP = MROW / 4;                      // 4-byte pieces a meta row (window)
#pragma unroll
    for (int i0 = 0; i0 < TR * MP; i0 += NTHR) {
        const int i = i0 + tid;
        if ((TR * MP) % NTHR == 0 || i < TR * MP) {
            const int r = i / MP, c = i % MP;
            const size_t rb = (size_t)wrow_of<GLU>(r, a.ob0, a.N) * a.mrs;    // the row's meta
            const size_t s = rb + T::moff(u0);
            const size_t p = (s & ~(size_t)3) + 4 * c;                       // this piece
            const long long left = (long long)(rb + a.mrs) - (long long)p;   // bytes to the row's end
            if (4 * c < MST + 4 && left > 0)
                cp4n(st + OFF_M + r * MROW + 4 * c, a.meta + p, left < 4 ? (int)left : 4);
        }
    }
}
MEMRA_DEVICE void produce_x(uint32_t st, int u0, const Args& a) {
    const int tid = threadIdx.x;
    constexpr int XP = SU * 64 / 16;
    const int xlim = (a.nu - u0) * 64;
#pragma unroll
    for (int i0 = 0; i0 < BN * XP; i0 += NTHR) {
        const int i = i0 + tid;
        if ((BN * XP) % NTHR == 0 || i < BN * XP) {
            const int col = i / XP, c = i % XP;
            if (16 * c < xlim)
                cp16(st + OFF_X + col * XROW + 16 * c,
                     a.xq + (size_t)min(a.cb + col, a.nb - 1) * a.K + (size_t)u0 * 64 + 16 * c);
        }
    }
    constexpr int SP = SROW / 16;                     // two Q8Scale blocks a piece
    const int slim = (a.nu - u0) * 2;                 // scale blocks left
#pragma unroll
    for (int i0 = 0; i0 < BN * SP; i0 += NTHR) {
        const int i = i0 + tid;
        if ((BN * SP) % NTHR == 0 || i < BN * SP) {
            const int col = i / SP, c = i % SP;
            if (2 * c < slim)
                cp16(st + OFF_S + col * SROW + 16 * c,
                     a.xs + (size_t)min(a.cb + col, a.nb - 1) * (a.K / 32) + 2 * u0 + 2 * c);
        }
    }
}

// One unit of this warp: its fragments from stage buffer (st, stp), folded into partial P[M].
template <int J, bool GLU>
MEMRA_DEVICE void unit(float (&P)[NO], uint32_t st, const uint8_t* stp, int u, int u0, const Args& a,
                       int wm, int gid, int tig, int lane, bool tile1) {
    const int lr = lane & 7, lm = lane >> 3;
    const int r0 = 16 * wm;
    // A: word tig of each bulk chunk of rows r0 + gid, r0 + gid + 8 (ldmatrix: lanes 8m..8m+7
    // give matrix m's rows: rows r0 + 8 (m & 1) + lr of chunk c + (m >> 1))
    uint32_t q[GT::NCH][2];
    const int ubase = u0 * BPU;
#pragma unroll
    for (int c = 0; c + 1 < GT::NCH; c += 2) {
        uint32_t r4[4];
        ldsm4(r4, st + (r0 + 8 * (lm & 1) + lr) * WROW + (GT::chunk(u, c + (lm >> 1)) - ubase));
        q[c][0] = r4[0]; q[c][1] = r4[1]; q[c + 1][0] = r4[2]; q[c + 1][1] = r4[3];
    }
    if (GT::NCH % 2) {
        uint32_t r2[2];
        ldsm2(r2, st + (r0 + 8 * (lm & 1) + lr) * WROW + (GT::chunk(u, GT::NCH - 1) - ubase));
        q[GT::NCH - 1][0] = r2[0]; q[GT::NCH - 1][1] = r2[1];
    }
    typename T::U w[2];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
        const int r = r0 + gid + 8 * rh;
        // the window's start is 4-byte aligned in global memory except for Q6_K rows when K / 256
        // is odd (18-byte meta blocks): then the bytes sit (start & 3) into the window
        const int sh = META4 ? 0 : (int)(((size_t)wrow_of<GLU>(r, a.ob0, a.N) * a.mrs + T::moff(u0)) & 3);
        const uint8_t* mp = stp + OFF_M + r * MROW + sh + (T::moff(u) - T::moff(u0));
        T::template load_meta<SLd>(w[rh], mp, u);
        if (J >= 0) setj(w[rh], J);
    }
    uint32_t af[GT::NK][AR];
    GT::afrag(q, w, tig, af);
    const typename GT::R rq[2] = {GT::rowscal(w[0]), GT::rowscal(w[1])};
    const int sb = T::goff(u, 0, a.nu) / 32 - 2 * u0;     // first scale block of the unit, in the stage
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) {
        if (ni == 1 && !tile1) break;                      // warp-uniform: no live column
        uint32_t xb[4];   // B: word tig of the unit's 4 activation groups of column 8 ni + gid
        ldsm4(xb, st + OFF_X + (8 * ni + lr) * XROW + (T::goff(u, lm, a.nu) - 64 * u0));
        Q8Scale sv[2][4];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const uint8_t* sp = stp + OFF_S + (8 * ni + 2 * tig + cc) * SROW + 8 * sb;
            const uint4 e01 = *reinterpret_cast<const uint4*>(sp);
            if (K16) {
                const uint4 e23 = *reinterpret_cast<const uint4*>(sp + 16);
                sv[cc][0].d = __uint_as_float(e01.x); sv[cc][0].s = (int)e01.y;
                sv[cc][1].d = __uint_as_float(e01.z); sv[cc][1].s = (int)e01.w;
                sv[cc][2].d = __uint_as_float(e23.x); sv[cc][2].s = (int)e23.y;
                sv[cc][3].d = __uint_as_float(e23.z); sv[cc][3].s = (int)e23.w;
            } else {   // groups 0, 1 in block 0; groups 2, 3 in block 1
                sv[cc][0].d = sv[cc][1].d = __uint_as_float(e01.x);
                sv[cc][0].s = sv[cc][1].s = (int)e01.y;
                sv[cc][2].d = sv[cc][3].d = __uint_as_float(e01.z);
                sv[cc][2].s = sv[cc][3].s = (int)e01.w;
            }
        }
        int c[GT::NK][4];
#pragma unroll
        for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], af[k], xb, k);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int ints[T::NI];
#pragma unroll
            for (int k = 0; k < T::NI; ++k) ints[k] = c[k][e];
            P[4 * ni + e] = GT::accum(P[4 * ni + e], rq[e >> 1], ints, sv[e & 1]);
        }
    }
}

// The stage loop: R stages a trip so that the slot index of every unit is a constant.
template <int J, bool GLU>
MEMRA_DEVICE void kloop(float (&P)[NS][NO], uint32_t sbase, const uint8_t* smem, const Args& a,
                        int nst, int wk, int wm, int gid, int tig, int lane, bool tile1) {
    for (int s0 = 0; s0 < nst; s0 += R) {
#pragma unroll
        for (int q = 0; q < R; ++q) {
            const int s = s0 + q;
            if (s >= nst) break;   // block-uniform
            cp_wait<MVT_STAGES - 2>();
            __syncthreads();       // stage s visible to every warp; stage s - 1 read by all
            if (s + MVT_STAGES - 1 < nst) {
                const uint32_t nst_b = sbase + ((s + MVT_STAGES - 1) % MVT_STAGES) * STAGE;
                produce_w<GLU>(nst_b, (s + MVT_STAGES - 1) * SU, a);
                produce_x(nst_b, (s + MVT_STAGES - 1) * SU, a);
            }
            cp_commit();
            const int b = s % MVT_STAGES;
            const uint32_t st = sbase + b * STAGE;
            const uint8_t* stp = smem + b * STAGE;
            const int u0 = s * SU;
#pragma unroll
            for (int i = 0; i < MVT_UPW; ++i) {
                const int u = u0 + wk + MVT_WK * i;
                if (u < a.nu && !(MEMRA_CANARY == 1 && u == 1)) {
                    // slot u % 32 = wk + WK m, m = (UPW s + i) % NS: static (s0 a multiple of R)
                    unit<J, GLU>(P[(MVT_UPW * q + i) % NS], st, stp, u, u0, a, wm, gid, tig, lane, tile1);
                }
            }
        }
    }
}

template <bool GLU>
MEMRA_DEVICE void mvt_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                           const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                           float* y, const float* res, int N, int K, int nb, int act) {
    extern __shared__ __align__(128) uint8_t smem[];   // MVT_STAGES * STAGE bytes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wk = warp % MVT_WK, wm = warp / MVT_WK;
    constexpr int OBM = GLU ? 8 : 16;                  // outputs (rows of y) a tile
    Args a;
    a.bulk = bulk; a.meta = meta; a.xq = xq; a.xs = xs; a.N = N; a.K = K; a.nb = nb;
    a.nu = K / 64; a.ob0 = blockIdx.x * MVT_WM * OBM; a.cb = blockIdx.y * BN;
    a.brs = (size_t)(K / T::BLK) * T::BULK; a.mrs = (size_t)(K / T::BLK) * T::META;
    const bool tile1 = MVT_TN > 1 && a.cb + 8 < nb;
    const int nst = (a.nu + SU - 1) / SU;
    const uint32_t sbase = smem_u32(smem);

    float P[NS][NO];
#pragma unroll
    for (int m = 0; m < NS; ++m)
#pragma unroll
        for (int o = 0; o < NO; ++o) P[m][o] = 0.f;

    // prologue: the first stages' weights before the PDL wait (never written by kernels), their
    // activations after it; one commit group a stage (group 0 also holds the later stages' weights)
#pragma unroll
    for (int s = 0; s < MVT_STAGES - 1; ++s)
        if (s < nst) produce_w<GLU>(sbase + s * STAGE, s * SU, a);
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
#pragma unroll
    for (int s = 0; s < MVT_STAGES - 1; ++s) {
        if (s < nst) produce_x(sbase + s * STAGE, s * SU, a);
        cp_commit();
    }

    if (JFIX) {   // u & 3 == wk & 3 for every unit of this warp (u0 a multiple of 4, WK too)
        switch (wk & 3) {
        case 0: kloop<0, GLU>(P, sbase, smem, a, nst, wk, wm, gid, tig, lane, tile1); break;
        case 1: kloop<1, GLU>(P, sbase, smem, a, nst, wk, wm, gid, tig, lane, tile1); break;
        case 2: kloop<2, GLU>(P, sbase, smem, a, nst, wk, wm, gid, tig, lane, tile1); break;
        default: kloop<3, GLU>(P, sbase, smem, a, nst, wk, wm, gid, tig, lane, tile1); break;
        }
    } else {
        kloop<-1, GLU>(P, sbase, smem, a, nst, wk, wm, gid, tig, lane, tile1);
    }
    cp_wait<0>();

    // the warp's slots in the butterfly's levels of offsets 16 .. WK: P[m] + P[m + h]
    float v[NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        float t[NS];
#pragma unroll
        for (int m = 0; m < NS; ++m) t[m] = P[m][o];
#pragma unroll
        for (int h = NS / 2; h > 0; h >>= 1)
#pragma unroll
            for (int m = 0; m < h; ++m) t[m] = __fadd_rn(t[m], t[m + h]);
        v[o] = t[0];
    }

    // the WK warps' results meet in the last log2 WK levels (offsets WK / 2 .. 1), as kernels/mvt.cu,
    // through the stage buffers (every copy landed, every stage read: after the barrier)
    __syncthreads();
    float (*red)[MVT_WM][NO][32] = reinterpret_cast<float (*)[MVT_WM][NO][32]>(smem);
    if (wk > 0) {
#pragma unroll
        for (int o = 0; o < NO; ++o) red[wk - 1][wm][o][lane] = v[o];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        float t[MVT_WK];
        t[0] = v[o];
#pragma unroll
        for (int k = 1; k < MVT_WK; ++k) t[k] = red[k - 1][wm][o][lane];
#pragma unroll
        for (int off = MVT_WK / 2; off > 0; off >>= 1)
#pragma unroll
            for (int k = 0; k < off; ++k) t[k] = __fadd_rn(t[k], t[k + off]);
        v[o] = t[0];
    }

    // epilogue: finish()'s operations
    const int ob = a.ob0 + wm * OBM;
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni)
#pragma unroll
        for (int e = 0; e < (GLU ? 2 : 4); ++e) {
            const int row = ob + gid + 8 * (e >> 1);
            const int col = a.cb + 8 * ni + 2 * tig + (e & 1);
            if (row >= N || col >= nb) continue;
            const int o = 4 * ni + e;
            float x = v[o];
            if (GLU) {
                const float gte = v[o], up = v[o + 2];   // C rows gid (gate), gid + 8 (up)
                x = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
            }
            const size_t yo = (size_t)col * N + row;
            if (res) x = __fadd_rn(x, res[yo]);
            y[yo] = x;
        }
}

extern "C" __global__ void __launch_bounds__(NTHR, MVT_MINB)
mvt_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
       const float* res, int N, int K, int nb, int act) {
    mvt_body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(NTHR, MVT_MINB)
mvt_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
           const float* res, int N, int K, int nb, int act) {
    mvt_body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
