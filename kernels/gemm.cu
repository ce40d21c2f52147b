// gemm.cu — quantized matrix products on the tensor cores (mma.sync int8) for many rows,
// bit-identical to matvec.cu's mv_q8 / mv_q8_glu.
//
// Computes y[b, n] = sum_k W[n, k] * x[b, k] for b < nb (any nb >= 1: decode batches, prefill
// chunks), W in one quantized GGUF type (MV_TYPE: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K, IQ4_XS) in the planes layout of matvec.cu, x as q8 activations (q8.cuh: int8 xq and
// one Q8Scale {d, s} per 32). Same arguments and epilogues as mv_q8: gemm_q8_glu reads 2N
// weight rows [gate; up] and writes act(gate) * up (act 1 SiLU, 2 GELU-tanh); res (nullable,
// may alias y) is added last. Each weight byte is read once per block column (ceil(nb / BN)
// times per launch, from L2 after the first), not once per 8 rows.
//
// What is computed, exactly (the exactness argument). mv_q8 (MV_KSPLIT 1) gives output (n, b)
// as: lane slot l in 0..31 folds its units u = l, l+32, l+64, ... (64 weights each, qtypes.cuh)
// in increasing u into P_l = T::accum(...T::accum(0, u=l)..., u=l+32...); then the xor
// butterfly of warp_sum: level 1 sums P_l + P_(l+16), level 2 adds the pairs 8 apart, then 4,
// 2, 1; then finish(): __fmul_rn(act(gate), up), then __fadd_rn(v, res). This kernel performs
// the same float operations on the same operands:
//  - a unit's integer dot products (per 32-element activation block; per 16-element group for
//    Q6_K, whose groups carry their own scale) come from mma.sync m16n8k32 (m16n8k16 for Q6_K)
//    s8 x s8 -> s32 with a zero accumulator: integer sums are exact in any order, so they equal
//    idots' dp4a sums bit for bit (|sum| <= 32 * 127 * 127, no overflow);
//  - G<T>::accum (mma_frag.cuh), the float part of the T::accum that mv_q8 calls (T::accum_r;
//    for Q4_K / Q5_K an exact rewrite with float row scalars, mma_frag.cuh RK4F), folds each
//    unit into the slot partial; every float operation in it is an explicit-rounding
//    intrinsic, so no contraction differs. Its row scalars come from G<T>::rowscal, computed
//    once per row instead of once per output;
//  - the slots are walked in bit-reversed order (slot l = brev5(i), i = 0..31), each slot's
//    units in increasing u, and a finished slot is merged into a 5-level stack exactly like a
//    binary counter: after slot i, the partials of the t = trailing-ones(i) pending left
//    siblings are added (L_k + v, k = 0..t-1) and the result is parked at level t. Slot
//    brev5(i) and brev5(i ^ 1) differ in bit 4 (the butterfly's offset 16), i's bit k is the
//    offset 16 >> k, so every add is a butterfly add with the same two operands (float
//    addition is commutative: operand order does not matter, and the tree is the same);
//  - with GM_WK > 1 warp groups, group k takes the slots l = k (mod WK): those form the
//    butterfly's subtree below its last log2(WK) levels (offsets WK/2 .. 1), which the group
//    walks exactly as above (leaf j = slot k + WK brev(j)); at the end the groups' roots meet
//    through shared memory in those last levels, T(k) = T(k) + T(k + o) for o = WK/2 .. 1;
//  - the epilogue is finish()'s, with the same common.cuh activation functions.
// Nothing depends on nb, the tile sizes, the grid or the chunk of rows a caller passes, so a
// row's bits are the same in every launch and equal to mv_q8's at any MV_B.
//
// Tiles. A block owns BM = GM_WM * GM_TM * 16 weight rows (for _glu: BM/2 output rows, gate
// and up rows both) and BN = GM_WN * GM_TN * 8 batch columns; its GM_WM x GM_WN x GM_WK warps
// own GM_TM m16 tiles x GM_TN n8 tiles each (for _glu, m tiles [0, TM/2) are gate rows and
// [TM/2, TM) the up rows of the same outputs, so one thread holds both), for their group's
// slots. A thread holds, per output it owns (TM * TN * 4 of them, mma C layout: rows gid,
// gid + 8, columns 2 tig, +1), the current slot partial P and the LV = 5 - log2(WK) pending
// stack levels: the first GM_LREG in registers, the rest in shared memory ([level][output]
// [thread], touched once per slot); a unit's row scalars (T::rowscal) are computed once per row.
// The K loop runs WK units (64 elements each, one per group) per step, in slot order; each
// unit's weight bulk bytes (BM rows x WB bytes), meta bytes (BM x MW), activations (BN x 64
// bytes) and activation scales (BN x 2 or 4 Q8Scale) are staged in shared memory by cp.async,
// GM_STAGES deep. Weights go into A fragments with ldmatrix (.x4: rows gid / gid + 8, word
// tig of two 16-byte chunks) and are unpacked in registers (nibbles, Q5 high bits, Q6_K, IQ4_XS):
// the k order inside a 32-block is free as long as A and B agree, and the natural order
// makes every type's raw bytes fragment-ready. Activations go into B fragments with ldmatrix.
//
// Tunables (-D): MV_TYPE (ggml type id, required), GM_WM warps along rows (2), GM_WN warps
// along the batch (4), GM_TM m16 tiles per warp (2; even for _glu), GM_TN n8 tiles per warp
// (2), GM_WK warp groups splitting the slots (1; 1, 2, 4, 8, 16), GM_STAGES cp.async
// pipeline depth (3; >= 2), GM_LREG stack levels kept in registers (1; 0..5), GM_MINB the
// blocks per SM __launch_bounds__ asks for (2: at most 128 registers for 256 threads),
// GM_STATIC=1 the static slot structure of variant 9 (GM_WK 1 with GM_LREG >= 1; other
// configurations keep the slot walk; the default; 0 compiles exactly the slot walk), GM_RSS=1
// (variant 10 a, the default: Q4_K / Q5_K row scalars staged once per block row; with
// GM_STATIC_ON only, else ignored), GM_AOFF=1 (variant 10 b, the default: Q4_0 / Q5_0's offset
// in the A fragment; other types ignore it); the three are rollback seams (0: variant 8's
// code), not tunables. GM_SASS_FULL=1
// (SASS counting only: the partial-block consume path left out),
// MEMRA_CANARY=1 drops unit 1 of every row (as mv_q8's canary: a deliberately wrong variant
// that a check must catch). Measured on the H200 (WM,WN,TM,TN,WK,STAGES,LREG,MINB; variant 7,
// experiments/gemm_sweep.sh): 4 n8 tiles a warp win at every batch: nb 16 2,1,2,4,4,3,1,1,
// nb 64 2,1,2,4,2,3,1,2 (the 4096-row shapes 1,1,2,4,4,3,1,2 or 2,1,2,4,4,3,1,1), nb 512
// 2,2,2,4,1,3,1,1 (memra/gpu/ops/gemm.py CONFIGS; the table per shape).
// Launch: grid = (ceil(N / OBM), ceil(nb / BN)) with OBM = BM (gemm_q8) or BM / 2
// (gemm_q8_glu), block = NTHR = 32 * GM_WM * GM_WN * GM_WK, dynamic shared memory
// max(GM_STAGES * GM_WK * STAGE + max(0, LV - GM_LREG) * TM * TN * 4 * NTHR * 4,
//     GM_WK > 1 ? GM_WK * BM * BN * 4 : 0) bytes,
// STAGE = BM * WBS + BN * 80 + BN * SSB + BM * MWS (rounded up to 16), per type (WBS, SSB, MWS):
// Q4_0 (48, 16, 4), Q4_1 (48, 16, 8), Q5_0 (48, 16, 12), Q5_1 (48, 16, 16), Q8_0 (80, 16, 4),
// Q4_K (48, 16, 16), Q5_K (80, 16, 16), Q6_K (48, 32, 20), IQ4_XS (48, 16, 8) (above 48 KiB
// the launcher raises the kernel's limit). K a multiple of 64 and of the type's block; the
// planes and xq / xs 16-byte aligned (memra's upload_weight does this).
//
// History:
//  1. first version: bit-reversed slot walk with a register stack of pending butterfly
//     levels, m16n8k32 (Q6_K m16n8k16) on unpacked ldmatrix fragments, cp.async stages.
//     H200: bit-identical to mv_q8 in 835 checks; Q4_0 78, Q8_0 87, Q6_K 57, Q4_K 18 TOPS
//     at nb = 512 (4096 x 4096; Q6_K 4096 x 14336).
//  2. row scalars (qtypes.cuh rowscal) once per row instead of per output: Q4_K 18 -> 46
//     TOPS at nb = 512 (its 6-bit scale unpacking ran per output).
//  3. GM_WK warp groups split the slots (exact: subtrees of the butterfly), for small
//     batches: Q4_K gate+up 2 x 14336 x 4096 at nb = 16 in 121 us (mv_q8 chunks: 340 us).
//  4. stack levels past GM_LREG in shared memory, __launch_bounds__(NTHR, GM_MINB): 188 ->
//     <= 128 registers, two blocks (16 warps) per SM; nb = 512: Q4_0 84 -> 100, Q4_K 47 -> 60,
//     Q6_K 57 -> 61 TOPS (ncu before: 2 warps per scheduler, 0.49 issued per cycle).
//  5. Q4_K / Q5_K row scalars by a block-uniform switch on j = u & 3 (constant byte
//     positions; ncu: 702 instructions per warp and unit before, most of them byte selects):
//     Q4_K nb = 512 59 -> 75 TOPS, gate+up 78.
//  6. a unit's (mi, ni) tiles as one straight line when every n tile of the block
//     has live columns (consume(true); the per-tile liveness branch only in blocks with dead
//     columns): the scheduler interleaves the tiles' IMMAs and epilogues and the nibble
//     unpack is no longer redone per n tile. 8B Q4_K_M decode step at 64 rows 19.84 ->
//     19.14 ms (down Q6_K 2.68 -> 2.53 ms), at 16 rows within noise.
//  7. Q4_K / Q5_K row scalars as floats d sc, dmin m (mma_frag.cuh RK4F, the same
//     bits as mv_q8's accum_k4: its exactness note), 9 float operations per output and unit
//     instead of 15 plus 4 integer products, and (float)S once per column; and the sweep of
//     4-n8-tile configurations (32 outputs a thread, ~220 registers, GM_MINB 1 or 2), never
//     tried before. ncu before (2,2,2,2,2,3,1,2, glu 2 x 14336 x 4096 at nb 64, 221 us):
//     600 instructions per warp and unit for 16 outputs (IMAD 16 %, I2FP 11 %, LOP3 9 %,
//     FFMA 8 %, FMUL 8 %, SHF 8 %, BRA 5 %, IMMA 1.3 %), issue slots 66 % busy, 3.66 warps
//     per scheduler, 3.39 waves (ncu: the partial wave up to 25 %). H200, bits = mv_q8's in
//     493 checks, us at nb 64 (v6 built-in -> v7 best): glu 220 -> 197, Q6_K 4096 x 14336
//     155 -> 131, Q4_K 6144 x 4096 66 -> 55, 4096 x 4096 46 -> 34; nb 512: glu 1485 -> 1300
//     (92.5 TOPS), Q6_K 979 -> 807. The accum alone, same config: glu at 64 220 -> 211,
//     at 512 1619 -> 1532 (research/2026-12-01-gemm-v7/).
//  8. (this) the K-quants' and IQ4_XS's row scalars once per quad (LaneRS below): lane tig
//     unpacks those of the quad's row tig (2 GM_TM rows, 4 lanes holding the same rows) and
//     the quad shares them by shuffles, instead of every lane unpacking all of them; their A
//     fragments read no meta. Static SASS of the glu module (Q4_K, 2,1,2,4,2,3,1,2): 5792 ->
//     5408 instructions (SHF -152, LOP3 -126, IMAD -87; +32 SHFL), registers 219 -> 245 (the
//     same 2 blocks an SM). Predicted ~10 % (v7's counters: ~100 of 731 instructions per warp
//     and unit were row scalars); H200, v7 and v8 in one call, 321 checks bit-identical to
//     mv_q8 each (research/2026-12-01-session9/gemm-ab/): best configuration per shape, us at
//     16 / 64 / 128 / 512 rows: glu 95.9 / 194.6 / 345.1 / 1303.9 -> 95.7 / 185.8 / 327.0 /
//     1246.4 (+0 / 5 / 6 / 5 %), Q6_K 4096 x 14336 +3 % at each, qkv 6144 x 4096 0 / 3 / 0 / 4
//     %, 4096 x 4096 3 / -2 / 2 / 3 %. Less than predicted: the kernel is latency-bound (v7:
//     45 % of issue slots), so instructions off the critical path buy less than their count.
//  9. (GM_STATIC=1, the default; GM_WK 1 only) a static slot structure instead of the
//     run-time slot walk and its jump-table merge: the consumer loop is a nest "pair i = 0..15 ->
//     leaf 2i's units, leaf 2i + 1's units" with leaf 2i = slot brev4(i), leaf 2i + 1 = slot
//     brev4(i) + 16 (brev5(2i) and brev5(2i + 1) differ in bit 4 only); leaf 2i folds into the
//     stack's level 0 (registers) and leaf 2i + 1 into P directly, so merge(2i), which parked P at
//     level 0 and zeroed it, is gone (no copy: the two register sets swap roles statically); then
//     P = L0 + P and, for l = 1.., while bit l - 1 of i is set, P = L_l + P, parking P at the first
//     level whose bit is clear (the root after i = 15): warp-uniform branches, one per level, no
//     jump table and no per-slot MOVs. Every add is merge(2i + 1)'s on the same operands, in the
//     same order; a slot with no unit (nu = K / 64 not a multiple of 32, or < 32) loops zero times
//     and contributes the +0 it starts from, merged by the same adds, as the slot walk's leading /
//     trailing empty slots and mv_q8's idle lanes; units within a slot in increasing u, and the
//     producer's walk (and so the staged sequence: the slot walk's leaf order) is unchanged, one
//     unit a stage and a barrier. experiments/gemm_v9/selftest.py replays this loop against
//     mv_q8's lane order and butterfly (nu = 1..300, signed zeros) bit for bit. Static SASS
//     (Q4_K glu, 2,2,2,4,1,3,1,1, experiments/gemm_v9/): a unit 36.0 -> 34.8 instructions an
//     IMMA, the merge ~5.8 -> ~3.3 an IMMA at K = 4096 (weighted by how often each level runs),
//     registers 251 -> 255, no spills: predicted -3 to -6 % at 512 rows (latency-bound).
//     H200 (session 14, experiments/gemm_v9/ab.sh, bits = mv_q8's everywhere), us at 512 rows
//     base -> GM_STATIC=1: glu 1249.2 -> 1146.7 (0.918; 0.923 at 128 rows), Q6_K 4096 x 14336
//     786.9 -> 748.7 (0.951), Q4_0 4096 x 4096 145.3 -> 132.5 (0.912), qkv 0.919; 16 rows ~1.0.
// 10. (GM_RSS=1, GM_AOFF=1, the defaults since session 15; with both 0 every module's SASS is
//     variant 9's) step 2 of experiments/gemm_plan, the parts inside
//     gemm.cu, exact. (a) GM_RSS=1 (with GM_STATIC_ON; Q4_K, Q5_K): a unit's row scalars (RK4F:
//     d sc, dmin m of its two sub-blocks) computed once per block row and unit by a cooperative
//     pass (threads r < BM) into the free 16-byte pad of the staged bulk row (WBS - 16 NCH),
//     instead of per warp and quad lane with 16 shuffles; the consumer loads them (one LDS.128 a
//     row). The pass for position t + 1 of the staged sequence runs after barrier t (its own copy
//     of the producer's walk gives the unit), so a unit's meta is staged one step early (issued
//     with the previous unit's bulk, into its own stage's meta window, which the consumer no
//     longer reads); position 0's come from global memory in the prologue. The same rowscal on
//     the same bytes: the same bits. (b) GM_AOFF=1 (Q4_0, Q5_0): the offset 8 S
//     (16 S) inside the integer dot: A bytes q - 8 ((q + 0x78) ^ 0x80; Q5_0 q - 16), so the mma
//     returns I - 8 S, the int accum_r converted before (q8.cuh: S is the sum of the block's
//     stored q). No float operation changes; shared-memory layout and size are unchanged
//     (memra/gpu/ops/gemm.py's formula holds). experiments/gemm_v10/selftest.py: the staging
//     schedule race-free with each unit's own scalars (2..5 stages, nu = 1..300), Q4_K against
//     mv_q8 (f16 subnormals, exponents over 2^+-40), the offset bytes exhaustively. Static SASS
//     (2,2,2,4,1,3,1,1, unit loop per IMMA, v9 -> v10): Q4_K glu 34.8 -> 33.1 (registers 255 ->
//     252; executed, the pass running in 2 of 4 warps and one switch case: ~32.3 -> ~29.2), Q4_0
//     28.1 -> 26.6, Q6_K unchanged; no spills. Predicted 512 rows vs v9: glu / qkv -5 to -9 %,
//     Q4_0 -3 to -5 %, Q6_K 0 (experiments/gemm_v10/README.md). H200 (session 15,
//     experiments/gemm_v10/ab.sh, 2,2,2,4,1,3,1,1, every output bit-equal to mv_q8, us at 16 /
//     128 / 512 rows, v9 -> v10): glu 240.3 / 303.4 / 1144.1 -> 257.7 / 287.8 / 1077.1 (1.072 /
//     0.949 / 0.941), qkv 6144 x 4096 62.7 / 87.5 / 248.4 -> 60.8 / 81.6 / 231.0 (0.97 / 0.93 /
//     0.93), Q4_0 4096 x 4096 53.7 / 49.8 / 135.7 -> 51.6 / 45.6 / 127.3 (0.96 / 0.92 / 0.94),
//     Q6_K 1.00; against variant 8: 0.83-0.88 at 128 and 512 rows. Withdrawn with it: GM_XSF
//     (the activation sums as floats once per block column through the same pass): 0.978-1.021
//     of (a) + (b), neutral (research/2026-12-02-session15/gemm-v10-ab.jsonl).
//  Withdrawn (research/2026-12-01-batch/, both bit-identical): the accum's int -> float
//  conversions by a magic-number add instead of I2FP (1-7 % slower), and Q4_K / Q5_K row
//  scalars d sc, dmin m per row with 9 float operations per output instead of 15 (gate+up
//  at 64 rows -2 %). With variant 6's 3 %, neither the issue rate, the conversions nor the
//  ILP within a warp is what bounds this kernel at 16..64 rows: the next step is counters.
// The type selection, the mma wrappers, G<T> and mma_unit live in mma_frag.cuh (shared with
// mvt.cu, moved unchanged: the SASS of every module compared, 6 types x 2 configs, is identical).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "mma_frag.cuh"

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id) must be defined"
#endif
#ifndef GM_WM
#define GM_WM 2
#endif
#ifndef GM_WN
#define GM_WN 4
#endif
#ifndef GM_TM
#define GM_TM 2
#endif
#ifndef GM_TN
#define GM_TN 2
#endif
#ifndef GM_STAGES
#define GM_STAGES 3
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
#if GM_STAGES < 2
#error "GM_STAGES must be >= 2"
#endif

