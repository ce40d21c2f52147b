// common.cuh — helpers shared by every memra kernel family.
//
// NVRTC compiles memra's kernels with no CUDA include path (no <cuda_fp16.h>), so the few
// things needed from those headers are written here directly: fixed-width integer types,
// f16/bf16 <-> f32 conversions (exact, via PTX cvt), warp reductions, and the programmatic
// dependent launch (PDL) hooks.
//
// PDL contract (sm_90+; no-ops below): a kernel launched with pdl=True may begin while the
// previous kernel in the stream still runs. It must call MEMRA_PDL_WAIT() before reading
// anything the previous kernel wrote (and before writing anything it reads), and may call
// MEMRA_PDL_LAUNCH() once its remaining work no longer gates the next kernel's start.
// Every memra kernel calls MEMRA_PDL_LAUNCH() only after its own MEMRA_PDL_WAIT(), so a
// kernel starts only once every launch before its predecessor has completed: data written
// two or more launches back (positions, the sampler's token) and constants (weights) may be
// read before the wait.
#pragma once

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define MEMRA_DEVICE __device__ __forceinline__

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MEMRA_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define MEMRA_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define MEMRA_PDL_WAIT() do {} while (0)
#define MEMRA_PDL_LAUNCH() do {} while (0)
#endif

// IEEE half (bits) -> float: exact.
MEMRA_DEVICE float f16_to_f32(uint16_t h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// float -> IEEE half (bits), round to nearest even (what numpy's astype(float16) does).
MEMRA_DEVICE uint16_t f32_to_f16(float f) {
    uint16_t h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

// bfloat16 (bits) -> float: exact (the top 16 bits of an f32).
MEMRA_DEVICE float bf16_to_f32(uint16_t h) { return __uint_as_float(((uint32_t)h) << 16); }

// float -> bfloat16 bits, round to nearest even (NaN kept quiet).
MEMRA_DEVICE uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Sum over the 32 lanes of a warp (every lane gets the result). The butterfly order is
// fixed, so the result does not depend on anything but the 32 inputs.
MEMRA_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

MEMRA_DEVICE float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

MEMRA_DEVICE int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    const int8_t* pa = (const int8_t*)&a;
    const int8_t* pb = (const int8_t*)&b;
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// Activation functions used by gated FFNs; the CPU references use the same formulas.
MEMRA_DEVICE float silu_f32(float x) { return x / (1.0f + expf(-x)); }

MEMRA_DEVICE float gelu_tanh_f32(float x) {
    const float k0 = 0.7978845608028654f;   // sqrt(2/pi)
    const float k1 = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
}
