// qf.cu — the "qf" arithmetic of generated rows' Q4_K and Q6_K matmuls (MEMRA_DECODE=qf, memra.gpu.ops.qf): one kernel for 1..8
// activation rows (qf_mv), one for more (qf_gemm), and the activation producer (to_qf); every row's bits the same at
// any row count, beside any rows, in either kernel and at any tunable but QF_CHAINS. Its experiments (v8-v13,
// mv_qf.cu, and the probes) are experiments/f16_decode.
//
// What it computes. W: N rows (qf_mv / qf_gemm) or 2N rows [gate; up] (_glu) of K Q4_K weights in memra's planes
// layout (bulk: a row's superblocks' 128 nibble bytes; meta: their 16 bytes, d | dmin | scales[12]); x: nb activation
// rows as to_qf writes them. For every output (weight row n, activation row b) and superblock of 256 k in increasing
// k within a chain:
//  D1 = the tensor core's f32 sum of (sc_s q) x over the superblock: sc_s q (<= 63 * 15) exact in f16 (one fused
//       HFMA2 a pair: (1024 + q) sc - 1024 sc), x f16; 16 mma.sync m16n8k16 chained from a zero accumulator, k16
//       steps in increasing k, slots 2 tig, 2 tig + 1 | 2 tig + 8, 2 tig + 9 <- elements 8 tig + 0, 2 | 1, 3 (then
//       + 4 ..) of each 32-element sub-block;
//  D2 = the tensor core's f32 sum of m_s S2_s over the superblock's 8 sub-blocks: mma.sync m16n8k8 tf32, A = m_s
//       (exact), B = S2's hi, then S2's lo, chained from zero;
//  acc = fma(d, D1, acc), then acc = fma(-dmin, D2, acc) (d, dmin the superblock's f16 scales in f32).
// Q6_K (QF_TYPE 14; bulk: ql[128] qh[64], meta: scales[16] int8 | d, 18 bytes a superblock), for every 16-element
// sub-block s in increasing k: D = one mma.sync m16n8k16 from zero of (q - 32) x ((1024 + q) - 1056, exact in f16;
// slots 2 tig, 2 tig + 1 | 2 tig + 8, 2 tig + 9 <- elements 4 tig + 0, 2 | 1, 3 of the sub-block, the same x layout
// read 8 bytes a lane), acc = fma(d sc_s, D, acc) (d sc_s exact in f32); no sums (xs2 unread).
// QF_CHAINS chains split K into equal runs of superblocks, each from acc = +0, folded left (c0 + c1, + c2 ..) —
// the chain count is part of the arithmetic (memra.gpu.ops.qf.chains: by the shape alone). Then the epilogue:
//   plain: y[b N + n] = v, or with res != null fl(res[b N + n] + v) (res may alias y)
//   glu:   y[b N + n] = fl(act(gate) * up), act 1 = silu_f32, 2 = gelu_tanh_f32 (common.cuh)
//   to_qf: xh = f16(x) (cvt.rn) with each 8 elements stored e0 e2 e1 e3 e4 e6 e5 e7 (a lane's 16-byte load at element
//          8 tig is its two k16 steps' B fragments), xs2 per row and superblock 16 floats [tig 4][hi_t, hi_t+4,
//          lo_t, lo_t+4], S2_s = each 8 f16 values of sub-block s summed in f32 in increasing k, then the four as
//          (s0 + s1) + (s2 + s3); hi = tf32(S2) (cvt.rna), lo = tf32(S2 - hi)
// Nothing depends on nb, on the rows beside a row, on the grid, or on QF_WARPS / QF_GWARPS / QF_NT / QF_STAGES /
// QF_KSPLIT (kernel-check compares them bit for bit). Not mv_q8's arithmetic (q8 activations there: 8 significant
// bits relative to a block's largest; here 11 each, and S2 to ~22 bits).
//
// Work. qf_mv: a warp owns a 16-row A tile (glu: gate rows n0 + gid and up rows N + n0 + gid of 8 outputs; plain
// rows n0 + gid, + 8) and one chain; activation rows are B's columns gid < nb; weights and meta QF_AHEAD superblocks
// ahead in registers (the first before the PDL wait); a tile's chains share a block and meet in shared memory. qf_gemm:
// a warp owns one A tile and QF_NT n8 tiles of activation rows; the block's QF_GWARPS warps share each superblock's
// activations and sums staged by cp.async QF_STAGES deep (rows padded to QF_XROW halves: a quarter warp's LDS.128
// reads two rows 16 banks apart; rows >= nb zero-filled). QF_KSPLIT 0: a warp walks its chains one after another, a
// finished chain's sums parked in shared memory; QF_KSPLIT 1: QF_CHAINS blocks along z, one chain each, their sums
// written to ws [chain][row][weight row] and the (x, y) tile's last block (cnt, reset by it) folds them in chain
// order and runs the epilogue. The weights and meta ride a register ring one superblock ahead, or (QF_WSMEM 1)
// the stages too: each warp copies its 16 rows (QF_WROW bytes apart) and their meta with the activations.
//
// Tunables (-D): QF_CHAINS (1; the arithmetic), QF_WARPS (4; a multiple of QF_CHAINS), QF_GWARPS (4), QF_NT (8),
// QF_STAGES (2; 2..4), QF_KSPLIT (0), QF_WSMEM (0), QF_AHEAD (1; 1..3, qf_mv); the launcher passes them all
// (memra.gpu.ops.qf.launch_config). MEMRA_CANARY: deliberately wrong variants kernel-check must catch: 1, the second
// k16 step of every superblock's first sub-block skipped (its products dropped from every output; Q6_K: sub-block 1
// dropped); 2, qf_gemm's
// QF_KSPLIT fold walks the chains in reverse order (other bits than qf_mv's from 3 chains on); 3, to_qf sums a
// sub-block's four partial sums as (s0 + s2) + (s1 + s3) (other S2 bits than the host replay's).
//
// Launch contract (memra.gpu.ops.qf computes it):
//   qf_mv / _glu: grid (ceil(T QF_CHAINS / QF_WARPS), 1, 1), T = Nw / 16 (Nw = N, 2N for glu), block (32 QF_WARPS);
//     nb <= 8
//   qf_gemm / _glu: grid (ceil(T / QF_GWARPS), ceil(nb / (8 QF_NT)), QF_KSPLIT ? QF_CHAINS : 1), block (32
//     QF_GWARPS), dynamic shared memory QF_STAGES 8 QF_NT (2 QF_XROW + 64) + (QF_WSMEM: QF_STAGES QF_GWARPS 16
//     (QF_WROW + QF_MROW)) + (!QF_KSPLIT && QF_CHAINS > 1: 4 QF_NT 32 QF_GWARPS 4) bytes; QF_KSPLIT: ws >= QF_CHAINS nb Nw floats, cnt >= grid.x grid.y ints, zero before the
//     first launch (each launch leaves them zero)
//   to_qf: grid (ceil(nb K / 2048), 1, 1), block (256, 1, 1)
// Host contract: Q4_K (type 12, QF_TYPE 12) or Q6_K (14, QF_TYPE 14); K % (256 QF_CHAINS) == 0; Nw % 16 == 0; nb >= 1; bulk, meta, xh, xs2 16-byte
// aligned; N, K, nb int32.
// PDL: the first superblock's weights load before MEMRA_PDL_WAIT(), the rest after it; MEMRA_PDL_LAUNCH() after the
// K loop. to_qf: wait first, launch last.
//
// Variant history (experiments/f16_decode/README.md; research/2026-12-07-session53/f16/qf.jsonl and
// research/2026-12-07-session54/, NVIDIA H100, the 8B's Q4_K shapes):
//  v8-v12 (mv_qf.cu, one row): nibbles exact in f16 into mma.sync, a per-sub-block fold acc = fma(d sc, S1, acc),
//      fma(-dmin m, S2, acc): gate+up 31.9 µs against mv_q8's 24.6.
//  v13 (mv_qf.cu's gm_qf, 8..64 rows, that arithmetic): every output bit-identical to the one-row launches, but
//      ~250 instructions a warp and sub-block (the fold, four PRMT an n8 tile): gate+up at 64 rows 132.6 µs against
//      gemm.cu's 159.3, down 122.3 against 90.4.
//  v14 (this file): the scales in the A values and the mins through a tf32 mma — one fold a superblock, x in qf
//      order (no PRMT): ~106 instructions a warp and sub-block at QF_NT 8 (static SASS). Every output at 1 / 8 / 64
//      rows = the one-row launches'. One row 1.06-1.18x mv_q8 (gate+up 29.5 µs), 8 rows 0.58-0.81x mvt, 64 rows
//      0.66-0.84x gemm.cu (gate+up 104.0 against 157.8): 8 warps an SM, 31 % issue, long-scoreboard stalls on the
//      register ring's meta (ncu).
//  v15 (QF_WSMEM, qf_gemm; QF_AHEAD, qf_mv; research/2026-12-07-session55/q2): the weights and meta through shared
//      memory with the activations: 64 rows 0.57-0.72x gemm.cu (gate+up 93.9 µs against 154.6, down 51.1 against
//      89.2), 16 warps an SM at QF_NT 4 (100 registers), 48 % issue; the one-row ring deeper (QF_AHEAD 2, 3) loses
//      1.2-2x (registers). The engine's configurations: memra.gpu.ops.qf.default_config.
//  v16 (QF_TYPE 14, session 56): Q6_K. Its sub-block scale is int8 (sc (q - 32) up to 4,096: not exact in f16), so
//      the scale folds in f32 once a 16-element sub-block (one mma from zero, 4 FFMA an n8 tile) where Q4_K folds
//      once a superblock; the lanes read the same x layout 8 bytes at a time (the sub-block's elements 4 tig ..),
//      the staged rows XROW 272 / WROW 208 (bank-conflict-free for those reads), the 18-byte meta as the 4-aligned
//      20-byte window holding it (offset 0 or 2 by the superblock's parity: cp.async copies 4-byte pieces).
//  v17 (session 57, qf_gemm): each thread's cp.async copies planned once — a staged activation row warp + GWARPS j
//      and piece lane, a sum piece, a lane's weight row lane & 15 and its bulk pieces lane >> 4 + 2 j (with the meta
//      or a share of the Q6_K window) — so a stage adds one superblock offset to each planned address; v16 recomputed
//      rows, pieces (k / 9, k % 9) and clamps in three loops, ~half a warp's instructions a superblock (static SASS).
//      The staged bytes are v16's (tests/test_qf_v17.py replays both plans), so are the outputs. qf_mv: a
//      superblock's activations from one address, unpredicated (a column >= nb reads row 0's, never stored).
#include "common.cuh"
#include "smem_stage.cuh"

