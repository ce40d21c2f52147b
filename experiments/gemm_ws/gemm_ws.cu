// gemm_ws.cu — experiments/gemm_ws: a warp-specialized successor of kernels/gemm.cu for mv_q8's order at
// 16-128 rows (Q4_K and Q6_K, the 8B Q4_K_M's types), bit-identical to gemm.cu (and so to mv_q8).
// Compiled with -I kernels/ (NVRTC), MV_TYPE=12 or 14.
//
// Same arguments as gemm.cu (gemm_ws / gemm_ws_glu = gemm_q8 / gemm_q8_glu: y[b, n] = sum_k W[n, k] x[b, k],
// the glu form act(gate) * up, res added last, res may alias y).
//
// What is computed: exactly gemm.cu's arithmetic (its header's exactness argument, unchanged): per output
// the 32 slots l = 0..31 of mv_q8's lanes, each a chain over its units u = l, l + 32, .. in increasing u
// through accum_k4f (mma_frag.cuh; Q6_K: TQ6_K::accum_r), merged in the butterfly's tree, then finish()'s
// epilogue. With WS_WK
// warp groups, group k takes the slots l = k (mod WK), the subtree below the butterfly's last log2(WK)
// levels (gemm.cu's GM_WK argument), walked by gemm.cu's static pair structure generalized to LV = 5 -
// log2(WK) levels: pair i = 0 .. 2^(LV-1) - 1 holds leaf 2i = slot k + WK brev_(LV-1)(i) and leaf 2i + 1 =
// that slot + 16 (brev_LV(2i + 1) = brev_LV(2i) + 2^(LV-1), times WK = 16), leaf 2i folded into L0 and
// leaf 2i + 1 into P, then P = L0 + P and the binary counter's levels 1 .. LV - 1 (for WK 1 this is
// gemm.cu's GM_STATIC loop exactly); the groups' roots meet in the last levels, T(k) = T(k) + T(k + o) for
// o = WK/2 .. 1, as gemm.cu's. Only where the operands come from changes:
//  - the row scalars (Q4_K: RK4F, d sc and dmin m of the unit's two sub-blocks; Q6_K: the four 16-groups'
//    int8 scales and d) are computed by a producer warp with the same G<T>::rowscal on the same staged
//    meta bytes (as gemm.cu's GM_RSS pass), into the pad after the staged bulk row;
//  - a column's activation scales are staged as floats by the producer: Q4_K {d0, (float)S0, d1,
//    (float)S1} ((float)S is exact, |S| < 2^12, and accum_k4f converts the same int), Q6_K the four
//    groups' d: the float part's operands are the same;
//  - the integer sums come from the same G<T>::afrag fragments and mma_unit as gemm.cu's.
// So every output's bits equal gemm.cu's (and mv_q8's at any MV_B) for any nb, configuration or grid.
//
// Structure (the design: experiments/gemm_ws/README.md):
//  - WS_PW PRODUCER warps (the block's last); producer p serves the groups k = p (mod PW). A group's
//    positions (its units in its consumption order, tile after tile) each go: ISSUE, once the stage is
//    free (the EMPTY mbarrier of position t - NS), by cp.async (the unit's weight bulk BM x 32 B (Q6_K
//    48), its meta window BM x 16 B (Q6_K 20: 4-byte pieces around the 2-aligned 18 bytes, as gemm.cu),
//    the activations BN x 64 B, the activation scales BN x 16 B (Q6_K 32)) and a
//    cp.async.mbarrier.arrive on the stage's LANDED mbarrier; then the scalar PASS once LANDED completes
//    (row scalars, column floats, each lane on the rows and columns it copied); then an arrive on FULL.
//    The producer polls its groups (test_wait, warp-uniform by __all_sync) and never blocks on one: with
//    WK > 1 the consumer groups meet at a barrier each tile, so a producer blocked on one group's EMPTY
//    could hold back a pass another group needs (a deadlock experiments/gemm_ws/selftest.py found in the
//    round-based first draft).
//  - WS_WK groups of WS_WM x WS_WN CONSUMER warps, each warp gemm.cu's warp tile (WS_TM m16 x WS_TN n8):
//    wait on FULL, ldmatrix + IMMA + the exact float part + the slot stack, then one lane arrives on the
//    stage's EMPTY mbarrier (WM x WN arrivals). No __syncthreads in the main loop; with WK > 1 the
//    consumers meet at a named barrier (bar.sync 1, the consumer threads) twice a tile for the roots.
//  - a ring of WS_STAGES stages a group, one unit each, in the group's consumption order
//    (experiments/gemm_ws/selftest.py models the protocol statement for statement under random schedules).
//  - tiles: the block loops over tiles tile = blockIdx.x, + gridDim.x, .. (ntiles = ceil(N / OBM) x
//    ceil(nb / BN), row tile fastest): a grid of ntiles blocks is gemm.cu's launch; a smaller grid is
//    persistent, the producers staging the next tile's units during the consumers' epilogue.
//
// Tunables (-D): WS_WM (2), WS_WN (2) consumer warps of a group, WS_TM (2, even for _glu), WS_TN (4) tiles
// a warp, WS_WK (1; 1, 2, 4, 8, 16) groups, WS_PW (1; divides WS_WK) producer warps, WS_STAGES (4; >= 2) a
// group, WS_LREG (1; 1 .. LV stack levels in registers), WS_MINB (1; __launch_bounds__ blocks an SM),
// WS_SLEEP (0; ns a producer sleeps after a poll round that moved nothing), WS_GLU (0: the module holds
// gemm_ws, 1: gemm_ws_glu). MEMRA_CANARY=1 drops unit 1 of every row (a check must catch it).
// Launch: grid = (G, 1, 1), G = ntiles (one tile a block) or fewer (persistent); block = 32 (WS_WM WS_WN
// WS_WK + WS_PW); dynamic shared memory = WK NS STAGE + (LV - LREG) NOUT NC 4 + (WK > 1 ? NC NOUT 4 : 0)
// + 24 WK NS, with STAGE = round128(BM WBS + BN 80 + BN XCB + BM MCB) (Q4_K: WBS 48, XCB 16, MCB 16; Q6_K:
// 80, 32, 20), BM = 16 WS_WM WS_TM, BN = 8 WS_WN
// WS_TN, NOUT = 4 WS_TM WS_TN, NC = 32 WS_WM WS_WN WS_WK, LV = 5 - log2(WK); the module's gemm_ws_smem
// holds the value (experiments/gemm_ws/check.py compares its formula). Contract as gemm.cu's: K a multiple
// of 256, planes and xq / xs 16-byte aligned.
//
// History:
//  1. (this) first version, not yet run on a device. Static SASS of the unit loop (experiments/gemm_ws/
//     sass.py): Q4_K 2,2,2,4 24.2 instructions an IMMA against gemm.cu's 32.5 in the same configuration
//     (2,2,2,4,1,3,1,1), 2,2,2,2 27.7 against 40.8 (the exact formula's 9 operations an output and unit
//     ~74 % of it); Q6_K 2,2,2,4 18.9 against 23.9 (k16 IMMAs).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "mma_frag.cuh"

