// rope.cu — per-head Q/K RMSNorm (qwen3, gemma3), rotary position embedding (normal and
// NeoX pairing, per-dimension frequency factors folded into inv_freq), and the KV-cache
// append (float32 -> f16), in one launch.
//
// For token t at position p = pos[t] of sequence s = seq ? seq[t] : 0, with the QKV bias
// (qwen2; null elsewhere: [q_dim + 2 kv_dim] floats, q then k then v) added first:
//   head h < n_head:            q_out[t, h]  = rope(norm(q[t, h], q_norm_w))
//   n_head <= h < +n_kv:        kcache[s, p, h'] = f16(rope(norm(k[t, h'], k_norm_w)))
//   n_head+n_kv <= h < +2 n_kv: vcache[s, p, h'] = f16(v[t, h'])
//   norm(x, w) = x * (1/sqrtf(mean(x^2) + eps)) * w when w is non-null, else x.
//   rope: pair (a, b) = (2i, 2i+1) (normal) or (i, i + rope_dim/2) (NeoX), i < rope_dim/2,
//   (c, s) = cs[p][i], the float32 cos and sin of theta = p * inv_freq[i] (made once per
//   context size by memra/ops/rope.py in float64 and rounded, as the CPU reference rounds
//   them; inv_freq = freq_scale / (base^(2i/rope_dim) * freq_factor[i])), then
//   a' = a c - b s, b' = a s + b c. Dimensions >= rope_dim pass through.
//
// Variant history (H200, per-kernel breakdown inside the decode graph):
//   v1  theta and sincos in double precision per pair in the kernel: 1.56 us at head 64
//       (one pair a lane), 3.25 us at head 256 (four pairs a lane, serial).
//   v2  (this) cos/sin read from a per-position table.
//
// Compile-time: HEAD_DIM (required, even), ROPE_WARPS (heads per block, default 4);
//   MEMRA_CANARY: a wrong variant (rotation sign flipped) that kernel-check must catch.
// Launch contract: grid (ceil((n_head + 2 n_kv) / ROPE_WARPS), n_tokens), block
//   (32 * ROPE_WARPS), no dynamic shared memory. q, k, v rows of token t start at
//   t * q_stride / k_stride / v_stride floats (so one fused QKV buffer serves); q_out is
//   [n_tokens][n_head * HEAD_DIM] and must not overlap q. kcache/vcache:
//   [n_seq][n_ctx][n_kv * HEAD_DIM] half; cs: [cs_rows][rope_dim / 2] float2 with every
//   pos in [0, cs_rows) (others read row 0 or the last). Positions outside [0, n_ctx) are
//   not written to the cache.

// PDL: each kernel waits for the previous one before touching memory, then lets the
// next one launch (both no-ops when launched without programmatic dependent launch).

#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef ROPE_WARPS
#define ROPE_WARPS 4
#endif

extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS)
    rope_norm_kv(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, int q_stride, int k_stride, int v_stride,
                 float* __restrict__ q_out, uint16_t* __restrict__ kcache, uint16_t* __restrict__ vcache,
                 const int* __restrict__ pos, const int* __restrict__ seq,
                 const float* __restrict__ bias, const float* __restrict__ q_norm_w,
                 const float* __restrict__ k_norm_w,
                 const float2* __restrict__ cs, int cs_rows, int n_head, int n_kv, int n_ctx,
                 int rope_dim, int neox, float eps) {
    __shared__ float buf[ROPE_WARPS][HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.x * ROPE_WARPS + warp;
    const int t = blockIdx.y;
    if (h >= n_head + 2 * n_kv) return;  // whole warp leaves together
    // before the PDL wait: the position (written two or more launches back, see common.cuh),
    // this lane's cos/sin pairs and norm weights (constants)
    const int p = pos[t];
    const int s = seq ? seq[t] : 0;
    const size_t kv_row = ((size_t)s * n_ctx + p) * (size_t)(n_kv * HEAD_DIM);
    const bool in_ctx = p >= 0 && p < n_ctx;
    constexpr int NPL = (HEAD_DIM / 2 + 31) / 32;  // rotated pairs per lane, at most
    const int half_dim = rope_dim / 2;
    const float2* csr = cs + (size_t)min(max(p, 0), cs_rows - 1) * half_dim;
    float2 csv[NPL];
#pragma unroll
    for (int j = 0; j < NPL; j++) csv[j] = lane + 32 * j < half_dim ? csr[lane + 32 * j] : make_float2(1.f, 0.f);
    const float* nw = h < n_head ? q_norm_w : k_norm_w;
    float nwv[HEAD_DIM / 32 + 1];
#pragma unroll
    for (int j = 0; j < (HEAD_DIM + 31) / 32; j++)
        nwv[j] = (nw && h < n_head + n_kv && lane + 32 * j < HEAD_DIM) ? nw[lane + 32 * j] : 1.f;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    if (h >= n_head + n_kv) {  // V: convert and append
        const int hv = h - n_head - n_kv;
        const float* src = v + (size_t)t * v_stride + hv * HEAD_DIM;
        const float* bv = bias ? bias + (n_head + n_kv + hv) * HEAD_DIM : nullptr;
        if (in_ctx)
            for (int d = lane; d < HEAD_DIM; d += 32)
                vcache[kv_row + hv * HEAD_DIM + d] = f32_to_f16(bv ? __fadd_rn(src[d], bv[d]) : src[d]);
        return;
    }
    const bool is_q = h < n_head;
    const int hh = is_q ? h : h - n_head;
    const float* src = is_q ? q + (size_t)t * q_stride + hh * HEAD_DIM
                            : k + (size_t)t * k_stride + hh * HEAD_DIM;
    const float* bh = bias ? bias + h * HEAD_DIM : nullptr;  // q heads then k heads then v
    float* b = buf[warp];

    float ss = 0.f;
#pragma unroll
    for (int d = lane; d < HEAD_DIM; d += 32) {
        float x = bh ? __fadd_rn(src[d], bh[d]) : src[d];
        b[d] = x;
        ss += x * x;
    }
    if (nw) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float sc = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(ss, (float)HEAD_DIM), eps));
#pragma unroll
        for (int j = 0; j < (HEAD_DIM + 31) / 32; j++) {
            const int d = lane + 32 * j;
            if (d < HEAD_DIM) b[d] = __fmul_rn(__fmul_rn(b[d], sc), nwv[j]);
        }
    }
    __syncwarp();

    // one angle per rotated pair (pair i: dims a, b), then the dims past rope_dim as they are
    float* qo = q_out + (size_t)t * n_head * HEAD_DIM + hh * HEAD_DIM;
    uint16_t* ko = kcache + kv_row + hh * HEAD_DIM;
    const bool store = is_q || in_ctx;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        const int i = lane + 32 * j;
        if (i >= half_dim) break;
        const int ia = neox ? i : 2 * i, ib = neox ? i + half_dim : 2 * i + 1;
        const float c = csv[j].x;
        float sv = csv[j].y;
#ifdef MEMRA_CANARY
        sv = -sv;  // kernel-check canary: rotates the wrong way
#endif
        const float a = b[ia], bb = b[ib];
        const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, sv));
        const float rb = __fadd_rn(__fmul_rn(a, sv), __fmul_rn(bb, c));
        if (is_q) {
            qo[ia] = ra;
            qo[ib] = rb;
        } else if (store) {
            ko[ia] = f32_to_f16(ra);
            ko[ib] = f32_to_f16(rb);
        }
    }
    for (int d = rope_dim + lane; d < HEAD_DIM; d += 32) {
        if (is_q)
            qo[d] = b[d];
        else if (store)
            ko[d] = f32_to_f16(b[d]);
    }
}
