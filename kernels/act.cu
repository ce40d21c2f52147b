// act.cu — gated activations of the feed-forward block, and the final logit soft-cap.
//
//   act_mul:  out[r, i] = act(gate[r, i]) * up[r, i]
//             act = SiLU  x / (1 + expf(-x))                                  (act == 0)
//                 = GELU-tanh  0.5 x (1 + tanhf(sqrt(2/pi) (x + 0.044715 x^3)))  (act == 1)
//   softcap:  x[i] = cap * tanhf(x[i] / cap)   (in place)
//
// Tunables: ACT_THREADS (default 256). MEMRA_CANARY: wrong variants that kernel-check must
// catch (act_mul always SiLU; softcap leaves the last value unwritten).
// Launch contract:
//   act_mul: grid (ceil(n / ACT_THREADS), n_rows), block (ACT_THREADS); rows of gate, up
//     and out start at r * gate_stride / up_stride / out_stride floats (gate and up may
//     be the two halves of one fused gate+up output).
//   softcap: grid (ceil(n / ACT_THREADS)), block (ACT_THREADS).

// PDL: each kernel waits for the previous one before touching memory, then lets the
// next one launch (both no-ops when launched without programmatic dependent launch).

#include "common.cuh"

#ifndef ACT_THREADS
#define ACT_THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(ACT_THREADS)
    act_mul(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out,
            int n, int gate_stride, int up_stride, int out_stride, int act) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    int i = blockIdx.x * ACT_THREADS + threadIdx.x;
    int r = blockIdx.y;
    if (i >= n) return;
    float g = gate[(size_t)r * gate_stride + i];
#ifdef MEMRA_CANARY
    float a = silu_f32(g);  // kernel-check canary: ignores the model's activation
#else
    float a = act ? gelu_tanh_f32(g) : silu_f32(g);
#endif
    out[(size_t)r * out_stride + i] = a * up[(size_t)r * up_stride + i];
}

extern "C" __global__ void __launch_bounds__(ACT_THREADS)
    softcap(float* __restrict__ x, int n, float cap) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    int i = blockIdx.x * ACT_THREADS + threadIdx.x;
#ifdef MEMRA_CANARY
    n -= 1;  // kernel-check canary: the last value is left as it was (in place: unwritten)
#endif
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
