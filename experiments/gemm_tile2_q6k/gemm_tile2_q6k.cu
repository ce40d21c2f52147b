// gemm_tile2_q6k.cu — experiments/gemm_tile2's pipelined tile GEMM for Q6_K weights (README.md here).
//
// y[b, n] = sum_k W[n, k] x[b, k]: W in memra's planes layout for Q6_K (bulk = ql[128] | qh[64], 192
// bytes a super-block of 256; meta = scales[16] (int8) | d (f16), 18 bytes a super-block), x as q8
// (int8 per value, Q8Scale {d, s} per 32, as memra's quantize_q8 writes them).
//
// Q6_K (ggml's dequantize_row_q6_K, kernels/qtypes.cuh TQ6_K): element 128 n + 32 g + l of a
// super-block (half n < 2, quarter g < 4, l < 32) = the k32 block i = 4 n + g, element l:
//     q = (ql[64 n + 32 (g & 1) + l] >> 4 (g >> 1)) & 15  |  ((qh[32 n + l] >> 2 g) & 3) << 4
//     w = d scales[8 n + 2 g + l / 16] (q - 32)      -> the two 16-halves of block i have scales 2 i, 2 i + 1
//
// Design (as gemm_tile2, differences marked *):
// * Raw weights by cp.async: 192 bytes a row and stage (row stride WS = 208: conflict-free ldmatrix);
//   the 18 meta bytes of a row by five 4-byte cp.async (the meta plane is only 2-byte aligned a
//   super-block: the window [18 sb - 2 (sb & 1), + 20) is 4-aligned; needs K % 512 == 0 so that the
//   last window ends inside the plane), the activations and Q8Scale as gemm_tile2.
// * A fragments built in registers: one ldmatrix.x4 per m tile at ql + 64 n + 32 c (c = 0, 1) gives a
//   lane its m16n8k32 words of blocks 4 n + c (low nibbles) and 4 n + c + 2 (high nibbles); one at
//   qh + 32 n gives the 2-bit fields of all four blocks 4 n .. 4 n + 3. Per word: q = lo | hi << 4
//   (unsigned 0..63, ~3 integer ops, see build()). 3 ldmatrix.x4 per m tile serve 4 k32 steps.
// * The -32 offset through the IMMA accumulator input: one extra m16n8k32 s8 IMMA per n tile and k32
//   step with A = -32 on (rows 0-7, k 0-15) and (rows 8-15, k 16-31), 0 elsewhere, C = C0, gives
//   c0, c1 = C0 - 32 Sa(col), c2, c3 = C0 - 32 Sb(col) (Sa, Sb: the column's sums over the 16-halves);
//   they are the C inputs of the two m16n8k16 u8.s8 IMMAs of the step (one per 16-half): exact
//   Ia = sum (q - 32) x over half a (+ C0), Ib likewise.
// * Formulas: GT_FORM 0 (the per-16 chain, free to split K): per output and k32 block i,
//       acc = fma(fl(Ia d sc_2i), dx, acc);  acc = fma(fl(Ib d sc_2i+1), dx, acc)
//   with fl(I dsc) = fma(M + I, dsc, -M dsc) (C0 = the bits of M = 12582912.0f; |I| <= 16 * 32 * 128
//   < 2^22; dsc = d sc exact (<= 19 bits) so -M dsc is exact): 4 FFMA an output and k32.
//   GT_FORM 1 (the exact J chain): J = sc_2i Ia + sc_2i+1 Ib in int32 (C0 = 0; |J| <= 2^24: float(J)
//   exact, but beyond the magic bias's 2^22), acc = fma(fl(float(J) d), dx, acc): IMUL, IMAD, I2FP,
//   FMUL, FFMA an output and k32. No split-K (the host refuses ks > 1).
//   Without split-K both are one fixed float chain an output: batch- and grid-invariant.
// Tile, ring, cooperative scalar pass, split-K workspace and reduction as gemm_tile2 (plain only).
// Contract (host checks): K % (512 ks) == 0, N % BM == 0, any nb.
#include "common.cuh"
#include "q8.cuh"

