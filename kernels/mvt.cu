// mvt.cu — a skinny tensor-core matvec for 2..15 rows (parallel decode, speculative verification;
// the launch plan's choice on the q8 path below GEMM_MIN_ROWS, memra/gpu/ops/mvt.py), bit-identical to kernels/matvec.cu's mv_q8 / mv_q8_glu,
// in two layouts of the same entries (MVT_LAYOUT; the tuning table picks one per shape and batch
// bucket, the built-in configurations are layout 0):
//  0 (the default: register ring) no shared-memory staging of weights and no barrier inside
//    the K loop: each lane loads its fragments' words straight from global memory;
//  1 (shared-memory stages, variant 6) the block's weights, meta, activations and scales staged
//    in shared memory by coalesced cp.async, fragments by ldmatrix, each warp's units in plain
//    K order with one partial per slot.
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
// integer dot products go to mma.sync; in layout 0 the weights go from global memory straight
// into the A fragments, and a warp never waits for another one until the very end. Layout 1
// (research/2026-12-02-session10/: ncu of layout 0 at 8 rows): layout 0's lanes load 4-16 bytes
// from 8 different rows or columns per instruction (~8 load instructions and ~56 L1 wavefronts
// a warp and unit), so its time follows the units, not the bytes; in layout 1 a stage's SU
// units of a row are one contiguous run of bytes in the planes layout (SU a multiple of 4, so
// K-quant super-blocks are whole), copied by 16-byte cp.async of consecutive threads (whole
// 128-byte lines), and the warps read their fragments with ldmatrix and shared-memory loads.
//
// Work split (both layouts). One warp owns one m16 tile of weight rows and MVT_TN n8 tiles of
// columns (the block's columns cb .. cb + 8 TN - 1): plain, tile rows 0..15 = weight rows ob ..
// ob + 15; _glu, tile rows 0..7 = gate rows ob .. ob + 7 and rows 8..15 = their up rows N + ob ..
// (so the thread holding C (gid, c) also holds C (gid + 8, c): act(gate) * up needs no exchange).
// MVT_WK warps of a block share one tile and split its 32 slots (below); a block holds MVT_WM
// tiles, so NTHR = 32 MVT_WM MVT_WK.
// Layout 0. Per unit (64 weights of each of the tile's rows), lane (gid = lane / 4, tig = lane % 4) loads
// the 4-byte word tig of each of the type's NCH 16-byte bulk chunks for rows gid and gid + 8
// (exactly the words gemm.cu's ldmatrix gives it; weights through ld.global.nc.L1::no_allocate
// by default, so they do not evict the activations), the rows' meta fields through qtypes.cuh's
// load_meta<GLd>, then builds the A fragments with gemm.cu's G<T>::afrag (mma_frag.cuh, the
// same code). B fragments: word tig of the unit's 4 activation groups of column cb + 8 ni + gid
// (gemm.cu's ldmatrix of the staged activations gives the same words); scales: the unit's 2
// (Q6_K: 4) Q8Scale blocks of columns 2 tig, 2 tig + 1 (the C layout's), both __ldg (L1).
// Software prefetch: the weight words and meta of the next MVT_PREFETCH units of the warp's
// walk are in registers (a ring shifted with static indices) while the current one is consumed.
// Layout 1. Unit u goes to warp u % WK (WK divides 32, so that is its slot's warp: slot u % 32,
// slots k, k + WK, ... belong to warp k), MVT_UPW units a warp per stage, SU = WK UPW units a
// stage; MVT_STAGES stage buffers in dynamic shared memory (a barrier a stage, the copies of
// stage s + STAGES - 1 issued while stage s is consumed). A warp reads the same words as in
// layout 0 (and as gemm.cu): the A words by ldmatrix of the staged bulk rows, the meta through
// load_meta<SLd> from the staged meta window, B by ldmatrix of the staged activations, the
// scales from the staged Q8Scale blocks; G<T>::afrag, mma_unit and G<T>::accum as in layout 0.
//
// What is computed, exactly (the exactness argument; it is gemm.cu's, minus the staging).
// mv_q8 (MV_KSPLIT 1) gives output (n, b) as: lane slot l in 0..31 folds its units u = l, l+32,
// ... in increasing u into P_l = T::accum(...T::accum(0, u=l)..., u=l+32...) (qtypes.cuh:
// exact integer dots, then the explicit-rounding float part); then warp_sum's xor butterfly
// (offsets 16, 8, 4, 2, 1); then finish(): __fmul_rn(act(gate), up), then __fadd_rn(v, res).
// This kernel performs the same float operations on the same operands, in either layout:
//  - a unit's integer sums (per 32-element activation block; per 16-element group for Q6_K)
//    come from mma.sync m16n8k32 (m16n8k16) s8 x s8 -> s32 with a zero accumulator: integer sums
//    are exact in any order (|sum| <= 32 * 127 * 127), so they equal idots' dp4a sums;
//  - G<T>::accum (mma_frag.cuh: T::accum_r, or for Q4_K / Q5_K its exact rewrite with float
//    row scalars, RK4F) folds each unit into the slot partial with the row scalars of
//    G<T>::rowscal, once per row and unit; every float operation in it is an explicit-rounding
//    intrinsic, so nothing contracts differently;
//  - layout 0: the warp of group k (k < MVT_WK) walks the slots l = k (mod WK), leaf j = slot k + WK
//    brev_LV(j) (LV = 5 - log2 WK), each slot's units in increasing u, and merges a finished
//    slot into an LV-level stack of pending butterfly levels like a binary counter (after leaf j,
//    the partials of the t = trailing-ones(j) pending left siblings are added, L_i + v, and the
//    result parked at level t). Bit i of j is the slot offset WK 2^(LV-1-i) = 16 >> i, the
//    butterfly's level-i offset, so leaves j and j ^ 1 are the slots warp_sum pairs first
//    (l, l ^ 16) and every add of the counter is one of the butterfly's adds with the same two
//    operands (fp add is commutative). gemm.cu's argument; mvt_check.py --selftest replays this
//    loop (with its prefetch ring) against the lane order and butterfly, bit for bit;
//  - layout 1: warp k keeps NS = 32 / WK partials, P[m] for slot k + WK m, and folds each of its
//    units into its slot's partial; stages run in increasing u, so each slot's units are folded
//    in increasing u, as lane l's are. After the K loop the warp adds its partials in the
//    butterfly's levels whose offsets are multiples of WK (16, 8, .., WK: P[m] + P[m + h] for
//    h = NS / 2 .. 1, slot offset WK h), the same adds with the same operands as the butterfly's
//    (and as layout 0's counter). Slots without units (nu < 32) keep +0, as mv_q8's lanes
//    without units do. experiments/mvt/v6/selftest.py models the staging, fragment reads and
//    this order against GGUF sums and the mv_q8 order;
//  - layout 0 with MVT_SB (variant 7; Q4_K / Q5_K, WK 8): warp k owns the slots 4k .. 4k + 3
//    (unit u = 4 sb + j with sb = k (mod 8)), walks its super-blocks in increasing sb and folds
//    unit j into slot 4k + j's partial, so each slot's units are folded in increasing u; unit j's
//    row scalars are G<T>::rowscal of the same meta bytes with the same j (a constant here, u & 3
//    there), so the same RK4F. After the K loop the 32 slot partials of an output meet in shared
//    memory and are added t[m] + t[m + h], h = 16 .. 1, the butterfly's adds with the same
//    operands (as layout 1's). experiments/mvt/v7/selftest.py replays this loop against the
//    mv_q8 order bit for bit;
//  - the WK groups' subtree roots meet through shared memory once, after the K loop, in the
//    butterfly's last log2 WK levels: T(k) = T(k) + T(k + o), o = WK/2 .. 1 (gemm.cu's GM_WK);
//  - the epilogue is finish()'s, with the same common.cuh activation functions.
// Nothing depends on nb, TN, WM, WK, the layout, the prefetch depth, UPW, the stage count or
// the grid, so a row's bits equal mv_q8's at any MV_B in either layout. experiments/mvt/mvt_check.py
// checks this bit for bit on the device and its --selftest models layout 0's word maps,
// fragments and walk in numpy against the mv_q8 order.
//
// Tunables (-D): MV_TYPE (ggml type id, required), MVT_LAYOUT (0; 1: the shared-memory stages),
// MVT_TN n8 tiles per warp (2; 1 when nb <= 8), MVT_WK warps splitting a tile's slots (8; layout 0
// 1, 2, 4, 8, 16; layout 1 4, 8, 16: its NS = 32 / WK partials a thread), MVT_WM tiles per block (1),
// MVT_MINB the blocks per SM __launch_bounds__ asks for (2), MVT_JFIX (1: Q4_K / Q5_K loops
// specialised on the warp-constant j = u & 3 when WK % 4 == 0, see kloop), MEMRA_CANARY=1 drops
// unit 1 of every row (a deliberately wrong variant a check must catch), MVT_SB (0; 1: variant 7's
// super-block walk for Q4_K / Q5_K, layout 0 with WK 8, PREFETCH then unused; ignored by the other
// types and by layout 1). Layout 0 only:
// MVT_PREFETCH units of weights held ahead in registers (2; 0..3), MVT_WLOAD weight bulk loads
// (0: ld.global.nc.L1::no_allocate, 1: ld.global.nc, L1-allocating), MVT_KPERM (0; 1: 8-byte lane
// loads for Q4_K, Q5_K, Q8_0 with the same k permutation in A and B, see KPERM below), MVT_PIN
// (1), MV_WLOAD (qtypes.cuh) picks the meta loads' flavour, as in matvec. Layout 1 only: MVT_UPW
// units a warp per stage (1; 1, 2, 4), MVT_STAGES stage buffers (3; >= 2), MVT_EXPECT_SMEM (the
// launcher's dynamic shared-memory size, checked against the kernel's at compile time).
// Launch: grid = (ceil(N / (OBM MVT_WM)), ceil(nb / (8 MVT_TN))) with OBM = 16 (mvt_q8) or 8
// (mvt_q8_glu), block = NTHR = 32 MVT_WM MVT_WK. Layout 0: dynamic shared memory 0 (static:
// (WK - 1) WM 32 TN 4 floats when WK > 1). Layout 1: no static shared memory; dynamic
// MVT_STAGES * STAGE bytes, STAGE = 16 WM (SU BPU + 16) + 16 WM roundup16(MST + 4) + 8 TN
// (64 SU + 16) + 8 TN 16 SU, SU = WK UPW, BPU = 64 BULK / BLK, MST = 64 SU META / BLK (at most
// 227 KiB; above 48 KiB the launcher raises the kernel's limit; memra/gpu/ops/mvt.py's
// smem_bytes). K a multiple of 64 and of the type's block (layout 1: whole K-quant super-blocks,
// 256); planes and xq / xs 16-byte aligned (memra's upload_weight does this). Any nb >= 1 works
// (grid.y); meant for <= 16.
// PDL: weights are never written by kernels, so layout 0 loads the first MVT_PREFETCH units'
// weights and layout 1 issues the copies of the first MVT_STAGES - 1 stages' weights and meta
// before MEMRA_PDL_WAIT, then MEMRA_PDL_LAUNCH.
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
//  4. MVT_JFIX: with WK % 4 == 0 all of a warp's units have the same j = u & 3, so the
//     Q4_K / Q5_K loop is compiled per j (row scalars from constant byte positions, no per-unit
//     switch). With 3: Q4_K TN 2 338 -> 255 instructions per unit (TN 1: 188).
//  H200 (2026-12-01, research/2026-12-01-mvt/, as experiments/mvt/mvt.cu): bit-identical to mv_q8
//  in 2706 checks; at 8 rows 1.5-2.6x faster than mv_q8, at 16 rows 1.0-1.3x than gemm.cu's
//  small-batch config. In kernels/: G<T> and the mma wrappers from mma_frag.cuh (gemm.cu's),
//  and the K loop a function template on J instead of a generic lambda (NVRTC 13.0).
//  5. (withdrawn, not in this file; experiments/mvt/v5/ at e4151ee) the K loop unrolled by the
//     ring's depth: bit-identical, no faster (research/2026-12-02-session10/).
//  6. (this) MVT_LAYOUT 1, the shared-memory stages (experiments/mvt/v6/mvt.cu, landed beside
//     layout 0; the cp.async / ldmatrix wrappers and SLd from smem_stage.cuh, gemm.cu's copy).
//     H200 (session 11, research/2026-12-02-session11/ab2/, UPW 1, 3 stages): bit-identical to
//     mv_q8 in 1,225 checks; against layout 0, µs: Q6_K 4096 x 14336 at 8 / 16 rows 42.9 -> 34.0
//     / 80.4 -> 58.5, the Q6_K head 128256 x 4096 at 4 / 8 / 16 rows 300 -> 244 / 352 -> 240 /
//     699 -> 465, Q4_0 4096 x 4096 at 16 rows 30.6 -> 16.3; but every Q4_K shape at 4 rows loses
//     (qkv 6144 x 4096 20.6 -> 25.5, 4096 x 4096 13.6 -> 20.3, glu 2 x 14336 x 4096 61.4 -> 76.1)
//     and 8 rows is about even. Not a replacement: the layout is chosen per shape and batch
//     bucket by the tuning table (tune/campaigns/h200-mvt.toml, `memra tune dispatch`).
//  7. MVT_SB=1 (layout 0, Q4_K / Q5_K, WK 8; off by default: the default modules' SASS is
//     unchanged), the super-block walk (experiments/mvt/v7/): warp k walks super-blocks k, k + 8,
//     ... and folds unit 4 sb + j into the partial of slot 4k + j (each slot still in increasing
//     u); the row meta is loaded once a row and super-block, the four units' row scalars come
//     from it with constant j, the bulk of unit j of the warp's next super-block is loaded into
//     the slot unit j just left (4 units ahead, no ring moves, meta double-buffered), and the 32
//     slots of an output meet in shared memory in the butterfly's order (mvt_body_sb). CPU
//     (sm_90a, TN 1, KPERM 1): 128 registers, no spills; Q4_K 181 -> 126 SASS instructions a
//     unit (glu and plain), Q5_K 148; TN 2 spills at MINB 2 (MINB 1 does not). H200 (session 14,
//     research/2026-12-02-session14/, experiments/mvt/v7/ab.sh): bit-identical to mv_q8 in 297
//     checks; against layout 0 at 4 / 8 rows, µs: Q4_K gate+up 2 x 14336 x 4096 61.4 -> 43.3 /
//     63.3 -> 50.8, 6144 x 4096 20.5 -> 15.5 / 21.2 -> 18.1, 4096 x 4096 13.3 -> 11.3 / 13.6 ->
//     12.2, 4096 x 14336 32.1 -> 22.8 / 33.2 -> 25.8 (layout 1 lost all eight). Chosen per shape
//     and bucket by the tuning table (h200-mvt's MVT_SB configurations).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id) must be defined"
#endif
#ifndef MVT_LAYOUT
#define MVT_LAYOUT 0
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
#ifndef MVT_UPW
#define MVT_UPW 1
#endif
#ifndef MVT_STAGES
#define MVT_STAGES 3
#endif
#ifndef MVT_SB
#define MVT_SB 0
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
// MVT_SB (variant 7): layout 0's super-block walk for Q4_K / Q5_K; ignored by the other types and layout 1
#define MVT_SBW (MVT_SB && MVT_LAYOUT == 0 && (MV_TYPE == 12 || MV_TYPE == 13))
#if MVT_LAYOUT != 0 && MVT_LAYOUT != 1
#error "MVT_LAYOUT must be 0 or 1"
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

