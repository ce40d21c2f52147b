// gemm_ws.cu — experiments/gemm_ws: a warp-specialized successor of kernels/gemm.cu for mv_q8's order at
// 16-128 rows (Q4_K only in this first version), bit-identical to gemm.cu (and so to mv_q8).
// Compiled with -I kernels/ (NVRTC), MV_TYPE=12.
//
// Same arguments as gemm.cu (gemm_ws / gemm_ws_glu = gemm_q8 / gemm_q8_glu: y[b, n] = sum_k W[n, k] x[b, k],
// the glu form act(gate) * up, res added last, res may alias y).
//
// What is computed: exactly gemm.cu's arithmetic (its header's exactness argument, unchanged): per output
// the 32 slots l = 0..31 of mv_q8's lanes, each a chain over its units u = l, l + 32, .. in increasing u
// through accum_k4f (mma_frag.cuh), merged in the butterfly's tree, then finish()'s epilogue. With WS_WK
// warp groups, group k takes the slots l = k (mod WK), the subtree below the butterfly's last log2(WK)
// levels (gemm.cu's GM_WK argument), walked by gemm.cu's static pair structure generalized to LV = 5 -
// log2(WK) levels: pair i = 0 .. 2^(LV-1) - 1 holds leaf 2i = slot k + WK brev_(LV-1)(i) and leaf 2i + 1 =
// that slot + 16 (brev_LV(2i + 1) = brev_LV(2i) + 2^(LV-1), times WK = 16), leaf 2i folded into L0 and
// leaf 2i + 1 into P, then P = L0 + P and the binary counter's levels 1 .. LV - 1 (for WK 1 this is
// gemm.cu's GM_STATIC loop exactly); the groups' roots meet in the last levels, T(k) = T(k) + T(k + o) for
// o = WK/2 .. 1, as gemm.cu's. Only where the operands come from changes:
//  - the row scalars (RK4F: d sc, dmin m of the unit's two sub-blocks) are computed by a producer warp
//    with the same rk4f(rowscal_k4_uniform(meta, u & 3)) on the same staged meta bytes (as GM_RSS does),
//    into the 16-byte pad of the staged bulk row;
//  - a column's activation scales are staged as floats {d0, (float)S0, d1, (float)S1} by the producer:
//    (float)S is exact (|S| < 2^12) and accum_k4f converts the same int, so its operands are the same;
//  - the integer sums come from the same G<TQ4_K>::afrag fragments and mma_unit as gemm.cu's.
// So every output's bits equal gemm.cu's (and mv_q8's at any MV_B) for any nb, configuration or grid.
//
// Structure (the design: experiments/gemm_ws/README.md):
//  - WS_PW PRODUCER warps (the block's last); producer p serves the groups k = p (mod PW). A group's
//    positions (its units in its consumption order, tile after tile) each go: ISSUE, once the stage is
//    free (the EMPTY mbarrier of position t - NS), by cp.async (the unit's weight bulk BM x 32 B, its
//    meta window BM x 16 B, the activations BN x 64 B, the activation scales BN x 16 B) and a
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
// + 24 WK NS, with STAGE = round128(BM 48 + BN 80 + BN 16 + BM 16), BM = 16 WS_WM WS_TM, BN = 8 WS_WN
// WS_TN, NOUT = 4 WS_TM WS_TN, NC = 32 WS_WM WS_WN WS_WK, LV = 5 - log2(WK); the module's gemm_ws_smem
// holds the value (experiments/gemm_ws/check.py compares its formula). Contract as gemm.cu's: K a multiple
// of 256, planes and xq / xs 16-byte aligned.
//
// History:
//  1. (this) first version, not yet run on a device. Static SASS of the unit loop (experiments/gemm_ws/
//     sass.py, the full-tile path): 2,2,2,4 ~24 instructions an IMMA against gemm.cu's 32.5 in the same
//     configuration (2,2,2,4,1,3,1,1), 2,2,2,2 27.7 against 40.8; the exact formula's 9 operations an
//     output and unit are ~74 % of it.
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "mma_frag.cuh"