#ifndef QF_WARPS
#define QF_WARPS 4
#endif
#ifndef QF_CHAINS
#define QF_CHAINS 1
#endif
#ifndef QF_GWARPS
#define QF_GWARPS 4
#endif
#ifndef QF_NT
#define QF_NT 8
#endif
#ifndef QF_STAGES
#define QF_STAGES 2
#endif
#ifndef QF_KSPLIT
#define QF_KSPLIT 0
#endif
#ifndef QF_AHEAD
#define QF_AHEAD 1   // qf_mv: superblocks of weights and meta in registers ahead of the one computed (1..3)
#endif
#ifndef QF_WSMEM
#define QF_WSMEM 0   // v15 (qf_gemm): the weights and meta staged through shared memory with the activations
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif
#ifndef QF_TYPE
#define QF_TYPE 12   // the weight type: 12 Q4_K, 14 Q6_K (the launcher passes the weight's)
#endif
#if QF_TYPE == 14
#define QF_BULK 192   // bulk bytes a superblock: ql[128], qh[64]
#define QF_MROW 20    // a staged row's meta: the 4-byte-aligned 20-byte window holding its 18 (scales[16], d)
#define QF_WROW 208   // bytes a staged weight row (QF_WSMEM): 192 + 16 (a warp's 4-byte reads of 8 rows: 32 banks)
#define QF_XROW 272   // halves a staged activation row: a half warp's LDS.64 reads 4 rows 8 banks apart
#define QF_XLANE 4    // a lane's activations start 4 tig into a 16-element sub-block
#elif QF_TYPE == 12
#define QF_BULK 128
#define QF_MROW 16
#define QF_WROW 160   // 128 + 32 (rows gid, gid + 1 on other banks)
#define QF_XROW 288
#define QF_XLANE 8    // 8 tig into a 32-element sub-block
#else
#error "QF_TYPE: 12 (Q4_K) or 14 (Q6_K)"
#endif
static_assert(QF_WARPS % QF_CHAINS == 0, "qf_mv: a tile's chains share a block");
static_assert(QF_STAGES >= 2 && QF_STAGES <= 4, "QF_STAGES 2..4");

