// gemm_tile2_q40.cu — experiments/gemm_tile2's pipelined tensor-core GEMM for Q4_0 (GT_QT 2) and Q8_0
// (GT_QT 8) weights x q8 activations (README.md here). One source, the type chosen by GT_QT.
//
// W in memra's planes layout (memra/gpu/ops/matvec.py pack_planes): bulk = the quant bytes of each
// row (Q4_0: 16 a block of 32, K / 2 a row; Q8_0: 32 a block, K a row), meta = the f16 d of each block
// (2 a block, K / 16 a row: 16 bytes a row and 256-k stage for both types). x as q8 (int8 per value,
// Q8Scale {d, s} per 32, memra's quantize_q8). y[b, n] (glu: silu(gate) * up; plain: W x).
//
// A fragments (mma.m16n8k32.row.col.s32.s8.s8; a0 row g k 4 tig.., a1 row g + 8, a2 row g k 16 + 4 tig..,
// a3 row g + 8 k 16 + ..), built in registers from the RAW bytes staged by cp.async:
//  - Q8_0: the int8 bytes ARE the fragment bytes: one ldmatrix.x4 per m tile and k32 block at byte 32 j
//    of the raw tile (lanes: row (lane & 7) + 8 ((lane >> 3) & 1), byte 16 (lane >> 4)): a0..a3 directly.
//  - Q4_0: byte l of a block holds element l (low nibble) and element l + 16 (high nibble), so the word
//    of row g at bytes 4 tig.. of the block gives a0 (its low nibbles: k 4 tig..) AND a2 (its high
//    nibbles: k 16 + 4 tig..); the row g + 8 word gives a1 and a3. One ldmatrix.x2 per m tile and block
//    (rows 0-7 | 8-15 of the 16 bytes at byte 16 j). The -8 offset goes into the fragment as
//    16 (q - 8) = (16 q) ^ 0x80 per byte (exact s8): hi(w) = (w & 0xF0F0F0F0) ^ 0x80808080 (one LOP3),
//    lo(w) = ((w << 4) & 0xF0F0F0F0) ^ 0x80808080 (SHF + LOP3); the factor 16 is compensated by d / 16
//    in the row scalar (a power of two: exact).
// Formula, per output and k32 block i (both GT_FORMs; Q4_0's I' = 16 I, d' = d / 16; Q8_0 I' = I, d' = d):
//        p = fma(M + I', d', -M d') = fl(I d);  acc = fma(p, dx, acc)
// with the IMMA accumulating from the bits of M = 12582912.0f (|I'| <= 2^19 (Q4_0) / 520,192 (Q8_0) < 2^22:
// M + I' exact). GT_FORM 1 = the exact chain: the blocks in increasing k into one accumulator per output,
// no split-K (the host refuses ks > 1), so outputs do not depend on batch size, tile position or grid.
// GT_FORM 0 = the free order: the same per-block arithmetic (it is already the shortest: 2 FFMA an output
// and k32) but split-K allowed (grid.z parts, raw partials, gemm_tile_reduce adds them in z order).
// The device code of the two forms is identical; GT_FORM only names the host contract.
//
// Pipeline as gemm_tile2: ring group t = {raw W + x of stage t (slot t % NS), meta + Q8Scale of t + 1
// (slot (t + 1) % NS)}; a cooperative scalar pass turns a stage's meta / Q8Scale into floats (d', -M d'
// per row and block; dx per column and block) one stage ahead (double-buffered); each k32 step loads the
// next step's raw A words, B fragments (and with GT_PF 1 the scalars) before its own IMMAs.
// Tile: a block = GT_WM x GT_WN warps, a warp 64 weight rows x 32 columns (4 m16 x 4 n8); glu: m tiles
// 0, 1 gate rows, 2, 3 the up rows of the same 32 outputs. Contract (host): K % (256 ks) == 0,
// N % (glu ? BM / 2 : BM) == 0, GT_WN >= 2, any nb.
#include "common.cuh"
#include "q8.cuh"

#ifndef GT_QT
#define GT_QT 2
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
#ifndef GT_FORM
#define GT_FORM 0
#endif
// GT_PF 1: the next step's raw A words, B and scalars loaded before the current step's IMMAs; 2: only
// the IMMA operands one step ahead, the scalars at the start of their own step; 0: no prefetch
#ifndef GT_PF
#define GT_PF 1
#endif
// GT_SU: unroll of the 8-step k32 loop of a stage (8 = full, 2 = pairs, 1 = rolled)
#ifndef GT_SU
#define GT_SU 2
#endif
// GT_PFB 1: the prefetch of step j + 1 / the next stage's step 0 without a branch (addresses selected)
#ifndef GT_PFB
#define GT_PFB 1
#endif
#ifndef GT_XROT
#define GT_XROT 1
#endif
#ifndef GT_SRCV
#define GT_SRCV 1
#endif
// GT_PASS: the step of stage s in which the scalar pass of s + 1 runs (0 .. 6), or 7: the pass of s + 2
// right after the refill barrier inside step 7
#ifndef GT_PASS
#define GT_PASS 7
#endif
#ifndef GT_MINB
#define GT_MINB 1
#endif