#if MVT_LAYOUT == 1
// =================================================================================
// Layout 1: the shared-memory stages (variant 6, experiments/mvt/v6/mvt.cu)
#if MVT_WK != 4 && MVT_WK != 8 && MVT_WK != 16
#error "MVT_LAYOUT 1: MVT_WK must be 4, 8 or 16"
#endif
#if MVT_UPW != 1 && MVT_UPW != 2 && MVT_UPW != 4
#error "MVT_UPW must be 1, 2 or 4"
#endif
#if MVT_STAGES < 2
#error "MVT_STAGES must be >= 2"
#endif
// smem_u32, cp16, cp4n, cp_commit, cp_wait, ldsm4, ldsm2 and SLd: gemm.cu's (a verbatim copy;
// gemm.cu keeps its own until its tuning entries are next re-frozen)
#include "smem_stage.cuh"

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
static_assert(MVT_STAGES * STAGE <= 227 * 1024, "mvt layout 1: the stages exceed an SM's shared memory (227 KiB)");
static_assert((MVT_WK - 1) * MVT_WM * NO * 32 * 4 <= MVT_STAGES * STAGE, "the warps' reduction fits the stages");
#ifdef MVT_EXPECT_SMEM   // the launcher's formula (memra/gpu/ops/mvt.py smem_bytes), checked at compile time
static_assert(MVT_STAGES * STAGE == MVT_EXPECT_SMEM, "mvt layout 1: the launcher's shared-memory size differs");
#endif
// every row's meta window starts 4-byte aligned (rows of whole 64-element units: Q5_0's 6-byte
// blocks come in pairs); only Q6_K's 18-byte super-block meta can start 2 bytes in
constexpr bool META4 = T::META % 4 == 0 || (T::BLK == 32 && (2 * T::META) % 4 == 0);
constexpr bool JFIX = MVT_JFIX && (MV_TYPE == 12 || MV_TYPE == 13) && MVT_WK % 4 == 0;

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

    // the WK warps' results meet in the last log2 WK levels (offsets WK / 2 .. 1), as layout 0's,
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