MEMRA_DEVICE void mma16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
MEMRA_DEVICE void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// nibbles 0 and 2 of v's halves times sc, exact in f16: ((1024 + q) sc - 1024 sc) in one fused HFMA2; s2 = (sc, sc),
// k2 = (-1024 sc, -1024 sc)
MEMRA_DEVICE uint32_t nib_sc(uint32_t v, uint32_t s2, uint32_t k2) {
    uint32_t t, r;
    asm("lop3.b32 %0, %1, 0x000F000F, 0x64006400, 0xEA;" : "=r"(t) : "r"(v));   // (v & mask) | magic
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(t), "r"(s2), "r"(k2));
    return r;
}
// (sc, sc) and (-1024 sc, -1024 sc) as f16 pairs for 0 <= sc < 64: (1024 + sc) - 1024 by the exponent trick, then
// times -1024 (exact)
MEMRA_DEVICE void sc_pair(int sc, uint32_t& s2, uint32_t& k2) {
    uint32_t t;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(((uint32_t)sc * 0x10001u) | 0x64006400u), "r"(0x64006400u));
    s2 = t;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(k2) : "r"(t), "r"(0xE400E400u));   // -1024
}
// A superblock of a warp's two A rows (ra: gid, rb: gid + 8) as a lane holds it. Q4_K: w[r][j] the row's nibble
// bytes 32 j + 8 tig .. + 7, m[r] its 16 meta bytes. Q6_K: w[r][3 (2 h + j) + c] the row's 4 bytes at l0 = 16 j + 4
// tig of ql[64 h + l0] (c 0), ql[64 h + 32 + l0] (c 1), qh[32 h + l0] (c 2); m[r] the 20-byte window of its meta at
// the 4-aligned byte below it, o[r] (0 or 2) where the 18 bytes (scales[16], d) start in it.
#if QF_TYPE == 14
struct QfRegs {
    uint32_t w[2][12];
    uint32_t m[2][5];
    int o[2];
};
#else
struct QfRegs {
    uint2 w[2][4];
    uint4 m[2];
};
#endif

// Q4_K meta (x: d | dmin; y, z, w: scales[0..11]): the scale (sub-block s < 8, compile-time) and the min (run-time s)
template <int s>
MEMRA_DEVICE int k4_sc(const uint4& m) {
    if (s < 4) return (m.y >> (8 * (s & 3))) & 63;
    constexpr int i = s & 3;
    return ((m.w >> (8 * i)) & 0xF) | (((m.y >> (8 * i + 6)) & 3) << 4);
}
MEMRA_DEVICE int k4_mn(const uint4& m, int s) {   // s in 0..7 at run time (s < 4 and s >= 4 are the two halves)
    const int i = s & 3;
    return s < 4 ? (int)((m.z >> (8 * i)) & 63) : (int)(((m.w >> (8 * i + 4)) & 0xF) | (((m.z >> (8 * i + 6)) & 3) << 4));
}
MEMRA_DEVICE int k4_sc_rt(const uint4& m, int s) {
    switch (s) {
    case 0: return k4_sc<0>(m);
    case 1: return k4_sc<1>(m);
    case 2: return k4_sc<2>(m);
    case 3: return k4_sc<3>(m);
    case 4: return k4_sc<4>(m);
    case 5: return k4_sc<5>(m);
    case 6: return k4_sc<6>(m);
    default: return k4_sc<7>(m);
    }
}

