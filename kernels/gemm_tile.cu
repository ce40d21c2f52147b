// gemm_tile.cu — pipelined tensor-core GEMM for many rows in the exact "chain" order, one family for
// the weight types Q4_0 (MV_TYPE 2), Q8_0 (8), Q4_K (12) and Q6_K (14). Written for kernels/ (NVRTC,
// -I kernels/); it includes only common.cuh and q8.cuh. Landed from the session-15/16 prototypes
// experiments/gemm_tile2 (Q4_K), gemm_tile2_q40 (Q4_0 / Q8_0) and gemm_tile2_q6k (Q6_K): their
// GT_FORM 1 ("exact chain", split-K 1) paths, one skeleton instead of three (variant history below).
//
// What it computes. W: N rows (gemm_tile) or 2N rows [gate; up] (gemm_tile_glu) of K weights in
// memra's planes layout (bulk, meta: memra.gpu.ops.matvec.pack_planes); x: nb activation rows as q8
// (q8.cuh: int8 xq[b * K + k], one Q8Scale {d, s} per 32, s = sum of the block's 32 xq). For every
// output (n, b) ONE float accumulator acc = +0 runs over the k32 blocks i = 0, 1, .., K/32 - 1 in
// increasing order (the chain; all float operations round to nearest, no contraction differs):
//   dx = xs[b, i].d;  I = sum_{l<32} q(n, 32 i + l) * xq[b, 32 i + l]  (exact int32 from the IMMA)
//   Q4_0: q = nibble - 8, d = f16 block scale:        p = fl(I * d);  acc = fma(p, dx, acc)
//   Q8_0: q = int8 quant, d = f16 block scale:        p = fl(I * d);  acc = fma(p, dx, acc)
//   Q4_K: q = nibble (0..15), sub-block j = i % 8:    dsc = fl(d * sc_j), ndmm = -fl(dmin * m_j)
//         (both exact: <= 17 significant bits), sx = fl(dx * (float)s):
//                                                     p = fl(I * dsc);  acc = fma(p, dx, acc);
//                                                     acc = fma(ndmm, sx, acc)
//   Q6_K: q = 6-bit quant - 32, the two 16-halves a, b of block i with int8 scales sc_2i', sc_2i'+1
//         (i' = i % 8), d = f16 super-block scale:   J = sc_a * Ia + sc_b * Ib  (int32, exact, |J| < 2^24)
//                                                     p = fl((float)J * d);  acc = fma(p, dx, acc)
// fl(I * dsc) is computed as fma(M + I, dsc, -M dsc) with M = 12582912.0f (the IMMA accumulates from
// M's bits; |I| < 2^22 keeps M + I exact; Q4_0's words and Q4_K's high-nibble words carry 16 I,
// compensated by dsc / 16: exact) — the same bits as fl(I * dsc). Then the epilogue (kernels/gemm.cu's finish()):
//   gemm_tile:     v = acc
//   gemm_tile_glu: v = fl(act(gate) * up), act 1 = silu_f32, 2 = gelu_tanh_f32 (common.cuh)
//   res != null:   v = fl(v + res[yo]);   y[yo] = v,   yo = b * N + n   (res may alias y)
// Nothing depends on nb, the tile sizes, the configuration, the grid or the position of a row or a
// column in its tile: an output's bits are the same in every launch (batch- and config-invariant).
// CPU references: experiments/gemm_tile2/model2.py chain_ref (Q4_K; experiments/chain_mv/chain_ref.py
// is the same order), gemm_tile2_q40/model_q40.py chain_ref (Q4_0, Q8_0), gemm_tile2_q6k/model_q6k.py
// chain_ref(form=1) (Q6_K). Not the order of mv_q8 / gemm.cu.
//
// Tile. A block = GT_WM x GT_WN warps, a warp 64 weight rows x 32 activation columns (4 m16 x 4 n8
// tiles, 64 float accumulators a thread): BM = 64 GT_WM weight rows, BN = 32 GT_WN columns. _glu: a
// warp's m tiles 0, 1 are gate rows and 2, 3 the up rows of the same 32 outputs (wrow()). K advances one
// 256-element super-block a stage (8 k32 steps). A ring of GT_STAGES slots filled by cp.async: group t
// = {raw weight bytes + activations of stage t; meta + Q8Scale of t + 1}. A cooperative scalar pass
// (all threads) turns a stage's staged meta / Q8Scale into a double-buffered float area two stages
// ahead (after the step-7 barrier). A fragments are built in registers from the RAW weight bytes
// (ldmatrix on the raw tile; per-type unpack below), B fragments by ldmatrix; each k32 step's IMMA
// operands (GT_PF) are loaded one step ahead.
//
// Tunables (-D): MV_TYPE (required: 2, 8, 12, 14); GT_WM (2), GT_WN (4; >= 2: the scalar pass needs
// a thread per weight row), GT_STAGES (2; >= 2), GT_MINB (1; __launch_bounds__ blocks per SM), GT_PF
// (fragment prefetch; Q4_K / Q4_0 / Q8_0: 2 = the raw A words and B one step ahead, the scalars at the
// start of their own step (default), 1 = the scalars too, 0 = none; Q6_K: 1 = B and the next half's raw
// words ahead (default), 0 = none), GT_PU (Q4_K: unroll of the 4-pair loop, 1; Q6_K: unroll of the
// 2-half loop, 1), GT_SU (Q4_0 / Q8_0: unroll of the 8-step loop, 2), GT_LD (the loader: 1 = lane pairs on
// 32-byte sectors where a row / column splits over two threads (default), 0 = v5's), GT_RPAD (1 = the row
// records' groups padded where they fit (default), 0 = v6's layout). MEMRA_CANARY=1: a deliberately
// wrong variant (block 1 of every row dropped: its dx, sx staged as 0, so acc = fma(p, 0, acc) = acc)
// that a check must catch.
//
// Launch contract (experiments/tile_land/launch.py computes it):
//   grid  = (N / OBM, ceil(nb / BN), 1),  OBM = BM (gemm_tile) or BM / 2 (gemm_tile_glu)
//   block = (NT, 1, 1), NT = 32 GT_WM GT_WN
//   dynamic shared memory = GT_STAGES (BM WS + BN 272 + BM MS + BN 64) + 2 (RS + CS) bytes with
//     Q4_0: WS 144, MS 16, RS 64 BM, CS 32 BN       Q8_0: WS 272, MS 16, RS 64 BM, CS 32 BN
//     Q4_K: WS 144, MS 16, RS 96 BM, CS 64 BN       Q6_K: WS 208, MS 20, RS 68 BM, CS 32 BN
//   (above 48 KiB the launcher raises the kernel's max dynamic shared memory attribute).
// Host contract: N % OBM == 0 (plain: N % BM, glu: N % (BM / 2), N = the output rows); K % 256 == 0
// (Q4_0, Q8_0, Q4_K), K % 512 == 0 (Q6_K: its 2-byte-aligned meta is staged by 4-byte cp.async windows);
// nb >= 1, any (partial column tiles: a dead column loads column nb - 1 and is not stored); bulk, meta,
// xq, xs 16-byte aligned (Q6_K's meta 4-byte), as memra's upload_weight / quantize_q8 give; 32-bit
// element offsets: nb K < 2^32, weight rows x bulk bytes a row < 2^32.
// PDL: MEMRA_PDL_WAIT() then MEMRA_PDL_LAUNCH() at the start, before any load (as gemm.cu).
//
// Variant history (H200 numbers from research/2026-12-02-session16/, µs at 512 rows unless noted;
// every configuration bit-identical to its CPU chain reference there):
//  1. experiments/gemm_tile (session 15): Q4_K, unpacked tile, free order ("tcm"), split-K.
//     Q4_K gate + up 2 x 14336 x 4096: 715.1 (gemm.cu v10: 1,075.7).
//  2. experiments/gemm_tile2: fragment prefetch (GT_PF), raw Q4_K bytes by cp.async (no unpack pass),
//     A = raw & 0x0F0F0F0F / & 0xF0F0F0F0 (16 I, dsc / 16), cooperative scalar pass one stage ahead.
//     GT_FORM 0 (free: the min term as a 3xTF32 m16n8k8 product per stage, split-K `ks` with a reduce
//     kernel) and GT_FORM 1 (the exact chain above, no split-K). gate + up, 2,4,2 (WM, WN, STAGES):
//     F0 pf2 772.0, F1 pf2 740.7 (1.45x gemm.cu), F1 pf1 spilled (4 B, glu); 128 rows F1 216.7 vs
//     284.4; 4096 x 14336: F1 pf2 350.8 vs 472.0. 2,2,3: F1 1,049.8 (64 rows: 156.0 vs gemm.cu 162.4).
//  3. experiments/gemm_tile2_q40: the same skeleton for Q4_0 / Q8_0 (GT_QT); A words Q4_0
//     (16 q) ^ 0x80 = 16 (q - 8) from one ldmatrix.x2 per m tile and block, Q8_0 the raw bytes (x4);
//     the prefetch branch-free (GT_PFB). Both forms had identical device code (only split-K differed).
//     8B Q4_0: gate + up 626.1 (2,4,2 pf2) vs 859.9, 4096 x 14336 312.3 vs 380.5, 4096 x 4096 94.9 vs
//     127.6; Q8_0: gate + up 697.0 (pf2) vs 870.8, 4096 x 14336 330.9 (pf1; pf2 333.4) vs 396.6,
//     4096 x 4096 99.9 vs 129.7. At 64-128 rows the 128 x 128 tiles lose to gemm.cu without split-K.
//  4. experiments/gemm_tile2_q6k: Q6_K (no glu there); A words q - 32 built from 3 ldmatrix.x4 a m
//     tile and half (GT_SIGNED 1: the -32 in the bytes; 0: an offset IMMA, ablation), GT_FORM 1 = the
//     J chain (int32 J, one FMUL + FFMA a block), GT_COOP (cooperative unpack into an int8 tile,
//     comparison). 4096 x 14336: F1 2,4,2 465.7 (1.60x gemm.cu's 745.6), F0 483.1, F0 PU2 481.9, F1
//     coop 477.2, 2,2,3 587.2; 4096 x 4096: F1 136.4 vs 234.4; 1024 x 4096: F1 136.4 vs 77.3 (32
//     blocks: the tile is too big there; F0 ks 4 41.4 — split-K is not exact, not landed).
//  5. (this file) one family: the exact chain only. Removed: GT_FORM 0 code (tcm formula, 3xTF32 min
//     term and GT_MINS, Q6_K's per-16 formula), split-K (`ks`, grid.z, the workspace partials, the
//     gemm_tile_reduce / gemm_tile_q6k_reduce kernels), ablation / comparison switches fixed at their
//     measured defaults: GT_XROT 1, GT_SRCV 1, GT_PASS 7, GT_PFB 1 (Q4_0 / Q8_0), GT_SIGNED 1 and
//     GT_COOP 0 (Q6_K). Added: gemm.cu's arguments and epilogue (res, act: silu / gelu-tanh, PDL,
//     MEMRA_CANARY), a Q6_K glu entry (rows through wrow() as the other types), one loader (raw weights,
//     activations, Q8Scale; per-type meta), one scalar-pass column part, one epilogue. The per-type K
//     loops are the prototypes' GT_FORM 1 loops unchanged (their prefetch schedules differ: Q4_K loads
//     raw words every 2 steps, Q4_0 / Q8_0 every step, Q6_K 3 ldmatrix a m tile per half). Static SASS
//     of the stage loop against each prototype's GT_FORM 1 ks 1 build (experiments/tile_land/
//     sass_compare.txt, 4 types x 12 timed configs x {plain, glu}): IMMA, LDSM, LDS, LDGSTS, STS, I2F,
//     FFMA, FMUL, FADD, BAR identical everywhere; integer address / branch instructions -2.1 .. +1.2 %
//     of the loop. Registers (plain / glu, default configs): Q4_K 254 / 254 (proto 254 / 254), Q4_0
//     194 / 192 (196 / 195), Q8_0 195 / 194 (197 / 197), Q6_K 221 / 213 (213); 0 spills except Q4_K
//     2,2,3 pf1 glu (4 B at 255 registers; pf2: 0). Default configuration per type (launch.py
//     default_config; GT_PF defaults to the timed best, the prototypes' default was 1): Q4_K 2,4,2 pf2,
//     Q4_0 2,4,2 pf2, Q8_0 2,4,2 pf2, Q6_K 2,4,2 pf1 (GT_MINB 1). Not yet run on a device.
//  6. GT_LD 1 (session 21): the loader's lane pairs (pair_row below). ncu of the 8B's Q4_K gate + up at
//     512 rows (v5, research/2026-12-03-session21): 721.8 µs, 254 registers (one block of 8 warps an
//     SM), issue slots 39.6 % busy, 49 % of the L2 sectors and 55 % of the shared wavefronts
//     excessive, all on the loader's LDGSTS (a lane's 16-byte chunks 64 B apart in an instruction),
//     23 % of the stall samples around them (long scoreboard on the LDGSTS address registers).
//     Static loop: Q4_K glu 851 -> 839 instructions, Q4_0 605 -> 593, Q8_0 560 -> 542, Q6_K 2017 -> 2005.
//     GT_LD 0 keeps v5's mapping (the A/B of tune/campaigns/h200-gemm-tile-ld.toml); a row a thread
//     (GT_WN 2: the weights) always takes it.
//  7. GT_RPAD 1 (session 22; A/B tune/campaigns/h200-gemm-tile-rpad.toml, research/2026-12-03-session22/r/):
//     a lane's group of 8 row records padded by 16 bytes where it fits (rrec). ncu of v6's Q4_K gate + up:
//     the K loop's 6 LDS.128 of row records a step ran 2-way bank conflicts (3.67 M wavefronts for 1.84 M
//     ideal; Q4_0 / Q8_0 / Q6_K's 64-byte groups: 4-way by the same arithmetic). Loop instructions
//     unchanged (Q4_K 839 -> 840), registers unchanged; the padded buffers do not fit Q4_K / Q8_0 /
//     Q6_K at 2 x 4 warps with 3 stages or Q8_0 at 4 x 2 (those stay unpadded). Measured at 512 rows on
//     the 14 8B tile shapes: -0.1 % (Q6_K) to -2.5 % (Q8_0 6144 x 4096), Q4_K gate + up 715.7 -> 711.1 µs,
//     Q4_0 598.6 -> 587.9, Q8_0 626.1 -> 615.5. The losing arm, GT_LDA 1 (the lane pairs' copies from one
//     64-bit base at immediate offsets: static loop Q4_K 839 -> 810 instructions, Q8_0 542 -> 503):
//     +0.3 to +1.5 % alone on 11 of the 14 shapes, with RPAD slower than RPAD alone on 12; removed.
#include "common.cuh"
#include "q8.cuh"

