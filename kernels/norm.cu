// norm.cu — RMSNorm, alone and fused with the residual add.
//
//   rmsnorm:      out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps)
//   add_rmsnorm:  d = w_post ? rmsnorm(delta[r]) * w_post : delta[r]   (gemma3 post-norms)
//                 x[r] += d                                            (residual, in place)
//                 out[r] = rmsnorm(x[r]) * w                           (the next op's input)
//   Each row's reduction order depends only on n and NORM_THREADS, never on the number of
//   rows, so a row gives the same bits alone or in a batch.
//   The scale is 1/sqrtf(mean + eps) and each product is rounded separately (x*scale)*w,
//   as ggml evaluates it.
//
// Tunables: NORM_THREADS (block size, a multiple of 32, default 256). MEMRA_CANARY: a
// wrong variant (divides by n - 1) that kernel-check must catch.
//
// q8 output (optional, for the dp4a matvecs): when xq is non-null the row of `out` is also
//   written as int8 blocks of 32 (xq [rows][n], xs [rows][n/32]) by q8_quantize_warp, the
//   rule every q8 producer shares (q8.cuh), so it equals quantize_q8 of `out` bit for bit.
// PDL: waits for the previous kernel before touching memory, then lets the next one launch.
//
// Launch contract: grid (n_rows), block (NORM_THREADS), no dynamic shared memory.
//   Row r of x, delta, out starts at r * n (contiguous rows); n % 4 == 0 (n % 32 == 0 with
//   q8 output) and the pointers are 16-byte aligned (float4 access). w_post, xq, xs may be
//   null.

#include "common.cuh"
#include "q8.cuh"

#ifndef NORM_THREADS
#define NORM_THREADS 256
#endif

#define NORM_WARPS (NORM_THREADS / 32)

// deterministic block sum: per-thread partials, xor-tree in each warp, warps summed in order
static __device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NORM_WARPS; i++) s += red[i];
    return s;
}

static __device__ __forceinline__ float sumsq4(float4 a) {
    return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
}

static __device__ __forceinline__ float rms_scale(float ss, int n, float eps) {
#ifdef MEMRA_CANARY
    n -= 1;  // kernel-check canary: the variance of a sample, not the mean square
#endif
    return 1.0f / sqrtf(__fadd_rn(__fdiv_rn(ss, (float)n), eps));
}

static __device__ __forceinline__ float4 scale_mul(float4 a, float s, float4 w) {
    return make_float4(__fmul_rn(__fmul_rn(a.x, s), w.x), __fmul_rn(__fmul_rn(a.y, s), w.y),
                       __fmul_rn(__fmul_rn(a.z, s), w.z), __fmul_rn(__fmul_rn(a.w, s), w.w));
}

// the q8 twin of a finished output row (each warp takes whole blocks of 32)
static __device__ __forceinline__ void quantize_row(const float* orow, int n, int8_t* xq, Q8Scale* xs) {
    __syncthreads();  // the row was written by other threads of the block
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int b = warp; b < n / 32; b += NORM_WARPS)
        q8_quantize_warp(orow[b * 32 + lane], xq + (size_t)blockIdx.x * n + b * 32,
                         xs + (size_t)blockIdx.x * (n / 32) + b);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
            int n, float eps, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs) {
    __shared__ float red[NORM_WARPS];
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const float4* xr = (const float4*)(x + (size_t)blockIdx.x * n);
    float4* orow = (float4*)(out + (size_t)blockIdx.x * n);
    const float4* w4 = (const float4*)w;
    int n4 = n / 4;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n4; i += NORM_THREADS) ss += sumsq4(xr[i]);
    float s = rms_scale(block_sum(ss, red), n, eps);
    for (int i = threadIdx.x; i < n4; i += NORM_THREADS) orow[i] = scale_mul(xr[i], s, w4[i]);
    if (xq) quantize_row(out + (size_t)blockIdx.x * n, n, xq, xs);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm(float* __restrict__ x, const float* __restrict__ delta,
                const float* __restrict__ w_post, const float* __restrict__ w,
                float* __restrict__ out, int n, float eps_post, float eps,
                int8_t* __restrict__ xq, Q8Scale* __restrict__ xs) {
    __shared__ float red[NORM_WARPS];
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    float4* xr = (float4*)(x + (size_t)blockIdx.x * n);
    const float4* dr = (const float4*)(delta + (size_t)blockIdx.x * n);
    float4* orow = (float4*)(out + (size_t)blockIdx.x * n);
    const float4* w4 = (const float4*)w;
    int n4 = n / 4;
    float sp = 1.f;
    if (w_post) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < n4; i += NORM_THREADS) ss += sumsq4(dr[i]);
        sp = rms_scale(block_sum(ss, red), n, eps_post);
    }
    const float4* wp4 = (const float4*)w_post;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n4; i += NORM_THREADS) {
        float4 d = dr[i];
        if (w_post) d = scale_mul(d, sp, wp4[i]);
        float4 a = xr[i];
        a.x = __fadd_rn(a.x, d.x);
        a.y = __fadd_rn(a.y, d.y);
        a.z = __fadd_rn(a.z, d.z);
        a.w = __fadd_rn(a.w, d.w);
        xr[i] = a;
        ss += sumsq4(a);
    }
    float s = rms_scale(block_sum(ss, red), n, eps);
    // each thread re-reads only the float4s it wrote itself: no barrier needed
    for (int i = threadIdx.x; i < n4; i += NORM_THREADS) orow[i] = scale_mul(xr[i], s, w4[i]);
    if (xq) quantize_row(out + (size_t)blockIdx.x * n, n, xq, xs);
}
