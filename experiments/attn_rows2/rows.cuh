// attn_prefill_rows — attn_decode's arithmetic for ATT_ROWS token rows a block (experiments/
// attn_rows2/README.md). Appended by make.py to a copy of kernels/attention.cu, so it uses that
// file's constants (G = N_GQA, D, NT, LPK, CPL, KPW, KG, SSTEP, SITER, SB, VITER, VB) and helpers
// (key_range, unpack8, kv_slot, q8_store4). A block = (row group blockIdx.x, head block
// blockIdx.y, split blockIdx.z); a group is at most ATT_ROWS consecutive rows of one sequence
// that share lo and chunk (key_range's), from groups[2 x] (first row, count). Its VH = ATT_ROWS
// x G virtual heads run split_body's code side by side: every (row, head) does split_body's
// float operations in split_body's order (the same lanes own the same chunks and keys, the
// same butterflies, the same key groups), each bounded by its own row's keys; the K/V rows of
// a tile are loaded and unpacked once for all of them. A row with one split writes out (and
// its q8 twin) itself; else its partial, and the last of its split blocks (counters [n_tokens]
// [n_head / G]) merges with decode_body's code. Grid z is the split count S (key_range's).
#ifndef ATT_ROWS
#define ATT_ROWS 2
#endif
constexpr int RW = ATT_ROWS;
constexpr int VH = RW * G;
constexpr int OPT_R = (VH * D + NT - 1) / NT;
constexpr int SMEM_R = 4 * (VH * ATT_TILE + 3 * VH + G * MAX_SPLITS + G + VH * D) + 64;
constexpr int RED_CAP_R = (48 * 1024 - SMEM_R) / 4;
static_assert(RED_CAP_R >= VH * D, "ATT_ROWS * N_GQA * HEAD_DIM too large for the shared-memory budget");
constexpr int RED_R2 = KG * VH * D <= RED_CAP_R ? KG : RED_CAP_R / (VH * D);

extern "C" __global__ void __launch_bounds__(NT)
    attn_prefill_rows(const float* __restrict__ q, const uint16_t* __restrict__ kcache,
                      const uint16_t* __restrict__ vcache, float* __restrict__ part_o, float* __restrict__ part_ml,
                      int* __restrict__ counters, float* __restrict__ out, int8_t* __restrict__ xq,
                      Q8Scale* __restrict__ xs, const int* __restrict__ pos, const int* __restrict__ seq,
                      const int* __restrict__ block_table, int max_blocks, int n_kv, int qpk, int window, float scale,
                      float softcap, const int* __restrict__ groups) {
    __shared__ float sc[VH][ATT_TILE];
    __shared__ float m_s[VH], l_s[VH], alpha_s[VH];
    __shared__ float w_s[G][MAX_SPLITS];
    __shared__ float inv_den[G];
    __shared__ __align__(16) float ob[VH * D];
    __shared__ __align__(16) float red[RED_R2][VH * D];
    __shared__ int s_last[RW];

    const int hb = blockIdx.y, split = blockIdx.z, S = gridDim.z, nhb = gridDim.y;
    const int n_head = nhb * G;
    const int kvh = hb * G / qpk;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t0 = groups[2 * blockIdx.x], cnt = groups[2 * blockIdx.x + 1];
    if (cnt <= 0) return;
    // the rows' keys (pos: two or more launches back, readable before the wait)
    int n_r[RW], nact[RW];
    int lo = 0, chunk = 0;
#pragma unroll
    for (int r = 0; r < RW; r++) {
        n_r[r] = 0;
        nact[r] = 0;
        if (r < cnt) {
            const KeyRange kr = key_range(pos[t0 + r], window, S);
            n_r[r] = kr.n;
            nact[r] = kr.n_active;
            if (r == 0) { lo = kr.lo; chunk = kr.chunk; }
        }
    }
    const int k0 = lo + split * chunk;
    int k1[RW], k1max = k0;
#pragma unroll
    for (int r = 0; r < RW; r++) {
        k1[r] = r < cnt ? min(lo + n_r[r], k0 + chunk) : k0;
        k1max = max(k1max, k1[r]);
    }
    if (k1max <= k0) return;  // no row of the group has keys in this split
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();

    const size_t row_stride = (size_t)n_kv * D;
    const uint16_t* kbase = kcache + (size_t)kvh * D;
    const uint16_t* vbase = vcache + (size_t)kvh * D;
    const int* bt = block_table + (size_t)(seq ? seq[t0] : 0) * max_blocks;

    const int sl = lane % LPK, ks = lane / LPK;
    float qr[VH][CPL][8];
#pragma unroll
    for (int v = 0; v < VH; v++)
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int ch = c * LPK + sl, r = v / G, g = v % G;
#pragma unroll
            for (int e = 0; e < 8; e++)
                qr[v][c][e] = (ch >= NCH || r >= cnt) ? 0.f
                              : q[(size_t)(t0 + r) * n_head * D + (size_t)(hb * G + g) * D + ch * 8 + e];
        }
    if (tid < VH) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.f;
    }
    const int vc = tid % NCH, kg = tid / NCH;
    const bool v_active = kg < KG;
    float acc[VH][8];