#if MV_TYPE != 12
#error "gemm_ws.cu: MV_TYPE must be 12 (Q4_K) in this version"
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
constexpr int WBS = GT::WBS;                // 48: 32 bulk bytes + the RK4F record (odd multiple of 16)
constexpr int OFF_RS = 32;                  // the row scalars' place in a staged bulk row
constexpr int XS = 80;                      // a column's 64 activation bytes, padded
constexpr int OFF_X = BM * WBS;
constexpr int OFF_C = OFF_X + BN * XS;      // column records: raw {Q8Scale, Q8Scale}, then float4
constexpr int OFF_M = OFF_C + BN * 16;      // meta windows (16 bytes a row)
constexpr int STAGE = (OFF_M + BM * 16 + 127) / 128 * 128;
constexpr int OFF_STACK = WK * NS * STAGE;
constexpr int OFF_RED = OFF_STACK + LSM * NOUT * NC * 4;
constexpr int OFF_BAR = OFF_RED + (WK > 1 ? NC * NOUT * 4 : 0);
constexpr int SMEM = OFF_BAR + 24 * WK * NS;
extern "C" __device__ const int gemm_ws_smem = SMEM;   // read by experiments/gemm_ws/check.py
static_assert(sizeof(typename GT::R) == 16, "RK4F is 16 bytes");
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
MEMRA_DEVICE void ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
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
    for (int q = 0; q < NXQ; ++q) {
        const int i = lane + 32 * q;
        o.x[q] = xq + (size_t)min(tl.cb + (i >> 2), nb - 1) * K + 16 * (i & 3);
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
    const size_t brs = (size_t)(K / 256) * 128, mrs = (size_t)(K / 256) * 16;
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
#pragma unroll
        for (int j = 0; j < MG; ++j) {
            const int k = p + PW * j;
            w[j].start(k, nu);
            pw[j].start(k, nu);
            tile[j] = blockIdx.x;
            gdone[j] = tile[j] >= ntiles || k >= nu;   // no tile, or a group without units (nu <= k)
            iss[j] = tp[j] = 0;
            if (!gdone[j]) src_of<GLU>(src[j], tile[j], lane, bulk, meta, xq, xs, N, K, nb, brs, mrs);
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
                            const uint4 m = *reinterpret_cast<const uint4*>(sp + OFF_M + 16 * r);
                            const RK4F f = rk4f(rowscal_k4_uniform(m, u & 3));
                            *reinterpret_cast<float4*>(sp + r * WBS + OFF_RS) = make_float4(f.dsc0, f.dm0, f.dsc1, f.dm1);
                        }
#pragma unroll
                        for (int q = 0; q < (BN + 31) / 32; ++q) {
                            const int col = lane + 32 * q;
                            if (BN % 32 != 0 && col >= BN) break;
                            const uint4 e = *reinterpret_cast<const uint4*>(sp + OFF_C + 16 * col);
                            *reinterpret_cast<float4*>(sp + OFF_C + 16 * col) =
                                make_float4(__uint_as_float(e.x), (float)(int)e.y, __uint_as_float(e.z), (float)(int)e.w);
                        }
                        bar_arrive(full0 + 8 * s);
                        ++tp[j];
                        pw[j].next(nu);
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
                            cp16(st + r * WBS, o.b[q] + 32 * u);
                            cp16(st + r * WBS + 16, o.b[q] + 32 * u + 16);
                            cp16(st + OFF_M + 16 * r, o.m[q] + 16 * (u >> 2));
                        }
                        // activations: BN columns x 4 groups of 16 bytes; scales: blocks 2u, 2u + 1 of each column
#pragma unroll
                        for (int q = 0; q < NXQ; ++q) {
                            const int i = lane + 32 * q;
                            cp16(st + OFF_X + (i >> 2) * XS + 16 * (i & 3), o.x[q] + 64 * u);
                        }
#pragma unroll
                        for (int q = 0; q < NSQ; ++q) {
                            const int col = lane + 32 * q;
                            if (BN % 32 != 0 && col >= BN) break;
                            cp16(st + OFF_C + 16 * col, o.s[q] + 2 * u);
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
        float4 cs[WS_TN][2];   // columns 2 tig, 2 tig + 1 of each n tile: {d0, S0, d1, S1}
#pragma unroll
        for (int ni = 0; ni < WS_TN; ++ni) {
            const int c0 = (wn * WS_TN + ni) * 8;
            ldsm4(xb[ni], st + OFF_X + (c0 + lr) * XS + 16 * lm);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc)
                cs[ni][cc] = *reinterpret_cast<const float4*>(stp + OFF_C + 16 * (c0 + 2 * tig + cc));
        }
#pragma unroll
        for (int mi = 0; mi < WS_TM; ++mi) {
            const int r0 = (wm * WS_TM + mi) * 16;
            uint32_t q[2][2];
            {
                uint32_t r4[4];
                ldsm4(r4, st + (r0 + 8 * (lm & 1) + lr) * WBS + 16 * (lm >> 1));
                q[0][0] = r4[0]; q[0][1] = r4[1]; q[1][0] = r4[2]; q[1][1] = r4[3];
            }
            RK4F rq[2];
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const float4 v = *reinterpret_cast<const float4*>(stp + (r0 + gid + 8 * rh) * WBS + OFF_RS);
                rq[rh].dsc0 = v.x; rq[rh].dm0 = v.y; rq[rh].dsc1 = v.z; rq[rh].dm1 = v.w;
            }
            typename T::U wu[2];
            uint32_t a[GT::NK][4];
            GT::afrag(q, wu, tig, a);
#pragma unroll
            for (int ni = 0; ni < WS_TN; ++ni) {
                if (!FULL && cb + (wn * WS_TN + ni) * 8 >= nb) continue;   // warp-uniform: no live column
                int c[GT::NK][4];
#pragma unroll
                for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], xb[ni], k);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const RK4F& r = rq[e >> 1];
                    const float4& s = cs[ni][e & 1];
                    const int o = (mi * WS_TN + ni) * 4 + e;
                    // accum_k4f with the column's floats: the same operations on the same operands
                    const float fa = __fmaf_rn(r.dsc0, (float)c[0][e], -__fmul_rn(r.dm0, s.y));
                    const float fb = __fmaf_rn(r.dsc1, (float)c[1][e], -__fmul_rn(r.dm1, s.w));
                    acc[o] = __fadd_rn(acc[o], __fmaf_rn(fa, s.x, __fmul_rn(fb, s.z)));
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
