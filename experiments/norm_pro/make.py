#!/usr/bin/env python3
"""build/matvec.cu: kernels/matvec.cu with MV_NORM (issue 14 item 1: the RMSNorm before a matvec moved into its
prologue): entry points mv_q8n / mv_q8n_glu take the f32 rows x and the norm weight (null: quantize only, the down
projection's quantize_q8 moved in likewise). v3 (session 33; the variants in PROLOGUE's comment): every warp finds
the norm's scale itself, and mv_q8's unit loop makes each unit's q8 values from the f32 row where it would load
them — no launch between the residual and the matvec, no shared memory, no barrier, no traffic between blocks.

A non-null delta makes the prologue norm.cu's add_rmsnorm (Gemma-3's post-norms): the rows x + (w_post ?
rmsnorm(delta) * w_post : delta), normalized by w; block 0 writes those sums to xo (the residual's next buffer).

Exactness: the same bits as norm.cu's rmsnorm (add_rmsnorm) at NORM_THREADS = MV_NORM followed by mv_q8: the prologue
emulates that kernel's order — thread vt's partial over float4s vt, vt + MV_NORM, ... (sumsq4, the expression pinned
to the contraction NVRTC makes of it there: static SASS, session 32), each
32-thread group's xor tree, the groups summed in order from 0.f — a warp's lanes taking the virtual threads 32 at
a time; then norm.cu's rms_scale and scale_mul (explicit roundings) and q8.cuh's q8_store4 rule over each 32-value
block (d = amax / 127, q = rint(v / d), the integer sum: order-free). So the engine's tokens would not change, and kernel-check can compare the
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
// Variants (H200, research/2026-12-05-session33):
//   v1 (session 32) each block normalized and quantized the rows into shared memory, walking the row value by value
//      (4-9 dependent L2 round trips a block): tg128 with every fold -20 / -36 / -45 % (SmolLM2 / Gemma-3 / 1B).
//   v2 the same with the row in registers (one round trip, the norm weights before the PDL wait): -7 / -25 / -38 %;
//      alone -0.3..+0.3 us against the pair (1B down +4.5); in the engine its dynamic shared memory re-splits the
//      SMs' L1 / shared memory against the neighbours (MEMRA_SMEM_CARVEOUT=100: a folded down 2.8 -> 0.16 us).
//   v3 (this) no shared memory and no barrier: every warp reduces the norm's sum itself (norm.cu's virtual threads
//      32 at a time, each 32's xor tree across the lanes: block_sum's bits), and the unit loop makes each unit's q8
//      values from the f32 row just in time, where mv_q8 loads them (q8_store4's rule over the 32-block: order-free).
// MV_NORM_MODE: 0 the rows quantized as they are (q8.cu's quantize_q8), 1 rmsnorm, 2 add_rmsnorm, 3 add_rmsnorm with a
// post-norm; MV_NORM: the emulated NORM_THREADS; MV_NORM_V: float4s a virtual thread holds, norm.cu's NORM_MAXV loop
// cut to ceil(K / 4 / MV_NORM) (matvec.py's prologue_defines)
#if !defined(MV_NORM_MODE) || !defined(MV_NORM_V)
#error "MV_NORM needs MV_NORM_MODE and MV_NORM_V (matvec.py: prologue_defines)"
#endif
// norm.cu's block_sum of sumsq4 (R: sumsq4r) over float4s f(i), i < n4, at MV_NORM threads, by one warp: lane l
// takes threads l + 32 g (norm.cu's warp g), each one's partial over float4s vt + j MV_NORM in order from 0.f (past
// the row: + 0.f, as norm.cu's zeros), warp g's xor tree across the lanes, the warps in order from 0.f
template <bool R, class F>
MEMRA_DEVICE float mvn_warp_sum(F f, int n4) {
    const int lane = threadIdx.x & 31;
    float s = 0.f;
#pragma unroll
    for (int g = 0; g < MV_NORM / 32; ++g) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < MV_NORM_V; ++j) {
            const int i = lane + 32 * g + j * MV_NORM;
            const float4 a = i < n4 ? f(i) : make_float4(0.f, 0.f, 0.f, 0.f);
            ss += R ? mvn_sumsq4r(a) : mvn_sumsq4(a);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        s += ss;  // MV_NORM 32: 0.f + v, as block_sum
    }
    return s;
}
MEMRA_DEVICE float4 mvn_add4(float4 x, float4 d) {
    return make_float4(__fadd_rn(x.x, d.x), __fadd_rn(x.y, d.y), __fadd_rn(x.z, d.z), __fadd_rn(x.w, d.w));
}
// one batch row's prologue: the rows it reads and the scales its norms found
struct MvnRow {
    const float4* x;
    const float4* d;
    float sc, sp;
    // float4 i of the row the norm reads: x, or x + d (d: rmsnorm(delta) * w_post in mode 3), one __fadd_rn a value
    MEMRA_DEVICE float4 row(const MvnIn& in, int i) const {
#if MV_NORM_MODE >= 2
        float4 e = d[i];
#if MV_NORM_MODE == 3
        e = mvn_scale_mul(e, sp, reinterpret_cast<const float4*>(in.wp)[i]);
#endif
        return mvn_add4(x[i], e);
#else
        return x[i];
#endif
    }
    // float4 i of what is quantized: the row, normalized in modes 1..3
    MEMRA_DEVICE float4 val(const MvnIn& in, int i) const {
#if MV_NORM_MODE >= 1
        return mvn_scale_mul(row(in, i), sc, reinterpret_cast<const float4*>(in.w)[i]);
#else
        return x[i];
#endif
    }
};
// batch row b's operands and scales (every warp the same, bit for bit); block 0's first warp writes add_rmsnorm's
// sums x + d to xo
MEMRA_DEVICE MvnRow mvn_row(const MvnIn& in, int K, int b) {
    MvnRow r;
    r.x = reinterpret_cast<const float4*>(in.x + (size_t)b * K);
    r.d = reinterpret_cast<const float4*>(in.delta + (size_t)b * K);
    r.sc = r.sp = 1.f;
    const int n4 = K / 4;
#if MV_NORM_MODE == 3
    r.sp = mvn_rms_scale(mvn_warp_sum<false>([&](int i) { return r.d[i]; }, n4), K, in.eps_post);
#endif
#if MV_NORM_MODE >= 1
    // add_rmsnorm's second sum (of x + d) is contracted as fma(y, y, x * x) at NORM_MAXV 1 and as the other sums at
    // 2..16 (static SASS of norm.cu, session 32): the same choice here
    r.sc = mvn_rms_scale(mvn_warp_sum<MV_NORM_MODE >= 2 && MV_NORM_V == 1>([&](int i) { return r.row(in, i); }, n4),
                         K, in.eps);
#endif
#if MV_NORM_MODE >= 2
    if (in.xo && blockIdx.x == 0 && threadIdx.x < 32)
        for (int i = threadIdx.x; i < n4; i += 32) reinterpret_cast<float4*>(in.xo + (size_t)b * K)[i] = r.row(in, i);
#endif
    return r;
}
// whether a unit's groups g and g + 1 (g even) are the two halves of one 32-value block (goff(u, g) = 64 u + 16 g):
// every q8-path type but Q6_K, whose unit holds a quarter of each of four blocks
template <class TT> struct MvnPairs { static constexpr bool v = true; };
template <> struct MvnPairs<TQ6_K> { static constexpr bool v = false; };
// q8_store4's rule over the 32 values of block blk (elements 32 blk ..): q[] the 32 int8 packed 4 to an int as the
// q8 row's bytes, d = amax / 127, s the integer sum
MEMRA_DEVICE void mvn_q8_block(const MvnIn& in, const MvnRow& r, int blk, int (&q)[8], float& d, int& s) {
    float4 v[8];
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        v[k] = r.val(in, 8 * blk + k);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
    }
    d = amax / 127.0f;
    const bool z = amax == 0.0f;
    s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int q0 = z ? 0 : __float2int_rn(v[k].x / d), q1 = z ? 0 : __float2int_rn(v[k].y / d);
        const int q2 = z ? 0 : __float2int_rn(v[k].z / d), q3 = z ? 0 : __float2int_rn(v[k].w / d);
        s += q0 + q1 + q2 + q3;
        q[k] = (int)((uint32_t)(q0 & 0xff) | ((uint32_t)(q1 & 0xff) << 8) | ((uint32_t)(q2 & 0xff) << 16) |
                     ((uint32_t)(q3 & 0xff) << 24));
    }
}
#endif
'''

STAGE = r'''#if MV_NORM
    // the batch rows' norm scales, every warp its own (no shared memory, no barrier)
    MvnRow mr[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
        if (b < nb) mr[b] = mvn_row(pin, K, b);
#elif MV_XSMEM
'''

UNIT = r'''#if MV_NORM
                // unit u's q8 values and scales made here from the f32 row (mvn_q8_block), where mv_q8 loads them:
                // groups g, g + 1 halves of one 32-value block (MvnPairs), else each group its own block
#pragma unroll
                for (int g = 0; g < 4; g += MvnPairs<T>::v ? 2 : 1) {
                    const int e = T::goff(u, g, nu);
                    int qb[8], sb;
                    float db;
                    mvn_q8_block(pin, mr[b], e >> 5, qb, db, sb);
                    const bool hi = !MvnPairs<T>::v && (e & 16);
                    xv[g] = hi ? make_int4(qb[4], qb[5], qb[6], qb[7]) : make_int4(qb[0], qb[1], qb[2], qb[3]);
                    sv[g].d = db;
                    sv[g].s = sb;
                    if (MvnPairs<T>::v) {
                        xv[g + 1] = make_int4(qb[4], qb[5], qb[6], qb[7]);
                        sv[g + 1] = sv[g];
                    }
                }
#else
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
     "    MEMRA_PDL_WAIT();\n#if MV_PDL_TRIGGER\n    MEMRA_PDL_LAUNCH();\n#endif\n" + STAGE + "    // Stage x in shared memory,"),
    ("                Q8Scale sv[4];\n#pragma unroll\n                for (int g = 0; g < 4; ++g) {\n#if MV_XSMEM\n",
     "                Q8Scale sv[4];\n" + UNIT + "#pragma unroll\n                for (int g = 0; g < 4; ++g) {\n#if MV_XSMEM\n"),
    ("                    sv[g].d = __int_as_float(t.x); sv[g].s = t.y;\n                }\n",
     "                    sv[g].d = __int_as_float(t.x); sv[g].s = t.y;\n                }\n#endif\n"),
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