#ifndef MV_TYPE
#error "MV_TYPE (ggml type id: 2 Q4_0, 8 Q8_0, 12 Q4_K, 14 Q6_K) must be defined"
#endif
#if MV_TYPE != 2 && MV_TYPE != 8 && MV_TYPE != 12 && MV_TYPE != 14
#error "gemm_tile.cu: MV_TYPE must be 2 (Q4_0), 8 (Q8_0), 12 (Q4_K) or 14 (Q6_K)"
#endif
#ifndef GT_WM
#define GT_WM 2
#endif
#ifndef GT_WN
#define GT_WN 4
#endif
#ifndef GT_STAGES
#define GT_STAGES 2
#endif
#ifndef GT_PF
#if MV_TYPE == 14
#define GT_PF 1
#else
#define GT_PF 2
#endif
#endif
#ifndef GT_PU
#define GT_PU 1
#endif
#ifndef GT_SU
#define GT_SU 2
#endif
#ifndef GT_MINB
#define GT_MINB 1
#endif
#ifndef GT_LD
#define GT_LD 1
#endif
#ifndef GT_RPAD
#define GT_RPAD 1
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif

// =====================================================================================================
// per-type geometry: raw weight bytes a row and stage (RB), staged meta bytes a row and stage (MS),
// float area of one buffer (rows RS_BYTES, columns CS_BYTES), the row-scalar record (RSTR bytes a row
// and k32 step), the column record (CSTR: 8 = float2 (dx, sx), 4 = float dx)
// =====================================================================================================
constexpr int WM = GT_WM, WN = GT_WN, NS = GT_STAGES;
constexpr int NT = 32 * WM * WN;          // threads
constexpr int BM = 64 * WM, BN = 32 * WN; // weight rows, activation columns of a block
#if MV_TYPE == 12        // Q4_K: bulk = qs (128 B a super-block), meta = d | dmin | scales[12] (16 B)
constexpr int RB = 128, MS = 16, RSTR = 12, CSTR = 8;   // rows (dsc', -M dsc', ndmm); columns (dx, sx)
constexpr int RD_BYTES = 0;
static_assert(GT_PF >= 0 && GT_PF <= 2, "GT_PF 0, 1, 2");
#elif MV_TYPE == 2 || MV_TYPE == 8   // Q4_0: 16 B a block of 32 / Q8_0: 32 B; meta = f16 d a block (16 B a stage)
constexpr bool Q4 = MV_TYPE == 2;
constexpr int RB = Q4 ? 128 : 256, MS = 16, RSTR = 8, CSTR = 4;   // rows (d', -M d'); columns dx
constexpr int RD_BYTES = 0;
constexpr int RAWN = Q4 ? 2 : 4;          // raw A words a lane holds per m tile and step
constexpr float DSCALE = Q4 ? 0.0625f : 1.0f;
static_assert(GT_PF >= 0 && GT_PF <= 2, "GT_PF 0, 1, 2");
#else                    // Q6_K: bulk = ql[128] | qh[64] (192 B), meta = scales[16] | d (18 B, 2-aligned)
constexpr int RB = 192, MS = 20, RSTR = 8, CSTR = 4;      // rows int2 (sc_a, sc_b), then [BM] float d
constexpr int RD_BYTES = BM * 4;
static_assert(GT_PF == 0 || GT_PF == 1, "GT_PF 0, 1 (Q6_K)");
#endif
constexpr int WS = RB + 16;               // raw tile row stride (+16: conflict-free ldmatrix)
constexpr int TS = 272;                   // activation tile column stride (256 B + 16)
constexpr int CPR = RB / 16;              // raw cp.async chunks (16 B) a row
constexpr int CS_BYTES = 8 * BN * CSTR;
constexpr int WT_BYTES = BM * WS, XT_BYTES = BN * TS, MT_BYTES = BM * MS, ST_BYTES = BN * 64;
constexpr int OFF_W = 0;
constexpr int OFF_X = OFF_W + NS * WT_BYTES;
constexpr int OFF_M = OFF_X + NS * XT_BYTES;
constexpr int OFF_S = OFF_M + NS * MT_BYTES;
constexpr int OFF_F = OFF_S + NS * ST_BYTES;
// the row records of a k32 step: a lane's 8 row positions (rperm) contiguous, groups of 8 GSTR bytes
// apart. GT_RPAD 1 pads a group by 16 bytes where the padded buffers fit (112 / 80 B: 28 / 20 words,
// so the 8 groups one load instruction reads start on distinct 4-bank sets; unpadded, 96 / 64 B put
// 2 / 4 of them on one set); memra.gpu.ops.gemm_tile.smem_bytes makes the same choice
constexpr int RS_UNPAD = 8 * BM * RSTR + RD_BYTES, RS_PAD = RS_UNPAD + 8 * (BM / 8) * 16;   // 8 k32 steps, then (Q6_K) d
constexpr bool RPAD = GT_RPAD && OFF_F + 2 * (RS_PAD + CS_BYTES) <= 232448;
constexpr int GSTR = 8 * RSTR + (RPAD ? 16 : 0);
constexpr int JSTR = (BM / 8) * GSTR;
constexpr int RS_BYTES = RPAD ? RS_PAD : RS_UNPAD;
MEMRA_DEVICE constexpr int rrec(int j, int p) { return j * JSTR + (p >> 3) * GSTR + (p & 7) * RSTR; }
constexpr int F_BYTES = RS_BYTES + CS_BYTES;
constexpr int SMEM_TOTAL = OFF_F + 2 * F_BYTES;   // = launch.py smem_bytes()
static_assert(SMEM_TOTAL <= 232448, "shared memory (227 KiB)");
static_assert(WN >= 2 && NS >= 2 && NT >= BM && NT >= BN, "GT_WN >= 2 (a thread per row), GT_STAGES >= 2");
static_assert(OFF_M % 16 == 0 && OFF_S % 16 == 0 && OFF_F % 16 == 0 && F_BYTES % 16 == 0, "alignment");

