// gemm_f16.cu — the prompt rows' GEMM on f16 tensor cores, one family for every quantized weight
// type of qtypes.cuh (MV_TYPE 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K, 23
// IQ4_XS), and to_f16, the conversion of its activations. Written for kernels/ (NVRTC, -I kernels/);
// it includes common.cuh, q8.cuh, qtypes.cuh and mma_frag.cuh (for T, the type of MV_TYPE). Landed
// from experiments/gemm_f16 (variant history below). The engine runs it under MEMRA_PROMPT_GEMM=f16
// (memra.gpu.plan; the default since session 43) for MEMRA_ATTN=hybrid's prompt rows: its to_f16
// everywhere, its GEMM off sm_90a (gemm_f16_wg.cu on sm_90a: the same bits).
//
// What it computes. W: N rows (gemm_f16) or 2N rows [gate; up] (gemm_f16_glu) of K weights in
// memra's planes layout (bulk, meta: memra.gpu.ops.matvec.pack_planes); x: nb activation rows of K
// f16 values (to_f16 of the f32 activations). Each CTA dequantizes a BM x 128 weight tile to f16 in
// shared memory (qtypes.cuh's T::deq: the f32 value of ggml's dequantize_row_*, rounded to f16 once
// by cvt.rn), stages a BN x 128 x tile with cp.async (rows past nb zero-filled) and runs mma.sync
// m16n8k16 f16 x f16 -> f32 (the f16 products are exact in f32). For every output (m, n) ONE f32
// accumulator acc = +0 runs over the k16 steps 0, 1, .., K/16 - 1 in increasing k (inside a step
// the mma's own sum of 16 products, fixed by the hardware). Then the epilogue:
//   gemm_f16:      y[m N + n] = acc, or with res != null fl(res[m N + n] + acc) (__fadd_rn; res may alias y)
//   gemm_f16_glu:  y[m N + n] = fl(act(gate) * up) (__fmul_rn), gate = acc of row n, up = acc of row
//                  N + n, act 1 = silu_f32, 2 = gelu_tanh_f32 (common.cuh): act_mul's (kernels/act.cu)
//                  arithmetic on the plain kernel's gate and up outputs, bit for bit
//   to_f16:        h[i] = f16(x[i]), round to nearest even (numpy's astype(float16)), i < n
// Order: no split over K and nothing that depends on nb, on the rows beside a row, on a row's place
// in its tile, on the grid or on the GF_* tunables: a row's bits are the same in any chunk, beside
// any rows and at any configuration (chunk-, batch- and configuration-invariant: the prompt rows'
// contract under MEMRA_ATTN=hybrid). Not the order or the arithmetic of mv_q8 / gemm.cu /
// gemm_tile.cu (q8 activations there: 8 significant bits relative to a block's largest; here 11
// each, and every weight rounded to f16, ~2^-11 relative).
//
// Tile. GF_WM x GF_WN warps, a warp GF_TM m16 weight tiles x GF_TN n8 activation tiles: BM = 16
// GF_TM GF_WM weight rows (glu: BM / 2 outputs, each 16-row tile its 8 gate rows then the same 8 up
// rows, wrow()), BN = 8 GF_TN GF_WN activation rows. K advances 128 elements a stage (two 64-element
// units of every weight row, T::load / T::goff), double-buffered: stage s + 1's x by cp.async and
// its weights into registers while stage s's 8 k16 steps run (A and B fragments by ldmatrix.x4),
// then stage s + 1's dequant into the other buffer (GF_OVERLAP 1: spread between the mma of k16
// steps GF_OVL0..7 instead).
//
// Tunables (-D): MV_TYPE (the ggml type id; without it the module holds to_f16 alone), GF_WM (2),
// GF_WN (4), GF_TM (4), GF_TN (4; even), GF_OVERLAP (0), GF_OVL0 (4). Static asserts: 2 BM a
// multiple of NT, BN 16 a multiple of NT. MEMRA_CANARY: deliberately wrong variants kernel-check
// must catch: 1, k16 step 1 of stage 0 skipped (the products of k = 16..31 dropped from every
// output); 2, to_f16 rounds toward zero (cvt.rz) where it converts pairs.
//
// Launch contract (memra.gpu.ops.gemm_f16 computes it):
//   gemm_f16 / gemm_f16_glu: grid (ceil(nb / BN), N / OBM, 1), OBM = BM (plain) or BM / 2 (glu);
//     block (NT, 1, 1), NT = 32 GF_WM GF_WN; dynamic shared memory 2 (BM + BN) 272 bytes (two stages
//     of 128 f16 a row plus 16 bytes of padding; above 48 KiB the launcher raises the kernel's limit)
//   to_f16: grid (ceil(n / 512), 1, 1), block (256, 1, 1), no shared memory
// Host contract: N % OBM == 0 (no partial row tile), K % 128 == 0 and K a multiple of the type's
// block (256 for the K-quants and IQ4_XS); nb >= 1, any (a partial last column tile loads zeros and
// stores nothing past nb); bulk, meta and x 16-byte aligned (upload_weight; x's rows of K % 128 == 0
// halves stay aligned), N, K, nb and to_f16's n int32 (element offsets are 64-bit); to_f16's x and
// h 8- and 4-byte aligned.
// PDL: the first stage's weights load before MEMRA_PDL_WAIT() (no kernel writes weights), the rest
// after it; MEMRA_PDL_LAUNCH() after the K loop, before the epilogue's stores (the dependent kernel's
// wait still sees them: it waits for this grid's completion). to_f16: wait first, launch last.
//
// Variant history:
//  v1 (session 41-42): experiments/gemm_f16/gemm_f16.cu moved here unchanged in its arithmetic and
//     index math (experiments/gemm_f16/index_check.py replays it on the CPU; tests/test_gemm_f16.py
//     runs that replay), its own PTX wrappers kept (cp.async with zero fill, ldmatrix.x4, mma
//     m16n8k16 f16, the f16x2 pack: attn_fa.cu has the same ones; a shared header is left for when
//     both are next edited). Added: MEMRA_CANARY 1 and 2, the module without MV_TYPE (to_f16 alone),
//     the guard on MV_TYPE's types. Registers (NVRTC 13.5, sm_90a, plain / glu): 4 x 4 tiles a warp
//     (the default) 166-199, no spills, every type; 8 x 4 (GF_TM 8: BM 256) 246-255, Q4_0 plain 12 B
//     and Q4_1 glu 8 B of spills, the others none. Timed in session 42 (research/2026-12-06-session42/f:
//     at parity with the int8 tile on the 8B's Q4_K gate+up at 512 rows, 677 vs 689 us, 1.39x on the
//     Q6_K down); on sm_90a the engine runs gemm_f16_wg.cu instead.
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"

