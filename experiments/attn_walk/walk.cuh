// attn_walk (experiments/attn_walk): a prefill row's attention as attn_decode computes it, its
// non-empty splits walked in order by one block instead of one block each.
//
// attn_decode launches (head blocks, S, rows) blocks; block (hb, j, t) computes split j of row
// t (split_body) and the last of the row's n_active blocks merges them in split order
// (decode_body). Here block (hb, 0, t) runs split_body for j = 0 .. n_active - 1 in turn, each
// with the same (split, S) it would have as block (hb, j, t), so every partial is the same
// bits, then merges them with decode_body's merge_splits (no counter: the block wrote them all). A
// row with one split writes out itself, as decode_body's short path does. So a row's result
// is attn_decode's at the same S, bit for bit, while the grid no longer grows with S: the
// split count (part of every row's bits) can be chosen for decode at depth without making
// prefill pay a block per split. Launch: grid (n_head / N_GQA, 1, n_tokens), block NT,
// arguments as attn_decode's without counters, plus S.
extern "C" __global__ void __launch_bounds__(NT)
    attn_walk(const float* __restrict__ q, const uint16_t* __restrict__ kcache,
              const uint16_t* __restrict__ vcache, float* __restrict__ part_o, float* __restrict__ part_ml,
              float* __restrict__ out, int8_t* __restrict__ xq, Q8Scale* __restrict__ xs,
              const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ block_table,
              int max_blocks, int n_kv, int qpk, int window, float scale, float softcap, int S) {
    __shared__ __align__(16) float ob[G * D];  // the output row, staged for its q8 twin
    const int hb = blockIdx.x, t = blockIdx.z;
    const int n_head = gridDim.x * G;
    const int n_act = key_range(pos[t], window, S).n_active;
    if (n_act == 0) return;  // a padded row
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    float* orow = out + (size_t)t * n_head * D + (size_t)hb * G * D;
    if (n_act == 1) {
        split_body(q, kcache, vcache, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, out, xq ? ob : nullptr, nullptr, 0, S);
    } else {
        for (int j = 0; j < n_act; j++) {
            split_body(q, kcache, vcache, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window,
                       scale, softcap, nullptr, nullptr, nullptr, j, S);
            __syncthreads();  // the partial written before the next split reuses shared memory
        }
        merge_splits(part_o, part_ml, t, hb, S, n_act, orow, ob);  // decode_body's merge
    }
    if (xq) {  // decode_body's q8 twin
        __syncthreads();
        twin_row(xq, xs, t, hb, ob);
    }
}
