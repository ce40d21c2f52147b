// gemm_tile2.cu — the pipelined successor of experiments/gemm_tile/gemm_tile.cu (README.md here).
//
// Same inputs and outputs as gemm_tile: W in memra's planes layout (bulk = the Q4_K qs bytes, 128
// per super-block of 256; meta = d | dmin | scales[12], 16 per super-block), x as q8 (int8 per value,
// Q8Scale {d, s} per 32), y[b, n] (glu: silu(gate) * up; plain: W x). Changes against gemm_tile:
//
// 1. Fragment software pipelining: each k32 step first issues the shared loads of the NEXT step
//    (ldmatrix of B, the raw A words when the next step starts a new nibble pair, the row / column
//    scalars) into a second register set, then the IMMAs / FFMAs of the current step, whose operands
//    were loaded one step earlier. The k32 loop is fully unrolled (8 steps a stage); the barrier of
//    the next stage sits inside step 7 so step 0 of stage s + 1 is prefetched behind step 7 of s.
// 2. Weights by cp.async: the RAW Q4_K bytes (128 a row and stage, row stride 144 B: conflict-free
//    ldmatrix) and the 16 meta bytes of a row go through the same cp.async ring as the activations
//    (and their Q8Scale pairs); no LDG into registers, no unpack pass. In Q4_K's qs, byte l of the
//    32-byte group j' holds element l of sub-block 2 j' (low nibble) and of 2 j' + 1 (high nibble), so
//    the ldmatrix.x4 that gemm_tile used on its unpacked tile, applied at byte 32 j' of the RAW tile,
//    gives each lane exactly the m16n8k32 A-fragment words of both k32 blocks 2 j' and 2 j' + 1:
//    A(2 j') = w & 0x0F0F0F0F, A(2 j' + 1) = w & 0xF0F0F0F0 = 16 q (one LOP3 each; the IMMA is
//    .u8.s8), whose 16 I is compensated by dsc / 16 (exact: a power of two) in the row scalars.
//    Row scalars (d sc_j, -(dmin m_j), 6-bit unpack) and column scalars (dx, dx S) are computed once
//    per row / column and stage by a cooperative pass from the staged meta / Q8Scale bytes into a
//    double-buffered float area, one stage ahead (ring groups: {W, x of stage t; meta, xs of t + 1}).
// 3. GT_FORM 0 ("tcm" of gemm_tile: free order): per output and k32, p = fl(I dsc) by one FFMA from
//    the magic-biased IMMA result, acc = fma(p, dx, acc); the stage's min term sum_j ndmm sx as a
//    k = 8 3xTF32 m16n8k8 product (after step 0's main terms). GT_FORM 1 (the exact chain): per
//    output, for each k32 block i in increasing k:
//        p = fma(M + I, dsc, -M dsc) = fl(I dsc);  acc = fma(p, dx, acc);  acc = fma(ndmm, sx, acc)
//    with M = 12582912.0f, ndmm = -(dmin m_j), sx = fl(dx S_i): one float chain per output, the same
//    for every batch size, tile position and grid (no split-K: the host refuses ks > 1 in this mode).
//    The high-nibble blocks' 16 I with dsc / 16 give the same p bit for bit (the product 16 I dsc / 16
//    = I dsc is exact inside the FFMA; |16 I| <= 16 x 32 x 15 x 128 < 2^22 keeps M + 16 I exact).
//
// Tile (as gemm_tile): a block = GT_WM x GT_WN warps, a warp 64 weight rows x 32 columns (4 m16 x 4 n8
// tiles); glu: a warp's m tiles 0, 1 are gate rows and 2, 3 the up rows of the same 32 outputs.
// Split-K (GT_FORM 0 only): grid.z = ks parts, raw partials to a workspace, gemm_tile_reduce in z order.
// Contract (host checks): K % (256 ks) == 0, N % (glu ? BM / 2 : BM) == 0, GT_WN >= 2, any nb.
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
// GT_PF 1: the next step's fragments (raw A words, B, row / column scalars) are loaded before the
// current step's IMMAs (register double buffering); 2: only the IMMA operands (raw A, B) one step
// ahead, the scalars at the start of their own step (their FFMAs wait for the IMMA results anyway);
// 0: each step loads its own fragments right before use (gemm_tile's order; comparison)
#ifndef GT_PF
#define GT_PF 1
#endif
// GT_PU: unroll of the loop over a stage's 4 nibble pairs (2 k32 steps each): 4 = fully unrolled
#ifndef GT_PU
#define GT_PU 1
#endif
// GT_MINS 1 (with GT_PU 4): the min term's HMMAs spread over steps 0 .. 3 (m tile mi after step mi);
// 2: all after step 0, each m tile's A quads loaded right before its HMMAs; 0: all loaded before step 0
#ifndef GT_MINS
#define GT_MINS 2
#endif
// GT_XROT 1: the activation cp.async chunks of a column's second thread rotated by 4 (bank-conflict-free
// LDGSTS phases, see sources())
#ifndef GT_XROT
#define GT_XROT 1
#endif
// GT_SRCV 1: the cp.async sources recomputed in each stage's refill (not live across the loop)
#ifndef GT_SRCV
#define GT_SRCV 1
#endif
// GT_PASS: the step of stage s in which the scalar pass of stage s + 1 runs (0 .. 6: between the barriers
// B_s and B_s+1, writing buffer (s + 1) & 1, which stage s does not read), or 7: the pass of s + 2 right
// after B_s+1 in step 7 (beside the refill and the next stage's prefetch: the register peak)
#ifndef GT_PASS
#define GT_PASS 7
#endif
#ifndef GT_MINB
#define GT_MINB 1
#endif

