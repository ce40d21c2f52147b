// sample.cu — choosing the next token on the device: argmax (greedy) and seeded sampling
// with temperature, top-k, top-p and min-p; each writes the token where the next decode
// step reads it, so a captured graph needs no host work between steps.
//
// Commit (both kernels, row b): nothing when pos[b] < 0 (a padded row); else tok[b] = id;
//   hist[b * hist_len + step[b]] = id when hist is non-null and 0 <= step[b] < hist_len;
//   step[b] += 1; pos[b] += advance (1 after a decode step, whose pos[b] is the fed token's
//   position; 0 for the token after a prefill, whose pos[b] already is the next position).
//   The chosen token's position pos[b] + advance numbers the random draw, so a token is a
//   function of (logits, seed, position) only — however its sequence was batched, chunked
//   or verified.
//
// argmax_partial / argmax_final: the largest logit, ties to the smallest index (numpy's
//   argmax); NaN logits are never chosen.
// sample: llama.cpp's default order with penalties off — top-k, top-p, min-p on the
//   untempered distribution, then temperature, then one draw:
//   key(x): the float's bits mapped to an order-preserving u32; M = max logit;
//   K1 = the top_k-th largest key (0 when top_k <= 0 or top_k >= n): keep key >= K1
//   (ties at the k-th value are all kept);
//   F(x) = (u64)(x * 2^40) (fixed point: integer sums are exact and order-free);
//   top_p < 1: Z = sum over kept of F(expf(l - M)); need = max(1, (u64)(top_p * Z));
//   K2 = the largest key with sum_{kept, key >= K2} F(expf(l - M)) >= need; keep key >= K2;
//   min_p > 0: keep expf(l - M) >= min_p;
//   temp <= 0: argmax instead of a draw;
//   w_i = kept ? F(expf((l_i - M) / temp)) : 0, W = sum w; u = uniform(seed, position) in
//   [0, 1); target = min(W - 1, (u64)(u * W)); the token is the smallest i whose
//   inclusive prefix sum of w (in token order) exceeds target.
//   uniform(seed, c) = (splitmix64(seed + (c + 1) * 0x9E3779B97F4A7C15) >> 11) * 2^-53.
//
// Tunables: SAMPLE_THREADS (block size for every kernel here, default 1024).
// MEMRA_CANARY: wrong variants kernel-check must catch: 1, sample draws the next position's
// number; 2, argmax (and sample's greedy argmax) breaks ties to the largest index.
// Launch contract:
//   argmax_partial: grid (NB, B), block (SAMPLE_THREADS); part_val/part_idx: [B][NB].
//   argmax_final:   grid (B), block (SAMPLE_THREADS); NB <= SAMPLE_THREADS.
//   sample:         grid (B), block (SAMPLE_THREADS); logits [B][n]; fparams [B][3]
//     (temp, top_p, min_p); top_k [B]; seed [B].

// PDL: each kernel waits for the previous one before touching memory, then lets the
// next one launch (both no-ops when launched without programmatic dependent launch).

#include "common.cuh"

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif
#define SW (SAMPLE_THREADS / 32)
#define NEG_INF __int_as_float(0xff800000)
#define FIX_ONE 1099511627776.0f  // 2^40

typedef unsigned long long u64;

static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 2
    return v > bv || (v == bv && i > bi);  // kernel-check canary: ties go to the largest index
#else
    return v > bv || (v == bv && i < bi);
#endif
}

// block-wide argmax; every thread gets the result
static __device__ void block_argmax(float& v, int& idx) {
    __shared__ float sv[SW];
    __shared__ int si[SW];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (better(ov, oi, v, idx)) { v = ov; idx = oi; }
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) { sv[threadIdx.x / 32] = v; si[threadIdx.x / 32] = idx; }
    __syncthreads();
    v = sv[0];
    idx = si[0];
    for (int w = 1; w < SW; w++)
        if (better(sv[w], si[w], v, idx)) { v = sv[w]; idx = si[w]; }
    __syncthreads();
}

static __device__ u64 block_sum_u64(u64 x) {
    __shared__ u64 s[SW];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = x;
    __syncthreads();
    u64 t = 0;
    for (int w = 0; w < SW; w++) t += s[w];
    __syncthreads();
    return t;
}

static __device__ __forceinline__ void commit(int b, int id, int* tok, int* pos, int* step,
                                              int* hist, int hist_len, int advance) {
    if (pos[b] < 0) return;  // a padded row of the batch: nothing to choose
    tok[b] = id;
    int k = step[b];
    if (hist && k >= 0 && k < hist_len) hist[(size_t)b * hist_len + k] = id;
    step[b] = k + 1;
    pos[b] += advance;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    argmax_partial(const float* __restrict__ logits, int n, float* __restrict__ part_val,
                   int* __restrict__ part_idx) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int b = blockIdx.y, nb = gridDim.x;
    const float* l = logits + (size_t)b * n;
    int seg = (n + nb - 1) / nb;
    int i0 = blockIdx.x * seg, i1 = min(n, i0 + seg);
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += SAMPLE_THREADS)
        if (better(l[i], i, v, idx)) { v = l[i]; idx = i; }
    block_argmax(v, idx);
    if (threadIdx.x == 0) {
        part_val[(size_t)b * nb + blockIdx.x] = v;
        part_idx[(size_t)b * nb + blockIdx.x] = idx;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    argmax_final(const float* __restrict__ part_val, const int* __restrict__ part_idx, int nb,
                 int* tok, int* pos, int* step, int* hist, int hist_len, int advance) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int b = blockIdx.x;
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < nb; i += SAMPLE_THREADS)
        if (better(part_val[(size_t)b * nb + i], part_idx[(size_t)b * nb + i], v, idx)) {
            v = part_val[(size_t)b * nb + i];
            idx = part_idx[(size_t)b * nb + i];
        }
    block_argmax(v, idx);
    if (threadIdx.x == 0) commit(b, idx == 0x7fffffff ? 0 : idx, tok, pos, step, hist, hist_len, advance);
}

