// mvt.cu — a skinny tensor-core matvec for 2..15 rows (parallel decode, speculative verification;
// the launch plan's choice on the q8 path below GEMM_MIN_ROWS, memra/gpu/ops/mvt.py), bit-identical to kernels/matvec.cu's mv_q8 / mv_q8_glu, with no shared-memory
// staging of weights and no barrier inside the K loop.
//
// Computes y[b, n] = sum_k W[n, k] * x[b, k] for b < nb, W in one quantized GGUF type (MV_TYPE:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS) in matvec.cu's planes layout, x as q8
// activations (q8.cuh: int8 xq, one Q8Scale {d, s} per 32). Same arguments and epilogues as
// mv_q8: mvt_q8_glu reads 2N weight rows [gate; up] and writes act(gate) * up (act 1 SiLU,
// 2 GELU-tanh); res (nullable, may alias y) is added last.
//
// Why. At 2..16 rows mv_q8 (MV_B 8) is ALU/L1-bound (every weight feeds B dp4a rows and the
// K-quant scale unpacking is redone per row and column), and gemm.cu's small-batch config
// (1,1,2,2,8) stages every weight through shared memory with a __syncthreads per step. Here the
// integer dot products go to mma.sync, the weights go from global memory straight into the A
// fragments, and a warp never waits for another one until the very end.
//
// Work split. One warp owns one m16 tile of weight rows and MVT_TN n8 tiles of columns (the
// block's columns cb .. cb + 8 TN - 1): plain, tile rows 0..15 = weight rows ob .. ob + 15;
// _glu, tile rows 0..7 = gate rows ob .. ob + 7 and rows 8..15 = their up rows N + ob .. (so
// the thread holding C (gid, c) also holds C (gid + 8, c): act(gate) * up needs no exchange).
// MVT_WK warps of a block share one tile and split its 32 slots (below); a block holds MVT_WM
// tiles, so NTHR = 32 MVT_WM MVT_WK.
// Per unit (64 weights of each of the tile's rows), lane (gid = lane / 4, tig = lane % 4) loads
// the 4-byte word tig of each of the type's NCH 16-byte bulk chunks for rows gid and gid + 8
// (exactly the words gemm.cu's ldmatrix gives it; weights through ld.global.nc.L1::no_allocate
// by default, so they do not evict the activations), the rows' meta fields through qtypes.cuh's
// load_meta<GLd>, then builds the A fragments with gemm.cu's G<T>::afrag (mma_frag.cuh, the
// same code). B fragments: word tig of the unit's 4 activation groups of column cb + 8 ni + gid
// (gemm.cu's ldmatrix of the staged activations gives the same words); scales: the unit's 2
// (Q6_K: 4) Q8Scale blocks of columns 2 tig, 2 tig + 1 (the C layout's), both __ldg (L1).
// Software prefetch: the weight words and meta of the next MVT_PREFETCH units of the warp's
// walk are in registers (a ring shifted with static indices) while the current one is consumed.
//
// What is computed, exactly (the exactness argument; it is gemm.cu's, minus the staging).
// mv_q8 (MV_KSPLIT 1) gives output (n, b) as: lane slot l in 0..31 folds its units u = l, l+32,
// ... in increasing u into P_l = T::accum(...T::accum(0, u=l)..., u=l+32...) (qtypes.cuh:
// exact integer dots, then the explicit-rounding float part); then warp_sum's xor butterfly
// (offsets 16, 8, 4, 2, 1); then finish(): __fmul_rn(act(gate), up), then __fadd_rn(v, res).
// This kernel performs the same float operations on the same operands:
//  - a unit's integer sums (per 32-element activation block; per 16-element group for Q6_K)
//    come from mma.sync m16n8k32 (m16n8k16) s8 x s8 -> s32 with a zero accumulator: integer sums
//    are exact in any order (|sum| <= 32 * 127 * 127), so they equal idots' dp4a sums;
//  - G<T>::accum (mma_frag.cuh: T::accum_r, or for Q4_K / Q5_K its exact rewrite with float
//    row scalars, RK4F) folds each unit into the slot partial with the row scalars of
//    G<T>::rowscal, once per row and unit; every float operation in it is an explicit-rounding
//    intrinsic, so nothing contracts differently;
//  - the warp of group k (k < MVT_WK) walks the slots l = k (mod WK), leaf j = slot k + WK
//    brev_LV(j) (LV = 5 - log2 WK), each slot's units in increasing u, and merges a finished
//    slot into an LV-level stack of pending butterfly levels like a binary counter (after leaf j,
//    the partials of the t = trailing-ones(j) pending left siblings are added, L_i + v, and the
//    result parked at level t). Bit i of j is the slot offset WK 2^(LV-1-i) = 16 >> i, the
//    butterfly's level-i offset, so leaves j and j ^ 1 are the slots warp_sum pairs first
//    (l, l ^ 16) and every add of the counter is one of the butterfly's adds with the same two
//    operands (fp add is commutative). gemm.cu's argument; mvt_check.py --selftest replays this
//    loop (with its prefetch ring) against the lane order and butterfly, bit for bit;
//  - the WK groups' subtree roots meet through shared memory once, after the K loop, in the
//    butterfly's last log2 WK levels: T(k) = T(k) + T(k + o), o = WK/2 .. 1 (gemm.cu's GM_WK);
//  - the epilogue is finish()'s, with the same common.cuh activation functions.
// Nothing depends on nb, TN, WM, WK, the prefetch depth or the grid, so a row's bits equal
// mv_q8's at any MV_B. experiments/mvt/mvt_check.py checks this bit for bit on the device and
// its --selftest models the word maps, fragments and walk in numpy against the mv_q8 order.
//
// Tunables (-D): MV_TYPE (ggml type id, required), MVT_TN n8 tiles per warp (2; 1 when nb <= 8),
// MVT_WK warps splitting a tile's slots (8; 1, 2, 4, 8, 16), MVT_WM tiles per block (1),
// MVT_PREFETCH units of weights held ahead in registers (2; 0..3), MVT_WLOAD weight bulk loads
// (0: ld.global.nc.L1::no_allocate, 1: ld.global.nc, L1-allocating), MVT_MINB the blocks per SM
// __launch_bounds__ asks for (2), MVT_KPERM (0; 1: 8-byte lane loads for Q4_K, Q5_K, Q8_0 with
// the same k permutation in A and B, see KPERM below), MVT_JFIX (1: Q4_K / Q5_K loops specialised
// on the warp-constant j = u & 3 when WK % 4 == 0, see kloop), MEMRA_CANARY=1 drops unit 1 of every row (a deliberately wrong
// variant a check must catch). MV_WLOAD (qtypes.cuh) picks the meta loads' flavour, as in matvec.
// Launch: grid = (ceil(N / (OBM MVT_WM)), ceil(nb / (8 MVT_TN))) with OBM = 16 (mvt_q8) or 8
// (mvt_q8_glu), block = NTHR = 32 MVT_WM MVT_WK, dynamic shared memory 0 (static: (WK - 1) WM
// 32 TN 4 floats when WK > 1). K a multiple of 64 and of the type's block; planes and xq / xs
// 16-byte aligned (memra's upload_weight does this). Any nb >= 1 works (grid.y); meant for <= 16.
// PDL: the first MVT_PREFETCH units' weights are loaded before MEMRA_PDL_WAIT (weights are never
// written by kernels), then MEMRA_PDL_LAUNCH.
//
// History:
//  1. first version: direct-to-register A fragments (gemm.cu's word map and afrag), B fragments
//     and scales from L1, register prefetch ring, bit-reversed slot walk with a register stack,
//     WK groups merged once through shared memory. 338 SASS instructions per unit (Q4_K, TN 2,
//     common path, experiments/mvt/sass_count.py), of which 120 are accum_r's float part.
//  2. MVT_KPERM: 8-byte weight and activation loads (k permuted alike in A and B) for Q4_K,
//     Q5_K, Q8_0: 18 -> 12 loads per unit; off by default until the device says it pays.
//  3. MVT_PIN: the loop-invariant row / column addresses pinned in registers (NVVM recomputed
//     the row clamps, row x stride products and parameter loads inside the K loop).
//  4. (this) MVT_JFIX: with WK % 4 == 0 all of a warp's units have the same j = u & 3, so the
//     Q4_K / Q5_K loop is compiled per j (row scalars from constant byte positions, no per-unit
//     switch). With 3: Q4_K TN 2 338 -> 255 instructions per unit (TN 1: 188).
//  H200 (2026-12-01, research/2026-12-01-mvt/, as experiments/mvt/mvt.cu): bit-identical to mv_q8
//  in 2706 checks; at 8 rows 1.5-2.6x faster than mv_q8, at 16 rows 1.0-1.3x than gemm.cu's
//  small-batch config. In kernels/: G<T> and the mma wrappers from mma_frag.cuh (gemm.cu's),
//  and the K loop a function template on J instead of a generic lambda (NVRTC 13.0).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id) must be defined"
#endif
#ifndef MVT_TN
#define MVT_TN 2
#endif
#ifndef MVT_WK
#define MVT_WK 8
#endif
#ifndef MVT_WM
#define MVT_WM 1
#endif
#ifndef MVT_PREFETCH
#define MVT_PREFETCH 2
#endif
#ifndef MVT_WLOAD
#define MVT_WLOAD 0
#endif
#ifndef MVT_MINB
#define MVT_MINB 2
#endif
#ifndef MVT_KPERM
#define MVT_KPERM 0
#endif
#ifndef MVT_JFIX
#define MVT_JFIX 1
#endif
#ifndef MVT_PIN
#define MVT_PIN 1
#endif
#ifndef MVT_XPF
#define MVT_XPF 0
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
#if MVT_WK != 1 && MVT_WK != 2 && MVT_WK != 4 && MVT_WK != 8 && MVT_WK != 16
#error "MVT_WK must be 1, 2, 4, 8 or 16"
#endif
#if MVT_TN < 1 || MVT_TN > 2
#error "MVT_TN must be 1 or 2"
#endif
#if MVT_PREFETCH < 0 || MVT_PREFETCH > 3
#error "MVT_PREFETCH must be 0..3"
#endif