constexpr int WM = GT_WM, WN = GT_WN, NS = GT_STAGES;
constexpr int NT = 32 * WM * WN;          // threads
constexpr int BM = 64 * WM, BN = 32 * WN; // weight rows, columns of a block
constexpr int WS = 144;                   // raw weight tile row stride (128 B + 16: conflict-free ldmatrix)
constexpr int TS = 272;                   // activation tile column stride (256 B + 16)
constexpr int WT_BYTES = BM * WS, XT_BYTES = BN * TS, MT_BYTES = BM * 16, ST_BYTES = BN * 64;
// float area, one buffer: GT_FORM 0: rows [8][BM] float2 (dsc', -M dsc') (at rperm), then the min term's
// tf32 A quads of ndmm in register order (8 BM floats hi, 8 BM floats lo: aperm); columns [8][BN] float dx
// (at cperm), then the B quads of sx (hi b0 b1, lo b0 b1: bperm). GT_FORM 1: rows [8][BM] x 3 floats
// (dsc', -M dsc', ndmm); columns [8][BN] float2 (dx, sx). dsc' = d sc_j (j even), d sc_j / 16 (j odd)
constexpr int RS_BYTES = 8 * BM * (GT_FORM ? 12 : 16);
constexpr int CS_BYTES = 8 * BN * (GT_FORM ? 8 : 12);
constexpr int OFF_W = 0;
constexpr int OFF_X = OFF_W + NS * WT_BYTES;
constexpr int OFF_M = OFF_X + NS * XT_BYTES;
constexpr int OFF_S = OFF_M + NS * MT_BYTES;
constexpr int OFF_F = OFF_S + NS * ST_BYTES;
constexpr int F_BYTES = RS_BYTES + CS_BYTES;
constexpr int SMEM_TOTAL = OFF_F + 2 * F_BYTES;   // = the host's smem_bytes()
static_assert(SMEM_TOTAL <= 232448, "shared memory");
static_assert(WN >= 2 && NS >= 2, "GT_WN >= 2 (row pass: NT >= BM), GT_STAGES >= 2");

// per-thread shares of a stage's cp.async chunks (16 B)
constexpr int WCH = BM * 8 / NT;          // raw weights: 8 a row
constexpr int XCH = BN * 16 / NT;         // activations: 16 a column
constexpr int SCH = BN * 4 / NT;          // Q8Scale: 4 a column (64 B)
static_assert(BM * 8 % NT == 0 && BN * 16 % NT == 0 && BN * 4 % NT == 0 && 8 % WCH == 0 && 16 % XCH == 0 &&
              4 % SCH == 0 && SCH >= 1, "loader shares");
