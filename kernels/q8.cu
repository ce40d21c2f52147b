// q8.cu — quantize f32 activations to int8 blocks of 32 for the dp4a matvecs.
//
// quantize_q8(x, xq, xs, nblocks): x is [rows, K] f32 contiguous, nblocks = rows * K / 32;
// one warp per block (q8.cuh has the exact rule). Launch: block = 32 * Q8_WARPS threads,
// grid = ceil(nblocks / Q8_WARPS), no shared memory.
// Tunables: Q8_WARPS (8), Q8_PDL_TRIGGER where the kernel lets its PDL dependant start (1: right after
// its wait, as every memra kernel does; 2: before its wait, so the dependant — the down matvec, whose
// weight loads are issued before its own wait — may start while this kernel's predecessor still runs:
// experiments/pdl_early; 0: not at all, the dependant launches when this grid completes).
// MEMRA_CANARY=2: truncating instead of rounding (must be caught).
//
// History: 1. no trigger (the down matvec's launch and pre-wait loads sat on a decode step's critical
// path: experiments/timeline, session 46). 2. (this) Q8_PDL_TRIGGER, 1 by default: tg128 on the H100
// +1.7 % SmolLM2, +1.2 % the 1B and the 8B Q4_K_M (research/2026-12-06-session46, P/bench-pdl.jsonl).
#include "common.cuh"
#include "q8.cuh"

#ifndef Q8_WARPS
#define Q8_WARPS 8
#endif
#ifndef Q8_PDL_TRIGGER
#define Q8_PDL_TRIGGER 1
#endif

extern "C" __global__ void __launch_bounds__(32 * Q8_WARPS)
quantize_q8(const float* __restrict__ x, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs,
            int nblocks) {
    const int blk = blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
#if Q8_PDL_TRIGGER == 2
    MEMRA_PDL_LAUNCH();
#endif
    MEMRA_PDL_WAIT();
#if Q8_PDL_TRIGGER == 1
    MEMRA_PDL_LAUNCH();
#endif
    if (blk >= nblocks) return;
    const size_t i = (size_t)blk * 32 + (threadIdx.x & 31);
    q8_quantize_warp(x[i], xq + (size_t)blk * 32, xs + blk);
}
