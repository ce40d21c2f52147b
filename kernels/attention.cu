// attention.cu — decode attention over an f16 KV cache: split-KV flash-decoding with GQA
// and sliding windows, plus the combine kernel that merges the splits.
//
// attn_split: for token t (position p = pos[t], block-table row s = seq ? seq[t] : 0), KV head
//   head block hb and split j, over the keys [k0, k1) of its share of the window
//   lo = window > 0 ? max(0, p + 1 - window) : 0, hi = p + 1, n = hi - lo,
//   chunk = max(ATT_MIN_CHUNK, roundup(ceil(n / S), ATT_TILE)), k0 = lo + j * chunk,
//   k1 = min(hi, k0 + chunk):
//     score_k = scale * q·K[k]   (then softcap * tanh(score / softcap) when softcap > 0)
//     m = max_k score_k, l = sum_k exp(score_k - m), o = sum_k exp(score_k - m) V[k]
//   for each of the N_GQA query heads h = hb * N_GQA + g of the block, which share the KV
//   head kvh = h / qpk (qpk: the model's query heads per KV head, a multiple of N_GQA; K
//   and V are read once for the block's heads). A head's result does not depend on
//   N_GQA (its dot products, softmax and key-group sums run in the same order in any
//   block), so N_GQA trades K/V reuse against parallelism freely. The split layout is a function of n and S only, so a
//   token's result does not depend on the batch it runs in, nor on prefill vs decode.
//   Empty splits write m = -inf, l = 0, o = 0.
// attn_combine: out[t, h] = sum_j exp(m_j - M) o_j / sum_j exp(m_j - M) l_j, M = max_j m_j.
// attn_decode: both in one launch (the last split block of a KV head merges; with a single
//   non-empty split, as at short contexts, that block writes the output itself, bit-identical
//   to the merge), with an optional q8 twin of the output for the dp4a matvecs (see the kernel).
//
// Compile-time: HEAD_DIM (multiple of 8, <= 8 * ATT_WARPS * 32), N_GQA (query heads per
//   KV head), ATT_WARPS (default 4), ATT_TILE (keys per online-softmax step, default 64),
//   KV_BLOCK (positions per KV-cache block, kv.cuh); ATT_RING (attn_ring.cuh; 0 default:
//   K/V loaded to registers tile by tile; 2..4: a cp.async ring of that many K/V tiles in
//   dynamic shared memory; bit-neutral; f16 KV only); ATT_TC (attn_tc.cuh; 0 default): 1 runs
//   split_body's keys on the tensor cores (v11; the ring, f16 K/V, head 64 or 128, N_GQA <= 8,
//   ATT_TILE = 16 or 8 ATT_WARPS; memra.gpu.ops.attention.tc_supported decides), 2 the rows of
//   ATT_TC_MIN keys or more (default 256; a row's own count), shorter rows the CUDA-core body;
//   KV_K_Q8 / KV_V_Q8 (kv.cuh, default 0): that side of the cache is q8_0 planes (int8 codes,
//   f16 scales per 32; kscale / vscale, the kernels' last two parameters): read as d * q in
//   fp32 (exact), then split_body's arithmetic unchanged, so the bits are the f16 kernel's on
//   the q8_0 round trip of every K/V value; attn_decode_rope appends q8_0 (kv_q8_store_row);
//   ATT_ROWS (v12, default 0: every row) / ATT_SWITCH (keys, default 256): attn_decode and attn_decode_rope
//   compute only the rows of fewer than ATT_SWITCH keys (1) or of ATT_SWITCH or more (2), a row's own count
//   (pos + 1 less a window's start), so two launches at two configurations split a step's rows between them;
//   attn_split is not filtered.
//   MEMRA_CANARY: wrong variants kernel-check must catch: 1, a token does not attend to
//   itself; 2 (kv.cuh), the block table ignored; 4 (kv.cuh, q8_0), the scale plane ignored.
// Launch contract:
//   attn_split:   grid (n_head / N_GQA, S, n_tokens), block (32 * ATT_WARPS), static
//     shared memory plus, with ATT_RING, RING_BYTES = ATT_RING * 2 * ATT_TILE * HEAD_DIM * 2
//     dynamic (attn_decode and attn_decode_rope alike; memra.gpu.ops.attention.ring_bytes).
//     q: [n_tokens][n_kv * N_GQA * HEAD_DIM] f32 (roped); kcache, vcache: paged pools
//     [n_blocks][KV_BLOCK][n_kv * HEAD_DIM] f16 read through block_table [n_rows][max_blocks]
//     (kv.cuh), n_kv = n_head / qpk; part_o: [n_tokens][n_head][S][HEAD_DIM] f32;
//     part_ml: [n_tokens][n_head][S][2] f32 (m, l).
//   attn_combine: grid (n_head, n_tokens), block (min(HEAD_DIM, 256)); out:
//     [n_tokens][n_head * HEAD_DIM] f32.
//   attn_decode: as attn_split, S <= MAX_SPLITS (default 256); counters [n_tokens][n_head / N_GQA]
//     int zeroed once; out as attn_combine; xq [n_tokens][n_head * HEAD_DIM] int8 and xs
//     [n_tokens][n_head * HEAD_DIM / 32] Q8Scale, or null.
// attn_decode_rope: rope.cu's rope_norm_kv and attn_decode in one launch (decode only; see
//   the kernel).
// PDL: attn_decode reads pos before its wait (written two or more launches back, see
//   common.cuh) so empty splits leave at once; everything else waits, except with ATT_EARLY
//   (attn_decode_rope, ring only): the K/V rows below the row's own position, which earlier
//   steps wrote (a decode row's sequence gets no other key in its step), are copied into the
//   ring before the wait.
//
// Variant history (H200, µs a layer in the decode graph; research/gpu-engine-breakdown-*,
// research/attn-probe-*):
//   v1  one block per KV head and split, K/V loaded a row per loop step, key groups summed
//       in KG barrier rounds, q8 twin re-read from global: at a 12-token context 8B 6.75,
//       SmolLM2 5.79, Gemma-3 12.5.
//   v2  8 K/V rows loaded before use, key groups summed in one pass: at 64 tokens 8B 10.2,
//       1B 7.2, Gemma-3 15.5 (the tile loops still ran to the tile's end).
//   v3  loops stop at the last key, 8 warps from head 128, splits of >= ATT_MIN_CHUNK
//       keys, the first V rows loaded with the K rows, q8 twin by 8-lane groups, pos read
//       before the PDL wait: 8B 6.1, 1B 5.2, Gemma-3 8.4.
//   v4  blocks of N_GQA (heads_per_block) query heads, bit-neutral: Gemma-3 (one KV head)
//       4.4 at hpb 1 against 6.9 with the whole group; 8B 3.5 vs 3.9 (hpb 1 vs 2), but 22.9
//       vs 15.4 at 4096 keys.
//   v5  attn_decode_rope: RoPE and the KV append folded in at decode (one launch
//       less a layer): 1B 4.6 against 4.1 + 1.2 for attention + rope_norm_kv; tg128 1B
//       1892 -> 1919 t/s, SmolLM2 shape 2047 -> 2116, 8B Q4_K_M 474 -> 481, Gemma-3 shape
//       within noise (research/bench-fused-h200-2026-11-30-aea1c24.jsonl).
//   v6  the paged KV cache: K/V rows addressed through a per-sequence block table
//       (kv.cuh's kv_slot, one table lookup per key row loaded); the split layout and every
//       float operation unchanged, so a token's bits equal v5's.
//   v7  ATT_RING (attn_ring.cuh): split_body's K/V tiles staged by cp.async into a ring of
//       ATT_RING tiles in shared memory, the block-table entries looked up a tile ahead, the
//       key-group sums' red in the ring after the loop; every float operation unchanged (120 of
//       120 device cases bit-identical to v6; research/2026-12-02-session17 section 3). 8B
//       (8 warps, one head a block, 9 splits) 29.1 -> 25.4 µs at 4,096 keys, 90.2 -> 76.9 at
//       16,384; 1B 1.16-1.31x, SmolLM2 1.08-1.22x there; within +-2 % at 64-1,024 keys; 3 stages
//       no better (2 blocks an SM at head 128). Predicted 19-22 µs at 4,096: missed, the tile's
//       compute and barriers bound it once the loads are in flight.
//   v8  (ATT_EARLY 1, the default since session 23; 0 is v7's code) ATT_EARLY:
//       attn_decode_rope issues the ring prologue (block-table lookups and cp.async of the first
//       ATT_RING - 1 tiles, keys below p) before the PDL wait, and the appending warps write key
//       p's f16 row into its ring stage as well as the cache, so after the wait the block waits on
//       no global load but the QKV rows (v7: QKV rows -> append -> barrier -> table lookup ->
//       copy -> wait). The same values in the same places: bit-neutral. Measured at 1 / 64 / 128
//       keys, v7 (8 warps, tile 64, ring 2; research/2026-12-03-session22/a): 8B 5.72 / 6.91 /
//       8.71 µs, 1B 4.81 / 5.58 / 6.67, SmolLM2 4.72 / 5.40 / 6.50. Predicted -0.3 to -0.8 µs.
//       H200, v7 -> v8 in one campaign (tune/campaigns/h200-attn-early.toml, the engine's launch;
//       research/2026-12-03-session23/e), µs at 1 / 64 / 128 / 512 keys: 8B 5.75 / 6.98 / 8.69 /
//       11.18 -> 5.81 / 6.79 / 8.30 / 10.85, 1B 4.82 / 5.58 / 6.67 / 9.17 -> 4.79 / 5.23 / 6.31 /
//       8.78, SmolLM2 4.69 / 5.39 / 6.53 / 9.11 -> 4.64 / 5.09 / 6.16 / 8.58: -0.2 to -0.5 µs
//       from 64 keys, as predicted; nothing at one key, where the predicted L2 round trip (key
//       p's row) was not on the critical path: the fixed ~3 µs over a RMSNorm launch is not in
//       the loads (ncu at one key, SmolLM2: 82 instructions a warp, 19.6 cycles each, 5,575
//       cycles elapsed: the warps live for under a third of the kernel's duration).
//   v9  with one non-empty split (short contexts), the q8 twin is quantized from the
//       output values in registers, a warp a block of 32 (q8_quantize_warp: the same max,
//       divisions and integer sum as q8_store4, bit-exact), instead of staging the row in shared
//       memory and quantizing it after a barrier; the merge path keeps v8's staged twin. H200,
//       PDL, µs a launch at 1 / 64 keys (experiments/attn_fixed arm twinreg,
//       research/2026-12-04-session26): 8B 3.87 / 4.50 -> 3.80 / 4.41, 1B 3.55 / 3.79 -> 3.21 /
//       3.47, SmolLM2 3.51 / 3.75 -> 3.17 / 3.41 (predicted -0.2 to -0.4 at head 64); tg128 in the
//       engine, alternating arms: SmolLM2 shape +2.4 %, 1B +1.7 %, Gemma-3 shape +1.3 %, 8B Q4_K_M
//       +0.8 %, 64 greedy ids of the 1B identical.
//   v10 attn_decode's merge loads ATT_MERGE_MJ (default 16) splits of every output of a thread
//       before the first fma, then the same fma chain in the same order (v9: ptxas unrolled the split loop
//       by 4, one output after another: the 8B at 4,096 keys waited on 16 L2 round trips, 32 splits x 2
//       outputs a thread). Bit-neutral (the same operations and operands in the same order). H200, a
//       launch in a graph, µs at 4,096 keys (experiments/attn_merge, research/2026-12-04-session29 e/, the
//       outputs bit for bit the same): 8B 20.61 -> 18.25, 1B 16.85 -> 13.78, SmolLM2 12.04 -> 10.88; at
//       1,024 keys -1 %, at 16,384 (8B) 41.32 -> 39.87.
//   v11 (ATT_TC 1) split_body's keys on the tensor cores (attn_tc.cuh; experiments/attn_tc): a 16-key slice of
//       every ring tile a warp (ATT_TILE = 16 ATT_WARPS) or a warp pair (ATT_TILE = 8 ATT_WARPS, each warp half the
//       output rows), S^T = K Q^T and O^T += V^T P^T by mma.sync m16n8k16 with q and p as f16 hi + lo, a slice's
//       online softmax in its warp, the slices merged in slice order; the ring's 16-byte chunks XOR-swizzled by
//       row (ldmatrix), V rows past a split's keys zero-filled. A new float order (each row's still fixed by its
//       own keys and split layout: batch-, graph- and chunk-invariant); ATT_TC 0 is v10's code and SASS.
//       H200 (research/2026-12-04-session31): attn_decode_rope at the engine's 8 warps / 64-key tiles, µs a launch,
//       v10 -> v11: 8B 6.51 -> 7.43 at 64 keys, 13.54 -> 11.54 at 1,024, 18.75 -> 14.78 at 4,096, 40.00 -> 27.94 at
//       16,384; 1B 12.76 -> 11.22, SmolLM2 11.00 -> 10.57 at 4,096. tg128 @ d4096 8B +5.2 %, 1B +4.4 %, SmolLM2
//       shape +1.5 %; at depth 0 -1.2 / -1.1 / -1.3 % (the one-tile blocks' fixed cost). A switch by the row's key
//       count (the CUDA-core body below 256 keys, one kernel) lost at depth 0 in the engine (-2.5 % on the 8B): its
//       attn_decode_rope is 8,408 SASS instructions against 6,040 / 5,528.
//   v12 (this) the row filter (ATT_ROWS / ATT_SWITCH): a row of another module's key count leaves where an empty
//       split leaves (before the PDL wait, the rope, the append, the ring and the counters), so a step launches
//       two configurations — the CUDA-core body on 32-key tiles below ATT_SWITCH keys, v11's above — and each
//       row is computed, appended and twinned by one of them (memra.gpu.plan's attention switch, a table entry
//       per shape; ATT_ROWS 0 compiles to v11's code). H100 (research/2026-12-05-session35), tg128 switch 256 vs
//       v11 alone: 8B Q4_K_M +3.4 % at depth 0 (predicted +3.1 % from session 31's H200 engine-choice arms), 0
//       at 4,096; 1B -1.2 %, SmolLM2 shape -3.5 % (head 64: the 32-key CUDA-core body is not faster there), so
//       it is on for the 8B's attention entry only.

