// attn_fa.cu — one attention arithmetic for decode rows and prefill rows alike, on the tensor cores (mma.sync m16n8k16 f16 -> f32),
// whose per-row result does not depend on how rows are packed, so prefill and decode give
// the same bits by construction.
//
// A query row is (token t, head h). Its keys: [lo, hi) with hi = pos[t] + 1, lo = window > 0
// ? max(0, hi - window) : 0, read from the paged f16 cache (kv.cuh) of KV head h / qpk.
// Keys are cut into absolute splits j = [j FA_SPLIT, (j + 1) FA_SPLIT) and, inside a split,
// absolute tiles of 64 keys [64 i, 64 i + 64). For each split the row touches, in tile order:
//   s_k  = (scale log2 e) (f16(q) . K[k]): an mma chain over the head's 16-wide k-steps in
//          order, f32 accumulate from 0 (softcap: log2 e * softcap * tanh(scale (q.K) / softcap))
//   s_k  = -inf for k outside [lo, hi)
//   mx   = max_k s_k (the 64 keys), m' = max(m, mx)
//   m' = -inf: alpha = 1, p_k = 0; else alpha = 2^(m - m'), p_k = 2^(s_k - m') (ex2.approx)
//   t_g  = for each 16-key group g: ((p_a + p_b) + p_c) + p_d over a quad lane's four keys of
//          the group, then + xor-shuffle 1, + xor-shuffle 2 (the quad's lanes);
//   l    = l alpha + (((t_0 + t_1) + t_2) + t_3)
//   o    = o alpha, then + f16(p) . V: an mma chain over the 4 key k-steps in order
// then (m, l, o) is the split's partial; the row's output is
//   M = max_j m_j, w_j = 2^(m_j - M), out = (sum_j w_j o_j) * (1 / sum_j w_j l_j), j ascending
// (a row with one split: o * (1 / l), the same value, written by the split's block).
// A tile outside the row's keys leaves m, l and o unchanged bit for bit (alpha = 1, p = 0: x *
// 1 = x, x + 0 = x, and the mma adds exact zeros), every float operation is an explicitly
// rounded intrinsic or asm, and the mma's element (i, j) depends only on A's row i and B's
// column j: so a row's bits depend on its q, its keys and FA_SPLIT, not on its tile's other
// rows, its block, the block's key range, or which warp computed which part.
//
// Two packings of the same arithmetic:
//  - attn_fa (prefill): a block = (token group blockIdx.x, KV head blockIdx.y, split
//    blockIdx.z); group x is count = groups[2x + 1] <= FA_WARPS * tpw consecutive tokens from
//    first = groups[2x], all of ONE sequence (padded rows aside); warp w holds the 16 rows
//    of tokens first + w tpw .. + tpw (tpw = 16 / qpk; row r = token r / qpk, head kvh qpk +
//    r % qpk) and computes all 64 keys and all HEAD_DIM outputs of a tile for them; the
//    block's K/V tiles (cp.async, double-buffered) are shared by its warps. memra.gpu.ops.attn_fa.groups makes the table: a step's runs of
//    one sequence cut into groups of FA_WARPS * tpw tokens (or one token a group).
//  - attn_fa_dec (decode): a block = (token blockIdx.x, KV head, split); its one 16-row tile
//    (the token's qpk heads) is shared by the FA_WARPS = 4 warps: each computes the tile's
//    scores and softmax for the 16 rows (the same code and values: no exchange, one barrier a
//    tile) and the outputs of its quarter of the dims, [w D / 4, (w + 1) D / 4); K/V in three
//    stages. It merges a row's splits itself (the last of its split blocks, fa_combine's
//    arithmetic), writes the q8 twin of the heads it writes, and (fused) ropes Q and appends
//    the row's K / V (rope.cuh: rope_norm_kv's bits), writing the new key into its own tile.
// Compile-time: HEAD_DIM (a multiple of 32 up to 256; attn_fa_dec: of 64), FA_WARPS (4; attn_fa_dec needs 4),
// FA_SPLIT (keys per split, a multiple of 64), KV_BLOCK (kv.cuh); MEMRA_CANARY: wrong variants
// kernel-check must catch: 1, a token does not see itself; 2 (kv.cuh), the block table ignored.
//
// Variant history (H200, experiments/attn_mma/fa_check.py; research/2026-12-01-prefill §5):
//   v1  decode rows through the prefill packing (one warp computing a tile): decode 0.2-0.5x
//       attn_decode (one warp's ~4-5k dependent instructions: IEEE divisions, expf).
//   v2  block-table lookups before the copies: no change.
//   v3  a decode packing (warps split the keys, exchange maxima, sums and f16(p) in shared
//       memory), ex2.approx in log2 units, one reciprocal a row: decode 0.54-1.01x, prefill
//       2.9-8.4x over a 128-row chunk.
//   v4  the decode packing computes the tile's softmax in every warp (no exchange, one
//       barrier a tile, three K/V stages): decode unchanged (8B @64 8.2 µs vs 5.9).
//   v5  (this) attn_fa_dec takes RoPE and the KV append (fused), the split merge (counters, the
//       last block) and the q8 twin in: three launches a decode layer fewer; the split's
//       block-table entries staged once (kv_block) before the PDL wait. tg128 against
//       MEMRA_ATTN=decode, same call (research/2026-12-02-session11/fa-v5/): SmolLM2 shape
//       -8.3 % (v4 in the engine: -16 %), Gemma-3 -19 % (-23 %), 1B -6.2 %, 8B Q4_K_M -6.1 %
//       (-6 %), 8B @ d4096 -3.2 %; pp512 +70 / +49 / +34 / +12.5 %, @ d4096 +102 %.
//   v6  the first two tiles' copies issued before the PDL wait when fused (every copied key is
//       an earlier step's): tg128 SmolLM2 -2.4 %, Gemma-3 -4.2 %, 1B -1.7 %, 8B +1.0 %, 8B @
//       d4096 +1.8 % against v5 (fa-v6/): withdrawn (blocks that launch early hold an SM's
//       shared memory while the matvec before them still runs).
//   v7  (session 20) the prefill packing's instructions a tile: its loader walks a thread's fixed
//       rows (load_tile_pf: NPASS block-table lookups a tile shared by K and V, no per-chunk index
//       arithmetic), every ldmatrix takes a 32-bit base plus an immediate, and a tile that every
//       live row of a warp sees whole skips the mask (softmax_tile<true>). Static SASS of the 8B's
//       module (HEAD_DIM 128, 8 warps, split 4096) a tile a warp: 1,373 -> 699 instructions, 230 ->
//       178 registers; Gemma-3's head-256 module loses its 220 B of spills (experiments/attn_fa_v7/
//       README.md). The same arithmetic: every row's bits as v6 (fa_check --src, on the H200).
//   v8  (this) v7 plus one barrier a tile instead of two (the next tile's copies issued after the
//       barrier that ends the previous tile's reads of their stage) and a warp's Q fragments held
//       in registers across the tiles (head sizes up to 128: D / 16 x 4 registers) instead of
//       ldmatrix'd from shared memory each tile. The same arithmetic. 512 prompt rows, split 4096,
//       µs against v6 alternating (research/2026-12-03-session21 §5), v6 at its engine default (8
//       warps up to head 128) -> v7 / v8 at 4 warps: 8B d0 64.7 -> 46.1 / 45.1, d4096 319.2 ->
//       257.9 / 248.8; SmolLM2 d0 29.7 -> 21.3 / 21.2, d4096 160.4 -> 128.1 / 127.1; Gemma-3 global
//       (4 warps both) d0 81.4 -> 48.0 / 47.4, d4096 494.8 -> 213.1 / 215.3. v7 at 8 warps spills at
//       head 64 (SmolLM2 d4096 182.1 µs, slower than v6); v8 at 8 warps 267.8 on the 8B at d4096.
//       (Those timings launched one block a row along x, 512 for the 16-32 groups, the rest exiting
//       at count 0: the engine trims x to the groups. The same overhead in both arms, not the
//       engine's µs; experiments/h200_session22.sh STAGE f re-times on the engine's grid.)
// Launch: attn_fa grid (n_groups, n_kv, n_split) (groups past the table's last: count 0),
// attn_fa_dec grid (n_tokens, n_kv, n_split); block 32 * FA_WARPS, dynamic shared memory
// FA_SMEM (attn_fa) / FA_SMEM_DEC bytes; part_o [n_tokens][n_head][n_split][HEAD_DIM] f32,
// part_ml [...][2]; after attn_fa, fa_combine (grid (n_head, n_tokens), block HEAD_DIM) for the
// rows with more than one split; attn_fa_dec: counters [n_tokens][n_kv] int, zero (left zero).
#include "common.cuh"
#include "kv.cuh"
#if KV_K_Q8 || KV_V_Q8
#error "attn_fa reads an f16 KV cache only (a q8_0 cache runs on attention.cu; memra/gpu/plan.py turns fa off)"
#endif
#include "q8.cuh"
#include "rope.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef FA_WARPS
#define FA_WARPS 4
#endif
#ifndef FA_SPLIT
#define FA_SPLIT 256
#endif
// (experiment) FA_DSPLIT warps share each 16-row tile of the prefill packing: every one computes the
// tile's scores and softmax (the same code on the same values) and P V for its 1 / FA_DSPLIT of the
// head's dims, as attn_fa_dec's warps do; a block is FA_WARPS row tiles x FA_DSPLIT warps (the host's
// tokens a block, group table and shared memory unchanged; the block 32 FA_WARPS FA_DSPLIT threads).
// FA_QREG 0: Q's fragments ldmatrix'd from shared memory each tile (registers for 2 blocks of 8 warps).
#ifndef FA_DSPLIT
#define FA_DSPLIT 2
#endif
#ifndef FA_QREG
#define FA_QREG 0
#endif
#ifndef FA_MINB
#define FA_MINB 2
#endif
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 32, at most 256");
static_assert(FA_SPLIT % 64 == 0, "FA_SPLIT must be a multiple of 64");

