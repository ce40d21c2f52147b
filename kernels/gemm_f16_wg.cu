// gemm_f16_wg.cu — gemm_f16.cu's GEMM as a Hopper warp-specialized wgmma kernel (sm_90a): the prompt rows'
// layer matmuls under MEMRA_PROMPT_GEMM=f16 (memra.gpu.ops.gemm_f16: the engine's f16 kernel on sm_90a;
// gemm_f16.cu's mma.sync elsewhere). Written for kernels/ (NVRTC, -I kernels/, compiled with -default-device:
// memra.gpu.compile.FILE_OPTIONS; NVRTC 12 takes the generic lambdas below for host functions without it).
// Variants (the losing ones' numbers in research/, not here):
//   v1 (session 42, experiments/gemm_f16/wg): this design, compiled and CPU-checked (layout_check.py).
//   v1 measured (session 43, H100 80GB HBM3, research/2026-12-06-session43/f, the 8B's shapes at 512 rows, µs
//     against the int8 prompt tile gemm_tile.cu at the table's configuration): every configuration correct and
//     bit-identical to gemm_f16.cu's mma.sync (same f16 operands, same k16 steps); WG_BN 256 WG_INFLIGHT 0:
//     Q4_K gate+up 331.9 vs 691.4 (2.08x, 362 TFLOPS), QKV 70.2 vs 181.7, Q4_0 gate+up 302.3 vs 581.6, Q8_0
//     374.2 vs 604.9; WG_BN 128 on the 4,096-row weights (64 blocks at 256 leave half the SMs idle): Q6_K
//     down 225.9 vs 428.0, Q4_K down 183.7 vs 321.4, attn_output 54.1 vs 94.0; WG_MT 2 (no prefetch) slower
//     everywhere (389-593).
//   v2 (session 45, experiments/gemm_f16/wg/cvt.py): the producer's integer -> float step by the exponent
//     trick (deq_cvt.cuh: no I2F, the same floats and bits as T::deq): Q6_K down 229.8 -> 192.9, Q4_K down 186.2 ->
//     188.9, Q4_K gate+up 334.2 -> 321.3, Q8_0 gate+up 371.2 -> 366.5, Q8_0 down 209.1 -> 190.3 (us at 512 rows,
//     NVIDIA H100 80GB HBM3).
// MEMRA_CANARY 1 (kernel-check must catch it): the k16 step 1 of stage 0 skipped (the products of k = 16..31
// dropped from every output), gemm_f16.cu's canary 1. On another arch than sm_90a the entries trap (the
// launcher never picks this module there; memra kernel-check --compile-only builds it for every arch).
//
// Contract (gemm_f16.cu's): y[m, n] = sum_k W[n, k] x[m, k] for m < nb activation rows, W a quantized GGUF
// weight in the planes layout (memra/gpu/ops/matvec.py: w.bulk, w.meta), x in f16 (gemm_f16.cu's to_f16).
// W is dequantized to the values gemm_f16.cu's qtypes.cuh T::deq gives (the f32 value ggml gives; deq_cvt.cuh's
// DeqCvt<T> computes them without I2F), rounded to f16 once by cvt.rn.f16x2.f32. Entries and arguments are
// gemm_f16.cu's: gemm_f16 (plain; res != 0: y = __fadd_rn(res, acc)) and gemm_f16_glu (W stacks [gate; up],
// N outputs from 2N weight rows, y = __fmul_rn(act(gate), up), act 1 silu_f32 / 2 gelu_tanh_f32).
//
// Order: one f32 accumulator per output, updated by one wgmma.mma_async m64n{WG_BN}k16 per k16 step, in
// increasing k (the instruction's own sum of 16 products into the accumulator is the hardware's, fixed for
// a given instruction shape). No split over K. An output's accumulation sees only its weight row, its
// activation row and the k order, so a row's bits do not depend on nb, on the other rows beside it (the
// zero-filled rows past nb only feed their own accumulators), on blockIdx or on WG_STAGES / WG_INFLIGHT:
// chunk- and batch-invariant. WG_BN changes the instruction (m64n128 vs m64n256): whether the hardware
// sums a k16 step the same way at every N is not documented, so the bits of WG_BN 128 and 256 may differ
// (probe.py checks each against numpy and reports whether they agree). The arithmetic differs from
// gemm_f16.cu's mma.sync m16n8k16 in the same way: same operands, same k16 steps, possibly other bits.
//
// Block: 3 warpgroups (384 threads). Warpgroup 0 is the producer, 1 and 2 the consumers. BM = 128 WG_MT
// weight rows (consumer c owns rows 64 (WG_MT c + t) .. + 63, t < WG_MT: one wgmma M = 64 each), BN = WG_BN
// activation rows (the wgmma N), BK = 64 (one 128-byte swizzle atom of f16) a stage, WG_STAGES stages in a
// ring. A stage is the W tile (BM x 64 f16, BM * 128 bytes) then the X tile (BN x 64 f16), each a multiple of
// 1024 bytes from a 1024-aligned base.
//
// Shared layout of both tiles (K-major, the PTX ISA's 128-byte swizzle): row r (weight row or activation row
// of the tile), 16-byte chunk j = k / 8 (k < 64 in the stage), element k % 8 of the chunk:
//     byte  (r / 8) * 1024 + (r % 8) * 128 + ((j ^ (r % 8)) * 16) + (k % 8) * 2
// i.e. 8-row x 128-byte atoms stacked along M / N 1024 bytes apart (the descriptor's SBO), the chunk index
// XOR the row within the atom (the address bits [4, 7) XOR [7, 10): an absolute-address swizzle, hence the
// 1024-byte alignment). Descriptor (PTX ISA "matrix descriptor"): bits 0-13 start address >> 4, 16-29 LBO >> 4
// (unused for swizzled K-major: 1), 32-45 SBO >> 4 (1024 >> 4 = 64), 49-51 base offset 0 (atoms 1024-aligned),
// 62-63 layout 1 (128-byte swizzle). The k16 step kk of a stage starts 32 kk bytes into the atom row (the
// hardware applies the XOR to the address it forms, so the logical offset is what advances).
//
// Producer (128 threads, thread p owns tile rows p + 128 i, i < WG_MT): the stages come in pairs (128 k: the
// two 64-element units of each row that gemm_f16.cu's stage holds; Q6_K's units interleave groups over 128
// elements, so a pair is the smallest k range made of whole units). Per pair P (stages 2P, 2P + 1):
//   wait empty[] of both slots (not on the ring's first pass) -> cp.async (16 bytes, zero fill past nb) the X
//   tiles of both stages into the swizzled layout -> issue the global loads of pair P + 1's weight units
//   (WG_PREFETCH) -> dequantize pair P's units (DeqCvt<T>::deq, cvt.rn.f16x2.f32) and st.shared them at
//   T::goff's columns -> cp.async.wait_group 0 -> fence.proxy.async.shared::cta -> mbarrier.arrive on full[]
//   of both slots.
// Why wait_group + arrive, not cp.async.mbarrier.arrive.noinc: wgmma reads shared memory through the async
// proxy, and cp.async / st.shared write through the generic proxy; the fence.proxy.async that orders them
// must come after the writes are complete in the writing thread. After wait_group 0 the thread's copies are
// complete, so one fence covers both its copies and its stores, and the arrive (release) publishes both.
// With .noinc the copies complete after the thread's last instruction, with no fence of its own after them.
// The cost (the producer stalls on the X copies it issued before its dequant) is hidden by that dequant.
// Consumers (warpgroup c + 1): per stage i (slot i % S): mbarrier.try_wait.parity full[slot] (phase parity
//   (i / S) & 1) -> wgmma.fence -> 4 k16 steps x WG_MT wgmma -> wgmma.commit_group -> wgmma.wait_group
//   WG_INFLIGHT -> each warp's lane 0 arrives on empty[] of the slot whose group is now complete (stage i -
//   WG_INFLIGHT). mbarriers: full[s] expects 128 arrivals (every producer thread), empty[s] 8 (every
//   consumer warp); initialised by thread 0, published by __syncthreads before any use.
// Epilogue (the PTX ISA's m64nNk16 f32 D fragment): thread t of a consumer warpgroup, warp w = t / 32,
//   gid = lane / 4, tig = lane % 4: register 4j + e holds row 16w + gid + 8 (e >> 1) of the m64 tile, column
//   8j + 2 tig + (e & 1). Row = weight row -> output n; column = activation row m0 + column; written to
//   y[m N + n] for m < nb. glu: gemm_f16.cu's wrow interleave (each 16-row tile: 8 gate rows n, then the same 8
//   up rows N + n) puts a gate (e < 2) and its up (e + 2) in one thread: warp w's 16 rows are one such tile.
// PDL: every thread MEMRA_PDL_WAIT before its first read of x / res (the producer issues pair 0's weight
//   loads before it: weights are never written by kernels), MEMRA_PDL_LAUNCH after its main loop.
//
// Tunables (-D): MV_TYPE (ggml type id); WG_BN (128; 64 or 256) activation rows a block = wgmma N; WG_MT (1; 2)
// m64 tiles a consumer (BM = 128 WG_MT); WG_STAGES (4) ring slots; WG_INFLIGHT (1; 0) wgmma groups left in
// flight when a consumer releases a slot; WG_PREFETCH (1; 0) load pair P + 1's weight units before
// dequantizing pair P; WG_SETMAXNREG (0; 1) setmaxnreg.dec WG_PREGS (40) in the producer, .inc WG_CREGS (232)
// in the consumers. WG_STAGES, WG_INFLIGHT, WG_PREFETCH, WG_SETMAXNREG change nothing but timing; WG_MT
// neither (same instruction); WG_BN changes the instruction shape.
// Host contract: N a multiple of BM (glu: of BM / 2), K a multiple of 128, nb >= 1; grid (ceil(nb / BN),
// N / OBM) with OBM = BM (glu: BM / 2); 384 threads; dynamic shared memory smem_bytes() below
// (WG_STAGES (BM + BN) 128 + 1024 alignment slack + 16 WG_STAGES mbarrier bytes; the launcher opts in > 48 KB).
#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
#include "deq_cvt.cuh"
#define MMA_FRAG_VOLATILE 0
#include "mma_frag.cuh"
#include "wgmma_ops.cuh"