#else
// =================================================================================
// Layout 0: the register ring (the default)

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

// The K loop of a warp: consumer (cj, cu), producer (pj, pu) MVT_PREFETCH units ahead, the
// prefetch ring buf, the slot partials P; merge(j) / padvance() are mvt_body's (typed) lambdas.
// A template on J rather than a generic lambda (NVRTC 13.0 takes generic lambdas in device code
// for host functions): with JFIX (Q4_K / Q5_K, WK a multiple of 4) every unit of this warp has
// u & 3 == wk & 3 (slot = wk + WK brev(j), u = slot + 32 i), so the loop is instantiated per
// J = u & 3 and the row scalars' byte positions (rowscal_k4_uniform's switch) and Q5_K's high-bit
// shifts become constants; J = -1: j read per unit, as loaded. Force-inlined (MEMRA_DEVICE): the
// references are mvt_body's registers, as the lambda's captures were.
template <int J, class Merge, class Advance>
MEMRA_DEVICE void kloop(int& cj, int& cu, const int& pj, const int& pu, Pre (&buf)[MVT_PREFETCH + 1],
                        float (&P)[NO], const uint8_t* const (&wb)[2], const uint8_t* const (&wmp)[2],
                        const int8_t* const (&xb_p)[MVT_TN], const Q8Scale* const (&xs_p)[MVT_TN][2],
                        bool tile1, int tig, int wk, int nu, Merge& merge, Advance& padvance) {
while (cj < NLEAF) {
    if (pj < NLEAF) { fetch(buf[MVT_PREFETCH], wb, wmp, pu); padvance(); }
    const int u = cu;
    if (!(MEMRA_CANARY == 1 && u == 1)) {
        const Pre& p = buf[0];
        typename T::U w[2] = {p.w[0], p.w[1]};
        if (J >= 0) { setj(w[0], J); setj(w[1], J); }
        uint32_t a[GT::NK][AR];
        GT::afrag(p.q, w, tig, a);
        const typename GT::R rq[2] = {GT::rowscal(w[0]), GT::rowscal(w[1])};   // once per row
        const int e0 = T::goff(u, 0, nu);
        const int sb = e0 / 32;                     // first scale block of the unit
#pragma unroll
        for (int ni = 0; ni < MVT_TN; ++ni) {
            if (ni == 1 && !tile1) break;           // warp-uniform: no live column
            uint32_t xb[4];
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                if (KPERM) {   // xb_p carries + 4 tig: add the other 4 tig
                    if (g % 2 == 0) {
                        const uint2 v = __ldg(reinterpret_cast<const uint2*>(xb_p[ni] + T::goff(u, g, nu) + 4 * tig));
                        xb[g] = v.x; xb[g + 1] = v.y;
                    }
                } else {
                    xb[g] = ldx(xb_p[ni] + T::goff(u, g, nu));
                }
            }
            Q8Scale sv[2][4];
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const uint4 e01 = __ldg(reinterpret_cast<const uint4*>(xs_p[ni][cc] + sb));
                if (K16) {
                    const uint4 e23 = __ldg(reinterpret_cast<const uint4*>(xs_p[ni][cc] + sb + 2));
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
            for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], xb, k);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int ints[T::NI];
#pragma unroll
                for (int k = 0; k < T::NI; ++k) ints[k] = c[k][e];
                P[4 * ni + e] = GT::accum(P[4 * ni + e], rq[e >> 1], ints, sv[e & 1]);
            }
        }
    }
    // rotate the ring (static indices: register moves)