static_assert(GT_QT == 2 || GT_QT == 8, "GT_QT: 2 (Q4_0) or 8 (Q8_0)");
constexpr bool Q4 = GT_QT == 2;
constexpr int WM = GT_WM, WN = GT_WN, NS = GT_STAGES;
constexpr int NT = 32 * WM * WN;
constexpr int BM = 64 * WM, BN = 32 * WN;
constexpr int RB = Q4 ? 128 : 256;        // raw weight bytes of a row and stage
constexpr int CPR = RB / 16;              // cp.async chunks a row
constexpr int WS = RB + 16;               // raw tile row stride (+16: conflict-free ldmatrix)
constexpr int TS = 272;                   // activation tile column stride
constexpr int RAWN = Q4 ? 2 : 4;          // raw A words a lane holds per m tile and step
constexpr int WT_BYTES = BM * WS, XT_BYTES = BN * TS, MT_BYTES = BM * 16, ST_BYTES = BN * 64;
// float area, one buffer: rows [8][BM] float2 (d', -M d') at rperm; columns [8][BN] float dx at cperm
constexpr int RS_BYTES = 8 * BM * 8;
constexpr int CS_BYTES = 8 * BN * 4;
constexpr int OFF_W = 0;
constexpr int OFF_X = OFF_W + NS * WT_BYTES;
constexpr int OFF_M = OFF_X + NS * XT_BYTES;
constexpr int OFF_S = OFF_M + NS * MT_BYTES;
constexpr int OFF_F = OFF_S + NS * ST_BYTES;
constexpr int F_BYTES = RS_BYTES + CS_BYTES;
constexpr int SMEM_TOTAL = OFF_F + 2 * F_BYTES;   // = the host's smem_bytes()
static_assert(SMEM_TOTAL <= 232448, "shared memory");
static_assert(WN >= 2 && NS >= 2, "GT_WN >= 2 (row pass: NT >= BM), GT_STAGES >= 2");

constexpr int WCH = BM * CPR / NT;        // raw weights: CPR chunks a row
constexpr int XCH = BN * 16 / NT;         // activations: 16 a column
constexpr int SCH = BN * 4 / NT;          // Q8Scale: 4 a column
static_assert(BM * CPR % NT == 0 && BN * 16 % NT == 0 && BN * 4 % NT == 0 && CPR % WCH == 0 && 16 % XCH == 0 &&
              4 % SCH == 0 && SCH >= 1 && WCH >= 1, "loader shares");
constexpr int RPT = NT / BM, CPT = NT / BN;
static_assert(8 % RPT == 0 && 8 % CPT == 0, "scalar pass shares");
constexpr float MAGF = 12582912.0f;
constexpr int MAGIC = 0x4B400000;
constexpr float DSCALE = Q4 ? 0.0625f : 1.0f;

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
MEMRA_DEVICE void ldsm2(uint32_t a, uint32_t& r0, uint32_t& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a));
}
MEMRA_DEVICE float4 lds128(uint32_t a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
// c = A B + M (the magic bias), A and B signed 8-bit
MEMRA_DEVICE void mma_s8s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC));
}
// Q4_0 nibbles -> 16 (q - 8) per byte (s8): (16 q) ^ 0x80
MEMRA_DEVICE uint32_t q4_hi(uint32_t w) { return (w & 0xF0F0F0F0u) ^ 0x80808080u; }
MEMRA_DEVICE uint32_t q4_lo(uint32_t w) { return ((w << 4) & 0xF0F0F0F0u) ^ 0x80808080u; }

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
template <bool GLU>
MEMRA_DEVICE int wrow(int r, int ob, int N) {
    if (!GLU) return ob + r;
    const int w = r >> 6, l = r & 63;
    return (l < 32 ? 0 : N) + ob + 32 * w + (l & 31);
}

