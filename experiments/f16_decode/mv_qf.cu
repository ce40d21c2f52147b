// mv_qf.cu — experiment v8 (experiments/f16_decode/README.md, session 53): the "qf" arithmetic at 1..8 activation
// rows, Q4_K. Entries and arguments as mv_f16.cu's plus xs2 (the activation rows' sub-block sums).
//
// Arithmetic ("qf"): weights stay integers. For weight row n and sub-block s (32 k): q in 0..15 exactly in f16 (the
// exponent trick, one exact subtraction); S1 = the tensor core's f32 sum of q x over the sub-block (mma.sync
// m16n8k16 twice from a zero accumulator: its k16 steps in increasing k, the sum inside a step the hardware's,
// slot-invariant: perm_probe.py); S2 = xs2[b][s], the activation row's sub-block sum (one definition, computed once
// per activation row by whoever makes x: here the host); then per output, sub-blocks in increasing k:
// acc = fma(d sc, S1, acc), acc = fma(-(dmin m), S2, acc) (d sc, dmin m exact in f32). Chains over K as mv_f16's
// (MQ_CHAINS), folded left; then the epilogue. The 64-row GEMM would run the same per-sub-block steps (wgmma k16
// pairs from zero, the same fold) — no per-weight float work, two FFMA per output and 32 k.
//
// Work (v7's layout): a warp owns 8 weight rows as mma's B operand (glu: gate / up rows of 4 outputs in columns 2 t /
// 2 t + 1) and one chain; the activation rows are A's rows gid < nb (rows gid + 8 zero). Per 64-k pair of sub-blocks
// lane (gid, tig) loads 8 bytes of its row's nibbles (elements 8 tig .. 8 tig + 7 of both sub-blocks) and x[gid]'s
// 8 halves of each sub-block at the same elements: step 1 elements 8 tig + 0..3 (slots 2 tig, +1 <- e0, e2; 2 tig +
// 8, +9 <- e1, e3), step 2 elements 8 tig + 4..7. The lane's D holds outputs (gid, 2 tig), (gid, 2 tig + 1), so it
// needs the scales of weight rows 2 tig, 2 tig + 1 (not its own B row): it loads their 16 meta bytes a superblock.
// Weights and meta one superblock ahead in registers (MQ_AHEAD 1), before the PDL wait for the first.
//
// MQ_WA 1 (v9): the weights as mma's A operand instead (16 weight rows a warp, glu: gate rows gid, up rows gid + 8 of
// 8 outputs), the activation rows as B's columns gid < nb: a lane dequantizes rows gid and gid + 8 (the same
// elements) and its D holds those rows x activation rows 2 tig, 2 tig + 1, so it folds with its own rows' scales
// (4 lanes share a row's scale work instead of 8). v8's SASS: ~45 instructions a sub-block for 256 weights (scales
// of two other rows 16, dequant 10, x 6, fold 4); v9's estimate ~58 for 512.
// v10 options (MQ_WA 1), the same bits if the tensor core's sum scales exactly by powers of two (asked on the device:
// qf_probe.py's differ against v9): MQ_SUBN 1 feeds q as the f16 subnormal q 2^-24 (low nibbles: w & 0x000F000F)
// or 16 q 2^-24 = q 2^-20 (high nibbles: w & 0x00F000F0, no shift) — one LOP3 a pair of weights instead of SHF + LOP3
// + HSUB2 — and folds with d 2^24 sc / d 2^20 sc (exact); MQ_SHARE 1: lane tig of a quad computes the scales of
// sub-blocks 2 tig, 2 tig + 1 of rows gid, gid + 8 (mv_k4bf's branch-free pair) and the quad shuffles them.
// Tunables: MQ_WARPS (4), MQ_CHAINS (1; divides MQ_WARPS), MQ_AHEAD (1: superblocks in flight beyond the current),
// MQ_WA (0), MQ_SUBN (0), MQ_SHARE (0), MQ_MINB (0), MQ_XV (0: see ldx).
// MQ_TL 1 (v11, MQ_WA): `bulk` holds the nibbles in the tile layout instead of the planes: per 16-row tile (v9's A
// rows: glu the gate rows n0 .. n0 + 7 then their up rows; plain rows n0 .. n0 + 15) and superblock, 2,048 bytes in
// [tig 4][half 2][A row 16][pair 2][8 bytes] order (half h: pairs 2h, 2h + 1), so lane (gid, tig) reads rows gid and
// gid + 8 as four 16-byte loads and a warp's load covers four 128-byte lines (v9: 8-byte slices, 8 rows a load).
// The same bytes and arithmetic: the same bits as v9. MQ_TL 2: the meta plane tiled too ([tile][superblock][A row
// 16][16 bytes]: a warp's meta load one 128-byte line instead of 8 rows' pieces).
// MQ_PF n (v12, MQ_TL 2): each superblock step, one warp-wide prefetch.global.L2 of the tile's bytes n superblocks
// beyond the register ring (lanes 0..15 a nibble line each, 16..17 the meta's): bytes in flight without registers.
// MQ_ABL (0), an ablation bit mask for timing only (the outputs are wrong): 1 the scales constant (no extraction /
// I2F / FMUL), 2 one x load a superblock instead of eight, 4 no dequant (the raw words as A), 8 no mma (an XOR into
// D instead), 16 no fold (acc += D), 32 no S2 loads.
// Launch: grid ceil(T C / MQ_WARPS), T = Nw / 8 (MQ_WA: Nw / 16; Nw = N, 2N for glu), block 32 MQ_WARPS. K a
// multiple of 256 C.
// Versions (research/2026-12-07-session53/f16/qf.jsonl, NVIDIA H100, the 8B gate+up Q4_K at one row; mv_q8 24.6 µs):
//  v8  (MQ_WA 0) weights as B: 53.6 µs at its best (2 chains): the D columns' scales are two other rows' (8x work).
//  v9  (MQ_WA 1) weights as A: 33.4 (4 chains); 8 rows 37.9 against mvt's 47.5. Bits = v8's (the operand roles do
//      not change the sum). ncu: 162 registers, 56 % DRAM, stalls long-scoreboard 31 %.
//  v10 MQ_SUBN 31.5 but other bits (subnormal sums are not 2^-24 times the normal ones); MQ_SHARE 37.6 (shuffles
//      cost more than the scale work they share); MQ_MINB 4 / 5, MQ_XV: slower or no change.
//      MQ_ABL: with everything but the weight / meta loads removed, 27.8 (the skeleton is the bound).
//  v11 MQ_TL 1 / 2 (the tile layout, the meta tiled too): 32.6 / 32.1 (2 chains 31.9); the skeleton 27.2 / 26.5 —
//      not the access pattern either: ncu of the skeleton, 70 % DRAM, 60 % long-scoreboard at 24 warps an SM with
//      one superblock (2.3 KB a warp) in flight.
//  v12 MQ_PF 1-8 (an L2 prefetch beyond the ring): slower everywhere (32.2 -> 35.3-40.3; the skeleton 26.5 -> 30.2).
#include "common.cuh"
#include "smem_stage.cuh"