#include "common.cuh"
#include "q8.cuh"
#include "rope.cuh"
#include "kv.cuh"
#include "smem_stage.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef N_GQA
#error "N_GQA must be defined"
#endif
#ifndef ATT_WARPS
#define ATT_WARPS 4
#endif
#ifndef ATT_TILE
#define ATT_TILE 64
#endif

#ifndef MAX_SPLITS
#define MAX_SPLITS 256
#endif
#ifndef ATT_MIN_CHUNK
#define ATT_MIN_CHUNK 128
#endif
#ifndef ATT_ROWS  // v12's row filter: 0 every row, 1 rows of < ATT_SWITCH keys, 2 rows of >= ATT_SWITCH
#define ATT_ROWS 0
#endif
#ifndef ATT_SWITCH
#define ATT_SWITCH 256
#endif
static_assert(ATT_ROWS >= 0 && ATT_ROWS <= 2 && ATT_SWITCH >= 1, "ATT_ROWS: 0, 1 or 2; ATT_SWITCH >= 1");
#ifndef ATT_MERGE_MJ  // attn_decode's merge: splits loaded before the first fma (v10)
#define ATT_MERGE_MJ 16
#endif
#ifndef ATT_EARLY
#define ATT_EARLY 1
#endif

#define NEG_INF __int_as_float(0xff800000)