// per-thread shares of a stage's cp.async chunks
constexpr int WCH = BM * CPR / NT;        // raw weights
constexpr int XCH = BN * 16 / NT;         // activations: 16 chunks a column
constexpr int SCH = BN * 4 / NT;          // Q8Scale: 4 chunks a column (64 B)
static_assert(BM * CPR % NT == 0 && CPR % WCH == 0 && BN * 16 % NT == 0 && 16 % XCH == 0 && BN * 4 % NT == 0 &&
              4 % SCH == 0 && SCH >= 1 && WCH >= 1, "loader shares");
constexpr int RPT = NT / BM, CPT = NT / BN;   // threads a row / a column in the scalar pass
static_assert(8 % RPT == 0 && 8 % CPT == 0, "scalar pass shares");
constexpr float MAGF = 12582912.0f;
constexpr int MAGIC = 0x4B400000;

// =====================================================================================================
// shared helpers
// =====================================================================================================
MEMRA_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
MEMRA_DEVICE void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
MEMRA_DEVICE void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}
MEMRA_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
MEMRA_DEVICE void ldsm4(uint32_t a, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
MEMRA_DEVICE void ldsm2(uint32_t a, uint32_t& r0, uint32_t& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a));
}
MEMRA_DEVICE float4 lds128(uint32_t a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
MEMRA_DEVICE uint4 lds128u(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
// GT_LD 1 (the loader's lane pairs): where a stage's raw weight row / activation column splits over two
// threads, lanes 2p and 2p + 1 copy the two 16-byte halves of one 32-byte sector an instruction (the
// other mapping, GT_LD 0, gives a lane 64-128 contiguous bytes: each instruction touched twice the L2
// sectors it used, ncu: 49 % excessive sectors on the 8B's gate + up). The pair's row is
// pair_row(p): a warp's 16 pairs take rows 0, 2, 4, 6 | 1, 3, 5, 7 | 8, 10, .. (one parity in each
// 8-lane phase), so the four 32-byte stores of a phase land on distinct banks (the row strides 144,
// 208, 272 B are 4 or 20 words mod 32: rows of one parity start 8 banks apart). The bytes land where
// GT_LD 0 puts them: the outputs' bits do not depend on it.
constexpr bool LD_PAIR = GT_LD != 0;
MEMRA_DEVICE int pair_row(int p) {
    return (p & ~15) | (p & 8) | ((p & 3) << 1) | ((p >> 2) & 1);
}
// %tid.x through a volatile asm: not hoisted out of the K loop, so the cp.async sources are recomputed
// (~15 integer ops a stage) where they are used instead of holding ~8 registers across the loop
MEMRA_DEVICE int tid_v() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
// scalar positions in the float area: a warp's row r = 16 mi + 8 h + g -> 8 g + 2 mi + h; column
// c = 8 ni + 2 tig + e -> 8 tig + 2 ni + e (a lane's 8 rows / 8 columns are contiguous)
MEMRA_DEVICE int rperm(int r) {
    const int w = r >> 6, l = r & 63;
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1);
}
MEMRA_DEVICE int cperm(int c) {
    const int w = c >> 5, l = c & 31;
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1);
}
// the weight row of tile row r: _glu: a warp's rows 0-31 gate rows ob + 32 w .., rows 32-63 the up rows N + ..
template <bool GLU>
MEMRA_DEVICE int wrow(int r, int ob, int N) {
    if (!GLU) return ob + r;
    const int w = r >> 6, l = r & 63;
    return (l < 32 ? 0 : N) + ob + 32 * w + (l & 31);
}
struct Ptr { const uint8_t* bulk; const uint8_t* meta; const int8_t* xq; const uint8_t* xs; };
// lane-relative smem addresses (u32) of a stage: raw weights, activations, float rows / columns
struct Addr { uint32_t w, x, r, c; };
struct Ring {   // a lane's addresses in stage 0's slot / float buffer (d0: Q6_K's row d's)
    uint32_t w0, x0, r0, c0, d0;
    MEMRA_DEVICE Addr at(int s) const {
        Addr a;
        a.w = w0 + (s % NS) * WT_BYTES;
        a.x = x0 + (s % NS) * XT_BYTES;
        a.r = r0 + (s & 1) * F_BYTES;
        a.c = c0 + (s & 1) * F_BYTES;
        return a;
    }
};
MEMRA_DEVICE void load_bfrag(uint32_t (&B)[4][2], uint32_t x, int j) {   // B of the warp's 4 n8 tiles, k32 block j
#pragma unroll
    for (int np = 0; np < 2; ++np) ldsm4(x + np * 16 * TS + 32 * j, B[2 * np][0], B[2 * np][1], B[2 * np + 1][0], B[2 * np + 1][1]);
}