#ifndef GT_WM
#define GT_WM 2
#endif
#ifndef GT_WN
#define GT_WN 4
#endif
#ifndef GT_STAGES
#define GT_STAGES 2
#endif
#ifndef GT_FORM
#define GT_FORM 0
#endif
// GT_PF 1: the next k32 step's B fragments and the next half's raw words loaded one step ahead (the
// row / column scalars at the start of their own step); 0: every operand right before use
#ifndef GT_PF
#define GT_PF 1
#endif
// GT_PU: unroll of the loop over a stage's two halves (4 k32 steps each): 1 rolled, 2 unrolled
#ifndef GT_PU
#define GT_PU 1
#endif
// GT_SIGNED 1: the A bytes built as q - 32 (s8; the -32 folded into the build, see build_s); 0: q unsigned
// and the offset through the C input of the half IMMAs from one offset IMMA a step and n tile (mma_off)
#ifndef GT_SIGNED
#define GT_SIGNED 1
#endif
// GT_COOP 1: a cooperative unpack once a stage (all threads: raw ql / qh of the slot -> an int8 tile of
// q - 32, BM x 272 bytes, single-buffered, between the step-7 barrier and a second barrier) and the A
// fragments by one ldmatrix.x4 per m tile and step from that tile, prefetched a step ahead (instead of the
// per-warp build in registers: every warp of a row group rebuilt the same words)
#ifndef GT_COOP
#define GT_COOP 0
#endif
#ifndef GT_MINB
#define GT_MINB 1
#endif

constexpr int WM = GT_WM, WN = GT_WN, NS = GT_STAGES;
constexpr int NT = 32 * WM * WN;
constexpr int BM = 64 * WM, BN = 32 * WN;
constexpr int WS = 208;                   // raw row stride: 192 + 16 (8 rows -> 8 distinct 16-byte bank slots)
constexpr int TS = 272;                   // activation column stride (256 + 16)
constexpr int MS = 20;                    // staged meta bytes a row (5 x 4)
constexpr int WT_BYTES = BM * WS, XT_BYTES = BN * TS, MT_BYTES = BM * MS, ST_BYTES = BN * 64;
// float area, one buffer: GT_FORM 0: rows [8][BM] float4 (dsc_a, -M dsc_a, dsc_b, -M dsc_b) at rperm;
// GT_FORM 1: rows [8][BM] int2 (sc_a, sc_b) at rperm, then [BM] float d at rperm. Columns [8][BN] float dx
constexpr int RS_BYTES = GT_FORM ? 8 * BM * 8 + BM * 4 : 8 * BM * 16;
constexpr int CS_BYTES = 8 * BN * 4;
constexpr int OFF_W = 0;
constexpr int OFF_X = OFF_W + NS * WT_BYTES;
constexpr int OFF_M = OFF_X + NS * XT_BYTES;
constexpr int OFF_S = OFF_M + NS * MT_BYTES;
constexpr int OFF_F = OFF_S + NS * ST_BYTES;
constexpr int F_BYTES = RS_BYTES + CS_BYTES;
constexpr int US = 272;                   // GT_COOP: unpacked tile row stride (256 + 16: conflict-free ldmatrix)
constexpr int OFF_U = OFF_F + 2 * F_BYTES;
constexpr int SMEM_TOTAL = OFF_U + (GT_COOP ? BM * US : 0);   // = the host's smem_bytes()
static_assert(SMEM_TOTAL <= 232448, "shared memory");
static_assert(NS >= 2 && NT >= BM && NT >= BN, "GT_STAGES >= 2, a thread per row / column at least");
static_assert(OFF_M % 16 == 0 && OFF_S % 16 == 0 && OFF_F % 16 == 0 && F_BYTES % 16 == 0, "alignment");

constexpr int WCH = BM * 12 / NT;         // raw weight chunks (16 B) a thread: 12 a row
constexpr int XCH = BN * 16 / NT;
constexpr int SCH = BN * 4 / NT;
constexpr int MCH = (BM * 5 + NT - 1) / NT;   // meta chunks (4 B) a thread (the last trip predicated)
static_assert(BM * 12 % NT == 0 && 12 % WCH == 0 && BN * 16 % NT == 0 && 16 % XCH == 0 && BN * 4 % NT == 0 &&
              4 % SCH == 0 && SCH >= 1, "loader shares");