constexpr int D = HEAD_DIM;
// the scale pointers through the device functions (kv.cuh's KV_SCALE_PARAMS on the kernels)
#if KV_ANY_Q8
static_assert(HEAD_DIM % 32 == 0, "a q8_0 KV cache needs HEAD_DIM % 32 == 0");
#define KV_SP , const uint16_t* __restrict__ kscale, const uint16_t* __restrict__ vscale
#define KV_SA , kscale, vscale
#else
#define KV_SP
#define KV_SA
#endif
constexpr int G = N_GQA;
constexpr int NT = ATT_WARPS * 32;
constexpr int NCH = D / 8;  // 16-byte chunks (8 halves) per K/V row
__host__ __device__ constexpr int pow2ceil(int x) { return x <= 1 ? 1 : 2 * pow2ceil((x + 1) / 2); }
constexpr int LPK = NCH >= 32 ? 32 : pow2ceil(NCH);  // lanes per key in the score phase
constexpr int CPL = (NCH + LPK - 1) / LPK;             // chunks per lane
constexpr int KPW = 32 / LPK;                          // keys per warp per step
constexpr int KG = NT / NCH;                           // key groups in the V phase
static_assert(D % 8 == 0, "HEAD_DIM must be a multiple of 8");
static_assert(NCH <= NT, "HEAD_DIM too large for ATT_WARPS");
constexpr int SSTEP = ATT_WARPS * KPW;                // keys per block step (scores)
constexpr int SITER = (ATT_TILE + SSTEP - 1) / SSTEP;  // steps per tile
constexpr int SB = SITER < 8 ? SITER : 8;              // steps whose K loads overlap
constexpr int VITER = (ATT_TILE + KG - 1) / KG;        // keys per thread per tile (V phase)
constexpr int VB = VITER < 8 ? VITER : 8;              // V rows in flight per thread
constexpr int OPT = (G * D + NT - 1) / NT;  // output values per thread in the key-group sum
// shared memory left for that sum under the 48 KB static limit, after the other arrays
// (attn_decode_rope adds its roped query heads and one K row)
constexpr int SMEM_OTHER = 4 * (G * ATT_TILE + 3 * G + G * MAX_SPLITS + G + G * D + G * D + D) + 64;
constexpr int RED_CAP = (48 * 1024 - SMEM_OTHER) / 4;
static_assert(RED_CAP >= G * D, "N_GQA * HEAD_DIM too large for the shared-memory budget");
constexpr int RED_R = KG * G * D <= RED_CAP ? KG : RED_CAP / (G * D);
#include "attn_ring.cuh"
#include "attn_tc.cuh"
#if !ATT_RING  // ATT_EARLY stages through the ring: without one it is off
#undef ATT_EARLY
#define ATT_EARLY 0
#endif

static __device__ __forceinline__ void unpack8(const uint4 u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = f16_to_f32((uint16_t)(w[i] & 0xffffu));
        f[2 * i + 1] = f16_to_f32((uint16_t)(w[i] >> 16));
    }
}

// A K / V chunk (8 values, ch: its index in the head row) of pool row `slot` as a uint4, and
// its 8 floats: f16 bits (unpack8), or q8_0 (kv.cuh: codes, scale bits; d * q exact). Inside
// split_body (kbase / vbase, row_stride, and the scale rows ksbase / vsbase, srow_stride).
#if KV_K_Q8
#define K_LD(slot, ch) kv_q8_chunk(kbase, ksbase, (slot), row_stride, srow_stride, (ch))
#define K_UNPACK kv_q8_unpack8
#else
#define K_LD(slot, ch) *(const uint4*)(kbase + (slot) * row_stride + (ch) * 8)
#define K_UNPACK unpack8
#endif
#if KV_V_Q8
#define V_LD(slot, ch) kv_q8_chunk(vbase, vsbase, (slot), row_stride, srow_stride, (ch))
#define V_UNPACK kv_q8_unpack8
#else
#define V_LD(slot, ch) *(const uint4*)(vbase + (slot) * row_stride + (ch) * 8)
#define V_UNPACK unpack8
#endif

