// persist.cu (experiments/persist): what a launch boundary costs in a decode step, against a
// grid barrier inside one persistent kernel: the opportunity of issue 14's persistent decode
// kernel, before building one.
//
// phase(src, dst, words, region): one step's worth of streaming: the grid reads `words` 16-byte
//   words of src from word region * words on (each block a contiguous share, 16-byte loads,
//   summed), and each block writes its sum to dst[block] (so nothing is optimized away).
//   Launched with PDL as the engine's kernels are (wait, then launch_dependents, then work).
// persist(src, dst, words, nphase, bar): the same nphase phases in one launch, region k in phase
//   k, with a grid barrier between phases (a sense-reversing barrier on bar[0..1]; every block
//   resident: the launcher caps the grid at the co-resident count).
// rowop(dst, row, out, n) (session 23): a RMSNorm's shape of work on one block after its PDL wait —
//   read n floats (the producer's row: dst's first min(n, blocks) entries, the rest of `row`), the
//   sum of squares, write the n scaled values to out. phase_tail(src, dst, words, region, row, out,
//   n, cnt): phase, then each block fences its write and counts itself on cnt; the last block does
//   rowop's work in the same launch and puts cnt back to 0. probe.py --tail times N x (phase,
//   rowop) launches against N phase_tail launches: what folding a one-block op into its producer's
//   tail saves against a PDL launch boundary (the session 23 README's "Next").
#include "common.cuh"

__device__ __forceinline__ float stream_sum(const uint4* __restrict__ src, long long begin, long long end) {
    float s = 0.f;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const uint4 v = __ldcs(src + i);
        s += __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
    }
    return s;
}

// the block's sum of v (blockDim.x a multiple of 32), in thread 0 (0 elsewhere)
__device__ __forceinline__ float block_total(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += red[w];
    return t;
}

__device__ __forceinline__ void phase_body(const uint4* __restrict__ src, float* __restrict__ dst, long long words,
                                           int region, int block, int nblocks) {
    __shared__ float red[32];
    const long long base = (long long)region * words;
    const long long per = (words + nblocks - 1) / nblocks;
    const long long b0 = base + min((long long)block * per, words), b1 = base + min((long long)(block + 1) * per, words);
    const float t = block_total(stream_sum(src, b0, b1), red);
    if (threadIdx.x == 0) dst[block] = t;
    __syncthreads();
}

extern "C" __global__ void phase(const uint4* __restrict__ src, float* __restrict__ dst, long long words, int region) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    phase_body(src, dst, words, region, blockIdx.x, gridDim.x);
}

// sense-reversing grid barrier: bar[0] arrivals, bar[1] the generation
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned nblocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == nblocks - 1) {
            bar[0] = 0;
            __threadfence();
            atomicExch(bar + 1, g + 1);
        } else {
            while (*gen == g) {}
        }
        __threadfence();
    }
    __syncthreads();
}

extern "C" __global__ void persist(const uint4* __restrict__ src, float* __restrict__ dst, long long words,
                                   int nphase, unsigned* bar) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    for (int k = 0; k < nphase; ++k) {
        phase_body(src, dst, words, k, blockIdx.x, gridDim.x);
        if (k + 1 < nphase) grid_barrier(bar, gridDim.x);
    }
}

// rowop's work: 256-thread blocks (probe.py launches that many), n <= 16 x 256
__device__ __forceinline__ void rowop_body(const float* __restrict__ dst, const float* __restrict__ row,
                                           float* __restrict__ out, int n, int nsum) {
    __shared__ float red2[32];
    __shared__ float scale;
    float a[16];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        a[j] = i < n ? (i < nsum ? __ldcg(dst + i) : __ldcg(row + i)) : 0.f;
        ss += a[j] * a[j];
    }
    const float t = block_total(ss, red2);
    if (threadIdx.x == 0) scale = rsqrtf(t / (float)max(n, 1) + 1e-6f);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n) out[i] = a[j] * scale;
    }
}

extern "C" __global__ void rowop(const float* __restrict__ dst, const float* __restrict__ row, float* __restrict__ out,
                                 int n, int nsum) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    rowop_body(dst, row, out, n, nsum);
}

extern "C" __global__ void phase_tail(const uint4* __restrict__ src, float* __restrict__ dst, long long words,
                                      int region, const float* __restrict__ row, float* __restrict__ out, int n,
                                      unsigned* cnt) {
    __shared__ int last;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    phase_body(src, dst, words, region, blockIdx.x, gridDim.x);
    if (threadIdx.x == 0) {
        __threadfence();  // this block's dst write before its count
        last = atomicAdd(cnt, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // every other block's write, counted, before the reads
    rowop_body(dst, row, out, n, (int)gridDim.x);
    if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch and graph replay
}