#ifndef MEMRA_CANARY
#define MEMRA_CANARY 0
#endif

// two floats -> f16x2 (lo in the low half), round to nearest even (NVRTC has no cuda_fp16.h here);
// MEMRA_CANARY 2: toward zero
MEMRA_DEVICE uint32_t pack_h2(float lo, float hi) {
    uint32_t r;
#if MEMRA_CANARY == 2
    asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// x (f32, n values) -> f16, round to nearest even: the activations gemm_f16 reads. Every module
// holds it; the engine loads it from the one built without MV_TYPE.
extern "C" __global__ void __launch_bounds__(256)
to_f16(const float* __restrict__ x, uint16_t* __restrict__ h, int n) {
    MEMRA_PDL_WAIT();
    const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 1 < n) {
        const float2 v = *reinterpret_cast<const float2*>(x + i);
        *reinterpret_cast<uint32_t*>(h + i) = pack_h2(v.x, v.y);
    } else if (i < n) {
        h[i] = f32_to_f16(x[i]);
    }
    MEMRA_PDL_LAUNCH();
}

#ifdef MV_TYPE
#if MV_TYPE != 2 && MV_TYPE != 3 && MV_TYPE != 6 && MV_TYPE != 7 && MV_TYPE != 8 && MV_TYPE != 12 && \
    MV_TYPE != 13 && MV_TYPE != 14 && MV_TYPE != 23
#error "gemm_f16.cu: MV_TYPE must be a quantized type of qtypes.cuh (2, 3, 6, 7, 8, 12, 13, 14, 23)"
#endif
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"   // T, the weight type of MV_TYPE

#ifndef GF_WM
#define GF_WM 2
#endif
#ifndef GF_WN
#define GF_WN 4
#endif
#ifndef GF_TM
#define GF_TM 4
#endif
#ifndef GF_TN
#define GF_TN 4
#endif
#ifndef GF_OVERLAP
#define GF_OVERLAP 0   // 1: the next stage's dequant spread over k16 steps GF_OVL0..7 (between the mma)
#endif
#ifndef GF_OVL0
#define GF_OVL0 4      // the first k16 step that dequantizes: the weight loads issued at the stage's top land first
#endif