#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
constexpr int D = HEAD_DIM;
constexpr int NT = 32 * FA_WARPS * FA_DSPLIT;
static_assert((HEAD_DIM / 8) % (2 * FA_DSPLIT) == 0, "attn_fa dsplit: each warp's dims a whole number of n-tile pairs");
constexpr int TK = 64;                 // keys per tile
constexpr int RS = D * 2 + 16;         // smem row stride (bytes) of K, V and Q: ldmatrix rows on distinct banks
constexpr int KV_TILE = TK * RS;       // one K (or V) tile
constexpr int Q_TILE = 16 * RS;        // 16 query rows
constexpr int FA_SMEM = 2 * 2 * KV_TILE + FA_WARPS * Q_TILE;
constexpr int FA_SMEM_DEC = 3 * 2 * KV_TILE + Q_TILE + FA_WARPS * D * 4;
constexpr int CPR = D / 8;             // 16-byte chunks per row

MEMRA_DEVICE uint32_t sa(const void* p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global -> shared, or zeros (ok false: nothing read). No memory clobber: the
// compiler may issue the block-table loads of later copies first; cp.async.wait_group (with
// one) orders the copies before their readers.
MEMRA_DEVICE void cp16z(uint32_t dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
MEMRA_DEVICE void ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void ldsm4t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
MEMRA_DEVICE uint32_t pack_h2(float lo, float hi) {
    uint32_t r;
    asm("{ .reg .f16 a, b; cvt.rn.f16.f32 a, %1; cvt.rn.f16.f32 b, %2; mov.b32 %0, {a, b}; }"
        : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}
// 2^x by the SFU (ex2.approx: -inf -> +0); the scores are kept in log2 units
MEMRA_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// one K tile and one V tile (keys [k0, k0 + 64) of KV head kvh) into ks (K) and ks + KV_TILE
// (V) by cp.async; keys outside [blo, bhi) are zero-filled, not read. bts: null (the block
// table row bt looked up per chunk), or the row's entries from bt0 staged in shared memory
// (kv_block's). skip: a key whose tile row is left alone (no copy, no zeros: the decode
// packing writes the key it appends itself), or -1.
MEMRA_DEVICE void load_tile(unsigned char* ks, const uint16_t* __restrict__ kcache, const uint16_t* __restrict__ vcache,
                            const int* __restrict__ bt, size_t row_stride, int kvh, int k0, int blo, int bhi, int tid,
                            const int* bts = nullptr, int bt0 = 0, int skip = -1) {
#pragma unroll 4
    for (int c = tid; c < TK * CPR * 2; c += NT) {
        const int which = c / (TK * CPR), rr = (c % (TK * CPR)) / CPR, ch = c % CPR;
        const int key = k0 + rr;
        if (key == skip) continue;
        const bool ok = key >= blo && key < bhi;
        const uint16_t* base = which ? vcache : kcache;
        size_t slot = 0;
        if (ok) slot = bts ? (size_t)bts[key / KV_BLOCK - bt0] * KV_BLOCK + key % KV_BLOCK : kv_slot(bt, key);
        const uint16_t* src = base + slot * row_stride + (size_t)kvh * D + ch * 8;
        cp16z(sa(ks + which * KV_TILE + rr * RS + ch * 16), src, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// (v7) load_tile for the prefill packing: a thread's 16-byte chunks of a tile are NPASS rows
// r0 + i RPT at one column chunk ch (r0 = tid / CPR, ch = tid % CPR), so its copies need NPASS
// block-table lookups (shared by K and V) and no per-chunk index arithmetic. dst: the shared
// address of this stage's K tile plus the thread's (r0, ch) offset; kb / vb: the caches at KV
// head kvh and column chunk ch. The same bytes land where load_tile puts them.
constexpr int RPT = NT / CPR;   // tile rows one pass of the block's threads covers
constexpr int NPASS = TK / RPT;
static_assert(NT % CPR == 0 && TK % RPT == 0, "attn_fa: the prefill loader's passes");
MEMRA_DEVICE void load_tile_pf(uint32_t dst, const uint16_t* __restrict__ kb, const uint16_t* __restrict__ vb,
                               const int* __restrict__ bt, size_t row_stride, int key0, int blo, int bhi) {
#pragma unroll
    for (int i = 0; i < NPASS; i++) {
        const int key = key0 + i * RPT;
        const bool ok = key >= blo && key < bhi;
        const size_t off = ok ? kv_slot(bt, key) * row_stride : 0;
        cp16z(dst + i * RPT * RS, kb + off, ok);
        cp16z(dst + KV_TILE + i * RPT * RS, vb + off, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

struct RowKeys { int lo, hi; };
MEMRA_DEVICE RowKeys row_keys(int p, int window) {
    RowKeys k;
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 1
    k.hi = p;      // kernel-check canary: a token does not see itself
#else
    k.hi = p + 1;  // p = -1 (a padded row): no keys
#endif
    k.lo = window > 0 ? max(0, k.hi - window) : 0;
    if (k.hi <= 0) k.lo = k.hi = 0;
    return k;
}

// query rows [r0, r0 + nr) of a 16-row tile as f16 into q_s ([16][RS]): row r = (token t0 + r /
// qpk, head kvh qpk + r % qpk) for r < nrow, zeros past it; the lanes of one warp
MEMRA_DEVICE void fill_q_rows(unsigned char* q_s, const float* __restrict__ q, int t0, int nrow, int qpk, int kvh,
                              int n_head, int lane, int r0, int nr) {
#pragma unroll 4
    for (int i = lane; i < nr * (D / 2); i += 32) {
        const int r = r0 + i / (D / 2), c = (i % (D / 2)) * 2;
        float a = 0.f, b = 0.f;
        if (r < nrow) {
            const float* qr = q + (size_t)(t0 + r / qpk) * n_head * D + (size_t)(kvh * qpk + r % qpk) * D;
            const float2 v = *reinterpret_cast<const float2*>(qr + c);
            a = v.x;
            b = v.y;
        }
        *(uint32_t*)(q_s + r * RS + c * 2) = pack_h2(a, b);
    }
}

// scale (log2 units), softcap, mask of one score
MEMRA_DEVICE float score(float acc, float scale, float scale_l2, float softcap, int key, const RowKeys& k) {
    const float v = softcap > 0.f
                        ? __fmul_rn(__fmul_rn(softcap, tanhf(__fdiv_rn(__fmul_rn(acc, scale), softcap))), LOG2E)
                        : __fmul_rn(acc, scale_l2);
    return (key >= k.lo && key < k.hi) ? v : NEG_INF;
}

// a quad lane's group partial, reduced over the quad
MEMRA_DEVICE float group_sum(float a, float b, float c, float d) {
    float t = __fadd_rn(__fadd_rn(__fadd_rn(a, b), c), d);
    t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 1));
    return __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 2));
}

// S = Q K^T of one tile for the 16 rows of q_s: 8 n-tiles of 8 keys, each an mma chain over the
// head's k-steps in order (two k-steps per ldmatrix.x4)
// (v7: shared addresses as one 32-bit base a lane plus compile-time offsets, so each ldmatrix
// takes its offset as an immediate: no address arithmetic a load)
MEMRA_DEVICE void scores_tile(float (&s)[8][4], uint32_t q_a, uint32_t k_a, int lane) {
#pragma unroll
    for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const uint32_t qa = q_a + ((lane % 8) + 8 * ((lane / 8) % 2)) * RS + 16 * (lane / 16);
    const uint32_t ka = k_a + (lane % 8) * RS + 16 * (lane / 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
        uint32_t a0[4], a1[4];
        ldsm4(a0, qa + kk * 32);
        ldsm4(a1, qa + kk * 32 + 32);
#pragma unroll
        for (int n = 0; n < 8; n++) {
            uint32_t b[4];
            ldsm4(b, ka + n * 8 * RS + kk * 32);
            mma16816(s[n], a0, b[0], b[1]);
            mma16816(s[n], a1, b[2], b[3]);
        }
    }
}

// the online softmax step of one tile for this thread's two rows: s (scores in) becomes p,
// m and l are updated, alpha returned per row
// (v8) the scores from Q fragments held in registers (qf[k-step]: ldmatrix.x4 of the warp's 16 rows)
MEMRA_DEVICE void scores_tile_qf(float (&s)[8][4], const uint32_t (&qf)[D / 16][4], uint32_t k_a, int lane) {
#pragma unroll
    for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const uint32_t ka = k_a + (lane % 8) * RS + 16 * (lane / 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
        for (int n = 0; n < 8; n++) {
            uint32_t b[4];
            ldsm4(b, ka + n * 8 * RS + kk * 32);
            mma16816(s[n], qf[kk], b[0], b[1]);
            mma16816(s[n], qf[kk + 1], b[2], b[3]);
        }
    }
}
constexpr bool QREG = FA_QREG && D <= 128;  // the fragments' D / 4 registers fit beside o's D / 2 up to 128

// (v7) FULL: every key of the tile lies in every live row's range (warp-uniform, the caller's
// test): the mask is the identity there and is left out; a dead row's values are never written
template <bool FULL = false>
MEMRA_DEVICE void softmax_tile(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&alpha)[2], int k0, int tig,
                               const RowKeys (&rk)[2], float scale, float scale_l2, float softcap) {
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = e / 2;
            s[n][e] = FULL ? score(s[n][e], scale, scale_l2, softcap, 0, RowKeys{0, 1})
                           : score(s[n][e], scale, scale_l2, softcap, k0 + n * 8 + 2 * tig + (e % 2), rk[i]);
            mx[i] = fmaxf(mx[i], s[n][e]);
        }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]);
        alpha[i] = mn == NEG_INF ? 1.f : ex2(__fsub_rn(m[i], mn));
        m[i] = mn;
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = e / 2;
            s[n][e] = m[i] == NEG_INF ? 0.f : ex2(__fsub_rn(s[n][e], m[i]));
        }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float t[4];
#pragma unroll
        for (int g = 0; g < 4; g++)
            t[g] = group_sum(s[2 * g][2 * i], s[2 * g][2 * i + 1], s[2 * g + 1][2 * i], s[2 * g + 1][2 * i + 1]);
        l[i] = __fadd_rn(__fmul_rn(l[i], alpha[i]), __fadd_rn(__fadd_rn(__fadd_rn(t[0], t[1]), t[2]), t[3]));
    }
}

