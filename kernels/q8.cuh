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