// One superblock of a warp's 16-row A tile against NT n8 tiles of activation rows: w the rows' nibbles (row gid:
// w[0], gid + 8: w[1]; pair j = sub-blocks 2j (low nibbles) / 2j + 1 (high), elements 8 tig .. + 7), ma / mb their
// meta; xl(t, j, h) the lane's 16 bytes of n8 tile t's column gid at sub-block 2j + h (qf order), sl(t) its 16-byte
// S2 fragment; acc[t] += the superblock (see the header).
template <int NT, class XL, class SL>
MEMRA_DEVICE void qf_superblock(const uint2 (&w)[2][4], const uint4& ma, const uint4& mb, int tig, XL xl, SL sl,
                                 float (&acc)[NT][4]) {
    float d1[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) d1[t][e] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t sa, ka, sb, kb;
            sc_pair(k4_sc_rt(ma, 2 * j + h), sa, ka);
            sc_pair(k4_sc_rt(mb, 2 * j + h), sb, kb);
            const uint32_t u0 = w[0][j].x >> (4 * h), u1 = w[0][j].y >> (4 * h);   // row gid
            const uint32_t v0 = w[1][j].x >> (4 * h), v1 = w[1][j].y >> (4 * h);   // row gid + 8
            const uint32_t a0 = nib_sc(u0, sa, ka), a1 = nib_sc(v0, sb, kb);
            const uint32_t a2 = nib_sc(u0 >> 8, sa, ka), a3 = nib_sc(v0 >> 8, sb, kb);
            const uint32_t e0 = nib_sc(u1, sa, ka), e1 = nib_sc(v1, sb, kb);
            const uint32_t e2 = nib_sc(u1 >> 8, sa, ka), e3 = nib_sc(v1 >> 8, sb, kb);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const uint4 xv = xl(t, j, h);
                mma16(d1[t], a0, a1, a2, a3, xv.x, xv.y);
#if MEMRA_CANARY == 1
                if (j == 0 && h == 0) continue;   // canary: the sub-block's second k16 step dropped
#endif
                mma16(d1[t], e0, e1, e2, e3, xv.z, xv.w);
            }
        }
    }
    // the mins: A (16 rows x 8 sub-blocks) = m, the lane's (gid, tig), (gid + 8, tig), (gid, tig + 4), (gid + 8, tig + 4)
    const uint32_t m0 = __float_as_uint((float)k4_mn(ma, tig)), m1 = __float_as_uint((float)k4_mn(mb, tig));
    const uint32_t m2 = __float_as_uint((float)k4_mn(ma, tig + 4)), m3 = __float_as_uint((float)k4_mn(mb, tig + 4));
    const float da = f16_to_f32((uint16_t)ma.x), dmina = f16_to_f32((uint16_t)(ma.x >> 16));
    const float db = f16_to_f32((uint16_t)mb.x), dminb = f16_to_f32((uint16_t)(mb.x >> 16));
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const uint4 sv = sl(t);
        float d2[4] = {0.f, 0.f, 0.f, 0.f};
        mma_tf32(d2, m0, m1, m2, m3, sv.x, sv.y);   // hi
        mma_tf32(d2, m0, m1, m2, m3, sv.z, sv.w);   // lo
        // D: (row gid, col 2 tig), (gid, 2 tig + 1), (gid + 8, 2 tig), (gid + 8, 2 tig + 1)
        acc[t][0] = __fmaf_rn(-dmina, d2[0], __fmaf_rn(da, d1[t][0], acc[t][0]));
        acc[t][1] = __fmaf_rn(-dmina, d2[1], __fmaf_rn(da, d1[t][1], acc[t][1]));
        acc[t][2] = __fmaf_rn(-dminb, d2[2], __fmaf_rn(db, d1[t][2], acc[t][2]));
        acc[t][3] = __fmaf_rn(-dminb, d2[3], __fmaf_rn(db, d1[t][3], acc[t][3]));
    }
}

#if QF_TYPE == 14
// f16 pairs (q - 32) of a word's bytes 0, 2 (lo) and 1, 3 (hi), q < 64, exact: (1024 + q) - 1056
MEMRA_DEVICE void q6_pairs(uint32_t q, uint32_t& lo, uint32_t& hi) {
    uint32_t t0, t1;
    asm("lop3.b32 %0, %1, 0x00FF00FF, 0x64006400, 0xEA;" : "=r"(t0) : "r"(q));
    asm("lop3.b32 %0, %1, 0x00FF00FF, 0x64006400, 0xEA;" : "=r"(t1) : "r"(q >> 8));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(t0), "r"(0x64206420u));   // 1056
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(t1), "r"(0x64206420u));
}
// One Q6_K superblock of a warp's A tile against NT n8 tiles: for its 16-element sub-blocks s = 0..15 in increasing
// k, D = one mma.sync m16n8k16 from zero of (q - 32) x (the lane's slots 2 tig, 2 tig + 1 | 2 tig + 8, 2 tig + 9 <-
// elements 4 tig + 0, 2 | 1, 3 of the sub-block), acc = fma(d sc_s, D, acc) (d sc_s exact in f32); xl(t, s) the
// lane's 8 bytes of n8 tile t's column gid at sub-block s (qf order: elements 4 tig + 0, 2, 1, 3).
template <int NT, class XL>
MEMRA_DEVICE void qf6_superblock(const QfRegs& q, XL xl, float (&acc)[NT][4]) {
    uint32_t sw[2][4];
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int k = 0; k < 4; ++k) sw[r][k] = q.o[r] ? __funnelshift_r(q.m[r][k], q.m[r][k + 1], 16) : q.m[r][k];
        d[r] = f16_to_f32((uint16_t)(q.o[r] ? q.m[r][4] >> 16 : q.m[r][4]));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int qd = 0; qd < 4; ++qd)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int s = 8 * h + 2 * qd + j;   // elements 128 h + 32 qd + 16 j .. + 15
                uint32_t a[2][2];
                float ds[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t v = ((q.w[r][3 * (2 * h + j) + (qd & 1)] >> (4 * (qd >> 1))) & 0x0F0F0F0Fu) |
                                       (((q.w[r][3 * (2 * h + j) + 2] >> (2 * qd)) & 0x03030303u) << 4);
                    q6_pairs(v, a[r][0], a[r][1]);
                    ds[r] = __fmul_rn(d[r], (float)(int)(int8_t)(sw[r][s >> 2] >> (8 * (s & 3))));
                }
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#if MEMRA_CANARY == 1
                    if (s == 1) continue;   // canary: sub-block 1 dropped from every output
#endif
                    const uint2 xv = xl(t, s);
                    float D[4] = {0.f, 0.f, 0.f, 0.f};
                    mma16(D, a[0][0], a[1][0], a[0][1], a[1][1], xv.x, xv.y);
                    acc[t][0] = __fmaf_rn(ds[0], D[0], acc[t][0]);
                    acc[t][1] = __fmaf_rn(ds[0], D[1], acc[t][1]);
                    acc[t][2] = __fmaf_rn(ds[1], D[2], acc[t][2]);
                    acc[t][3] = __fmaf_rn(ds[1], D[3], acc[t][3]);
                }
            }
}
#endif

// the epilogue of one n8 tile's outputs v (D layout) at activation rows col0 + 2 tig, + 1 (< nb)
template <bool GLU>
MEMRA_DEVICE void qf_store(const float (&v)[4], float* y, const float* res, int N, int n0, int gid, int col0, int tig,
                            int nb, int act) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int col = col0 + 2 * tig + c;
        if (col >= nb) continue;
        if (GLU) {
            y[(size_t)col * N + n0 + gid] = __fmul_rn(act == 2 ? gelu_tanh_f32(v[c]) : silu_f32(v[c]), v[2 + c]);
        } else {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const size_t o = (size_t)col * N + n0 + gid + 8 * r;
                y[o] = res ? __fadd_rn(res[o], v[2 * r + c]) : v[2 * r + c];
            }
        }
    }
}