#pragma unroll
    for (int i = 0; i < MVT_PREFETCH; ++i) buf[i] = buf[i + 1];
    // next unit of the slot, or the slot is complete: merge it (and any empty ones after)
    cu += 32;
    while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot_of(wk, cj) : 0; }
}
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
    Pre buf[MVT_PREFETCH + 1];
    // weights are never written by kernels: the first units may be loaded before the PDL wait
#pragma unroll
    for (int i = 0; i < MVT_PREFETCH; ++i) {
        if (pj < NLEAF) { fetch(buf[i], wb, wmp, pu); padvance(); }
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    // The K loop (kloop above), instantiated per J = u & 3 with JFIX, else J = -1
    if (JFIX) {
        switch (wk & 3) {
        case 0: kloop<0>(cj, cu, pj, pu, buf, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        case 1: kloop<1>(cj, cu, pj, pu, buf, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        case 2: kloop<2>(cj, cu, pj, pu, buf, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        default: kloop<3>(cj, cu, pj, pu, buf, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance); break;
        }
    } else {
        kloop<-1>(cj, cu, pj, pu, buf, P, wb, wmp, xb_p, xs_p, tile1, tig, wk, nu, merge, padvance);
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
#if MVT_SBW
// ---------------------------------------------------------------------------------
// MVT_SB 1 (variant 7; Q4_K / Q5_K, WK 8): the super-block walk. Warp k of a tile walks the
// super-blocks sb = k, k + 8, k + 16, ... (4 units each) instead of the slots k, k + 8, .. in
// bit-reversed order; unit u = 4 sb + j falls in slot u % 32 = 4 k + j (sb % 8 = k), so the warp
// owns the four slots 4k .. 4k + 3 and folds unit j into partial P[j]: each slot's units in
// increasing u, as mv_q8's lane does. The row meta (d, dmin, the 12 scale bytes) is loaded once
// per row and super-block and the four units' row scalars come from it with constant j; a
// super-block's bulk (128 / 160 bytes of a row) is fetched as one group, the next one of the
// warp (sb + 8) while this one is consumed: a two-buffer ring unrolled by 2 (static indices, no
// register moves), i.e. 4-8 units of weights in flight a warp instead of PF + 1. After the K loop
// the 32 slot partials of each output meet in shared memory and one warp a (pair of) output(s)
// adds them in warp_sum's butterfly order (t[m] + t[m + h], h = 16 .. 1: the same adds with the
// same operands as the xor butterfly), then finish()'s epilogue. Q5_K's qh chunks (shared by a
// super-block's units) are loaded once.
static_assert(MVT_WK == 8, "MVT_SB: the super-block walk needs MVT_WK 8 (warp k owns slots 4k .. 4k+3)");
static_assert(T::BLK == 256, "MVT_SB: K-quant super-blocks only");
static_assert(MVT_WM * MVT_TN <= 2, "MVT_SB: the slot partials (32 x WM x 4 TN x 32 floats) must fit 48 KiB of static shared memory");

// A super-block's words a lane holds: the rows' meta (and Q5_K's qh words, chunks 2, 3, shared
// by the super-block's units), double-buffered; the units' own bulk words (chunks 0, 1), one
// buffer refilled in place: unit j of the next super-block is loaded into slot j as soon as
// unit j of this one is consumed (4 units ahead, as a second whole buffer would be, in half the
// registers).
constexpr int NCU = 2;                              // per-unit chunks (Q4_K: all; Q5_K: qs)
static_assert(GT::NCH == NCU || (MV_TYPE == 13 && GT::NCH == 4), "MVT_SB: chunk split");
struct SBM {
    typename T::U w[2];
    uint32_t h[2][2];                               // Q5_K: qh words [chunk 2, 3][row half]
};
struct SBQ { uint32_t q[4][NCU][2]; };
MEMRA_DEVICE void fetch_meta(SBM& m, const uint8_t* const (&wb)[2], const uint8_t* const (&wm)[2], int sb) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) T::template load_meta<GLd>(m.w[rh], wm[rh] + T::moff(4 * sb), 4 * sb);
    if (MV_TYPE == 13) {
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            if (KPERM) {   // wb[] already carries + 4 tig: add the other 4 tig
                const uint2 v = ldw2(wb[rh] + GT::chunk(4 * sb, 2) + 4 * (threadIdx.x & 3));
                m.h[0][rh] = v.x; m.h[1][rh] = v.y;
            } else {
                m.h[0][rh] = ldw(wb[rh] + GT::chunk(4 * sb, 2));
                m.h[1][rh] = ldw(wb[rh] + GT::chunk(4 * sb, 3));
            }
        }
    }
}
template <int J>
MEMRA_DEVICE void fetch_unit(SBQ& q, const uint8_t* const (&wb)[2], int u) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
        if (KPERM) {
            const uint2 v = ldw2(wb[rh] + GT::chunk(u, 0) + 4 * (threadIdx.x & 3));
            q.q[J][0][rh] = v.x; q.q[J][1][rh] = v.y;
        } else {
            q.q[J][0][rh] = ldw(wb[rh] + GT::chunk(u, 0));
            q.q[J][1][rh] = ldw(wb[rh] + GT::chunk(u, 1));
        }
    }
}