#if MV_TYPE != 12 && MV_TYPE != 14
#error "gemm_ws.cu: MV_TYPE must be 12 (Q4_K) or 14 (Q6_K)"
#endif
#ifndef WS_WM
#define WS_WM 2
#endif
#ifndef WS_WN
#define WS_WN 2
#endif
#ifndef WS_TM
#define WS_TM 2
#endif
#ifndef WS_TN
#define WS_TN 4
#endif
#ifndef WS_WK
#define WS_WK 1
#endif
#ifndef WS_PW
#define WS_PW 1
#endif
#ifndef WS_STAGES
#define WS_STAGES 4
#endif
#ifndef WS_SLEEP
#define WS_SLEEP 0
#endif
#ifndef WS_LREG
#define WS_LREG 1
#endif
#ifndef WS_MINB
#define WS_MINB 1
#endif
#ifndef WS_GLU
#define WS_GLU 0
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
#if WS_WK != 1 && WS_WK != 2 && WS_WK != 4 && WS_WK != 8 && WS_WK != 16
#error "WS_WK must be 1, 2, 4, 8 or 16"
#endif
static_assert(WS_PW >= 1 && WS_WK % WS_PW == 0, "WS_PW must divide WS_WK");
static_assert(WS_STAGES >= 2, "WS_STAGES must be >= 2");

