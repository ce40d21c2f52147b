// experiments/gemm_wg/gemm_wg.cu — a warpgroup GEMM on wgmma (sm_90a) with kernels/gemm.cu's
// arithmetic, for many rows: prototype, not yet run on a device (experiments/gemm_wg/README.md,
// experiments/gemm_wg/check.py is its bit check against mv_q8 and its timing against gemm.cu).
//
// y[b, n] = sum_k W[n, k] x[b, k] for b < nb, W in Q4_0, Q4_K or Q8_0 planes, x as q8 activations;
// gemm_q8 / gemm_q8_glu with gemm.cu's arguments, epilogues (act(gate) * up, + res) and bits.
//
// A block is one warpgroup (128 threads) and a 64-row x 64-column tile (_glu: 32 outputs, tile
// rows 16 w .. 16 w + 7 the gate rows ob + 8 w + i and 16 w + 8 .. the same outputs' up rows, so
// a thread holds an output's gate and up values). Per 64-element unit of the slot walk:
//  1. the raw stage (cp.async, MVT_STAGES deep, as gemm.cu: weight bulk bytes, meta, activation
//     groups, activation scales) lands; the activations are copied straight into wgmma's K-major
//     core-matrix layout (8 rows x 16 bytes a core matrix, no swizzle: (row / 8) SBO + (k / 16)
//     LBO + (row % 8) 16 + k % 16 with SBO 256, LBO 128, one 2 KB tile per 32-element k-chunk);
//  2. a cooperative pass unpacks the 64 rows' weights into int8 tiles of the same layout (k in the
//     natural order within each 32-block, as the activations are) and writes each row's row
//     scalars (G<T>::rowscal, gemm.cu's) once; then fence.proxy.async (the pass's stores are
//     generic-proxy writes that wgmma reads through the async proxy) and a barrier;
//  3. two wgmma.mma_async m64n64k32 s32.s8.s8, one per k-chunk, with scale-d 0 (each 32-block's
//     integer sums apart: exact in any order, as mma.sync's are), committed and waited for;
//  4. each thread folds its 32 outputs (rows 16 w + gid, + 8; columns 8 i + 2 tig, + 1, i < 8:
//     wgmma's accumulator layout) into the slot partials with G<T>::accum, and the slot walk,
//     stack and merges are gemm.cu's (WK 1: 32 slots, levels 1.. in shared memory).
// So every float operation of a row is gemm.cu's, in its order: the bits are mv_q8's.
//
// Tunables (-D): MV_TYPE (2, 12 or 8), WG_STAGES (3), WG_LREG (1: stack levels in registers),
// WG_SWAP (0: LBO = the K-direction core-matrix offset, SBO = the M/N one; 1: swapped, should a
// device show the descriptor fields the other way round), MEMRA_CANARY=1 drops unit 1.
// Launch: grid (ceil(N / OBM), ceil(nb / 64)), OBM 64 (gemm_q8) or 32 (_glu), block 128, dynamic
// shared memory WG_SMEM bytes (below; check.py computes the same and the kernel asserts it when
// given WG_EXPECT_SMEM).
// (The cp.async wrappers, SLd, the slot walk's merge and the epilogue are gemm.cu's, copied so
// the prototype stands alone: if it lands, they move to a header both include.)
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "mma_frag.cuh"

#if MV_TYPE != 2 && MV_TYPE != 12 && MV_TYPE != 8
#error "gemm_wg prototype: Q4_0 (2), Q4_K (12) or Q8_0 (8)"
#endif
#ifndef WG_STAGES
#define WG_STAGES 3
#endif
#ifndef WG_LREG
#define WG_LREG 1
#endif
#ifndef WG_SWAP
#define WG_SWAP 0
#endif
#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif

