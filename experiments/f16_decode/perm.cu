// perm.cu — experiment (experiments/f16_decode/README.md, session 52): is mma.sync m16n8k16 f16 x f16 -> f32 invariant
// to a permutation of k inside one instruction? perm_probe.py launches this on A, B and on A[:, P], B[P, :] and
// compares the bits. One warp a trial: A (16 x 16 f16, row-major), B stored transposed (8 x 16 f16: Bt[n][k]),
// C (16 x 8 f32, row-major) in; D = A B + C out (row-major), the fragments loaded straight from global memory.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(32)
mma_trial(const uint16_t* __restrict__ A, const uint16_t* __restrict__ Bt, const float* __restrict__ C, float* D) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const uint16_t* a = A + (size_t)blockIdx.x * 256;
    const uint16_t* b = Bt + (size_t)blockIdx.x * 128;
    const float* c = C + (size_t)blockIdx.x * 128;
    float* d = D + (size_t)blockIdx.x * 128;
    auto pk = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
    // A fragment: a0 (g, 2t..2t+1), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..); B: b0 (k 2t.., n g), b1 (k 2t + 8..)
    const uint32_t a0 = pk(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
    const uint32_t a1 = pk(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
    const uint32_t a2 = pk(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
    const uint32_t a3 = pk(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
    const uint32_t b0 = pk(b[g * 16 + 2 * t], b[g * 16 + 2 * t + 1]);
    const uint32_t b1 = pk(b[g * 16 + 2 * t + 8], b[g * 16 + 2 * t + 9]);
    // C / D fragment: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
    float r0 = c[g * 8 + 2 * t], r1 = c[g * 8 + 2 * t + 1], r2 = c[(g + 8) * 8 + 2 * t], r3 = c[(g + 8) * 8 + 2 * t + 1];
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(r0), "+f"(r1), "+f"(r2), "+f"(r3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    d[g * 8 + 2 * t] = r0; d[g * 8 + 2 * t + 1] = r1; d[(g + 8) * 8 + 2 * t] = r2; d[(g + 8) * 8 + 2 * t + 1] = r3;
}