typedef G<T> GT;
constexpr int WK = WS_WK, PW = WS_PW, NS = WS_STAGES;
constexpr int NGW = WS_WM * WS_WN;          // consumer warps of a group
constexpr int NCW = NGW * WK;               // consumer warps
constexpr int NC = 32 * NCW;                // consumer threads
constexpr int NTHR = NC + 32 * PW;          // + the producer warps
constexpr int BM = WS_WM * WS_TM * 16;      // weight rows of a tile
constexpr int BN = WS_WN * WS_TN * 8;       // activation columns of a tile
constexpr int NOUT = WS_TM * WS_TN * 4;     // outputs a consumer thread
constexpr int SKB = WK == 1 ? 0 : WK == 2 ? 1 : WK == 4 ? 2 : WK == 8 ? 3 : 4;
constexpr int LV = 5 - SKB;                 // stack levels of a group's subtree
constexpr int NPAIR = 1 << (LV - 1);        // leaf pairs of a group
static_assert(WS_LREG >= 1 && WS_LREG <= LV, "WS_LREG must be in 1 .. LV");
constexpr int LSM = LV - WS_LREG;           // stack levels in shared memory
// Per type: a unit's bulk chunks (16 bytes each) and the row record after them in the staged row (WBS: an
// odd multiple of 16, so ldmatrix rows hit distinct banks); the staged column-scale bytes of a column (raw
// Q8Scale, then rewritten in place as floats by the pass: Q4_K {d0, (float)S0, d1, (float)S1}, Q6_K the four
// groups' d); the staged meta bytes of a row.
#if MV_TYPE == 12
constexpr int NCHW = 2, OFF_RS = 32, WBS = 48, XCB = 16, MCB = 16;   // row record RK4F (16 B)
#else
constexpr int NCHW = 3, OFF_RS = 48, WBS = 80, XCB = 32, MCB = 20;   // row record int sc[4] + float d (20 B)
#endif
static_assert(NCHW == GT::NCH, "bulk chunks");
constexpr int XS = 80;                      // a column's 64 activation bytes, padded
constexpr int OFF_X = BM * WBS;
constexpr int OFF_C = OFF_X + BN * XS;      // column records: raw Q8Scale, then floats (the pass)
constexpr int OFF_M = OFF_C + BN * XCB;     // meta windows (MCB bytes a row)
constexpr int STAGE = (OFF_M + BM * MCB + 127) / 128 * 128;
constexpr int OFF_STACK = WK * NS * STAGE;
constexpr int OFF_RED = OFF_STACK + LSM * NOUT * NC * 4;
constexpr int OFF_BAR = OFF_RED + (WK > 1 ? NC * NOUT * 4 : 0);
constexpr int SMEM = OFF_BAR + 24 * WK * NS;
extern "C" __device__ const int gemm_ws_smem = SMEM;   // read by experiments/gemm_ws/check.py
static_assert(OFF_X % 16 == 0 && OFF_C % 16 == 0 && OFF_M % 16 == 0 && OFF_STACK % 16 == 0 && OFF_RED % 16 == 0,
              "alignment");
static_assert(BM % 32 == 0, "the producer's lanes: BM a multiple of 32 (BN any multiple of 8)");