constexpr int RPT = NT / BM, CPT = NT / BN;
static_assert(8 % RPT == 0 && 8 % CPT == 0, "scalar pass shares");
constexpr float MAGF = 12582912.0f;
constexpr int MAGIC = 0x4B400000;

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
MEMRA_DEVICE uint4 lds128u(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
// the offset IMMA: rows 0-7 x k 0-15 and rows 8-15 x k 16-31 of A are -32 (0xE0), the rest 0
MEMRA_DEVICE void mma_off(int (&c)[4], uint32_t b0, uint32_t b1, int c0) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %5, %4}, {%6, %7}, {%8, %8, %8, %8};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(0xE0E0E0E0u), "r"(0u), "r"(b0), "r"(b1), "r"(c0));
}
// one 16-half: c = A B + (o0, o1, o0, o1), A unsigned (q in 0..63), B signed
MEMRA_DEVICE void mma16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b, int o0, int o1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5}, {%6}, {%7, %8, %7, %8};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(o0), "r"(o1));
}
// one 16-half, A signed (q - 32): c = A B + c0
MEMRA_DEVICE void mma16s(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b, int c0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5}, {%6}, {%7, %7, %7, %7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(c0));
}
// GT_SIGNED 1: the A word of quarter g as bytes q - 32. With hf = the 2-bit field at bits 4-5 of each
// byte, T = hf + 0xE0E0E0E0 (a 32-bit add: a byte's carry lands in bit 0 of the next byte, inside the
// low nibble that the merge drops) has high nibbles (hi + 14) mod 16, so (T & 0xF0) | lo = q + 224 mod
// 256 = q - 32 as s8
// (T & ~0x0F0F0F0F) | (lo & 0x0F0F0F0F) as one LOP3 (select by the mask; ptxas does not merge the two masks)
MEMRA_DEVICE uint32_t sel_nib(uint32_t T, uint32_t lo) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xD8;" : "=r"(r) : "r"(T), "r"(lo), "r"(0x0F0F0F0Fu));
    return r;
}
// H & m through an opaque lop3 (so ptxas keeps mask-then-shift and fuses shift + add into one LEA).
// The LUT is F(a = 0xF0, b = 0xCC, c = 0xAA) of the operands (a, b, c) = (H, m, 0): a & b = 0xC0. (0x88 is
// b & c = m & 0 = 0: it dropped every qh bit, so every weight came out as lo - 32; model_q6k.lop3 now
// evaluates these LUTs from this file.)
MEMRA_DEVICE uint32_t and_m(uint32_t H, uint32_t m) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, 0, 0xC0;" : "=r"(r) : "r"(H), "r"(m));
    return r;
}
MEMRA_DEVICE uint32_t build_s(uint32_t L, uint32_t H, int g) {
    switch (g) {
        case 0: return sel_nib(and_m(H, 0x03030303u) * 16u + 0xE0E0E0E0u, L);
        case 1: return sel_nib(and_m(H, 0x0C0C0C0Cu) * 4u + 0xE0E0E0E0u, L);
        case 2: return sel_nib(and_m(H, 0x30303030u) + 0xE0E0E0E0u, L >> 4);
        default: return sel_nib((and_m(H, 0xC0C0C0C0u) >> 2) + 0xE0E0E0E0u, L >> 4);
    }
}
// GT_SIGNED 0: the A word of quarter g (k32 block 4 n + g) from the ql word L (plane g & 1) and the qh word H
MEMRA_DEVICE uint32_t build(uint32_t L, uint32_t H, int g) {
    switch (g) {
        case 0: return (L & 0x0F0F0F0Fu) | ((H & 0x03030303u) << 4);
        case 1: return (L & 0x0F0F0F0Fu) | ((H & 0x0C0C0C0Cu) << 2);
        case 2: return ((L >> 4) & 0x0F0F0F0Fu) | (H & 0x30303030u);
        default: return ((L >> 4) & 0x0F0F0F0Fu) | ((H >> 2) & 0x30303030u);
    }
}
// scalar positions (as gemm_tile2): a warp's row r = 16 mi + 8 h + g -> 8 g + 2 mi + h; column
// c = 8 ni + 2 tig + e -> 8 tig + 2 ni + e
MEMRA_DEVICE int rperm(int r) {
    const int w = r >> 6, l = r & 63;
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1);
}
MEMRA_DEVICE int cperm(int c) {
    const int w = c >> 5, l = c & 31;
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1);
}