#if KV_ANY_Q8
// kv_q8_ld8 of pool row `slot` (the table lookup evaluated once for both planes)
static __device__ __forceinline__ uint4 kv_q8_chunk(const int8_t* __restrict__ base, const uint16_t* __restrict__ sbase,
                                                    size_t slot, size_t row_stride, size_t srow_stride, int ch) {
    return kv_q8_ld8(base + slot * row_stride, sbase + slot * srow_stride, ch);
}
#endif

// The keys of token t: [lo, lo + n); the splits: `chunk` keys each, `n_active` non-empty.
struct KeyRange { int lo, n, chunk, n_active; };

static __device__ __forceinline__ KeyRange key_range(int p, int window, int S) {
    KeyRange r;
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 1
    const int hi = p;  // kernel-check canary: the token does not see itself
#else
    const int hi = p + 1;
#endif
    r.lo = window > 0 ? max(0, hi - window) : 0;
    r.n = hi - r.lo;
    int chunk = (r.n + S - 1) / S;
    r.chunk = max(ATT_MIN_CHUNK, (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE);
    r.n_active = r.chunk > 0 ? (r.n + r.chunk - 1) / r.chunk : 0;
    return r;
}

// One block's split: writes its partial (o, m, l) for the G heads of its KV head.
static __device__ __forceinline__ void split_body(
    const float* __restrict__ q, const kv_k_t* __restrict__ kcache,
    const kv_v_t* __restrict__ vcache KV_SP, float* __restrict__ part_o, float* __restrict__ part_ml,
    const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ block_table,
    int max_blocks, int n_kv, int qpk, int window, float scale, float softcap, float* __restrict__ out_direct,
    int8_t* tw_q, Q8Scale* tw_s, const float* qsm = nullptr, const int* pre_blk = nullptr) {
    __shared__ float sc[G][ATT_TILE];
    __shared__ float m_s[G], l_s[G], alpha_s[G];
    RING_RED;

    const int hb = blockIdx.x, split = blockIdx.y, t = blockIdx.z, S = gridDim.y;
    const int n_head = gridDim.x * G;
    const int kvh = hb * G / qpk;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int p = pos[t];
    const int s = seq ? seq[t] : 0;
    const KeyRange kr = key_range(p, window, S);
    const int k0 = kr.lo + split * kr.chunk;
    const int k1 = min(kr.lo + kr.n, k0 + kr.chunk);
    const size_t part0 = ((size_t)t * n_head + (size_t)hb * G) * S + split;  // head g: + g * S

    if (k0 >= k1) {
        for (int i = tid; i < G * D; i += NT) part_o[(part0 + (size_t)(i / D) * S) * D + i % D] = 0.f;
        if (tid < G) {
            part_ml[(part0 + (size_t)tid * S) * 2] = NEG_INF;
            part_ml[(part0 + (size_t)tid * S) * 2 + 1] = 0.f;
        }
        return;
    }

    const size_t row_stride = (size_t)n_kv * D;
    const kv_k_t* kbase = kcache + (size_t)kvh * D;  // + kv_slot(bt, key) * row_stride
    const kv_v_t* vbase = vcache + (size_t)kvh * D;
#if KV_ANY_Q8
    const size_t srow_stride = row_stride / 32;  // the scale planes' row: one f16 per 32 values
#endif
#if KV_K_Q8
    const uint16_t* ksbase = kscale + (size_t)kvh * D / 32;
#endif
#if KV_V_Q8
    const uint16_t* vsbase = vscale + (size_t)kvh * D / 32;
#endif
    const int* bt = block_table + (size_t)s * max_blocks;
    RING_PROLOGUE;

#if ATT_TC
    // ATT_TC 1: every row on the tensor cores; 2: a row of ATT_TC_MIN keys or more (its own count, so the choice
    // is the row's alone: batch- and chunk-invariant), shorter rows on the CUDA-core body below
    float tot[OPT];
    if (ATT_TC == 1 || kr.n >= ATT_TC_MIN) {
    // ATT_TC (tc_body.cuh): lane (gid, tig); the scores' B fragments of Q for k-step ks: dims 16 ks + 2 tig
    // (+1) and + 8, head gid (zero past G)
    const int gid = lane >> 2, tig = lane & 3;
    uint32_t qh[TC_KS][2], ql[TC_KS][2];
#pragma unroll
    for (int ks = 0; ks < TC_KS; ks++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int d = 16 * ks + 8 * hf + 2 * tig;
            float x0 = 0.f, x1 = 0.f;
            if (gid < G) {
                const float* qrow = qsm ? qsm + gid * D : q + (size_t)t * n_head * D + (size_t)(hb * G + gid) * D;
                x0 = qrow[d];
                x1 = qrow[d + 1];
            }
            tc_split(x0, x1, qh[ks][hf], ql[ks][hf]);
        }
    // this warp's softmax state for heads 2 tig and 2 tig + 1 (the same in every gid) and its O^T tiles:
    // oacc[mt] = (dim 16 (mt0 + mt) + gid: heads 2 tig, 2 tig + 1; dim 16 (mt0 + mt) + gid + 8: the same heads)
    float om[2] = {NEG_INF, NEG_INF}, ol[2] = {0.f, 0.f};
    float oacc[TC_MT][4];
    const int slice = warp % TC_SL, mt0 = (warp / TC_SL) * TC_MT;  // this warp's keys and output rows
#pragma unroll
    for (int mt = 0; mt < TC_MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[mt][e] = 0.f;
    const int r0 = 16 * slice;  // this warp's first row of every tile
    for (int tile0 = k0; tile0 < k1; tile0 += ATT_TILE) {
        const int nt = min(ATT_TILE, k1 - tile0);
        RING_TILE_HEAD;
        if (r0 < nt) {  // warp-uniform
            float s[4] = {0.f, 0.f, 0.f, 0.f};
            const uint32_t kb = smem_u32(r_k), vb = smem_u32(r_v);
#pragma unroll
            for (int ks = 0; ks < TC_KS; ks++) {
                const int row = r0 + (lane & 15), ch = 2 * ks + (lane >> 4);
                uint32_t a[4];
                ldsm4(a, kb + (uint32_t)(row * D + ((ch ^ RING_SWZ(row)) << 3)) * 2u);
                tc_mma(s, a, qh[ks][0], qh[ks][1]);
                tc_mma(s, a, ql[ks][0], ql[ks][1]);
            }
            // s: keys r0 + gid (s[0], s[1]) and r0 + gid + 8 (s[2], s[3]), heads 2 tig and 2 tig + 1
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[e] * scale;
                if (softcap > 0.f) v = softcap * tanhf(v / softcap);
                s[e] = r0 + gid + (e >> 1) * 8 < nt ? v : NEG_INF;
            }
            float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], o));
            float al[2], mn[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                mn[j] = fmaxf(om[j], mx[j]);
                al[j] = mn[j] == NEG_INF ? 1.f : expf(om[j] - mn[j]);
            }
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) p[e] = mn[e & 1] == NEG_INF ? 0.f : expf(s[e] - mn[e & 1]);
            float ps[2] = {p[0] + p[2], p[1] + p[3]};
#pragma unroll
            for (int j = 0; j < 2; j++) {
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) ps[j] += __shfl_xor_sync(0xffffffffu, ps[j], o);
                ol[j] = ol[j] * al[j] + ps[j];
                om[j] = mn[j];
            }
            // P^T's B fragments: keys 2 tig (+1) and 2 tig + 8 (+9), head gid
            uint32_t x0h, x0l, x1h, x1l;
            tc_split(p[0], p[1], x0h, x0l);
            tc_split(p[2], p[3], x1h, x1l);
            const uint32_t bh0 = tc_trans(x0h), bh1 = tc_trans(x1h), bl0 = tc_trans(x0l), bl1 = tc_trans(x1l);