constexpr int RPT = NT / BM, CPT = NT / BN;   // threads a row / a column in the scalar pass
static_assert(8 % RPT == 0 && 8 % CPT == 0, "scalar pass shares");
constexpr float MAGF = 12582912.0f;
constexpr int MAGIC = 0x4B400000;

MEMRA_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
MEMRA_DEVICE void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
MEMRA_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
MEMRA_DEVICE void ldsm4(uint32_t a, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
MEMRA_DEVICE float4 lds128(uint32_t a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
// c = A B + C0 (C0 = the magic bias), A unsigned 8-bit (the masked nibbles), B signed
MEMRA_DEVICE void mma_u8s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC));
}
MEMRA_DEVICE void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
MEMRA_DEVICE float2 tf32_split(float x) {
    uint32_t h;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(x));
    const float hi = __uint_as_float(h);
    return make_float2(hi, x - hi);
}
MEMRA_DEVICE uint32_t bsel(const uint4& v, int i) {   // byte i (constant after unrolling)
    const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (w >> (8 * (i & 3))) & 0xFFu;
}
// scalar positions (as gemm_tile): a warp's row r = 16 mi + 8 h + g -> 8 g + 2 mi + h; column
// c = 8 ni + 2 tig + e -> 8 tig + 2 ni + e; the min term's B columns c -> 4 g + ni
MEMRA_DEVICE int rperm(int r) {
    const int w = r >> 6, l = r & 63;
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1);
}
MEMRA_DEVICE int cperm(int c) {
    const int w = c >> 5, l = c & 31;
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1);
}
// the min term's tf32 fragments in register order (GT_FORM 0), so one LDS.128 is one operand:
// A (m16n8k8: a0 (g, tig), a1 (g + 8, tig), a2 (g, tig + 4), a3 (g + 8, tig + 4)): row r = 64 w + 16 mi
// + 8 h + g, sub-block j = tig + 4 jj -> float (32 (4 w + mi) + 4 g + tig) 4 + h + 2 jj (hi array; lo
// array 8 BM floats later). B (b0 (k tig, col g), b1 (k tig + 4, col g)): column c = 32 w + 8 ni + g ->
// float (32 (4 w + ni) + 4 g + tig) 4 + jj (hi), + 2 (lo): a lane's float4 = (hi b0, hi b1, lo b0, lo b1)
MEMRA_DEVICE int aperm(int r, int j) {
    const int w = r >> 6, l = r & 63;
    return (32 * (4 * w + (l >> 4)) + 4 * (l & 7) + (j & 3)) * 4 + ((l >> 3) & 1) + 2 * (j >> 2);
}
MEMRA_DEVICE int bperm(int c, int j) {
    const int w = c >> 5, l = c & 31;
    return (32 * (4 * w + (l >> 3)) + 4 * (l & 7) + (j & 3)) * 4 + (j >> 2);
}
template <bool GLU>
MEMRA_DEVICE int wrow(int r, int ob, int N) {
    if (!GLU) return ob + r;
    const int w = r >> 6, l = r & 63;
    return (l < 32 ? 0 : N) + ob + 32 * w + (l & 31);
}

