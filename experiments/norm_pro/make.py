#!/usr/bin/env python3
"""build/matvec.cu: kernels/matvec.cu with MV_NORM (issue 14 item 1: the RMSNorm before a matvec moved into its
prologue): entry points mv_q8n / mv_q8n_glu take the f32 rows x and the norm weight (null: quantize only, the down
projection's quantize_q8 moved in likewise), and each block normalizes and quantizes the rows into shared memory itself (no launch between the residual and the matvec, no traffic between
blocks), then runs mv_q8's loop on them in MV_XSMEM's tile-interleaved layout.

A non-null delta makes the prologue norm.cu's add_rmsnorm (Gemma-3's post-norms): the rows x + (w_post ?
rmsnorm(delta) * w_post : delta), normalized by w; block 0 writes those sums to xo (the residual's next buffer).

Exactness: the same bits as norm.cu's rmsnorm (add_rmsnorm) at NORM_THREADS = MV_NORM followed by mv_q8: the prologue
emulates that kernel's order — thread vt's partial over float4s vt, vt + MV_NORM, ... (sumsq4, the expression pinned
to the contraction NVRTC makes of it there: static SASS, session 32), each
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
@NORM_HELPERS@// the prologue's operands: the f32 rows x and the norm weight w (null: x quantized as it is, q8.cu's quantize_q8 of
// the down projection's input); delta non-null: add_rmsnorm's rows, x + (w_post ? rmsnorm(delta) * w_post : delta),
// normalized by w, and (xo non-null) block 0 writes those sums to xo (the residual's next buffer: x stays as it is)
struct MvnIn {
    const float* x = nullptr;
    const float* w = nullptr;
    float eps = 0.f;
    const float* delta = nullptr;
    const float* wp = nullptr;
    float eps_post = 0.f;
    float* xo = nullptr;
};
// norm.cu's block_sum over MV_NORM virtual threads, this block's threads taking them in turn: virtual thread vt's
// partial sums term(vt + j MV_NORM) for j < maxv in order from 0.f, each 32 virtual threads' xor tree, then the
// groups in order from 0.f; red: MV_NORM / 32 floats
template <class F>
MEMRA_DEVICE float mvn_block_sum(F term, int maxv, float* red) {
    constexpr int NT = MV_NORM, NW = MV_NORM / 32, BT = 32 * MV_NWARPS;
    const int lane = threadIdx.x & 31;
    for (int vt = threadIdx.x; vt < NT; vt += BT) {  // warp-uniform: BT and NT are multiples of 32
        float ss = 0.f;
        for (int j = 0; j < maxv; ++j) ss += term(vt + j * NT);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[vt >> 5] = ss;
    }
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NW; i++) s += red[i];  // NW == 1: 0.f + v, as block_sum
    __syncthreads();  // red is the next sum's
    return s;
}
// rows b < nb: norm.cu's rmsnorm (or add_rmsnorm) with NORM_THREADS = MV_NORM and its q8 twin, into lq / ls (linear,
// shared memory)
MEMRA_DEVICE void mvn_rows(const MvnIn& in, int K, int nb, int8_t* lq, Q8Scale* ls, float* red) {
    const int n4 = K / 4, maxv = (n4 + MV_NORM - 1) / MV_NORM;  // norm.py: NORM_MAXV
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4* wr = reinterpret_cast<const float4*>(in.w);
    const float4* wpr = reinterpret_cast<const float4*>(in.wp);
    for (int b = 0; b < nb; ++b) {
        const float4* xr = reinterpret_cast<const float4*>(in.x + (size_t)b * K);
        const float4* dr = reinterpret_cast<const float4*>(in.delta + (size_t)b * K);
        float sp = 1.f;
        if (in.delta && in.wp)
            sp = mvn_rms_scale(mvn_block_sum([&](int i) { return i < n4 ? mvn_sumsq4(dr[i]) : 0.f; }, maxv, red), K,
                               in.eps_post);
        // the row the norm reads: x, or (add_rmsnorm) x + d, one __fadd_rn a value as norm.cu's
        auto row = [&](int i) {
            float4 v = xr[i];
            if (in.delta) {
                float4 d = dr[i];
                if (in.wp) d = mvn_scale_mul(d, sp, wpr[i]);
                v = make_float4(__fadd_rn(v.x, d.x), __fadd_rn(v.y, d.y), __fadd_rn(v.z, d.z), __fadd_rn(v.w, d.w));
            }
            return v;
        };
        // add_rmsnorm's second sum (of x + d) is contracted as fma(y, y, x * x) at NORM_MAXV 1 and as the other sums
        // at 2..16 (static SASS of norm.cu, session 32): the same choice here
        const bool yfirst = in.delta && maxv == 1;
        float sc = 0.f;
        if (in.w)
            sc = mvn_rms_scale(yfirst ? mvn_block_sum([&](int i) { return i < n4 ? mvn_sumsq4r(row(i)) : 0.f; }, maxv, red)
                                      : mvn_block_sum([&](int i) { return i < n4 ? mvn_sumsq4(row(i)) : 0.f; }, maxv, red),
                               K, in.eps);
        const bool wo = in.xo && blockIdx.x == 0;
        for (int i0 = 0; i0 < n4; i0 += 32 * MV_NWARPS) {  // every lane of a warp calls q8_store4
            const int i = i0 + (int)threadIdx.x;
            const bool active = i < n4;
            float4 v = z4;
            if (active) {
                v = row(i);
                if (wo) reinterpret_cast<float4*>(in.xo + (size_t)b * K)[i] = v;
                if (in.w) v = mvn_scale_mul(v, sc, wr[i]);
            }
            q8_store4(v, active, i, lq + (size_t)b * K, ls + (size_t)b * (K / 32));
        }
        __syncthreads();  // lq / ls complete before they are re-laid
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
    mvn_rows(pin, K, nb, lq, ls, reinterpret_cast<float*>(ls + (size_t)nb * (K / 32)));
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

ENTRY = '''extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_q8n@GLU@(const uint8_t* bulk, const uint8_t* meta, const float* xn, const float* nw, float eps, float* y,
       const float* res, int N, int K, int nb, int act, const float* delta, const float* wp, float eps_post,
       float* xo) {
    MvnIn in;
    in.x = xn; in.w = nw; in.eps = eps; in.delta = delta; in.wp = wp; in.eps_post = eps_post; in.xo = xo;
    mv_q8_body<MV_B, @GLUB@>(bulk, meta, nullptr, nullptr, y, res, N, K, nb, act, in);
}
'''

EDITS = [
    ('#include "qtypes.cuh"\n', '#include "qtypes.cuh"\n' + PROLOGUE),
    ("                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,\n"
     "                        float* y, const float* res, int N, int K, int nb, int act) {\n",
     "                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,\n"
     "                        float* y, const float* res, int N, int K, int nb, int act\n"
     "#if MV_NORM\n"
     "                        , const MvnIn& pin = MvnIn()\n"
     "#endif\n"
     "                        ) {\n"),
    ("#if MV_XSMEM\n    // Stage x in shared memory, tile-interleaved:", STAGE + "    // Stage x in shared memory, tile-interleaved:"),
    ("#if MV_XSMEM\n                    const size_t c =", "#if MV_XSMEM || MV_NORM\n                    const size_t c ="),
    ("    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);\n}\n#endif\n",
     "    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);\n}\n"
     "#if MV_NORM\n" + ENTRY.replace("@GLU@", "").replace("@GLUB@", "false")
     + ENTRY.replace("@GLU@", "_glu").replace("@GLUB@", "true") + "#endif\n#endif\n"),
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
                     ("return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;\n}\n",
                      "return __fmaf_rn(a.w, a.w, __fmaf_rn(a.z, a.z, __fmaf_rn(a.x, a.x, __fmul_rn(a.y, a.y))));\n}\n"
                      # add_rmsnorm's second sum (of x + d) at NORM_MAXV 1 is contracted the other way: fma(y, y, x * x)
                      "static __device__ __forceinline__ float mvn_sumsq4r(float4 a) {\n"
                      "    return __fmaf_rn(a.w, a.w, __fmaf_rn(a.z, a.z, __fmaf_rn(a.y, a.y, __fmul_rn(a.x, a.x))));\n}\n"),
                     ("float rms_scale(", "float mvn_rms_scale("), ("float4 scale_mul(", "float4 mvn_scale_mul(")):
        if h.count(old) != 1:
            raise SystemExit(f"norm.cu's helpers changed: {old.strip()!r} (update norm_helpers)")
        h = h.replace(old, new)
    return h


def edits() -> list[tuple[str, str]]:
    """EDITS with norm.cu's helpers in place (the build copy's, and landing.py's)."""
    return [(old, new.replace("@NORM_HELPERS@", norm_helpers())) for old, new in EDITS]


def generate() -> None:
    if make_variant(ROOT / "kernels" / "matvec.cu", BUILD, edits(), HEADER):
        raise SystemExit("matvec.cu's anchor moved: update the edits")


if __name__ == "__main__":
    generate()