#pragma unroll
            for (int mt = 0; mt < TC_MT; mt++) {
                oacc[mt][0] *= al[0];
                oacc[mt][1] *= al[1];
                oacc[mt][2] *= al[0];
                oacc[mt][3] *= al[1];
                const int row = r0 + (lane & 7) + ((lane >> 4) << 3), ch = 2 * (mt0 + mt) + ((lane >> 3) & 1);
                uint32_t a[4];
                tc_ldsm4t(a, vb + (uint32_t)(row * D + ((ch ^ RING_SWZ(row)) << 3)) * 2u);
                tc_mma(oacc[mt], a, bh0, bh1);
                tc_mma(oacc[mt], a, bl0, bl1);
            }
        }
        RING_TILE_TAIL;
    }
    RING_AFTER_LOOP;
    // the slices merged in slice order: M = max_c m_c, o = sum_c exp(m_c - M) o_c, l = sum_c exp(m_c - M) l_c
    __shared__ float tc_m[TC_SL][8], tc_l[TC_SL][8];
    float* tc_o = reinterpret_cast<float*>(attn_ring_smem);  // [TC_SL][8][D]
    if (gid == 0 && mt0 == 0) {  // a pair's two warps hold the same (m, l)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            tc_m[slice][2 * tig + j] = om[j];
            tc_l[slice][2 * tig + j] = ol[j];
        }
    }
#pragma unroll
    for (int mt = 0; mt < TC_MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            tc_o[(slice * 8 + 2 * tig + (e & 1)) * D + 16 * (mt0 + mt) + gid + (e >> 1) * 8] = oacc[mt][e];
    __syncthreads();
#pragma unroll
    for (int o = 0; o < OPT; o++) {
        const int i = tid + o * NT;
        tot[o] = 0.f;
        if (i < G * D) {
            const int h = i / D, d = i % D;
            float M = NEG_INF;
#pragma unroll
            for (int c = 0; c < TC_SL; c++) M = fmaxf(M, tc_m[c][h]);
#pragma unroll
            for (int c = 0; c < TC_SL; c++) tot[o] += expf(tc_m[c][h] - M) * tc_o[(c * 8 + h) * D + d];
        }
    }
    if (tid < G) {
        float M = NEG_INF, l = 0.f;
#pragma unroll
        for (int c = 0; c < TC_SL; c++) M = fmaxf(M, tc_m[c][tid]);
#pragma unroll
        for (int c = 0; c < TC_SL; c++) l += expf(tc_m[c][tid] - M) * tc_l[c][tid];
        m_s[tid] = M;
        l_s[tid] = l;
    }
    __syncthreads();
    } else {
#endif
    // this lane's 16-byte chunks of every query head
    const int sl = lane % LPK, ks = lane / LPK;
    float qr[G][CPL][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            int ch = c * LPK + sl;
#pragma unroll
            for (int e = 0; e < 8; e++)
                qr[g][c][e] = ch >= NCH ? 0.f
                              : qsm ? qsm[g * D + ch * 8 + e]  // roped by this block (attn_decode_rope)
                                    : q[(size_t)t * n_head * D + (size_t)(hb * G + g) * D + ch * 8 + e];
        }

    if (tid < G) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.f;
    }
    // V phase roles: chunk vc of the row, key group kg
    const int vc = tid % NCH, kg = tid / NCH;
    const bool v_active = kg < KG;
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
    __syncthreads();

    for (int tile0 = k0; tile0 < k1; tile0 += ATT_TILE) {
        const int nt = min(ATT_TILE, k1 - tile0);
        RING_TILE_HEAD;
        // this thread's first VB V rows of the tile, loaded with the K rows: their latency
        // overlaps the scores and the softmax
        uint4 vpre[VB];
#pragma unroll
        for (int i = 0; i < (ATT_RING ? 0 : VB); i++) {
            const int k = kg + i * KG;
            vpre[i] = (v_active && i < VITER && k < nt)
                          ? V_SRC(k, vc)
                          : make_uint4(0u, 0u, 0u, 0u);
        }
        // scores: LPK lanes per key, KPW keys per warp step; the K rows of SB steps are
        // loaded before any is used, so SB loads per lane are in flight at once
        for (int i0 = 0; i0 < SITER; i0 += SB) {
            if (i0 * SSTEP >= nt) break;  // the rest of the tile is past the keys (block-uniform)
            uint4 kraw[SB][CPL];
#pragma unroll
            for (int i = 0; i < SB; i++) {
                const int key = (i0 + i) * SSTEP + warp * KPW + ks;
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    const int ch = c * LPK + sl;
                    kraw[i][c] = (i0 + i < SITER && key < nt && ch < NCH)
                                     ? K_SRC(key, ch)
                                     : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int i = 0; i < SB; i++) {
                if (i0 + i >= SITER || (i0 + i) * SSTEP + warp * KPW >= nt) break;  // warp-uniform
                const int key = (i0 + i) * SSTEP + warp * KPW + ks;
                const bool valid = key < nt;
                float dot[G];
#pragma unroll
                for (int g = 0; g < G; g++) dot[g] = 0.f;
                if (valid) {
#pragma unroll
                    for (int c = 0; c < CPL; c++) {
                        const int ch = c * LPK + sl;
                        if (ch < NCH) {
                            float kf[8];
                            K_UNPACK(kraw[i][c], kf);
#pragma unroll
                            for (int g = 0; g < G; g++)
#pragma unroll
                                for (int e = 0; e < 8; e++) dot[g] = fmaf(qr[g][c][e], kf[e], dot[g]);
                        }
                    }
                }
#pragma unroll
                for (int g = 0; g < G; g++) {
#pragma unroll
                    for (int o = LPK / 2; o > 0; o >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
                }
                if (valid && sl == 0) {
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float v = dot[g] * scale;
                        if (softcap > 0.f) v = softcap * tanhf(v / softcap);
                        sc[g][key] = v;
                    }
                }
            }
        }
        __syncthreads();
        // online softmax, one warp per head
        for (int g = warp; g < G; g += ATT_WARPS) {
            float mx = NEG_INF;
            for (int k = lane; k < nt; k += 32) mx = fmaxf(mx, sc[g][k]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int k = lane; k < nt; k += 32) {
                float e = expf(sc[g][k] - m_new);
                sc[g][k] = e;
                sum += e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                float alpha = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
                alpha_s[g] = alpha;
                l_s[g] = l_s[g] * alpha + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
        if (v_active) {
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = alpha_s[g];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] *= a;
            }
            // keys kg, kg + KG, ... in that order; VB rows loaded before any is used
            for (int i0 = 0; i0 < VITER; i0 += VB) {
                if (kg + i0 * KG >= nt) break;
                uint4 vraw[VB];
#pragma unroll
                for (int i = 0; i < VB; i++) {
                    const int k = kg + (i0 + i) * KG;
                    vraw[i] = i0 == 0 && !ATT_RING ? vpre[i]
                              : (i0 + i < VITER && k < nt)
                                  ? V_SRC(k, vc)
                                  : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int i = 0; i < VB; i++) {
                    const int k = kg + (i0 + i) * KG;
                    if (i0 + i < VITER && k < nt) {
                        float vf[8];
                        V_UNPACK(vraw[i], vf);
#pragma unroll
                        for (int g = 0; g < G; g++) {
                            float pk = sc[g][k];
#pragma unroll
                            for (int e = 0; e < 8; e++) acc[g][e] = fmaf(pk, vf[e], acc[g][e]);
                        }
                    }
                }
            }
        }
        RING_TILE_TAIL;
    }
    RING_AFTER_LOOP;

    // sum the key groups in a fixed order: output i = ((0 + acc_0) + acc_1) + ... over the
    // KG groups, RED_R groups staged in shared memory per pass (one pass when they fit)