// ---------------------------------------------------------------------------------
// PTX wrappers
MEMRA_DEVICE uint32_t smem_u32(const void* p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
MEMRA_DEVICE void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
// an arrive on `bar` once every cp.async this thread issued before has completed (no pending-count increment:
// the barrier's count includes these arrivals)
MEMRA_DEVICE void cp_arrive_landed(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
MEMRA_DEVICE void cp4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}
MEMRA_DEVICE void cp4n(uint32_t dst, const void* src, int n) {   // 4 bytes, only n read (the rest zero)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
MEMRA_DEVICE void ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void ldsm2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
struct SLd {   // qtypes.cuh's meta loaders from shared memory (gemm.cu's)
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};

// ---------------------------------------------------------------------------------
// Per type: staging a row's meta window (issue), the row record and the column record (the pass)
#if MV_TYPE == 12
// Q4_K: the super-block's 16 meta bytes (d, dmin, scales[12]), 16-byte aligned
MEMRA_DEVICE void stage_meta(uint32_t dst, const uint8_t* m) { cp16(dst, m); }
// the row record: RK4F {d sc, dmin m} of the unit's sub-blocks 2j, 2j + 1 (gemm.cu's G<TQ4_K>::rowscal)
MEMRA_DEVICE void pass_row(uint8_t* rec, const uint8_t* mw, const uint8_t*, int u) {
    TQ4_K::U w;
    T::template load_meta<SLd>(w, mw, u);
    const RK4F f = GT::rowscal(w);
    *reinterpret_cast<float4*>(rec) = make_float4(f.dsc0, f.dm0, f.dsc1, f.dm1);
}
// the column record: {d0, (float)S0, d1, (float)S1} of blocks 2u, 2u + 1 (accum_k4f converts the same ints)
MEMRA_DEVICE void pass_col(uint8_t* c) {
    const uint4 e = *reinterpret_cast<const uint4*>(c);
    *reinterpret_cast<float4*>(c) = make_float4(__uint_as_float(e.x), (float)(int)e.y, __uint_as_float(e.z), (float)(int)e.w);
}
#else
// Q6_K: the super-block's 18 meta bytes (scales[16], d) start 2-byte aligned: the 20 bytes from their start
// rounded down to 4, the last word reading only the bytes that belong (2 when the start is 4-aligned: never
// past the plane's end); gemm.cu's produce_meta window
MEMRA_DEVICE void stage_meta(uint32_t dst, const uint8_t* m) {
    const uint8_t* a = reinterpret_cast<const uint8_t*>(reinterpret_cast<unsigned long long>(m) & ~(unsigned long long)3);
#pragma unroll
    for (int c = 0; c < 4; ++c) cp4(dst + 4 * c, a + 4 * c);
    cp4n(dst + 16, a + 16, (reinterpret_cast<unsigned long long>(m) & 3) ? 4 : 2);
}
// the row record: TQ6_K::R {sc[4] (the unit's four 16-groups' int8 scales), d}; gm (the window's global
// address) says where the 18 bytes start in it
MEMRA_DEVICE void pass_row(uint8_t* rec, const uint8_t* mw, const uint8_t* gm, int u) {
    TQ6_K::U w;
    T::template load_meta<SLd>(w, mw + (reinterpret_cast<unsigned long long>(gm) & 3), u);
    const TQ6_K::R q = GT::rowscal(w);
    *reinterpret_cast<int4*>(rec) = make_int4(q.sc[0], q.sc[1], q.sc[2], q.sc[3]);
    *reinterpret_cast<float*>(rec + 16) = q.d;
}
// the column record: the four groups' block scales d (blocks goff(u, 0) / 32 + g), in place of the raw 32 bytes
MEMRA_DEVICE void pass_col(uint8_t* c) {
    const uint4 e0 = *reinterpret_cast<const uint4*>(c), e1 = *reinterpret_cast<const uint4*>(c + 16);
    *reinterpret_cast<float4*>(c) = make_float4(__uint_as_float(e0.x), __uint_as_float(e0.z), __uint_as_float(e1.x),
                                                __uint_as_float(e1.z));
}
#endif
MEMRA_DEVICE void bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
MEMRA_DEVICE void bar_arrive(uint32_t bar) {   // release at CTA scope: this thread's earlier accesses
    asm volatile("{ .reg .b64 st; mbarrier.arrive.release.cta.shared::cta.b64 st, [%0]; }" :: "r"(bar) : "memory");
}
MEMRA_DEVICE bool bar_test(uint32_t bar, uint32_t parity) {   // non-blocking: has the phase of this parity completed
    uint32_t ok;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok != 0;
}
MEMRA_DEVICE void bar_wait(uint32_t bar, uint32_t parity) {   // acquire: the phase of this parity completed
    uint32_t ok;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    } while (!ok);
}
MEMRA_DEVICE void consumers_sync() {   // the consumer warps only (the producers never come)
    asm volatile("bar.sync 1, %0;" :: "n"(NC) : "memory");
}

// Which weight row smem row r of the tile holds (gemm.cu's weight_row_of: clamped rows are loaded and
// computed, never stored; glu: warp wm's m tiles [0, TM/2) gate rows, [TM/2, TM) the up rows).
template <bool GLU>
MEMRA_DEVICE int weight_row_of(int r, int ob, int N) {
    if (!GLU) return min(ob + r, N - 1);
    const int wm = r / (WS_TM * 16), mi = (r / 16) % WS_TM, i = r % 16;
    const int o = ob + wm * (WS_TM / 2) * 16 + (mi % (WS_TM / 2)) * 16 + i;
    return min(o, N - 1) + (mi >= WS_TM / 2 ? N : 0);
}

// leaf 2i's slot of group k: k + WK brev_(LV-1)(i)
MEMRA_DEVICE int pair_slot(int k, int i) {
    return k + (LV > 1 ? WK * (int)(__brev((unsigned)i) >> (33 - LV)) : 0);
}

// A group's staged sequence: its consumption order over a tile's units (pair i, half h: slot
// pair_slot(k, i) + 16 h, its units in increasing u), then the next tile's. `wrapped` after a tile's last.
struct Walk {
    int k, i, h, u;
    bool wrapped;
    // a group with units (k < nu: its smallest slot is k); an empty group is never walked
    MEMRA_DEVICE void start(int kk, int nu) { k = kk; i = 0; h = 0; u = k; wrapped = false; settle(nu); }
    MEMRA_DEVICE void settle(int nu) {
        while (u >= nu) {
            if (h == 0) { h = 1; u = pair_slot(k, i) + 16; }
            else if (++i < NPAIR) { h = 0; u = pair_slot(k, i); }
            else { i = 0; h = 0; u = k; wrapped = true; return; }   // u = k < nu: the next tile's first unit
        }
    }
    MEMRA_DEVICE void next(int nu) { u += 32; settle(nu); }
};

struct Tile { int ob, cb; };
template <bool GLU>
MEMRA_DEVICE Tile tile_of(int tile, int N) {
    constexpr int OBM = GLU ? BM / 2 : BM;
    const int nrt = (N + OBM - 1) / OBM;
    return {(tile % nrt) * OBM, (tile / nrt) * BN};
}

// A producer lane's global sources in a tile, computed once a tile (a unit adds 32 u, 16 (u >> 2), 64 u, 2 u):
// the bulk and meta rows of smem rows lane + 32 q, the activation chunk (column (lane + 32 q) / 4, group
// (lane + 32 q) % 4) and the scales of column lane + 32 q.
constexpr int NXQ = BN / 8, NSQ = (BN + 31) / 32;
struct Src {
    const uint8_t* b[BM / 32];
    const uint8_t* m[BM / 32];
    const int8_t* x[NXQ];
    const Q8Scale* s[NSQ];
};
template <bool GLU>
MEMRA_DEVICE void src_of(Src& o, int tile, int lane, const uint8_t* bulk, const uint8_t* meta, const int8_t* xq,
                         const Q8Scale* xs, int N, int K, int nb, size_t brs, size_t mrs) {
    const Tile tl = tile_of<GLU>(tile, N);
#pragma unroll
    for (int q = 0; q < BM / 32; ++q) {
        const size_t row = (size_t)weight_row_of<GLU>(lane + 32 * q, tl.ob, N);
        o.b[q] = bulk + row * brs;
        o.m[q] = meta + row * mrs;
    }
#pragma unroll
    for (int q = 0; q < NXQ; ++q) {   // + T::goff(u, g) - T::goff(u, 0) = 16 g (Q4_K), 32 g (Q6_K)
        const int i = lane + 32 * q;
        o.x[q] = xq + (size_t)min(tl.cb + (i >> 2), nb - 1) * K + (T::goff(0, i & 3, 0) - T::goff(0, 0, 0));
    }
#pragma unroll
    for (int q = 0; q < NSQ; ++q)
        o.s[q] = xs + (size_t)min(tl.cb + min(lane + 32 * q, BN - 1), nb - 1) * (K / 32);
}

template <bool GLU>
MEMRA_DEVICE void ws_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                          const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                          float* y, const float* res, int N, int K, int nb, int act) {
    extern __shared__ __align__(128) uint8_t ws_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int OBM = GLU ? BM / 2 : BM;
    const int nu = K / 64;
    const size_t brs = (size_t)(K / 256) * T::BULK, mrs = (size_t)(K / 256) * T::META;
    const int ntiles = ((N + OBM - 1) / OBM) * ((nb + BN - 1) / BN);
    const uint32_t sbase = smem_u32(ws_smem);
    // [group][stage] each: FULL (the pass done: 32 producer lanes), EMPTY (the group's NGW consumer warps),
    // LANDED (the stage's copies done: the 32 lanes' cp.async.mbarrier.arrive)
    const uint32_t full0 = sbase + OFF_BAR, empty0 = full0 + 8 * WK * NS, landed0 = empty0 + 8 * WK * NS;

    if (tid == 0) {
#pragma unroll 1
        for (int s = 0; s < WK * NS; ++s) {
            bar_init(full0 + 8 * s, 32);
            bar_init(empty0 + 8 * s, NGW);
            bar_init(landed0 + 8 * s, 32);
        }
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    __syncthreads();   // the barriers initialized; after this the producers never meet the consumers at a barrier

    if (warp >= NCW) {
        // ============================== producers ==============================
        constexpr int MG = WK / PW;   // groups of this producer: k = p + PW j
        const int p = warp - NCW;
        Walk w[MG], pw[MG];           // the issue walk and the scalar pass's walk of each group
        int tile[MG], iss[MG], tp[MG];   // tile being issued, positions issued, positions passed
        bool gdone[MG];
        Src src[MG];                  // the sources of the tile being issued
#if MV_TYPE == 14
        Src psrc[MG];                 // Q6_K: the pass's tile's (its meta windows' alignment)
        int ptile[MG];
#else
        Src (&psrc)[MG] = src;        // Q4_K: the pass reads only the stage
#endif
#pragma unroll
        for (int j = 0; j < MG; ++j) {
            const int k = p + PW * j;
            w[j].start(k, nu);
            pw[j].start(k, nu);
            tile[j] = blockIdx.x;
            gdone[j] = tile[j] >= ntiles || k >= nu;   // no tile, or a group without units (nu <= k)
            iss[j] = tp[j] = 0;
            if (!gdone[j]) src_of<GLU>(src[j], tile[j], lane, bulk, meta, xq, xs, N, K, nb, brs, mrs);
#if MV_TYPE == 14
            ptile[j] = tile[j];
            psrc[j] = src[j];
#endif
        }
        // Each group's positions go issue -> LANDED (the lanes' cp.async done: cp.async.mbarrier.arrive) ->
        // pass -> FULL. The producer polls (never blocks on one group while another could move: with WK > 1
        // the consumer groups meet at a barrier each tile, so a producer blocked on one group's EMPTY could
        // hold back the pass another group waits for). Warp-uniform decisions (__all_sync of the polls).
        for (;;) {
            bool busy = false, moved = false;
#pragma unroll
            for (int j = 0; j < MG; ++j) {
                const int k = p + PW * j;
                if (tp[j] < iss[j]) {   // the oldest issued position, once landed: the scalar pass
                    busy = true;
                    const int s = k * NS + tp[j] % NS;
                    if (__all_sync(0xffffffffu, bar_test(landed0 + 8 * s, (uint32_t)((tp[j] / NS) & 1)))) {
                        moved = true;
                        uint8_t* sp = ws_smem + s * STAGE;
                        const int u = pw[j].u;
#pragma unroll
                        for (int q = 0; q < BM / 32; ++q) {
                            const int r = lane + 32 * q;
                            pass_row(sp + r * WBS + OFF_RS, sp + OFF_M + MCB * r, psrc[j].m[q] + T::moff(u), u);
                        }
#pragma unroll
                        for (int q = 0; q < (BN + 31) / 32; ++q) {
                            const int col = lane + 32 * q;
                            if (BN % 32 != 0 && col >= BN) break;
                            pass_col(sp + OFF_C + XCB * col);
                        }
                        bar_arrive(full0 + 8 * s);
                        ++tp[j];
                        pw[j].next(nu);
#if MV_TYPE == 14
                        if (pw[j].wrapped) {
                            pw[j].wrapped = false;
                            ptile[j] += gridDim.x;
                            if (ptile[j] < ntiles) src_of<GLU>(psrc[j], ptile[j], lane, bulk, meta, xq, xs, N, K, nb, brs, mrs);
                        }
#endif
                    }
                }
                if (!gdone[j]) {        // the next position, once its stage is free (EMPTY of position t - NS)
                    busy = true;
                    const int t = iss[j];
                    const int s = k * NS + t % NS;
                    if (t < NS || __all_sync(0xffffffffu, bar_test(empty0 + 8 * s, (uint32_t)((t / NS - 1) & 1)))) {
                        moved = true;
                        const uint32_t st = sbase + s * STAGE;
                        const int u = w[j].u;
                        const Src& o = src[j];
                        // weight bulk: BM rows x 2 chunks of 16 bytes; meta window: BM rows x 16 bytes
#pragma unroll
                        for (int q = 0; q < BM / 32; ++q) {
                            const int r = lane + 32 * q;
#pragma unroll
                            for (int c = 0; c < NCHW; ++c) cp16(st + r * WBS + 16 * c, o.b[q] + GT::chunk(u, c));
                            stage_meta(st + OFF_M + MCB * r, o.m[q] + T::moff(u));
                        }
                        // activations: BN columns x 4 groups of 16 bytes; scales: blocks 2u, 2u + 1 of each column
#pragma unroll
                        for (int q = 0; q < NXQ; ++q) {
                            const int i = lane + 32 * q;
                            cp16(st + OFF_X + (i >> 2) * XS + 16 * (i & 3), o.x[q] + T::goff(u, 0, 0));
                        }
#pragma unroll
                        for (int q = 0; q < NSQ; ++q) {
                            const int col = lane + 32 * q;
                            if (BN % 32 != 0 && col >= BN) break;
#pragma unroll
                            for (int c = 0; c < XCB / 16; ++c)   // blocks goff(u, 0) / 32 ..
                                cp16(st + OFF_C + XCB * col + 16 * c, o.s[q] + T::goff(u, 0, 0) / 32 + 2 * c);
                        }
                        cp_arrive_landed(landed0 + 8 * s);   // LANDED completes when every lane's copies have
                        ++iss[j];
                        w[j].next(nu);
                        if (w[j].wrapped) {   // the tile's units are all issued
                            w[j].wrapped = false;
                            tile[j] += gridDim.x;
                            gdone[j] = tile[j] >= ntiles;
                            if (!gdone[j]) src_of<GLU>(src[j], tile[j], lane, bulk, meta, xq, xs, N, K, nb, brs, mrs);
                        }
                    }
                }
            }
            if (!busy) break;   // every position issued and passed
#if WS_SLEEP > 0
            if (!moved) __nanosleep(WS_SLEEP);
#endif
            (void)moved;
        }
        return;
    }

    // ============================== consumers ==============================
    const int gid = lane >> 2, tig = lane & 3;
    const int gk = warp / NGW, gw = warp % NGW;   // group, warp in the group
    const int wm = gw / WS_WN, wn = gw % WS_WN;
    const int lr = lane & 7, lm = lane >> 3;      // ldmatrix: lanes 8m..8m+7 give matrix m's rows
    constexpr int NO = NOUT;
    float P[NO], Lr[WS_LREG][NO];
    float* Ls = reinterpret_cast<float*>(ws_smem + OFF_STACK);   // [level - LREG][o][consumer thread]
    auto Lget = [&](int l, int o) -> float { return l < WS_LREG ? Lr[l][o] : Ls[((l - WS_LREG) * NO + o) * NC + tid]; };
    auto Lset = [&](int l, int o, float v) {
        if (l < WS_LREG) Lr[l][o] = v; else Ls[((l - WS_LREG) * NO + o) * NC + tid] = v;
    };
    int t = 0;   // this group's staged positions consumed

    // a unit's work on stage `st`; FULL: every n tile of the tile has live columns
    auto consume = [&](const bool FULL, float (&acc)[NO], const uint32_t st, const uint8_t* stp, const int cb) {
        uint32_t xb[WS_TN][4];
        float4 cs[WS_TN][2];   // columns 2 tig, 2 tig + 1 of each n tile: Q4_K {d0, S0, d1, S1}, Q6_K {d0..d3}
#pragma unroll
        for (int ni = 0; ni < WS_TN; ++ni) {
            const int c0 = (wn * WS_TN + ni) * 8;
            ldsm4(xb[ni], st + OFF_X + (c0 + lr) * XS + 16 * lm);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc)
                cs[ni][cc] = *reinterpret_cast<const float4*>(stp + OFF_C + XCB * (c0 + 2 * tig + cc));
        }
#pragma unroll
        for (int mi = 0; mi < WS_TM; ++mi) {
            const int r0 = (wm * WS_TM + mi) * 16;
            // raw bulk words: q[c][rh] = word tig of chunk c of row r0 + gid + 8 rh (gemm.cu's ldmatrix)
            uint32_t q[NCHW][2];
            {
                uint32_t r4[4];
                ldsm4(r4, st + (r0 + 8 * (lm & 1) + lr) * WBS + 16 * (lm >> 1));
                q[0][0] = r4[0]; q[0][1] = r4[1]; q[1][0] = r4[2]; q[1][1] = r4[3];
            }
            if (NCHW == 3) {
                uint32_t r2[2];
                ldsm2(r2, st + (r0 + 8 * (lm & 1) + lr) * WBS + 32);
                q[NCHW - 1][0] = r2[0]; q[NCHW - 1][1] = r2[1];
            }
            typename GT::R rq[2];
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const uint8_t* rp = stp + (r0 + gid + 8 * rh) * WBS + OFF_RS;
#if MV_TYPE == 12
                const float4 v = *reinterpret_cast<const float4*>(rp);
                rq[rh].dsc0 = v.x; rq[rh].dm0 = v.y; rq[rh].dsc1 = v.z; rq[rh].dm1 = v.w;
#else
                const int4 v = *reinterpret_cast<const int4*>(rp);
                rq[rh].sc[0] = v.x; rq[rh].sc[1] = v.y; rq[rh].sc[2] = v.z; rq[rh].sc[3] = v.w;
                rq[rh].d = *reinterpret_cast<const float*>(rp + 16);
#endif
            }
            typename T::U wu[2];
            uint32_t a[GT::NK][AR];
            GT::afrag(q, wu, tig, a);
#pragma unroll
            for (int ni = 0; ni < WS_TN; ++ni) {
                if (!FULL && cb + (wn * WS_TN + ni) * 8 >= nb) continue;   // warp-uniform: no live column
                int c[GT::NK][4];
#pragma unroll
                for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], xb[ni], k);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const typename GT::R& r = rq[e >> 1];
                    const float4& s = cs[ni][e & 1];
                    const int o = (mi * WS_TN + ni) * 4 + e;
#if MV_TYPE == 12
                    // accum_k4f with the column's floats: the same operations on the same operands
                    const float fa = __fmaf_rn(r.dsc0, (float)c[0][e], -__fmul_rn(r.dm0, s.y));
                    const float fb = __fmaf_rn(r.dsc1, (float)c[1][e], -__fmul_rn(r.dm1, s.w));
                    acc[o] = __fadd_rn(acc[o], __fmaf_rn(fa, s.x, __fmul_rn(fb, s.z)));
#else
                    // TQ6_K::accum_r with the column's group scales d: the same operations on the same operands
                    float v = 0.f;
                    v = __fmaf_rn(s.x, (float)(r.sc[0] * c[0][e]), v);
                    v = __fmaf_rn(s.y, (float)(r.sc[1] * c[1][e]), v);
                    v = __fmaf_rn(s.z, (float)(r.sc[2] * c[2][e]), v);
                    v = __fmaf_rn(s.w, (float)(r.sc[3] * c[3][e]), v);
                    acc[o] = __fmaf_rn(r.d, v, acc[o]);
#endif
                }
            }
        }
    };

    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const Tile tl = tile_of<GLU>(tile, N);
        const bool full = tl.cb + BN <= nb;   // block-uniform
        auto step = [&](float (&acc)[NO], const int u) {
            const int s = gk * NS + t % NS;
            bar_wait(full0 + 8 * s, (uint32_t)((t / NS) & 1));
            const uint32_t st = sbase + s * STAGE;
            const uint8_t* stp = ws_smem + s * STAGE;
            if (!(MEMRA_CANARY == 1 && u == 1)) {
                if (full) consume(true, acc, st, stp, tl.cb); else consume(false, acc, st, stp, tl.cb);
            }
            __syncwarp();
            if (lane == 0) bar_arrive(empty0 + 8 * s);
            ++t;
        };
        float (&A)[NO] = Lr[0];
