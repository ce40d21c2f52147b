// gemm_tile.cu — a free-order Q4_K x q8 GEMM prototype (experiments/gemm_tile/README.md).
//
// y[b, n] = sum_k W[n, k] x[b, k] on memra's inputs as they are: W in the planes layout
// (memra/gpu/ops/matvec.py pack_planes: per row a bulk plane of the Q4_K quant bytes, 128 per
// super-block of 256, and a meta plane of the 16 scale bytes d | dmin | scales[12] per
// super-block), x as q8 (kernels/q8.cuh: int8 per value, {d, s} per 32). NOT bit-identical to
// memra's matvec: each output sums its k32 blocks in increasing k, one float chain per output,
// independent of the batch size, the tile configuration's column position and the grid.
//
// Math, per output (n, b) and k32 block i (sub-block j = i % 8 of super-block i / 8):
//   w = d sc_j q - dmin m_j (q in 0..15),  x = dx_i qx
//   sum_32 w x = dx_i (d sc_j I - dmin m_j S_i),  I = sum q qx (one m16n8k32 IMMA), S_i = sum qx
//   acc = fma(fl(float(I) * dsc), dx, acc);  acc = fma(ndmm, sx, acc)
// with the row scalars dsc = d sc_j, ndmm = -(dmin m_j) computed once per row and stage (256 k)
// and the column scalars dx, sx = dx S_i once per column and stage: 4 float ops per output
// and k32 (I2F, FMUL, 2 FFMA), 16 per IMMA.
//
// Tile: a block = GT_WM x GT_WN warps; a warp owns 64 weight rows x 32 columns (4 m16 x 4 n8
// tiles, 64 float accumulators a thread); BM = 64 GT_WM weight rows, BN = 32 GT_WN columns.
// K advances one super-block (256) a stage, one __syncthreads a stage:
//   weights: global -> registers one stage ahead (LDG.128 of the raw nibbles and meta), unpacked
//            into a double-buffered int8 tile (row stride 272 B: conflict-free ldmatrix) with
//            the row scalars (float2 per row and sub-block, permuted so a lane's 8 rows are 64
//            contiguous bytes);
//   activations: int8 by cp.async, GT_STAGES deep (column stride 272 B); their scales through
//            registers one stage ahead, converted to (dx, dx S) floats (permuted likewise).
// glu (gemm_tile_glu): a warp's m tiles 0, 1 are gate rows and 2, 3 the up rows of the same 32
// outputs, so the epilogue y = silu(gate) * up is thread-local. Plain (gemm_tile): 64 rows.
// Split-K (ks > 1, grid.z = ks; the host picks ks per shape, never per batch size): block z sums
// super-blocks [z K/256/ks, (z+1) K/256/ks) and writes its raw partials to y = a workspace
// [ks][nb][weight rows]; gemm_tile_reduce adds them in z order (then the glu). Deterministic.
// Contract (host checks): K % (256 ks) == 0, N % (glu ? BM / 2 : BM) == 0; any nb (columns past nb
// read column nb - 1 and are not written).
#include "common.cuh"
#include "q8.cuh"

#ifndef GT_WM
#define GT_WM 2
#endif
#ifndef GT_WN
#define GT_WN 4
#endif
#ifndef GT_STAGES
#define GT_STAGES 3
#endif
#ifndef GT_JUNROLL
#define GT_JUNROLL 1
#endif
#ifndef GT_MINTC
#define GT_MINTC 0
#endif
#ifndef GT_MAGIC
#define GT_MAGIC 0
#endif
#if GT_MAGIC && !GT_MINTC
#error "GT_MAGIC needs GT_MINTC"
#endif
#ifndef GT_MINB
#define GT_MINB 1
#endif
// GT_ABL (timing ablations only, wrong results; prof.py): bit 0 no weight staging in the K loop
// (stage 0's tile reused), bit 1 no float formula (the IMMAs accumulate the int sums in place;
// no FFMA, no min-term HMMA), bit 2 no activation copies in the K loop
#ifndef GT_ABL
#define GT_ABL 0
#endif

