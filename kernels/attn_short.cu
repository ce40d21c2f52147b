// attn_short.cu — short-context decode attention: the attention switch's short module (memra.gpu.plan's
// att_switch, a table entry's `short` naming ATT_KERNEL 1), for rows of fewer than ATT_SWITCH <= SHORT_MAX + 1
// keys, f16 K/V. Two entries with kernels/attention.cu's parameters and grid (n_head / N_GQA, splits, n_tokens):
// attn_decode_rope (RoPE and key p's K / V append inside, rope_norm_kv's bits) and attn_decode (after
// rope_norm_kv); both give the same bits. Only blockIdx.y == 0 works (a row is one block a head: the launcher
// gives grid y 1); part_o, part_ml and counters are never touched. A block of N_GQA heads is N_GQA sub-blocks of
// W = ATT_WARPS / N_GQA warps, each computing its head exactly as a one-head block would (the engine launches
// one head a block; only sub-block 0 appends). In a sub-block of W warps:
//
//   before the PDL wait: pos (written two or more launches back), the block table row, the lane's RoPE / norm
//     constants, and the K rows of this warp's first SHORT_PF key steps below p (written by earlier steps);
//   after it: warp 0 ropes q into shared memory (attn_decode: the block reads rope_norm_kv's q); where key p is
//     writable, warp W-1 ropes and appends K, warp W-2 appends V (every block of the KV head writes the same
//     bits); barrier 1;
//   scores: LPK lanes a key (LPK = min(32, HEAD_DIM / 8): a lane one 16-byte chunk), KPW = 32 / LPK keys a
//     warp step, SHORT_KB steps' loads issued before their dot products, one shuffle tree a key, into sc[];
//     barrier 2;
//   softmax statistics: every warp reduces max and sum over sc[] itself (the same order in every warp), so no
//     barrier follows;
//   P V: warp w the keys i = w (mod W), lane k of the warp holding its k-th key's p (shuffled to the lanes),
//     lane l the dims [l * DPL, (l + 1) * DPL), DPL = HEAD_DIM / 32, V rows loaded SHORT_VB at a time before
//     their products; partials red[w][d]; barrier 3;
//   output: thread d sums red[0..W)[d] in warp order, divides by l, writes out and (xq non-null) the q8 twin
//     with q8_quantize_warp (quantize_q8's rule, bit for bit).
//
// Rows without a key (p < 0) and rows of ATT_SWITCH keys or more (the long module's: ATT_ROWS 1, attention.cu
// v12's filter, mode 1 only) leave before the wait.
//
// Not attention.cu's float order: the scores' dot products (a lane's 8 products, then the LPK-lane tree), the
// softmax sums and the P V sums run in this file's order, fixed by the row's own key count (batch-, graph- and
// N_GQA-invariant), so kernel-check compares it with the float64 reference (attention.py's TOL), the two entries
// with each other bit for bit and the appended rows with rope_norm_kv's.
//
// Variant history (H100, experiments/attn_short/probe.py: µs a launch in a graph of PDL launches, the engine's
// attention.cu launch beside it; research/2026-12-06-session48/a/, research/2026-12-06-session49/a/):
//   v1  p recomputed per key by every lane in the P V (an expf and a shared-memory load a key and lane),
//       SHORT_PF (1-2) key steps' loads in flight: at 1 / 64 / 128 / 256 keys SmolLM2 2.55 / 3.51 / 4.92 / 8.15
//       vs 3.12 / 3.37 / 4.41 / 6.77, Gemma-3 (head 256) 3.03 / 5.68 / 8.94 / 15.71 vs 4.15 / 7.74 / 7.65 / 7.70:
//       a lower fixed cost, a higher cost a key.
//   v2  the K / V lines below p prefetched into L2 before the wait: within ±0.1 µs of v1 (removed).
//   v3  (this) a warp's p once, shuffled; SHORT_KB key steps' loads in flight; N_GQA sub-blocks. 16 warps,
//       SHORT_KB 8, SHORT_VB 8 at 1 / 64 / 128 / 256 keys: SmolLM2 3.60 / 4.00 / 4.41 / 5.90 vs 3.13 / 3.33 /
//       4.42 / 6.77, Gemma-3 4.26 / 5.02 / 5.79 / 8.87 vs 4.14 / 7.70 / 7.70 / 7.73, the 8B 3.96 / 4.45 / 5.16 /
//       6.96 vs 3.52 / 4.73 / 7.04 / 9.98; 8 warps, SHORT_KB 2: 2.78 / 3.31 / 4.52 / 7.28 on SmolLM2.
#include "common.cuh"
#include "q8.cuh"
#include "rope.cuh"
#include "kv.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef N_GQA
#error "N_GQA must be defined"
#endif
#ifndef ATT_WARPS
#define ATT_WARPS 8
#endif
#ifndef SHORT_MAX
#define SHORT_MAX 256
#endif
#ifndef SHORT_PF   // key steps a warp loads before the PDL wait
#define SHORT_PF 2
#endif
#ifndef SHORT_KB   // key steps a warp loads before their dot products (>= SHORT_PF)
#define SHORT_KB 8
#endif
#ifndef SHORT_VB   // V rows a lane loads before their products
#define SHORT_VB 8
#endif
#ifndef ATT_ROWS   // attention.cu v12's row filter, mode 1 only: 1 computes the rows of fewer than ATT_SWITCH keys
#define ATT_ROWS 0
#endif
#ifndef ATT_SWITCH
#define ATT_SWITCH SHORT_MAX
#endif
static_assert(ATT_ROWS == 0 || (ATT_ROWS == 1 && ATT_SWITCH <= SHORT_MAX + 1),
              "attn_short: ATT_ROWS 0, or 1 with ATT_SWITCH <= SHORT_MAX + 1 (it computes short rows only)");