#if !ATT_TC  // ATT_TC: declared before the two bodies
    float tot[OPT];
#endif
#pragma unroll
    for (int o = 0; o < OPT; o++) tot[o] = 0.f;
    for (int r0 = 0; r0 < KG; r0 += RED_R) {
        if (v_active && kg >= r0 && kg < r0 + RED_R) {
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int e = 0; e < 8; e++) red[kg - r0][g * D + vc * 8 + e] = acc[g][e];
        }
        __syncthreads();
        const int nr = min(RED_R, KG - r0);
#pragma unroll
        for (int o = 0; o < OPT; o++) {
            const int i = tid + o * NT;
            if (i < G * D)
                for (int r = 0; r < nr; r++) tot[o] += red[r][i];
        }
        __syncthreads();
    }
#if ATT_TC
    }  // ATT_TC
#endif
    if (out_direct) {
        // The only non-empty split: the merge would weigh it by expf(m - m) = 1 and divide
        // by 1 * l, so writing o * (1 / l) here gives the merge's bits without the partials'
        // round trip through global memory, the fence and the counter. Thread i holds output
        // i and G * D and NT are multiples of 32, so each warp holds whole q8 blocks of the
        // row and quantizes its q8 twin (tw_q / tw_s, or null) from registers.
        float* orow = out_direct + (size_t)t * n_head * D + (size_t)hb * G * D;
#pragma unroll
        for (int o = 0; o < OPT; o++) {
            const int i = tid + o * NT;
            if (i < G * D) {
                const float v = tot[o] * (1.0f / l_s[i / D]);
                orow[i] = v;
                if (tw_q) q8_quantize_warp(v, tw_q + (i & ~31), tw_s + i / 32);
            }
        }
        return;
    }
#pragma unroll
    for (int o = 0; o < OPT; o++) {
        const int i = tid + o * NT;
        if (i < G * D) part_o[(part0 + (size_t)(i / D) * S) * D + i % D] = tot[o];
    }
    if (tid < G) {
        part_ml[(part0 + (size_t)tid * S) * 2] = m_s[tid];
        part_ml[(part0 + (size_t)tid * S) * 2 + 1] = l_s[tid];
    }
}

extern "C" __global__ void __launch_bounds__(NT)
    attn_split(const float* __restrict__ q, const kv_k_t* __restrict__ kcache,
               const kv_v_t* __restrict__ vcache, float* __restrict__ part_o,
               float* __restrict__ part_ml, const int* __restrict__ pos,
               const int* __restrict__ seq, const int* __restrict__ block_table, int max_blocks, int n_kv,
               int qpk, int window, float scale, float softcap KV_SCALE_PARAMS) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
               softcap, nullptr, nullptr, nullptr);
}