// unit u = 4 sb + J, folded into P (kloop's unit body with J constant)
template <int J>
MEMRA_DEVICE void unit_sb(float (&P)[NO], const SBQ& sq, const SBM& m, int u, const int8_t* const (&xb_p)[MVT_TN],
                          const Q8Scale* const (&xs_p)[MVT_TN][2], bool tile1, int tig, int nu) {
    if (MEMRA_CANARY == 1 && u == 1) return;
    typename T::U w[2] = {m.w[0], m.w[1]};
    setj(w[0], J); setj(w[1], J);
    uint32_t qq[GT::NCH][2];
#pragma unroll
    for (int c = 0; c < GT::NCH; ++c)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) qq[c][rh] = c < NCU ? sq.q[J][c][rh] : m.h[(c - NCU) & 1][rh];
    uint32_t a[GT::NK][AR];
    GT::afrag(qq, w, tig, a);
    const typename GT::R rq[2] = {GT::rowscal(w[0]), GT::rowscal(w[1])};   // once per row
    const int sb = T::goff(u, 0, nu) / 32;          // first scale block of the unit
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) {
        if (ni == 1 && !tile1) break;               // warp-uniform: no live column
        uint32_t xb[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            if (KPERM) {
                if (g % 2 == 0) {
                    const uint2 v = __ldg(reinterpret_cast<const uint2*>(xb_p[ni] + T::goff(u, g, nu) + 4 * tig));
                    xb[g] = v.x; xb[g + 1] = v.y;
                }
            } else {
                xb[g] = ldx(xb_p[ni] + T::goff(u, g, nu));
            }
        }
        Q8Scale sv[2][4];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {   // groups 0, 1 in block 0; groups 2, 3 in block 1
            const uint4 e01 = __ldg(reinterpret_cast<const uint4*>(xs_p[ni][cc] + sb));
            sv[cc][0].d = sv[cc][1].d = __uint_as_float(e01.x);
            sv[cc][0].s = sv[cc][1].s = (int)e01.y;
            sv[cc][2].d = sv[cc][3].d = __uint_as_float(e01.z);
            sv[cc][2].s = sv[cc][3].s = (int)e01.w;
        }
        int c[GT::NK][4];
#pragma unroll
        for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], xb, k);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int ints[T::NI];