// T (the weight type of MV_TYPE), G<T> (gemm.cu's fragment code), mma_k32 / mma_k16 and
// mma_unit: mma_frag.cuh, shared with gemm.cu

constexpr int NTHR = 32 * MVT_WM * MVT_WK;
constexpr int SKB = MVT_WK == 1 ? 0 : MVT_WK == 2 ? 1 : MVT_WK == 4 ? 2 : MVT_WK == 8 ? 3 : 4;
constexpr int LV = 5 - SKB;            // stack levels of a group's subtree
constexpr int NLEAF = 1 << LV;         // slots per group
constexpr int NO = MVT_TN * 4;         // C values per thread (one m tile, TN n tiles)
constexpr int BN = 8 * MVT_TN;         // columns per block

// ---------------------------------------------------------------------------------
// PTX wrappers (the mma ones are mma_frag.cuh's, not volatile here: MMA_FRAG_VOLATILE 0)
// one 4-byte weight word (bulk plane)
MEMRA_DEVICE uint32_t ldw(const uint8_t* p) {
    uint32_t v;
#if MVT_WLOAD == 0
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
#else
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
#endif
    return v;
}
// two 4-byte weight words at an 8-byte aligned address (MVT_KPERM)
MEMRA_DEVICE uint2 ldw2(const uint8_t* p) {
    uint2 v;
#if MVT_WLOAD == 0
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
#else
    asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
#endif
    return v;
}
// an opaque register copy: the compiler can no longer recompute the value from its inputs
template <class P> MEMRA_DEVICE void pin(P*& p) { asm volatile("" : "+l"(p)); }
// one 4-byte activation word (L1-cached: the block's columns are reused by every tile)
MEMRA_DEVICE uint32_t ldx(const int8_t* p) { return __ldg(reinterpret_cast<const unsigned int*>(p)); }