extern __shared__ __align__(16) uint8_t smem[];

// =====================================================================================================
// per-type: meta staging (load_meta) and the row part of the scalar pass (row_pass)
// =====================================================================================================
#if MV_TYPE == 14
constexpr int MCH = (BM * 5 + NT - 1) / NT;   // meta chunks (4 B) a thread (the last trip predicated)
// five 4-byte cp.async a row: the 4-aligned window [18 sb - 2 (sb & 1), + 20) of the row's meta plane
template <bool GLU>
MEMRA_DEVICE void load_meta(uint32_t s_base, const Ptr& P, int t, int slot, int sb, int ob, int N, int K) {
    const uint32_t nblk = K / 256;
#pragma unroll
    for (int i = 0; i < MCH; ++i) {
        const int c = t + NT * i;
        if (c < BM * 5) {
            const int r = c / 5, part = c - 5 * r;
            const uint32_t src = (uint32_t)wrow<GLU>(r, ob, N) * nblk * 18 + 18 * sb - 2 * (sb & 1) + 4 * part;
            cp_async4(s_base + OFF_M + slot * MT_BYTES + MS * r + 4 * part, P.meta + src);
        }
    }
}
// rows: thread t -> row t % BM, k32 blocks (t / BM) 8 / RPT ..: (sc_a, sc_b) int2, and d
MEMRA_DEVICE void row_pass(int slot, int sb, uint8_t* f, int t) {
    constexpr int JR = 8 / RPT;
    const int r = t % BM, j0 = (t / BM) * JR;
    const uint8_t* m = smem + OFF_M + slot * MT_BYTES + MS * r + 2 * (sb & 1);
    const float d = f16_to_f32(*reinterpret_cast<const uint16_t*>(m + 16));
    const int p = rperm(r);
#pragma unroll
    for (int jj = 0; jj < JR; ++jj) {
        const int j = j0 + jj;
        const uint16_t sc2 = *reinterpret_cast<const uint16_t*>(m + 2 * j);
        *reinterpret_cast<int2*>(f + rrec(j, p)) = make_int2((int)(int8_t)(sc2 & 0xFF), (int)(int8_t)(sc2 >> 8));
    }
    if (j0 == 0) reinterpret_cast<float*>(f + 8 * JSTR)[p] = d;
}
#else
// one 16-byte cp.async a row (threads < BM): Q4_K's d | dmin | scales[12], or Q4_0 / Q8_0's 8 f16 d
template <bool GLU>
MEMRA_DEVICE void load_meta(uint32_t s_base, const Ptr& P, int t, int slot, int sb, int ob, int N, int K) {
    const uint32_t mt = (uint32_t)wrow<GLU>(t < BM ? t : 0, ob, N) * (K / 16);
    if (t < BM) cp_async16(s_base + OFF_M + slot * MT_BYTES + 16 * t, P.meta + (mt + 16 * sb));
}
#if MV_TYPE == 12
MEMRA_DEVICE uint32_t bsel(const uint4& v, int i) {   // byte i (constant after unrolling)
    const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (w >> (8 * (i & 3))) & 0xFFu;
}
// Q4_K sub-blocks J0 .. J0 + JN - 1 of row r: (dsc', -M dsc', ndmm), dsc' = d sc_j (j even), d sc_j / 16 (odd)
template <int JN, int J0>
MEMRA_DEVICE void row_pass_k4(const uint4 m, uint8_t* f, int r) {
    const float d = f16_to_f32((uint16_t)m.x), dmin = f16_to_f32((uint16_t)(m.x >> 16));
    const int p = rperm(r);
#pragma unroll
    for (int jj = 0; jj < JN; ++jj) {
        const int j = J0 + jj;
        int sc, mn;
        if (j < 4) {
            sc = bsel(m, 4 + j) & 63;
            mn = bsel(m, 8 + j) & 63;
        } else {
            const uint32_t a = bsel(m, 8 + j), lo = bsel(m, j), hi = bsel(m, 4 + j);
            sc = (a & 0xF) | ((lo >> 6) << 4);
            mn = (a >> 4) | ((hi >> 6) << 4);
        }
        const float dsc = (j & 1) ? d * (float)sc * 0.0625f : d * (float)sc;   // exact (<= 17 bits, 2^-4)
        const float ndmm = -(dmin * (float)mn);
        float* q = reinterpret_cast<float*>(f + rrec(j, p));
        q[0] = dsc; q[1] = -MAGF * dsc; q[2] = ndmm;
    }
}
MEMRA_DEVICE void row_pass(int slot, int sb, uint8_t* f, int t) {
    (void)sb;
    const int r = t % BM, part = t / BM;
    const uint4 m = *reinterpret_cast<const uint4*>(smem + OFF_M + slot * MT_BYTES + 16 * r);
    if (RPT == 1) row_pass_k4<8, 0>(m, f, r);
    else if (RPT == 2) { if (part == 0) row_pass_k4<4, 0>(m, f, r); else row_pass_k4<4, 4>(m, f, r); }
    else { if (part == 0) row_pass_k4<2, 0>(m, f, r); else if (part == 1) row_pass_k4<2, 2>(m, f, r);
           else if (part == 2) row_pass_k4<2, 4>(m, f, r); else row_pass_k4<2, 6>(m, f, r); }
}
#else
// Q4_0 / Q8_0: (d', -M d') per row and block, d' = d / 16 (Q4_0: the A words carry 16 (q - 8); exact)
MEMRA_DEVICE void row_pass(int slot, int sb, uint8_t* f, int t) {
    (void)sb;
    constexpr int JR = 8 / RPT;
    const int r = t % BM, j0 = (t / BM) * JR, p = rperm(r);
    const uint16_t* m = reinterpret_cast<const uint16_t*>(smem + OFF_M + slot * MT_BYTES + 16 * r) + j0;
#pragma unroll
    for (int jj = 0; jj < JR; ++jj) {
        const float d = f16_to_f32(m[jj]) * DSCALE;   // exact
        *reinterpret_cast<float2*>(f + rrec(j0 + jj, p)) = make_float2(d, -MAGF * d);
    }
}
#endif
#endif