#ifndef MQ_WARPS
#define MQ_WARPS 4
#endif
#ifndef MQ_CHAINS
#define MQ_CHAINS 1
#endif
#ifndef MQ_AHEAD
#define MQ_AHEAD 1
#endif
#ifndef MQ_WA
#define MQ_WA 0
#endif
#ifndef MQ_SUBN
#define MQ_SUBN 0   // v10 (MQ_WA): q as an f16 subnormal, no exponent trick (see the header)
#endif
#ifndef MQ_SHARE
#define MQ_SHARE 0  // v10 (MQ_WA): a quad's 4 lanes share the scale work (rows gid, gid + 8) by shuffles
#endif
#ifndef MQ_XV
#define MQ_XV 0
#endif
#ifndef MQ_TL
#define MQ_TL 0     // v11 (MQ_WA): the nibbles in the tile layout (qf_probe.py's tile_layout; see the header)
#endif
#if MQ_TL && !MQ_WA
#error "MQ_TL needs MQ_WA 1"
#endif
#ifndef MQ_PF
#define MQ_PF 0     // v12 (MQ_TL 2): an L2 prefetch distance in superblocks beyond the register ring (0: none)
#endif
#if MQ_PF && MQ_TL < 2
#error "MQ_PF needs MQ_TL 2"
#endif
#ifndef MQ_ABL
#define MQ_ABL 0    // ablation (wrong results, timing only; MQ_WA 1 without SUBN / SHARE): see the header
#endif
#ifndef MQ_MINB
#define MQ_MINB 0   // __launch_bounds__'s minimum blocks an SM (a register budget; 0: none)
#endif
#if MQ_MINB
#define MQ_BOUNDS __launch_bounds__(32 * MQ_WARPS, MQ_MINB)
#else
#define MQ_BOUNDS __launch_bounds__(32 * MQ_WARPS)
#endif
#if (MQ_SUBN || MQ_SHARE) && !MQ_WA
#error "MQ_SUBN / MQ_SHARE need MQ_WA 1"
#endif
static_assert(MQ_WARPS % MQ_CHAINS == 0, "MQ: a tile's chains share a block");
static_assert(MQ_AHEAD >= 1 && MQ_AHEAD <= 3, "MQ_AHEAD 1..3");