constexpr int NTHR = 128, BM = 64, BN = 64, NO = 32;     // a thread's outputs: 8 n8 tiles x 4
constexpr int LV = 5, NLEAF = 32;                          // WK 1: the whole butterfly
constexpr int LSM = LV > WG_LREG ? LV - WG_LREG : 0;
constexpr int SSB = 8 * GT::SB;
// stage: raw weights, meta, B tile (2 k-chunks x 2 KB), scales
constexpr int OFF_M = BM * GT::WBS;
constexpr int OFF_B = (OFF_M + BM * GT::MWS + 127) / 128 * 128;
constexpr int OFF_S = OFF_B + 2 * 2048;
constexpr int STAGE = (OFF_S + BN * SSB + 127) / 128 * 128;
// after the stages: the unpacked A tile (2 k-chunks x 2 KB), the rows' scalars, the stack levels
constexpr int RS_B = (int)((sizeof(typename GT::R) + 15) / 16 * 16);
constexpr int OFF_A = WG_STAGES * STAGE;
constexpr int OFF_R = OFF_A + 2 * 2048;
constexpr int OFF_L = OFF_R + BM * RS_B;
constexpr int WG_SMEM = OFF_L + LSM * NO * NTHR * 4;
#ifdef WG_EXPECT_SMEM
static_assert(WG_SMEM == WG_EXPECT_SMEM, "gemm_wg: the launcher's shared-memory size differs");
#endif
static_assert(!K16, "gemm_wg: no Q6_K (its 16-element groups need k16 products)");
static_assert(GT::NK == 2, "two k-chunks a unit");

MEMRA_DEVICE uint32_t smem_u32(const void* p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
MEMRA_DEVICE void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
template <int N>
MEMRA_DEVICE void cpn(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(dst), "l"(src), "n"(N) : "memory");
}
MEMRA_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
struct SLd {
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};

// wgmma: a shared-memory matrix descriptor (no swizzle): start address, leading- and
// stride-dimension byte offsets, each >> 4
MEMRA_DEVICE uint64_t wg_desc(uint32_t addr) {
    constexpr uint32_t LBO = WG_SWAP ? 256 : 128, SBO = WG_SWAP ? 128 : 256;
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(LBO >> 4) << 16) | ((uint64_t)(SBO >> 4) << 32);
}
MEMRA_DEVICE void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
MEMRA_DEVICE void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
MEMRA_DEVICE void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
MEMRA_DEVICE void pin_acc(int (&d)[32]) {   // keep the compiler from moving accumulator reads across the wait
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+r"(d[i]) :: "memory");
}
// D (64 x 64 s32) = A (64 x 32 s8, K-major) . B (64 x 32 s8, K-major)^T, no accumulate
MEMRA_DEVICE void wgmma_k32(int (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(da), "l"(db), "r"(0));
}

// byte offset of (row or column r, k) in a k-chunk's core-matrix tile
MEMRA_DEVICE int core_off(int r, int k) { return (r >> 3) * 256 + (k >> 4) * 128 + (r & 7) * 16 + (k & 15); }

// the weight row behind tile row r (clamped: computed, never stored)
template <bool GLU>
MEMRA_DEVICE int wrow_of(int r, int ob, int N) {
    if (!GLU) return min(ob + r, N - 1);
    const int w = r >> 4, i = r & 15;
    const int o = min(ob + 8 * w + (i & 7), N - 1);
    return i < 8 ? o : o + N;
}

template <bool GLU>
MEMRA_DEVICE void produce(uint32_t st, int u, const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                          const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                          int N, int K, int nb, int ob, int cb, size_t brs, size_t mrs) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i0 = 0; i0 < BM * GT::NCH; i0 += NTHR) {   // weight bulk: BM rows x NCH chunks
        const int i = i0 + tid;
        if (BM * GT::NCH % NTHR == 0 || i < BM * GT::NCH) {
            const int r = i / GT::NCH, c = i % GT::NCH;
            cp16(st + r * GT::WBS + 16 * c, bulk + (size_t)wrow_of<GLU>(r, ob, N) * brs + GT::chunk(u, c));
        }
    }