// T (the weight type of MV_TYPE), G<T> and the mma wrappers: mma_frag.cuh (shared with mvt.cu)

#ifndef GM_WK
#define GM_WK 1
#endif
#if GM_WK != 1 && GM_WK != 2 && GM_WK != 4 && GM_WK != 8 && GM_WK != 16
#error "GM_WK must be 1, 2, 4, 8 or 16"
#endif
constexpr int NTHR = 32 * GM_WM * GM_WN * GM_WK;
constexpr int SKB = GM_WK == 1 ? 0 : GM_WK == 2 ? 1 : GM_WK == 4 ? 2 : GM_WK == 8 ? 3 : 4;
constexpr int LV = 5 - SKB;          // stack levels of a group's subtree
constexpr int NLEAF = 1 << LV;       // slots per group
#ifndef GM_LREG
#define GM_LREG 1
#endif
#ifndef GM_MINB
#define GM_MINB 2
#endif
#ifndef GM_STATIC
#define GM_STATIC 1
#endif
// variant 9: the static slot structure (GM_WK 1 with GM_LREG >= 1 only; otherwise the slot walk)
#define GM_STATIC_ON (GM_STATIC && GM_WK == 1 && GM_LREG >= 1)
#ifndef GM_SASS_FULL
#define GM_SASS_FULL 0   // SASS counting only (experiments/gemm_v9/sass_classes.py): no partial-block path
#endif
#ifndef GM_RSS
#define GM_RSS 1   // variant 10 (a): row scalars staged once per block row (needs GM_STATIC_ON; see RSS)
#endif
#ifndef GM_AOFF
#define GM_AOFF 1  // variant 10 (b): Q4_0 / Q5_0's activation offset (8 S, 16 S) inside the integer dot
#endif
constexpr int NOUT = GM_TM * GM_TN * 4;                       // outputs per thread
constexpr int LSM = LV > GM_LREG ? LV - GM_LREG : 0;         // stack levels in shared memory
#if 32 * GM_WM * GM_WN * GM_WK * GM_MINB > 2048
#error "GM_MINB blocks of 32 * GM_WM * GM_WN * GM_WK threads exceed an SM (2048 threads)"
#endif
constexpr int BM = GM_WM * GM_TM * 16;
constexpr int BN = GM_WN * GM_TN * 8;

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
template <int N>
MEMRA_DEVICE void cpn(uint32_t dst, const void* src) {   // N = 4, 8, 16 bytes
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(dst), "l"(src), "n"(N) : "memory");
}
// 4-byte copy reading only `n` (<= 4) source bytes, the rest zero-filled
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