// ---------------------------------------------------------------------------------
// MVT_KPERM 1 (Q4_K, Q5_K, Q8_0 only; ignored elsewhere): within each k-chunk of 32 the lane
// takes the 8 contiguous bytes 8 tig .. 8 tig + 7 instead of words tig and tig + 4, for the
// weights (chunk pairs (c, c + 1) are the two halves of one contiguous 32-byte piece whose byte i
// is element i of the k-chunk, so q[c] = word at chunk(u, c & ~1) + 8 tig + 4 (c & 1), one 8-byte
// load per pair) and for the activations (x[2k + h] = word at goff(u, 2k) + 8 tig + 4 h, one
// 8-byte load per k-chunk). A and B use the same permutation of k inside every 32-block, so
// every integer sum is the same set of products (exact in any order); afrag is unchanged.
// Half the load instructions, and each weight load instruction covers whole 32-byte sectors.
constexpr bool KPERM = MVT_KPERM && (MV_TYPE == 12 || MV_TYPE == 13 || MV_TYPE == 8);


// One unit's weights as a lane holds them: word tig of each bulk chunk of rows gid, gid + 8,
// and the two rows' meta fields (T::U; only its meta members are used).
struct Pre {
    uint32_t q[GT::NCH][2];
    typename T::U w[2];
};
MEMRA_DEVICE void fetch(Pre& p, const uint8_t* const (&wb)[2], const uint8_t* const (&wm)[2], int u) {
    if (KPERM) {   // wb[] already carries + 4 tig: add the other 4 tig
#pragma unroll
        for (int c = 0; c < GT::NCH; c += 2) {
            const int off = GT::chunk(u, c);
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const uint2 v = ldw2(wb[rh] + off + 4 * (threadIdx.x & 3));
                p.q[c][rh] = v.x; p.q[c + 1][rh] = v.y;
            }
        }
    } else {
#pragma unroll
        for (int c = 0; c < GT::NCH; ++c) {
            const int off = GT::chunk(u, c);
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) p.q[c][rh] = ldw(wb[rh] + off);
        }
    }
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) T::template load_meta<GLd>(p.w[rh], wm[rh] + T::moff(u), u);
}