// o (NN n-tiles of 8 dims from n-tile dn0) = o alpha + f16(p) V: 4 k-steps of 16 keys in order
template <int NN>
MEMRA_DEVICE void pv_tile(float (&o)[NN][4], const float (&s)[8][4], const float (&alpha)[2], uint32_t v_a,
                          int lane, int dn0) {
    const uint32_t va = v_a + ((lane % 8) + 8 * ((lane / 8) % 2)) * RS + 16 * (lane / 16) + dn0 * 16;
#pragma unroll
    for (int n = 0; n < NN; n++) {
        o[n][0] = __fmul_rn(o[n][0], alpha[0]); o[n][1] = __fmul_rn(o[n][1], alpha[0]);
        o[n][2] = __fmul_rn(o[n][2], alpha[1]); o[n][3] = __fmul_rn(o[n][3], alpha[1]);
    }
#pragma unroll
    for (int kq = 0; kq < 4; kq++) {
        const uint32_t a[4] = {pack_h2(s[2 * kq][0], s[2 * kq][1]), pack_h2(s[2 * kq][2], s[2 * kq][3]),
                               pack_h2(s[2 * kq + 1][0], s[2 * kq + 1][1]), pack_h2(s[2 * kq + 1][2], s[2 * kq + 1][3])};
#pragma unroll
        for (int n = 0; n < NN; n += 2) {
            uint32_t b[4];
            ldsm4t(b, va + kq * 16 * RS + n * 16);
            mma16816(o[n], a, b[0], b[1]);
            mma16816(o[n + 1], a, b[2], b[3]);
        }
    }
}

