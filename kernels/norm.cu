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
// Tunables: NORM_THREADS (block size, a multiple of 32, default 256); NORM_MAXV (float4s a
// thread holds, default 8: rows up to 32 * NORM_THREADS). MEMRA_CANARY: a wrong variant
// (divides by n - 1) that kernel-check must catch.
//
// Shape of the work: one block per row, every value read once into registers (thread t
// holds float4s t, t + NORM_THREADS, ...), the sums reduced in the block, the results and
// their q8 twin written from registers: one global round trip instead of three.
//
// Variant history (H200, per-kernel breakdown inside the decode graph):
//   v1  read x, reduce, re-read x and w, write out, barrier, re-read out for the q8 twin
//       (q8_quantize_warp): 2.6 us at n = 576, 4.1 us at n = 4096.
//   v2  register-resident row, q8 twin from registers by 8-lane groups: 1.7 us at n = 576,
//       2.5-3.1 us at n = 4096 (one block of 1024 threads: it needs a whole SM's registers).
//   v3  (this) rmsnorm rows of n >= 1024 by NORM_MAXV blocks of 256 threads, each reducing
//       the whole row and writing its share.
//
// q8 output (optional, for the dp4a matvecs): when xq is non-null the row of `out` is also
//   written as int8 blocks of 32 (xq [rows][n], xs [rows][n/32]) by q8_quantize_warp, the
//   rule every q8 producer shares (q8.cuh), so it equals quantize_q8 of `out` bit for bit.
// PDL: loads the weights (model constants), then waits for the previous kernel before
// touching the activations, then lets the next one launch.
//
// Launch contract: grid (n_rows) (rmsnorm: (n_rows, split), split <= NORM_MAXV blocks per
//   row, each writing NORM_MAXV / split of every thread's float4s), block (NORM_THREADS),
//   no dynamic shared memory.
//   Row r of x, delta, out starts at r * n (contiguous rows); n % 4 == 0 (n % 32 == 0 with
//   q8 output), n <= 4 * NORM_MAXV * NORM_THREADS, and the pointers are 16-byte aligned (float4 access). w_post, xq, xs may be
//   null.

#include "common.cuh"

// NORM_PDL_TRIGGER (1): when rmsnorm / add_rmsnorm let their PDL dependant start: 1 after their wait,
// 2 before it (experiments/pdl_early: a per-shape engine choice)
#ifndef NORM_PDL_TRIGGER
#define NORM_PDL_TRIGGER 1
#endif
#include "q8.cuh"

#ifndef NORM_THREADS
#define NORM_THREADS 256
#endif
#ifndef NORM_MAXV
#define NORM_MAXV 8
#endif

#define NORM_WARPS (NORM_THREADS / 32)
static_assert(NORM_THREADS % 32 == 0, "NORM_THREADS must be a multiple of 32");

// deterministic block sum: per-thread partials, xor-tree in each warp, warps summed in order
static __device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (NORM_WARPS == 1) return 0.f + v;  // one warp a row: no barrier (the same bits)
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

// out = a * s * w for the thread's float4s j in [j0, j1), plus the q8 twin when xq is non-null
// the thread's float4s of a weight vector (model constants: loaded before the PDL wait)
static __device__ __forceinline__ void load_w(float4 (&wv)[NORM_MAXV], const float* w, int n4) {
#pragma unroll
    for (int j = 0; j < NORM_MAXV; j++) {
        const int i = threadIdx.x + j * NORM_THREADS;
        wv[j] = (w && i < n4) ? reinterpret_cast<const float4*>(w)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

static __device__ __forceinline__ void write_row(const float4 (&a)[NORM_MAXV], float s, const float4 (&wv)[NORM_MAXV],
                                                 float4* orow, int n4, int8_t* xq, Q8Scale* xs,
                                                 int j0 = 0, int j1 = NORM_MAXV) {
#pragma unroll
    for (int j = 0; j < NORM_MAXV; j++) {
        const int i = threadIdx.x + j * NORM_THREADS;
        if (j * NORM_THREADS >= n4 || j >= j1) break;  // uniform over the block
        if (j < j0) continue;
        const bool active = i < n4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (active) {
            v = scale_mul(a[j], s, wv[j]);
            orow[i] = v;
        }
        if (xq) q8_store4(v, active, i, xq, xs);
    }
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
            int n, float eps, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs) {
    __shared__ float red[NORM_WARPS];
    const int n4 = n / 4;
    float4 wv[NORM_MAXV];
    load_w(wv, w, n4);
#if NORM_PDL_TRIGGER == 2
    MEMRA_PDL_LAUNCH();
#endif
    MEMRA_PDL_WAIT();
#if NORM_PDL_TRIGGER == 1
    MEMRA_PDL_LAUNCH();
#endif
    const size_t r = blockIdx.x;
    const float4* xr = (const float4*)(x + r * n);
    float4 a[NORM_MAXV];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_MAXV; j++) {
        const int i = threadIdx.x + j * NORM_THREADS;
        a[j] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += sumsq4(a[j]);
    }
    const float s = rms_scale(block_sum(ss, red), n, eps);
    // gridDim.y blocks share a row: each reduces all of it (the same sum, bit for bit) and
    // writes its own share of the thread's float4s
    const int per = (NORM_MAXV + gridDim.y - 1) / gridDim.y;
    write_row(a, s, wv, (float4*)(out + r * n), n4, xq ? xq + r * n : nullptr,
              xq ? xs + r * (n / 32) : nullptr, blockIdx.y * per, (blockIdx.y + 1) * per);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm(float* __restrict__ x, const float* __restrict__ delta,
                const float* __restrict__ w_post, const float* __restrict__ w,
                float* __restrict__ out, int n, float eps_post, float eps,
                int8_t* __restrict__ xq, Q8Scale* __restrict__ xs) {
    __shared__ float red[NORM_WARPS];
    const int n4 = n / 4;
    float4 wv[NORM_MAXV], wpv[NORM_MAXV];
    load_w(wv, w, n4);
    load_w(wpv, w_post, n4);
#if NORM_PDL_TRIGGER == 2
    MEMRA_PDL_LAUNCH();
#endif
    MEMRA_PDL_WAIT();
#if NORM_PDL_TRIGGER == 1
    MEMRA_PDL_LAUNCH();
#endif
    const size_t r = blockIdx.x;
    float4* xr = (float4*)(x + r * n);
    const float4* dr = (const float4*)(delta + r * n);
    float4 a[NORM_MAXV];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_MAXV; j++) {
        const int i = threadIdx.x + j * NORM_THREADS;
        a[j] = i < n4 ? dr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += sumsq4(a[j]);
    }
    float sp = 1.f;
    if (w_post) sp = rms_scale(block_sum(ss, red), n, eps_post);
    ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_MAXV; j++) {
        const int i = threadIdx.x + j * NORM_THREADS;
        if (i < n4) {
            float4 d = a[j];
            if (w_post) d = scale_mul(d, sp, wpv[j]);
            float4 v = xr[i];
            v.x = __fadd_rn(v.x, d.x);
            v.y = __fadd_rn(v.y, d.y);
            v.z = __fadd_rn(v.z, d.z);
            v.w = __fadd_rn(v.w, d.w);
            xr[i] = v;  // each thread owns its float4s: in place is safe
            a[j] = v;
        }
        ss += sumsq4(a[j]);  // zeros past the row
    }
    const float s = rms_scale(block_sum(ss, red), n, eps);
    write_row(a, s, wv, (float4*)(out + r * n), n4, xq ? xq + r * n : nullptr,
              xq ? xs + r * (n / 32) : nullptr);
}