// The meta fields read from shared memory (qtypes.cuh's load_meta through this loader).
struct SLd {
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};


constexpr int XS = 80;                           // smem stride of a column's 64 activation bytes
constexpr int SSB = 8 * GT::SB;                  // smem bytes of a column's scales
constexpr int OFF_X = BM * GT::WBS;
constexpr int OFF_S = OFF_X + BN * XS;
constexpr int OFF_M = OFF_S + BN * SSB;
constexpr int STAGE = (OFF_M + BM * GT::MWS + 15) / 16 * 16;
static_assert(GT::WBS % 16 == 0 && (GT::WBS / 16) % 2 == 1, "WBS must be an odd multiple of 16");
static_assert(GT::NCH * 16 <= GT::WBS, "bulk chunks exceed the stride");
static_assert(OFF_S % 16 == 0 && OFF_M % 16 == 0, "stage regions must be 16-byte aligned");


MEMRA_DEVICE int brev5(int i) { return (int)(__brev((unsigned)i) >> 27); }

// Row scalars computed once per quad (variant 8): the four lanes of a quad (same gid) hold the
// same 2 * GM_TM rows, so for the types whose row scalars cost most (the K-quants' scale
// unpacking, IQ4_XS's 6-bit scales) lane tig computes those of the quad's rows tig, tig + 4, ...
// (row t = m tile t / 2, half t % 2) and the quad shares them by shuffles; their A fragments
// need no meta (Q5_K's only the unit's j). The same rowscal on the same bytes: the bits are
// unchanged. The other types' row scalars are one or two f16 conversions: computed in place.
template <class TT> struct LaneRS { static constexpr bool on = false; };
template <> struct LaneRS<TQ4_K> { static constexpr bool on = true; };
template <> struct LaneRS<TQ5_K> { static constexpr bool on = true; };
template <> struct LaneRS<TQ6_K> { static constexpr bool on = true; };
template <> struct LaneRS<TIQ4_XS> { static constexpr bool on = true; };
constexpr bool LRS = LaneRS<T>::on;
template <class U> MEMRA_DEVICE void unit_j(U&, int) {}
MEMRA_DEVICE void unit_j(TQ5_K::U& w, int u) { w.j = u & 3; }
constexpr int QRW = (2 * GM_TM + 3) / 4;   // rows a lane computes
template <class RR>
MEMRA_DEVICE RR shfl_rs(const RR& v, int src) {
    static_assert(sizeof(RR) % 4 == 0, "row scalars are 32-bit words");
    RR o;
    const uint32_t* a = reinterpret_cast<const uint32_t*>(&v);
    uint32_t* b = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(RR) / 4); ++i) b[i] = __shfl_sync(0xffffffffu, a[i], src);
    return o;
}