// a row's split result: out directly (its only split) or the partial
MEMRA_DEVICE void write_row(float* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml,
                            const int* __restrict__ pos, int window, int t, int h, int n_head, int S, int j,
                            const RowKeys& here, const float* ov, int d0, int nd, float m, float l, bool ml) {
    const RowKeys full = row_keys(pos[t], window);
    if (full.hi <= full.lo || here.hi <= here.lo) return;  // no keys in this split
    const bool only = full.lo / FA_SPLIT == (full.hi - 1) / FA_SPLIT;
    if (only) {
        float* orow = out + ((size_t)t * n_head + h) * D;
        const float inv = __frcp_rn(l);  // fa_combine's num * (1 / den) with the one weight 1
        for (int i = 0; i < nd; i++) orow[d0 + i * 8] = __fmul_rn(ov[i], inv);
    } else {
        const size_t pr = ((size_t)t * n_head + h) * S + j;
        float* po = part_o + pr * D;
        for (int i = 0; i < nd; i++) po[d0 + i * 8] = ov[i];
        if (ml) {
            part_ml[pr * 2] = m;
            part_ml[pr * 2 + 1] = l;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, FA_MINB)
    attn_fa(const float* __restrict__ q, const uint16_t* __restrict__ kcache, const uint16_t* __restrict__ vcache,
            float* __restrict__ part_o, float* __restrict__ part_ml, float* __restrict__ out,
            const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ block_table,
            int max_blocks, const int* __restrict__ groups, int n_kv, int qpk, int window, float scale,
            float softcap) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int warp = (tid / 32) % FA_WARPS, part = (tid / 32) / FA_WARPS;  // row tile, dim part
    constexpr int NN = D / 8 / FA_DSPLIT;                                    // n-tiles of 8 dims a warp
    const int kvh = blockIdx.y, j = blockIdx.z, S = gridDim.z;
    // this block's tokens: groups[2 x], groups[2 x + 1] (first token, count; 0: no tokens)
    const int t0 = groups[2 * blockIdx.x], t_end = t0 + groups[2 * blockIdx.x + 1];
    if (t_end <= t0) return;
    const int n_head = n_kv * qpk;
    const int tpw = 16 / qpk;
    const int split_lo = j * FA_SPLIT, split_hi = split_lo + FA_SPLIT;
    const float scale_l2 = __fmul_rn(scale, LOG2E);

    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    // the block's key range in this split: the union of its rows'
    int blo = 1 << 30, bhi = 0;
    for (int t = t0; t < t_end; t++) {
        const RowKeys k = row_keys(pos[t], window);
        if (k.hi > k.lo) { blo = min(blo, k.lo); bhi = max(bhi, k.hi); }
    }
    blo = max(blo, split_lo);
    bhi = min(bhi, split_hi);
    if (blo >= bhi) return;  // no row of the block has keys in this split (block-uniform)
    const int* bt = block_table + (size_t)(seq ? seq[t0] : 0) * max_blocks;

    // this warp's tokens; this thread's two rows (gid, gid + 8)
    const int wt0 = t0 + warp * tpw;
    const int wtok = max(0, min(tpw, t_end - wt0));
    const int nrow = wtok * qpk;
    int rt[2], rh[2];
    RowKeys rk[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = gid + 8 * i;
        const bool live = r < nrow;
        rt[i] = live ? wt0 + r / qpk : -1;
        rh[i] = kvh * qpk + r % qpk;
        rk[i] = live ? row_keys(pos[rt[i]], window) : RowKeys{0, 0};
        rk[i].lo = max(rk[i].lo, split_lo);
        rk[i].hi = min(rk[i].hi, split_hi);
    }

    unsigned char* kv_s = smem;                               // [2 stages][K, V][TK][RS]
    unsigned char* q_s = smem + 4 * KV_TILE + warp * Q_TILE;  // [16][RS]
    if (part == 0) fill_q_rows(q_s, q, wt0, nrow, qpk, kvh, n_head, lane, 0, 16);
    __syncthreads();  // the row tile's Q, written by its part-0 warp, before any warp reads it

    float o[NN][4];
#pragma unroll
    for (int n = 0; n < NN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    const int tile_lo = blo < bhi ? blo / TK * TK : 0;
    const int n_tiles = blo < bhi ? (bhi - tile_lo + TK - 1) / TK : 0;
    const size_t row_stride = (size_t)n_kv * D;
    // the loader's thread constants (load_tile_pf)
    const int r0 = tid / CPR, ch = tid % CPR;
    const uint32_t kv_a = sa(kv_s), q_a = sa(q_s);
    const uint32_t ld_a = kv_a + r0 * RS + ch * 16;
    const uint16_t* kb = kcache + (size_t)kvh * D + ch * 8;
    const uint16_t* vb = vcache + (size_t)kvh * D + ch * 8;
    // the tiles every live row of this warp sees whole: [f_lo, f_hi) (warp-uniform)
    int f_lo = -(1 << 30), f_hi = 1 << 30;
#pragma unroll
    for (int i = 0; i < 2; i++)
        if (rt[i] >= 0) { f_lo = max(f_lo, rk[i].lo); f_hi = min(f_hi, rk[i].hi); }
#pragma unroll
    for (int o2 = 1; o2 < 32; o2 *= 2) {
        f_lo = max(f_lo, __shfl_xor_sync(0xffffffffu, f_lo, o2));
        f_hi = min(f_hi, __shfl_xor_sync(0xffffffffu, f_hi, o2));
    }

    // (v8) the warp's Q fragments, once (its lanes wrote q_s: a warp barrier first)
    uint32_t qf[D / 16][4];  // (used when QREG)
    if constexpr (QREG) {
        const uint32_t qa = q_a + ((lane % 8) + 8 * ((lane / 8) % 2)) * RS + 16 * (lane / 16);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) ldsm4(qf[kk], qa + kk * 32);
    }

    if (n_tiles > 0) load_tile_pf(ld_a, kb, vb, bt, row_stride, tile_lo + r0, blo, bhi);
    for (int it = 0; it < n_tiles; it++) {
        const int stage = it & 1;
        // tile it's copies (the only group in flight) landed; after the barrier every warp is done
        // with tile it - 1, whose stage the next tile's copies then refill: one barrier a tile
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (it + 1 < n_tiles)
            load_tile_pf(ld_a + (stage ^ 1) * 2 * KV_TILE, kb, vb, bt, row_stride, tile_lo + (it + 1) * TK + r0,
                         blo, bhi);
        const int k0 = tile_lo + it * TK;
        const uint32_t ks_a = kv_a + stage * 2 * KV_TILE;
        if (nrow > 0) {
            float s[8][4], alpha[2];
            if constexpr (QREG) scores_tile_qf(s, qf, ks_a, lane);
            else scores_tile(s, q_a, ks_a, lane);
            if (k0 >= f_lo && k0 + TK <= f_hi)
                softmax_tile<true>(s, m, l, alpha, k0, tig, rk, scale, scale_l2, softcap);
            else
                softmax_tile<false>(s, m, l, alpha, k0, tig, rk, scale, scale_l2, softcap);
            pv_tile<NN>(o, s, alpha, ks_a + KV_TILE, lane, part * NN);
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (rt[i] < 0) continue;
        // dims n * 8 + 2 tig and n * 8 + 2 tig + 1: two runs of stride 8
        float ev[NN], od[NN];
#pragma unroll
        for (int n = 0; n < NN; n++) { ev[n] = o[n][2 * i]; od[n] = o[n][2 * i + 1]; }
        const int d0 = part * NN * 8;
        write_row(out, part_o, part_ml, pos, window, rt[i], rh[i], n_head, S, j, rk[i], ev, d0 + 2 * tig, NN, m[i],
                  l[i], tig == 0 && part == 0);
        write_row(out, part_o, part_ml, pos, window, rt[i], rh[i], n_head, S, j, rk[i], od, d0 + 2 * tig + 1, NN, m[i],
                  l[i], false);
    }
}

#if FA_WARPS == 4 && HEAD_DIM % 64 == 0 && FA_DSPLIT == 1
static_assert(FA_SPLIT % KV_BLOCK == 0, "attn_fa_dec stages a split's block-table entries: FA_SPLIT % KV_BLOCK == 0");
constexpr int BT_N = FA_SPLIT / KV_BLOCK;  // block-table entries of one split

// attn_fa_dec: decode rows, one token a block per (KV head, split); see the header. Two ways in:
//  - q_raw null: q holds the roped query rows (after rope_norm_kv);
//  - q_raw set (fused, decode rows of distinct sequences): the QKV matvec's rows, RoPE'd here by
//    rope.cuh (rope_norm_kv's arithmetic: the same bits), and the block of the row's own
//    position (its last split) appends the row's K and V to the cache — and writes them into its
//    own K/V tile instead of copying them back.
// The last of a row's split blocks (counters [n_tokens][n_kv], zero; put back to zero) merges
// the partials with fa_combine's arithmetic, so no combine launch follows; the block that
// writes a row's heads also writes their q8 twin when xq is set (q8.cuh's rule).
// Before the PDL wait: pos, the block table's entries of the split, the RoPE constants.
extern "C" __global__ void __launch_bounds__(NT)
    attn_fa_dec(const float* __restrict__ q, const float* __restrict__ q_raw, const float* __restrict__ k_raw,
                const float* __restrict__ v_raw, int q_stride, int k_stride, int v_stride,
                const float* __restrict__ bias, const float* __restrict__ q_norm_w,
                const float* __restrict__ k_norm_w, const float2* __restrict__ cs, int cs_rows, int rope_dim,
                int neox, float eps, uint16_t* __restrict__ kcache, uint16_t* __restrict__ vcache,
                float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counters,
                float* __restrict__ out, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs,
                const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ block_table,
                int max_blocks, int n_kv, int qpk, int window, float scale, float softcap) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int bts[BT_N];
    __shared__ int s_last;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int t = blockIdx.x, kvh = blockIdx.y, j = blockIdx.z, S = gridDim.z;
    const int n_head = n_kv * qpk;
    constexpr int WN = D / 32;           // this warp's output n-tiles (D / 4 dims; even: HEAD_DIM % 64 == 0)

    // pos is written two or more launches back and the block table by the host only (common.cuh):
    // both readable before the wait, so the blocks of splits without keys leave at once
    const int p = pos[t];
    const RowKeys kr = row_keys(p, window);
    if (kr.hi <= kr.lo) return;
    const int j0 = kr.lo / FA_SPLIT, j1 = (kr.hi - 1) / FA_SPLIT;
    if (j < j0 || j > j1) return;
    const int split_lo = j * FA_SPLIT;
    const int blo = max(kr.lo, split_lo), bhi = min(kr.hi, split_lo + FA_SPLIT);
    const int* bt = block_table + (size_t)(seq ? seq[t] : 0) * max_blocks;
    const int bt0 = split_lo / KV_BLOCK;
    for (int i = tid; i < BT_N; i += NT)
        if (bt0 + i >= blo / KV_BLOCK && bt0 + i <= (bhi - 1) / KV_BLOCK) bts[i] = kv_block(bt, bt0 + i);
    const bool fused = q_raw != nullptr;
    const bool appends = fused && j == p / FA_SPLIT && kv_writable(bt, max_blocks, p);
    RopeLane rq, rk;
    if (fused) {
        rope_lane_load(rq, cs, cs_rows, p, rope_dim, q_norm_w);
        rope_lane_load(rk, cs, cs_rows, p, rope_dim, k_norm_w);
    }
    const float scale_l2 = __fmul_rn(scale, LOG2E);
    const RowKeys here{blo, bhi};
    const int tile_lo = blo / TK * TK;
    const int n_tiles = (bhi - tile_lo + TK - 1) / TK;
    const size_t row_stride = (size_t)n_kv * D;
    const int skip = appends ? p : -1;
    unsigned char* kv_s = smem;                       // [3 stages][K, V][TK][RS]
    unsigned char* q_s = smem + 6 * KV_TILE;          // [16][RS]
    float* fbuf = (float*)(smem + 6 * KV_TILE + Q_TILE);  // [FA_WARPS][D]: a warp's roped head
    __syncthreads();  // bts

    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    load_tile(kv_s, kcache, vcache, bt, row_stride, kvh, tile_lo, blo, bhi, tid, bts, bt0, skip);

    // q rows 0 .. qpk - 1: the token's heads (rows past qpk: zeros); warp w stages rows w, w + 4, ...
    if (fused) {
        float* b = fbuf + warp * D;
        for (int r = warp; r < 16; r += FA_WARPS) {
            if (r < qpk) {
                const int h = kvh * qpk + r;
                rope_head(q_raw + (size_t)t * q_stride + (size_t)h * D, bias ? bias + (size_t)h * D : nullptr,
                          q_norm_w != nullptr, rq, eps, rope_dim, neox, b);
            }
            for (int c = lane; c < D / 2; c += 32)
                *(uint32_t*)(q_s + r * RS + c * 4) = r < qpk ? pack_h2(b[2 * c], b[2 * c + 1]) : 0u;
            __syncwarp();
        }
    } else {
        fill_q_rows(q_s, q, t, qpk, qpk, kvh, n_head, lane, 4 * warp, 4);
    }
    // the appended key: warp 3 ropes K, warp 2 takes V; both into the cache and kept as f16 in
    // registers (lane d / 32 .. : dims lane + 32 i) for the tile that holds position p
    constexpr int DPL = D / 32;
    uint16_t knew[DPL], vnew[DPL];
    if (appends) {
        const size_t row = kv_slot(bt, p) * row_stride + (size_t)kvh * D;
        if (warp == 3) {
            float* b = fbuf + warp * D;
            __syncwarp();
            rope_head(k_raw + (size_t)t * k_stride + (size_t)kvh * D,
                      bias ? bias + (size_t)(n_head + kvh) * D : nullptr, k_norm_w != nullptr, rk, eps, rope_dim,
                      neox, b);
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                knew[i] = f32_to_f16(b[lane + 32 * i]);
                kcache[row + lane + 32 * i] = knew[i];
            }
        } else if (warp == 2) {
            const float* src = v_raw + (size_t)t * v_stride + (size_t)kvh * D;
            const float* bv = bias ? bias + (size_t)(n_head + n_kv + kvh) * D : nullptr;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                vnew[i] = f32_to_f16(bv ? __fadd_rn(src[d], bv[d]) : src[d]);
                vcache[row + d] = vnew[i];
            }
        }
    }

    float o[WN][4];