constexpr int NT = 32 * GF_WM * GF_WN;
constexpr int BM = 16 * GF_TM * GF_WM;
constexpr int BN = 8 * GF_TN * GF_WN;
constexpr int BK = 128;                 // two 64-element units of every weight row a stage
constexpr int LDS = BK + 8;             // smem row stride in halves (272 bytes: ldmatrix conflict-free)
constexpr int UPT = 2 * BM / NT;        // weight units a thread dequantizes a stage
constexpr int XPT = BN * (BK / 8) / NT; // 16-byte x chunks a thread copies a stage
static_assert(2 * BM % NT == 0 && UPT >= 1, "GF: the weight units must split evenly over the threads");
static_assert(BN * (BK / 8) % NT == 0, "GF: the x chunks must split evenly over the threads");
static_assert(GF_TN % 2 == 0, "GF_TN even: B fragments load two 8-row tiles an ldmatrix.x4");

MEMRA_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

MEMRA_DEVICE void cp16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
MEMRA_DEVICE void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The weight row (global index) of tile-local row r: plain, or glu's 16-row tiles of 8 gate rows
// (n) then the same 8 up rows (N + n).
MEMRA_DEVICE int wrow(int r, int n0, int N, bool glu) {
    if (!glu) return n0 + r;
    const int n = n0 + 8 * (r >> 4) + (r & 7);
    return (r & 8) ? N + n : n;
}

template <bool GLU>
MEMRA_DEVICE void gemm_f16_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                const uint16_t* __restrict__ x, float* y, const float* res, int N, int K, int nb,
                                int act) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* Ws = reinterpret_cast<uint16_t*>(smem);             // [2][BM][LDS]
    uint16_t* Xs = Ws + 2 * BM * LDS;                           // [2][BN][LDS]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / GF_WN, wn = warp % GF_WN;
    const int m0 = blockIdx.x * BN;
    const int n0 = blockIdx.y * (GLU ? BM / 2 : BM);
    const int S = K / BK;
    const size_t bulk_row = (size_t)(K / T::BLK) * T::BULK, meta_row = (size_t)(K / T::BLK) * T::META;

    // this thread's weight units: tile-local row ur[p], unit parity uu[p] of each stage
    int ur[UPT], uu[UPT];
    const uint8_t* ub[UPT];
    const uint8_t* um[UPT];