#pragma unroll
    for (int i0 = 0; i0 < BN * 4; i0 += NTHR) {         // activations: BN columns x 4 groups, into the B tiles
        const int i = i0 + tid;
        const int col = i >> 2, g = i & 3;               // group g: k-chunk g / 2, k 16 (g % 2)
        const size_t b = (size_t)min(cb + col, nb - 1);
        cp16(st + OFF_B + (g >> 1) * 2048 + core_off(col, 16 * (g & 1)), xq + b * K + T::goff(u, g, 0));
    }
#pragma unroll
    for (int i0 = 0; i0 < BN * GT::SB / 2; i0 += NTHR) {   // activation scales
        const int i = i0 + tid;
        if (BN * GT::SB / 2 % NTHR == 0 || i < BN * GT::SB / 2) {
            const int col = i / (GT::SB / 2), c = i % (GT::SB / 2);
            const size_t b = (size_t)min(cb + col, nb - 1);
            cp16(st + OFF_S + col * SSB + 16 * c, xs + b * (K / 32) + T::goff(u, 0, 0) / 32 + 2 * c);
        }
    }
    constexpr int NP = GT::MW / GT::MCP;                  // meta window (gemm.cu's)
#pragma unroll
    for (int i0 = 0; i0 < BM * NP; i0 += NTHR) {
        const int i = i0 + tid;
        if (BM * NP % NTHR == 0 || i < BM * NP) {
            const int r = i / NP, c = i % NP;
            const size_t abs = (size_t)wrow_of<GLU>(r, ob, N) * mrs + T::moff(u);
            const size_t start = abs & ~(size_t)(GT::MCP - 1);
            cpn<GT::MCP>(st + OFF_M + r * GT::MWS + GT::MCP * c, meta + start + GT::MCP * c);
        }
    }
}

// The cooperative pass: thread t unpacks k-chunk t % 2 of tile row t / 2 into the A tile (32
// int8 in the natural order of the chunk's 32-block) and, for t % 2 == 0, writes the row's scalars.
MEMRA_DEVICE uint32_t lo4w(uint32_t v) { return v & 0x0F0F0F0Fu; }
MEMRA_DEVICE uint32_t hi4w(uint32_t v) { return (v >> 4) & 0x0F0F0F0Fu; }
MEMRA_DEVICE void unpack(uint8_t* smem, const uint8_t* stp, int u) {
    const int t = threadIdx.x, r = t >> 1, c = t & 1;
    const uint8_t* raw = stp + r * GT::WBS;
    uint4 v0, v1;   // the chunk's 32 int8, k 0..15 and 16..31
#if MV_TYPE == 12   // Q4_K: the unit's 32 bytes; k-chunk 0 = low nibbles (sub-block 2j), 1 = high
    const uint4 a = *reinterpret_cast<const uint4*>(raw), b = *reinterpret_cast<const uint4*>(raw + 16);
    if (c == 0) { v0 = make_uint4(lo4w(a.x), lo4w(a.y), lo4w(a.z), lo4w(a.w)); v1 = make_uint4(lo4w(b.x), lo4w(b.y), lo4w(b.z), lo4w(b.w)); }
    else        { v0 = make_uint4(hi4w(a.x), hi4w(a.y), hi4w(a.z), hi4w(a.w)); v1 = make_uint4(hi4w(b.x), hi4w(b.y), hi4w(b.z), hi4w(b.w)); }
#elif MV_TYPE == 2  // Q4_0: block c's 16 bytes; elements 0..15 low nibbles, 16..31 high (raw 0..15:
                    // accum_r subtracts 8 s, as for mma.sync's fragments)
    const uint4 a = *reinterpret_cast<const uint4*>(raw + 16 * c);
    v0 = make_uint4(lo4w(a.x), lo4w(a.y), lo4w(a.z), lo4w(a.w));
    v1 = make_uint4(hi4w(a.x), hi4w(a.y), hi4w(a.z), hi4w(a.w));
#else               // Q8_0: block c's 32 int8
    v0 = *reinterpret_cast<const uint4*>(raw + 32 * c);
    v1 = *reinterpret_cast<const uint4*>(raw + 32 * c + 16);
#endif
    uint8_t* at = smem + OFF_A + c * 2048;
    *reinterpret_cast<uint4*>(at + core_off(r, 0)) = v0;
    *reinterpret_cast<uint4*>(at + core_off(r, 16)) = v1;
    if (c == 0) {
        typename T::U w;
        T::template load_meta<SLd>(w, stp + OFF_M + r * GT::MWS, u);
        const typename GT::R q = GT::rowscal(w);
        *reinterpret_cast<typename GT::R*>(smem + OFF_R + r * RS_B) = q;
    }
}