// JFIX: the unit's j = u & 3 as a compile-time constant (types with a j field only)
template <int V> struct IC { static constexpr int value = V; };
template <class U> MEMRA_DEVICE void setj(U&, int) {}
MEMRA_DEVICE void setj(TQ4_K::U& w, int j) { w.j = j; }
MEMRA_DEVICE void setj(TQ5_K::U& w, int j) { w.j = j; }
constexpr bool JFIX = MVT_JFIX && (MV_TYPE == 12 || MV_TYPE == 13) && MVT_WK % 4 == 0;

// leaf j (tree order) of group k: slot k + WK brev_LV(j)
MEMRA_DEVICE int slot_of(int k, int j) { return k + MVT_WK * (int)(__brev((unsigned)j) >> (32 - LV)); }

// The K loop of a warp as a ring of R = MVT_PREFETCH + 1 unit buffers at compile-time positions
// (variant 5). Step i consumes position i % R and first fetches the unit MVT_PREFETCH ahead into
// position (i + MVT_PREFETCH) % R; the loop is unrolled R times so every position is a constant
// and no register moves between positions. (Variant 4 shifted the ring with register moves after
// each unit: a move out of a register whose load is still in flight waits for the load, so the
// prefetched units were waited for one step after being issued — ncu, research/2026-12-02-session10/:
// 45 % of the stall cycles were long-scoreboard waits on those moves, and MVT_PREFETCH 1, 2 and 3
// timed alike.) With MVT_XPF 1 the unit's activation words and scales ride in the ring too
// (fetched after the PDL wait: the previous kernel writes them).
constexpr int RING = MVT_PREFETCH + 1;
struct Xs {
    uint32_t xb[MVT_TN][4];
    uint4 e[MVT_TN][2][K16 ? 2 : 1];
};
MEMRA_DEVICE void fetch_x(Xs& x, const int8_t* const (&xb_p)[MVT_TN], const Q8Scale* const (&xs_p)[MVT_TN][2],
                          bool tile1, int tig, int u, int nu) {
    const int sb = T::goff(u, 0, nu) / 32;
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) {
        if (ni == 1 && !tile1) break;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            if (KPERM) {
                if (g % 2 == 0) {
                    const uint2 v = __ldg(reinterpret_cast<const uint2*>(xb_p[ni] + T::goff(u, g, nu) + 4 * tig));
                    x.xb[ni][g] = v.x; x.xb[ni][g + 1] = v.y;
                }
            } else {
                x.xb[ni][g] = ldx(xb_p[ni] + T::goff(u, g, nu));
            }
        }
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            x.e[ni][cc][0] = __ldg(reinterpret_cast<const uint4*>(xs_p[ni][cc] + sb));
            if (K16) x.e[ni][cc][K16 ? 1 : 0] = __ldg(reinterpret_cast<const uint4*>(xs_p[ni][cc] + sb + 2));
        }
    }
}

