// mask.cu — constrained decoding: a row's vocabulary bitmask applied to its logits before
// the sampler (kernels/sample.cu) chooses the token, inside the captured decode graph.
//
// apply_mask: for row b with pos[b] >= 0 (a padded row, pos[b] < 0, is left alone), every
//   token i < n whose bit is clear in mask[b] gets logits[b * n + i] = -inf; other logits
//   are not written. Bit i of a row is bit (i % 32) of word i / 32 (little-endian in the
//   word: llguidance's bitmask layout), words = ceil(n / 32) a row. A row that allows every
//   token (all words 0xFFFFFFFF, what the host leaves in an unconstrained row) costs one read
//   of its words and no write.
// One thread a word; a word with every bit set is skipped.
//
// Tunables: MASK_THREADS (block size, default 256).
// MEMRA_CANARY: wrong variants kernel-check must catch: 1, the bits of a word are read in
//   the reverse order (bit 31 - i % 32).
// Launch contract:
//   apply_mask: grid (ceil(words / MASK_THREADS), B), block (MASK_THREADS); logits [B][n]
//   float32, mask [B][words] uint32, pos [B] int32 (or null: every row is live).

// PDL: wait for the previous kernel (the head's logits) before touching memory, then let
// the sampler launch.

#include "common.cuh"

#ifndef MASK_THREADS
#define MASK_THREADS 256
#endif
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(MASK_THREADS)
    apply_mask(float* __restrict__ logits, int n, const unsigned* __restrict__ mask, int words,
               const int* __restrict__ pos) {
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    const int b = blockIdx.y;
    const int w = blockIdx.x * MASK_THREADS + threadIdx.x;
    if (w >= words) return;
    if (pos && pos[b] < 0) return;  // a padded row of the batch
    unsigned m = mask[(size_t)b * words + w];
    if (m == 0xffffffffu) return;
    float* l = logits + (size_t)b * n + (size_t)w * 32;
    const int lim = min(32, n - w * 32);
    for (int i = 0; i < lim; i++) {
#if defined(MEMRA_CANARY) && MEMRA_CANARY == 1
        const int bit = 31 - i;  // kernel-check canary: the word's bits in reverse
#else
        const int bit = i;
#endif
        if (!((m >> bit) & 1u)) l[i] = NEG_INF;
    }
}