// a warp's A tile: rows ra (gid), rb (gid + 8) of weight tile `tile`
struct QfTile {
    const uint8_t* bulk;
    const uint8_t* meta;
    int ra, rb, nsb, tig;
    int n0;
    MEMRA_DEVICE QfTile(const uint8_t* bulk_, const uint8_t* meta_, int tile, bool glu, int N, int nsb_, int gid,
                        int tig_) : bulk(bulk_), meta(meta_), nsb(nsb_), tig(tig_) {
        n0 = tile * (glu ? 8 : 16);
        ra = n0 + gid;
        rb = glu ? N + n0 + gid : n0 + gid + 8;
    }
    MEMRA_DEVICE int row(int r) const { return r ? rb : ra; }
    // the global superblock index of row r's superblock sb, its bulk, and (Q6_K) its meta window and offset
    MEMRA_DEVICE size_t unit(int r, int sb) const { return (size_t)row(r) * nsb + sb; }
    MEMRA_DEVICE const uint8_t* bulk_of(int r, int sb) const { return bulk + unit(r, sb) * QF_BULK; }
#if QF_TYPE == 14
    MEMRA_DEVICE const uint8_t* window_of(int r, int sb) const { return meta + ((unit(r, sb) * 18) & ~(size_t)3); }
    MEMRA_DEVICE int offset_of(int r, int sb) const { return (int)(unit(r, sb) & 1) * 2; }
    MEMRA_DEVICE void load(int sb, QfRegs& q) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t* p = bulk_of(r, sb);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int l0 = 16 * j + 4 * tig;
                    q.w[r][3 * (2 * h + j) + 0] = __ldg(reinterpret_cast<const uint32_t*>(p + 64 * h + l0));
                    q.w[r][3 * (2 * h + j) + 1] = __ldg(reinterpret_cast<const uint32_t*>(p + 64 * h + 32 + l0));
                    q.w[r][3 * (2 * h + j) + 2] = __ldg(reinterpret_cast<const uint32_t*>(p + 128 + 32 * h + l0));
                }
            const uint32_t* m = reinterpret_cast<const uint32_t*>(window_of(r, sb));
#pragma unroll
            for (int c = 0; c < 5; ++c) q.m[r][c] = __ldg(m + c);
            q.o[r] = offset_of(r, sb);
        }
    }
#else
    MEMRA_DEVICE void load(int sb, QfRegs& q) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t* p = bulk_of(r, sb) + 8 * tig;
#pragma unroll
            for (int j = 0; j < 4; ++j) q.w[r][j] = __ldg(reinterpret_cast<const uint2*>(p + 32 * j));
            q.m[r] = __ldg(reinterpret_cast<const uint4*>(meta + unit(r, sb) * 16));
        }
    }
#endif
};

template <bool GLU>
MEMRA_DEVICE void qf_mv_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                              const uint16_t* __restrict__ x, const float* __restrict__ xs2, float* y, const float* res,
                              int N, int K, int nb, int act) {
    __shared__ float part[QF_WARPS][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pair = blockIdx.x * QF_WARPS + warp;
    const int tiles = (GLU ? 2 * N : N) / 16;
    const bool live = pair < tiles * QF_CHAINS;
    const int tile = live ? pair / QF_CHAINS : 0, chain = pair % QF_CHAINS;
    const int nsb = K / 256, SB = nsb / QF_CHAINS, sb0 = chain * SB;
    const int gid = lane >> 2, tig = lane & 3;
    const bool xrow = gid < nb;
    const QfTile T(bulk, meta, tile, GLU, N, nsb, gid, tig);
    const uint16_t* xr = x + (size_t)(xrow ? gid : 0) * K + QF_XLANE * tig;
    const float* sr = xs2 + (size_t)(xrow ? gid : 0) * nsb * 16 + 4 * tig;
    (void)sr;
    // the register ring: QF_AHEAD superblocks loaded ahead of the one being computed (slots rotate, unrolled)
    constexpr int RING = QF_AHEAD + 1;
    QfRegs rq[RING];
#pragma unroll
    for (int r = 0; r < QF_AHEAD; ++r)
        if (live && r < SB) T.load(sb0 + r, rq[r]);
    MEMRA_PDL_WAIT();
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    if (live) {
        for (int i = 0; i < SB; i += RING) {
#pragma unroll
            for (int r = 0; r < RING; ++r) {
                if (i + r >= SB) break;
                const int nx = i + r + QF_AHEAD;   // refill the slot freed last step: superblock i + r + AHEAD
                if (nx < SB) {
                    const int slot = (r + QF_AHEAD) % RING;
                    T.load(sb0 + nx, rq[slot]);
                }
                const int sb = sb0 + i + r;
                // v17: the superblock's activations from one address, unpredicated: a lane of column gid >= nb reads
                // row 0's (xr, sr), whose products land in D columns no lane stores (qf_store: col < nb)
                const uint16_t* xb = xr + 256 * (size_t)sb;
#if QF_TYPE == 14
                qf6_superblock<1>(rq[r],
                    [&](int, int s) { return __ldg(reinterpret_cast<const uint2*>(xb + 16 * s)); }, acc);
#else
                qf_superblock<1>(rq[r].w, rq[r].m[0], rq[r].m[1], tig,
                    [&](int, int j, int h) { return __ldg(reinterpret_cast<const uint4*>(xb + 64 * j + 32 * h)); },
                    [&](int) { return __ldg(reinterpret_cast<const uint4*>(sr + 16 * (size_t)sb)); }, acc);
#endif
            }
        }
    }
    MEMRA_PDL_LAUNCH();
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][lane][e] = acc[0][e];
    __syncthreads();
    if (!live || chain != 0) return;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        v[e] = part[warp][lane][e];
#pragma unroll
        for (int c = 1; c < QF_CHAINS; ++c) v[e] = __fadd_rn(v[e], part[warp + c][lane][e]);
    }
    qf_store<GLU>(v, y, res, N, T.n0, gid, 0, tig, nb, act);
}

