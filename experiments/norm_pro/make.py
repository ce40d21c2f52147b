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
// v2 (session 33): the row in registers. v1 read the row value by value in loops over the virtual threads (a sum,
// then the scaled values again, then add_rmsnorm's delta again): 4-9 dependent L2 round trips a block, and the fold
// lost 1.3-10.6 us a launch in the engine (research/2026-12-05-session33). Now every value a thread holds is loaded
// at once (one round trip; the norm weights before the PDL wait), the sums and the q8 rule run from registers.
// Measured (H200, session 33): alone -0.3..+0.3 us against the pair (1B down +4.5); in the engine the norms' loss
// fell to 0.56 / 3.8 / 5.3 us a launch (SmolLM2 / Gemma-3 / 1B shapes), the down's did not move: the dynamic shared
// memory re-splits the SMs' L1 / shared memory against the neighbours (MEMRA_SMEM_CARVEOUT=100: 2.8 -> 0.16 us).
// MV_NORM_MODE: 0 the rows quantized as they are (q8.cu's quantize_q8; MV_NORM = the block's threads, the row in
// chunks of MV_NORM_V float4s a thread), 1 rmsnorm, 2 add_rmsnorm, 3 add_rmsnorm with a post-norm; MV_NORM_V:
// float4s a virtual thread holds, norm.cu's NORM_MAXV loop cut to ceil(K / 4 / MV_NORM) (matvec.py's prologue_defines)
#if !defined(MV_NORM_MODE) || !defined(MV_NORM_V)
#error "MV_NORM needs MV_NORM_MODE and MV_NORM_V (matvec.py: prologue_defines)"
#endif
constexpr int MVN_BT = 32 * MV_NWARPS, MVN_VT = (MV_NORM + MVN_BT - 1) / MVN_BT, MVN_V = MV_NORM_V;
// virtual thread vt = threadIdx.x + v MVN_BT holds float4s vt + j MV_NORM (norm.cu's thread vt's), + c0 (mode 0's chunk)
MEMRA_DEVICE bool mvn_live(int v) { return (int)threadIdx.x + v * MVN_BT < MV_NORM; }
MEMRA_DEVICE int mvn_at(int v, int j) { return (int)threadIdx.x + v * MVN_BT + j * MV_NORM; }
struct MvnW {
    float4 w[MVN_VT][MVN_V];
    float4 wp[MVN_VT][MVN_V];
};
// the norm weights this thread's values take (model constants: loaded before the PDL wait)
MEMRA_DEVICE void mvn_weights(const MvnIn& in, int K, MvnW& pw) {
#if MV_NORM_MODE >= 1
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int v = 0; v < MVN_VT; ++v)
#pragma unroll
        for (int j = 0; j < MVN_V; ++j) {
            const int i = mvn_at(v, j);
            const bool on = mvn_live(v) && i < K / 4;
            pw.w[v][j] = on ? reinterpret_cast<const float4*>(in.w)[i] : z4;
            if (MV_NORM_MODE == 3) pw.wp[v][j] = on ? reinterpret_cast<const float4*>(in.wp)[i] : z4;
        }
