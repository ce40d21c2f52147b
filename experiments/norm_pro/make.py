#!/usr/bin/env python3
"""build/matvec.cu: kernels/matvec.cu with MV_NORM (issue 14 item 1: the RMSNorm before a matvec moved into its
prologue): entry points mv_q8n / mv_q8n_glu take the f32 rows x and the norm weight (null: quantize only, the down
projection's quantize_q8 moved in likewise), and each block normalizes and quantizes the rows into shared memory itself (no launch between the residual and the matvec, no traffic between
blocks), then runs mv_q8's loop on them in MV_XSMEM's tile-interleaved layout.

Exactness: the same bits as norm.cu's rmsnorm at NORM_THREADS = MV_NORM followed by mv_q8: the prologue emulates
that kernel's order — thread vt's partial over float4s vt, vt + MV_NORM, ... (sumsq4, the same expression), each
32-thread group's xor tree, the groups summed in order from 0.f — with this block's threads taking the virtual
threads in turn; then norm.cu's rms_scale and scale_mul (explicit roundings) and q8.cuh's q8_store4 (d = amax /
127, q = rint(v / d): order-free). So the engine's tokens would not change, and kernel-check can compare the
fused launch with the two launches bit for bit. probe.py checks that and times both.

    python3 experiments/norm_pro/make.py
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from kernel_edit import build_copy, make_variant  # noqa: E402

BUILD, ARM_FILE, HEADER = build_copy(HERE, "matvec.cu")

PROLOGUE = r'''
#ifndef MV_NORM
#define MV_NORM 0
#endif
#if MV_NORM
static_assert(MV_NORM % 32 == 0 && MV_NORM <= 1024, "MV_NORM: the emulated rmsnorm's NORM_THREADS");
// norm.cu's arithmetic: its sumsq4 / rms_scale / scale_mul, taken from kernels/norm.cu by make.py (norm_helpers)
@NORM_HELPERS@// rows b < nb of x (K floats each): rmsnorm(x[b]) * w quantized to lq / ls (linear, shared memory), as norm.cu's
// rmsnorm with NORM_THREADS = MV_NORM and its q8 twin write them; red: MV_NORM / 32 floats of shared memory.
// w null: x[b] quantized as it is (q8.cu's quantize_q8 of the down projection's input; the q8 rule is order-free)
MEMRA_DEVICE void mvn_rows(const float* __restrict__ x, const float* __restrict__ w, float eps, int K, int nb,
                           int8_t* lq, Q8Scale* ls, float* red) {
    constexpr int NT = MV_NORM, NW = MV_NORM / 32, BT = 32 * MV_NWARPS;
    const int n4 = K / 4, lane = threadIdx.x & 31, maxv = (n4 + NT - 1) / NT;  // norm.py: NORM_MAXV
    const float4* wr = reinterpret_cast<const float4*>(w);
    for (int b = 0; b < nb; ++b) {
        const float4* xr = reinterpret_cast<const float4*>(x + (size_t)b * K);
        for (int vt = threadIdx.x; w && vt < NT; vt += BT) {  // warp-uniform: BT and NT are multiples of 32
            float ss = 0.f;
            for (int j = 0; j < maxv; ++j) {
                const int i = vt + j * NT;
                ss += mvn_sumsq4(i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f));
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) red[vt >> 5] = ss;
        }
        __syncthreads();
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < NW; i++) s += red[i];  // NW == 1: 0.f + v, as block_sum
        const float sc = mvn_rms_scale(s, K, eps);
        for (int i0 = 0; i0 < n4; i0 += BT) {  // every lane of a warp calls q8_store4
            const int i = i0 + (int)threadIdx.x;
            const bool active = i < n4;
            const float4 v = active ? (w ? mvn_scale_mul(xr[i], sc, wr[i]) : xr[i]) : make_float4(0.f, 0.f, 0.f, 0.f);
            q8_store4(v, active, i, lq + (size_t)b * K, ls + (size_t)b * (K / 32));
        }
        __syncthreads();  // red is the next row's
    }
}
#endif
'''

STAGE = r'''#if MV_NORM
    // the rows normalized and quantized here (mvn_rows), then tile-interleaved as MV_XSMEM stages them
    extern __shared__ __align__(16) uint8_t mv_smem[];
    const int ntile = (nu + 31) >> 5;
    int8_t* sxq = reinterpret_cast<int8_t*>(mv_smem);                      // nb x ntile x 2048 B
    int2* sxs = reinterpret_cast<int2*>(mv_smem + (size_t)nb * ntile * 2048); // nb x ntile x 128 x 8 B
    int8_t* lq = reinterpret_cast<int8_t*>(mv_smem + (size_t)nb * ntile * 3072);
    Q8Scale* ls = reinterpret_cast<Q8Scale*>(lq + (size_t)nb * K);
    mvn_rows(xn, nw, eps, K, nb, lq, ls, reinterpret_cast<float*>(ls + (size_t)nb * (K / 32)));
    for (int i = threadIdx.x; i < nb * nu * 4; i += blockDim.x) {
        const int b = i / (nu * 4), ug = i - b * nu * 4, uu = ug >> 2, g = ug & 3;
        const int e = T::goff(uu, g, nu);
        const int c = (uu >> 5) * 128 + g * 32 + (uu & 31);
        reinterpret_cast<int4*>(sxq)[(size_t)b * ntile * 128 + c] = *reinterpret_cast<const int4*>(lq + (size_t)b * K + e);
        sxs[(size_t)b * ntile * 128 + c] = *reinterpret_cast<const int2*>(ls + (size_t)b * (K / 32) + e / 32);
    }
    __syncthreads();
#elif MV_XSMEM
'''

EDITS = [
    ('#include "qtypes.cuh"\n', '#include "qtypes.cuh"\n' + PROLOGUE),
    ("                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,\n"
     "                        float* y, const float* res, int N, int K, int nb, int act) {\n",
     "                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,\n"
     "                        float* y, const float* res, int N, int K, int nb, int act,\n"
     "                        const float* __restrict__ xn = nullptr, const float* __restrict__ nw = nullptr,\n"
     "                        float eps = 0.f) {\n"),
    ("#if MV_XSMEM\n    // Stage x in shared memory, tile-interleaved:", STAGE + "    // Stage x in shared memory, tile-interleaved:"),
    ("#if MV_XSMEM\n                    const size_t c =", "#if MV_XSMEM || MV_NORM\n                    const size_t c ="),
    ("    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);\n}\n#endif\n",
     "    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);\n}\n"
     "#if MV_NORM\n"
     "extern \"C\" __global__ void __launch_bounds__(32 * MV_NWARPS)\n"
     "mv_q8n(const uint8_t* bulk, const uint8_t* meta, const float* xn, const float* nw, float eps, float* y,\n"
     "       const float* res, int N, int K, int nb, int act) {\n"
     "    mv_q8_body<MV_B, false>(bulk, meta, nullptr, nullptr, y, res, N, K, nb, act, xn, nw, eps);\n}\n"
     "extern \"C\" __global__ void __launch_bounds__(32 * MV_NWARPS)\n"
     "mv_q8n_glu(const uint8_t* bulk, const uint8_t* meta, const float* xn, const float* nw, float eps, float* y,\n"
     "           const float* res, int N, int K, int nb, int act) {\n"
     "    mv_q8_body<MV_B, true>(bulk, meta, nullptr, nullptr, y, res, N, K, nb, act, xn, nw, eps);\n}\n"
     "#endif\n#endif\n"),
]


def norm_helpers() -> str:
    """kernels/norm.cu's sumsq4, rms_scale and scale_mul as mvn_* (taken from the file, so the prologue's arithmetic
    is norm.cu's expressions, whatever they become); its canary (#ifdef MEMRA_CANARY: matvec.cu always defines it)
    becomes MEMRA_CANARY == 3, unused by matvec.cu's own canaries."""
    text = (ROOT / "kernels" / "norm.cu").read_text()
    start = "static __device__ __forceinline__ float sumsq4(float4 a) {\n"
    end = "// out = a * s * w for the thread's float4s"
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit("norm.cu's helpers moved: update norm_helpers")
    h = text[text.index(start):text.index(end)]
    for old, new in (("#ifdef MEMRA_CANARY\n", "#if MEMRA_CANARY == 3\n"), ("float sumsq4(", "float mvn_sumsq4("),
                     # the contraction NVRTC makes of sumsq4 in rmsnorm (x^2 + y^2 as fma(x, x, y * y), then z, w:
                     # static SASS of every NORM_THREADS 32..1024 x NORM_MAXV 1..8 module, session 32), pinned
                     # here so the prologue's surroundings cannot make NVRTC contract it the other way
                     ("return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;",
                      "return __fmaf_rn(a.w, a.w, __fmaf_rn(a.z, a.z, __fmaf_rn(a.x, a.x, __fmul_rn(a.y, a.y))));"),
                     ("float rms_scale(", "float mvn_rms_scale("), ("float4 scale_mul(", "float4 mvn_scale_mul(")):
        if h.count(old) != 1:
            raise SystemExit(f"norm.cu's helpers changed: {old.strip()!r} (update norm_helpers)")
        h = h.replace(old, new)
    return h


def generate() -> None:
    edits = [(old, new.replace("@NORM_HELPERS@", norm_helpers())) for old, new in EDITS]
    if make_variant(ROOT / "kernels" / "matvec.cu", BUILD, edits, HEADER):
        raise SystemExit("matvec.cu's anchor moved: update the edits")


if __name__ == "__main__":
    generate()