MEMRA_DEVICE void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                          uint32_t b1) {
#if MQ_XV
    asm volatile(
#else
    asm(
#endif
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// nibbles 0 and 2 of v's halves (bits 0..3 of each 16-bit half) as exact f16 integers: (1024 + q) - 1024
MEMRA_DEVICE uint32_t nib_h2(uint32_t v) {
    uint32_t t, r;
    asm("lop3.b32 %0, %1, 0x000F000F, 0x64006400, 0xEA;" : "=r"(t) : "r"(v));   // (v & mask) | magic
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(t), "r"(0x64006400u));
    return r;
}
// x's 16 bytes; MQ_XV 1: as volatile asm, which the compiler keeps in program order with the (then volatile) mma,
// so a superblock's x loads are not all hoisted to its start (v9: 162 registers, 12 warps an SM)
MEMRA_DEVICE uint4 ldx(const uint16_t* p) {
#if MQ_XV
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}
// MQ_ABL's stand-ins: NIB (4: the raw word), MMA_A (8: an XOR of the fragments into D instead of the mma)
#if MQ_ABL & 4
#define NIB(v) (v)
#else
#define NIB(v) nib_h2(v)
#endif
#if MQ_ABL & 8
#define MMA_A(d, a0, a1, a2, a3, b0, b1) do { \
    d[0] += __uint_as_float(((a0) ^ (b0)) & 0x3F7FFFFFu); d[1] += __uint_as_float(((a1) ^ (b1)) & 0x3F7FFFFFu); \
    d[2] += __uint_as_float(((a2) ^ (b0)) & 0x3F7FFFFFu); d[3] += __uint_as_float(((a3) ^ (b1)) & 0x3F7FFFFFu); \
} while (0)
#else
#define MMA_A(d, a0, a1, a2, a3, b0, b1) mma_f16(d, a0, a1, a2, a3, b0, b1)
#endif
MEMRA_DEVICE uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }
// sub-block s (compile-time) of a Q4_K meta (x: d | dmin; y, z, w: scales[0..11]): d sc, dmin m (exact in f32)
template <int s>
MEMRA_DEVICE void k4_scales(const uint4& m, float d, float dmin, float& dsc, float& dm) {
    int sc, mn;
    if (s < 4) {
        sc = (m.y >> (8 * (s & 3))) & 63;
        mn = (m.z >> (8 * (s & 3))) & 63;
    } else {
        constexpr int i = s & 3;
        sc = ((m.w >> (8 * i)) & 0xF) | (((m.y >> (8 * i + 6)) & 3) << 4);
        mn = ((m.w >> (8 * i + 4)) & 0xF) | (((m.z >> (8 * i + 6)) & 3) << 4);
    }
    dsc = __fmul_rn(d, (float)sc);
    dm = __fmul_rn(dmin, (float)mn);
}

// sub-blocks 2j, 2j + 1 (run-time j) of a Q4_K meta without branches (experiments/mv_k4bf's rowscal): sc, mn pairs
MEMRA_DEVICE void k4_pair(const uint4& m, int j, int (&sc)[2], int (&mn)[2]) {
    const int sh = 16 * (j & 1);
    const uint32_t yy = m.y >> sh, zz = m.z >> sh, ww = m.w >> sh;
    const uint32_t c = j >= 2 ? ((ww & 0x0F0Fu) | ((yy >> 2) & 0x3030u)) : (yy & 0x3F3Fu);
    const uint32_t n = j >= 2 ? (((ww >> 4) & 0x0F0Fu) | ((zz >> 2) & 0x3030u)) : (zz & 0x3F3Fu);
    sc[0] = (int)(c & 0xFFu); sc[1] = (int)((c >> 8) & 0xFFu);
    mn[0] = (int)(n & 0xFFu); mn[1] = (int)((n >> 8) & 0xFFu);
}
// the scales of sub-block s (run-time s, in an unrolled loop: a constant) of meta m
MEMRA_DEVICE void k4_sub(int s, const uint4& m, float d, float dmin, float& dsc, float& dm) {
    switch (s) {
    case 0: k4_scales<0>(m, d, dmin, dsc, dm); break;
    case 1: k4_scales<1>(m, d, dmin, dsc, dm); break;
    case 2: k4_scales<2>(m, d, dmin, dsc, dm); break;
    case 3: k4_scales<3>(m, d, dmin, dsc, dm); break;
    case 4: k4_scales<4>(m, d, dmin, dsc, dm); break;
    case 5: k4_scales<5>(m, d, dmin, dsc, dm); break;
    case 6: k4_scales<6>(m, d, dmin, dsc, dm); break;
    default: k4_scales<7>(m, d, dmin, dsc, dm); break;
    }
}