template <bool GLU>
MEMRA_DEVICE void body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                       const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                       float* y, const float* res, int N, int K, int nb, int act) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    constexpr int OBM = GLU ? BM / 2 : BM;
    const int ob = blockIdx.x * OBM, cb = blockIdx.y * BN;
    const int nu = K / 64;
    const size_t brs = (size_t)(K / T::BLK) * T::BULK, mrs = (size_t)(K / T::BLK) * T::META;
    const uint32_t sbase = smem_u32(smem);

    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    float P[NO], Lr[WG_LREG > 0 ? WG_LREG : 1][NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
        P[o] = 0.f;
#pragma unroll
        for (int l = 0; l < (WG_LREG > 0 ? WG_LREG : 1); ++l) Lr[l][o] = 0.f;
    }
    float* Ls = reinterpret_cast<float*>(smem + OFF_L);
    auto Lget = [&](int l, int o) -> float { return l < WG_LREG ? Lr[l][o] : Ls[((l - WG_LREG) * NO + o) * NTHR + tid]; };
    auto Lset = [&](int l, int o, float v) {
        if (l < WG_LREG) Lr[l][o] = v; else Ls[((l - WG_LREG) * NO + o) * NTHR + tid] = v;
    };
    auto slot = [](int j) { return (int)(__brev((unsigned)j) >> 27); };
    auto merge = [&](int j) {   // gemm.cu's binary counter over the 32 slots
        const int tz = __ffs(~j) - 1;
        if (tz >= LV) {
#pragma unroll
            for (int o = 0; o < NO; ++o) {
                float v = P[o];
#pragma unroll
                for (int l = 0; l < LV; ++l) v = __fadd_rn(Lget(l, o), v);
                P[o] = v;
            }
            return;
        }
        switch (tz) {
#define WG_MERGE(TZ)                                                                       \
        _Pragma("unroll") for (int o = 0; o < NO; ++o) {                                     \
            float v = P[o];                                                                   \
            _Pragma("unroll") for (int l = 0; l < TZ; ++l) v = __fadd_rn(Lget(l, o), v);      \
            Lset(TZ, o, v);                                                                   \
            P[o] = 0.f;                                                                       \
        }
        case 0: WG_MERGE(0); break;
        case 1: WG_MERGE(1); break;
        case 2: WG_MERGE(2); break;
        case 3: WG_MERGE(3); break;
        default: WG_MERGE(4); break;
#undef WG_MERGE
        }
    };

    // producer (pj, pu) and consumer (cj, cu) walks, leading empty slots merged as zeros
    int pj = 0, pu = 0;
    while (pu >= nu && pj < NLEAF) { ++pj; pu = pj < NLEAF ? slot(pj) : 0; }
    int pst = 0;
    auto produce_step = [&]() {
        if (pj < NLEAF) {
            produce<GLU>(sbase + pst * STAGE, pu, bulk, meta, xq, xs, N, K, nb, ob, cb, brs, mrs);
            pu += 32;
            while (pu >= nu && pj < NLEAF) { ++pj; pu = pj < NLEAF ? slot(pj) : 0; }
        }
        pst = pst + 1 == WG_STAGES ? 0 : pst + 1;
    };
    const int nsteps = nu;