#ifndef WG_BN
#define WG_BN 128
#endif
#ifndef WG_MT
#define WG_MT 1
#endif
#ifndef WG_STAGES
#define WG_STAGES 4
#endif
#ifndef WG_INFLIGHT
#define WG_INFLIGHT 1
#endif
#ifndef WG_PREFETCH
#define WG_PREFETCH 1
#endif
#ifndef WG_SETMAXNREG
#define WG_SETMAXNREG 0
#endif
#ifndef WG_PREGS
#define WG_PREGS 40
#endif
#ifndef WG_CREGS
#define WG_CREGS 232
#endif

constexpr int NT = 384;                      // 3 warpgroups
constexpr int BM = 128 * WG_MT;              // weight rows a block
constexpr int BN = WG_BN;                    // activation rows a block
constexpr int BK = 64;                       // k a stage: one 128-byte swizzle atom of f16
constexpr int S = WG_STAGES;
constexpr int W_BYTES = BM * 128;            // a stage's W tile
constexpr int X_BYTES = BN * 128;            // a stage's X tile
constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
constexpr int XPT = BN * 8 / 128;            // 16-byte x chunks a producer thread copies a stage
constexpr int NACC = BN / 2;                 // f32 accumulators a thread an m64 tile
static_assert(BN == 64 || BN == 128 || BN == 256, "WG_BN: 64, 128 or 256");
static_assert(WG_MT == 1 || WG_MT == 2, "WG_MT: 1 or 2");
// the producer frees both slots of pair P before writing either: stage 2P + 1 - S must be released, which
// happens once stage 2P + 1 - S + WG_INFLIGHT is issued, a stage of pair P - 1 at the latest (layout_check.py's
// protocol model deadlocks at WG_STAGES 2, WG_INFLIGHT 1)
static_assert(S >= 2 + WG_INFLIGHT, "WG_STAGES >= 2 + WG_INFLIGHT");
static_assert(WG_INFLIGHT == 0 || WG_INFLIGHT == 1, "WG_INFLIGHT: 0 or 1");
static_assert(STAGE_BYTES % 1024 == 0, "stages 1024-aligned");
// setmaxnreg moves registers inside the block's allocation (384 x 168): 128 WG_PREGS + 256 WG_CREGS <= 384 x 168,
// or the consumers' .inc waits for registers nobody frees
static_assert(!WG_SETMAXNREG || (WG_PREGS + 2 * WG_CREGS <= 504 && WG_PREGS % 8 == 0 && WG_CREGS % 8 == 0),
              "WG_PREGS + 2 WG_CREGS <= 504, multiples of 8");
