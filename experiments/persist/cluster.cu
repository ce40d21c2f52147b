// cluster.cu (experiments/persist, session 46): a persistent decode kernel that needs no grid-wide barrier —
// one thread-block cluster (up to 16 SMs, one block an SM) running every phase of a step, its phases separated by
// the hardware cluster barrier and their results exchanged through distributed shared memory. Session 13 priced a
// grid barrier in global memory at 2.02 µs a phase against 1.02 µs for a PDL launch boundary, session 24 a
// producer's-tail op at -0.5..-0.8 µs a launch: both pay a round trip through L2. A cluster barrier does not; what
// one cluster gives up is bandwidth (its SMs only). This probe measures both sides before anything is built.
//
// cl_persist(src, dst, words, nphase, mode): nphase phases, region k of src in phase k (16-byte loads, each block a
//   contiguous share of `words`, summed); each block puts its sum in its shared memory, and then
//   mode 0: a cluster barrier, and every block reads the cluster's sums from its peers' shared memory (DSMEM) and
//           adds them into its running value (a real dependency: the next phase's results depend on every block's);
//   mode 1: no barrier, no exchange: the cluster's streaming rate alone (the bandwidth ceiling of its SMs);
//   mode 2: mode 0 with the next phase's loads issued before the barrier (registers, PF words a thread at most):
//           the weight prefetch across op boundaries a real kernel would do (weights do not depend on activations).
// Launched as one cluster of gridDim.x blocks (probe.py --cluster), with enough dynamic shared memory that two
// blocks never share an SM. dst[rank] = the block's running value (nothing optimized away; the same in modes 0, 2).
#include "common.cuh"

#ifndef PF
#define PF 16  // mode 2: 16-byte words a thread held across the barrier
#endif

__device__ __forceinline__ unsigned cl_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned cl_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cl_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// a float at `p` (this block's shared memory) in block `rank`'s shared memory
__device__ __forceinline__ float cl_load(const float* p, unsigned rank) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
    return v;
}

__device__ __forceinline__ float sum4(uint4 v) {
    return __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.f;
    if (threadIdx.x < 32) {
        t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    }
    __syncthreads();
    return t;  // in warp 0
}

extern "C" __global__ void cl_persist(const uint4* __restrict__ src, float* __restrict__ dst, long long words,
                                      int nphase, int mode) {
    __shared__ float red[32];
    __shared__ float part[2];
    const unsigned rank = cl_rank(), n = cl_size();
    const long long per = (words + n - 1) / n;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    float run = 0.f;
    uint4 pf[PF];
    auto share = [&](int k, long long& b0, long long& b1) {
        const long long base = (long long)k * words;
        b0 = base + min((long long)rank * per, words);
        b1 = base + min((long long)(rank + 1) * per, words);
    };
    if (mode == 2) {
        long long b0, b1;
        share(0, b0, b1);
#pragma unroll
        for (int j = 0; j < PF; ++j) {
            const long long i = b0 + threadIdx.x + (long long)j * blockDim.x;
            pf[j] = i < b1 ? __ldcs(src + i) : make_uint4(0, 0, 0, 0);
        }
    }
    for (int k = 0; k < nphase; ++k) {
        long long b0, b1;
        share(k, b0, b1);
        float s = 0.f;
        if (mode == 2) {
#pragma unroll
            for (int j = 0; j < PF; ++j) s += sum4(pf[j]);
            for (long long i = b0 + threadIdx.x + (long long)PF * blockDim.x; i < b1; i += blockDim.x) s += sum4(__ldcs(src + i));
            if (k + 1 < nphase) {  // the next phase's loads, in flight across the barrier
                long long c0, c1;
                share(k + 1, c0, c1);
#pragma unroll
                for (int j = 0; j < PF; ++j) {
                    const long long i = c0 + threadIdx.x + (long long)j * blockDim.x;
                    pf[j] = i < c1 ? __ldcs(src + i) : make_uint4(0, 0, 0, 0);
                }
            }
        } else {
            for (long long i = b0 + threadIdx.x; i < b1; i += blockDim.x) s += sum4(__ldcs(src + i));
        }
        const float t = block_sum(s, red);
        if (mode == 1) {
            if (threadIdx.x == 0) run += t;
            continue;
        }
        if (threadIdx.x == 0) part[k & 1] = t + 1e-30f * run;
        cl_sync();  // every block's part[k & 1] written, and visible cluster-wide
        if (threadIdx.x < 32) {
            float v = threadIdx.x < n ? cl_load(&part[k & 1], threadIdx.x) : 0.f;
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            run += v;  // the same in every thread of warp 0 and every block
        }
        // part[k & 1] is written again in phase k + 2, after barrier k + 1, which this block reaches only after its
        // read above: one barrier a phase is enough.
    }
    if (mode != 1) cl_sync();  // no block leaves while a peer may still read its shared memory
    if (threadIdx.x == 0) dst[rank] = run;
}