static_assert(N_GQA >= 1 && ATT_WARPS % N_GQA == 0, "attn_short: N_GQA sub-blocks of ATT_WARPS / N_GQA warps");
static_assert(SHORT_PF >= 1 && SHORT_PF <= SHORT_KB, "attn_short: SHORT_PF in 1..SHORT_KB");
static_assert(SHORT_MAX <= 32 * (ATT_WARPS / N_GQA), "attn_short: a warp holds the p of at most 32 keys");
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 256, "attn_short: HEAD_DIM a multiple of 32, at most 256");
static_assert(ATT_WARPS / N_GQA >= 3 && ATT_WARPS / N_GQA * 32 >= HEAD_DIM,
              "attn_short: a head's warps (ATT_WARPS / N_GQA) >= 3 and 32 x them >= HEAD_DIM");
#if KV_K_Q8 || KV_V_Q8
#error "attn_short: f16 K/V only"
#endif

#define NEG_INF __int_as_float(0xff800000)

namespace {
constexpr int D = HEAD_DIM;
constexpr int G = N_GQA;                      // heads a block: G sub-blocks, each one head as at N_GQA 1
constexpr int W = ATT_WARPS / N_GQA;          // a head's warps
constexpr int NT = ATT_WARPS * 32;
constexpr int ST = W * 32;                    // a sub-block's threads
constexpr int NCH = D / 8;                    // 16-byte chunks a row
constexpr int LPK = NCH < 32 ? NCH : 32;      // lanes a key (NCH is 4, 8, 16 or 32 here)
constexpr int KPW = 32 / LPK;                 // keys a warp step
constexpr int CPL = NCH / LPK;                // chunks a lane (1)
constexpr int DPL = D / 32;                   // P V: dims a lane
constexpr int SSTEP = W * KPW;                // keys a block step
constexpr int MAXSTEPS = (SHORT_MAX + SSTEP - 1) / SSTEP;
static_assert(CPL == 1, "attn_short: one chunk a lane");

__device__ __forceinline__ void unpack8(const uint4 u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = f16_to_f32((uint16_t)(w[i] & 0xffffu));
        f[2 * i + 1] = f16_to_f32((uint16_t)(w[i] >> 16));
    }
}