template <bool GLU>
MEMRA_DEVICE void qf_gemm_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                              const uint16_t* __restrict__ x, const float* __restrict__ xs2, float* y, const float* res,
                              float* ws, int* cnt, int N, int K, int nb, int act) {
    constexpr int R = 8 * QF_NT;
    extern __shared__ __align__(16) uint8_t qf_smem[];
    uint16_t* xsm = reinterpret_cast<uint16_t*>(qf_smem);                                    // [stage][R][XROW]
    float* ssm = reinterpret_cast<float*>(qf_smem + (size_t)QF_STAGES * R * QF_XROW * 2);   // [stage][R][16]
    // QF_WSMEM: [stage][warp][16 rows of QF_WROW bytes, then their QF_MROW meta bytes each]
    uint8_t* wsm = qf_smem + (size_t)QF_STAGES * R * (QF_XROW * 2 + 64);
    (void)wsm;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tiles = (GLU ? 2 * N : N) / 16;
    const bool live = blockIdx.x * QF_GWARPS + warp < tiles;
    const int tile = live ? blockIdx.x * QF_GWARPS + warp : 0;
    const int c0 = blockIdx.y * R;
    const int nsb = K / 256, SB = nsb / QF_CHAINS;
    const int sb0 = QF_KSPLIT ? blockIdx.z * SB : 0, nloc = QF_KSPLIT ? SB : nsb;   // this block's superblocks
    const int gid = lane >> 2, tig = lane & 3;
    const QfTile T(bulk, meta, tile, GLU, N, nsb, gid, tig);
    // v17: each thread's copies planned once (the per-superblock part of a source address is 256 sb elements of x,
    // sb units of the weight rows), so a stage issues its cp.async with one address add each instead of recomputing
    // rows, pieces and clamps (v16: ~530 of a warp's ~1,030 instructions a superblock, static SASS). The staged
    // layout is v16's byte for byte: only which thread copies which piece changes.
    // activations: thread copy j takes staged row warp + GWARPS j, piece lane (16 bytes: elements 8 lane ..), rows
    // >= nb zero-filled (their source: row 0's, never read); copies j < xn read a row < nb
    constexpr int XCP = (R + QF_GWARPS - 1) / QF_GWARPS;   // copies a thread makes a stage
    const uint32_t xbase = (uint32_t)(c0 + warp) * (uint32_t)K + 8 * lane, xstep = (uint32_t)QF_GWARPS * (uint32_t)K;
    const int xlim = min(nb - c0, R) - warp;
    const int xn = xlim > 0 ? (xlim + QF_GWARPS - 1) / QF_GWARPS : 0;
    const uint32_t xdl = 2 * (warp * QF_XROW + 8 * lane);
#if QF_TYPE == 12   // the sums: copy j of thread t takes staged row (t >> 2) + 8 GWARPS j's piece t & 3 (16 bytes)
    constexpr int SCP = (4 * R + 32 * QF_GWARPS - 1) / (32 * QF_GWARPS);
    const uint32_t sbase = (uint32_t)(c0 + (threadIdx.x >> 2)) * (uint32_t)(nsb * 16) + 4 * (threadIdx.x & 3);
    const uint32_t sstep = (uint32_t)(8 * QF_GWARPS) * (uint32_t)(nsb * 16);
    const int slim = min(nb - c0, R) - (int)(threadIdx.x >> 2);
    const int sn = slim > 0 ? (slim + 8 * QF_GWARPS - 1) / (8 * QF_GWARPS) : 0;
#endif
    auto stage_x = [&](int i, int s) {   // superblock sb0 + i's activations and sums into stage s
        const int sb = sb0 + i;
        const uint32_t xd = smem_u32(xsm + (size_t)s * R * QF_XROW) + xdl;
        const uint16_t* xs = x + 256 * (size_t)sb;
#pragma unroll
        for (int j = 0; j < XCP; ++j) {
            if (warp + QF_GWARPS * j >= R) break;   // (R % QF_GWARPS: the last copy's warps past R)
            const bool in = j < xn;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :: "r"(xd + 2 * QF_GWARPS * QF_XROW * j), "l"(xs + (in ? xbase + xstep * j : 8 * lane)),
                            "r"(in ? 16 : 0) : "memory");
        }
#if QF_TYPE == 12   // (Q6_K reads no sums)
        const uint32_t sd = smem_u32(ssm + (size_t)s * R * 16) + 16 * threadIdx.x;
        const float* ss = xs2 + 16 * (size_t)sb;
#pragma unroll
        for (int j = 0; j < SCP; ++j) {
            if (threadIdx.x + 32 * QF_GWARPS * j >= 4 * R) break;
            const bool in = j < sn;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :: "r"(sd + 16 * 32 * QF_GWARPS * j), "l"(ss + (in ? sbase + sstep * j : 4 * (threadIdx.x & 3))),
                            "r"(in ? 16 : 0) : "memory");
        }