template <int J, int S, class Merge, class Advance>
MEMRA_DEVICE void kstep(int& cj, int& cu, const int& pj, const int& pu, Pre (&buf)[RING], Xs (&xr)[RING],
                        float (&P)[NO], const uint8_t* const (&wb)[2], const uint8_t* const (&wmp)[2],
                        const int8_t* const (&xb_p)[MVT_TN], const Q8Scale* const (&xs_p)[MVT_TN][2],
                        bool tile1, int tig, int wk, int nu, Merge& merge, Advance& padvance) {
    constexpr int F = (S + MVT_PREFETCH) % RING;   // the position the unit MVT_PREFETCH ahead goes to
    if (pj < NLEAF) {
        fetch(buf[F], wb, wmp, pu);
        if (MVT_XPF) fetch_x(xr[F], xb_p, xs_p, tile1, tig, pu, nu);
        padvance();
    }
    const int u = cu;
    if (!(MEMRA_CANARY == 1 && u == 1)) {
        const Pre& p = buf[S];
        Xs xn;
        if (!MVT_XPF) fetch_x(xn, xb_p, xs_p, tile1, tig, u, nu);
        const Xs& x = MVT_XPF ? xr[S] : xn;
        typename T::U w[2] = {p.w[0], p.w[1]};
        if (J >= 0) { setj(w[0], J); setj(w[1], J); }
        uint32_t a[GT::NK][AR];
        GT::afrag(p.q, w, tig, a);
        const typename GT::R rq[2] = {GT::rowscal(w[0]), GT::rowscal(w[1])};   // once per row
#pragma unroll
        for (int ni = 0; ni < MVT_TN; ++ni) {
            if (ni == 1 && !tile1) break;           // warp-uniform: no live column
            Q8Scale sv[2][4];
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const uint4 e01 = x.e[ni][cc][0];
                if (K16) {
                    const uint4 e23 = x.e[ni][cc][K16 ? 1 : 0];
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
            for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], x.xb[ni], k);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int ints[T::NI];
#pragma unroll
                for (int k = 0; k < T::NI; ++k) ints[k] = c[k][e];
                P[4 * ni + e] = GT::accum(P[4 * ni + e], rq[e >> 1], ints, sv[e & 1]);
            }
        }
    }
    // next unit of the slot, or the slot is complete: merge it (and any empty ones after)
    cu += 32;
    while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot_of(wk, cj) : 0; }
}