// Variant 10 (a), GM_RSS=1: the row scalars of the LRS types whose G<T>::R fits the 16-byte pad
// of a staged bulk row (Q4_K, Q5_K: RK4F, WBS - 16 NCH = 16 bytes; IQ4_XS would fit, but its
// row scalars are cheap, no switch, and the static count rose 37.8 -> 38.6 an IMMA: left out) are
// computed once per block row and unit by a cooperative pass (thread r < BM: row r) into that
// pad, instead of once per warp (and quad lane) with 16 shuffles a unit; the consumer reads them
// with one 16-byte shared load per row. The pass for the unit at position t + 1 of the staged
// sequence runs at step t (after its barrier; the consumer reads it after barrier t + 1), so that
// unit's meta is staged one step early: the producer issues unit n's meta with unit n - 1's bulk,
// into unit n's stage's meta window (read only by the pass at step n - 1, never by the
// consumer); the pass follows the staged sequence with its own copy of the producer's walk
// (rj, ru). Position 0's row scalars come from global memory in the prologue. The same rowscal
// on the same meta bytes: the bits are unchanged. GM_STATIC_ON only (GM_WK 1).
template <class TT> struct RSFit { static constexpr bool on = false; };
template <> struct RSFit<TQ4_K> { static constexpr bool on = true; };
template <> struct RSFit<TQ5_K> { static constexpr bool on = true; };
constexpr bool RSS = GM_RSS && GM_STATIC_ON && LRS && RSFit<T>::on;
constexpr int OFF_RS = 16 * GT::NCH;             // the row scalars' place in a staged bulk row
static_assert(!RSS || (GT::WBS - OFF_RS >= (int)sizeof(typename GT::R) && sizeof(typename GT::R) % 8 == 0),
              "GM_RSS: the row scalars must fit the bulk row's pad");