constexpr int WM = GT_WM, WN = GT_WN, NS = GT_STAGES;
constexpr int NT = 32 * WM * WN;          // threads
constexpr int BM = 64 * WM, BN = 32 * WN; // weight rows, columns of a block
constexpr int TS = 272;                   // smem row stride (bytes) of the int8 tiles
constexpr int WT_BYTES = BM * TS;         // one unpacked weight tile
// row scalars: [8 sub-blocks][BM] float2 (dsc, ndmm); GT_MINTC: [8][BM] float dsc, then [8][BM]
// float2 (hi, lo) of ndmm. Column scalars: [8][BN] float2 (dx, sx); GT_MINTC: [8][BN] float dx,
// then [8][BN] float2 (hi, lo) of sx
// GT_MAGIC: the first array is [8][BM] float2 (dsc, -12582912 dsc)
constexpr int RS_BYTES = 8 * BM * (GT_MAGIC ? 16 : GT_MINTC ? 12 : 8);
constexpr int CS_BYTES = 8 * BN * (GT_MINTC ? 12 : 8);
constexpr int XT_BYTES = BN * TS;         // one activation stage
// dynamic shared memory: 2 x (weight tile, row scalars, column scalars), NS activation stages
constexpr int OFF_W = 0;
constexpr int OFF_RS = OFF_W + 2 * WT_BYTES;
constexpr int OFF_CS = OFF_RS + 2 * RS_BYTES;
constexpr int OFF_X = OFF_CS + 2 * CS_BYTES;
constexpr int SMEM_TOTAL = OFF_X + NS * XT_BYTES;   // = the host's smem_bytes()
static_assert(SMEM_TOTAL <= 232448, "shared memory");
static_assert(WN >= 2, "meta loads need NT >= BM");

// per-thread shares of a stage's loads
constexpr int WCH = BM * 8 / NT;          // 16-byte raw weight chunks (8 a row)
constexpr int XCH = BN * 16 / NT;         // 16-byte activation chunks (16 a column)
constexpr int SCH = BN * 4 / NT;          // 16-byte activation scale pairs (4 a column)
static_assert(BM * 8 % NT == 0 && BN * 16 % NT == 0 && 8 % WCH == 0 && 16 % XCH == 0, "loader shares");
static_assert(BN * 4 >= NT ? BN * 4 % NT == 0 && 4 % SCH == 0 : true, "scale share");
constexpr int SCH1 = SCH > 0 ? SCH : 1;

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
MEMRA_DEVICE void mma_s8_acc(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int c0 = __float_as_int(d[0]), c1 = __float_as_int(d[1]), c2 = __float_as_int(d[2]), c3 = __float_as_int(d[3]);
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(c0), "+r"(c1), "+r"(c2), "+r"(c3)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    d[0] = __int_as_float(c0); d[1] = __int_as_float(c1); d[2] = __int_as_float(c2); d[3] = __int_as_float(c3);
}
MEMRA_DEVICE void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c0 = 0) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
}
// GT_MAGIC: the IMMA starts from C = 0x4B400000 (12582912.0f), so its int32 result I + 0x4B400000
// read as a float is 12582912 + I exactly (|I| <= 32 * 15 * 128 < 2^22), and
// fma(12582912 + I, dsc, -12582912 dsc) = fl(I dsc): the same bits as fl(float(I) * dsc) (the product
// is exact in the FFMA and -12582912 dsc = -3 * 2^22 dsc is exact: dsc = d sc has <= 17 significant
// bits), one FFMA instead of I2F + FMUL.
constexpr int MAGIC = 0x4B400000;
// d += a b, m16n8k8 tf32 (fp32 accumulate): the min term of GT_MINTC
MEMRA_DEVICE void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// x = hi + lo with hi a tf32 (round to nearest, ties away) and lo = x - hi exact: the 3xTF32 split
MEMRA_DEVICE float2 tf32_split(float x) {
    uint32_t h;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(x));
    const float hi = __uint_as_float(h);
    return make_float2(hi, x - hi);
}
MEMRA_DEVICE uint4 ldg16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
MEMRA_DEVICE uint32_t bsel(const uint4& v, int i) {   // byte i (constant after unrolling)
    const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (w >> (8 * (i & 3))) & 0xFFu;
}

// smem position of weight-tile row r's scalars: a warp's 64 rows r = 16 mi + 8 h + g go to
// 8 g + 2 mi + h, so a lane (g) reads its 8 rows as 64 contiguous bytes
MEMRA_DEVICE int rperm(int r) {
    const int w = r >> 6, l = r & 63;
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1);
}
// column c = 8 ni + 2 tig + e of a warp's 32 -> 8 tig + 2 ni + e
MEMRA_DEVICE int cperm(int c) {
    const int w = c >> 5, l = c & 31;
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1);
}