// The K loop: RING steps per trip, each at its constant ring position. A template on J rather
// than a generic lambda (NVRTC 13.0): with JFIX (Q4_K / Q5_K, WK a multiple of 4) every unit of
// this warp has u & 3 == wk & 3, so J = u & 3 is a constant (row scalars' byte positions, Q5_K's
// shifts); J = -1: j read per unit. merge / padvance are mvt_body's lambdas.
template <int J, class Merge, class Advance>
MEMRA_DEVICE void kloop(int& cj, int& cu, const int& pj, const int& pu, Pre (&buf)[RING], Xs (&xr)[RING],
                        float (&P)[NO], const uint8_t* const (&wb)[2], const uint8_t* const (&wmp)[2],
                        const int8_t* const (&xb_p)[MVT_TN], const Q8Scale* const (&xs_p)[MVT_TN][2],
                        bool tile1, int tig, int wk, int nu, Merge& merge, Advance& padvance) {
#define MVT_STEP(S)                                                                                 \
    if (RING > S) {                                                                                 \
        if (cj >= NLEAF) break;                                                                     \
        kstep<J, S % RING>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); \
    }
    for (;;) {
        MVT_STEP(0) MVT_STEP(1) MVT_STEP(2) MVT_STEP(3)
    }
#undef MVT_STEP
}

template <bool GLU>
MEMRA_DEVICE void mvt_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                           const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                           float* y, const float* res, int N, int K, int nb, int act) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wk = warp % MVT_WK, wm = warp / MVT_WK;
    constexpr int OBM = GLU ? 8 : 16;                    // outputs (rows of y) per tile
    const int ob = (blockIdx.x * MVT_WM + wm) * OBM;
    const int cb = blockIdx.y * BN;
    const int nblk = K / T::BLK, nu = K / 64;
    const size_t brs = (size_t)nblk * T::BULK, mrs = (size_t)nblk * T::META;

    // the lane's weight rows (tile rows gid, gid + 8), clamped: computed, never stored
    int wr[2];
    if (GLU) {
        const int o = min(ob + gid, N - 1);
        wr[0] = o; wr[1] = o + N;
    } else {
        wr[0] = min(ob + gid, N - 1); wr[1] = min(ob + gid + 8, N - 1);
    }
    const uint8_t* wb[2] = {bulk + wr[0] * brs + 4 * tig, bulk + wr[1] * brs + 4 * tig};
    const uint8_t* wmp[2] = {meta + wr[0] * mrs, meta + wr[1] * mrs};
    // the lane's activation rows: B column gid, scale columns 2 tig, 2 tig + 1 (clamped)
    const int8_t* xb_p[MVT_TN];
    const Q8Scale* xs_p[MVT_TN][2];
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) {
        xb_p[ni] = xq + (size_t)min(cb + 8 * ni + gid, nb - 1) * K + 4 * tig;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) xs_p[ni][cc] = xs + (size_t)min(cb + 8 * ni + 2 * tig + cc, nb - 1) * (K / 32);
    }
    const bool tile1 = MVT_TN > 1 && cb + 8 < nb;        // the second n tile has live columns