// Variant 10 (b), GM_AOFF=1: Q4_0's (Q5_0's) float part takes (float)(I - 8 S) ((I - 16 S)) per
// output and block, I the block's integer dot and S its activation sum (q8.cuh: s is the sum of
// the block's 32 stored int8 q, exactly). With the offset in the A fragment (each weight byte
// q in 0..15 (0..31) becomes the signed byte q - 8 (q - 16): (q + 0x78) ^ 0x80, (q + 0x70) ^ 0x80,
// no carry between bytes) the mma's integer sum is sum (q - 8) x = I - 8 S exactly, the same
// int the float part converted before; the float operations and operands are unchanged.
template <class TT> struct AOffK { static constexpr int k = 0; };
template <> struct AOffK<TQ4_0> { static constexpr int k = 8; };
template <> struct AOffK<TQ5_0> { static constexpr int k = 16; };
constexpr bool AOF = GM_AOFF && AOffK<T>::k != 0;
MEMRA_DEVICE uint32_t aoff(uint32_t v) {
    return (v + (uint32_t)(128 - AOffK<T>::k) * 0x01010101u) ^ 0x80808080u;
}
// the float part of a unit with the offset already in ints: T::accum_r's operations on
// T::accum_r's operands (ints[k] here = ints[k] - k S there)
template <class TT> MEMRA_DEVICE float accum_aoff(float acc, const typename TT::R& q, const int* ints, const Q8Scale* s) {
    float r = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) r = __fmaf_rn(__fmul_rn(q.d[k], s[2 * k].d), (float)ints[k], r);
    return __fadd_rn(acc, r);
}
template <class TT> MEMRA_DEVICE float accum_sel(float acc, const typename G<TT>::R& q, const int* ints, const Q8Scale* s) {
    if constexpr (GM_AOFF && AOffK<TT>::k != 0) return accum_aoff<TT>(acc, q, ints, s);
    else return G<TT>::accum(acc, q, ints, s);
}

// Which weight row smem row r of the block holds (clamped: rows past N are loaded and
// computed, never stored). GLU: warp wm's m tiles [0, TM/2) are gate rows, [TM/2, TM) the
// up rows (N further down) of the same outputs.
template <bool GLU>
MEMRA_DEVICE int weight_row_of(int r, int ob, int N) {
    if (!GLU) return min(ob + r, N - 1);
    const int wm = r / (GM_TM * 16), mi = (r / 16) % GM_TM, i = r % 16;
    const int o = ob + wm * (GM_TM / 2) * 16 + (mi % (GM_TM / 2)) * 16 + i;
    return min(o, N - 1) + (mi >= GM_TM / 2 ? N : 0);
}

template <bool GLU>
MEMRA_DEVICE void produce_meta(uint32_t st, int u, const uint8_t* __restrict__ meta, int N, int ob, size_t mrs);
// Stage the operands of unit u into stage buffer `st` (shared address).
template <bool GLU>
MEMRA_DEVICE void produce(uint32_t st, int u, const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                          const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                          int N, int K, int nb, int ob, int cb, size_t brs, size_t mrs) {
    const int tid = threadIdx.x;
    // weight bulk: BM rows x NCH chunks
#pragma unroll
    for (int i0 = 0; i0 < BM * GT::NCH; i0 += NTHR) {
        const int i = i0 + tid;
        if (BM * GT::NCH % NTHR == 0 || i < BM * GT::NCH) {
            const int r = i / GT::NCH, c = i % GT::NCH;
            const size_t row = (size_t)weight_row_of<GLU>(r, ob, N);
            cp16(st + r * GT::WBS + 16 * c, bulk + row * brs + GT::chunk(u, c));
        }
    }
    // activations: BN columns x 4 groups of 16 bytes, group g from element goff(u, g)
#pragma unroll
    for (int i0 = 0; i0 < BN * 4; i0 += NTHR) {
        const int i = i0 + tid;
        if (BN * 4 % NTHR == 0 || i < BN * 4) {
            const int col = i >> 2, g = i & 3;
            const size_t b = (size_t)min(cb + col, nb - 1);
            cp16(st + OFF_X + col * XS + 16 * g, xq + b * K + T::goff(u, g, 0));
        }
    }
    // activation scales: SB blocks from block goff(u, 0) / 32, in 16-byte pieces
#pragma unroll
    for (int i0 = 0; i0 < BN * GT::SB / 2; i0 += NTHR) {
        const int i = i0 + tid;
        if (BN * GT::SB / 2 % NTHR == 0 || i < BN * GT::SB / 2) {
            const int col = i / (GT::SB / 2), c = i % (GT::SB / 2);
            const size_t b = (size_t)min(cb + col, nb - 1);
            cp16(st + OFF_S + col * SSB + 16 * c, xs + b * (K / 32) + T::goff(u, 0, 0) / 32 + 2 * c);
        }
    }
    if (!RSS) produce_meta<GLU>(st, u, meta, N, ob, mrs);
}
// the meta window of unit u into stage `st`: MW bytes from the aligned start of its meta bytes
template <bool GLU>
MEMRA_DEVICE void produce_meta(uint32_t st, int u, const uint8_t* __restrict__ meta, int N, int ob, size_t mrs) {
    const int tid = threadIdx.x;
    constexpr int NP = GT::MW / GT::MCP;
#pragma unroll
    for (int i0 = 0; i0 < BM * NP; i0 += NTHR) {
        const int i = i0 + tid;
        if (BM * NP % NTHR == 0 || i < BM * NP) {
            const int r = i / NP, c = i % NP;
            const size_t abs = (size_t)weight_row_of<GLU>(r, ob, N) * mrs + T::moff(u);
            const size_t start = abs & ~(size_t)(GT::MCP - 1);
            const uint32_t dst = st + OFF_M + r * GT::MWS + GT::MCP * c;
            if (K16 && c == NP - 1) {
                // Q6_K: the 18 meta bytes end 2 bytes into the last word when they start
                // 4-byte aligned: read only those (never past the plane's end)
                cp4n(dst, meta + start + 4 * c, (abs & 3) ? 4 : 2);
            } else {
                cpn<GT::MCP>(dst, meta + start + GT::MCP * c);
            }
        }
    }
}

