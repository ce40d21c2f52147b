// q8.cu — quantize f32 activations to int8 blocks of 32 for the dp4a matvecs.
//
// quantize_q8(x, xq, xs, nblocks): x is [rows, K] f32 contiguous, nblocks = rows * K / 32;
// one warp per block (q8.cuh has the exact rule). Launch: block = 32 * Q8_WARPS threads,
// grid = ceil(nblocks / Q8_WARPS), no shared memory.
// Tunables: Q8_WARPS (8). MEMRA_CANARY=2: truncating instead of rounding (must be caught).
#include "common.cuh"
#include "q8.cuh"

#ifndef Q8_WARPS
#define Q8_WARPS 8
#endif

extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
quantize_q8(const float* __restrict__ x, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs,
            int nblocks) {
    const int blk = blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
    MEMRA_PDL_WAIT();
    if (blk >= nblocks) return;
    const size_t i = (size_t)blk * 32 + (threadIdx.x & 31);
    q8_quantize_warp(x[i], xq + (size_t)blk * 32, xs + blk);
}