#pragma unroll
            for (int k = 0; k < T::NI; ++k) ints[k] = c[k][e];
            P[4 * ni + e] = GT::accum(P[4 * ni + e], rq[e >> 1], ints, sv[e & 1]);
        }
    }
}
// super-block sb from (sq, m) into P; with nx, unit j of super-block sb + WK refills slot j
// right after unit j is consumed
MEMRA_DEVICE void consume_sb(float (&P)[4][NO], SBQ& sq, const SBM& m, int sb, bool nx,
                             const uint8_t* const (&wb)[2], const int8_t* const (&xb_p)[MVT_TN],
                             const Q8Scale* const (&xs_p)[MVT_TN][2], bool tile1, int tig, int nu) {
    const int un = 4 * (sb + MVT_WK);
    unit_sb<0>(P[0], sq, m, 4 * sb + 0, xb_p, xs_p, tile1, tig, nu);
    if (nx) fetch_unit<0>(sq, wb, un + 0);
    unit_sb<1>(P[1], sq, m, 4 * sb + 1, xb_p, xs_p, tile1, tig, nu);
    if (nx) fetch_unit<1>(sq, wb, un + 1);
    unit_sb<2>(P[2], sq, m, 4 * sb + 2, xb_p, xs_p, tile1, tig, nu);
    if (nx) fetch_unit<2>(sq, wb, un + 2);
    unit_sb<3>(P[3], sq, m, 4 * sb + 3, xb_p, xs_p, tile1, tig, nu);
    if (nx) fetch_unit<3>(sq, wb, un + 3);
}