#pragma unroll 1
        for (int i = 0; i < NPAIR; ++i) {
            const int sa = pair_slot(gk, i);
#pragma unroll
            for (int o = 0; o < NO; ++o) { A[o] = 0.f; P[o] = 0.f; }
#pragma unroll 1
            for (int u = sa; u < nu; u += 32) step(A, u);
#pragma unroll 1
            for (int u = sa + 16; u < nu; u += 32) step(P, u);
#pragma unroll
            for (int o = 0; o < NO; ++o) P[o] = __fadd_rn(A[o], P[o]);   // level 0: L0 + v
#pragma unroll
            for (int l = 1; l < LV; ++l) {
                if (!((i >> (l - 1)) & 1)) {
#pragma unroll
                    for (int o = 0; o < NO; ++o) Lset(l, o, P[o]);
                    break;
                }
#pragma unroll
                for (int o = 0; o < NO; ++o) P[o] = __fadd_rn(Lget(l, o), P[o]);
            }
        }
        // the groups' roots meet in the butterfly's last levels: T(k) = T(k) + T(k + o), o = WK/2 .. 1
        if (WK > 1) {
            float* red = reinterpret_cast<float*>(ws_smem + OFF_RED);   // [group][warp of group][o][lane]
            if (gk > 0) {
#pragma unroll
                for (int o = 0; o < NO; ++o) red[((gk * NGW + gw) * NO + o) * 32 + lane] = P[o];
            }
            consumers_sync();
            if (gk == 0) {
#pragma unroll
                for (int o = 0; o < NO; ++o) {
                    float v[WK];
                    v[0] = P[o];
#pragma unroll
                    for (int k = 1; k < WK; ++k) v[k] = red[((k * NGW + gw) * NO + o) * 32 + lane];
#pragma unroll
                    for (int off = WK / 2; off > 0; off >>= 1)
#pragma unroll
                        for (int k = 0; k < off; ++k) v[k] = __fadd_rn(v[k], v[k + off]);
                    P[o] = v[0];
                }
            }
            consumers_sync();   // the buffer is read before the next tile's roots overwrite it
            if (gk > 0) continue;
        }
        // epilogue (group 0): finish()'s operations
        constexpr int TMO = GLU ? WS_TM / 2 : WS_TM;