// DPL halves of a V row from dims l * DPL
__device__ __forceinline__ void vload(const uint16_t* row, int l, uint32_t (&v)[DPL / 2]) {
    const uint16_t* s = row + l * DPL;
    if constexpr (DPL == 2) {
        v[0] = *(const uint32_t*)s;
    } else if constexpr (DPL == 4) {
        const uint2 u = *(const uint2*)s;
        v[0] = u.x; v[1] = u.y;
    } else {
        const uint4 u = *(const uint4*)s;
        v[0] = u.x; v[1] = u.y; v[2] = u.z; v[3] = u.w;
    }
}
}  // namespace

// The body of both entries: ROPE (attn_decode_rope) ropes q from the QKV row and appends key p's K / V rows
// (rope.cuh's code: rope_norm_kv's bits); !ROPE (attn_decode) reads q as rope_norm_kv wrote it, K / V appended.
template <bool ROPE>
__device__ __forceinline__ void short_body(
    const float* __restrict__ q_raw, const float* __restrict__ k_raw, const float* __restrict__ v_raw,
    int q_stride, int k_stride, int v_stride, const float* __restrict__ bias, const float* __restrict__ q_norm_w,
    const float* __restrict__ k_norm_w, const float2* __restrict__ cs, int cs_rows, int rope_dim, int neox,
    float eps, uint16_t* __restrict__ kcache, uint16_t* __restrict__ vcache, float* __restrict__ out,
    int8_t* __restrict__ xq, Q8Scale* __restrict__ xs, const int* __restrict__ pos, const int* __restrict__ seq,
    const int* __restrict__ block_table, int max_blocks, int n_kv, int qpk, int window, float scale,
    float softcap) {
    __shared__ __align__(16) float qs_all[G][D];
    __shared__ __align__(16) float kvb[D];
    __shared__ float sc_all[G][SHORT_MAX];
    __shared__ float red_all[G][W][D];
    const int t = blockIdx.z;
    // sub-block `sub` (warps sub W .. sub W + W - 1) computes head h exactly as a one-head block would: a head's
    // bits do not depend on N_GQA (as attention.cu's)
    const int tid = threadIdx.x % ST, sub = threadIdx.x / ST, warp = tid / 32, lane = tid % 32;
    const int h = blockIdx.x * G + sub;
    float* qs = qs_all[sub];
    float* sc = sc_all[sub];
    float (*red)[D] = red_all[sub];
    if (blockIdx.y != 0) return;
    const int p = pos[t];
    const int lo = window > 0 ? max(0, p + 1 - window) : 0;
    const int n = p + 1 - lo;
    if (n < 1 || n > SHORT_MAX) return;
#if ATT_ROWS == 1
    if (n >= ATT_SWITCH) return;   // the long module's row (its own key count), as attention.cu's filter
#endif
    const int n_head = gridDim.x * G, kvh = h / qpk;
    const int* bt = block_table + (size_t)(seq ? seq[t] : 0) * max_blocks;
    const bool appends = ROPE && kv_writable(bt, max_blocks, p);
    const size_t row_stride = (size_t)n_kv * D;
    const uint16_t* kbase = kcache + (size_t)kvh * D;
    const uint16_t* vbase = vcache + (size_t)kvh * D;
    RopeLane rq, rk;
    if constexpr (ROPE) {
        rope_lane_load(rq, cs, cs_rows, p, rope_dim, q_norm_w);
        rope_lane_load(rk, cs, cs_rows, p, rope_dim, k_norm_w);
    }
    // the scores' roles: chunk sl of key (step * SSTEP + warp * KPW + ks)
    const int sl = lane % LPK, ks = lane / LPK;
    const int nsteps = (n + SSTEP - 1) / SSTEP;
    // K rows below p (earlier steps wrote them) of this warp's first SHORT_PF steps, before the wait
    uint4 kpre[SHORT_PF];
#pragma unroll
    for (int j = 0; j < SHORT_PF; j++) {
        const int i = j * SSTEP + warp * KPW + ks;
        kpre[j] = (j < nsteps && i < n - 1) ? *(const uint4*)(kbase + kv_slot(bt, lo + i) * row_stride + sl * 8)
                                            : make_uint4(0u, 0u, 0u, 0u);
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    if constexpr (ROPE) {
        if (warp == 0)
            rope_head(q_raw + (size_t)t * q_stride + (size_t)h * D, bias ? bias + (size_t)h * D : nullptr,
                      q_norm_w != nullptr, rq, eps, rope_dim, neox, qs);
    } else {   // q as rope_norm_kv wrote it: [n_tokens, n_head * D]
        for (int d = tid; d < D; d += ST) qs[d] = q_raw[((size_t)t * n_head + h) * D + d];
    }
    if (appends && sub == 0) {   // the block's K / V row once (every block of the KV head writes the same bits)
        const size_t row = kv_slot(bt, p) * row_stride + (size_t)kvh * D;
        if (warp == W - 1) {
            rope_head(k_raw + (size_t)t * k_stride + (size_t)kvh * D,
                      bias ? bias + (size_t)(n_head + kvh) * D : nullptr, k_norm_w != nullptr, rk, eps, rope_dim,
                      neox, kvb);
            for (int d = lane; d < D; d += 32) kcache[row + d] = f32_to_f16(kvb[d]);
        }
        if (warp == W - 2)
            v_append(v_raw + (size_t)t * v_stride + (size_t)kvh * D,
                     bias ? bias + (size_t)(n_head + n_kv + kvh) * D : nullptr, vcache + row);
    }
    __syncthreads();  // 1: q roped; key p's K / V rows in the cache, visible to the block

    // scores
    float qr[8];
#pragma unroll
    for (int e = 0; e < 8; e++) qr[e] = qs[sl * 8 + e];
    for (int s0 = 0; s0 < nsteps; s0 += SHORT_KB) {
        uint4 kr[SHORT_KB];
#pragma unroll
        for (int j = 0; j < SHORT_KB; j++) {
            const int i = (s0 + j) * SSTEP + warp * KPW + ks;
            if (s0 == 0 && j < SHORT_PF && i < n - 1) kr[j] = kpre[j < SHORT_PF ? j : 0];
            else kr[j] = (s0 + j < nsteps && i < n) ? *(const uint4*)(kbase + kv_slot(bt, lo + i) * row_stride + sl * 8)
                                                    : make_uint4(0u, 0u, 0u, 0u);
        }
        float dot[SHORT_KB];
#pragma unroll
        for (int j = 0; j < SHORT_KB; j++) {
            float f[8];
            unpack8(kr[j], f);
            float a = 0.f;
#pragma unroll
            for (int e = 0; e < 8; e++) a = fmaf(qr[e], f[e], a);
            dot[j] = a;
        }
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < SHORT_KB; j++) dot[j] += __shfl_xor_sync(0xffffffffu, dot[j], o);
#pragma unroll
        for (int j = 0; j < SHORT_KB; j++) {
            const int i = (s0 + j) * SSTEP + warp * KPW + ks;
            if (sl == 0 && s0 + j < nsteps && i < n) {
                float v = dot[j] * scale;
                if (softcap > 0.f) v = softcap * tanhf(v / softcap);
                sc[i] = v;
            }
        }
    }
    __syncthreads();  // 2: every score in sc[0, n)

    // softmax statistics, the same in every warp
    float m = NEG_INF;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, sc[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int i = lane; i < n; i += 32) l += expf(sc[i] - m);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);

    // P V: warp w the keys w, w + W, ... (its k-th key i = w + W k; lane k holds its p, at most 32 a warp:
    // SHORT_MAX <= 32 W); lane the dims [lane * DPL, lane * DPL + DPL)
    const int kw = n > warp ? (n - warp + W - 1) / W : 0;
    const float pl = lane < kw ? expf(sc[warp + W * lane] - m) : 0.f;
    float acc[DPL];
