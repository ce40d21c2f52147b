// deq_cvt.cuh — qtypes.cuh's T::deq (group g of a unit as 16 floats) without I2F, for gemm_f16_wg.cu's producer.
//
// Why: the producer warpgroup dequantizes one value per I2F (int8/uint8 -> f32, a conversion at 16 results a clock
// an SM) and packs two per F2FP (the same pipe): 1.5 conversions a value, 768 clocks a 128 x 64 stage against the
// 512 of its wgmma at WG_BN 128 (~2,048 dense f16 MACs a clock an SM): the stage waits on the dequant, as
// experiments/gemm_f16/wg/diag.py measured (Q6_K down at WG_BN 128: 226.8 us, 146.7 without the dequant = 1.55x, the
// model's 768 / 512 = 1.5x). Here an integer byte becomes a float by the exponent trick: byte u placed in the low
// mantissa bits of 2^23 (one PRMT) is the float 2^23 + u, and one FADD of -(2^23 + k) gives u - k, every step an
// integer below 2^24, so exact: the same float as (float)(u - k), hence the same bits downstream. Each type's
// arithmetic after the conversion (FMUL, FFMA with the min, the `+ 0.f` of i8x16 that turns -0 into +0) is written
// exactly as its T::deq writes it. 0.5 conversions a value are left (the F2FP packs): 256 clocks a stage.
//
// A probe-only header (experiments/gemm_f16/wg/cvt.py compiles gemm_f16_wg.cu with it, WG_CVT 1, against
// T::deq, WG_CVT 0); it lands as the kernel's own once a device run shows the same bits and the time.
#pragma once

// byte J of b (0..255) minus the integer bias - 2^23, as a float: exact (see above)
template <int J>
MEMRA_DEVICE float ubyte_f(uint32_t b, float bias) {
    return __int_as_float((int)__byte_perm(b, 0x4B000000u, 0x7540u + J)) - bias;
}
constexpr float CVT_2P23 = 8388608.0f;

// o[4 i + j] = d * (byte j of word i - k): Q4_0 (k 8), Q5_0 (k 16): T::deq's d * (float)((int)byte - k)
template <int K>
MEMRA_DEVICE void cvt_mul(const uint32_t (&b)[4], float d, float* o) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[4 * i + 0] = d * ubyte_f<0>(b[i], CVT_2P23 + K);
        o[4 * i + 1] = d * ubyte_f<1>(b[i], CVT_2P23 + K);
        o[4 * i + 2] = d * ubyte_f<2>(b[i], CVT_2P23 + K);
        o[4 * i + 3] = d * ubyte_f<3>(b[i], CVT_2P23 + K);
    }
}
// o = d * byte + m: Q4_1, Q5_1 (T::deq's d * (float)byte + m); cvt_fms: d * byte - m, Q4_K and Q5_K's, as written
MEMRA_DEVICE void cvt_fma(const uint32_t (&b)[4], float d, float m, float* o) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[4 * i + 0] = d * ubyte_f<0>(b[i], CVT_2P23) + m;
        o[4 * i + 1] = d * ubyte_f<1>(b[i], CVT_2P23) + m;
        o[4 * i + 2] = d * ubyte_f<2>(b[i], CVT_2P23) + m;
        o[4 * i + 3] = d * ubyte_f<3>(b[i], CVT_2P23) + m;
    }
}
MEMRA_DEVICE void cvt_fms(const uint32_t (&b)[4], float d, float m, float* o) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[4 * i + 0] = d * ubyte_f<0>(b[i], CVT_2P23) - m;
        o[4 * i + 1] = d * ubyte_f<1>(b[i], CVT_2P23) - m;
        o[4 * i + 2] = d * ubyte_f<2>(b[i], CVT_2P23) - m;
        o[4 * i + 3] = d * ubyte_f<3>(b[i], CVT_2P23) - m;
    }
}
// i8x16 (scale * (float)(int8_t)byte + mn) of bytes given as u = q + K (unsigned): the bias takes K back
template <int K>
MEMRA_DEVICE void cvt_i8(const uint32_t (&u)[4], float scale, float mn, float* o) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[4 * i + 0] = scale * ubyte_f<0>(u[i], CVT_2P23 + K) + mn;
        o[4 * i + 1] = scale * ubyte_f<1>(u[i], CVT_2P23 + K) + mn;
        o[4 * i + 2] = scale * ubyte_f<2>(u[i], CVT_2P23 + K) + mn;
        o[4 * i + 3] = scale * ubyte_f<3>(u[i], CVT_2P23 + K) + mn;
    }
}

template <class T> struct DeqCvt;