struct Ptr { const uint8_t* bulk; const uint8_t* meta; const int8_t* xq; const uint8_t* xs; };
MEMRA_DEVICE int tid_v() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
// ring group of stage t: raw weights + activations of t (slot t % NS), meta + Q8Scale of t + 1
// (slot (t + 1) % NS); either part skipped past the block's nsb stages. Always one commit.
// Sources recomputed from a volatile %tid.x at every call (not live across the K loop).
MEMRA_DEVICE void load_meta(uint32_t s_base, const Ptr& P, int slot, int sb, int ob, int K) {
    const int t = tid_v();
    const uint32_t nblk = K / 256;
#pragma unroll
    for (int i = 0; i < MCH; ++i) {
        const int c = t + NT * i;
        if (c < BM * 5) {
            const int r = c / 5, part = c - 5 * r;
            const uint32_t src = (uint32_t)(ob + r) * nblk * 18 + 18 * sb - 2 * (sb & 1) + 4 * part;
            cp_async4(s_base + OFF_M + slot * MT_BYTES + MS * r + 4 * part, P.meta + src);
        }
    }
}
MEMRA_DEVICE void load_scales(uint32_t s_base, const Ptr& P, int slot, int sb, int cb, int K, int nb) {
    const int t = tid_v();
    const int scol = (SCH * t) >> 2, spart = (SCH * t) & 3;
    const uint32_t xs = (uint32_t)min(cb + scol, nb - 1) * (K / 32) * 8 + 16 * spart;
#pragma unroll
    for (int i = 0; i < SCH; ++i)
        cp_async16(s_base + OFF_S + slot * ST_BYTES + scol * 64 + 16 * spart + 16 * i, P.xs + (xs + 64 * sb + 16 * i));
}
MEMRA_DEVICE void load_group(uint32_t s_base, const Ptr& P, int t_, int sb0, int nsb, int ob, int cb, int K, int nb) {
    if (t_ < nsb) {
        const int t = tid_v();
        const int sb = sb0 + t_, slot = t_ % NS;
        const int r = (WCH * t) / 12, part = (WCH * t) % 12;
        const uint32_t wq = (uint32_t)(ob + r) * (K / 256 * 192) + 192 * sb + 16 * part;
#pragma unroll
        for (int i = 0; i < WCH; ++i)
            cp_async16(s_base + OFF_W + slot * WT_BYTES + r * WS + 16 * part + 16 * i, P.bulk + (wq + 16 * i));
        const int xcol = (XCH * t) >> 4, xpart = (XCH * t) & 15;
        const uint32_t xq = (uint32_t)min(cb + xcol, nb - 1) * K + 256 * sb + 16 * xpart;
        // GT_XROT of gemm_tile2 (XCH 8): the second thread of a column starts at its 5th chunk
        const int rot = (XCH == 8) ? 64 * (t & 1) : 0;
#pragma unroll
        for (int i = 0; i < XCH; ++i) {
            const int xr = (XCH == 8 && i >= 4) ? -rot : rot;
            cp_async16(s_base + OFF_X + slot * XT_BYTES + xcol * TS + 16 * xpart + xr + 16 * i, P.xq + (xq + xr + 16 * i));
        }
    }
    if (t_ + 1 < nsb) {
        load_meta(s_base, P, (t_ + 1) % NS, sb0 + t_ + 1, ob, K);
        load_scales(s_base, P, (t_ + 1) % NS, sb0 + t_ + 1, cb, K, nb);
    }
    cp_commit();
}

extern __shared__ __align__(16) uint8_t smem[];