#pragma unroll
    for (int p = 0; p < UPT; ++p) {
        const int i = tid + p * NT;
        ur[p] = i >> 1;
        uu[p] = i & 1;
        const int gr = wrow(ur[p], n0, N, GLU);
        ub[p] = bulk + gr * bulk_row;
        um[p] = meta + gr * meta_row;
    }
    typename T::U w[UPT];

    auto load_w = [&](int s) {
#pragma unroll
        for (int p = 0; p < UPT; ++p) T::load(w[p], ub[p], um[p], 2 * s + uu[p], K / 64);
    };
    auto store_wg = [&](int p, int g, int s, int buf) {   // unit p's group g of stage s
        const int u = 2 * s + uu[p];
        uint16_t* row = Ws + (buf * BM + ur[p]) * LDS;
        float f[16];
        T::deq(w[p], g, f);
        uint4 lo, hi;
        lo.x = pack_h2(f[0], f[1]);   lo.y = pack_h2(f[2], f[3]);
        lo.z = pack_h2(f[4], f[5]);   lo.w = pack_h2(f[6], f[7]);
        hi.x = pack_h2(f[8], f[9]);   hi.y = pack_h2(f[10], f[11]);
        hi.z = pack_h2(f[12], f[13]); hi.w = pack_h2(f[14], f[15]);
        const int c = T::goff(u, g, K / 64) - BK * s;   // 0..127, a multiple of 16
        *reinterpret_cast<uint4*>(row + c) = lo;
        *reinterpret_cast<uint4*>(row + c + 8) = hi;
    };
    auto store_w = [&](int s, int buf) {
#pragma unroll
        for (int p = 0; p < UPT; ++p)
#pragma unroll
            for (int g = 0; g < 4; ++g) store_wg(p, g, s, buf);
    };
    auto load_x = [&](int s, int buf) {
#pragma unroll
        for (int p = 0; p < XPT; ++p) {
            const int c = tid + p * NT, r = c >> 4, col = 8 * (c & 15);
            const bool ok = m0 + r < nb;
            const uint16_t* src = x + (size_t)(ok ? m0 + r : 0) * K + BK * s + col;
            cp16_zfill(smem_u32(Xs + (buf * BN + r) * LDS + col), src, ok);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    float acc[GF_TM][GF_TN][4];
#pragma unroll
    for (int a = 0; a < GF_TM; ++a)
#pragma unroll
        for (int b = 0; b < GF_TN; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

    load_w(0);            // weights are never written by kernels: before the PDL wait
    MEMRA_PDL_WAIT();
    load_x(0, 0);
    store_w(0, 0);
    for (int s = 0; s < S; ++s) {
        const int buf = s & 1;
        if (s + 1 < S) {
            load_x(s + 1, buf ^ 1);
            load_w(s + 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const uint16_t* wt = Ws + (buf * BM + wm * 16 * GF_TM) * LDS;
        const uint16_t* xt = Xs + (buf * BN + wn * 8 * GF_TN) * LDS;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t a[GF_TM][4], b[GF_TN][2];
#pragma unroll
            for (int tm = 0; tm < GF_TM; ++tm)
                ldsm_x4(a[tm], smem_u32(wt + (16 * tm + (lane & 15)) * LDS + 16 * kk + 8 * (lane >> 4)));
#pragma unroll
            for (int tn = 0; tn < GF_TN; tn += 2) {
                uint32_t r[4];
                ldsm_x4(r, smem_u32(xt + (8 * tn + (lane & 7) + 8 * (lane >> 4)) * LDS + 16 * kk +
                                    8 * ((lane >> 3) & 1)));
                b[tn][0] = r[0]; b[tn][1] = r[1]; b[tn + 1][0] = r[2]; b[tn + 1][1] = r[3];
            }
            if (!(MEMRA_CANARY == 1 && s == 0 && kk == 1)) {   // the canary drops k = 16..31
#pragma unroll
                for (int tm = 0; tm < GF_TM; ++tm)
#pragma unroll
                    for (int tn = 0; tn < GF_TN; ++tn) mma_f16(acc[tm][tn], a[tm], b[tn][0], b[tn][1]);
            }
#if GF_OVERLAP
            // the next stage's groups q in [lo, hi) of 4 UPT, spread over steps GF_OVL0..7 (its buffer
            // was last read in the previous stage, before this stage's top barrier)
            if (kk >= GF_OVL0 && s + 1 < S) {
                constexpr int NS = BK / 16 - GF_OVL0, NG = 4 * UPT;
                const int lo = (kk - GF_OVL0) * NG / NS, hi = (kk - GF_OVL0 + 1) * NG / NS;
#pragma unroll
                for (int q = 0; q < NG; ++q)
                    if (q >= lo && q < hi) store_wg(q >> 2, q & 3, s + 1, buf ^ 1);
            }
#endif
        }
#if !GF_OVERLAP
        if (s + 1 < S) store_w(s + 1, buf ^ 1);
#endif
        __syncthreads();
    }
    MEMRA_PDL_LAUNCH();

    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int tm = 0; tm < GF_TM; ++tm)
#pragma unroll
        for (int tn = 0; tn < GF_TN; ++tn) {
            const int m = m0 + wn * 8 * GF_TN + 8 * tn + 2 * tig;
            const float* d = acc[tm][tn];
            if (GLU) {   // rows gid (gate) and gid + 8 (up) of the 16-row tile are one output n
                const int n = n0 + 8 * (wm * GF_TM + tm) + gid;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (m + e >= nb) continue;
                    const float gv = d[e], uv = d[2 + e];
                    y[(size_t)(m + e) * N + n] = __fmul_rn(act == 2 ? gelu_tanh_f32(gv) : silu_f32(gv), uv);
                }
            } else {
                const int n = n0 + 16 * (wm * GF_TM + tm) + gid;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int mm = m + (e & 1), nn = n + 8 * (e >> 1);
                    if (mm >= nb) continue;
                    const size_t o = (size_t)mm * N + nn;
                    y[o] = res ? __fadd_rn(res[o], d[e]) : d[e];
                }
            }
        }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm_f16(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
         float* y, const float* res, int N, int K, int nb) {
    gemm_f16_body<false>(bulk, meta, x, y, res, N, K, nb, 0);
}

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm_f16_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
             float* y, int N, int K, int nb, int act) {
    gemm_f16_body<true>(bulk, meta, x, y, nullptr, N, K, nb, act);
}
#endif  // MV_TYPE