static_assert(S * STAGE_BYTES + 1024 + 16 * S <= 232448, "shared memory: at most 227 KB a block");

MEMRA_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

MEMRA_DEVICE void cp16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
// two floats -> f16x2 (lo in the low half), round to nearest even: gemm_f16.cu's pack_h2
MEMRA_DEVICE uint32_t pack_h2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
MEMRA_DEVICE void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" :: "r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

// mbarrier (shared::cta, 64-bit): init, arrive (release, CTA scope), wait on a phase's parity (acquire)
MEMRA_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
MEMRA_DEVICE void mbar_arrive(uint32_t bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(bar) : "memory");
}
MEMRA_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// generic-proxy writes (st.shared, completed cp.async) -> visible to the async proxy (wgmma's reads)
MEMRA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

MEMRA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
MEMRA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
// keeps the compiler from moving accumulator reads / writes across wgmma issue and wait (the registers
// are written asynchronously in between)
template <int N>
MEMRA_DEVICE void fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
MEMRA_DEVICE void wgmma_tile(float (&d)[NACC], uint64_t a, uint64_t b) {
#if WG_BN == 64
    wgmma_m64n64k16(d, a, b);
#elif WG_BN == 128
    wgmma_m64n128k16(d, a, b);
#else
    wgmma_m64n256k16(d, a, b);
#endif
}