// the cooperative scalar pass of stage t (global super-block sb): staged meta / Q8Scale (slot t % NS)
// -> float buffer t & 1
MEMRA_DEVICE void scalar_pass(int t_stage, int sb) {
    const int t = threadIdx.x, slot = t_stage % NS;
    uint8_t* f = smem + OFF_F + (t_stage & 1) * F_BYTES;
    if (t < BM * RPT) {   // rows: thread t -> row t % BM, k32 blocks (t / BM) * 8 / RPT ..
        constexpr int JR = 8 / RPT;
        const int r = t % BM, j0 = (t / BM) * JR;
        const uint8_t* m = smem + OFF_M + slot * MT_BYTES + MS * r + 2 * (sb & 1);
        const float d = f16_to_f32(*reinterpret_cast<const uint16_t*>(m + 16));
        const int p = rperm(r);
#pragma unroll
        for (int jj = 0; jj < JR; ++jj) {
            const int j = j0 + jj;
            const uint16_t sc2 = *reinterpret_cast<const uint16_t*>(m + 2 * j);
            const int sa = (int)(int8_t)(sc2 & 0xFF), sb_ = (int)(int8_t)(sc2 >> 8);
#if GT_FORM == 0
            const float da = d * (float)sa, db = d * (float)sb_;   // exact: f16 x int8 (<= 19 bits)
            reinterpret_cast<float4*>(f)[j * BM + p] = make_float4(da, -MAGF * da, db, -MAGF * db);
#else
            reinterpret_cast<int2*>(f)[j * BM + p] = make_int2(sa, sb_);
#endif
        }
#if GT_FORM == 1
        if (j0 == 0) reinterpret_cast<float*>(f + 8 * BM * 8)[p] = d;
#endif
    }
    if (t < BN * CPT) {   // columns: thread t -> column t % BN, k32 blocks (t / BN) * 8 / CPT ..
        constexpr int JC = 8 / CPT;
        const int c = t % BN, j0 = (t / BN) * JC;
        const Q8Scale* s = reinterpret_cast<const Q8Scale*>(smem + OFF_S + slot * ST_BYTES + 64 * c) + j0;
        float* fc = reinterpret_cast<float*>(f + RS_BYTES);
#pragma unroll
        for (int jj = 0; jj < JC; ++jj) fc[(j0 + jj) * BN + cperm(c)] = s[jj].d;
    }
}