// a thread's cp.async sources at super-block 0 as 32-bit element offsets from the kernel's pointer
// parameters (fewer live registers than 64-bit pointers) and their smem offsets inside a slot
struct Src {
    uint32_t wq, wdst;   // raw weights: row (WCH t) / 8, chunks (WCH t) % 8 ..
    uint32_t xq, xdst;   // activations: column (XCH t) / 16, chunks (XCH t) % 16 .. (in the order xrot + i)
    uint32_t xrot;       // GT_XROT, XCH 8: the second thread of a column starts at its 5th chunk (bytes)
    uint32_t mt;         // meta: row t (threads < BM), 16 B
    uint32_t xs, sdst;   // Q8Scale (bytes): column (SCH t) / 4, chunks (SCH t) % 4 ..
};
struct Ptr { const uint8_t* bulk; const uint8_t* meta; const int8_t* xq; const uint8_t* xs; };
// %tid.x through a volatile asm: not hoisted out of the K loop, so the sources are recomputed (~15
// integer ops a stage) where they are used instead of holding ~8 registers across the whole loop
MEMRA_DEVICE int tid_v() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
template <bool GLU>
MEMRA_DEVICE Src sources(int ob, int cb, int N, int K, int nb) {
    const int t = GT_SRCV ? tid_v() : (int)threadIdx.x;
    Src p;
    const int r = (WCH * t) >> 3, part = (WCH * t) & 7;
    p.wq = (uint32_t)wrow<GLU>(r, ob, N) * (K / 2) + 16 * part;
    p.wdst = r * WS + 16 * part;
    const int xcol = (XCH * t) >> 4, xpart = (XCH * t) & 15;
    p.xq = (uint32_t)min(cb + xcol, nb - 1) * K + 16 * xpart;
    p.xdst = xcol * TS + 16 * xpart;
    // LDGSTS shared-store phases (8 lanes x 16 B): lanes 2c, 2c + 1 write column c (c = 0..3) at chunk
    // i and 8 + i, 16-byte bank slot (17 c + i) % 8 = (c + i) % 8 for both: 2-way. Rotating the second
    // thread's chunks by 4 gives slots (c + 4 (t & 1) + i) % 8: the 8 lanes of a phase all distinct
    p.xrot = (GT_XROT && XCH == 8) ? 64 * (t & 1) : 0;   // bytes (4 chunks)
    p.mt = (uint32_t)wrow<GLU>(t < BM ? t : 0, ob, N) * (K / 16);
    const int scol = (SCH * t) >> 2, spart = (SCH * t) & 3;
    p.xs = (uint32_t)min(cb + scol, nb - 1) * (K / 32) * 8 + 16 * spart;
    p.sdst = scol * 64 + 16 * spart;
    return p;
}
// ring group of stage t: raw weights + activations of t (slot t % NS), meta + Q8Scale of t + 1
// (slot (t + 1) % NS); either part skipped past the block's nsb stages. Always one commit.
MEMRA_DEVICE void load_group(uint32_t s_base, const Ptr& P, const Src& p, int t, int sb0, int nsb) {
    if (t < nsb) {
        const int sb = sb0 + t, slot = t % NS;
#pragma unroll
        for (int i = 0; i < WCH; ++i) cp_async16(s_base + OFF_W + slot * WT_BYTES + p.wdst + 16 * i, P.bulk + (p.wq + 128 * sb + 16 * i));
#pragma unroll
        for (int i = 0; i < XCH; ++i) {   // chunk (i + rot) % 8 = i + rot (i < 4), i - rot (i >= 4): rot 0 or 4
            const int xr = (XCH == 8 && i >= 4) ? -(int)p.xrot : (int)p.xrot;   // bytes: 16 rot
            cp_async16(s_base + OFF_X + slot * XT_BYTES + (p.xdst + xr) + 16 * i, P.xq + (p.xq + 256 * sb + xr + 16 * i));
        }
    }
    if (t + 1 < nsb) {
        const int sb = sb0 + t + 1, slot = (t + 1) % NS;
        if (threadIdx.x < BM) cp_async16(s_base + OFF_M + slot * MT_BYTES + 16 * threadIdx.x, P.meta + (p.mt + 16 * sb));
#pragma unroll
        for (int i = 0; i < SCH; ++i) cp_async16(s_base + OFF_S + slot * ST_BYTES + p.sdst + 16 * i, P.xs + (p.xs + 64 * sb + 16 * i));
    }
    cp_commit();
}
// prologue group: meta + Q8Scale of stage 0 (slot 0)
MEMRA_DEVICE void load_meta0(uint32_t s_base, const Ptr& P, const Src& p, int sb0) {
    if (threadIdx.x < BM) cp_async16(s_base + OFF_M + 16 * threadIdx.x, P.meta + (p.mt + 16 * sb0));
#pragma unroll
    for (int i = 0; i < SCH; ++i) cp_async16(s_base + OFF_S + p.sdst + 16 * i, P.xs + (p.xs + 64 * sb0 + 16 * i));
    cp_commit();
}

extern __shared__ __align__(16) uint8_t smem[];