#if MVT_PIN
    // Pin the loop-invariant addresses in registers: NVVM otherwise rematerialises them (row
    // clamps, row x stride products, parameter loads) inside the K loop, ~60 instructions per unit.
    pin(wb[0]); pin(wb[1]); pin(wmp[0]); pin(wmp[1]);
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) { pin(xb_p[ni]); pin(xs_p[ni][0]); pin(xs_p[ni][1]); }
#endif

    // per output (n tile ni, C element e; o = 4 ni + e): slot partial P, pending levels L
    float P[NO], L[LV][NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        P[o] = 0.f;
#pragma unroll
        for (int l = 0; l < LV; ++l) L[l][o] = 0.f;
    }
    // slot-finished merge of leaf j (a binary counter over the group's subtree)
    auto merge = [&](int j) {
        const int tz = __ffs(~j) - 1;   // trailing ones of j (warp-uniform)
        if (tz >= LV) {                 // the group's last leaf: its subtree root, kept in P
#pragma unroll
            for (int o = 0; o < NO; ++o) {
                float v = P[o];
#pragma unroll
                for (int l = 0; l < LV; ++l) v = __fadd_rn(L[l][o], v);
                P[o] = v;
            }
            return;
        }
        switch (tz) {
#define MVT_MERGE(TZ)                                                                      \
        _Pragma("unroll") for (int o = 0; o < NO; ++o) {                                     \
            float v = P[o];                                                                   \
            _Pragma("unroll") for (int l = 0; l < TZ; ++l) v = __fadd_rn(L[l][o], v);         \
            L[TZ < LV ? TZ : 0][o] = v;                                                        \
            P[o] = 0.f;                                                                       \
        }
        case 0: MVT_MERGE(0); break;
        case 1: MVT_MERGE(1); break;
        case 2: MVT_MERGE(2); break;
        case 3: MVT_MERGE(3); break;
        default: MVT_MERGE(4); break;
#undef MVT_MERGE
        }
    };

    // the walk: consumer (cj, cu), producer (pj, pu) MVT_PREFETCH units ahead; leading empty
    // slots (nu < 32) are merged as zeros, as mv_q8's lanes without units contribute 0
    int cj = 0, cu = wk;
    while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot_of(wk, cj) : 0; }
    int pj = cj, pu = cu;
    auto padvance = [&]() {
        pu += 32;
        while (pu >= nu && pj < NLEAF) { ++pj; pu = pj < NLEAF ? slot_of(wk, pj) : 0; }
    };
    Pre buf[RING];
    Xs xr[RING];   // used with MVT_XPF only
    int pre_u[MVT_PREFETCH > 0 ? MVT_PREFETCH : 1];
    bool pre_ok[MVT_PREFETCH > 0 ? MVT_PREFETCH : 1];
    // weights are never written by kernels: the first units may be loaded before the PDL wait
#pragma unroll
    for (int i = 0; i < MVT_PREFETCH; ++i) {
        pre_ok[i] = pj < NLEAF;
        pre_u[i] = pu;
        if (pj < NLEAF) { fetch(buf[i], wb, wmp, pu); padvance(); }
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    if (MVT_XPF) {   // the prologue units' activations, now that the previous kernel is done
#pragma unroll
        for (int i = 0; i < MVT_PREFETCH; ++i)
            if (pre_ok[i]) fetch_x(xr[i], xb_p, xs_p, tile1, tig, pre_u[i], nu);
    }

    // The K loop (kloop above), instantiated per J = u & 3 with JFIX, else J = -1
    if (JFIX) {
        switch (wk & 3) {
        case 0: kloop<0>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        case 1: kloop<1>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        case 2: kloop<2>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        default: kloop<3>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        }
    } else {
        kloop<-1>(cj, cu, pj, pu, buf, xr, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance);
    }

    // the groups' subtree roots T(k) meet in the butterfly's last log2 WK levels: for offset
    // o = WK/2 .. 1, T(k) = T(k) + T(k + o) (k < o); group 0 then runs the epilogue
#if MVT_WK > 1
    __shared__ float red[MVT_WK - 1][MVT_WM][NO][32];
    if (wk > 0) {
#pragma unroll
        for (int o = 0; o < NO; ++o) red[wk - 1][wm][o][lane] = P[o];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        float t[MVT_WK];
        t[0] = P[o];
#pragma unroll
        for (int k = 1; k < MVT_WK; ++k) t[k] = red[k - 1][wm][o][lane];
#pragma unroll
        for (int off = MVT_WK / 2; off > 0; off >>= 1)
#pragma unroll
            for (int k = 0; k < off; ++k) t[k] = __fadd_rn(t[k], t[k + off]);
        P[o] = t[0];
    }
#endif

    // epilogue: finish()'s operations
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni)
#pragma unroll
        for (int e = 0; e < (GLU ? 2 : 4); ++e) {
            const int row = ob + gid + 8 * (e >> 1);
            const int col = cb + 8 * ni + 2 * tig + (e & 1);
            if (row >= N || col >= nb) continue;
            const int o = 4 * ni + e;
            float v = P[o];
            if (GLU) {
                const float gte = P[o], up = P[o + 2];   // C rows gid (gate), gid + 8 (up)
                v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
            }
            const size_t yo = (size_t)col * N + row;
            if (res) v = __fadd_rn(v, res[yo]);
            y[yo] = v;
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