template <bool GLU>
MEMRA_DEVICE void mv_qf_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                             const uint16_t* __restrict__ x, const float* __restrict__ xs2, float* y, const float* res,
                             int N, int K, int nb, int act) {
    constexpr int TR = MQ_WA ? 16 : 8;   // weight rows a warp
    constexpr int NA = MQ_WA ? 4 : 2;    // accumulators a lane
    __shared__ float part[MQ_WARPS][32][NA];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pair = blockIdx.x * MQ_WARPS + warp;
    const int tiles = (GLU ? 2 * N : N) / TR;
    const bool live = pair < tiles * MQ_CHAINS;
    const int tile = live ? pair / MQ_CHAINS : 0, chain = pair % MQ_CHAINS;
    const int n0 = tile * (GLU ? TR / 2 : TR);
    const int nsb = K / 256, SB = nsb / MQ_CHAINS, sb0 = chain * SB;   // this chain's superblocks
    const int gid = lane >> 2, tig = lane & 3;
    const bool xrow = gid < nb;
#if MQ_WA
    // A rows gid, gid + 8: glu the gate and up rows of output n0 + gid; the lane's D: those rows x columns 2 tig, + 1
    const int ra = GLU ? n0 + gid : n0 + gid, rb = GLU ? N + n0 + gid : n0 + gid + 8;
    const int ca = min(2 * tig, nb - 1), cb = min(2 * tig + 1, nb - 1);   // D columns' activation rows (clamped)
#if MQ_TL
    const uint8_t* tbase = bulk + (size_t)tile * nsb * 2048;   // the tile's nibbles (and meta, MQ_TL 2: mbase)
    const uint8_t* mbase = meta + (size_t)tile * nsb * 256;
    (void)tbase; (void)mbase;
    const uint8_t* qa = bulk + (size_t)tile * nsb * 2048 + 512 * tig + 16 * gid;   // row gid; row gid + 8 at + 128
    const uint8_t* qb = qa + 128;
#else
    const uint8_t* qa = bulk + (size_t)ra * nsb * 128 + 8 * tig;
    const uint8_t* qb = bulk + (size_t)rb * nsb * 128 + 8 * tig;
#endif
#if MQ_TL >= 2
    // the meta tiled too: per tile and superblock its 16 A rows' 16 bytes (256 bytes), row gid then gid + 8
    const uint4* m0p = reinterpret_cast<const uint4*>(meta + (size_t)tile * nsb * 256 + 16 * gid);
    const uint4* m1p = m0p + 8;
#else
    const uint4* m0p = reinterpret_cast<const uint4*>(meta + (size_t)ra * nsb * 16);
    const uint4* m1p = reinterpret_cast<const uint4*>(meta + (size_t)rb * nsb * 16);
#endif
    const float* s2a = xs2 + (size_t)ca * (K / 32);
    const float* s2b = xs2 + (size_t)cb * (K / 32);
#else
    const int wr = GLU ? ((gid & 1) ? N + n0 + (gid >> 1) : n0 + (gid >> 1)) : n0 + gid;   // B column gid's row
    const int f0 = GLU ? n0 + tig : n0 + 2 * tig, f1 = GLU ? N + n0 + tig : n0 + 2 * tig + 1;   // D columns' rows
    const uint8_t* qa = bulk + (size_t)wr * nsb * 128 + 8 * tig;
    const uint4* m0p = reinterpret_cast<const uint4*>(meta + (size_t)f0 * nsb * 16);
    const uint4* m1p = reinterpret_cast<const uint4*>(meta + (size_t)f1 * nsb * 16);
    const float* s2a = xs2 + (size_t)(xrow ? gid : 0) * (K / 32);
#endif
    const uint16_t* xr = x + (size_t)(xrow ? gid : 0) * K + 8 * tig;

    // ring: a superblock's 4 pairs x 8 bytes of nibbles (of each loaded row) and two rows' meta
    constexpr int NW = MQ_WA ? 2 : 1;
    uint2 wq[MQ_AHEAD + 1][NW][4];
    uint4 mA[MQ_AHEAD + 1], mB[MQ_AHEAD + 1];
    auto load = [&](int sb, uint2 (&w)[NW][4], uint4& a, uint4& b) {
#if MQ_TL
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const uint4 v = __ldg(reinterpret_cast<const uint4*>((r ? qb : qa) + (size_t)sb * 2048 + 256 * hh));
                w[r][2 * hh] = make_uint2(v.x, v.y);
                w[r][2 * hh + 1] = make_uint2(v.z, v.w);
            }
#else
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            w[0][j] = __ldg(reinterpret_cast<const uint2*>(qa + (size_t)sb * 128 + 32 * j));
#if MQ_WA
            w[1][j] = __ldg(reinterpret_cast<const uint2*>(qb + (size_t)sb * 128 + 32 * j));
#endif
        }
#endif
        a = __ldg(m0p + (MQ_TL >= 2 ? 16 : 1) * sb);
        b = __ldg(m1p + (MQ_TL >= 2 ? 16 : 1) * sb);
    };
#pragma unroll
    for (int i = 0; i < MQ_AHEAD; ++i)
        if (live && i < SB) load(sb0 + i, wq[i], mA[i], mB[i]);
    MEMRA_PDL_WAIT();

    float acc[NA];
#pragma unroll
    for (int e = 0; e < NA; ++e) acc[e] = 0.f;
    auto superblock = [&](int sb, const uint2 (&w)[NW][4], const uint4& ma, const uint4& mb) {
        const float da = f16_to_f32((uint16_t)ma.x), dmina = f16_to_f32((uint16_t)(ma.x >> 16));
        const float db = f16_to_f32((uint16_t)mb.x), dminb = f16_to_f32((uint16_t)(mb.x >> 16));
#if MQ_SHARE
        // lane tig: sub-blocks 2 tig (p 0), 2 tig + 1 (p 1) of rows gid (a), gid + 8 (b); [p][row][dsc, dm]
        float sh[2][2][2];
        {
            int sca[2], mna[2], scb[2], mnb[2];
            k4_pair(ma, tig, sca, mna);
            k4_pair(mb, tig, scb, mnb);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const float ea = MQ_SUBN ? __fmul_rn(da, q ? 1048576.f : 16777216.f) : da;   // d 2^20 / d 2^24
                const float eb = MQ_SUBN ? __fmul_rn(db, q ? 1048576.f : 16777216.f) : db;
                sh[q][0][0] = __fmul_rn(ea, (float)sca[q]); sh[q][0][1] = __fmul_rn(dmina, (float)mna[q]);
                sh[q][1][0] = __fmul_rn(eb, (float)scb[q]); sh[q][1][1] = __fmul_rn(dminb, (float)mnb[q]);
            }
        }