struct Addr { uint32_t w, x, r, c; };
// raw words of half n for the 4 m tiles: L[mi][c][4] (ql plane c), H[mi][4]
struct Raw { uint32_t L[4][2][4]; uint32_t H[4][4]; };
MEMRA_DEVICE void load_L(Raw& R, uint32_t w, int n, int c) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
        ldsm4(w + mi * 16 * WS + 64 * n + 32 * c, R.L[mi][c][0], R.L[mi][c][1], R.L[mi][c][2], R.L[mi][c][3]);
}
MEMRA_DEVICE void load_H(Raw& R, uint32_t w, int n) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(w + mi * 16 * WS + 128 + 32 * n, R.H[mi][0], R.H[mi][1], R.H[mi][2], R.H[mi][3]);
}
MEMRA_DEVICE void load_b(uint32_t (&B)[4][2], uint32_t x, int j) {
#pragma unroll
    for (int np = 0; np < 2; ++np) ldsm4(x + np * 16 * TS + 32 * j, B[2 * np][0], B[2 * np][1], B[2 * np + 1][0], B[2 * np + 1][1]);
}
// the column scalars of a step (dx of the lane's 8 columns) at the start of the step; the row scalars of
// m tile mi (2 rows) inside compute, right before mi's IMMAs (read after them: the IMMA latency covers the LDS)
struct Scal { float cs[8]; uint32_t r; };   // r: the lane's row-scalar address of the step
MEMRA_DEVICE void load_s(Scal& S, const Addr& a, int j) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const uint4 v = lds128u(a.c + (j * BN) * 4 + 16 * q);
        S.cs[4 * q] = __uint_as_float(v.x); S.cs[4 * q + 1] = __uint_as_float(v.y);
        S.cs[4 * q + 2] = __uint_as_float(v.z); S.cs[4 * q + 3] = __uint_as_float(v.w);
    }
    S.r = a.r + (j * BM) * (GT_FORM ? 8 : 16);
}
// the IMMAs and formula of m tile mi in one k32 step, A = its 4 fragment words (q - 32 or q)
MEMRA_DEVICE void compute_mi(float (&acc)[4][4][4], const uint32_t (&A)[4], const uint32_t (&B)[4][2], const Scal& S,
                             int mi, const int (&o)[4][4], const float (&dd)[8]) {
#if GT_FORM == 0
    const uint4 v0 = lds128u(S.r + 32 * mi), v1 = lds128u(S.r + 32 * mi + 16);   // rows 2 mi, 2 mi + 1
    const float rs[2][4] = {{__uint_as_float(v0.x), __uint_as_float(v0.y), __uint_as_float(v0.z), __uint_as_float(v0.w)},
                            {__uint_as_float(v1.x), __uint_as_float(v1.y), __uint_as_float(v1.z), __uint_as_float(v1.w)}};
#else
    const uint4 v0 = lds128u(S.r + 16 * mi);
    const int rs[2][2] = {{(int)v0.x, (int)v0.y}, {(int)v0.z, (int)v0.w}};
#endif
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
        int ca[4], cb[4];
        if (GT_SIGNED || GT_COOP) {
            mma16s(ca, A[0], A[1], B[ni][0], o[ni][0]);
            mma16s(cb, A[2], A[3], B[ni][1], o[ni][0]);
        } else {
            mma16(ca, A[0], A[1], B[ni][0], o[ni][0], o[ni][1]);
            mma16(cb, A[2], A[3], B[ni][1], o[ni][2], o[ni][3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = e >> 1, cc = 2 * ni + (e & 1);
#if GT_FORM == 0
            const float pa = __fmaf_rn(__int_as_float(ca[e]), rs[h][0], rs[h][1]);
            float a = __fmaf_rn(pa, S.cs[cc], acc[mi][ni][e]);
            const float pb = __fmaf_rn(__int_as_float(cb[e]), rs[h][2], rs[h][3]);
            acc[mi][ni][e] = __fmaf_rn(pb, S.cs[cc], a);
#else
            const int J = ca[e] * rs[h][0] + cb[e] * rs[h][1];
            const float p = __fmul_rn(__int2float_rn(J), dd[2 * mi + h]);
            acc[mi][ni][e] = __fmaf_rn(p, S.cs[cc], acc[mi][ni][e]);
#endif
        }
    }
}
MEMRA_DEVICE void offsets(int (&o)[4][4], const uint32_t (&B)[4][2]) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
        if (GT_SIGNED || GT_COOP) { o[ni][0] = o[ni][1] = o[ni][2] = o[ni][3] = GT_FORM ? 0 : MAGIC; }
        else mma_off(o[ni], B[ni][0], B[ni][1], GT_FORM ? 0 : MAGIC);
    }
}
// one k32 step (quarter g of the current half) from the raw words: offset IMMAs, A build, half IMMAs, formula
MEMRA_DEVICE void compute(float (&acc)[4][4][4], const Raw& R, const uint32_t (&B)[4][2], const Scal& S, int g,
                          const float (&dd)[8]) {
    int o[4][4];
    offsets(o, B);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        uint32_t A[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) A[r] = GT_SIGNED ? build_s(R.L[mi][g & 1][r], R.H[mi][r], g) : build(R.L[mi][g & 1][r], R.H[mi][r], g);
        compute_mi(acc, A, B, S, mi, o, dd);
    }
}
// GT_COOP: one k32 step from A fragments loaded from the unpacked tile
MEMRA_DEVICE void compute_u(float (&acc)[4][4][4], const uint32_t (&A)[4][4], const uint32_t (&B)[4][2], const Scal& S,
                            const float (&dd)[8]) {
    int o[4][4];
    offsets(o, B);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) compute_mi(acc, A[mi], B, S, mi, o, dd);
}
MEMRA_DEVICE void load_au(uint32_t (&A)[4][4], uint32_t u, int j) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(u + mi * 16 * US + 32 * j, A[mi][0], A[mi][1], A[mi][2], A[mi][3]);
}
// GT_COOP: the cooperative unpack of the raw slot `slot` into the int8 tile (q - 32). Unit u = (row r,
// half n, 16-element part lh): 3 LDS.128 (ql planes 0 / 1 at 64 n + 32 c + 16 lh, qh at 128 + 32 n + 16 lh)
// -> 4 STS.128 (quarters g = 0..3: elements 128 n + 32 g + 16 lh ..)
MEMRA_DEVICE void unpack(int slot) {
    const uint32_t raw = smem_u32(smem) + OFF_W + slot * WT_BYTES, ut = smem_u32(smem) + OFF_U;
#pragma unroll
    for (int i = 0; i < BM * 4 / NT; ++i) {
        const int u = threadIdx.x + NT * i, r = u >> 2, n = (u >> 1) & 1, lh = u & 1;
        const uint32_t src = raw + r * WS + 16 * lh;
        const uint4 L0 = lds128u(src + 64 * n), L1 = lds128u(src + 64 * n + 32), H = lds128u(src + 128 + 32 * n);
        const uint32_t dst = ut + r * US + 128 * n + 16 * lh;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const uint4 L = (g & 1) ? L1 : L0;
            const uint32_t w0 = build_s(L.x, H.x, g), w1 = build_s(L.y, H.y, g), w2 = build_s(L.z, H.z, g), w3 = build_s(L.w, H.w, g);
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(dst + 32 * g), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
        }
    }
}