#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s) {
        if (s < nsteps) produce_step();
        cp_commit();
    }
    int cj = 0, cu = 0;
    while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot(cj) : 0; }
    int cst = 0;
    const uint64_t da0 = wg_desc(sbase + OFF_A), da1 = wg_desc(sbase + OFF_A + 2048);
    int d0[32], d1[32];   // wgmma's accumulators (scale-d 0: their old values are never read)
#pragma unroll
    for (int i = 0; i < 32; ++i) d0[i] = d1[i] = 0;
    for (int s = 0; s < nsteps; ++s) {
        cp_wait<WG_STAGES - 2>();
        __syncthreads();   // stage s landed for all; the previous unit's A tile and wgmma reads are done
        if (s + WG_STAGES - 1 < nsteps) produce_step();
        cp_commit();
        const int u = cu;
        const uint32_t st = sbase + cst * STAGE;
        const uint8_t* stp = smem + cst * STAGE;
        cst = cst + 1 == WG_STAGES ? 0 : cst + 1;
        unpack(smem, stp, u);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        pin_acc(d0); pin_acc(d1);
        wg_fence();
        wgmma_k32(d0, da0, wg_desc(st + OFF_B));
        wgmma_k32(d1, da1, wg_desc(st + OFF_B + 2048));
        wg_commit();
        wg_wait0();
        pin_acc(d0); pin_acc(d1);
        if (!(MEMRA_CANARY == 1 && u == 1)) {
            const int r0 = 16 * warp + gid;
            const typename GT::R rq[2] = {*reinterpret_cast<const typename GT::R*>(smem + OFF_R + r0 * RS_B),
                                          *reinterpret_cast<const typename GT::R*>(smem + OFF_R + (r0 + 8) * RS_B)};
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
                Q8Scale sv[2][4];
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {   // gemm.cu's scale words of columns 8 ni + 2 tig + cc
                    const uint4 e01 = *reinterpret_cast<const uint4*>(stp + OFF_S + (8 * ni + 2 * tig + cc) * SSB);
                    sv[cc][0].d = sv[cc][1].d = __uint_as_float(e01.x);
                    sv[cc][0].s = sv[cc][1].s = (int)e01.y;
                    sv[cc][2].d = sv[cc][3].d = __uint_as_float(e01.z);
                    sv[cc][2].s = sv[cc][3].s = (int)e01.w;
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int o = 4 * ni + e;
                    const int ints[2] = {d0[o], d1[o]};
                    P[o] = GT::accum(P[o], rq[e >> 1], ints, sv[e & 1]);
                }
            }
        }
        cu += 32;
        while (cu >= nu && cj < NLEAF) { merge(cj); ++cj; cu = cj < NLEAF ? slot(cj) : 0; }
    }
    cp_wait<0>();

    // epilogue: finish()'s operations (rows 16 w + gid + 8 (e >> 1), columns 8 ni + 2 tig + (e & 1))
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
        for (int e = 0; e < (GLU ? 2 : 4); ++e) {
            const int row = GLU ? ob + 8 * warp + gid : ob + 16 * warp + gid + 8 * (e >> 1);
            const int col = cb + 8 * ni + 2 * tig + (e & 1);
            if (row >= N || col >= nb) continue;
            const int o = 4 * ni + e;
            float v = P[o];
            if (GLU) {
                const float gte = P[o], up = P[o + 2];   // C rows gid (gate), gid + 8 (up)
                v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
            }
            const size_t yo = (size_t)col * N + row;
            if (res) v = __fadd_rn(v, res[yo]);
            y[yo] = v;
        }
}

extern "C" __global__ void __launch_bounds__(NTHR, 1)
gemm_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
        const float* res, int N, int K, int nb, int act) {
    body<false>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
extern "C" __global__ void __launch_bounds__(NTHR, 1)
gemm_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
            const float* res, int N, int K, int nb, int act) {
    body<true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