// the cooperative scalar pass of stage t: staged meta / Q8Scale (slot t % NS) -> float buffer t & 1
template <int JN, int J0>
MEMRA_DEVICE void row_pass(const uint4 m, uint8_t* f, int r) {
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
#if GT_FORM == 0
        reinterpret_cast<float2*>(f)[j * BM + p] = make_float2(dsc, -MAGF * dsc);
        const float2 nd = tf32_split(ndmm);
        float* rm = reinterpret_cast<float*>(f + 8 * BM * 8);
        rm[aperm(r, j)] = nd.x;
        rm[8 * BM + aperm(r, j)] = nd.y;
#else
        float* q = reinterpret_cast<float*>(f) + 3 * (j * BM + p);
        q[0] = dsc; q[1] = -MAGF * dsc; q[2] = ndmm;
#endif
    }
}
MEMRA_DEVICE void scalar_pass(int t_stage) {
    const int t = threadIdx.x, slot = t_stage % NS;
    uint8_t* f = smem + OFF_F + (t_stage & 1) * F_BYTES;
    {   // rows: thread t -> row t % BM, sub-blocks (t / BM) * 8 / RPT ..
        const int r = t % BM, part = t / BM;
        const uint4 m = *reinterpret_cast<const uint4*>(smem + OFF_M + slot * MT_BYTES + 16 * r);
        if (RPT == 1) row_pass<8, 0>(m, f, r);
        else if (RPT == 2) { if (part == 0) row_pass<4, 0>(m, f, r); else row_pass<4, 4>(m, f, r); }
        else { if (part == 0) row_pass<2, 0>(m, f, r); else if (part == 1) row_pass<2, 2>(m, f, r);
               else if (part == 2) row_pass<2, 4>(m, f, r); else row_pass<2, 6>(m, f, r); }
    }
    {   // columns: thread t -> column t % BN, k32 blocks (t / BN) * 8 / CPT ..
        constexpr int JC = 8 / CPT;
        const int c = t % BN, j0 = (t / BN) * JC;
        const Q8Scale* s = reinterpret_cast<const Q8Scale*>(smem + OFF_S + slot * ST_BYTES + 64 * c) + j0;
        uint8_t* fc = f + RS_BYTES;
#pragma unroll
        for (int jj = 0; jj < JC; ++jj) {
            const int j = j0 + jj;
            const Q8Scale v = s[jj];
            const float sx = v.d * (float)v.s;
#if GT_FORM == 0
            reinterpret_cast<float*>(fc)[j * BN + cperm(c)] = v.d;
            const float2 sp = tf32_split(sx);
            float* cm = reinterpret_cast<float*>(fc + 8 * BN * 4);
            cm[bperm(c, j)] = sp.x;
            cm[bperm(c, j) + 2] = sp.y;
#else
            reinterpret_cast<float2*>(fc)[j * BN + cperm(c)] = make_float2(v.d, sx);
#endif
        }
    }
}

// at the end of stage s (GT_PF: inside step 7, after its operands were loaded in step 6): stage s + 1's
// group landed and its scalars were written one stage ago; refill the slot of stage s with group s + NS
// (raw weights + x of s + NS, meta + Q8Scale of s + NS + 1) and write the scalars of s + 2 into s's buffer
template <bool GLU>
MEMRA_DEVICE void next_stage(uint32_t s_base, const Ptr& P, int s, int sb0, int nsb, int ob, int cb, int N, int K, int nb) {
    cp_wait<NS - 2>();
    __syncthreads();
    load_group(s_base, P, sources<GLU>(ob, cb, N, K, nb), s + NS, sb0, nsb);
#if GT_PASS == 7
    if (s + 2 < nsb) scalar_pass(s + 2);
#endif
}

// one k32 step's operands in registers (besides the raw A words)
struct Frag {
    uint32_t B[4][2];
#if GT_FORM == 0
    float rs[16];   // rows 2 mi + h: (dsc', -M dsc')
    float cs[8];    // columns 2 ni + e: dx
#else
    float rs[24];   // rows 2 mi + h: (dsc', -M dsc', ndmm)
    float cs[16];   // columns 2 ni + e: (dx, sx)
#endif
};
// lane-relative smem addresses (u32) of a stage: raw weights, activations, float buffer rows / columns
struct Addr { uint32_t w, x, r, c; };