MEMRA_DEVICE void gemm_q6k_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                                float* __restrict__ y, int N, int K, int nb, int ks) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, tig = lane & 3;
    const int ob = blockIdx.x * BM, cb = blockIdx.y * BN;
    const int nsb = K / 256 / ks, sb0 = blockIdx.z * nsb;
    const uint32_t s_base = smem_u32(smem);
    const Ptr P{bulk, meta, xq, reinterpret_cast<const uint8_t*>(xs)};
    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

    // prologue: group P (meta + Q8Scale of stage 0), groups 0 .. NS-2; passes of stages 0 and 1; group NS-1
    load_meta(s_base, P, 0, sb0, ob, K);
    load_scales(s_base, P, 0, sb0, cb, K, nb);
    cp_commit();
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) load_group(s_base, P, s, sb0, nsb, ob, cb, K, nb);
    cp_wait<NS - 2>();
    __syncthreads();
    scalar_pass(0, sb0);
    if (nsb > 1) scalar_pass(1, sb0 + 1);
    if (GT_COOP) unpack(0);
    __syncthreads();
    load_group(s_base, P, NS - 1, sb0, nsb, ob, cb, K, nb);

    const uint32_t a_off = (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + 16 * (lane >> 4);
    const uint32_t b_off = (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1);
    const uint32_t r_off = (wm * 64 + 8 * g) * (GT_FORM ? 8 : 16);
    const uint32_t c_off = RS_BYTES + (wn * 32 + 8 * tig) * 4;
    auto addr = [&](int s) {
        Addr a;
        a.w = s_base + OFF_W + (s % NS) * WT_BYTES + a_off;
        a.x = s_base + OFF_X + (s % NS) * XT_BYTES + b_off;
        a.r = s_base + OFF_F + (s & 1) * F_BYTES + r_off;
        a.c = s_base + OFF_F + (s & 1) * F_BYTES + c_off;
        return a;
    };
    Addr ac = addr(0);
    uint32_t Bc[4][2], Bn[4][2];
    float dd[8];
#if GT_FORM == 1
    const uint32_t d_off = 8 * BM * 8 + (wm * 64 + 8 * g) * 4;   // GT_FORM 1: a lane's 8 row d's of the stage
#endif
#if GT_COOP
    uint32_t Ac[4][4], An[4][4];
    const uint32_t u_base = s_base + OFF_U + (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * US + 16 * (lane >> 4);
    load_au(Ac, u_base, 0);
    load_b(Bc, ac.x, 0);
    for (int s = 0; s < nsb; ++s) {
#if GT_FORM == 1
        {
            const uint4 d0 = lds128u(ac.r - r_off + d_off), d1 = lds128u(ac.r - r_off + d_off + 16);
            dd[0] = __uint_as_float(d0.x); dd[1] = __uint_as_float(d0.y); dd[2] = __uint_as_float(d0.z); dd[3] = __uint_as_float(d0.w);
            dd[4] = __uint_as_float(d1.x); dd[5] = __uint_as_float(d1.y); dd[6] = __uint_as_float(d1.z); dd[7] = __uint_as_float(d1.w);
        }
#else
#pragma unroll
        for (int i = 0; i < 8; ++i) dd[i] = 0.f;
#endif
#pragma unroll GT_PU
        for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int j = 4 * n + q;
            Scal S;
            load_s(S, ac, j);
            if (j < 7) { load_b(Bn, ac.x, j + 1); load_au(An, u_base, j + 1); }
            compute_u(acc, Ac, Bc, S, dd);
            if (j == 7) {   // end of stage s: refill, pass of s + 2, unpack of s + 1 into the (single) tile
                cp_wait<NS - 2>();
                __syncthreads();
                load_group(s_base, P, s + NS, sb0, nsb, ob, cb, K, nb);
                if (s + 2 < nsb) scalar_pass(s + 2, sb0 + s + 2);
                if (s + 1 < nsb) {
                    unpack((s + 1) % NS);
                    __syncthreads();
                    const Addr an = addr(s + 1);
                    load_b(Bn, an.x, 0);
                    load_au(An, u_base, 0);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                Bc[i][0] = Bn[i][0]; Bc[i][1] = Bn[i][1];
                Ac[i][0] = An[i][0]; Ac[i][1] = An[i][1]; Ac[i][2] = An[i][2]; Ac[i][3] = An[i][3];
            }
        }
        ac = addr(s + 1);
    }
#else
    Raw R;
#if GT_PF
    load_L(R, ac.w, 0, 0); load_L(R, ac.w, 0, 1); load_H(R, ac.w, 0);
    load_b(Bc, ac.x, 0);
#endif
    for (int s = 0; s < nsb; ++s) {
#if GT_FORM == 1
        {
            const uint4 d0 = lds128u(ac.r - r_off + d_off), d1 = lds128u(ac.r - r_off + d_off + 16);
            dd[0] = __uint_as_float(d0.x); dd[1] = __uint_as_float(d0.y); dd[2] = __uint_as_float(d0.z); dd[3] = __uint_as_float(d0.w);
            dd[4] = __uint_as_float(d1.x); dd[5] = __uint_as_float(d1.y); dd[6] = __uint_as_float(d1.z); dd[7] = __uint_as_float(d1.w);
        }
#else
#pragma unroll
        for (int i = 0; i < 8; ++i) dd[i] = 0.f;
#endif
#pragma unroll GT_PU
        for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int j = 4 * n + q;
            Scal S;
            load_s(S, ac, j);
#if GT_PF
            if (j < 7) load_b(Bn, ac.x, j + 1);
            compute(acc, R, Bc, S, q, dd);
            // the next half's raw words: plane 0 after quarter 2 (its last reader), plane 1 and qh after quarter 3
            if (j == 2) load_L(R, ac.w, 1, 0);
            if (j == 3) { load_L(R, ac.w, 1, 1); load_H(R, ac.w, 1); }
            if (j == 7) {   // end of stage s (every read of its slot and buffer issued): refill, pass of s + 2
                cp_wait<NS - 2>();
                __syncthreads();
                load_group(s_base, P, s + NS, sb0, nsb, ob, cb, K, nb);
                if (s + 2 < nsb) scalar_pass(s + 2, sb0 + s + 2);
                if (s + 1 < nsb) {   // stage s + 1's first operands
                    const Addr an = addr(s + 1);
                    load_b(Bn, an.x, 0);
                    load_L(R, an.w, 0, 0); load_L(R, an.w, 0, 1); load_H(R, an.w, 0);
                }
            }
#else
            if (q == 0) { load_L(R, ac.w, n, 0); load_L(R, ac.w, n, 1); load_H(R, ac.w, n); }
            load_b(Bc, ac.x, j);
            compute(acc, R, Bc, S, q, dd);
#endif
#if GT_PF
#pragma unroll
            for (int i = 0; i < 4; ++i) { Bc[i][0] = Bn[i][0]; Bc[i][1] = Bn[i][1]; }
#endif
        }
#if !GT_PF
        cp_wait<NS - 2>();
        __syncthreads();
        load_group(s_base, P, s + NS, sb0, nsb, ob, cb, K, nb);
        if (s + 2 < nsb) scalar_pass(s + 2, sb0 + s + 2);
#endif
        ac = addr(s + 1);
    }
#endif
    (void)Bn; (void)dd;

    if (ks > 1) {   // split-K (GT_FORM 0 only): raw partials to y = ws[z][col][row]
        float* part = y + (size_t)blockIdx.z * nb * N;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1);
                if (col >= nb) continue;
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
                    part[(size_t)col * N + ob + wm * 64 + 16 * mi + 8 * (e >> 1) + g] = acc[mi][ni][e];
            }
        return;
    }
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1);
            if (col >= nb) continue;
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
                y[(size_t)col * N + ob + wm * 64 + 16 * mi + 8 * (e >> 1) + g] = acc[mi][ni][e];
        }
}

extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile_q6k(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
              const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    gemm_q6k_body(bulk, meta, xq, xs, y, N, K, nb, ks);
}

// split-K reduction: y[b, n] = sum over z in increasing order of ws[z][b][n]
extern "C" __global__ void gemm_tile_q6k_reduce(const float* __restrict__ ws, float* __restrict__ y, int N, int nb,
                                                int ks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * nb) return;
    const size_t zs = (size_t)nb * N;
    float a = ws[i];
    for (int z = 1; z < ks; ++z) a = __fadd_rn(a, ws[i + z * zs]);
    y[i] = a;
}