#pragma unroll
        for (int mi = 0; mi < TMO; ++mi)
#pragma unroll
            for (int ni = 0; ni < WS_TN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = tl.ob + (wm * TMO + mi) * 16 + gid + 8 * (e >> 1);
                    const int col = tl.cb + (wn * WS_TN + ni) * 8 + 2 * tig + (e & 1);
                    if (row >= N || col >= nb) continue;
                    const int o = (mi * WS_TN + ni) * 4 + e;
                    float v = P[o];
                    if (GLU) {
                        const float gte = P[o], up = P[o + TMO * WS_TN * 4];
                        v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
                    }
                    const size_t yo = (size_t)col * N + row;
                    if (res) v = __fadd_rn(v, res[yo]);
                    y[yo] = v;
                }
    }
}

// One entry a module (WS_GLU 0: gemm_ws, 1: gemm_ws_glu): ptxas 13.0 / NVRTC 13.5 crash (SIGSEGV) on a module
// holding both (each alone compiles).
#if !WS_GLU
extern "C" __global__ void __launch_bounds__(NTHR, WS_MINB)
gemm_ws(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
        const float* res, int N, int K, int nb, int act) {
    ws_body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
#else
extern "C" __global__ void __launch_bounds__(NTHR, WS_MINB)
gemm_ws_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
            const float* res, int N, int K, int nb, int act) {
#if WS_TM % 2 == 0
    ws_body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#else
    asm volatile("trap;");   // _glu pairs gate and up m tiles: WS_TM must be even
#endif
}
#endif
