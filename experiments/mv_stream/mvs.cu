// mvs.cu — experiment (experiments/mv_stream/README.md): kernels/matvec.cu's mv_q8 / mv_q8_glu at one activation
// row, with the weights streamed into shared memory by bulk copies instead of loaded by the lanes.
//
// Why: ncu on the H100 (session 53, research/2026-12-07-session53/prof/) has mv_q8_glu on the 8B gate+up at 75 % of
// DRAM throughput and the Q6_K down at 69 %, both with ~half their warp stalls on long scoreboard (the lanes' own
// weight loads): a warp has one unit a lane in flight, ~2 units a lane in its whole life (K 4096), and the grid
// runs 3.9 waves of short warps. Here a block is resident for the whole launch (grid <= SMs x MVS_CPS) and one
// thread keeps MVS_STAGES row groups of weight bytes in flight by cp.async.bulk, independent of the registers.
//
// Arithmetic: the same as mv_q8's (MV_KSPLIT 1) operation for operation, so the same bits: lane l folds units l,
// l + 32, ... of each weight row in increasing u (T::load from the staged bytes, T::idots, T::accum: qtypes.cuh's
// code), then warp_sum's butterfly, then __fmul_rn(act(gate), up) and __fadd_rn(v, res). Only where the bytes come
// from changes: qtypes_s.cuh is qtypes.cuh with its weight loaders' __ldg made plain loads (mvs.py generates it),
// which compile to shared-memory loads here.
//
// Work. Row group g (N / NRO of them, NRO = MVS_WARPS x MVS_ROWS output rows) is weight rows [g NRO, (g + 1) NRO)
// (glu: and their up rows N further); block b takes groups b, b + gridDim.x, ... The producer (warp MVS_WARPS, one
// lane) copies a group's bulk rows and meta rows (contiguous in the planes layout: one copy each, two for glu) into
// stage i % MVS_STAGES, completing on full[s]; consumer warp w computes output rows w MVS_ROWS .. + MVS_ROWS - 1 of
// the group from the stage, then its lane 0 arrives on empty[s], which the producer waits for before refilling.
// The producer never waits for PDL (weights are never written by kernels); consumers do before reading x.
//
// Tunables: MV_TYPE (required), MVS_WARPS consumer warps (4), MVS_ROWS output rows a warp (1), MVS_STAGES (4).
// Launch: grid min(N / NRO, SMs x CPS), block 32 (MVS_WARPS + 1), dynamic shared memory MVS_STAGES x SB + 16
// MVS_STAGES, SB = NRW (K / BLK) (BULK + META) rounded up to 128 (NRW = NRO, 2 NRO for glu). Host contract: N a
// multiple of NRO, (K / BLK) BULK and (K / BLK) META multiples of 16 (bulk copies move 16-byte multiples).
// Measured (session 53, H100, research/2026-12-07-session53/mv_stream/): the same bits as mv_q8 on every shape and
// slower on every shape (8B gate+up 28.3 µs at (4, 1, 2, 4 blocks an SM) against mv_q8's 24.6; 25.8 with
// mv_k4bf's branch-free scales): the consumer warps' instruction stream, not the loads, bounds it (README.md).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes_s.cuh"

#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"   // T, the MV_TYPE's qtypes struct (gemm.cu's and mv_f16.cu's selection)
#ifndef MVS_WARPS
#define MVS_WARPS 4
#endif
#ifndef MVS_ROWS
#define MVS_ROWS 1
#endif
#ifndef MVS_STAGES
#define MVS_STAGES 4
#endif

MEMRA_DEVICE uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
MEMRA_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
MEMRA_DEVICE void mbar_arrive(uint32_t bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(bar) : "memory");
}
MEMRA_DEVICE void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                 :: "r"(bar), "r"(bytes) : "memory");
}
MEMRA_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
MEMRA_DEVICE void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