template <bool GLU>
MEMRA_DEVICE void gemm_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                            const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                            float* y, const float* res, int N, int K, int nb, int act) {
    extern __shared__ __align__(128) uint8_t gm_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wk = warp / (GM_WM * GM_WN), wmn = warp % (GM_WM * GM_WN);
    const int wm = wmn / GM_WN, wn = wmn % GM_WN;
    constexpr int OBM = GLU ? BM / 2 : BM;
    const int ob = blockIdx.x * OBM, cb = blockIdx.y * BN;
    const int nblk = K / T::BLK, nu = K / 64;
    const size_t brs = (size_t)nblk * T::BULK, mrs = (size_t)nblk * T::META;
    const uint32_t sbase = smem_u32(gm_smem);

    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    // per output (m tile, n tile, C element; o = (mi * GM_TN + ni) * 4 + e): the current slot
    // partial P and the pending levels L0..L(LV-1) of the group's subtree
    constexpr int NO = NOUT;
    float P[NO], Lr[GM_LREG > 0 ? GM_LREG : 1][NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        P[o] = 0.f;
#pragma unroll
        for (int l = 0; l < (GM_LREG > 0 ? GM_LREG : 1); ++l) Lr[l][o] = 0.f;
    }
    // levels GM_LREG.. of the stack: shared memory after the stages, [level][o][thread]
    float* Ls = reinterpret_cast<float*>(gm_smem + GM_STAGES * GM_WK * STAGE);
    auto Lget = [&](int l, int o) -> float { return l < GM_LREG ? Lr[l][o] : Ls[((l - GM_LREG) * NO + o) * NTHR + tid]; };
    auto Lset = [&](int l, int o, float v) {
        if (l < GM_LREG) Lr[l][o] = v; else Ls[((l - GM_LREG) * NO + o) * NTHR + tid] = v;
    };

    // leaf j (tree order) of group k is slot k + WK brev_LV(j); its units step by 32
    auto slot = [](int k, int j) { return k + GM_WK * (int)(__brev((unsigned)j) >> (32 - LV)); };
    // slot-finished merge of leaf j (a binary counter over the group's subtree)
    auto merge = [&](int j) {
        const int tz = __ffs(~j) - 1;   // trailing ones of j (warp-uniform)
        if (tz >= LV) {                 // the group's last leaf: its subtree root, kept in P
#pragma unroll
            for (int o = 0; o < NO; ++o) {
                float v = P[o];
#pragma unroll
                for (int l = 0; l < LV; ++l) v = __fadd_rn(Lget(l, o), v);
                P[o] = v;
            }
            return;
        }
        switch (tz) {
#define GM_MERGE(T)                                                                        \
        _Pragma("unroll") for (int o = 0; o < NO; ++o) {                                     \
            float v = P[o];                                                                   \
            _Pragma("unroll") for (int l = 0; l < T; ++l) v = __fadd_rn(Lget(l, o), v);       \
            Lset(T, o, v);                                                                    \
            P[o] = 0.f;                                                                       \
        }
        case 0: GM_MERGE(0); break;
        case 1: GM_MERGE(1); break;
        case 2: GM_MERGE(2); break;
        case 3: GM_MERGE(3); break;
        default: GM_MERGE(4); break;
#undef GM_MERGE
        }
    };

    // producer: per group, the next (leaf, unit) to stage (empty slots skipped)
    int pj[GM_WK], pu[GM_WK];
#pragma unroll
    for (int k = 0; k < GM_WK; ++k) {
        pj[k] = 0; pu[k] = k;
        while (pu[k] >= nu && pj[k] < NLEAF) { ++pj[k]; pu[k] = pj[k] < NLEAF ? slot(k, pj[k]) : 0; }
    }
    int pst = 0;
    auto produce_step = [&]() {
#pragma unroll
        for (int k = 0; k < GM_WK; ++k) {
            if (pj[k] < NLEAF) {
                produce<GLU>(sbase + (pst * GM_WK + k) * STAGE, pu[k], bulk, meta, xq, xs, N, K, nb, ob, cb, brs, mrs);
                pu[k] += 32;
                while (pu[k] >= nu && pj[k] < NLEAF) { ++pj[k]; pu[k] = pj[k] < NLEAF ? slot(k, pj[k]) : 0; }
                if (RSS && pj[k] < NLEAF) {   // the next unit's meta into the next stage
                    const int nst = pst + 1 == GM_STAGES ? 0 : pst + 1;
                    produce_meta<GLU>(sbase + nst * STAGE, pu[k], meta, N, ob, mrs);
                }
            }
        }
        pst = pst + 1 == GM_STAGES ? 0 : pst + 1;
    };
    const int nsteps = (nu + GM_WK - 1) / GM_WK;   // group 0 has the most units
    int rj = pj[0], ru = pu[0];   // GM_RSS: the pass's position in the staged sequence (position 0)
#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; ++s) {
        if (s < nsteps) produce_step();
        cp_commit();
    }
    // GM_RSS: the row scalars of row r of the unit in stage `stg` into its bulk row pad
    auto rs_pass = [&](const int stg, const int u, const bool from_global) {
#pragma unroll
        for (int r0 = 0; r0 < BM; r0 += NTHR) {
            const int r = r0 + tid;
            if (BM % NTHR == 0 || r < BM) {
                typename T::U w;
                if (from_global)
                    T::template load_meta<GLd>(w, meta + (size_t)weight_row_of<GLU>(r, ob, N) * mrs + T::moff(u), u);
                else
                    T::template load_meta<SLd>(w, gm_smem + stg * STAGE + OFF_M + r * GT::MWS, u);
                *reinterpret_cast<typename GT::R*>(gm_smem + stg * STAGE + r * GT::WBS + OFF_RS) = GT::rowscal(w);
            }
        }
        ru += 32;   // the producer's walk: the next position
        while (ru >= nu && rj < NLEAF) { ++rj; ru = rj < NLEAF ? slot(0, rj) : 0; }
    };
    if (RSS && nsteps > 0) rs_pass(0, ru, true);

    // consumer: this warp's group, its leaf and unit (leading empty slots merged as zeros)