// The shared-memory matrix descriptor of a K-major, 128-byte-swizzled operand starting at byte addr:
// start >> 4 (bits 0-13), LBO 1 (16-29, unused), SBO 1024 >> 4 (32-45), base offset 0, layout 1 (62-63).
MEMRA_DEVICE uint64_t sw128_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
// byte offset of 16-byte chunk j (k / 8) of tile row r in the swizzled K-major layout
MEMRA_DEVICE uint32_t sw128(int r, int j) { return (r >> 3) * 1024 + (r & 7) * 128 + ((j ^ (r & 7)) << 4); }

// u % 4 of a unit, for the types whose U keeps it (T::load sets w.j = u & 3 from a run-time u): set again
// from a compile-time value, so the compiler folds the per-unit scale selection (a no-op for the others)
template <int V>
struct IntC { static constexpr int value = V; };   // a compile-time int passed to a generic lambda
template <class U>
MEMRA_DEVICE auto set_j(U& w, int j, int) -> decltype(w.j = j, void()) { w.j = j; }
template <class U>
MEMRA_DEVICE void set_j(U&, int, long) {}

// The weight row (global index) of tile-local row r: plain, or glu's 16-row tiles of 8 gate rows (n) then
// the same 8 up rows (N + n). gemm_f16.cu's wrow.
MEMRA_DEVICE int wrow(int r, int n0, int N, bool glu) {
    if (!glu) return n0 + r;
    const int n = n0 + 8 * (r >> 4) + (r & 7);
    return (r & 8) ? N + n : n;
}