#pragma unroll
    for (int v = 0; v < VH; v++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[v][e] = 0.f;
    __syncthreads();

    for (int tile0 = k0; tile0 < k1max; tile0 += ATT_TILE) {
        const int ntmax = min(ATT_TILE, k1max - tile0);
        int nt[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) nt[r] = min(ATT_TILE, k1[r] - tile0);  // <= 0: the row has left
        uint4 vpre[VB];
#pragma unroll
        for (int i = 0; i < VB; i++) {
            const int k = kg + i * KG;
            vpre[i] = (v_active && i < VITER && k < ntmax)
                          ? *(const uint4*)(vbase + kv_slot(bt, tile0 + k) * row_stride + vc * 8)
                          : make_uint4(0u, 0u, 0u, 0u);
        }
        for (int i0 = 0; i0 < SITER; i0 += SB) {
            if (i0 * SSTEP >= ntmax) break;
            uint4 kraw[SB][CPL];
#pragma unroll
            for (int i = 0; i < SB; i++) {
                const int key = (i0 + i) * SSTEP + warp * KPW + ks;
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    const int ch = c * LPK + sl;
                    kraw[i][c] = (i0 + i < SITER && key < ntmax && ch < NCH)
                                     ? *(const uint4*)(kbase + kv_slot(bt, tile0 + key) * row_stride + ch * 8)
                                     : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int i = 0; i < SB; i++) {
                if (i0 + i >= SITER || (i0 + i) * SSTEP + warp * KPW >= ntmax) break;  // warp-uniform
                const int key = (i0 + i) * SSTEP + warp * KPW + ks;
                const bool valid = key < ntmax;
                float dot[VH];
#pragma unroll
                for (int v = 0; v < VH; v++) dot[v] = 0.f;
                if (valid) {
#pragma unroll
                    for (int c = 0; c < CPL; c++) {
                        const int ch = c * LPK + sl;
                        if (ch < NCH) {
                            float kf[8];
                            unpack8(kraw[i][c], kf);
#pragma unroll
                            for (int v = 0; v < VH; v++)
#pragma unroll
                                for (int e = 0; e < 8; e++) dot[v] = fmaf(qr[v][c][e], kf[e], dot[v]);
                        }
                    }
                }
#pragma unroll
                for (int v = 0; v < VH; v++) {
#pragma unroll
                    for (int o = LPK / 2; o > 0; o >>= 1) dot[v] += __shfl_xor_sync(0xffffffffu, dot[v], o);
                }
                if (valid && sl == 0) {
#pragma unroll
                    for (int v = 0; v < VH; v++) {
                        if (key >= nt[v / G]) continue;
                        float x = dot[v] * scale;
                        if (softcap > 0.f) x = softcap * tanhf(x / softcap);
                        sc[v][key] = x;
                    }
                }
            }
        }
        __syncthreads();
        // online softmax, one warp per virtual head (split_body's code, the row's own keys)
        for (int v = warp; v < VH; v += ATT_WARPS) {
            const int ntv = nt[v / G];
            if (ntv <= 0) continue;
            float mx = NEG_INF;
            for (int k = lane; k < ntv; k += 32) mx = fmaxf(mx, sc[v][k]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = m_s[v];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int k = lane; k < ntv; k += 32) {
                float e = expf(sc[v][k] - m_new);
                sc[v][k] = e;
                sum += e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                float alpha = expf(m_old - m_new);
                alpha_s[v] = alpha;
                l_s[v] = l_s[v] * alpha + sum;
                m_s[v] = m_new;
            }
        }
        __syncthreads();
        if (v_active) {
#pragma unroll
            for (int v = 0; v < VH; v++) {
                if (nt[v / G] <= 0) continue;
                float a = alpha_s[v];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[v][e] *= a;
            }
            for (int i0 = 0; i0 < VITER; i0 += VB) {
                if (kg + i0 * KG >= ntmax) break;
                uint4 vraw[VB];
#pragma unroll
                for (int i = 0; i < VB; i++) {
                    const int k = kg + (i0 + i) * KG;
                    vraw[i] = i0 == 0 ? vpre[i]
                              : (i0 + i < VITER && k < ntmax)
                                  ? *(const uint4*)(vbase + kv_slot(bt, tile0 + k) * row_stride + vc * 8)
                                  : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int i = 0; i < VB; i++) {
                    const int k = kg + (i0 + i) * KG;
                    if (i0 + i < VITER && k < ntmax) {
                        float vf[8];
                        unpack8(vraw[i], vf);
#pragma unroll
                        for (int v = 0; v < VH; v++) {
                            if (k >= nt[v / G]) continue;
                            float pk = sc[v][k];
#pragma unroll
                            for (int e = 0; e < 8; e++) acc[v][e] = fmaf(pk, vf[e], acc[v][e]);
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    // split_body's key-group sum, ((0 + acc_0) + acc_1) + ..., for every virtual head
    float tot[OPT_R];
#pragma unroll
    for (int o = 0; o < OPT_R; o++) tot[o] = 0.f;
    for (int r0 = 0; r0 < KG; r0 += RED_R2) {
        if (v_active && kg >= r0 && kg < r0 + RED_R2) {
#pragma unroll
            for (int v = 0; v < VH; v++)
#pragma unroll
                for (int e = 0; e < 8; e++) red[kg - r0][v * D + vc * 8 + e] = acc[v][e];
        }
        __syncthreads();
        const int nr = min(RED_R2, KG - r0);
#pragma unroll
        for (int o = 0; o < OPT_R; o++) {
            const int i = tid + o * NT;
            if (i < VH * D)
                for (int r = 0; r < nr; r++) tot[o] += red[r][i];
        }
        __syncthreads();
    }
    // rows with one split: out = tot * (1 / l), as split_body's out_direct; else the partial
#pragma unroll
    for (int o = 0; o < OPT_R; o++) {
        const int i = tid + o * NT;
        if (i >= VH * D) continue;
        const int v = i / D, r = v / G, g = v % G, d = i % D;
        if (r >= cnt || k1[r] <= k0) continue;
        const int t = t0 + r;
        if (nact[r] == 1) {
            const float x = tot[o] * (1.0f / l_s[v]);
            out[(size_t)t * n_head * D + (size_t)(hb * G + g) * D + d] = x;
            ob[i] = x;
        } else {
            part_o[(((size_t)t * n_head + (size_t)hb * G + g) * S + split) * D + d] = tot[o];
        }
    }
    if (tid < VH) {
        const int r = tid / G, g = tid % G;
        if (r < cnt && k1[r] > k0 && nact[r] > 1) {
            const size_t pr = ((size_t)(t0 + r) * n_head + (size_t)hb * G + g) * S + split;
            part_ml[pr * 2] = m_s[tid];
            part_ml[pr * 2 + 1] = l_s[tid];
        }
    }
    // the q8 twins of the rows written directly (block-uniform loop: every lane shuffles)
    if (xq) {
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (r >= cnt || k1[r] <= k0 || nact[r] != 1) continue;  // block-uniform
            const size_t base = (size_t)(t0 + r) * n_head * D + (size_t)hb * G * D;
            for (int i0 = 0; i0 < G * D / 4; i0 += NT) {
                const int i4 = i0 + tid;
                const bool active = i4 < G * D / 4;
                q8_store4(active ? reinterpret_cast<const float4*>(ob + r * G * D)[i4] : make_float4(0.f, 0.f, 0.f, 0.f),
                          active, i4, xq + base, xs + base / 32);
            }
        }
    }
    // rows with several splits: count this block's partial; the last block merges the row
    bool any_multi = false;
#pragma unroll
    for (int r = 0; r < RW; r++) any_multi |= r < cnt && k1[r] > k0 && nact[r] > 1;
    if (!any_multi) return;  // block-uniform
    __threadfence();
    __syncthreads();
    if (tid < RW) {
        const int r = tid;
        s_last[r] = 0;
        if (r < cnt && k1[r] > k0 && nact[r] > 1)
            s_last[r] = atomicAdd(&counters[(t0 + r) * nhb + hb], 1) == nact[r] - 1;
    }
    __syncthreads();
    for (int r = 0; r < RW; r++) {
        if (!s_last[r]) continue;  // block-uniform
        __threadfence();
        const int t = t0 + r, n_act = nact[r];
        float* orow = out + (size_t)t * n_head * D + (size_t)hb * G * D;
        // decode_body's merge, for this row's G heads
        const size_t base = ((size_t)t * n_head + (size_t)hb * G) * S;
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
        for (int i = tid; i < G * D; i += NT) {
            const int g = i / D, d = i % D;
            const float* po = part_o + (base + (size_t)g * S) * D + d;
            float num = 0.f;
            for (int j = 0; j < n_act; j++) num += w_s[g][j] * __ldcg(po + (size_t)j * D);
            orow[i] = num * inv_den[g];
            ob[i] = num * inv_den[g];
        }
        if (tid == 0) counters[t * nhb + hb] = 0;
        if (xq) {
            __syncthreads();
            int8_t* q8 = xq + (size_t)t * n_head * D + (size_t)hb * G * D;
            Q8Scale* s8 = xs + ((size_t)t * n_head * D + (size_t)hb * G * D) / 32;
            for (int i0 = 0; i0 < G * D / 4; i0 += NT) {
                const int i4 = i0 + tid;
                const bool active = i4 < G * D / 4;
                q8_store4(active ? reinterpret_cast<const float4*>(ob)[i4] : make_float4(0.f, 0.f, 0.f, 0.f),
                          active, i4, q8, s8);
            }
        }
        __syncthreads();  // w_s, inv_den and ob are reused by the next merged row
    }
}
