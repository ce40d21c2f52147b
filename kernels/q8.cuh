// q8.cuh — int8 activation blocks for the dp4a matvecs (layout shared by every producer).
//
// x[b, :] of length K becomes xq[b, :] (int8, K values) and xs[b, :] (K/32 Q8Scale): per
// block of 32 values d = amax / 127 (f32 division), q = rint(x / d) (round half to even,
// IEEE division; q = 0 when amax = 0), s = sum of the 32 q. Any kernel that produces these
// (q8.cu, a fused norm+quantize) must use q8_quantize_warp so the numbers agree bit for bit
// with memra/ops/matvec.py's quantize_q8_ref.
#pragma once
#include "common.cuh"

struct Q8Scale { float d; int s; };

MEMRA_DEVICE int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One warp quantizes one block of 32: lane i holds element i. Writes q to qout[lane] and,
// from lane 0, the block's scale to *sout.
MEMRA_DEVICE void q8_quantize_warp(float v, int8_t* qout, Q8Scale* sout) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
#if MEMRA_CANARY == 2
    const int q = amax == 0.0f ? 0 : __float2int_rz(v / d);   // canary: truncation
#else
    const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
#endif
    qout[threadIdx.x & 31] = (int8_t)q;
    const int s = warp_sum_int(q);
    if ((threadIdx.x & 31) == 0) {
        Q8Scale t;
        t.d = d;
        t.s = s;
        *sout = t;
    }
}

MEMRA_DEVICE float max8(float m) {  // over the lane's group of 8
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
}

MEMRA_DEVICE int sum8(int v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

// The q8 twin of float4 i4 of the row (v), held with its 7 neighbours of the same block of
// 32 by the lanes of an aligned group of 8: q8_quantize_warp's rule, bit for bit (d =
// amax / 127, q = rint(v / d), s = sum of q). Every lane of the warp must call it.
MEMRA_DEVICE void q8_store4(float4 v, bool active, int i4, int8_t* xq, Q8Scale* xs) {
    const float amax = max8(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const float d = amax / 127.0f;
    const bool z = amax == 0.0f;
    const int q0 = z ? 0 : __float2int_rn(v.x / d), q1 = z ? 0 : __float2int_rn(v.y / d);
    const int q2 = z ? 0 : __float2int_rn(v.z / d), q3 = z ? 0 : __float2int_rn(v.w / d);
    const int s = sum8(q0 + q1 + q2 + q3);
    if (active) {
        *(uint32_t*)(xq + 4 * i4) = (uint32_t)(q0 & 0xff) | ((uint32_t)(q1 & 0xff) << 8) |
                                    ((uint32_t)(q2 & 0xff) << 16) | ((uint32_t)(q3 & 0xff) << 24);
        if ((i4 & 7) == 0) {
            Q8Scale t;
            t.d = d;
            t.s = s;
            xs[i4 / 8] = t;
        }
    }
}