// =====================================================================================================
// shared: the ring loader, the scalar pass, the refill
// =====================================================================================================
// ring group of stage t_: raw weights + activations of t_ (slot t_ % NS), meta + Q8Scale of t_ + 1
// (slot (t_ + 1) % NS); either part skipped past the nsb stages. Always one commit. The sources are
// recomputed from a volatile %tid.x at each call (32-bit element offsets from the pointer parameters).
template <bool GLU>
MEMRA_DEVICE void load_group(uint32_t s_base, const Ptr& P, int t_, int nsb, int ob, int cb, int N, int K, int nb) {
    const int t = tid_v();
    if (t_ < nsb) {
        const int sb = t_, slot = t_ % NS;
        if (LD_PAIR && 2 * WCH == CPR) {   // GT_LD 1: lanes 2p, 2p + 1 on row pair_row(p), chunks 2 i, 2 i + 1
            const int r = pair_row(t >> 1), h = t & 1;
            const uint32_t wq = (uint32_t)wrow<GLU>(r, ob, N) * (uint32_t)(K / 256 * RB) + RB * sb + 16 * h;
#pragma unroll
            for (int i = 0; i < WCH; ++i)
                cp_async16(s_base + OFF_W + slot * WT_BYTES + r * WS + 16 * h + 32 * i, P.bulk + (wq + 32 * i));
        } else {   // raw weights: row (WCH t) / CPR, chunks (WCH t) % CPR ..; a 16-chunk row split over two threads
            // (Q8_0, WCH 8) has the second thread's chunks rotated by 4 (conflict-free LDGSTS phases)
            const int r = (WCH * t) / CPR, part = (WCH * t) % CPR;
            const uint32_t wq = (uint32_t)wrow<GLU>(r, ob, N) * (uint32_t)(K / 256 * RB) + RB * sb + 16 * part;
            const int wrot = (CPR == 16 && WCH == 8) ? 64 * (t & 1) : 0;
#pragma unroll
            for (int i = 0; i < WCH; ++i) {
                const int wr = (CPR == 16 && WCH == 8 && i >= 4) ? -wrot : wrot;
                cp_async16(s_base + OFF_W + slot * WT_BYTES + r * WS + 16 * part + wr + 16 * i, P.bulk + (wq + wr + 16 * i));
            }
        }
        if (LD_PAIR && XCH == 8) {   // GT_LD 1: lanes 2p, 2p + 1 on column pair_row(p), chunks 2 i, 2 i + 1
            const int xcol = pair_row(t >> 1), h = t & 1;
            const uint32_t xq = (uint32_t)min(cb + xcol, nb - 1) * K + 256 * sb + 16 * h;
#pragma unroll
            for (int i = 0; i < XCH; ++i)
                cp_async16(s_base + OFF_X + slot * XT_BYTES + xcol * TS + 16 * h + 32 * i, P.xq + (xq + 32 * i));
        } else {   // activations: column (XCH t) / 16 (clamped to nb - 1), chunks (XCH t) % 16 ..; XCH 8: the
            // second thread of a column starts at its 5th chunk (lanes 2c, 2c + 1 on distinct bank slots)
            const int xcol = (XCH * t) >> 4, xpart = (XCH * t) & 15;
            const uint32_t xq = (uint32_t)min(cb + xcol, nb - 1) * K + 256 * sb + 16 * xpart;
            const int rot = (XCH == 8) ? 64 * (t & 1) : 0;
#pragma unroll
            for (int i = 0; i < XCH; ++i) {
                const int xr = (XCH == 8 && i >= 4) ? -rot : rot;
                cp_async16(s_base + OFF_X + slot * XT_BYTES + xcol * TS + 16 * xpart + xr + 16 * i, P.xq + (xq + xr + 16 * i));
            }
        }
    }
    if (t_ + 1 < nsb) {
        const int sb = t_ + 1, slot = (t_ + 1) % NS;
        load_meta<GLU>(s_base, P, t, slot, sb, ob, N, K);
        const int scol = (SCH * t) >> 2, spart = (SCH * t) & 3;
        const uint32_t xs = (uint32_t)min(cb + scol, nb - 1) * (K / 32) * 8 + 16 * spart;
#pragma unroll
        for (int i = 0; i < SCH; ++i)
            cp_async16(s_base + OFF_S + slot * ST_BYTES + scol * 64 + 16 * spart + 16 * i, P.xs + (xs + 64 * sb + 16 * i));
    }
    cp_commit();
}
// prologue group: meta + Q8Scale of stage 0 (slot 0)
template <bool GLU>
MEMRA_DEVICE void load_meta0(uint32_t s_base, const Ptr& P, int ob, int cb, int N, int K, int nb) {
    const int t = tid_v();
    load_meta<GLU>(s_base, P, t, 0, 0, ob, N, K);
    const int scol = (SCH * t) >> 2, spart = (SCH * t) & 3;
    const uint32_t xs = (uint32_t)min(cb + scol, nb - 1) * (K / 32) * 8 + 16 * spart;
#pragma unroll
    for (int i = 0; i < SCH; ++i) cp_async16(s_base + OFF_S + scol * 64 + 16 * spart + 16 * i, P.xs + (xs + 16 * i));
    cp_commit();
}
// the cooperative scalar pass of stage t_stage: staged meta / Q8Scale (slot t_stage % NS) -> float
// buffer t_stage & 1. Columns: thread t -> column t % BN, k32 blocks (t / BN) 8 / CPT ..: dx (and for
// Q4_K sx = fl(dx s)). MEMRA_CANARY 1: block 1 (stage 0, j 1) staged as dx = sx = 0 (dropped).
MEMRA_DEVICE void scalar_pass(int t_stage) {
    const int t = threadIdx.x, slot = t_stage % NS;
    uint8_t* f = smem + OFF_F + (t_stage & 1) * F_BYTES;
    row_pass(slot, t_stage, f, t);
    constexpr int JC = 8 / CPT;
    const int c = t % BN, j0 = (t / BN) * JC;
    const Q8Scale* s = reinterpret_cast<const Q8Scale*>(smem + OFF_S + slot * ST_BYTES + 64 * c) + j0;
#pragma unroll
    for (int jj = 0; jj < JC; ++jj) {
        const int j = j0 + jj;
        const Q8Scale v = s[jj];
        float dx = v.d;
        if (MEMRA_CANARY == 1 && t_stage == 0 && j == 1) dx = 0.f;
#if MV_TYPE == 12
        const float sx = dx * (float)v.s;
        reinterpret_cast<float2*>(f + RS_BYTES)[j * BN + cperm(c)] = make_float2(dx, sx);
#else
        reinterpret_cast<float*>(f + RS_BYTES)[j * BN + cperm(c)] = dx;
#endif
    }
}
// the end of stage s (every read of its slot and of its float buffer issued): wait for group s + 1,
// refill s's slot with group s + NS, and write the scalars of s + 2 into s's float buffer
template <bool GLU>
MEMRA_DEVICE void next_stage(uint32_t s_base, const Ptr& P, int s, int nsb, int ob, int cb, int N, int K, int nb) {
    cp_wait<NS - 2>();
    __syncthreads();
    load_group<GLU>(s_base, P, s + NS, nsb, ob, cb, N, K, nb);
    if (s + 2 < nsb) scalar_pass(s + 2);
}