#pragma unroll
    for (int e = 0; e < DPL; e++) acc[e] = 0.f;
    for (int k0 = 0; k0 < kw; k0 += SHORT_VB) {
        uint32_t vr[SHORT_VB][DPL / 2];
#pragma unroll
        for (int j = 0; j < SHORT_VB; j++) {
            if (k0 + j < kw) {
                vload(vbase + kv_slot(bt, lo + warp + W * (k0 + j)) * row_stride, lane, vr[j]);
            } else {
#pragma unroll
                for (int e = 0; e < DPL / 2; e++) vr[j][e] = 0u;
            }
        }
#pragma unroll
        for (int j = 0; j < SHORT_VB; j++) {
            const float pk = __shfl_sync(0xffffffffu, pl, (k0 + j) & 31);   // 0 past kw (those lanes hold 0)
#pragma unroll
            for (int e = 0; e < DPL / 2; e++) {
                acc[2 * e] = fmaf(pk, f16_to_f32((uint16_t)(vr[j][e] & 0xffffu)), acc[2 * e]);
                acc[2 * e + 1] = fmaf(pk, f16_to_f32((uint16_t)(vr[j][e] >> 16)), acc[2 * e + 1]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < DPL; e++) red[warp][lane * DPL + e] = acc[e];
    __syncthreads();  // 3: the warps' partials

    if (tid < D) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) o += red[w][tid];
        o = __fdiv_rn(o, l);
        const size_t base = ((size_t)t * n_head + h) * D;
        out[base + tid] = o;
        if (xq) q8_quantize_warp(o, xq + base + (tid & ~31), xs + (base + tid) / 32);
    }
}

