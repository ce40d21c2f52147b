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