#elif MQ_SUBN
        const float da24 = __fmul_rn(da, 16777216.f), da20 = __fmul_rn(da, 1048576.f);
        const float db24 = __fmul_rn(db, 16777216.f), db20 = __fmul_rn(db, 1048576.f);
#endif
        const float4* s2p = reinterpret_cast<const float4*>(s2a + 8 * sb);
#if MQ_ABL & 32
        const float4 sa0 = make_float4(1.f, 2.f, 3.f, 4.f), sa1 = sa0;
        (void)s2p;
#else
        const float4 sa0 = xrow || MQ_WA ? __ldg(s2p) : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 sa1 = xrow || MQ_WA ? __ldg(s2p + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
        const float s2[8] = {sa0.x, sa0.y, sa0.z, sa0.w, sa1.x, sa1.y, sa1.z, sa1.w};
#if MQ_WA
        const float4* s2q = reinterpret_cast<const float4*>(s2b + 8 * sb);
#if MQ_ABL & 32
        const float4 sb0v = make_float4(5.f, 6.f, 7.f, 8.f), sb1v = sb0v;
        (void)s2q;
#else
        const float4 sb0v = __ldg(s2q), sb1v = __ldg(s2q + 1);
#endif
        const float s2o[8] = {sb0v.x, sb0v.y, sb0v.z, sb0v.w, sb1v.x, sb1v.y, sb1v.z, sb1v.w};
#endif
#if MQ_ABL & 2
        uint4 x0a, x0b;
#endif
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            // x[gid] at elements 8 tig .. 8 tig + 7 of sub-blocks 2j (k 64 j ..) and 2j + 1 (k 64 j + 32 ..)
#if MQ_ABL & 2
            if (j == 0) {
                x0a = xrow ? ldx(xr + 256 * sb) : make_uint4(0, 0, 0, 0);
                x0b = make_uint4(x0a.y, x0a.z, x0a.w, x0a.x);
            }
            const uint4 xa = x0a, xb = x0b;
#else
            const uint4 xa = xrow ? ldx(xr + 256 * sb + 64 * j) : make_uint4(0, 0, 0, 0);
            const uint4 xb = xrow ? ldx(xr + 256 * sb + 64 * j + 32) : make_uint4(0, 0, 0, 0);
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {   // h 0: sub-block 2j (low nibbles), 1: 2j + 1 (high nibbles)
                const uint4& xv = h ? xb : xa;
                const int sub = 2 * j + h;
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                float dsa, dma, dsb, dmb;
#if MQ_SHARE
                {
                    const int src = (lane & ~3) | j;   // the quad lane that computed pair j
                    dsa = __shfl_sync(0xffffffffu, sh[h][0][0], src);
                    dma = __shfl_sync(0xffffffffu, sh[h][0][1], src);
                    dsb = __shfl_sync(0xffffffffu, sh[h][1][0], src);
                    dmb = __shfl_sync(0xffffffffu, sh[h][1][1], src);
                }
#elif MQ_SUBN
                k4_sub(sub, ma, h ? da20 : da24, dmina, dsa, dma);
                k4_sub(sub, mb, h ? db20 : db24, dminb, dsb, dmb);
#elif MQ_ABL & 1
                dsa = da; dma = dmina; dsb = db; dmb = dminb;
#else
                k4_sub(sub, ma, da, dmina, dsa, dma);
                k4_sub(sub, mb, db, dminb, dsb, dmb);
#endif
#if MQ_WA && MQ_SUBN
                {
                    const uint32_t mk = h ? 0x00F000F0u : 0x000F000Fu;   // q 2^-24 / 16 q 2^-24 as f16 subnormals
                    const uint32_t u0 = w[0][j].x, u1 = w[0][j].y, v0 = w[1][j].x, v1 = w[1][j].y;
                    mma_f16(d, u0 & mk, v0 & mk, (u0 >> 8) & mk, (v0 >> 8) & mk,
                            prmt(xv.x, xv.y, 0x5410), prmt(xv.x, xv.y, 0x7632));
                    mma_f16(d, u1 & mk, v1 & mk, (u1 >> 8) & mk, (v1 >> 8) & mk,
                            prmt(xv.z, xv.w, 0x5410), prmt(xv.z, xv.w, 0x7632));
                }
#endif
#if MQ_WA
#if !MQ_SUBN
                const uint32_t u0 = w[0][j].x >> (4 * h), u1 = w[0][j].y >> (4 * h);   // row gid
                const uint32_t v0 = w[1][j].x >> (4 * h), v1 = w[1][j].y >> (4 * h);   // row gid + 8
                mma_f16(d, nib_h2(u0), nib_h2(v0), nib_h2(u0 >> 8), nib_h2(v0 >> 8),
                        prmt(xv.x, xv.y, 0x5410), prmt(xv.x, xv.y, 0x7632));
                mma_f16(d, nib_h2(u1), nib_h2(v1), nib_h2(u1 >> 8), nib_h2(v1 >> 8),
                        prmt(xv.z, xv.w, 0x5410), prmt(xv.z, xv.w, 0x7632));
#endif
                // D: (row gid, col 2 tig), (gid, 2 tig + 1), (gid + 8, 2 tig), (gid + 8, 2 tig + 1)
#if MQ_ABL & 16
                acc[0] += d[0] + dsa + dma + s2[sub]; acc[1] += d[1] + s2o[sub];
                acc[2] += d[2] + dsb + dmb; acc[3] += d[3];
#else
                acc[0] = __fmaf_rn(-dma, s2[sub], __fmaf_rn(dsa, d[0], acc[0]));
                acc[1] = __fmaf_rn(-dma, s2o[sub], __fmaf_rn(dsa, d[1], acc[1]));
                acc[2] = __fmaf_rn(-dmb, s2[sub], __fmaf_rn(dsb, d[2], acc[2]));
                acc[3] = __fmaf_rn(-dmb, s2o[sub], __fmaf_rn(dsb, d[3], acc[3]));
#endif
#else
                const uint32_t w0 = w[0][j].x >> (4 * h), w1 = w[0][j].y >> (4 * h);
                mma_f16(d, prmt(xv.x, xv.y, 0x5410), 0u, prmt(xv.x, xv.y, 0x7632), 0u, nib_h2(w0), nib_h2(w0 >> 8));
                mma_f16(d, prmt(xv.z, xv.w, 0x5410), 0u, prmt(xv.z, xv.w, 0x7632), 0u, nib_h2(w1), nib_h2(w1 >> 8));
                const float sv = s2[sub];
                acc[0] = __fmaf_rn(-dma, sv, __fmaf_rn(dsa, d[0], acc[0]));
                acc[1] = __fmaf_rn(-dmb, sv, __fmaf_rn(dsb, d[1], acc[1]));
#endif
            }
        }
    };
    if (live) {
        for (int i = 0; i < SB; i += MQ_AHEAD + 1) {
#pragma unroll
            for (int r = 0; r <= MQ_AHEAD; ++r) {
                if (i + r >= SB) break;
                const int nx = i + r + MQ_AHEAD;   // refill the slot before r's: superblock i + r + AHEAD
                if (nx < SB) {
                    const int slot = (r + MQ_AHEAD) % (MQ_AHEAD + 1);
                    load(sb0 + nx, wq[slot], mA[slot], mB[slot]);
                }
#if MQ_PF
                // v12: one L2 prefetch a warp of superblock i + r + AHEAD + MQ_PF's tile bytes (16 lines of nibbles,
                // 2 of meta: lanes 0..17), no registers
                if (nx + MQ_PF < SB && lane < 18) {
                    const uint8_t* pf = lane < 16 ? tbase + (size_t)(sb0 + nx + MQ_PF) * 2048 + 128 * lane
                                                  : mbase + (size_t)(sb0 + nx + MQ_PF) * 256 + 128 * (lane - 16);
                    asm volatile("prefetch.global.L2 [%0];" :: "l"(pf));
                }
#endif
                superblock(sb0 + i + r, wq[r], mA[r], mB[r]);
            }
        }
    }
    MEMRA_PDL_LAUNCH();