#if !GM_STATIC_ON
    int cj = 0, cu = wk;
    while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot(wk, cj) : 0; }
#endif
    const int lr = lane & 7, lm = lane >> 3;   // ldmatrix: lanes 8m..8m+7 give matrix m's rows
    // the unit's work; FULL: every n tile of the block has live columns, so no tile is
    // skipped and its (mi, ni) blocks are one straight line the compiler interleaves
    auto consume = [&](const bool FULL, float (&acc)[NO], const int u, const uint32_t st, const uint8_t* stp) {
        // called with constants: inlined twice (four times with GM_STATIC: two accumulators)
        // B fragments and scales of the warp's n tiles
        uint32_t xb[GM_TN][4];
        Q8Scale sv[GM_TN][2][4];
#pragma unroll
        for (int ni = 0; ni < GM_TN; ++ni) {
            const int c0 = (wn * GM_TN + ni) * 8;
            ldsm4(xb[ni], st + OFF_X + (c0 + lr) * XS + 16 * lm);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const uint8_t* sp = stp + OFF_S + (c0 + 2 * tig + cc) * SSB;
                const uint4 e01 = *reinterpret_cast<const uint4*>(sp);
                if (K16) {
                    const uint4 e23 = *reinterpret_cast<const uint4*>(sp + 16);
                    sv[ni][cc][0].d = __uint_as_float(e01.x); sv[ni][cc][0].s = (int)e01.y;
                    sv[ni][cc][1].d = __uint_as_float(e01.z); sv[ni][cc][1].s = (int)e01.w;
                    sv[ni][cc][2].d = __uint_as_float(e23.x); sv[ni][cc][2].s = (int)e23.y;
                    sv[ni][cc][3].d = __uint_as_float(e23.z); sv[ni][cc][3].s = (int)e23.w;
                } else {   // groups 0, 1 in block 0; groups 2, 3 in block 1
                    sv[ni][cc][0].d = sv[ni][cc][1].d = __uint_as_float(e01.x);
                    sv[ni][cc][0].s = sv[ni][cc][1].s = (int)e01.y;
                    sv[ni][cc][2].d = sv[ni][cc][3].d = __uint_as_float(e01.z);
                    sv[ni][cc][2].s = sv[ni][cc][3].s = (int)e01.w;
                }
            }
        }
        // LRS: this lane's rows of the quad (t = tig + 4 k: m tile t / 2, half t % 2)
        typename GT::R rown[QRW];
        if (LRS && !RSS) {
#pragma unroll
            for (int k = 0; k < QRW; ++k) {
                const int t = tig + 4 * k;
                if (t < 2 * GM_TM) {
                    const int r = (wm * GM_TM + (t >> 1)) * 16 + gid + 8 * (t & 1);
                    const uint8_t* mp = stp + OFF_M + r * GT::MWS;
                    if (K16) mp += ((size_t)weight_row_of<GLU>(r, ob, N) * mrs + T::moff(u)) & 3;
                    typename T::U w;
                    T::template load_meta<SLd>(w, mp, u);
                    rown[k] = GT::rowscal(w);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < GM_TM; ++mi) {
            const int r0 = (wm * GM_TM + mi) * 16;
            // raw bulk words: q[c][rh] = word tig of chunk c of row r0 + gid + 8 rh
            uint32_t q[GT::NCH][2];
#pragma unroll
            for (int c = 0; c + 1 < GT::NCH; c += 2) {
                uint32_t r4[4];
                ldsm4(r4, st + (r0 + 8 * (lm & 1) + lr) * GT::WBS + 16 * (c + (lm >> 1)));
                q[c][0] = r4[0]; q[c][1] = r4[1]; q[c + 1][0] = r4[2]; q[c + 1][1] = r4[3];
            }
            if (GT::NCH % 2) {
                uint32_t r2[2];
                ldsm2(r2, st + (r0 + 8 * (lm & 1) + lr) * GT::WBS + 16 * (GT::NCH - 1));
                q[GT::NCH - 1][0] = r2[0]; q[GT::NCH - 1][1] = r2[1];
            }
            typename T::U w[2];
            typename GT::R rq[2];
            if (RSS) {   // staged by rs_pass
                unit_j(w[0], u);
                unit_j(w[1], u);
#pragma unroll
                for (int rh = 0; rh < 2; ++rh)
                    rq[rh] = *reinterpret_cast<const typename GT::R*>(stp + (r0 + gid + 8 * rh) * GT::WBS + OFF_RS);
            } else if (LRS) {
                unit_j(w[0], u);   // all Q5_K's afrag reads of the meta
                unit_j(w[1], u);
#pragma unroll
                for (int rh = 0; rh < 2; ++rh) {
                    const int t = 2 * mi + rh;
                    rq[rh] = shfl_rs(rown[t >> 2], (lane & ~3) | (t & 3));
                }
            } else {
#pragma unroll
                for (int rh = 0; rh < 2; ++rh) {
                    const uint8_t* mp = stp + OFF_M + (r0 + gid + 8 * rh) * GT::MWS;
                    if (K16) {   // Q6_K window: the meta bytes start 0 or 2 bytes in
                        const size_t abs = (size_t)weight_row_of<GLU>(r0 + gid + 8 * rh, ob, N) * mrs + T::moff(u);
                        mp += abs & 3;
                    }
                    T::template load_meta<SLd>(w[rh], mp, u);
                }
                rq[0] = GT::rowscal(w[0]);   // once per row
                rq[1] = GT::rowscal(w[1]);
            }
            uint32_t a[GT::NK][AR];
            GT::afrag(q, w, tig, a);
            if (AOF) {
#pragma unroll
                for (int k = 0; k < GT::NK; ++k)
#pragma unroll
                    for (int i = 0; i < AR; ++i) a[k][i] = aoff(a[k][i]);
            }
#pragma unroll
            for (int ni = 0; ni < GM_TN; ++ni) {
                if (!FULL && cb + (wn * GM_TN + ni) * 8 >= nb) continue;   // warp-uniform: no live column
                int c[GT::NK][4];
#pragma unroll
                for (int k = 0; k < GT::NK; ++k) mma_unit(c[k], a[k], xb[ni], k);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int ints[T::NI];
#pragma unroll
                    for (int k = 0; k < T::NI; ++k) ints[k] = c[k][e];
                    const int o = (mi * GM_TN + ni) * 4 + e;
                    acc[o] = accum_sel<T>(acc[o], rq[e >> 1], ints, sv[ni][e & 1]);
                }
            }
        }
    };