static __device__ __forceinline__ uint32_t fkey(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ u64 fix(float w) { return (u64)(w * FIX_ONE); }

static __device__ __forceinline__ u64 splitmix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The largest key K (among elements with key >= floor_key) such that the weight of
// {key >= K} reaches need: weight 1 per element (by_mass false) or F(expf(l - M)).
static __device__ uint32_t radix_select(const float* l, int n, float M, uint32_t floor_key,
                                       u64 need, bool by_mass) {
    __shared__ u64 hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ u64 s_need;
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SAMPLE_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) {
            float x = l[i];
            uint32_t k = fkey(x);
            if (k >= floor_key && (k & mask) == prefix && x == x) {
                u64 w = by_mass ? fix(expf(x - M)) : 1ull;
                if (w) atomicAdd(&hist[(k >> shift) & 255], w);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 cum = 0;
            int sel = 0;
            for (int bin = 255; bin >= 0; bin--) {
                if (cum + hist[bin] >= need) { sel = bin; break; }
                cum += hist[bin];
            }
            s_need = need - cum;
            s_prefix = prefix | ((uint32_t)sel << shift);
        }
        __syncthreads();
        need = s_need;
        prefix = s_prefix;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample(const float* __restrict__ logits, int n, const float* __restrict__ fparams,
           const int* __restrict__ top_k_arr, const u64* __restrict__ seeds, int* tok, int* pos,
           int* step, int* hist, int hist_len, int advance) {
    __shared__ u64 scan[SW];
    __shared__ int s_choice;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int b = blockIdx.x;
    const float* l = logits + (size_t)b * n;
    const float temp = fparams[b * 3], top_p = fparams[b * 3 + 1], min_p = fparams[b * 3 + 2];
    const int top_k = top_k_arr[b];

    float M = NEG_INF;
    int am = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS)
        if (better(l[i], i, M, am)) { M = l[i]; am = i; }
    block_argmax(M, am);
    if (!(temp > 0.f) || top_k == 1) {
        if (threadIdx.x == 0) commit(b, am == 0x7fffffff ? 0 : am, tok, pos, step, hist, hist_len, advance);
        return;
    }

    uint32_t kmin = 0;
    if (top_k > 0 && top_k < n) kmin = radix_select(l, n, M, 0, (u64)top_k, false);
    if (top_p < 1.f) {
        u64 z = 0;
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) {
            float x = l[i];
            if (fkey(x) >= kmin && x == x) z += fix(expf(x - M));
        }
        z = block_sum_u64(z);
        u64 need = (u64)((double)top_p * (double)z);
        if (need < 1) need = 1;
        kmin = radix_select(l, n, M, kmin, need, true);
    }

    // weights over contiguous per-thread ranges, then an exclusive scan of the ranges
    const int per = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int i0 = threadIdx.x * per, i1 = min(n, i0 + per);
    u64 total = 0;
    for (int i = i0; i < i1; i++) {
        float x = l[i];
        if (fkey(x) >= kmin && x == x && (min_p <= 0.f || expf(x - M) >= min_p))
            total += fix(expf((x - M) / temp));
    }
    // inclusive scan within the warp, then across warps
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u64 inc = total;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) scan[warp] = inc;
    __syncthreads();
    u64 before = 0, W = 0;
    for (int w = 0; w < SW; w++) {
        if (w < warp) before += scan[w];
        W += scan[w];
    }
    const u64 excl = before + inc - total;
    // the draw's counter: the position the chosen token will take (pos[b] + advance)
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 1
    const u64 c = (u64)(pos[b] + advance) + 1;  // kernel-check canary: the next position's draw
#else
    const u64 c = (u64)(pos[b] + advance);
#endif
    const double u = (double)(splitmix64(seeds[b] + (c + 1) * 0x9E3779B97F4A7C15ull) >> 11) *
                     (1.0 / 9007199254740992.0);
    u64 target = (u64)(u * (double)W);
    if (target >= W) target = W - 1;
    if (threadIdx.x == 0) s_choice = am;  // W > 0 always (the max has weight 2^40)
    __syncthreads();
    if (total > 0 && excl <= target && target < excl + total) {
        u64 run = excl;
        for (int i = i0; i < i1; i++) {
            float x = l[i];
            if (fkey(x) >= kmin && x == x && (min_p <= 0.f || expf(x - M) >= min_p)) {
                run += fix(expf((x - M) / temp));
                if (run > target) { s_choice = i; break; }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) commit(b, s_choice, tok, pos, step, hist, hist_len, advance);
}