#pragma unroll
    for (int e = 0; e < NA; ++e) part[warp][lane][e] = acc[e];
    __syncthreads();
    if (!live || chain != 0) return;
    float v[NA];
#pragma unroll
    for (int e = 0; e < NA; ++e) {
        v[e] = part[warp][lane][e];
#pragma unroll
        for (int c = 1; c < MQ_CHAINS; ++c) v[e] = __fadd_rn(v[e], part[warp + c][lane][e]);
    }
#if MQ_WA
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int col = 2 * tig + c;
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
#else
    if (!xrow) return;
    if (GLU) {
        y[(size_t)gid * N + n0 + tig] = __fmul_rn(act == 2 ? gelu_tanh_f32(v[0]) : silu_f32(v[0]), v[1]);
    } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const size_t o = (size_t)gid * N + n0 + 2 * tig + e;
            y[o] = res ? __fadd_rn(res[o], v[e]) : v[e];
        }
    }
#endif
}

extern "C" __global__ void MQ_BOUNDS
mv_qf(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
      const float* __restrict__ xs2, float* y, const float* res, int N, int K, int nb) {
    mv_qf_body<false>(bulk, meta, x, xs2, y, res, N, K, nb, 0);
}

extern "C" __global__ void MQ_BOUNDS
mv_qf_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
          const float* __restrict__ xs2, float* y, int N, int K, int nb, int act) {
    mv_qf_body<true>(bulk, meta, x, xs2, y, nullptr, N, K, nb, act);
}