MEMRA_DEVICE void load_raw(uint32_t (&raw)[4][4], uint32_t w, int jp) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(w + mi * 16 * WS + 32 * jp, raw[mi][0], raw[mi][1], raw[mi][2], raw[mi][3]);
}
MEMRA_DEVICE void load_b(Frag& F, const Addr& a, int j) {
#pragma unroll
    for (int np = 0; np < 2; ++np) ldsm4(a.x + np * 16 * TS + 32 * j, F.B[2 * np][0], F.B[2 * np][1], F.B[2 * np + 1][0], F.B[2 * np + 1][1]);
}
MEMRA_DEVICE void load_s(Frag& F, const Addr& a, int j) {
#if GT_FORM == 0
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float4 v = lds128(a.r + j * BM * 8 + 16 * q);
        F.rs[4 * q] = v.x; F.rs[4 * q + 1] = v.y; F.rs[4 * q + 2] = v.z; F.rs[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const float4 v = lds128(a.c + j * BN * 4 + 16 * q);
        F.cs[4 * q] = v.x; F.cs[4 * q + 1] = v.y; F.cs[4 * q + 2] = v.z; F.cs[4 * q + 3] = v.w;
    }
#else
#pragma unroll
    for (int q = 0; q < 6; ++q) {
        const float4 v = lds128(a.r + j * BM * 12 + 16 * q);
        F.rs[4 * q] = v.x; F.rs[4 * q + 1] = v.y; F.rs[4 * q + 2] = v.z; F.rs[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float4 v = lds128(a.c + j * BN * 8 + 16 * q);
        F.cs[4 * q] = v.x; F.cs[4 * q + 1] = v.y; F.cs[4 * q + 2] = v.z; F.cs[4 * q + 3] = v.w;
    }
#endif
}
MEMRA_DEVICE void load_frag(Frag& F, const Addr& a, int j) { load_b(F, a, j); load_s(F, a, j); }
// the IMMAs and float formula of one k32 step (hi: the high nibbles of the raw words)
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
#if GT_FORM == 0
                const float p = __fmaf_rn(__int_as_float(c[e]), F.rs[2 * rr], F.rs[2 * rr + 1]);
                acc[mi][ni][e] = __fmaf_rn(p, F.cs[cc], acc[mi][ni][e]);
#else
                const float p = __fmaf_rn(__int_as_float(c[e]), F.rs[3 * rr], F.rs[3 * rr + 1]);
                float a = __fmaf_rn(p, F.cs[2 * cc], acc[mi][ni][e]);
                acc[mi][ni][e] = __fmaf_rn(F.rs[3 * rr + 2], F.cs[2 * cc + 1], a);
#endif
            }
        }
    }
}

#if GT_FORM == 0
struct MinFrag { uint32_t ah[4][4], al[4][4]; uint32_t b[4][4]; };   // A hi / lo quads per mi; B (hi b0 b1, lo b0 b1) per ni
MEMRA_DEVICE uint4 lds128u(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
// lane addresses: rows (hi quads; lo quads + 8 BM * 4 bytes) of m tile mi at + 512 mi; columns of n tile ni at + 512 ni
MEMRA_DEVICE void load_min_b(MinFrag& M, uint32_t cm) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
        const uint4 v = lds128u(cm + 512 * ni);
        M.b[ni][0] = v.x; M.b[ni][1] = v.y; M.b[ni][2] = v.z; M.b[ni][3] = v.w;
    }
}
MEMRA_DEVICE void load_min_a(MinFrag& M, uint32_t rm, int mi) {
    const uint4 h = lds128u(rm + 512 * mi), l = lds128u(rm + 8 * BM * 4 + 512 * mi);
    M.ah[mi][0] = h.x; M.ah[mi][1] = h.y; M.ah[mi][2] = h.z; M.ah[mi][3] = h.w;
    M.al[mi][0] = l.x; M.al[mi][1] = l.y; M.al[mi][2] = l.z; M.al[mi][3] = l.w;
}
// acc += (hi + lo)(ndmm) (hi + lo)(sx) - lo lo: the stage's min term, 3xTF32, m tiles m0 .. m1 - 1
MEMRA_DEVICE void min_term(float (&acc)[4][4][4], const MinFrag& M, int m0 = 0, int m1 = 4) {
#pragma unroll
    for (int mi = m0; mi < m1; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const uint32_t* a = M.ah[mi];
            const uint32_t* l = M.al[mi];
            const uint32_t* b = M.b[ni];
            mma_tf32(acc[mi][ni], l[0], l[1], l[2], l[3], b[0], b[1]);   // lo hi
            mma_tf32(acc[mi][ni], a[0], a[1], a[2], a[3], b[2], b[3]);   // hi lo
            mma_tf32(acc[mi][ni], a[0], a[1], a[2], a[3], b[0], b[1]);   // hi hi
        }
}
#endif