// weight row of tile row r (block's first output ob)
template <bool GLU>
MEMRA_DEVICE int wrow(int r, int ob, int N) {
    if (!GLU) return ob + r;
    const int w = r >> 6, l = r & 63;
    return (l < 32 ? 0 : N) + ob + 32 * w + (l & 31);
}

struct WRegs {
    uint4 q[WCH];      // raw nibble chunks
    uint4 m;           // the meta of one row (threads < BM)
    uint4 s[SCH1];     // activation scale pairs
};

// a thread's global sources at super-block 0 (each loader thread: one weight row's contiguous
// chunks, one row's meta, one column's scale pairs and int8 chunks), computed once
struct Src {
    const uint8_t* wq;   // bulk: row (WCH t) / 8, chunk (WCH t) % 8
    const uint8_t* wm;   // meta: row t (threads < BM)
    const uint8_t* xsp;  // scales: column (SCH1 t) / 4, pair (SCH1 t) % 4
    const int8_t* xqp;   // int8: column (XCH t) / 16, chunk (XCH t) % 16
    uint32_t xdst;       // its smem offset in a stage
};
template <bool GLU>
MEMRA_DEVICE Src sources(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
                         const Q8Scale* __restrict__ xs, int ob, int cb, int N, int K, int nb) {
    const int t = threadIdx.x;
    Src p;
    const int r = (WCH * t) >> 3, part = (WCH * t) & 7;
    p.wq = bulk + (size_t)wrow<GLU>(r, ob, N) * (K / 2) + 16 * part;
    p.wm = meta + (size_t)wrow<GLU>(t < BM ? t : 0, ob, N) * (K / 16);
    const int c = SCH1 * t, scol = min(cb + min(c >> 2, BN - 1), nb - 1);
    p.xsp = reinterpret_cast<const uint8_t*>(xs + (size_t)scol * (K / 32) + (c & 3) * 2);
    const int xcol = (XCH * t) >> 4, xpart = (XCH * t) & 15;
    p.xqp = xq + (size_t)min(cb + xcol, nb - 1) * K + 16 * xpart;
    p.xdst = xcol * TS + 16 * xpart;
    return p;
}

MEMRA_DEVICE void load_w(WRegs& R, const Src& p, int sb) {
    const int t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < WCH; ++i) R.q[i] = ldg16(p.wq + 128 * sb + 16 * i);
    if (t < BM) R.m = ldg16(p.wm + 16 * sb);
    if (SCH > 0 || t < BN * 4) {
#pragma unroll
        for (int i = 0; i < SCH1; ++i) R.s[i] = ldg16(p.xsp + 64 * sb + 16 * i);
    }
}