// one level of warp_sum's butterfly over slot values t[0 .. 2H): t[m] + t[m + H]
template <int H> MEMRA_DEVICE void tree_level(float (&t)[16]) {
#pragma unroll
    for (int m = 0; m < H; ++m) t[m] = __fadd_rn(t[m], t[m + H]);
}

template <bool GLU>
MEMRA_DEVICE void mvt_body_sb(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                              const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                              float* y, const float* res, int N, int K, int nb, int act) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wk = warp % MVT_WK, wm = warp / MVT_WK;
    constexpr int OBM = GLU ? 8 : 16;
    const int ob = (blockIdx.x * MVT_WM + wm) * OBM;
    const int cb = blockIdx.y * BN;
    const int nblk = K / T::BLK, nu = K / 64, nsb = K / 256;
    const size_t brs = (size_t)nblk * T::BULK, mrs = (size_t)nblk * T::META;
    int wr[2];
    if (GLU) {
        const int o = min(ob + gid, N - 1);
        wr[0] = o; wr[1] = o + N;
    } else {
        wr[0] = min(ob + gid, N - 1); wr[1] = min(ob + gid + 8, N - 1);
    }
    const uint8_t* wb[2] = {bulk + wr[0] * brs + 4 * tig, bulk + wr[1] * brs + 4 * tig};
    const uint8_t* wmp[2] = {meta + wr[0] * mrs, meta + wr[1] * mrs};
    const int8_t* xb_p[MVT_TN];
    const Q8Scale* xs_p[MVT_TN][2];
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) {
        xb_p[ni] = xq + (size_t)min(cb + 8 * ni + gid, nb - 1) * K + 4 * tig;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) xs_p[ni][cc] = xs + (size_t)min(cb + 8 * ni + 2 * tig + cc, nb - 1) * (K / 32);
    }
    const bool tile1 = MVT_TN > 1 && cb + 8 < nb;