#endif
    };
    // QF_WSMEM: superblock sb0 + i of the warp's own 16 A rows (row q: q < 8 the row of ra = n0 + q, else of rb) and
    // their meta into stage s; lane copies row q = lane & 15, its bulk pieces h + 2 j (h = lane >> 4) and, Q4_K: h 0's
    // the meta's 16 bytes, Q6_K: the meta window's 4-byte pieces 3 h .. 3 h + 2 (< 5)
    const int wq = lane & 15, wh = lane >> 4;
    const int wrow = wq < 8 ? T.n0 + wq : (GLU ? N + T.n0 + wq - 8 : T.n0 + wq);
    const uint8_t* wsrc = bulk + (size_t)wrow * nsb * QF_BULK + 16 * wh;
    const uint32_t wdl = warp * 16 * (QF_WROW + QF_MROW) + wq * QF_WROW + 16 * wh;    // its bulk pieces' place
    const uint32_t wml = warp * 16 * (QF_WROW + QF_MROW) + 16 * QF_WROW + QF_MROW * wq + (QF_TYPE == 14 ? 12 * wh : 0);
    auto stage_w = [&](int i, int s) {
        const int sb = sb0 + i;
        const uint32_t wd = smem_u32(wsm + (size_t)s * QF_GWARPS * 16 * (QF_WROW + QF_MROW));
        const uint8_t* p = wsrc + (size_t)sb * QF_BULK;
#pragma unroll
        for (int j = 0; j < QF_BULK / 32; ++j) cp16(wd + wdl + 32 * j, p + 32 * j);
#if QF_TYPE == 14   // the window's pieces 3 wh .. (pieces 0-2, then 3-4)
        const uint8_t* m = meta + ((((size_t)wrow * nsb + sb) * 18) & ~(size_t)3) + 12 * wh;
#pragma unroll
        for (int c = 0; c < 3; ++c)
            if (3 * wh + c < 5) cpn<4>(wd + wml + 4 * c, m + 4 * c);
#else
        if (wh == 0) cp16(wd + wml, meta + ((size_t)wrow * nsb + sb) * 16);
#endif
    };
    auto stage = [&](int i, int s) {
        stage_x(i, s);
        if (QF_WSMEM) stage_w(i, s);
    };
#if QF_WSMEM
#pragma unroll
    for (int s = 0; s < QF_STAGES - 1; ++s)   // the weights need no PDL wait: the first stages' before it
        if (s < nloc) stage_w(s, s);
    MEMRA_PDL_WAIT();
#pragma unroll
    for (int s = 0; s < QF_STAGES - 1; ++s) {
        if (s < nloc) stage_x(s, s);
        cp_commit();
    }
#else
    QfRegs rq[2];
    if (live) T.load(sb0, rq[0]);
    MEMRA_PDL_WAIT();
#pragma unroll
    for (int s = 0; s < QF_STAGES - 1; ++s) {
        if (s < nloc) stage(s, s);
        cp_commit();
    }
#endif
    // the parked chain sums (QF_KSPLIT 0, QF_CHAINS > 1): [output 4 QF_NT][thread], each lane's own
    float* park = reinterpret_cast<float*>(wsm + (QF_WSMEM ? (size_t)QF_STAGES * QF_GWARPS * 16 * (QF_WROW + QF_MROW) : 0))
                  + threadIdx.x;
    float acc[QF_NT][4];
#pragma unroll
    for (int t = 0; t < QF_NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    // superblock i staged for all (stage (i - 1) % STAGES free: the next one issued into it); a finished chain parked
    auto advance = [&](int i) {
        cp_wait<QF_STAGES - 2>();
        __syncthreads();
        if (i + QF_STAGES - 1 < nloc) stage(i + QF_STAGES - 1, (i + QF_STAGES - 1) % QF_STAGES);
        cp_commit();
        if (!QF_KSPLIT && QF_CHAINS > 1 && i > 0 && i % SB == 0) {   // park it (c0, then + c)
#pragma unroll
            for (int t = 0; t < QF_NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float& p = park[(4 * t + e) * 32 * QF_GWARPS];
                    p = i == SB ? acc[t][e] : __fadd_rn(p, acc[t][e]);
                    acc[t][e] = 0.f;
                }
        }
    };
    auto compute = [&](int i, const QfRegs& q) {
        const int s = i % QF_STAGES;
        const uint16_t* xb = xsm + (size_t)s * R * QF_XROW + gid * QF_XROW + QF_XLANE * tig;
#if QF_TYPE == 14
        qf6_superblock<QF_NT>(q,
            [&](int t, int sub) { return *reinterpret_cast<const uint2*>(xb + t * 8 * QF_XROW + 16 * sub); }, acc);
#else
        const float* sbp = ssm + (size_t)s * R * 16 + gid * 16 + 4 * tig;
        qf_superblock<QF_NT>(q.w, q.m[0], q.m[1], tig,
            [&](int t, int j, int h) {
                return *reinterpret_cast<const uint4*>(xb + t * 8 * QF_XROW + 64 * j + 32 * h);
            },
            [&](int t) { return *reinterpret_cast<const uint4*>(sbp + t * 8 * 16); }, acc);
#endif
    };
#if QF_WSMEM
    for (int i = 0; i < nloc; ++i) {
        advance(i);
        if (!live) continue;
        const uint8_t* wb = wsm + ((size_t)(i % QF_STAGES) * QF_GWARPS + warp) * 16 * (QF_WROW + QF_MROW);
        QfRegs q;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t* wr = wb + (gid + 8 * r) * QF_WROW;
#if QF_TYPE == 14
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int l0 = 16 * j + 4 * tig;
                    q.w[r][3 * (2 * h + j) + 0] = *reinterpret_cast<const uint32_t*>(wr + 64 * h + l0);
                    q.w[r][3 * (2 * h + j) + 1] = *reinterpret_cast<const uint32_t*>(wr + 64 * h + 32 + l0);
                    q.w[r][3 * (2 * h + j) + 2] = *reinterpret_cast<const uint32_t*>(wr + 128 + 32 * h + l0);
                }
            const uint32_t* m = reinterpret_cast<const uint32_t*>(wb + 16 * QF_WROW + QF_MROW * (gid + 8 * r));
#pragma unroll
            for (int c = 0; c < 5; ++c) q.m[r][c] = m[c];
            q.o[r] = T.offset_of(r, sb0 + i);
#else
#pragma unroll
            for (int j = 0; j < 4; ++j) q.w[r][j] = *reinterpret_cast<const uint2*>(wr + 32 * j + 8 * tig);
            q.m[r] = *reinterpret_cast<const uint4*>(wb + 16 * QF_WROW + 16 * (gid + 8 * r));
#endif
        }
        compute(i, q);
    }
#else
    auto step = [&](int i, const QfRegs& q, QfRegs& qn) {
        advance(i);
        if (live && i + 1 < nloc) T.load(sb0 + i + 1, qn);
        if (live) compute(i, q);
    };
    for (int i = 0; i < nloc; i += 2) {
        step(i, rq[0], rq[1]);
        if (i + 1 < nloc) step(i + 1, rq[1], rq[0]);
    }