// The body of attn_decode after the PDL wait (n_act: the token's non-empty splits, this
// block among them); qsm: the block's roped query heads in shared memory, or null (q).
static __device__ __forceinline__ void decode_body(
    const float* __restrict__ q, const kv_k_t* __restrict__ kcache, const kv_v_t* __restrict__ vcache KV_SP,
    float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counters, float* __restrict__ out,
    int8_t* __restrict__ xq, Q8Scale* __restrict__ xs, const int* __restrict__ pos, const int* __restrict__ seq,
    const int* __restrict__ block_table, int max_blocks, int n_kv, int qpk, int window, float scale,
    float softcap, int n_act, const float* qsm, const int* pre_blk = nullptr) {
    __shared__ float w_s[G][MAX_SPLITS];
    __shared__ float inv_den[G];
    __shared__ int s_last;
    __shared__ __align__(16) float ob[G * D];  // the merged output row, staged for its q8 twin
    const int hb = blockIdx.x, t = blockIdx.z, S = gridDim.y;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_head = gridDim.x * G;
    float* orow = out + (size_t)t * n_head * D + (size_t)hb * G * D;
    int8_t* q8 = xq ? xq + (size_t)t * n_head * D + (size_t)hb * G * D : nullptr;
    Q8Scale* s8 = xq ? xs + ((size_t)t * n_head * D + (size_t)hb * G * D) / 32 : nullptr;
    if (n_act == 1) {  // short context: one block holds every key, no merge (counter untouched)
        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, out, q8, s8, qsm, pre_blk);
    } else {
        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, nullptr, nullptr, nullptr, qsm, pre_blk);

        __threadfence();  // this block's partial, visible device-wide before it is counted
        __syncthreads();
        if (tid == 0) s_last = atomicAdd(&counters[t * gridDim.x + hb], 1) == n_act - 1;
        __syncthreads();
        if (!s_last) return;
        __threadfence();

        const size_t base = ((size_t)t * n_head + (size_t)hb * G) * S;  // head g: + g * S
        for (int g = warp; g < G; g += ATT_WARPS) {
            const float* ml = part_ml + (base + (size_t)g * S) * 2;
            float M = NEG_INF;
            for (int j = lane; j < n_act; j += 32) M = fmaxf(M, __ldcg(ml + 2 * j));
            M = warp_max(M);
            float den = 0.f;
            for (int j = lane; j < n_act; j += 32) {
                float w = expf(__ldcg(ml + 2 * j) - M);
                w_s[g][j] = w;
                den += w * __ldcg(ml + 2 * j + 1);
            }
            den = warp_sum(den);
            if (lane == 0) inv_den[g] = 1.0f / den;
        }
        __syncthreads();
        {
            constexpr int MO = (G * D + NT - 1) / NT;  // outputs a thread: i = tid + o * NT
            float num[MO];
#pragma unroll
            for (int o = 0; o < MO; o++) num[o] = 0.f;
            for (int j0 = 0; j0 < n_act; j0 += ATT_MERGE_MJ) {
                float v[MO][ATT_MERGE_MJ];  // every load of the round issued before the first fma
#pragma unroll
                for (int o = 0; o < MO; o++) {  // unconditional loads (indices clamped): all issued at once
                    const int i = min(tid + o * NT, G * D - 1);
                    const float* po = part_o + (base + (size_t)(i / D) * S) * D + i % D;
#pragma unroll
                    for (int jj = 0; jj < ATT_MERGE_MJ; jj++) v[o][jj] = __ldcg(po + (size_t)min(j0 + jj, n_act - 1) * D);
                }
#pragma unroll
                for (int o = 0; o < MO; o++) {
                    const int i = tid + o * NT;
#pragma unroll
                    for (int jj = 0; jj < ATT_MERGE_MJ; jj++)
                        if (i < G * D && j0 + jj < n_act) num[o] += w_s[i / D][j0 + jj] * v[o][jj];
                }
            }
#pragma unroll
            for (int o = 0; o < MO; o++) {
                const int i = tid + o * NT;
                if (i < G * D) {
                    orow[i] = num[o] * inv_den[i / D];
                    ob[i] = num[o] * inv_den[i / D];
                }
            }
        }
        if (tid == 0) counters[t * gridDim.x + hb] = 0;
        if (q8) {  // from the block's staged copy of the merged row, 8 lanes per block of 32
            __syncthreads();
            for (int i0 = 0; i0 < G * D / 4; i0 += NT) {  // uniform trip count: every lane shuffles
                const int i4 = i0 + tid;
                const bool active = i4 < G * D / 4;
                q8_store4(active ? reinterpret_cast<const float4*>(ob)[i4] : make_float4(0.f, 0.f, 0.f, 0.f),
                          active, i4, q8, s8);
            }
        }
    }
}


// attn_decode: attn_split for the non-empty splits only (the others leave at once: at a
// short context nearly all are empty), then the last of the n_active blocks of each
// (token, KV head) to finish merges their partials for its G heads, in split order (it
// does not depend on which block came last), and writes out, plus its q8 twin when xq is
// non-null (HEAD_DIM % 32 == 0). counters: [n_tokens][n_kv] int, zero before the launch;
// the last block puts its counter back to zero, so the buffer stays ready for the next
// launch and graph replay.
extern "C" __global__ void RING_LB
    attn_decode(const float* __restrict__ q, const kv_k_t* __restrict__ kcache,
                const kv_v_t* __restrict__ vcache, float* __restrict__ part_o,
                float* __restrict__ part_ml, int* __restrict__ counters, float* __restrict__ out,
                int8_t* __restrict__ xq, Q8Scale* __restrict__ xs, const int* __restrict__ pos,
                const int* __restrict__ seq, const int* __restrict__ block_table, int max_blocks, int n_kv,
                int qpk, int window, float scale, float softcap KV_SCALE_PARAMS) {
    const int t = blockIdx.z, S = gridDim.y;
    // pos is written two or more launches back (common.cuh: safe before the wait), so an
    // empty split leaves without waiting: nothing to add, nothing to count
    const int n_act = key_range(pos[t], window, S).n_active;
    if ((int)blockIdx.y >= n_act) return;
#if ATT_ROWS
    // v12: the other module's row (its own key count against ATT_SWITCH) leaves here too
    if ((ATT_ROWS == 1) == (key_range(pos[t], window, S).n >= ATT_SWITCH)) return;
#endif
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    decode_body(q, kcache, vcache KV_SA, part_o, part_ml, counters, out, xq, xs, pos, seq, block_table, max_blocks, n_kv,
                qpk, window, scale, softcap, n_act, nullptr);
}

