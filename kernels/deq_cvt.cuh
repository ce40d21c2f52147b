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
// gemm_f16_wg.cu's producer calls DeqCvt<T>::deq where it called T::deq (experiments/gemm_f16/wg/cvt.py
// measured both; kernel-check holds every gemm_f16 launch to gemm_f16.cu's bits).
#pragma once

// byte j of b (0..255) minus the integer bias - 2^23, as a float: exact (see above); j is a constant once unrolled
MEMRA_DEVICE float ubyte_f(uint32_t b, int j, float bias) {
    return __int_as_float((int)__byte_perm(b, 0x4B000000u, 0x7540u + j)) - bias;
}
constexpr float CVT_2P23 = 8388608.0f;

// o[4 i + j] = f((float)(byte j of word i - K)): f is the type's arithmetic after T::deq's conversion, written as
// T::deq writes it (d * x, d * x + m, d * x - m, i8x16's scale * x + 0.f), so it contracts the same way
template <int K, class F>
MEMRA_DEVICE void cvt16(const uint32_t (&b)[4], float* o, F f) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) o[4 * i + j] = f(ubyte_f(b[i], j, CVT_2P23 + K));
}
// d sc and dmin m of sub-block 2 j + g / 2 of a Q4_K / Q5_K unit (their T::deq's)
MEMRA_DEVICE void k4_dm(const uint4& m4, int j, int g, float& d, float& m) {
    int sc, mn;
    scale_min_k4(m4, 2 * j + (g >> 1), sc, mn);
    d = f16_to_f32((uint16_t)m4.x) * (float)sc;
    m = f16_to_f32((uint16_t)(m4.x >> 16)) * (float)mn;
}

template <class T> struct DeqCvt;

template <> struct DeqCvt<TQ4_0> {
    static MEMRA_DEVICE void deq(const TQ4_0::U& w, int g, float* o) {
        const uint4& v = w.q[g >> 1];
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)((g & 1) ? hi4(word(v, i)) : lo4(word(v, i)));
        cvt16<8>(b, o, [d](float x) { return d * x; });
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
        cvt16<0>(b, o, [d, m](float x) { return d * x + m; });
    }
};
template <> struct DeqCvt<TQ5_0> {
    static MEMRA_DEVICE void deq(const TQ5_0::U& w, int g, float* o) {
        const int k = g >> 1;
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * k)));
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)TQ5_0::q5(word(w.q[k], i), w.h[k], i, g & 1);
        cvt16<16>(b, o, [d](float x) { return d * x; });
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
        cvt16<0>(b, o, [d, m](float x) { return d * x + m; });
    }
};
template <> struct DeqCvt<TQ8_0> {
    static MEMRA_DEVICE void deq(const TQ8_0::U& w, int g, float* o) {
        const float d = f16_to_f32((uint16_t)(w.d >> (16 * (g >> 1))));
        const uint4& v = w.q[g];
        const uint32_t u[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
        cvt16<128>(u, o, [d](float x) { return d * x + 0.f; });
    }
};
template <> struct DeqCvt<TQ4_K> {
    static MEMRA_DEVICE void deq(const TQ4_K::U& w, int g, float* o) {
        float d, m;
        k4_dm(w.m, w.j, g, d, m);
        const uint4& v = w.q[g & 1];
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (g >> 1) ? hi4(word(v, i)) : lo4(word(v, i));
        cvt16<0>(b, o, [d, m](float x) { return d * x - m; });
    }
};
template <> struct DeqCvt<TQ5_K> {
    static MEMRA_DEVICE void deq(const TQ5_K::U& w, int g, float* o) {
        float d, m;
        k4_dm(w.m, w.j, g, d, m);
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = (uint32_t)TQ5_K::q5(w, 4 * (g & 1) + i, g >> 1);
        cvt16<0>(b, o, [d, m](float x) { return d * x - m; });
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
        const float scale = w.d * (float)(int8_t)(w.sc >> (8 * g));
        cvt16<32>(u, o, [scale](float x) { return scale * x + 0.f; });
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
        const float scale = TIQ4_XS::dl(w, 2 * w.j + (g >> 1));
        cvt16<128>(u, o, [scale](float x) { return scale * x + 0.f; });
    }
};