#endif
    MEMRA_PDL_LAUNCH();
    const int Nw = GLU ? 2 * N : N;
    const int ra = T.n0 + gid, rb = GLU ? N + T.n0 + gid : T.n0 + gid + 8;
    if (QF_KSPLIT && QF_CHAINS > 1) {
        // this chain's sums into ws[chain][row][weight row]; the (x, y) tile's last block folds them in chain order
        __shared__ int last;
        if (live) {
#pragma unroll
            for (int t = 0; t < QF_NT; ++t)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int col = c0 + 8 * t + 2 * tig + c;
                    if (col >= nb) continue;
                    float* o = ws + ((size_t)blockIdx.z * nb + col) * Nw;
                    o[ra] = acc[t][c];
                    o[rb] = acc[t][2 + c];
                }
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            int* ct = cnt + blockIdx.y * gridDim.x + blockIdx.x;
            last = atomicAdd(ct, 1) == QF_CHAINS - 1;
            if (last) *ct = 0;
        }
        __syncthreads();
        if (!last || !live) return;
        __threadfence();
#pragma unroll
        for (int t = 0; t < QF_NT; ++t) {
            float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = c0 + 8 * t + 2 * tig + c;
                if (col >= nb) continue;
                for (int c_ = 0; c_ < QF_CHAINS; ++c_) {
#if MEMRA_CANARY == 2
                    const int ch = QF_CHAINS - 1 - c_;   // canary: the chains folded in reverse order
#else
                    const int ch = c_;
#endif
                    const float* o = ws + ((size_t)ch * nb + col) * Nw;
                    const float pa = __ldcg(o + ra), pb = __ldcg(o + rb);
                    v[c] = c_ ? __fadd_rn(v[c], pa) : pa;
                    v[2 + c] = c_ ? __fadd_rn(v[2 + c], pb) : pb;
                }
            }
            qf_store<GLU>(v, y, res, N, T.n0, gid, c0 + 8 * t, tig, nb, act);
        }
        return;
    }
    if (!live) return;
#pragma unroll
    for (int t = 0; t < QF_NT; ++t) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
            v[e] = QF_CHAINS > 1 ? __fadd_rn(park[(4 * t + e) * 32 * QF_GWARPS], acc[t][e]) : acc[t][e];
        qf_store<GLU>(v, y, res, N, T.n0, gid, c0 + 8 * t, tig, nb, act);
    }
}

extern "C" __global__ void __launch_bounds__(32 * QF_WARPS)
qf_mv(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
       const float* __restrict__ xs2, float* y, const float* res, int N, int K, int nb) {
    qf_mv_body<false>(bulk, meta, x, xs2, y, res, N, K, nb, 0);
}

extern "C" __global__ void __launch_bounds__(32 * QF_WARPS)
qf_mv_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
           const float* __restrict__ xs2, float* y, int N, int K, int nb, int act) {
    qf_mv_body<true>(bulk, meta, x, xs2, y, nullptr, N, K, nb, act);
}

extern "C" __global__ void __launch_bounds__(32 * QF_GWARPS)
qf_gemm(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
       const float* __restrict__ xs2, float* y, const float* res, float* ws, int* cnt, int N, int K, int nb) {
    qf_gemm_body<false>(bulk, meta, x, xs2, y, res, ws, cnt, N, K, nb, 0);
}

extern "C" __global__ void __launch_bounds__(32 * QF_GWARPS)
qf_gemm_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
           const float* __restrict__ xs2, float* y, float* ws, int* cnt, int N, int K, int nb, int act) {
    qf_gemm_body<true>(bulk, meta, x, xs2, y, nullptr, ws, cnt, N, K, nb, act);
}

// to_qf: the activation producer (x f32, nb rows of K, K a multiple of 256) -> xh (f16 in qf order) and xs2 (per
// row and superblock [tig 4][hi_tig, hi_tig+4, lo_tig, lo_tig+4]). A warp per superblock of a row: lane l converts
// elements 8 l .. 8 l + 7 (sub-block l / 4), stores them as e0 e2 e1 e3 e4 e6 e5 e7, sums its 8 f16 values in f32
// in increasing k, then its quad's sums as (l0 + l1) + (l2 + l3) (xor shuffles 1 then 2); S2's hi = tf32 (rna), lo =
// tf32 (S2 - hi). Launch: grid ceil(nb K / 256 / 8), block 256.
extern "C" __global__ void __launch_bounds__(256)
to_qf(const float* __restrict__ x, uint16_t* __restrict__ xh, float* __restrict__ xs2, int nb, int K) {
    MEMRA_PDL_WAIT();
    const int lane = threadIdx.x & 31;
    const size_t u = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);   // superblock index over all rows
    if (u >= (size_t)nb * (K / 256)) return;
    const float4* src = reinterpret_cast<const float4*>(x + u * 256 + 8 * lane);
    const float4 p = src[0], q = src[1];
    const float e[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
    uint16_t h[8];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        uint16_t v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(e[i]));
        h[i] = v;
        s = __fadd_rn(s, f16_to_f32(v));
    }
#if MEMRA_CANARY == 3
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));   // canary: (s0 + s2) + (s1 + s3)
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
#else
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
#endif
    uint4 o;
    o.x = h[0] | ((uint32_t)h[2] << 16);
    o.y = h[1] | ((uint32_t)h[3] << 16);
    o.z = h[4] | ((uint32_t)h[6] << 16);
    o.w = h[5] | ((uint32_t)h[7] << 16);
    *reinterpret_cast<uint4*>(xh + u * 256 + 8 * lane) = o;
    if ((lane & 3) == 0) {
        const int sub = lane >> 2, t = sub & 3, hi4 = sub >> 2;
        uint32_t hi, lo;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(s));
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(__fsub_rn(s, __uint_as_float(hi))));
        float* d = xs2 + u * 16 + 4 * t + hi4;
        d[0] = __uint_as_float(hi);
        d[2] = __uint_as_float(lo);
    }
    MEMRA_PDL_LAUNCH();
}
