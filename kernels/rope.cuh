// rope.cuh — one head's (bias +) per-head RMSNorm + rotary embedding, done by one warp:
// the arithmetic rope.cu's rope_norm_kv and attention.cu's attn_decode_rope share, so the
// two give the same bits. Requires HEAD_DIM.
//
//   x = src (+ bias); x = x * (1/sqrtf(mean(x^2) + eps)) * w when w is used;
//   pair i < rope_dim/2, dims (2i, 2i+1) (normal) or (i, i + rope_dim/2) (NeoX), rotated by
//   (c, s) = cs[p][i]: a' = a c - b s, b' = a s + b c; dims >= rope_dim pass through.
//   The result is left in the warp's shared buffer b[HEAD_DIM] (after a __syncwarp).
#pragma once
#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif

constexpr int ROPE_NPL = (HEAD_DIM / 2 + 31) / 32;  // rotated pairs per lane, at most
constexpr int ROPE_NDL = (HEAD_DIM + 31) / 32;      // dims per lane

// A lane's constants for one position and one norm weight vector: loaded before the PDL
// wait (the cos/sin table and the weights are constants, the position is written two or
// more launches back).
struct RopeLane {
    float2 cs[ROPE_NPL];
    float nw[ROPE_NDL];
};

MEMRA_DEVICE void rope_lane_load(RopeLane& r, const float2* __restrict__ cs, int cs_rows, int p, int rope_dim,
                                 const float* __restrict__ nw) {
    const int lane = threadIdx.x % 32, half_dim = rope_dim / 2;
    const float2* csr = cs + (size_t)min(max(p, 0), cs_rows - 1) * half_dim;
#pragma unroll
    for (int j = 0; j < ROPE_NPL; j++) r.cs[j] = lane + 32 * j < half_dim ? csr[lane + 32 * j] : make_float2(1.f, 0.f);
#pragma unroll
    for (int j = 0; j < ROPE_NDL; j++) r.nw[j] = (nw && lane + 32 * j < HEAD_DIM) ? nw[lane + 32 * j] : 1.f;
}

// The warp's head: src row (+ bh), normed when `norm`, rotated; into b (shared, HEAD_DIM).
MEMRA_DEVICE void rope_head(const float* __restrict__ src, const float* __restrict__ bh, bool norm,
                            const RopeLane& r, float eps, int rope_dim, int neox, float* b) {
    const int lane = threadIdx.x % 32, half_dim = rope_dim / 2;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < ROPE_NDL; j++) {
        const int d = lane + 32 * j;
        if (d < HEAD_DIM) {
            const float x = bh ? __fadd_rn(src[d], bh[d]) : src[d];
            b[d] = x;
            ss = fmaf(x, x, ss);
        }
    }
    if (norm) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float sc = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(ss, (float)HEAD_DIM), eps));
#pragma unroll
        for (int j = 0; j < ROPE_NDL; j++) {
            const int d = lane + 32 * j;
            if (d < HEAD_DIM) b[d] = __fmul_rn(__fmul_rn(b[d], sc), r.nw[j]);
        }
    }
    __syncwarp();
    // pairs are disjoint and each lane reads its pair before writing it: rotate in place
#pragma unroll
    for (int j = 0; j < ROPE_NPL; j++) {
        const int i = lane + 32 * j;
        if (i >= half_dim) break;
        const int ia = neox ? i : 2 * i, ib = neox ? i + half_dim : 2 * i + 1;
        const float c = r.cs[j].x;
        float sv = r.cs[j].y;
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 3
        sv = -sv;  // kernel-check canary (rope.cu): rotates the wrong way
#endif
        const float a = b[ia], bb = b[ib];
        b[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, sv));
        b[ib] = __fadd_rn(__fmul_rn(a, sv), __fmul_rn(bb, c));
    }
    __syncwarp();
}

// The warp's V head, (bias +) rounded to f16 into the cache row dst.
MEMRA_DEVICE void v_append(const float* __restrict__ src, const float* __restrict__ bv, uint16_t* dst) {
    for (int d = threadIdx.x % 32; d < HEAD_DIM; d += 32) dst[d] = f32_to_f16(bv ? __fadd_rn(src[d], bv[d]) : src[d]);
}