#if MVT_PIN
    // as mvt_body, except the meta row pointers (one load a row and super-block) and the
    // activation pointers: recomputed, so that the 128 registers of MINB 2 hold without spills
    pin(wb[0]); pin(wb[1]);
#pragma unroll
    for (int ni = 0; ni < MVT_TN; ++ni) { pin(xs_p[ni][0]); pin(xs_p[ni][1]); }
#endif

    float P[4][NO];   // slot 4 wk + j's partial of output o (slots without units keep +0)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int o = 0; o < NO; ++o) P[j][o] = 0.f;

    SBQ Q;            // the units' bulk words, refilled in place
    SBM M0, M1;       // meta (+ Q5_K qh) of this and the next super-block
    int sb = wk;
    // weights are never written by kernels: the first super-block may be loaded before the PDL wait
    if (sb < nsb) {
        fetch_meta(M0, wb, wmp, sb);
        fetch_unit<0>(Q, wb, 4 * sb); fetch_unit<1>(Q, wb, 4 * sb + 1);
        fetch_unit<2>(Q, wb, 4 * sb + 2); fetch_unit<3>(Q, wb, 4 * sb + 3);
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    // unrolled by 2 so the meta buffers alternate at static indices (no register moves)
    while (sb < nsb) {
        bool nx = sb + MVT_WK < nsb;
        if (nx) fetch_meta(M1, wb, wmp, sb + MVT_WK);
        consume_sb(P, Q, M0, sb, nx, wb, xb_p, xs_p, tile1, tig, nu);
        sb += MVT_WK;
        if (!nx) break;
        nx = sb + MVT_WK < nsb;
        if (nx) fetch_meta(M0, wb, wmp, sb + MVT_WK);
        consume_sb(P, Q, M1, sb, nx, wb, xb_p, xs_p, tile1, tig, nu);
        sb += MVT_WK;
        if (!nx) break;
    }

    // the 32 slots of each output meet in shared memory; warp_sum's butterfly over them
    __shared__ float red[32][MVT_WM][NO][32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int o = 0; o < NO; ++o) red[4 * wk + j][wm][o][lane] = P[j][o];
    __syncthreads();
    auto tree = [&](int o) {   // level 16 straight from shared memory, then 8, 4, 2, 1
        float t[16];
#pragma unroll
        for (int m = 0; m < 16; ++m) t[m] = __fadd_rn(red[m][wm][o][lane], red[m + 16][wm][o][lane]);
        tree_level<8>(t); tree_level<4>(t); tree_level<2>(t); tree_level<1>(t);
        return t[0];
    };
    // warp wk finishes output o = wk (plain, wk < 4 TN) or the gate / up pair o, o + 2 with
    // o = 4 (wk >> 1) + (wk & 1) (glu, wk < 2 TN): finish()'s operations
    if (wk >= (GLU ? 2 : 4) * MVT_TN) return;
    const int ni = GLU ? wk >> 1 : wk >> 2;
    const int e = GLU ? wk & 1 : wk & 3;
    const int o = 4 * ni + e;
    const int row = ob + gid + 8 * (e >> 1);
    const int col = cb + 8 * ni + 2 * tig + (e & 1);
    if (ni == 1 && !tile1) return;   // warp-uniform: no live column in the second n tile
    float v = tree(o);
    if (GLU) {
        const float up = tree(o + 2);   // C rows gid (gate), gid + 8 (up)
        v = __fmul_rn(act == 2 ? gelu_tanh_f32(v) : silu_f32(v), up);
    }
    if (row >= N || col >= nb) return;
    const size_t yo = (size_t)col * N + row;
    if (res) v = __fadd_rn(v, res[yo]);
    y[yo] = v;
}
#endif  // MVT_SB
#endif  // MVT_LAYOUT

extern "C" __global__ void __launch_bounds__(NTHR, MVT_MINB)
mvt_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
       const float* res, int N, int K, int nb, int act) {
#if MVT_SBW
    mvt_body_sb<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#else
    mvt_body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#endif
}
extern "C" __global__ void __launch_bounds__(NTHR, MVT_MINB)
mvt_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
           const float* res, int N, int K, int nb, int act) {
#if MVT_SBW
    mvt_body_sb<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#else
    mvt_body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#endif
}