template <bool GLU>
MEMRA_DEVICE void gemm_tile2_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                  const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                                  float* __restrict__ y, int N, int K, int nb, int ks) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, tig = lane & 3;
    const int ob = blockIdx.x * (GLU ? BM / 2 : BM), cb = blockIdx.y * BN;
    const int nsb = K / 256 / ks, sb0 = blockIdx.z * nsb;
    const uint32_t s_base = smem_u32(smem);
    const Src src = sources<GLU>(ob, cb, N, K, nb);
    const Ptr P{bulk, meta, xq, reinterpret_cast<const uint8_t*>(xs)};
    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

    // prologue: groups P (meta 0), 0 .. NS-2; passes of stages 0 and 1; group NS-1
    load_meta0(s_base, P, src, sb0);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) load_group(s_base, P, src, s, sb0, nsb);
    cp_wait<NS - 2>();
    __syncthreads();
    scalar_pass(0);
    if (GT_PASS == 7 && nsb > 1) scalar_pass(1);
    __syncthreads();
    load_group(s_base, P, src, NS - 1, sb0, nsb);

    // lane addresses inside a slot / float buffer (ldmatrix.x4: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31))
    const uint32_t a_off = (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + 16 * (lane >> 4);
    const uint32_t b_off = (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1);
    const uint32_t r_off = (wm * 64 + 8 * g) * (GT_FORM ? 12 : 8);
    const uint32_t c_off = RS_BYTES + (wn * 32 + 8 * tig) * (GT_FORM ? 8 : 4);
    const uint32_t rm_off = 8 * BM * 8 + (wm * 4 * 32 + lane) * 16;            // GT_FORM 0: min-term A quads
    const uint32_t cm_off = RS_BYTES + 8 * BN * 4 + (wn * 4 * 32 + lane) * 16; // and B quads
    auto addr = [&](int s) {
        Addr a;
        a.w = s_base + OFF_W + (s % NS) * WT_BYTES + a_off;
        a.x = s_base + OFF_X + (s % NS) * XT_BYTES + b_off;
        a.r = s_base + OFF_F + (s & 1) * F_BYTES + r_off;
        a.c = s_base + OFF_F + (s & 1) * F_BYTES + c_off;
        return a;
    };

    Addr ac = addr(0);
    uint32_t rawc[4][4], rawn[4][4];
    Frag fc, fn;
#if GT_PF
    load_raw(rawc, ac.w, 0);
    load_frag(fc, ac, 0);
#endif
    for (int s = 0; s < nsb; ++s) {
#if GT_FORM == 0
        MinFrag mf;
#endif
#pragma unroll GT_PU
        for (int jp = 0; jp < 4; ++jp)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int j = 2 * jp + hi;
#if GT_PF
            // GT_PF 2: step 7's scalars before the barrier (next_stage's pass overwrites this stage's buffer)
            if (GT_PF == 2) load_s(fc, ac, j);
            if (j == 7) next_stage<GLU>(s_base, P, s, sb0, nsb, ob, cb, N, K, nb);   // before step 0 of s + 1 is prefetched
#endif
#if GT_PF
            if (j < 7) {
                if (j & 1) load_raw(rawn, ac.w, (j + 1) >> 1);
                if (GT_PF == 1) load_frag(fn, ac, j + 1); else load_b(fn, ac, j + 1);
            } else if (s + 1 < nsb) {
                const Addr an = addr(s + 1);
                load_raw(rawn, an.w, 0);
                if (GT_PF == 1) load_frag(fn, an, 0); else load_b(fn, an, 0);
            }
#else
            if (!(j & 1)) load_raw(rawc, ac.w, j >> 1);
            load_frag(fc, ac, j);
#endif
#if GT_FORM == 0 && GT_PU == 4 && GT_MINS == 1
            if (j == 0) load_min_b(mf, s_base + OFF_F + (s & 1) * F_BYTES + cm_off);
            if (j < 4) load_min_a(mf, s_base + OFF_F + (s & 1) * F_BYTES + rm_off, j);
#elif GT_FORM == 0 && GT_MINS == 0
            if (j == 0) {
                load_min_b(mf, s_base + OFF_F + (s & 1) * F_BYTES + cm_off);
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) load_min_a(mf, s_base + OFF_F + (s & 1) * F_BYTES + rm_off, mi);
            }
#endif
#if GT_PASS < 7
            if (j == GT_PASS && s + 1 < nsb) scalar_pass(s + 1);
#endif
            compute(acc, rawc, fc, hi);
#if GT_FORM == 0 && GT_PU == 4 && GT_MINS == 1
            if (j < 4) min_term(acc, mf, j, j + 1);
#elif GT_FORM == 0 && GT_MINS == 0
            if (j == 0) min_term(acc, mf);
#elif GT_FORM == 0   // GT_MINS 2: after step 0, each m tile's fragments loaded right before its HMMAs
            if (j == 0) {
                load_min_b(mf, s_base + OFF_F + (s & 1) * F_BYTES + cm_off);
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    load_min_a(mf, s_base + OFF_F + (s & 1) * F_BYTES + rm_off, mi);
                    min_term(acc, mf, mi, mi + 1);
                }
            }