MEMRA_DEVICE void store_w(const WRegs& R, uint8_t* wt, float2* rs, float2* cs) {
    const int t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < WCH; ++i) {
        // chunk part p of a row = qs bytes 16 p .. 16 p + 15: j' = p / 2, h = p % 2; low nibbles ->
        // elements 64 j' + 16 h + 0..15, high -> 64 j' + 32 + 16 h + 0..15
        const int r = (WCH * t) >> 3, part = ((WCH * t) & 7) + i;
        const uint4 v = R.q[i];
        uint4 lo, hi;
        lo.x = v.x & 0x0F0F0F0Fu; lo.y = v.y & 0x0F0F0F0Fu; lo.z = v.z & 0x0F0F0F0Fu; lo.w = v.w & 0x0F0F0F0Fu;
        hi.x = (v.x >> 4) & 0x0F0F0F0Fu; hi.y = (v.y >> 4) & 0x0F0F0F0Fu;
        hi.z = (v.z >> 4) & 0x0F0F0F0Fu; hi.w = (v.w >> 4) & 0x0F0F0F0Fu;
        uint8_t* row = wt + r * TS + 64 * (part >> 1) + 16 * (part & 1);
        *reinterpret_cast<uint4*>(row) = lo;
        *reinterpret_cast<uint4*>(row + 32) = hi;
    }
    if (t < BM) {
        const uint4 m = R.m;
        const float d = f16_to_f32((uint16_t)m.x), dmin = f16_to_f32((uint16_t)(m.x >> 16));
        const int p = rperm(t);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int sc, mn;
            if (j < 4) {
                sc = bsel(m, 4 + j) & 63;
                mn = bsel(m, 8 + j) & 63;
            } else {
                const uint32_t a = bsel(m, 8 + j), lo = bsel(m, j), hi = bsel(m, 4 + j);
                sc = (a & 0xF) | ((lo >> 6) << 4);
                mn = (a >> 4) | ((hi >> 6) << 4);
            }
#if GT_MAGIC
            rs[j * BM + p] = make_float2(d * (float)sc, -12582912.0f * (d * (float)sc));
            reinterpret_cast<float2*>(rs + 8 * BM)[j * BM + p] = tf32_split(-(dmin * (float)mn));
#elif GT_MINTC
            reinterpret_cast<float*>(rs)[j * BM + p] = d * (float)sc;
            reinterpret_cast<float2*>(reinterpret_cast<float*>(rs) + 8 * BM)[j * BM + p] = tf32_split(-(dmin * (float)mn));
#else
            rs[j * BM + p] = make_float2(d * (float)sc, -(dmin * (float)mn));
#endif
        }
    }
    if (SCH > 0 || t < BN * 4) {
#pragma unroll
        for (int i = 0; i < SCH1; ++i) {
            const int c = SCH1 * t + i, col = c >> 2, j = 2 * (c & 3);
            const uint4 v = R.s[i];
            const float d0 = __uint_as_float(v.x), d1 = __uint_as_float(v.z);
            const int p = cperm(col);
#if GT_MINTC
            // the min term's B fragments: column c = 8 ni + g of a warp's 32 -> 4 g + ni
            const int pg = 32 * (col >> 5) + 4 * (col & 7) + ((col >> 3) & 3);
            float* cf = reinterpret_cast<float*>(cs);
            float2* cm = reinterpret_cast<float2*>(cf + 8 * BN);
            cf[j * BN + p] = d0;
            cf[(j + 1) * BN + p] = d1;
            cm[j * BN + pg] = tf32_split(d0 * (float)(int)v.y);
            cm[(j + 1) * BN + pg] = tf32_split(d1 * (float)(int)v.w);
#else
            cs[j * BN + p] = make_float2(d0, d0 * (float)(int)v.y);
            cs[(j + 1) * BN + p] = make_float2(d1, d1 * (float)(int)v.w);
#endif
        }
    }
}

MEMRA_DEVICE void load_x(uint32_t xt, const Src& p, int sb) {
#pragma unroll
    for (int i = 0; i < XCH; ++i) cp_async16(xt + p.xdst + 16 * i, p.xqp + 256 * sb + 16 * i);
}

extern __shared__ __align__(16) uint8_t smem[];