// ---- gm_qf (v13): the qf arithmetic for 8 GQ_NT activation rows a block column (issue 11's 8..64-row step) ----
// The same per-output operations as mv_qf at MQ_WA 1 and the same MQ_CHAINS, so every activation row's outputs have
// the one-row launch's bits: a warp owns one 16-row A tile (v9's rows: glu gate rows n0 + gid, up rows N + n0 + gid;
// plain rows n0 + gid, + 8) and all of the block column's activation rows (GQ_NT n8 tiles), walking K in increasing
// superblocks; a chain's sum is parked at its end and the chains are folded left as mv_qf's epilogue does
// (tot = c0, tot = tot + c1, ...). Per sub-block and n8 tile: d = two m16n8k16 from zero with mv_qf's slots (elements
// 8 tig + 0, 2 | 1, 3 then + 4 ..), then mv_qf's two FMA an output. The block's warps share each superblock's
// activations (8 GQ_NT rows x 256 halves, rows padded to GQ_XROW halves: a quarter warp's LDS.128 reads two rows 16
// banks apart) and their sub-block sums ([sub][row]), staged by cp.async GQ_STAGES deep (rows >= nb zero-filled); the
// weights and meta ride a register ring one superblock ahead as in mv_qf (the first before the PDL wait); a finished
// chain's sums are parked in shared memory (registers for two sets of 4 GQ_NT outputs took 255 at GQ_NT 8).
// Launch: grid (ceil(T / GQ_WARPS), ceil(nb / (8 GQ_NT))), T = Nw / 16, block 32 GQ_WARPS, dynamic shared memory
// GQ_STAGES 8 GQ_NT (2 GQ_XROW + 32) + (MQ_CHAINS > 1: 4 GQ_NT 32 GQ_WARPS 4) bytes. K a multiple of 256 MQ_CHAINS.
#ifndef GQ_NT
#define GQ_NT 8
#endif
#ifndef GQ_STAGES
#define GQ_STAGES 2
#endif
#ifndef GQ_WARPS
#define GQ_WARPS MQ_WARPS   // gm_qf's warps a block (one 16-row A tile each)
#endif
#define GQ_XROW 288
static_assert(GQ_STAGES >= 2 && GQ_STAGES <= 4, "GQ_STAGES 2..4");

MEMRA_DEVICE void cp16z(uint32_t dst, const void* src, int n) {   // 16 bytes, the source's first n read (0 or 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}

template <bool GLU>
MEMRA_DEVICE void gm_qf_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                             const uint16_t* __restrict__ x, const float* __restrict__ xs2, float* y, const float* res,
                             int N, int K, int nb, int act) {
    constexpr int R = 8 * GQ_NT;
    extern __shared__ __align__(16) uint8_t gq_smem[];
    uint16_t* xsm = reinterpret_cast<uint16_t*>(gq_smem);                                       // [stage][R][XROW]
    float* s2sm = reinterpret_cast<float*>(gq_smem + (size_t)GQ_STAGES * R * GQ_XROW * 2);     // [stage][sub][R]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tiles = (GLU ? 2 * N : N) / 16;
    const bool live = blockIdx.x * GQ_WARPS + warp < tiles;
    const int tile = live ? blockIdx.x * GQ_WARPS + warp : 0;
    const int n0 = tile * (GLU ? 8 : 16), c0 = blockIdx.y * R;
    const int nsb = K / 256, SB = nsb / MQ_CHAINS;
    const int gid = lane >> 2, tig = lane & 3;
    const int ra = n0 + gid, rb = GLU ? N + n0 + gid : n0 + gid + 8;
    const uint8_t* qa = bulk + (size_t)ra * nsb * 128 + 8 * tig;
    const uint8_t* qb = bulk + (size_t)rb * nsb * 128 + 8 * tig;
    const uint4* m0p = reinterpret_cast<const uint4*>(meta + (size_t)ra * nsb * 16);
    const uint4* m1p = reinterpret_cast<const uint4*>(meta + (size_t)rb * nsb * 16);

    auto load = [&](int sb, uint2 (&w)[2][4], uint4& a, uint4& b) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            w[0][j] = __ldg(reinterpret_cast<const uint2*>(qa + (size_t)sb * 128 + 32 * j));
            w[1][j] = __ldg(reinterpret_cast<const uint2*>(qb + (size_t)sb * 128 + 32 * j));
        }
        a = __ldg(m0p + sb);
        b = __ldg(m1p + sb);
    };
    auto stage = [&](int sb, int s) {   // superblock sb's activations and sub-block sums into stage s
        const uint32_t xd = smem_u32(xsm + (size_t)s * R * GQ_XROW);
        for (int i = threadIdx.x; i < R * 32; i += 32 * GQ_WARPS) {
            const int r = i >> 5, c = i & 31, row = c0 + r;
            cp16z(xd + 2 * (r * GQ_XROW + 8 * c), x + (size_t)(row < nb ? row : 0) * K + 256 * sb + 8 * c,
                  row < nb ? 16 : 0);
        }
        const uint32_t sd = smem_u32(s2sm + (size_t)s * 8 * R);
        for (int i = threadIdx.x; i < R * 8; i += 32 * GQ_WARPS) {
            const int r = i >> 3, sub = i & 7, row = c0 + r;
            cp4n(sd + 4 * (sub * R + r), xs2 + (size_t)(row < nb ? row : 0) * (K / 32) + 8 * sb + sub, row < nb ? 4 : 0);
        }
    };
    uint2 wq[2][2][4];
    uint4 mA[2], mB[2];
    if (live) load(0, wq[0], mA[0], mB[0]);
    MEMRA_PDL_WAIT();
#pragma unroll
    for (int s = 0; s < GQ_STAGES - 1; ++s) {
        if (s < nsb) stage(s, s);
        cp_commit();
    }
    // the parked chain sums (MQ_CHAINS > 1), [output 4 GQ_NT][warp][lane]: each lane's own, touched once a chain
    float* park = reinterpret_cast<float*>(gq_smem + (size_t)GQ_STAGES * R * (GQ_XROW * 2 + 32)) + threadIdx.x;
    float acc[GQ_NT][4];