#endif
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
        next_stage<GLU>(s_base, P, s, sb0, nsb, ob, cb, N, K, nb);   // after step 7 read its fragments
#endif
        ac = addr(s + 1);
    }
    (void)rawn; (void)fn;

    if (ks > 1) {   // split-K (GT_FORM 0 only): raw partials to y = ws[z][col][weight row]
        const int rows = GLU ? 2 * N : N;
        float* part = y + (size_t)blockIdx.z * nb * rows;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1);
                if (col >= nb) continue;
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
                    part[(size_t)col * rows + wrow<GLU>(wm * 64 + 16 * mi + 8 * (e >> 1) + g, ob, N)] = acc[mi][ni][e];
            }
        return;
    }
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = cb + wn * 32 + ni * 8 + 2 * tig + (e & 1);
            if (col >= nb) continue;
            if (GLU) {
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    const int row = ob + wm * 32 + 16 * mi + 8 * (e >> 1) + g;
                    y[(size_t)col * N + row] = silu_f32(acc[mi][ni][e]) * acc[mi + 2][ni][e];
                }
            } else {
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    const int row = ob + wm * 64 + 16 * mi + 8 * (e >> 1) + g;
                    y[(size_t)col * N + row] = acc[mi][ni][e];
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
          const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    gemm_tile2_body<false>(bulk, meta, xq, xs, y, N, K, nb, ks);
}

extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
              const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    gemm_tile2_body<true>(bulk, meta, xq, xs, y, N, K, nb, ks);
}

// split-K reduction (as gemm_tile): y[b, n] = sum over z in increasing order of ws[z][b][n] (glu: gate
// and up, then silu(gate) * up)
extern "C" __global__ void gemm_tile_reduce(const float* __restrict__ ws, float* __restrict__ y, int N, int nb,
                                            int ks, int glu) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * nb) return;
    const int b = i / N, n = i - b * N;
    const int rows = glu ? 2 * N : N;
    const size_t zs = (size_t)nb * rows;
    const float* p = ws + (size_t)b * rows + n;
    float a = p[0];
    for (int z = 1; z < ks; ++z) a = __fadd_rn(a, p[z * zs]);
    if (glu) {
        float u = p[N];
        for (int z = 1; z < ks; ++z) u = __fadd_rn(u, p[z * zs + N]);
        a = silu_f32(a) * u;
    }
    y[i] = a;
}