// =====================================================================================================
// per-type K loop: fragments, A build, the chain's float operations (the prototypes' GT_FORM 1 loops)
// =====================================================================================================
// ldmatrix.x4 lanes: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31); A at row (lane & 7) + 8 ((lane
// >> 3) & 1), byte 16 (lane >> 4) (.x2: lanes 0-15, bytes 0-15); B at column (lane & 7) + 8 (lane >> 4),
// byte 16 ((lane >> 3) & 1). Row scalars of a lane at rows 8 g.. (rperm), columns at 8 tig.. (cperm).
#if MV_TYPE == 12
// ---- Q4_K. Byte l of the 32-byte group j' of qs holds element l of sub-block 2 j' (low nibble) and of
// 2 j' + 1 (high nibble): one ldmatrix.x4 at byte 32 j' gives the words of blocks 2 j' and 2 j' + 1;
// A = w & 0x0F0F0F0F (I) or w & 0xF0F0F0F0 (16 I, dsc' = dsc / 16), u8 x s8 IMMA from M's bits.
constexpr uint32_t A_HI = 1;   // the A lane map uses byte 16 (lane >> 4)
MEMRA_DEVICE void mma_u8s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC));
}
struct Frag {
    uint32_t B[4][2];
    float rs[24];   // rows 2 mi + h: (dsc', -M dsc', ndmm)
    float cs[16];   // columns 2 ni + e: (dx, sx)
};
MEMRA_DEVICE void load_raw(uint32_t (&raw)[4][4], uint32_t w, int jp) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(w + mi * 16 * WS + 32 * jp, raw[mi][0], raw[mi][1], raw[mi][2], raw[mi][3]);
}
MEMRA_DEVICE void load_b(Frag& F, const Addr& a, int j) { load_bfrag(F.B, a.x, j); }
MEMRA_DEVICE void load_s(Frag& F, const Addr& a, int j) {
#pragma unroll
    for (int q = 0; q < 6; ++q) {
        const float4 v = lds128(a.r + j * JSTR + 16 * q);
        F.rs[4 * q] = v.x; F.rs[4 * q + 1] = v.y; F.rs[4 * q + 2] = v.z; F.rs[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float4 v = lds128(a.c + j * BN * 8 + 16 * q);
        F.cs[4 * q] = v.x; F.cs[4 * q + 1] = v.y; F.cs[4 * q + 2] = v.z; F.cs[4 * q + 3] = v.w;
    }
}
MEMRA_DEVICE void load_frag(Frag& F, const Addr& a, int j) { load_b(F, a, j); load_s(F, a, j); }
// one k32 step: p = fma(M + I, dsc', -M dsc') = fl(I dsc); acc = fma(p, dx, acc); acc = fma(ndmm, sx, acc)
MEMRA_DEVICE void compute(float (&acc)[4][4][4], const uint32_t (&raw)[4][4], const Frag& F, bool hi) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        uint32_t A[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) A[r] = raw[mi][r] & (hi ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            int c[4];
            mma_u8s8(c, A, F.B[ni][0], F.B[ni][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e >> 1, ce = e & 1, rr = 2 * mi + h, cc = 2 * ni + ce;
                const float p = __fmaf_rn(__int_as_float(c[e]), F.rs[3 * rr], F.rs[3 * rr + 1]);
                float a = __fmaf_rn(p, F.cs[2 * cc], acc[mi][ni][e]);
                acc[mi][ni][e] = __fmaf_rn(F.rs[3 * rr + 2], F.cs[2 * cc + 1], a);
            }
        }
    }
}
// the K loop: 4 nibble pairs (2 k32 steps each) a stage; GT_PF: the next step's operands before the
// current step's IMMAs; the refill barrier inside step 7 (before step 0 of s + 1 is prefetched)
template <bool GLU>
MEMRA_DEVICE void kloop(float (&acc)[4][4][4], const Ring& R, const Ptr& P, uint32_t s_base, int nsb, int ob, int cb,
                        int N, int K, int nb) {
    Addr ac = R.at(0);
    uint32_t rawc[4][4], rawn[4][4];
    Frag fc, fn;
#if GT_PF
    load_raw(rawc, ac.w, 0);
    load_frag(fc, ac, 0);
#endif
    for (int s = 0; s < nsb; ++s) {
#pragma unroll GT_PU
        for (int jp = 0; jp < 4; ++jp)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int j = 2 * jp + hi;
#if GT_PF
            // GT_PF 2: step j's scalars before the barrier (next_stage's pass overwrites this stage's buffer)
            if (GT_PF == 2) load_s(fc, ac, j);
            if (j == 7) next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
            if (j < 7) {
                if (j & 1) load_raw(rawn, ac.w, (j + 1) >> 1);
                if (GT_PF == 1) load_frag(fn, ac, j + 1); else load_b(fn, ac, j + 1);
            } else if (s + 1 < nsb) {
                const Addr an = R.at(s + 1);
                load_raw(rawn, an.w, 0);
                if (GT_PF == 1) load_frag(fn, an, 0); else load_b(fn, an, 0);
            }
#else
            if (!(j & 1)) load_raw(rawc, ac.w, j >> 1);
            load_frag(fc, ac, j);
#endif
            compute(acc, rawc, fc, hi);
#if GT_PF
            if (GT_PF == 1) fc = fn; else for (int q = 0; q < 4; ++q) { fc.B[q][0] = fn.B[q][0]; fc.B[q][1] = fn.B[q][1]; }
            if (hi) {
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int r = 0; r < 4; ++r) rawc[mi][r] = rawn[mi][r];
            }
#endif
        }
#if !GT_PF
        next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);   // after step 7 read its fragments
#endif
        ac = R.at(s + 1);
    }
    (void)rawn; (void)fn;
}

