// embed.cu — token embedding: gather one row per token from a table kept in its GGUF
// block format and write it as float32, multiplied by a scale (gemma3: sqrt(n_embd)).
//
// Variants (one entry point per table type, same signature):
//   embed_f32, embed_f16, embed_bf16, embed_q4_0, embed_q4_1, embed_q5_0, embed_q5_1,
//   embed_q8_0, embed_q4_k, embed_q5_k, embed_q6_k, embed_iq4_xs
// Each element is decoded with the float expression, in the order, of ggml's
// dequantize_row_* (products rounded separately: no FMA contraction), so the row is
// bit-identical to memra.quants.dequantize; the scale is one more rounded multiply.
//
// Tunables: EMBED_THREADS (block size, default 256). MEMRA_CANARY: a wrong variant
// (reads the neighbouring row) that kernel-check must catch.
//
// Launch contract: grid (n_tokens), block (EMBED_THREADS), no shared memory.
//   table: the whole [n_vocab][row_bytes] tensor; tok[t]: the token of row t (a device
//   array, so a captured graph reads the token sampled by the previous step);
//   out[t * n_embd + j]. Tokens outside [0, n_vocab) write a row of NaN rather than read
//   out of bounds.

// PDL: each kernel waits for the previous one before touching memory, then lets the
// next one launch (both no-ops when launched without programmatic dependent launch).

#include "common.cuh"

#ifndef EMBED_THREADS
#define EMBED_THREADS 256
#endif

// kernel-check canary: gathers the neighbouring row
#ifdef MEMRA_CANARY
#define CANARY_ROW(id) ((id) ^ 1)
#else
#define CANARY_ROW(id) (id)
#endif

#define QK_K 256

static __device__ __forceinline__ float ld_f16(const uint8_t* p) {
    return f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static __device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }

// element j of a row, per type ----------------------------------------------------------

static __device__ float deq_f32(const uint8_t* row, int j) {
    return __uint_as_float((uint32_t)row[4 * j] | ((uint32_t)row[4 * j + 1] << 8) |
                           ((uint32_t)row[4 * j + 2] << 16) | ((uint32_t)row[4 * j + 3] << 24));
}

static __device__ float deq_f16(const uint8_t* row, int j) { return ld_f16(row + 2 * j); }

static __device__ float deq_bf16(const uint8_t* row, int j) {
    uint32_t u = (uint32_t)row[2 * j] | ((uint32_t)row[2 * j + 1] << 8);
    return __uint_as_float(u << 16);
}

// the 4-bit value of element l (0..31) of a 16-byte nibble group: low nibbles first
static __device__ __forceinline__ int nib32(const uint8_t* qs, int l) {
    return l < 16 ? (qs[l] & 0xF) : (qs[l - 16] >> 4);
}

static __device__ float deq_q4_0(const uint8_t* row, int j) {  // {d, qs[16]} 18 B
    const uint8_t* b = row + (j / 32) * 18;
    return fmul((float)(nib32(b + 2, j % 32) - 8), ld_f16(b));
}

static __device__ float deq_q4_1(const uint8_t* row, int j) {  // {d, m, qs[16]} 20 B
    const uint8_t* b = row + (j / 32) * 20;
    return fadd(fmul((float)nib32(b + 4, j % 32), ld_f16(b)), ld_f16(b + 2));
}

static __device__ __forceinline__ int q5_high(const uint8_t* qh, int l) {  // bit l of a LE u32
    return ((qh[l >> 3] >> (l & 7)) & 1) << 4;
}

static __device__ float deq_q5_0(const uint8_t* row, int j) {  // {d, qh[4], qs[16]} 22 B
    const uint8_t* b = row + (j / 32) * 22;
    int l = j % 32;
    return fmul((float)((nib32(b + 6, l) | q5_high(b + 2, l)) - 16), ld_f16(b));
}

static __device__ float deq_q5_1(const uint8_t* row, int j) {  // {d, m, qh[4], qs[16]} 24 B
    const uint8_t* b = row + (j / 32) * 24;
    int l = j % 32;
    return fadd(fmul((float)(nib32(b + 8, l) | q5_high(b + 4, l)), ld_f16(b)), ld_f16(b + 2));
}