template <bool GLU>
MEMRA_DEVICE void gemm_tile_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                 const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                                 float* __restrict__ y, int N, int K, int nb, int ks) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, tig = lane & 3;
    const int ob = blockIdx.x * (GLU ? BM / 2 : BM), cb = blockIdx.y * BN;
    const int nsb = K / 256 / ks, sb0 = blockIdx.z * nsb;   // this block's super-blocks (split-K part z)
    const uint32_t s_base = smem_u32(smem);

    WRegs R;
    const Src src = sources<GLU>(bulk, meta, xq, xs, ob, cb, N, K, nb);
    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

    // prologue: activation stages 0 .. NS-2 in flight, weights of stage 0 stored, stage 1 in registers
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < nsb) load_x(s_base + OFF_X + s * XT_BYTES, src, sb0 + s);
        cp_commit();
    }
    load_w(R, src, sb0);
    store_w(R, smem + OFF_W, reinterpret_cast<float2*>(smem + OFF_RS), reinterpret_cast<float2*>(smem + OFF_CS));
    if (nsb > 1) load_w(R, src, sb0 + 1);

    // ldmatrix lane addresses (bytes, relative to a tile)
    const uint32_t a_off = (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * TS + 16 * (lane >> 4);
    const uint32_t b_off = (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1);

    uint32_t xrd = 0, xwr = (NS - 1) * XT_BYTES;   // smem offsets of the stage read / written now (slots s, s - 1)
    for (int s = 0; s < nsb; ++s) {
        cp_wait<NS - 2>();
        __syncthreads();
        {   // the next activation stage into the slot stage s - 1 used
            const int sn = s + NS - 1;
            if (sn < nsb && !(GT_ABL & 4)) load_x(s_base + OFF_X + xwr, src, sb0 + sn);
            cp_commit();
        }
        const int cur = s & 1, nxt = cur ^ 1;
        if (s + 1 < nsb && !(GT_ABL & 1)) {
            store_w(R, smem + OFF_W + nxt * WT_BYTES, reinterpret_cast<float2*>(smem + OFF_RS + nxt * RS_BYTES),
                    reinterpret_cast<float2*>(smem + OFF_CS + nxt * CS_BYTES));
            if (s + 2 < nsb) load_w(R, src, sb0 + s + 2);
        }
        const uint32_t wa = s_base + OFF_W + cur * WT_BYTES + a_off;
        const uint32_t xb = s_base + OFF_X + xrd + b_off;
        xwr = xrd;   // next iteration writes the slot read now
        xrd = xrd + XT_BYTES == NS * XT_BYTES ? 0 : xrd + XT_BYTES;
#if GT_MAGIC
        const float4* rsp = reinterpret_cast<const float4*>(smem + OFF_RS + cur * RS_BYTES) + (wm * 64 + 8 * g) / 2;
        const float4* csp = reinterpret_cast<const float4*>(smem + OFF_CS + cur * CS_BYTES) + (wn * 32 + 8 * tig) / 4;
#elif GT_MINTC
        const float4* rsp = reinterpret_cast<const float4*>(smem + OFF_RS + cur * RS_BYTES) + (wm * 64 + 8 * g) / 4;
        const float4* csp = reinterpret_cast<const float4*>(smem + OFF_CS + cur * CS_BYTES) + (wn * 32 + 8 * tig) / 4;
#else
        const float4* rsp = reinterpret_cast<const float4*>(smem + OFF_RS + cur * RS_BYTES) + (wm * 64 + 8 * g) / 2;
        const float4* csp = reinterpret_cast<const float4*>(smem + OFF_CS + cur * CS_BYTES) + (wn * 32 + 8 * tig) / 2;
#endif
#pragma unroll GT_JUNROLL
        for (int j = 0; j < 8; ++j) {
            uint32_t A[4][4], B[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) ldsm4(wa + mi * 16 * TS + 32 * j, A[mi][0], A[mi][1], A[mi][2], A[mi][3]);
#pragma unroll
            for (int np = 0; np < 2; ++np) ldsm4(xb + np * 16 * TS + 32 * j, B[2 * np][0], B[2 * np][1], B[2 * np + 1][0], B[2 * np + 1][1]);
            float rsv[16], csv[16];   // rows (mi, h): dsc, ndmm; columns (ni, e): dx, sx (GT_MINTC: dsc, dx only)
#if GT_MAGIC   // rows (mi, h): dsc, -12582912 dsc; columns: dx
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 r4 = rsp[j * BM / 2 + q];
                rsv[4 * q] = r4.x; rsv[4 * q + 1] = r4.y; rsv[4 * q + 2] = r4.z; rsv[4 * q + 3] = r4.w;
            }
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const float4 c4 = csp[j * BN / 4 + q];
                csv[8 * q] = c4.x; csv[8 * q + 2] = c4.y; csv[8 * q + 4] = c4.z; csv[8 * q + 6] = c4.w;
            }
#elif GT_MINTC
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const float4 r4 = rsp[j * BM / 4 + q], c4 = csp[j * BN / 4 + q];
                // float index 4 q + i = 2 mi + h (rows), 2 ni + e (columns) -> the 2 (2 mi + h) slots
                rsv[8 * q] = r4.x; rsv[8 * q + 2] = r4.y; rsv[8 * q + 4] = r4.z; rsv[8 * q + 6] = r4.w;
                csv[8 * q] = c4.x; csv[8 * q + 2] = c4.y; csv[8 * q + 4] = c4.z; csv[8 * q + 6] = c4.w;
            }
#else
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 r4 = rsp[j * BM / 2 + q], c4 = csp[j * BN / 2 + q];
                rsv[4 * q] = r4.x; rsv[4 * q + 1] = r4.y; rsv[4 * q + 2] = r4.z; rsv[4 * q + 3] = r4.w;
                csv[4 * q] = c4.x; csv[4 * q + 1] = c4.y; csv[4 * q + 2] = c4.z; csv[4 * q + 3] = c4.w;
            }
#endif
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    if (GT_ABL & 2) {
                        mma_s8_acc(acc[mi][ni], A[mi], B[ni][0], B[ni][1]);
                        continue;
                    }
                    int c[4];
                    mma_s8(c, A[mi], B[ni][0], B[ni][1], GT_MAGIC ? MAGIC : 0);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = e >> 1, ce = e & 1;
                        const float dsc = rsv[4 * mi + 2 * h], ndmm = rsv[4 * mi + 2 * h + 1];
                        const float dx = csv[4 * ni + 2 * ce], sx = csv[4 * ni + 2 * ce + 1];
                        float a = acc[mi][ni][e];