template <bool GLU>
MEMRA_DEVICE void gemm_f16_wg_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                                   const uint16_t* __restrict__ x, float* y, const float* res, int N, int K,
                                   int nb, int act) {
    extern __shared__ __align__(16) uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;   // stages 1024-aligned (the swizzle's period)
    const uint32_t bars = base + S * STAGE_BYTES;                   // full[S], then empty[S]
    const int tid = threadIdx.x, wg = tid >> 7;
    const int m0 = blockIdx.x * BN;
    const int n0 = blockIdx.y * (GLU ? BM / 2 : BM);
    const int NS = K / BK;                                          // stages (even: K % 128 == 0)

    if (tid == 0) {
#pragma unroll 1
        for (int s = 0; s < S; ++s) {
            mbar_init(bars + 8 * s, 128);          // full[s]: every producer thread
            mbar_init(bars + 8 * (S + s), 8);      // empty[s]: every consumer warp
        }
    }
    __syncthreads();

    if (wg == 0) {
        // ---------------------------------------------------------------- producer
#if WG_SETMAXNREG
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(WG_PREGS));
#endif
        const int p = tid;                                          // 0..127
        const size_t bulk_row = (size_t)(K / T::BLK) * T::BULK, meta_row = (size_t)(K / T::BLK) * T::META;
        const uint8_t* ub[WG_MT];
        const uint8_t* um[WG_MT];
#pragma unroll
        for (int i = 0; i < WG_MT; ++i) {
            const int gr = wrow(p + 128 * i, n0, N, GLU);
            ub[i] = bulk + gr * bulk_row;
            um[i] = meta + gr * meta_row;
        }
        typename T::U w[WG_MT][2];
        // pair P's units (2P, 2P + 1) of each of the thread's rows; par = P % 2 (a constant at the call)
        auto load_pair = [&](typename T::U (&v)[WG_MT][2], int P, auto parc) {
            constexpr int par = decltype(parc)::value;
#pragma unroll
            for (int i = 0; i < WG_MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    T::load(v[i][h], ub[i], um[i], 2 * P + h, K / 64);
                    set_j(v[i][h], 2 * par + h, 0);
                }
        };
        // unit h of pair P: its 4 groups of 16 at row columns T::goff(2P + h, g) - 128 P (0..127, a multiple
        // of 16): stage 2P + (col >> 6), chunks (col & 63) / 8 and + 1. goff(u + 4, g) = goff(u, g) + 256 for
        // every type (layout_check.py checks it), so col is goff(2 par + h, g) - 128 par: a constant.
        auto store_pair = [&](const typename T::U (&v)[WG_MT][2], auto parc, uint32_t wa, uint32_t wb) {
            constexpr int par = decltype(parc)::value;
#pragma unroll
            for (int i = 0; i < WG_MT; ++i) {
                const int r = p + 128 * i;
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int g = 0; g < 4; ++g) {
                        float f[16];
                        DeqCvt<T>::deq(v[i][h], g, f);
                        const int col = T::goff(2 * par + h, g, K / 64) - 128 * par;
                        const uint32_t wt = (col & 64) ? wb : wa;
                        const int j = (col & 63) >> 3;
                        st_shared_v4(wt + sw128(r, j), pack_h2(f[0], f[1]), pack_h2(f[2], f[3]),
                                     pack_h2(f[4], f[5]), pack_h2(f[6], f[7]));
                        st_shared_v4(wt + sw128(r, j + 1), pack_h2(f[8], f[9]), pack_h2(f[10], f[11]),
                                     pack_h2(f[12], f[13]), pack_h2(f[14], f[15]));
                    }
            }
        };
        // stage i's X tile (BN x 64 f16): chunk q of the thread is tile row r0 + 16 q, 16-byte chunk jx; a byte
        // offset from x a chunk (32 bits: rows past nb read row 0, zero-filled), so the hoisted per-chunk state
        // is one register, not a 64-bit pointer
        const int r0 = p >> 3, jx = p & 7;
        uint32_t xoff[XPT];
#pragma unroll
        for (int q = 0; q < XPT; ++q) {
            const int m = m0 + r0 + 16 * q;
            xoff[q] = (uint32_t)((m < nb ? m : 0) * K + 8 * jx) * 2u;
        }
        auto load_x = [&](int i, uint32_t xt) {
            const uint8_t* xs = reinterpret_cast<const uint8_t*>(x) + (size_t)i * (2 * BK);
            const uint32_t dst = xt + sw128(r0, jx);
#pragma unroll
            for (int q = 0; q < XPT; ++q)
                cp16_zfill(dst + 2048 * q, xs + xoff[q], m0 + r0 + 16 * q < nb);   // 16 rows = 2 atoms
        };

        // one pair: P's slots, X copies, P + 1's weight loads, P's dequant, the arrivals
        auto pair = [&](int P, auto parc) {
            constexpr int par = decltype(parc)::value;
            const int ia = 2 * P, ib = 2 * P + 1;
            const int sa = ia % S, sb = ib % S;
            if (ia >= S) mbar_wait(bars + 8 * (S + sa), ((ia / S) - 1) & 1);
            if (ib >= S) mbar_wait(bars + 8 * (S + sb), ((ib / S) - 1) & 1);
            const uint32_t wa = base + sa * STAGE_BYTES, wb = base + sb * STAGE_BYTES;
            load_x(ia, wa + W_BYTES);
            load_x(ib, wb + W_BYTES);
            asm volatile("cp.async.commit_group;" ::: "memory");
#if WG_PREFETCH
            typename T::U wn[WG_MT][2];
            // unconditional (the last pair reloads itself, unused): a load under a condition would leave w.j a
            // run-time value where the condition fails, and the scale selection unfolded
            load_pair(wn, P + 1 < NS / 2 ? P + 1 : P, IntC<par ^ 1>{});
            store_pair(w, parc, wa, wb);
#pragma unroll
            for (int i = 0; i < WG_MT; ++i) {
                w[i][0] = wn[i][0];
                w[i][1] = wn[i][1];
            }
#else
            store_pair(w, parc, wa, wb);
            load_pair(w, P + 1 < NS / 2 ? P + 1 : P, IntC<par ^ 1>{});   // unconditional: as above
#endif
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            fence_proxy_async();
            mbar_arrive(bars + 8 * sa);
            mbar_arrive(bars + 8 * sb);
        };

        load_pair(w, 0, IntC<0>{});                // weights are never written by kernels: before the PDL wait
        MEMRA_PDL_WAIT();
        // two pairs an iteration: unit u = 2P + h has u % 4 = 2 (P % 2) + h known to the compiler, which
        // folds the K-quant types' per-unit scale selection (T::load's j = u & 3) into constants
        const int NP = NS / 2;
