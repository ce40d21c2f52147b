// rope.cu — per-head Q/K RMSNorm (qwen3, gemma3), rotary position embedding (normal and
// NeoX pairing, per-dimension frequency factors folded into inv_freq), and the KV-cache
// append (float32 -> f16), in one launch.
//
// For token t at position p = pos[t] of the sequence in block-table row s = seq ? seq[t] : 0,
// with the QKV bias
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
//   v2  cos/sin read from a per-position table; constants loaded before the PDL wait:
//       1.2 us at head 64, 1.6 us at head 256.
//   v3  the per-head arithmetic moved to rope.cuh, shared with attention.cu's
//       attn_decode_rope (decode), which makes this launch a prefill-only one by default.
//   v4  (this) K/V appended through the paged cache's block table (kv.cuh).
//
// Compile-time: HEAD_DIM (required, even), ROPE_WARPS (heads per block, default 4);
//   MEMRA_CANARY: a wrong variant (rotation sign flipped) that kernel-check must catch.
// Launch contract: grid (ceil((n_head + 2 n_kv) / ROPE_WARPS), n_tokens), block
//   (32 * ROPE_WARPS), no dynamic shared memory. q, k, v rows of token t start at
//   t * q_stride / k_stride / v_stride floats (so one fused QKV buffer serves); q_out is
//   [n_tokens][n_head * HEAD_DIM] and must not overlap q. kcache/vcache: paged pools
//   [n_blocks][KV_BLOCK][n_kv * HEAD_DIM] half addressed through block_table
//   [n_rows][max_blocks] (kv.cuh); cs: [cs_rows][rope_dim / 2] float2 with every pos in
//   [0, cs_rows) (others read row 0 or the last). Positions the table does not map (p < 0
//   for padded rows) are not written to the cache.
//   KV_K_Q8 / KV_V_Q8 (kv.cuh): that side's pool is q8_0 planes (int8 codes, f16 scales), the
//   row quantized by kv_q8_store_row (one warp a head: each 32-group's amax by shuffles);
//   kscale / vscale, the scale planes, are then the kernel's last two parameters.

// PDL: each kernel waits for the previous one before touching memory, then lets the
// next one launch (both no-ops when launched without programmatic dependent launch).

#include "common.cuh"
#ifdef MEMRA_CANARY
#undef MEMRA_CANARY
#define MEMRA_CANARY 3  // rope.cuh's canary: the rotation's sign flipped
#endif
#include "rope.cuh"
#include "kv.cuh"

#ifndef ROPE_WARPS
#define ROPE_WARPS 4
#endif
#if KV_ANY_Q8
static_assert(HEAD_DIM % 32 == 0, "a q8_0 KV cache needs HEAD_DIM % 32 == 0");
#endif

extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS)
    rope_norm_kv(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, int q_stride, int k_stride, int v_stride,
                 float* __restrict__ q_out, kv_k_t* __restrict__ kcache, kv_v_t* __restrict__ vcache,
                 const int* __restrict__ pos, const int* __restrict__ seq,
                 const float* __restrict__ bias, const float* __restrict__ q_norm_w,
                 const float* __restrict__ k_norm_w,
                 const float2* __restrict__ cs, int cs_rows, const int* __restrict__ block_table,
                 int max_blocks, int n_head, int n_kv, int rope_dim, int neox, float eps KV_SCALE_PARAMS) {
    __shared__ float buf[ROPE_WARPS][HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.x * ROPE_WARPS + warp;
    const int t = blockIdx.y;
    if (h >= n_head + 2 * n_kv) return;  // whole warp leaves together
    // before the PDL wait: the position (written two or more launches back, see common.cuh),
    // this lane's cos/sin pairs and norm weights (constants)
    const int p = pos[t];
    const int* bt = block_table + (size_t)(seq ? seq[t] : 0) * max_blocks;  // host-written
    const bool in_ctx = kv_writable(bt, max_blocks, p);
    const size_t kv_row = in_ctx ? kv_slot(bt, p) * (size_t)(n_kv * HEAD_DIM) : 0;
#if KV_ANY_Q8
    const size_t kv_srow = kv_row / 32;  // the scale plane's row (n_kv * HEAD_DIM / 32 a position)
#endif
    RopeLane rl;
    rope_lane_load(rl, cs, cs_rows, p, rope_dim, h < n_head + n_kv ? (h < n_head ? q_norm_w : k_norm_w) : nullptr);
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    if (h >= n_head + n_kv) {  // V: convert and append
        const int hv = h - n_head - n_kv;
        const float* src = v + (size_t)t * v_stride + hv * HEAD_DIM;
        const float* bv = bias ? bias + (n_head + n_kv + hv) * HEAD_DIM : nullptr;
#if KV_V_Q8
        if (in_ctx) kv_q8_store_row(src, bv, HEAD_DIM, vcache + kv_row + hv * HEAD_DIM, vscale + kv_srow + hv * HEAD_DIM / 32);
#else
        if (in_ctx) v_append(src, bv, vcache + kv_row + hv * HEAD_DIM);
#endif
        return;
    }
    const bool is_q = h < n_head;
    const int hh = is_q ? h : h - n_head;
    const float* src = is_q ? q + (size_t)t * q_stride + hh * HEAD_DIM
                            : k + (size_t)t * k_stride + hh * HEAD_DIM;
    const float* bh = bias ? bias + h * HEAD_DIM : nullptr;  // q heads then k heads then v
    rope_head(src, bh, (is_q ? q_norm_w : k_norm_w) != nullptr, rl, eps, rope_dim, neox, buf[warp]);
    const float* b = buf[warp];
    if (is_q) {
        float* qo = q_out + (size_t)t * n_head * HEAD_DIM + hh * HEAD_DIM;
        for (int d = lane; d < HEAD_DIM; d += 32) qo[d] = b[d];
    } else if (in_ctx) {
#if KV_K_Q8
        kv_q8_store_row(b, nullptr, HEAD_DIM, kcache + kv_row + hh * HEAD_DIM, kscale + kv_srow + hh * HEAD_DIM / 32);
#else
        uint16_t* ko = kcache + kv_row + hh * HEAD_DIM;
        for (int d = lane; d < HEAD_DIM; d += 32) ko[d] = f32_to_f16(b[d]);
#endif
    }
}