#pragma unroll
    for (int n = 0; n < WN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const RowKeys rk2[2] = {gid < qpk ? here : RowKeys{0, 0}, gid + 8 < qpk ? here : RowKeys{0, 0}};

    // three stages, one tile ahead: a stage is rewritten two barriers after its last reader
    for (int it = 0; it < n_tiles; it++) {
        // the appended key's row of this tile (no copy touches it; the stage's last readers were
        // two barriers ago): written by the warp that holds it, published by the barrier below
        const int k_iss = tile_lo + it * TK;
        if (appends && p >= k_iss && p < k_iss + TK && (warp == 2 || warp == 3)) {
            unsigned char* row = kv_s + (it % 3) * 2 * KV_TILE + (warp == 2 ? KV_TILE : 0) + (p - k_iss) * RS;
#pragma unroll
            for (int i = 0; i < DPL; i++) ((uint16_t*)row)[lane + 32 * i] = warp == 2 ? vnew[i] : knew[i];
        }
        if (it + 1 < n_tiles) {
            load_tile(kv_s + ((it + 1) % 3) * 2 * KV_TILE, kcache, vcache, bt, row_stride, kvh, k_iss + TK, blo, bhi,
                      tid, bts, bt0, skip);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const unsigned char* ks = kv_s + (it % 3) * 2 * KV_TILE;
        // every warp: the tile's scores and softmax for the 16 rows (the same values); then P V
        // for its quarter of the dims
        float s[8][4], alpha[2];
        scores_tile(s, sa(q_s), sa(ks), lane);
        softmax_tile(s, m, l, alpha, k_iss, tig, rk2, scale, scale_l2, softcap);
        pv_tile<WN>(o, s, alpha, sa(ks + KV_TILE), lane, warp * WN);
    }

    // the row's output: this split alone (o / l), or the partial and, in the last block, the merge
    float* ob = (float*)smem;  // [qpk][D]: the heads' output, staged for the q8 twin (stage 0's K: read)
    const size_t orow0 = ((size_t)t * n_head + (size_t)kvh * qpk) * D;
    const int d0 = warp * (D / 4) + 2 * tig;
    __syncthreads();  // every warp done with the stages
    if (j0 == j1) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = gid + 8 * i;
            if (r >= qpk) continue;
            const float inv = __frcp_rn(l[i]);  // fa_combine's num * (1 / den) with the one weight 1
#pragma unroll
            for (int n = 0; n < WN; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float v = __fmul_rn(o[n][2 * i + e], inv);
                    out[orow0 + (size_t)r * D + d0 + n * 8 + e] = v;
                    ob[r * D + d0 + n * 8 + e] = v;
                }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = gid + 8 * i;
            if (r >= qpk) continue;
            const size_t pr = ((size_t)t * n_head + kvh * qpk + r) * S + j;
#pragma unroll
            for (int n = 0; n < WN; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) part_o[pr * D + d0 + n * 8 + e] = o[n][2 * i + e];
            if (warp == 0 && tig == 0) {
                part_ml[pr * 2] = m[i];
                part_ml[pr * 2 + 1] = l[i];
            }
        }
        __threadfence();  // this block's partial, visible device-wide before it is counted
        __syncthreads();
        if (tid == 0) s_last = atomicAdd(&counters[t * n_kv + kvh], 1) == j1 - j0;
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        // fa_combine's arithmetic, splits j0 .. j1 in order
        for (int i = tid; i < qpk * D; i += NT) {
            const int r = i / D, d = i % D;
            const size_t base = ((size_t)t * n_head + kvh * qpk + r) * S;
            float M = NEG_INF;
            for (int jj = j0; jj <= j1; jj++) M = fmaxf(M, __ldcg(part_ml + (base + jj) * 2));
            float num = 0.f, den = 0.f;
            for (int jj = j0; jj <= j1; jj++) {
                const float w = ex2(__fsub_rn(__ldcg(part_ml + (base + jj) * 2), M));
                den = __fadd_rn(den, __fmul_rn(w, __ldcg(part_ml + (base + jj) * 2 + 1)));
                num = __fadd_rn(num, __fmul_rn(w, __ldcg(part_o + (base + jj) * D + d)));
            }
            const float v = __fmul_rn(num, __frcp_rn(den));
            out[orow0 + i] = v;
            ob[i] = v;
        }
        if (tid == 0) counters[t * n_kv + kvh] = 0;
    }
    if (xq) {  // the heads' q8 twin from the staged copy, 8 lanes per block of 32
        __syncthreads();
        for (int i0 = 0; i0 < qpk * D / 4; i0 += NT) {  // uniform trip count: every lane shuffles
            const int i4 = i0 + tid;
            const bool active = i4 < qpk * D / 4;
            q8_store4(active ? reinterpret_cast<const float4*>(ob)[i4] : make_float4(0.f, 0.f, 0.f, 0.f), active, i4,
                      xq + orow0, xs + orow0 / 32);
        }
    }
}
#endif

// the rows with more than one split: out = (sum_j w_j o_j) * (1 / sum_j w_j l_j), w_j = 2^(m_j - M)
extern "C" __global__ void fa_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                      float* __restrict__ out, const int* __restrict__ pos, int window, int n_split) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const RowKeys k = row_keys(pos[t], window);
    if (k.hi <= k.lo) return;
    const int j0 = k.lo / FA_SPLIT, j1 = (k.hi - 1) / FA_SPLIT;
    if (j0 == j1) return;  // written by the split's block
    const size_t base = ((size_t)t * n_head + h) * n_split;
    float M = NEG_INF;
    for (int j = j0; j <= j1; j++) M = fmaxf(M, part_ml[(base + j) * 2]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int j = j0; j <= j1; j++) {
            const float w = ex2(__fsub_rn(part_ml[(base + j) * 2], M));
            den = __fadd_rn(den, __fmul_rn(w, part_ml[(base + j) * 2 + 1]));
            num = __fadd_rn(num, __fmul_rn(w, part_o[(base + j) * D + d]));
        }
        out[((size_t)t * n_head + h) * D + d] = __fmul_rn(num, __frcp_rn(den));
    }
}