#pragma unroll 1
        for (int P2 = 0; P2 < NP / 2; ++P2) {
            pair(2 * P2, IntC<0>{});
            pair(2 * P2 + 1, IntC<1>{});
        }
        if (NP & 1) pair(NP - 1, IntC<0>{});       // NP - 1 even
        MEMRA_PDL_LAUNCH();
        return;
    }

    // -------------------------------------------------------------------- consumers
#if WG_SETMAXNREG
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(WG_CREGS));
#endif
    const int c = wg - 1, t = tid & 127, lane = tid & 31, warp = t >> 5;
    float acc[WG_MT][NACC];
#pragma unroll
    for (int i = 0; i < WG_MT; ++i)
#pragma unroll
        for (int e = 0; e < NACC; ++e) acc[i][e] = 0.f;
    MEMRA_PDL_WAIT();                      // before res is read (and y written): the previous kernel's
#pragma unroll 1
    for (int i = 0; i < NS; ++i) {
        const int s = i % S;
        mbar_wait(bars + 8 * s, (i / S) & 1);
        const uint32_t wt = base + s * STAGE_BYTES, xt = wt + W_BYTES;
#pragma unroll
        for (int mt = 0; mt < WG_MT; ++mt) fence_acc(acc[mt]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
#if MEMRA_CANARY == 1
            if (i == 0 && kk == 1) continue;   // the canary: k = 16..31 dropped
#endif
            const uint64_t db = sw128_desc(xt + 32 * kk);
#pragma unroll
            for (int mt = 0; mt < WG_MT; ++mt)
                wgmma_tile(acc[mt], sw128_desc(wt + (WG_MT * c + mt) * 8192 + 32 * kk), db);
        }
        wgmma_commit();
        wgmma_wait<WG_INFLIGHT>();
#pragma unroll
        for (int mt = 0; mt < WG_MT; ++mt) fence_acc(acc[mt]);
        if (i >= WG_INFLIGHT) {            // stage i - WG_INFLIGHT's wgmma are complete: its slot is free
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8 * (S + (i - WG_INFLIGHT) % S));
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < WG_MT; ++mt) fence_acc(acc[mt]);
    MEMRA_PDL_LAUNCH();

    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int mt = 0; mt < WG_MT; ++mt) {
        const int r0 = 64 * (WG_MT * c + mt) + 16 * warp;           // the warp's 16 tile rows
#pragma unroll
        for (int j = 0; j < NACC / 4; ++j) {
            const int m = m0 + 8 * j + 2 * tig;
            const float* d = &acc[mt][4 * j];
            if (GLU) {   // rows gid (gate) and gid + 8 (up) of the 16-row tile are one output n
                const int n = n0 + (r0 >> 1) + gid;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (m + e >= nb) continue;
                    const float gv = d[e], uv = d[2 + e];
                    y[(size_t)(m + e) * N + n] = __fmul_rn(act == 2 ? gelu_tanh_f32(gv) : silu_f32(gv), uv);
                }
            } else {
                const int n = n0 + r0 + gid;
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
}

// sm_90a only (wgmma, setmaxnreg): on another arch the entries trap
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GF_WG_ARCH 1
#else
#define GF_WG_ARCH 0
#endif

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm_f16(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
         float* y, const float* res, int N, int K, int nb) {
#if GF_WG_ARCH
    gemm_f16_wg_body<false>(bulk, meta, x, y, res, N, K, nb, 0);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm_f16_glu(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta, const uint16_t* __restrict__ x,
             float* y, int N, int K, int nb, int act) {
#if GF_WG_ARCH
    gemm_f16_wg_body<true>(bulk, meta, x, y, nullptr, N, K, nb, act);
#else
    __trap();
#endif
}