// attn_decode_rope: rope_norm_kv (rope.cu) and attn_decode in one launch, for decode rows
// whose sequences differ (each row appends one key to its own sequence). Every non-empty
// split block ropes its own query heads into shared memory; the blocks holding a row's
// last key (its last split) also rope and append that row's K and V (blocks of one KV head
// write the same bits), then read them back like any other key. The arithmetic is
// rope.cuh's and split_body's, so the result equals the two launches bit for bit (checked
// by kernel-check). q_raw/k_raw/v_raw: the QKV matvec's rows (strides q_stride, k_stride,
// v_stride floats); bias, q_norm_w, k_norm_w, cs, cs_rows, rope_dim, neox, eps: as
// rope_norm_kv; the rest as attn_decode.
extern "C" __global__ void RING_LB
    attn_decode_rope(const float* __restrict__ q_raw, const float* __restrict__ k_raw,
                     const float* __restrict__ v_raw, int q_stride, int k_stride, int v_stride,
                     const float* __restrict__ bias, const float* __restrict__ q_norm_w,
                     const float* __restrict__ k_norm_w, const float2* __restrict__ cs, int cs_rows,
                     int rope_dim, int neox, float eps, kv_k_t* __restrict__ kcache,
                     kv_v_t* __restrict__ vcache, float* __restrict__ part_o, float* __restrict__ part_ml,
                     int* __restrict__ counters, float* __restrict__ out, int8_t* __restrict__ xq,
                     Q8Scale* __restrict__ xs, const int* __restrict__ pos, const int* __restrict__ seq,
                     const int* __restrict__ block_table, int max_blocks, int n_kv, int qpk, int window,
                     float scale, float softcap KV_SCALE_PARAMS) {
    __shared__ __align__(16) float qsm[G * D];
    __shared__ float kvb[D];
    const int hb = blockIdx.x, t = blockIdx.z, S = gridDim.y;
    const int warp = threadIdx.x / 32;
    const int p = pos[t];
    const int n_act = key_range(p, window, S).n_active;
    if ((int)blockIdx.y >= n_act) return;
#if ATT_ROWS
    // v12: the other module's row (its own key count against ATT_SWITCH) leaves here too
    if ((ATT_ROWS == 1) == (key_range(p, window, S).n >= ATT_SWITCH)) return;
#endif
    const int n_head = gridDim.x * G, kvh = hb * G / qpk;
    // the block table is written by the host only: readable before the wait
    const int* bt = block_table + (size_t)(seq ? seq[t] : 0) * max_blocks;
    const bool appends = (int)blockIdx.y == n_act - 1 && kv_writable(bt, max_blocks, p);
    // constants before the wait: this lane's cos/sin pairs and norm weights (Q; K on the
    // warp that ropes the key)
    RopeLane rq, rk;
    rope_lane_load(rq, cs, cs_rows, p, rope_dim, q_norm_w);
    rope_lane_load(rk, cs, cs_rows, p, rope_dim, k_norm_w);
#if ATT_EARLY
    // ATT_EARLY: the ring's first ATT_RING - 1 tiles of this block's keys below p, written by
    // earlier steps (a decode row's sequence gets no other key in this step), copied before the
    // wait; key p's row goes into its stage from the append below, not back through the cache
    const KeyRange e_kr = key_range(p, window, S);
    const int e_k0 = e_kr.lo + (int)blockIdx.y * e_kr.chunk, e_k1 = min(e_kr.lo + e_kr.n, e_k0 + e_kr.chunk);
    const int e_row = threadIdx.x / NCH, e_ch = threadIdx.x % NCH;
    const size_t e_stride = (size_t)n_kv * D;
    int e_blk[RPT] = {};
    ring_prologue(bt, kcache + (size_t)kvh * D, vcache + (size_t)kvh * D, e_stride, e_k0, e_k1, min(e_k1, p), e_row,
                  e_ch, e_blk);
    // key p's place in the ring: stage e_pr / ATT_TILE, row e_pr % ATT_TILE, when it is in the
    // prologue's tiles (e_pr < 0: another tile or split, loaded as before)
    const int e_pr = (p >= e_k0 && p < e_k1 && p - e_k0 < (ATT_RING - 1) * ATT_TILE) ? p - e_k0 : -1;
    uint16_t* e_ks = e_pr >= 0 ? attn_ring_smem + (e_pr / ATT_TILE) * RING_STAGE + (e_pr % ATT_TILE) * D : nullptr;
#endif
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    for (int g = warp; g < G; g += ATT_WARPS) {
        const int h = hb * G + g;
        rope_head(q_raw + (size_t)t * q_stride + (size_t)h * D, bias ? bias + (size_t)h * D : nullptr,
                  q_norm_w != nullptr, rq, eps, rope_dim, neox, qsm + g * D);
    }
    if (appends) {
        const size_t row = kv_slot(bt, p) * (size_t)(n_kv * D) + (size_t)kvh * D;
#if KV_ANY_Q8
        const size_t srow = row / 32;  // the scale planes' entry of the row's first group
#endif
        if (warp == ATT_WARPS - 1) {
            rope_head(k_raw + (size_t)t * k_stride + (size_t)kvh * D,
                      bias ? bias + (size_t)(n_head + kvh) * D : nullptr, k_norm_w != nullptr, rk, eps, rope_dim,
                      neox, kvb);
#if KV_K_Q8
            kv_q8_store_row(kvb, nullptr, D, kcache + row, kscale + srow);
#else
            for (int d = threadIdx.x % 32; d < D; d += 32) {
                const uint16_t h = f32_to_f16(kvb[d]);
                kcache[row + d] = h;
#if ATT_EARLY
                if (e_ks) e_ks[RING_COL(e_pr % ATT_TILE, d)] = h;  // the same bits as the ring's copy of the cache row
#endif
            }
#endif
        }
        if (warp == (ATT_WARPS >= 2 ? ATT_WARPS - 2 : 0))
#if KV_V_Q8
            kv_q8_store_row(v_raw + (size_t)t * v_stride + (size_t)kvh * D,
                            bias ? bias + (size_t)(n_head + n_kv + kvh) * D : nullptr, D, vcache + row, vscale + srow);
#else
        {
            const float* vsrc = v_raw + (size_t)t * v_stride + (size_t)kvh * D;
            const float* vb = bias ? bias + (size_t)(n_head + n_kv + kvh) * D : nullptr;
            v_append(vsrc, vb, vcache + row);
#if ATT_EARLY
            if (e_ks)  // rope.cuh's v_append value again, into the ring stage's V row
                for (int d = threadIdx.x % 32; d < D; d += 32)
                    e_ks[ATT_TILE * D + RING_COL(e_pr % ATT_TILE, d)] = f32_to_f16(vb ? __fadd_rn(vsrc[d], vb[d]) : vsrc[d]);
#endif
        }
#endif
    }
#if ATT_EARLY
    else if (e_ks) {  // key p not appended here (its table entry unmapped): its cache row, as before
#pragma unroll
        for (int j = 0; j < RPT; j++)
            if (e_row + j * RSTEP == e_pr % ATT_TILE) {
                const size_t off = kv_slot(bt, p) * e_stride + (size_t)kvh * D + e_ch * 8;
                cp16(smem_u32(e_ks + ((e_ch ^ RING_SWZ(e_pr % ATT_TILE)) << 3)), kcache + off);
                cp16(smem_u32(e_ks + ATT_TILE * D + ((e_ch ^ RING_SWZ(e_pr % ATT_TILE)) << 3)), vcache + off);
            }
        cp_commit();
        cp_wait<0>();
    }
#endif
    __syncthreads();  // q in shared memory; the appended K/V rows visible to the block
    decode_body(nullptr, kcache, vcache KV_SA, part_o, part_ml, counters, out, xq, xs, pos, seq, block_table, max_blocks,
                n_kv, qpk, window, scale, softcap, n_act, qsm,
#if ATT_EARLY
                e_blk
#else
                nullptr
#endif
    );
}

extern "C" __global__ void attn_combine(const float* __restrict__ part_o,
                                        const float* __restrict__ part_ml,
                                        float* __restrict__ out, int n_splits) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const size_t base = ((size_t)t * n_head + h) * n_splits;
    float M = NEG_INF;
    for (int j = 0; j < n_splits; j++) M = fmaxf(M, part_ml[(base + j) * 2]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int j = 0; j < n_splits; j++) {
            float m = part_ml[(base + j) * 2];
            if (m == NEG_INF) continue;  // empty split (its o may be anything)
            float w = expf(m - M);
            den += w * part_ml[(base + j) * 2 + 1];
            num += w * part_o[(base + j) * D + d];
        }
        out[((size_t)t * n_head + h) * D + d] = num / den;
    }
}