static __device__ float deq_q8_0(const uint8_t* row, int j) {  // {d, qs[32]} 34 B
    const uint8_t* b = row + (j / 32) * 34;
    return fmul((float)(int8_t)b[2 + j % 32], ld_f16(b));
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block is (0..7), ggml get_scale_min_k4
static __device__ __forceinline__ void scale_min_k4(int is, const uint8_t* q, int* sc, int* m) {
    if (is < 4) {
        *sc = q[is] & 63;
        *m = q[is + 4] & 63;
    } else {
        *sc = (q[is + 4] & 0xF) | ((q[is - 4] >> 6) << 4);
        *m = (q[is + 4] >> 4) | ((q[is] >> 6) << 4);
    }
}

static __device__ float deq_q4_k(const uint8_t* row, int j) {  // {d, dmin, scales[12], qs[128]} 144 B
    const uint8_t* b = row + (j / QK_K) * 144;
    int e = j % QK_K, chunk = e / 64, l = e % 64, is = 2 * chunk + (l >= 32);
    int sc, m;
    scale_min_k4(is, b + 4, &sc, &m);
    float d1 = fmul(ld_f16(b), (float)sc), m1 = fmul(ld_f16(b + 2), (float)m);
    uint8_t q = b[16 + 32 * chunk + (l % 32)];
    int v = l < 32 ? (q & 0xF) : (q >> 4);
    return fsub(fmul(d1, (float)v), m1);
}

static __device__ float deq_q5_k(const uint8_t* row, int j) {  // {d, dmin, scales[12], qh[32], qs[128]} 176 B
    const uint8_t* b = row + (j / QK_K) * 176;
    int e = j % QK_K, chunk = e / 64, l = e % 64, is = 2 * chunk + (l >= 32);
    int sc, m;
    scale_min_k4(is, b + 4, &sc, &m);
    float d1 = fmul(ld_f16(b), (float)sc), m1 = fmul(ld_f16(b + 2), (float)m);
    uint8_t q = b[48 + 32 * chunk + (l % 32)];
    uint8_t h = b[16 + (l % 32)];
    int v = (l < 32 ? (q & 0xF) : (q >> 4)) + (((h >> is) & 1) << 4);
    return fsub(fmul(d1, (float)v), m1);
}

static __device__ float deq_q6_k(const uint8_t* row, int j) {  // {ql[128], qh[64], sc[16], d} 210 B
    const uint8_t* b = row + (j / QK_K) * 210;
    int e = j % QK_K, half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t* ql = b + 64 * half;
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = (const int8_t*)(b + 192) + 8 * half;
    int lo = (quarter & 1) ? ql[l + 32] : ql[l];
    lo = (quarter & 2) ? (lo >> 4) : (lo & 0xF);
    int hi = (qh[l] >> (2 * quarter)) & 3;
    int q = (lo | (hi << 4)) - 32;
    int is = l / 16 + 2 * quarter;
    return fmul(fmul(ld_f16(b + 208), (float)sc[is]), (float)q);
}

__constant__ int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static __device__ float deq_iq4_xs(const uint8_t* row, int j) {  // {d, scales_h, scales_l[4], qs[128]} 136 B
    const uint8_t* b = row + (j / QK_K) * 136;
    int e = j % QK_K, ib = e / 32, l = e % 32;
    int sh = b[2] | (b[3] << 8);
    int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    float dl = fmul(ld_f16(b), (float)(ls - 32));
    return fmul(dl, (float)kvalues_iq4nl[nib32(b + 8 + 16 * ib, l)]);
}

// entry points ----------------------------------------------------------------------------

#define EMBED_KERNEL(NAME, DEQ)                                                               \
    extern "C" __global__ void __launch_bounds__(EMBED_THREADS)                               \
        NAME(const uint8_t* __restrict__ table, const int* __restrict__ tok,                   \
             float* __restrict__ out, int n_vocab, int n_embd, long long row_bytes,           \
             float scale) {                                                                    \
        MEMRA_PDL_WAIT();                                                                     \
        MEMRA_PDL_LAUNCH();                                                                   \
        int t = blockIdx.x;                                                                   \
        int id = tok[t];                                                                      \
        float* o = out + (size_t)t * n_embd;                                                  \
        if (id < 0 || id >= n_vocab) {                                                        \
            for (int j = threadIdx.x; j < n_embd; j += EMBED_THREADS) o[j] = __int_as_float(0x7fc00000); \
            return;                                                                           \
        }                                                                                     \
        const uint8_t* row = table + (size_t)CANARY_ROW(id) * (size_t)row_bytes;                          \
        for (int j = threadIdx.x; j < n_embd; j += EMBED_THREADS)                             \
            o[j] = fmul(DEQ(row, j), scale);                                                  \
    }

EMBED_KERNEL(embed_f32, deq_f32)
EMBED_KERNEL(embed_f16, deq_f16)
EMBED_KERNEL(embed_bf16, deq_bf16)
EMBED_KERNEL(embed_q4_0, deq_q4_0)
EMBED_KERNEL(embed_q4_1, deq_q4_1)
EMBED_KERNEL(embed_q5_0, deq_q5_0)
EMBED_KERNEL(embed_q5_1, deq_q5_1)
EMBED_KERNEL(embed_q8_0, deq_q8_0)
EMBED_KERNEL(embed_q4_k, deq_q4_k)
EMBED_KERNEL(embed_q5_k, deq_q5_k)
EMBED_KERNEL(embed_q6_k, deq_q6_k)
EMBED_KERNEL(embed_iq4_xs, deq_iq4_xs)