struct Src {
    uint32_t wq, wdst, wrot;   // raw weights: row (WCH t) / CPR, chunks (WCH t) % CPR .. (rotated: Q8_0, WCH 8)
    uint32_t xq, xdst, xrot;   // activations: column (XCH t) / 16, chunks (XCH t) % 16 ..
    uint32_t mt;               // meta: row t (threads < BM), 16 B
    uint32_t xs, sdst;         // Q8Scale: column (SCH t) / 4, chunks (SCH t) % 4 ..
};
struct Ptr { const uint8_t* bulk; const uint8_t* meta; const int8_t* xq; const uint8_t* xs; };
MEMRA_DEVICE int tid_v() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
template <bool GLU>
MEMRA_DEVICE Src sources(int ob, int cb, int N, int K, int nb) {
    const int t = GT_SRCV ? tid_v() : (int)threadIdx.x;
    Src p;
    const int r = (WCH * t) / CPR, part = (WCH * t) % CPR;
    p.wq = (uint32_t)wrow<GLU>(r, ob, N) * (uint32_t)(K / 256 * RB) + 16 * part;
    p.wdst = r * WS + 16 * part;
    // 16-chunk rows split over two threads (Q8_0 weights, the activations): lanes 2c, 2c + 1 would put
    // chunks i and 8 + i of row c on one 16-byte bank slot; the second thread's chunks rotated by 4
    p.wrot = (GT_XROT && CPR == 16 && WCH == 8) ? 64 * (t & 1) : 0;
    const int xcol = (XCH * t) >> 4, xpart = (XCH * t) & 15;
    p.xq = (uint32_t)min(cb + xcol, nb - 1) * K + 16 * xpart;
    p.xdst = xcol * TS + 16 * xpart;
    p.xrot = (GT_XROT && XCH == 8) ? 64 * (t & 1) : 0;
    p.mt = (uint32_t)wrow<GLU>(t < BM ? t : 0, ob, N) * (K / 16);
    const int scol = (SCH * t) >> 2, spart = (SCH * t) & 3;
    p.xs = (uint32_t)min(cb + scol, nb - 1) * (K / 32) * 8 + 16 * spart;
    p.sdst = scol * 64 + 16 * spart;
    return p;
}
MEMRA_DEVICE void load_group(uint32_t s_base, const Ptr& P, const Src& p, int t, int sb0, int nsb) {
    if (t < nsb) {
        const int sb = sb0 + t, slot = t % NS;
#pragma unroll
        for (int i = 0; i < WCH; ++i) {
            const int wr = (WCH == 8 && CPR == 16 && i >= 4) ? -(int)p.wrot : (int)p.wrot;
            cp_async16(s_base + OFF_W + slot * WT_BYTES + (p.wdst + wr) + 16 * i, P.bulk + (p.wq + RB * sb + wr + 16 * i));
        }
#pragma unroll
        for (int i = 0; i < XCH; ++i) {
            const int xr = (XCH == 8 && i >= 4) ? -(int)p.xrot : (int)p.xrot;
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
MEMRA_DEVICE void load_meta0(uint32_t s_base, const Ptr& P, const Src& p, int sb0) {
    if (threadIdx.x < BM) cp_async16(s_base + OFF_M + 16 * threadIdx.x, P.meta + (p.mt + 16 * sb0));
#pragma unroll
    for (int i = 0; i < SCH; ++i) cp_async16(s_base + OFF_S + p.sdst + 16 * i, P.xs + (p.xs + 64 * sb0 + 16 * i));
    cp_commit();
}

extern __shared__ __align__(16) uint8_t smem[];

// the cooperative scalar pass of stage t: staged meta (8 f16 d a row) / Q8Scale (slot t % NS) -> float
// buffer t & 1: rows (d', -M d'), columns dx
MEMRA_DEVICE void scalar_pass(int t_stage) {
    const int t = threadIdx.x, slot = t_stage % NS;
    uint8_t* f = smem + OFF_F + (t_stage & 1) * F_BYTES;
    {
        constexpr int JR = 8 / RPT;
        const int r = t % BM, j0 = (t / BM) * JR, p = rperm(r);
        const uint16_t* m = reinterpret_cast<const uint16_t*>(smem + OFF_M + slot * MT_BYTES + 16 * r) + j0;
#pragma unroll
        for (int jj = 0; jj < JR; ++jj) {
            const float d = f16_to_f32(m[jj]) * DSCALE;   // exact
            reinterpret_cast<float2*>(f)[(j0 + jj) * BM + p] = make_float2(d, -MAGF * d);
        }
    }
    {
        constexpr int JC = 8 / CPT;
        const int c = t % BN, j0 = (t / BN) * JC;
        const Q8Scale* s = reinterpret_cast<const Q8Scale*>(smem + OFF_S + slot * ST_BYTES + 64 * c) + j0;
#pragma unroll
        for (int jj = 0; jj < JC; ++jj) reinterpret_cast<float*>(f + RS_BYTES)[(j0 + jj) * BN + cperm(c)] = s[jj].d;
    }
}

template <bool GLU>
MEMRA_DEVICE void next_stage(uint32_t s_base, const Ptr& P, int s, int sb0, int nsb, int ob, int cb, int N, int K, int nb) {
    cp_wait<NS - 2>();
    __syncthreads();
    load_group(s_base, P, sources<GLU>(ob, cb, N, K, nb), s + NS, sb0, nsb);
#if GT_PASS == 7
    if (s + 2 < nsb) scalar_pass(s + 2);
#endif
}

struct Frag {
    uint32_t B[4][2];
    float rs[16];   // rows 2 mi + h: (d', -M d')
    float cs[8];    // columns 2 ni + e: dx
};
struct Addr { uint32_t w, x, r, c; };

// a step's raw A words: Q4_0 ldmatrix.x2 (rows 0-7 | 8-15, 16 bytes of block j); Q8_0 ldmatrix.x4
MEMRA_DEVICE void load_raw(uint32_t (&raw)[4][RAWN], uint32_t w, int j) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        if constexpr (Q4) ldsm2(w + mi * 16 * WS + 16 * j, raw[mi][0], raw[mi][1]);
        else ldsm4(w + mi * 16 * WS + 32 * j, raw[mi][0], raw[mi][1], raw[mi][2], raw[mi][3]);
    }
}
MEMRA_DEVICE void load_b(Frag& F, const Addr& a, int j) {
#pragma unroll
    for (int np = 0; np < 2; ++np) ldsm4(a.x + np * 16 * TS + 32 * j, F.B[2 * np][0], F.B[2 * np][1], F.B[2 * np + 1][0], F.B[2 * np + 1][1]);
}
MEMRA_DEVICE void load_s(Frag& F, const Addr& a, int j) {
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
}
MEMRA_DEVICE void load_frag(Frag& F, const Addr& a, int j) { load_b(F, a, j); load_s(F, a, j); }
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

template <bool GLU>
MEMRA_DEVICE void body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
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

    load_meta0(s_base, P, src, sb0);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) load_group(s_base, P, src, s, sb0, nsb);
    cp_wait<NS - 2>();
    __syncthreads();
    scalar_pass(0);
    if (GT_PASS == 7 && nsb > 1) scalar_pass(1);
    __syncthreads();
    load_group(s_base, P, src, NS - 1, sb0, nsb);

    // ldmatrix lanes: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31); .x2 uses lanes 0-15 (bytes 0-15)
    const uint32_t a_off = (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + (Q4 ? 0 : 16 * (lane >> 4));
    const uint32_t b_off = (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1);
    const uint32_t r_off = (wm * 64 + 8 * g) * 8;
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
            if (j == 7) next_stage<GLU>(s_base, P, s, sb0, nsb, ob, cb, N, K, nb);
#if GT_PFB
            {   // branch-free: step j + 1 of this stage or step 0 of the next (at the last stage: stale
                // smem, never used; race-free, see model_q40)
                const Addr an = j < 7 ? ac : addr(s + 1);
                const int jn = j < 7 ? j + 1 : 0;
                load_raw(rawn, an.w, jn);
                if (GT_PF == 1) load_frag(fn, an, jn); else load_b(fn, an, jn);
            }
#else
            if (j < 7) {
                load_raw(rawn, ac.w, j + 1);
                if (GT_PF == 1) load_frag(fn, ac, j + 1); else load_b(fn, ac, j + 1);
            } else if (s + 1 < nsb) {
                const Addr an = addr(s + 1);
                load_raw(rawn, an.w, 0);
                if (GT_PF == 1) load_frag(fn, an, 0); else load_b(fn, an, 0);
            }
#endif
#else
            load_raw(rawc, ac.w, j);
            load_frag(fc, ac, j);
#endif
#if GT_PASS < 7
            if (j == GT_PASS && s + 1 < nsb) scalar_pass(s + 1);
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
        next_stage<GLU>(s_base, P, s, sb0, nsb, ob, cb, N, K, nb);
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

#if GT_QT == 2
#define GT_NAME(s) gemm_q40##s
#else
#define GT_NAME(s) gemm_q80##s
#endif
extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
GT_NAME()(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
          const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    body<false>(bulk, meta, xq, xs, y, N, K, nb, ks);
}
extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
GT_NAME(_glu)(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
              const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    body<true>(bulk, meta, xq, xs, y, N, K, nb, ks);
}

// split-K reduction: y[b, n] = sum over z in increasing order of ws[z][b][n] (glu: gate and up, then
// silu(gate) * up)
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