template <> struct DeqCvt<TQ4_0> {
    static MEMRA_DEVICE void deq(const TQ4_0::U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)((g & 1) ? hi4(word(v, i)) : lo4(word(v, i)));
        cvt_mul<8>(b, d, o);
    }
};
template <> struct DeqCvt<TQ4_1> {
    static MEMRA_DEVICE void deq(const TQ4_1::U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const uint32_t dm = (g >> 1) ? w.dm.y : w.dm.x;
        const float d = f16_to_f32((uint16_t)dm), m = f16_to_f32((uint16_t)(dm >> 16));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)((g & 1) ? hi4(word(v, i)) : lo4(word(v, i)));
        cvt_fma(b, d, m, o);
    }
};
template <> struct DeqCvt<TQ5_0> {
    static MEMRA_DEVICE void deq(const TQ5_0::U& w, int g, float* o) {
        const int k = g >> 1;
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * k)));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)TQ5_0::q5(word(w.q[k], i), w.h[k], i, g & 1);
        cvt_mul<16>(b, d, o);
    }
};
template <> struct DeqCvt<TQ5_1> {
    static MEMRA_DEVICE void deq(const TQ5_1::U& w, int g, float* o) {
        const int k = g >> 1;
        const uint32_t h = k ? w.mh.w : w.mh.y;
        const uint32_t dm = k ? w.mh.z : w.mh.x;
        const float d = f16_to_f32((uint16_t)dm), m = f16_to_f32((uint16_t)(dm >> 16));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)TQ5_0::q5(word(w.q[k], i), h, i, g & 1);
        cvt_fma(b, d, m, o);
    }
};
template <> struct DeqCvt<TQ8_0> {
    static MEMRA_DEVICE void deq(const TQ8_0::U& w, int g, float* o) {
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
        const uint4& v = w.q[g];
        const uint32_t u[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
        cvt_i8<128>(u, d, 0.f, o);
    }
};
template <> struct DeqCvt<TQ4_K> {
    static MEMRA_DEVICE void deq(const TQ4_K::U& w, int g, float* o) {
        int sc, mn;
        scale_min_k4(w.m, 2 * w.j + (g >> 1), sc, mn);
        const float d = f16_to_f32((uint16_t)w.m.x) * (float)sc;
        const float m = f16_to_f32((uint16_t)(w.m.x >> 16)) * (float)mn;
        const uint4& v = w.q[g & 1];
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (g >> 1) ? hi4(word(v, i)) : lo4(word(v, i));
        cvt_fms(b, d, m, o);
    }
};
template <> struct DeqCvt<TQ5_K> {
    static MEMRA_DEVICE void deq(const TQ5_K::U& w, int g, float* o) {
        int sc, mn;
        scale_min_k4(w.m, 2 * w.j + (g >> 1), sc, mn);
        const float d = f16_to_f32((uint16_t)w.m.x) * (float)sc;
        const float m = f16_to_f32((uint16_t)(w.m.x >> 16)) * (float)mn;
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)TQ5_K::q5(w, 4 * (g & 1) + i, g >> 1);
        cvt_fms(b, d, m, o);
    }
};
template <> struct DeqCvt<TQ6_K> {
    // T::deq: i8x16 of q6 = subb(lo | hb, 32) (signed q - 32) with scale d * sc and mn 0; here the unsigned
    // lo | hb (0..63) with the bias 32
    static MEMRA_DEVICE void deq(const TQ6_K::U& w, int g, float* o) {
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lq = word((g & 1) ? w.b : w.a, i), h = word(w.h, i);
            const uint32_t lo = (g >> 1) ? ((lq >> 4) & 0x0F0F0F0Fu) : (lq & 0x0F0F0F0Fu);
            u[i] = lo | (((h >> (2 * g)) & 0x03030303u) << 4);
        }
        cvt_i8<32>(u, w.d * (float)(int8_t)(w.sc >> (8 * g)), 0.f, o);
    }
};
template <> struct DeqCvt<TIQ4_XS> {
    // T::deq: i8x16 of the signed table values; here as unsigned (value + 128)
    static MEMRA_DEVICE void deq(const TIQ4_XS::U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const int sh = 4 * (g & 1);
        const uint32_t u[4] = {(uint32_t)TIQ4_XS::lut(v.x >> sh) ^ 0x80808080u,
                               (uint32_t)TIQ4_XS::lut(v.y >> sh) ^ 0x80808080u,
                               (uint32_t)TIQ4_XS::lut(v.z >> sh) ^ 0x80808080u,
                               (uint32_t)TIQ4_XS::lut(v.w >> sh) ^ 0x80808080u};
        cvt_i8<128>(u, TIQ4_XS::dl(w, 2 * w.j + (g >> 1)), 0.f, o);
    }
};