extern "C" __global__ void __launch_bounds__(NT)
    attn_decode_rope(const float* __restrict__ q_raw, const float* __restrict__ k_raw,
                     const float* __restrict__ v_raw, int q_stride, int k_stride, int v_stride,
                     const float* __restrict__ bias, const float* __restrict__ q_norm_w,
                     const float* __restrict__ k_norm_w, const float2* __restrict__ cs, int cs_rows,
                     int rope_dim, int neox, float eps, uint16_t* __restrict__ kcache,
                     uint16_t* __restrict__ vcache, float* __restrict__ part_o, float* __restrict__ part_ml,
                     int* __restrict__ counters, float* __restrict__ out, int8_t* __restrict__ xq,
                     Q8Scale* __restrict__ xs, const int* __restrict__ pos, const int* __restrict__ seq,
                     const int* __restrict__ block_table, int max_blocks, int n_kv, int qpk, int window,
                     float scale, float softcap) {
    short_body<true>(q_raw, k_raw, v_raw, q_stride, k_stride, v_stride, bias, q_norm_w, k_norm_w, cs, cs_rows,
                     rope_dim, neox, eps, kcache, vcache, out, xq, xs, pos, seq, block_table, max_blocks, n_kv, qpk,
                     window, scale, softcap);
}

// attention.cu's attn_decode parameters: q roped and key p's K / V appended by rope_norm_kv before it
extern "C" __global__ void __launch_bounds__(NT)
    attn_decode(const float* __restrict__ q, uint16_t* __restrict__ kcache, uint16_t* __restrict__ vcache,
                float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counters,
                float* __restrict__ out, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs,
                const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ block_table,
                int max_blocks, int n_kv, int qpk, int window, float scale, float softcap) {
    short_body<false>(q, nullptr, nullptr, 0, 0, 0, nullptr, nullptr, nullptr, nullptr, 0, 0, 0, 0.f, kcache,
                      vcache, out, xq, xs, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale, softcap);
}