#if GT_MAGIC
                        a = __fmaf_rn(__fmaf_rn(__int_as_float(c[e]), dsc, ndmm), dx, a);   // ndmm: -12582912 dsc here
#else
                        a = __fmaf_rn(__fmul_rn((float)c[e], dsc), dx, a);
#endif
#if GT_MINTC
                        (void)ndmm; (void)sx;
                        acc[mi][ni][e] = a;
#else
                        acc[mi][ni][e] = __fmaf_rn(ndmm, sx, a);
#endif
                    }
                }
            }
        }
#if GT_MINTC
        if (!(GT_ABL & 2)) {   // the stage's min terms, sum_j ndmm[row, j] sx[j, col], as a k = 8 tf32 product (3xTF32:
            // hi hi + hi lo + lo hi) accumulated into acc. A (16 x 8): a0 (g, tig), a1 (g + 8, tig),
            // a2 (g, tig + 4), a3 (g + 8, tig + 4); B (8 x 8): b0 (tig, g), b1 (tig + 4, g)
            const float4* rm = reinterpret_cast<const float4*>(smem + OFF_RS + cur * RS_BYTES + 8 * BM * (GT_MAGIC ? 8 : 4)) + (wm * 64 + 8 * g) / 2;
            const float4* cm = reinterpret_cast<const float4*>(smem + OFF_CS + cur * CS_BYTES + 8 * BN * 4) + (wn * 32 + 4 * g) / 2;
            float ra[2][8][2];   // [j = tig, tig + 4][2 mi + h][hi, lo]
            float cb_[2][4][2];  // [j][ni][hi, lo]
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                const int j = tig + 4 * jj;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float4 v = rm[j * BM / 2 + q];
                    ra[jj][2 * q][0] = v.x; ra[jj][2 * q][1] = v.y; ra[jj][2 * q + 1][0] = v.z; ra[jj][2 * q + 1][1] = v.w;
                }
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const float4 v = cm[j * BN / 2 + q];
                    cb_[jj][2 * q][0] = v.x; cb_[jj][2 * q][1] = v.y; cb_[jj][2 * q + 1][0] = v.z; cb_[jj][2 * q + 1][1] = v.w;
                }
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
#define U_(x) __float_as_uint(x)
                    float* d = acc[mi][ni];
                    mma_tf32(acc[mi][ni], U_(ra[0][2 * mi][1]), U_(ra[0][2 * mi + 1][1]), U_(ra[1][2 * mi][1]),
                             U_(ra[1][2 * mi + 1][1]), U_(cb_[0][ni][0]), U_(cb_[1][ni][0]));   // lo hi
                    mma_tf32(acc[mi][ni], U_(ra[0][2 * mi][0]), U_(ra[0][2 * mi + 1][0]), U_(ra[1][2 * mi][0]),
                             U_(ra[1][2 * mi + 1][0]), U_(cb_[0][ni][1]), U_(cb_[1][ni][1]));   // hi lo
                    mma_tf32(acc[mi][ni], U_(ra[0][2 * mi][0]), U_(ra[0][2 * mi + 1][0]), U_(ra[1][2 * mi][0]),
                             U_(ra[1][2 * mi + 1][0]), U_(cb_[0][ni][0]), U_(cb_[1][ni][0]));   // hi hi
                    (void)d;
#undef U_
                }
            }
        }
#endif
    }

    if (ks > 1) {   // split-K: raw partials (gate and up unactivated) to y = ws[z][col][weight row]
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
    // epilogue
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
                    const float gt = acc[mi][ni][e], up = acc[mi + 2][ni][e];
                    y[(size_t)col * N + row] = silu_f32(gt) * up;
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
    gemm_tile_body<false>(bulk, meta, xq, xs, y, N, K, nb, ks);
}

extern "C" __global__ void __launch_bounds__(NT, GT_MINB)
gemm_tile_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const int8_t* __restrict__ xq,
              const Q8Scale* __restrict__ xs, float* __restrict__ y, int N, int K, int nb, int ks) {
    gemm_tile_body<true>(bulk, meta, xq, xs, y, N, K, nb, ks);
}

// split-K reduction: y[b, n] = sum over z = 0 .. ks - 1 (in this order) of ws[z][b][n] (glu: of the
// gate row n and the up row N + n, then silu(gate) * up). One thread an output.
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