#endif
}
// norm.cu's block_sum of sumsq4 (R: sumsq4r) of the values: virtual thread vt's partial in order from 0.f (values
// past the row are zeros: + 0.f, as norm.cu's), each 32 virtual threads' xor tree, then the groups in order from 0.f;
// red: MV_NORM / 32 floats
template <bool R>
MEMRA_DEVICE float mvn_sum(const float4 (&a)[MVN_VT][MVN_V], float* red) {
    constexpr int NW = MV_NORM / 32;
#pragma unroll
    for (int v = 0; v < MVN_VT; ++v) {
        if (!mvn_live(v)) break;  // warp-uniform: MVN_BT and MV_NORM are multiples of 32
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < MVN_V; ++j) ss += R ? mvn_sumsq4r(a[v][j]) : mvn_sumsq4(a[v][j]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((threadIdx.x & 31) == 0) red[((int)threadIdx.x + v * MVN_BT) >> 5] = ss;
    }
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NW; i++) s += red[i];  // NW == 1: 0.f + v, as block_sum
    __syncthreads();  // red is the next sum's
    return s;
}
// rows b < nb: norm.cu's rmsnorm (or add_rmsnorm) at NORM_THREADS = MV_NORM and its q8 twin (mode 0: quantize_q8),
// into lq / ls (linear, shared memory)
MEMRA_DEVICE void mvn_rows(const MvnIn& in, const MvnW& pw, int K, int nb, int8_t* lq, Q8Scale* ls, float* red) {
    const int n4 = K / 4;
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int b = 0; b < nb; ++b) {
        const float4* xr = reinterpret_cast<const float4*>(in.x + (size_t)b * K);
        // mode 0: chunks of MVN_BT x MVN_V float4s; a norm's row is one chunk (MV_NORM x MVN_V >= n4)
        for (int c0 = 0; c0 < n4; c0 += MV_NORM * MVN_V) {
            float4 a[MVN_VT][MVN_V];
#if MV_NORM_MODE >= 2
            const float4* dr = reinterpret_cast<const float4*>(in.delta + (size_t)b * K);
            float4 d[MVN_VT][MVN_V];
#endif
            // one round trip: every value (and delta) this thread holds, the loads issued together
#pragma unroll
            for (int v = 0; v < MVN_VT; ++v)
#pragma unroll
                for (int j = 0; j < MVN_V; ++j) {
                    const int i = c0 + mvn_at(v, j);
                    const bool on = mvn_live(v) && i < n4;
                    a[v][j] = on ? xr[i] : z4;
#if MV_NORM_MODE >= 2
                    d[v][j] = on ? dr[i] : z4;
#endif
                }
#if MV_NORM_MODE == 3
            const float sp = mvn_rms_scale(mvn_sum<false>(d, red), K, in.eps_post);
#endif
#if MV_NORM_MODE >= 2
            // the row the norm reads: x + d (d: rmsnorm(delta) * w_post in mode 3), one __fadd_rn a value as norm.cu's
            const bool wo = in.xo && blockIdx.x == 0;
#pragma unroll
            for (int v = 0; v < MVN_VT; ++v)
#pragma unroll
                for (int j = 0; j < MVN_V; ++j) {
                    float4 e = d[v][j];
#if MV_NORM_MODE == 3
                    e = mvn_scale_mul(e, sp, pw.wp[v][j]);
#endif
                    const float4 x = a[v][j];
                    a[v][j] = make_float4(__fadd_rn(x.x, e.x), __fadd_rn(x.y, e.y), __fadd_rn(x.z, e.z),
                                          __fadd_rn(x.w, e.w));
                    const int i = mvn_at(v, j);
                    if (wo && mvn_live(v) && i < n4) reinterpret_cast<float4*>(in.xo + (size_t)b * K)[i] = a[v][j];
                }
#endif
#if MV_NORM_MODE >= 1
            // add_rmsnorm's second sum (of x + d) is contracted as fma(y, y, x * x) at NORM_MAXV 1 and as the other
            // sums at 2..16 (static SASS of norm.cu, session 32): the same choice here
            const float sc = mvn_rms_scale(mvn_sum<MV_NORM_MODE >= 2 && MVN_V == 1>(a, red), K, in.eps);
#pragma unroll
            for (int v = 0; v < MVN_VT; ++v)
#pragma unroll
                for (int j = 0; j < MVN_V; ++j) a[v][j] = mvn_scale_mul(a[v][j], sc, pw.w[v][j]);
#endif
            // the q8 rule from registers: a warp's 32 lanes hold 32 consecutive float4s of each (v, j)
#pragma unroll
            for (int v = 0; v < MVN_VT; ++v) {
                if (!mvn_live(v)) break;
#pragma unroll
                for (int j = 0; j < MVN_V; ++j) {
                    const int i = c0 + mvn_at(v, j);
                    if (i - (int)(threadIdx.x & 31) >= n4) break;  // warp-uniform: the warp's first float4
                    q8_store4(a[v][j], i < n4, i, lq + (size_t)b * K, ls + (size_t)b * (K / 32));
                }
            }
        }
    }
    __syncthreads();  // lq / ls complete before they are re-laid
}
#endif
'''

STAGE = r'''#if MV_NORM
    // the rows normalized and quantized here (mvn_rows: the norm weights were loaded before the PDL wait), then
    // tile-interleaved as MV_XSMEM stages them
    extern __shared__ __align__(16) uint8_t mv_smem[];
    const int ntile = (nu + 31) >> 5;
    int8_t* sxq = reinterpret_cast<int8_t*>(mv_smem);                      // nb x ntile x 2048 B
    int2* sxs = reinterpret_cast<int2*>(mv_smem + (size_t)nb * ntile * 2048); // nb x ntile x 128 x 8 B
    int8_t* lq = reinterpret_cast<int8_t*>(mv_smem + (size_t)nb * ntile * 3072);
    Q8Scale* ls = reinterpret_cast<Q8Scale*>(lq + (size_t)nb * K);
    mvn_rows(pin, pw, K, nb, lq, ls, reinterpret_cast<float*>(ls + (size_t)nb * (K / 32)));
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
    ("    MEMRA_PDL_WAIT();\n#if MV_PDL_TRIGGER\n    MEMRA_PDL_LAUNCH();\n#endif\n#if MV_XSMEM\n    // Stage x in shared memory,",
     "#if MV_NORM\n    MvnW pw;\n    mvn_weights(pin, K, pw);\n#endif\n"
     "    MEMRA_PDL_WAIT();\n#if MV_PDL_TRIGGER\n    MEMRA_PDL_LAUNCH();\n#endif\n" + STAGE + "    // Stage x in shared memory,"),
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