#pragma unroll
    for (int t = 0; t < GQ_NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;

    auto superblock = [&](int i, const uint2 (&w)[2][4], const uint4& ma, const uint4& mb) {
        const int s = i % GQ_STAGES;
        const float da = f16_to_f32((uint16_t)ma.x), dmina = f16_to_f32((uint16_t)(ma.x >> 16));
        const float db = f16_to_f32((uint16_t)mb.x), dminb = f16_to_f32((uint16_t)(mb.x >> 16));
        const uint16_t* xb = xsm + (size_t)s * R * GQ_XROW + gid * GQ_XROW + 8 * tig;
        const float* sb2 = s2sm + (size_t)s * 8 * R + 2 * tig;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int sub = 2 * j + h;
                float dsa, dma, dsb, dmb;
                k4_sub(sub, ma, da, dmina, dsa, dma);
                k4_sub(sub, mb, db, dminb, dsb, dmb);
                const uint32_t u0 = w[0][j].x >> (4 * h), u1 = w[0][j].y >> (4 * h);   // row gid
                const uint32_t v0 = w[1][j].x >> (4 * h), v1 = w[1][j].y >> (4 * h);   // row gid + 8
                const uint32_t a0 = nib_h2(u0), a1 = nib_h2(v0), a2 = nib_h2(u0 >> 8), a3 = nib_h2(v0 >> 8);
                const uint32_t e0 = nib_h2(u1), e1 = nib_h2(v1), e2 = nib_h2(u1 >> 8), e3 = nib_h2(v1 >> 8);
#pragma unroll
                for (int t = 0; t < GQ_NT; ++t) {
                    const uint4 xv = *reinterpret_cast<const uint4*>(xb + t * 8 * GQ_XROW + 64 * j + 32 * h);
                    const float2 s2 = *reinterpret_cast<const float2*>(sb2 + sub * R + 8 * t);
                    float d[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_f16(d, a0, a1, a2, a3, prmt(xv.x, xv.y, 0x5410), prmt(xv.x, xv.y, 0x7632));
                    mma_f16(d, e0, e1, e2, e3, prmt(xv.z, xv.w, 0x5410), prmt(xv.z, xv.w, 0x7632));
                    acc[t][0] = __fmaf_rn(-dma, s2.x, __fmaf_rn(dsa, d[0], acc[t][0]));
                    acc[t][1] = __fmaf_rn(-dma, s2.y, __fmaf_rn(dsa, d[1], acc[t][1]));
                    acc[t][2] = __fmaf_rn(-dmb, s2.x, __fmaf_rn(dsb, d[2], acc[t][2]));
                    acc[t][3] = __fmaf_rn(-dmb, s2.y, __fmaf_rn(dsb, d[3], acc[t][3]));
                }
            }
        }
    };
    auto step = [&](int i, const uint2 (&w)[2][4], const uint4& ma, const uint4& mb, uint2 (&wn)[2][4], uint4& an,
                    uint4& bn) {
        cp_wait<GQ_STAGES - 2>();
        __syncthreads();   // superblock i staged for all; stage (i - 1) % STAGES free
        if (i + GQ_STAGES - 1 < nsb) stage(i + GQ_STAGES - 1, (i + GQ_STAGES - 1) % GQ_STAGES);
        cp_commit();
        if (MQ_CHAINS > 1 && i > 0 && i % SB == 0) {   // a chain ends: park it (tot = c0, then tot + c)
#pragma unroll
            for (int t = 0; t < GQ_NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float& p = park[(4 * t + e) * 32 * GQ_WARPS];
                    p = i == SB ? acc[t][e] : __fadd_rn(p, acc[t][e]);
                    acc[t][e] = 0.f;
                }
        }
        if (live && i + 1 < nsb) load(i + 1, wn, an, bn);
        if (live) superblock(i, w, ma, mb);
    };
    for (int i = 0; i < nsb; i += 2) {
        step(i, wq[0], mA[0], mB[0], wq[1], mA[1], mB[1]);
        if (i + 1 < nsb) step(i + 1, wq[1], mA[1], mB[1], wq[0], mA[0], mB[0]);
    }
    MEMRA_PDL_LAUNCH();
    if (!live) return;
#pragma unroll
    for (int t = 0; t < GQ_NT; ++t) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = MQ_CHAINS > 1 ? __fadd_rn(park[(4 * t + e) * 32 * GQ_WARPS], acc[t][e]) : acc[t][e];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int col = c0 + 8 * t + 2 * tig + c;
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
}

extern "C" __global__ void __launch_bounds__(32 * GQ_WARPS)
gm_qf(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
      const float* __restrict__ xs2, float* y, const float* res, int N, int K, int nb) {
    gm_qf_body<false>(bulk, meta, x, xs2, y, res, N, K, nb, 0);
}

extern "C" __global__ void __launch_bounds__(32 * GQ_WARPS)
gm_qf_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
          const float* __restrict__ xs2, float* y, int N, int K, int nb, int act) {
    gm_qf_body<true>(bulk, meta, x, xs2, y, nullptr, N, K, nb, act);
}