#elif MV_TYPE == 2 || MV_TYPE == 8
// ---- Q4_0 / Q8_0. Q8_0: the int8 bytes are the A bytes (one ldmatrix.x4 a m tile and block at byte
// 32 j). Q4_0: byte l of a block holds element l (low nibble) and l + 16 (high): one ldmatrix.x2 (rows
// 0-7 | 8-15, the 16 bytes at 16 j) gives a0 (low nibbles) and a2 (high) of row g, a1 / a3 of row g + 8;
// 16 (q - 8) = (16 q) ^ 0x80 per byte (exact s8), d' = d / 16.
constexpr uint32_t A_HI = Q4 ? 0 : 1;
MEMRA_DEVICE void mma_s8s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC));
}
MEMRA_DEVICE uint32_t q4_hi(uint32_t w) { return (w & 0xF0F0F0F0u) ^ 0x80808080u; }
MEMRA_DEVICE uint32_t q4_lo(uint32_t w) { return ((w << 4) & 0xF0F0F0F0u) ^ 0x80808080u; }
struct Frag {
    uint32_t B[4][2];
    float rs[16];   // rows 2 mi + h: (d', -M d')
    float cs[8];    // columns 2 ni + e: dx
};
MEMRA_DEVICE void load_raw(uint32_t (&raw)[4][RAWN], uint32_t w, int j) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        if constexpr (Q4) ldsm2(w + mi * 16 * WS + 16 * j, raw[mi][0], raw[mi][1]);
        else ldsm4(w + mi * 16 * WS + 32 * j, raw[mi][0], raw[mi][1], raw[mi][2], raw[mi][3]);
    }
}
MEMRA_DEVICE void load_b(Frag& F, const Addr& a, int j) { load_bfrag(F.B, a.x, j); }
MEMRA_DEVICE void load_s(Frag& F, const Addr& a, int j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float4 v = lds128(a.r + j * JSTR + 16 * q);
        F.rs[4 * q] = v.x; F.rs[4 * q + 1] = v.y; F.rs[4 * q + 2] = v.z; F.rs[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const float4 v = lds128(a.c + j * BN * 4 + 16 * q);
        F.cs[4 * q] = v.x; F.cs[4 * q + 1] = v.y; F.cs[4 * q + 2] = v.z; F.cs[4 * q + 3] = v.w;
    }
}
MEMRA_DEVICE void load_frag(Frag& F, const Addr& a, int j) { load_b(F, a, j); load_s(F, a, j); }
// one k32 step: p = fma(M + I', d', -M d') = fl(I d); acc = fma(p, dx, acc)
MEMRA_DEVICE void compute(float (&acc)[4][4][4], const uint32_t (&raw)[4][RAWN], const Frag& F) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        uint32_t A[4];
        if constexpr (Q4) {
            A[0] = q4_lo(raw[mi][0]); A[1] = q4_lo(raw[mi][1]); A[2] = q4_hi(raw[mi][0]); A[3] = q4_hi(raw[mi][1]);
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) A[r] = raw[mi][r];
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            int c[4];
            mma_s8s8(c, A, F.B[ni][0], F.B[ni][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = 2 * mi + (e >> 1), cc = 2 * ni + (e & 1);
                const float p = __fmaf_rn(__int_as_float(c[e]), F.rs[2 * rr], F.rs[2 * rr + 1]);
                acc[mi][ni][e] = __fmaf_rn(p, F.cs[cc], acc[mi][ni][e]);
            }
        }
    }
}
// the K loop: 8 k32 steps a stage (unrolled by GT_SU); the prefetch of step j + 1 / the next stage's
// step 0 without a branch (at the last stage it reads stale, in-bounds smem that is never used)
template <bool GLU>
MEMRA_DEVICE void kloop(float (&acc)[4][4][4], const Ring& R, const Ptr& P, uint32_t s_base, int nsb, int ob, int cb,
                        int N, int K, int nb) {
    Addr ac = R.at(0);
    uint32_t rawc[4][RAWN], rawn[4][RAWN];
    Frag fc, fn;
#if GT_PF
    load_raw(rawc, ac.w, 0);
    load_frag(fc, ac, 0);
#endif
    for (int s = 0; s < nsb; ++s) {
#pragma unroll GT_SU
        for (int j = 0; j < 8; ++j) {
#if GT_PF
            if (GT_PF == 2) load_s(fc, ac, j);   // before the refill barrier of step 7 (the pass of s + 2 overwrites it)
            if (j == 7) next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
            {
                const Addr an = j < 7 ? ac : R.at(s + 1);
                const int jn = j < 7 ? j + 1 : 0;
                load_raw(rawn, an.w, jn);
                if (GT_PF == 1) load_frag(fn, an, jn); else load_b(fn, an, jn);
            }
#else
            load_raw(rawc, ac.w, j);
            load_frag(fc, ac, j);
#endif
            compute(acc, rawc, fc);
#if GT_PF
            if (GT_PF == 1) fc = fn; else for (int q = 0; q < 4; ++q) { fc.B[q][0] = fn.B[q][0]; fc.B[q][1] = fn.B[q][1]; }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int r = 0; r < RAWN; ++r) rawc[mi][r] = rawn[mi][r];
#endif
        }
#if !GT_PF
        next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
#endif
        ac = R.at(s + 1);
    }
    (void)rawn; (void)fn;
}