#if GM_STATIC_ON
    // variant 9, the static slot structure: pair i = 0..15 holds leaves 2i, 2i + 1, i.e. slots
    // a = brev4(i) and a + 16 (brev5(2i) = brev4(i), brev5(2i + 1) = brev4(i) + 16). Leaf 2i
    // folds into Lr[0] (the stack's level 0, in registers), leaf 2i + 1 into P, each slot's units
    // in increasing u (a slot with no unit folds nothing: its partial is the +0 it starts with,
    // as mv_q8's lane with no unit); then the pair's merge is the binary counter's, unrolled:
    // P = L0 + P, and for l = 1, 2, ... while bit l - 1 of i is set P = L_l + P; P is parked at
    // the first level l whose bit l - 1 of i is clear, or (i = 15) is the root. The same adds on
    // the same operands as merge(2i) and merge(2i + 1) of the slot walk, with no jump table.
    // Stages, the producer's walk and the barrier per unit are the slot walk's.
    {
        int cst = 0, s = 0;
        const bool full = cb + BN <= nb;   // block-uniform
        auto step = [&](float (&acc)[NO], const int u) {
            cp_wait<GM_STAGES - 2>();
            __syncthreads();
            if (s + GM_STAGES - 1 < nsteps) produce_step();
            cp_commit();
            const uint32_t st = sbase + cst * STAGE;
            const uint8_t* stp = gm_smem + cst * STAGE;
            cst = cst + 1 == GM_STAGES ? 0 : cst + 1;
            ++s;
            if (RSS && s < nsteps) rs_pass(cst, ru, false);
            if (!(MEMRA_CANARY == 1 && u == 1)) {
                if (GM_SASS_FULL || full) consume(true, acc, u, st, stp); else consume(false, acc, u, st, stp);
            }
        };
        float (&A)[NO] = Lr[0];
#pragma unroll 1
        for (int i = 0; i < NLEAF / 2; ++i) {
            const int sa = (int)(__brev((unsigned)i) >> 28);   // brev4(i): leaf 2i's slot
#pragma unroll
            for (int o = 0; o < NO; ++o) { A[o] = 0.f; P[o] = 0.f; }
#pragma unroll 1
            for (int u = sa; u < nu; u += 32) step(A, u);
#pragma unroll 1
            for (int u = sa + 16; u < nu; u += 32) step(P, u);
#pragma unroll
            for (int o = 0; o < NO; ++o) P[o] = __fadd_rn(A[o], P[o]);   // level 0: L0 + v
            // levels 1..4 (warp-uniform branches): add while i's bit l - 1 is set, park at the first clear one
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
    }
#else
    int cst = 0;
    for (int s = 0; s < nsteps; ++s) {
        cp_wait<GM_STAGES - 2>();
        __syncthreads();
        if (s + GM_STAGES - 1 < nsteps) produce_step();
        cp_commit();
        const int stage = cst * GM_WK + wk;
        cst = cst + 1 == GM_STAGES ? 0 : cst + 1;
        if (cj >= NLEAF) continue;   // this group's units are all done (warp-uniform)
        const int u = cu;
        const uint32_t st = sbase + stage * STAGE;
        const uint8_t* stp = gm_smem + stage * STAGE;
        if (!(MEMRA_CANARY == 1 && u == 1)) {
            if (GM_SASS_FULL || cb + BN <= nb) consume(true, P, u, st, stp); else consume(false, P, u, st, stp);
        }
        // next unit of the slot, or the slot is complete: merge it (and any empty ones after)
        cu += 32;
        while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot(wk, cj) : 0; }
    }
#endif
    cp_wait<0>();

    // the groups' subtree roots T(k) meet in the butterfly's last SK levels: for offset
    // o = WK/2 .. 1, T(k) = T(k) + T(k + o) (k < o); group 0 then runs the epilogue
    if (GM_WK > 1) {
        __syncthreads();   // every stage read is done: reuse the buffer
        float* red = reinterpret_cast<float*>(gm_smem);   // [WK][WM * WN][NO][32]
        if (wk > 0) {
#pragma unroll
            for (int o = 0; o < NO; ++o) red[((wk * (GM_WM * GM_WN) + wmn) * NO + o) * 32 + lane] = P[o];
        }
        __syncthreads();
        if (wk > 0) return;
#pragma unroll
        for (int o = 0; o < NO; ++o) {
            float t[GM_WK];
            t[0] = P[o];
#pragma unroll
            for (int k = 1; k < GM_WK; ++k) t[k] = red[((k * (GM_WM * GM_WN) + wmn) * NO + o) * 32 + lane];
#pragma unroll
            for (int off = GM_WK / 2; off > 0; off >>= 1)
#pragma unroll
                for (int k = 0; k < off; ++k) t[k] = __fadd_rn(t[k], t[k + off]);
            P[o] = t[0];
        }
    }

    // epilogue: finish()'s operations
    constexpr int TMO = GLU ? GM_TM / 2 : GM_TM;
#pragma unroll
    for (int mi = 0; mi < TMO; ++mi)
#pragma unroll
        for (int ni = 0; ni < GM_TN; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = ob + (wm * TMO + mi) * 16 + gid + 8 * (e >> 1);
                const int col = cb + (wn * GM_TN + ni) * 8 + 2 * tig + (e & 1);
                if (row >= N || col >= nb) continue;
                const int o = (mi * GM_TN + ni) * 4 + e;
                float v = P[o];
                if (GLU) {
                    const float gte = P[o], up = P[o + TMO * GM_TN * 4];
                    v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
                }
                const size_t yo = (size_t)col * N + row;
                if (res) v = __fadd_rn(v, res[yo]);
                y[yo] = v;
            }
}

extern "C" __global__ void __launch_bounds__(NTHR, GM_MINB)
gemm_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
        const float* res, int N, int K, int nb, int act) {
    gemm_body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(NTHR, GM_MINB)
gemm_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
            const float* res, int N, int K, int nb, int act) {
#if GM_TM % 2 == 0
    gemm_body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
#else
    asm volatile("trap;");   // _glu pairs gate and up m tiles: GM_TM must be even
#endif
}
