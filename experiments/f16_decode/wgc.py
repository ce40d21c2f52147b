"""kernels/gemm_f16_wg.cu with chains over K (experiment; experiments/f16_decode/README.md step 2), generated.

generate(dst) writes a build copy of the engine's wgmma GEMM in which grid z is the chain: block (x, y, c) runs
chain c of C = gridDim.z over its contiguous K range (stages c K / C / 64 ..), the producer's weight units and X
columns offset by it, the consumers' stage count the chain's, and the plain entry's epilogue stores the raw
accumulator into part[c][m][n] (no residual, no activation; the glu entry is not used: a glu weight runs as a plain
2N-row weight). Appended: `fold_chains`, y[m, n] = ((part[0] + part[1]) + part[2]) + ... (__fadd_rn, chain order:
mv_f16.cu's fold), then the epilogue (glu: __fmul_rn(act(gate), up) with gate at row n and up at N + n; plain:
__fadd_rn(res, y) with a residual). With C = 1 the bits are gemm_f16's; with C chains they should equal mv_f16.cu's
at MF_CHAINS C (the same chains of k16 steps, the same fold) — probe.py --wgc checks both.
Every other line of the kernel is the engine's, so the mbarrier ring protocol is unchanged (local stage indices).
Session 52 also tried a bulk L2 prefetch of each producer row's next 4 / 8 pairs (the producer keeps one pair in
flight): slower on every shape (research/2026-12-07-session52/f16/wgc.jsonl, WGC_PF), so not kept. WGC_AHEAD 1
(built, not run) loads two pairs ahead instead.
Host contract beside the kernel's: K / C a multiple of 256 (each chain starts on an even pair, so the compile-time
unit parity holds), part holds C x nb x N' floats (N' the weight's rows).
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "kernels" / "gemm_f16_wg.cu"

EDITS = [
    ("    const int NS = K / BK;                                          // stages (even: K % 128 == 0)\n",
     "    const int NS = K / BK;                                          // stages (even: K % 128 == 0)\n"
     "    const int CH = blockIdx.z, NSC = NS / gridDim.z, P0 = CH * (NSC / 2);   // wgc: chain CH's stages, first pair\n"),
    ("                    T::load(v[i][h], ub[i], um[i], 2 * P + h, K / 64);\n",
     "                    T::load(v[i][h], ub[i], um[i], 2 * (P0 + P) + h, K / 64);\n"),
    ("            const uint8_t* xs = reinterpret_cast<const uint8_t*>(x) + (size_t)i * (2 * BK);\n",
     "            const uint8_t* xs = reinterpret_cast<const uint8_t*>(x) + (size_t)(2 * P0 + i) * (2 * BK);\n"),
    ("            load_pair(wn, P + 1 < NS / 2 ? P + 1 : P, IntC<par ^ 1>{});\n",
     "            load_pair(wn, P + 1 < NSC / 2 ? P + 1 : P, IntC<par ^ 1>{});\n"),
    ("            load_pair(w, P + 1 < NS / 2 ? P + 1 : P, IntC<par ^ 1>{});   // unconditional: as above\n",
     "            load_pair(w, P + 1 < NSC / 2 ? P + 1 : P, IntC<par ^ 1>{});   // unconditional: as above\n"),
    ("        const int NP = NS / 2;\n", "        const int NP = NSC / 2;\n"),
    ("    for (int i = 0; i < NS; ++i) {\n        const int s = i % S;\n",
     "    for (int i = 0; i < NSC; ++i) {\n        const int s = i % S;\n"),
    ("                    y[o] = res ? __fadd_rn(res[o], d[e]) : d[e];\n",
     "                    y[(size_t)CH * nb * N + o] = d[e];   // wgc: chain CH's partial (res unused)\n"),
    # WGC_AHEAD (0; 1): the producer's weight loads two pairs ahead instead of one (a register slot a pair parity,
    # loaded after that slot's dequant): session 52's fit says the 64-row GEMM waits on them (one CTA an SM)
    ("        typename T::U w[WG_MT][2];\n",
     "        typename T::U w[WG_MT][2];\n"
     "#if WGC_AHEAD\n"
     "        typename T::U w2[2][WG_MT][2];   // wgc: the units of pairs P and P + 1, slot P % 2\n"
     "#endif\n"),
    ("#if WG_PREFETCH\n            typename T::U wn[WG_MT][2];\n",
     "#if WGC_AHEAD\n"
     "            store_pair(w2[par], parc, wa, wb);\n"
     "            load_pair(w2[par], P + 2 < NSC / 2 ? P + 2 : P, parc);   // wgc: two pairs ahead, the same parity\n"
     "#elif WG_PREFETCH\n            typename T::U wn[WG_MT][2];\n"),
    ("        load_pair(w, 0, IntC<0>{});                // weights are never written by kernels: before the PDL wait\n",
     "#if WGC_AHEAD\n"
     "        load_pair(w2[0], 0, IntC<0>{});\n"
     "        load_pair(w2[1], NSC / 2 > 1 ? 1 : 0, IntC<1>{});   // one pair: slot 1 is never read\n"
     "#else\n"
     "        load_pair(w, 0, IntC<0>{});                // weights are never written by kernels: before the PDL wait\n"
     "#endif\n"),
    ("template <bool GLU>\nMEMRA_DEVICE void gemm_f16_wg_body(",
     "#ifndef WGC_AHEAD\n#define WGC_AHEAD 0\n#endif\ntemplate <bool GLU>\nMEMRA_DEVICE void gemm_f16_wg_body("),
]

FOLD = r'''
// wgc: y[m, n] = the chains' partials folded in chain order, then the epilogue (see experiments/f16_decode/wgc.py)
extern "C" __global__ void __launch_bounds__(256)
fold_chains(const float* __restrict__ part, float* y, const float* res, int N, int nb, int C, int glu, int act) {
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= nb * N) return;
    const int m = i / N, n = i % N;
    const int Nw = glu ? 2 * N : N;
    float v = part[(size_t)m * Nw + n];
    for (int c = 1; c < C; ++c) v = __fadd_rn(v, part[((size_t)c * nb + m) * Nw + n]);
    if (glu) {
        float u = part[(size_t)m * Nw + N + n];
        for (int c = 1; c < C; ++c) u = __fadd_rn(u, part[((size_t)c * nb + m) * Nw + N + n]);
        y[i] = __fmul_rn(act == 2 ? gelu_tanh_f32(v) : silu_f32(v), u);
    } else {
        y[i] = res ? __fadd_rn(res[i], v) : v;
    }
}
'''


def generate(dst: Path) -> Path:
    """The build copy at dst (a .cu file; -I kernels/ resolves its includes). Raises if an edit's anchor moved."""
    s = SRC.read_text()
    for old, new in EDITS:
        if s.count(old) != 1:
            raise SystemExit(f"wgc.py: anchor not found exactly once in {SRC.name}: {old.strip()[:80]!r}")
        s = s.replace(old, new)
    dst.write_text(s + FOLD)
    return dst


if __name__ == "__main__":
    import sys
    print(generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/gemm_f16_wgc.cu")))