template <bool GLU>
MEMRA_DEVICE void mvs_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                           const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs, float* y,
                           const float* res, int N, int K, int act) {
    constexpr int S = MVS_STAGES, NRO = MVS_WARPS * MVS_ROWS, NRW = GLU ? 2 * NRO : NRO;
    constexpr int NR = GLU ? 2 * MVS_ROWS : MVS_ROWS;   // weight rows a warp: [0, MVS_ROWS) gate, then up
    extern __shared__ __align__(128) uint8_t smem[];
    const int nblk = K / T::BLK, nu = K / 64, ngroups = N / NRO;
    const uint32_t brs = nblk * T::BULK, mrs = nblk * T::META;
    const uint32_t sb = (NRW * (brs + mrs) + 127) & ~127u;
    const uint32_t bars = sa(smem) + S * sb;   // full[s] at bars + 8 s, empty[s] at bars + 8 (S + s)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (S + s), MVS_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == MVS_WARPS) {   // the producer
        if (lane == 0) {
            int i = 0;
            for (int g = blockIdx.x; g < ngroups; g += gridDim.x, ++i) {
                const int s = i % S;
                if (i >= S) mbar_wait(bars + 8 * (S + s), ((i / S) - 1) & 1);
                const uint32_t full = bars + 8 * s, dst = sa(smem) + s * sb;
                mbar_expect(full, NRW * (brs + mrs));
                const size_t r0 = (size_t)g * NRO;
                bulk_g2s(dst, bulk + r0 * brs, NRO * brs, full);
                if (GLU) bulk_g2s(dst + NRO * brs, bulk + (r0 + N) * brs, NRO * brs, full);
                if (T::META) {
                    bulk_g2s(dst + NRW * brs, meta + r0 * mrs, NRO * mrs, full);
                    if (GLU) bulk_g2s(dst + NRW * brs + NRO * mrs, meta + (r0 + N) * mrs, NRO * mrs, full);
                }
            }
        }
        return;
    }
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    int i = 0;
    for (int g = blockIdx.x; g < ngroups; g += gridDim.x, ++i) {
        const int s = i % S;
        mbar_wait(bars + 8 * s, (i / S) & 1);
        const uint8_t* st = smem + s * sb;
        const uint8_t* wb[NR];
        const uint8_t* wm[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {   // local weight row: gate rows 0..NRO-1, up rows NRO..2 NRO-1
            const int li = r < MVS_ROWS ? warp * MVS_ROWS + r : NRO + warp * MVS_ROWS + r - MVS_ROWS;
            wb[r] = st + li * brs;
            wm[r] = st + NRW * brs + li * mrs;
        }
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.f;
        for (int u = lane; u < nu; u += 32) {
            typename T::U w[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) T::load(w[r], wb[r], wm[r], u, nu);
            int4 xv[4];
            Q8Scale sv[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int e = T::goff(u, q, nu);
                xv[q] = __ldg(reinterpret_cast<const int4*>(xq + e));
                const int2 t = __ldg(reinterpret_cast<const int2*>(xs + e / 32));
                sv[q].d = __int_as_float(t.x); sv[q].s = t.y;
            }
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                int ints[T::NI];
                T::idots(w[r], xv, ints);
                acc[r] = T::accum(acc[r], w[r], ints, sv);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (S + s));
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < MVS_ROWS; ++r) {
                const int row = g * NRO + warp * MVS_ROWS + r;
                float v = acc[r];
                if (GLU) v = __fmul_rn(act == 2 ? gelu_tanh_f32(acc[r]) : silu_f32(acc[r]), acc[MVS_ROWS + r]);
                if (res) v = __fadd_rn(v, res[row]);
                y[row] = v;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * (MVS_WARPS + 1))
mvs_q8(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y, const float* res,
       int N, int K, int act) {
    mvs_body<false>(bulk, meta, xq, xs, y, res, N, K, act);
}
extern "C" __global__ void __launch_bounds__(32 * (MVS_WARPS + 1))
mvs_q8_glu(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y, const float* res,
           int N, int K, int act) {
    mvs_body<true>(bulk, meta, xq, xs, y, res, N, K, act);
}