#else
// ---- Q6_K. Element 128 n + 32 g + l of a super-block (half n, quarter g) is element l of k32 block
// 4 n + g: q = ((ql[64 n + 32 (g & 1) + l] >> 4 (g >> 1)) & 15) | (((qh[32 n + l] >> 2 g) & 3) << 4).
// Per m tile and half: ldmatrix.x4 at ql + 64 n + 32 c (c = 0, 1: blocks 4 n + c low nibbles, 4 n + c + 2
// high) and at qh + 32 n (the 2-bit fields of all four blocks); build_s makes the bytes q - 32 (s8). Two
// m16n8k16 s8 IMMAs a step and n tile (one per 16-half, C = 0): Ia, Ib; J = sc_a Ia + sc_b Ib.
constexpr uint32_t A_HI = 1;
MEMRA_DEVICE void mma16s(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b, int c0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5}, {%6}, {%7, %7, %7, %7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(c0));
}
// (T & ~0x0F0F0F0F) | (lo & 0x0F0F0F0F) as one LOP3
MEMRA_DEVICE uint32_t sel_nib(uint32_t T, uint32_t lo) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xD8;" : "=r"(r) : "r"(T), "r"(lo), "r"(0x0F0F0F0Fu));
    return r;
}
// H & m through an opaque lop3 (LUT 0xC0 = a & b; ptxas keeps mask-then-shift and fuses shift + add)
MEMRA_DEVICE uint32_t and_m(uint32_t H, uint32_t m) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, 0, 0xC0;" : "=r"(r) : "r"(H), "r"(m));
    return r;
}
// the A word of quarter g as bytes q - 32: T = hf + 0xE0E0E0E0 (hf = the 2-bit field at bits 4-5 of each
// byte; a byte's carry lands in the next byte's low nibble, which the select drops): high nibbles
// (hi + 14) mod 16, so select(T, lo) = q + 224 mod 256 = q - 32
MEMRA_DEVICE uint32_t build_s(uint32_t L, uint32_t H, int g) {
    switch (g) {
        case 0: return sel_nib(and_m(H, 0x03030303u) * 16u + 0xE0E0E0E0u, L);
        case 1: return sel_nib(and_m(H, 0x0C0C0C0Cu) * 4u + 0xE0E0E0E0u, L);
        case 2: return sel_nib(and_m(H, 0x30303030u) + 0xE0E0E0E0u, L >> 4);
        default: return sel_nib((and_m(H, 0xC0C0C0C0u) >> 2) + 0xE0E0E0E0u, L >> 4);
    }
}
struct Raw { uint32_t L[4][2][4]; uint32_t H[4][4]; };   // raw words of half n: ql plane c, qh
MEMRA_DEVICE void load_L(Raw& R, uint32_t w, int n, int c) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
        ldsm4(w + mi * 16 * WS + 64 * n + 32 * c, R.L[mi][c][0], R.L[mi][c][1], R.L[mi][c][2], R.L[mi][c][3]);
}
MEMRA_DEVICE void load_H(Raw& R, uint32_t w, int n) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(w + mi * 16 * WS + 128 + 32 * n, R.H[mi][0], R.H[mi][1], R.H[mi][2], R.H[mi][3]);
}
// the column scalars of a step (dx of the lane's 8 columns) at its start; the row scalars of m tile mi
// inside compute, right after its IMMAs are issued
struct Scal { float cs[8]; uint32_t r; };
MEMRA_DEVICE void load_s(Scal& S, const Addr& a, int j) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const uint4 v = lds128u(a.c + (j * BN) * 4 + 16 * q);
        S.cs[4 * q] = __uint_as_float(v.x); S.cs[4 * q + 1] = __uint_as_float(v.y);
        S.cs[4 * q + 2] = __uint_as_float(v.z); S.cs[4 * q + 3] = __uint_as_float(v.w);
    }
    S.r = a.r + j * JSTR;
}
// m tile mi of one k32 step: J = sc_a Ia + sc_b Ib; p = fl((float)J d); acc = fma(p, dx, acc)
MEMRA_DEVICE void compute_mi(float (&acc)[4][4][4], const uint32_t (&A)[4], const uint32_t (&B)[4][2], const Scal& S,
                             int mi, const float (&dd)[8]) {
    const uint4 v0 = lds128u(S.r + 16 * mi);
    const int rs[2][2] = {{(int)v0.x, (int)v0.y}, {(int)v0.z, (int)v0.w}};
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
        int ca[4], cb[4];
        mma16s(ca, A[0], A[1], B[ni][0], 0);
        mma16s(cb, A[2], A[3], B[ni][1], 0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = e >> 1, cc = 2 * ni + (e & 1);
            const int J = ca[e] * rs[h][0] + cb[e] * rs[h][1];
            const float p = __fmul_rn(__int2float_rn(J), dd[2 * mi + h]);
            acc[mi][ni][e] = __fmaf_rn(p, S.cs[cc], acc[mi][ni][e]);
        }
    }
}
MEMRA_DEVICE void compute(float (&acc)[4][4][4], const Raw& R, const uint32_t (&B)[4][2], const Scal& S, int g,
                          const float (&dd)[8]) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        uint32_t A[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) A[r] = build_s(R.L[mi][g & 1][r], R.H[mi][r], g);
        compute_mi(acc, A, B, S, mi, dd);
    }
}
// the K loop: 2 halves of 4 quarters a stage; GT_PF 1: B one step ahead, the next half's raw words
// after their last reader (plane 0 after quarter 2, plane 1 and qh after quarter 3), stage s + 1's first
// operands after the step-7 refill barrier
template <bool GLU>
MEMRA_DEVICE void kloop(float (&acc)[4][4][4], const Ring& RG, const Ptr& P, uint32_t s_base, int nsb, int ob, int cb,
                        int N, int K, int nb) {
    Addr ac = RG.at(0);
    uint32_t Bc[4][2], Bn[4][2];
    float dd[8];
    Raw R;
#if GT_PF
    load_L(R, ac.w, 0, 0); load_L(R, ac.w, 0, 1); load_H(R, ac.w, 0);
    load_bfrag(Bc, ac.x, 0);
#endif
    for (int s = 0; s < nsb; ++s) {
        {
            const uint32_t da = RG.d0 + (s & 1) * F_BYTES;
            const uint4 d0 = lds128u(da), d1 = lds128u(da + 16);
            dd[0] = __uint_as_float(d0.x); dd[1] = __uint_as_float(d0.y); dd[2] = __uint_as_float(d0.z); dd[3] = __uint_as_float(d0.w);
            dd[4] = __uint_as_float(d1.x); dd[5] = __uint_as_float(d1.y); dd[6] = __uint_as_float(d1.z); dd[7] = __uint_as_float(d1.w);
        }
#pragma unroll GT_PU
        for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int j = 4 * n + q;
            Scal S;
            load_s(S, ac, j);
#if GT_PF
            if (j < 7) load_bfrag(Bn, ac.x, j + 1);
            compute(acc, R, Bc, S, q, dd);
            if (j == 2) load_L(R, ac.w, 1, 0);
            if (j == 3) { load_L(R, ac.w, 1, 1); load_H(R, ac.w, 1); }
            if (j == 7) {
                next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
                if (s + 1 < nsb) {   // stage s + 1's first operands
                    const Addr an = RG.at(s + 1);
                    load_bfrag(Bn, an.x, 0);
                    load_L(R, an.w, 0, 0); load_L(R, an.w, 0, 1); load_H(R, an.w, 0);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) { Bc[i][0] = Bn[i][0]; Bc[i][1] = Bn[i][1]; }
#else
            if (q == 0) { load_L(R, ac.w, n, 0); load_L(R, ac.w, n, 1); load_H(R, ac.w, n); }
            load_bfrag(Bc, ac.x, j);
            compute(acc, R, Bc, S, q, dd);
#endif
        }
#if !GT_PF
        next_stage<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
#endif
        ac = RG.at(s + 1);
    }
    (void)Bn;
}
#endif

// =====================================================================================================
// shared: the body (prologue, K loop, epilogue) and the entry points
// =====================================================================================================
template <bool GLU>
MEMRA_DEVICE void gemm_tile_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                 const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                                 float* y, const float* res, int N, int K, int nb, int act) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, tig = lane & 3;
    const int ob = blockIdx.x * (GLU ? BM / 2 : BM), cb = blockIdx.y * BN;
    const int nsb = K / 256;
    const uint32_t s_base = smem_u32(smem);
    const Ptr P{bulk, meta, xq, reinterpret_cast<const uint8_t*>(xs)};

    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

    // prologue: group P (meta + Q8Scale of stage 0), groups 0 .. NS-2; passes of stages 0 and 1; group NS-1
    load_meta0<GLU>(s_base, P, ob, cb, N, K, nb);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) load_group<GLU>(s_base, P, s, nsb, ob, cb, N, K, nb);
    cp_wait<NS - 2>();
    __syncthreads();
    scalar_pass(0);
    if (nsb > 1) scalar_pass(1);
    __syncthreads();
    load_group<GLU>(s_base, P, NS - 1, nsb, ob, cb, N, K, nb);

    Ring R;
    R.w0 = s_base + OFF_W + (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + A_HI * 16 * (lane >> 4);
    R.x0 = s_base + OFF_X + (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1);
    R.r0 = s_base + OFF_F + (wm * 8 + g) * GSTR;
    R.c0 = s_base + OFF_F + RS_BYTES + (wn * 32 + 8 * tig) * CSTR;
    R.d0 = s_base + OFF_F + 8 * JSTR + (wm * 64 + 8 * g) * 4;   // Q6_K: a lane's 8 row d's
    kloop<GLU>(acc, R, P, s_base, nsb, ob, cb, N, K, nb);

    // epilogue (gemm.cu's finish()): glu v = fl(act(gate) * up); v = fl(v + res); y[col * N + row] = v
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1);
            if (col >= nb) continue;
#pragma unroll
            for (int mi = 0; mi < (GLU ? 2 : 4); ++mi) {
                const int row = ob + wm * (GLU ? 32 : 64) + 16 * mi + 8 * (e >> 1) + g;
                float v = acc[mi][ni][e];
                if (GLU) {
                    const float up = acc[mi + 2][ni][e];
                    v = __fmul_rn(act == 2 ? gelu_tanh_f32(v) : silu_f32(v), up);
                }
                const size_t yo = (size_t)col * N + row;
                if (res) v = __fadd_rn(v, res[yo]);
                y[yo] = v;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
          const Q8Scale* __restrict__ xs, float* y, const float* res, int N, int K, int nb, int act) {
    gemm_tile_body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
              const Q8Scale* __restrict__ xs, float* y, const float* res, int N, int K, int nb, int act) {
    gemm_tile_body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
