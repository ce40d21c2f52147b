#!/usr/bin/env python3
"""build/attention.cu: kernels/attention.cu (v11) with kernels/attn_tc.cuh inlined and two edits, the candidate v12:

1. a warp quad a 16-key slice (ATT_TILE = 4 ATT_WARPS: the tensor-core body at 8 warps and 32-key tiles, each
   warp a quarter of the output's D rows; the same slices, so the same bits as 2 or 4 warps at 32-key tiles);
2. ATT_TC 2 (the switch by the row's key count) gone: it lost in the engine (research/2026-12-04-session31 a/),
   so `#if ATT_TC` picks the tensor-core body or the CUDA-core one at compile time.

Why (research/2026-12-04-session31 c/): on the 8B at depth 0 the CUDA-core body at 32-key tiles ran tg128 at
497.2 t/s, the tensor-core body at 64-key tiles 482.1 (2 µs a layer; alone, at 64 keys, 0.77 µs apart) and the
CUDA-core body at 64-key tiles 488.3 (a: the same 6.5 µs alone as at 32): a 64-key ring is 64 KiB at head 128
against 32 KiB, and under PDL the attention's blocks share the SMs with the neighbouring matvecs' early blocks.
A 32-key ring at 8 warps would keep the tensor cores' depth gain (8B @ d4096 430 against 417 t/s).

    python3 experiments/attn_quad/make.py      # generate build/attention.cu
    python3 experiments/attn_quad/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128 --tune-table T.json
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from kernel_edit import build_copy, make_variant  # noqa: E402

BUILD, ARM_FILE, HEADER = build_copy(HERE, "attention.cu")

TC_EDITS = [
    ("#pragma once\n", ""),   # inlined into the build copy
    ("// ---- ATT_TC: split_body's keys on the tensor cores (experiments/attn_tc; inlined into its build copy) ----\n"
     "// Slice c of every ring tile, keys [16 c, 16 c + 16), belongs to warp c (ATT_TILE = 16 ATT_WARPS) or to the warp\n"
     "// pair c, c + TC_SL (ATT_TILE = 8 ATT_WARPS: both compute the slice's scores, the same instructions on the same\n"
     "// operands, and each accumulates half of the output's D rows); a slice keeps its own online softmax (m, l) and\n"
     "// output for the block's G <= 8 heads, and the slices are merged at the end in slice order. So the pair layout\n"
     "// gives the same bits as a warp a slice at the same tile.\n",
     "// ---- ATT_TC: split_body's keys on the tensor cores (experiments/attn_tc, experiments/attn_quad) ----\n"
     "// Slice c of every ring tile, keys [16 c, 16 c + 16), belongs to warp c (ATT_TILE = 16 ATT_WARPS), to the warp\n"
     "// pair c, c + TC_SL (ATT_TILE = 8 ATT_WARPS) or to the quad c, c + TC_SL, c + 2 TC_SL, c + 3 TC_SL (ATT_TILE =\n"
     "// 4 ATT_WARPS): a slice's warps compute its scores alike (the same instructions on the same operands) and each\n"
     "// accumulates its share of the output's D rows; a slice keeps its own online softmax (m, l) and output for the\n"
     "// block's G <= 8 heads, and the slices are merged at the end in slice order. So every layout of a tile gives\n"
     "// the same bits.\n"),
    ("#ifndef ATT_TC_MIN  // ATT_TC 2: the fewest keys a row has for the tensor cores (fewer: the CUDA-core body)\n"
     "#define ATT_TC_MIN 256\n#endif\n"
     "static_assert(ATT_TC == 1 || ATT_TC == 2, \"ATT_TC: 0, 1 (every row) or 2 (rows of ATT_TC_MIN keys or more)\");\n",
     "static_assert(ATT_TC == 1, \"ATT_TC: 0 (the CUDA-core body) or 1 (the tensor cores)\");\n"),
    ("constexpr int TC_PAIR = ATT_WARPS / TC_SL;    // 1, or 2: the slice's two warps share its scores and split D\n",
     "constexpr int TC_PAIR = ATT_WARPS / TC_SL;    // 1, 2 or 4: the slice's warps share its scores and split D\n"),
    ("static_assert(TC_SL * 16 == ATT_TILE && (TC_PAIR == 1 || TC_PAIR == 2) && TC_PAIR * TC_SL == ATT_WARPS,\n"
     "              \"ATT_TC: ATT_TILE = 16 ATT_WARPS (a warp a 16-key slice) or 8 ATT_WARPS (a warp pair a slice)\");\n",
     "static_assert(TC_SL * 16 == ATT_TILE && (TC_PAIR == 1 || TC_PAIR == 2 || TC_PAIR == 4) &&\n"
     "              TC_PAIR * TC_SL == ATT_WARPS, \"ATT_TC: ATT_TILE = 16, 8 or 4 ATT_WARPS (a warp, pair or quad a slice)\");\n"),
    ("constexpr int TC_MT = TC_KS / TC_PAIR; // the output's 16-row tiles a warp accumulates\n",
     "constexpr int TC_MT = TC_KS / TC_PAIR; // the output's 16-row tiles a warp accumulates\n"
     "static_assert(TC_MT * TC_PAIR == TC_KS, \"ATT_TC: a slice's warps split the output's 16-row tiles evenly\");\n"
     "#ifndef ATT_TC_CHAINS  // the scores' independent mma accumulators (attention.cu's TC body)\n#define ATT_TC_CHAINS 1\n#endif\n"
     "static_assert(ATT_TC_CHAINS == 1 || ATT_TC_CHAINS == 2 || ATT_TC_CHAINS == 4, \"ATT_TC_CHAINS: 1, 2 or 4\");\n"),
]

ATT_EDITS = [
    ("//   ATT_TILE = 16 or 8 ATT_WARPS; memra.gpu.ops.attention.tc_supported decides), 2 the rows of\n"
     "//   ATT_TC_MIN keys or more (default 256; a row's own count), shorter rows the CUDA-core body;\n",
     "//   ATT_TILE = 16, 8 or 4 ATT_WARPS; memra.gpu.ops.attention.tc_supported decides);\n"),
    ("    // ATT_TC 1: every row on the tensor cores; 2: a row of ATT_TC_MIN keys or more (its own count, so the choice\n"
     "    // is the row's alone: batch- and chunk-invariant), shorter rows on the CUDA-core body below\n"
     "    float tot[OPT];\n    if (ATT_TC == 1 || kr.n >= ATT_TC_MIN) {\n",
     "    float tot[OPT];\n"),
    ("    __syncthreads();\n    } else {\n#endif\n    // this lane's 16-byte chunks of every query head\n",
     "    __syncthreads();\n#else\n    // this lane's 16-byte chunks of every query head\n"),
    ("    // ATT_TC (tc_body.cuh): lane (gid, tig)", "    // ATT_TC: lane (gid, tig)"),
    ("#if !ATT_TC  // ATT_TC: declared before the two bodies\n    float tot[OPT];\n#endif\n",
     "    float tot[OPT];\n"),
    ("#if ATT_TC\n    }  // ATT_TC\n#endif\n    if (out_direct) {\n",
     "#endif  // ATT_TC\n    if (out_direct) {\n"),
    # ATT_TC_CHAINS (1: v11's order): the scores' 2 TC_KS mma in 1, 2 (q's hi / lo parts) or 4 (and even / odd
    # k-steps) independent accumulators summed at the end — a shorter dependent chain a tile (16 mma at head 128),
    # another float order (each row's still its own)
    ("            float s[4] = {0.f, 0.f, 0.f, 0.f};\n",
     "            float sc[ATT_TC_CHAINS][4];\n"
     "#pragma unroll\n"
     "            for (int c = 0; c < ATT_TC_CHAINS; c++) sc[c][0] = sc[c][1] = sc[c][2] = sc[c][3] = 0.f;\n"),
    ("                tc_mma(s, a, qh[ks][0], qh[ks][1]);\n"
     "                tc_mma(s, a, ql[ks][0], ql[ks][1]);\n"
     "            }\n",
     "                tc_mma(sc[ATT_TC_CHAINS == 4 ? 2 * (ks & 1) : 0], a, qh[ks][0], qh[ks][1]);\n"
     "                tc_mma(sc[ATT_TC_CHAINS == 4 ? 2 * (ks & 1) + 1 : ATT_TC_CHAINS - 1], a, ql[ks][0], ql[ks][1]);\n"
     "            }\n"
     "            float s[4];\n"
     "#pragma unroll\n"
     "            for (int e = 0; e < 4; e++)\n"
     "                s[e] = ATT_TC_CHAINS == 1 ? sc[0][e] : ATT_TC_CHAINS == 2 ? sc[0][e] + sc[1][e]\n"
     "                     : (sc[0][e] + sc[2][e]) + (sc[1][e] + sc[3][e]);\n"),
]


V12 = ("//   v12 (this) the tensor-core body also as a warp quad a 16-key slice (ATT_TILE = 4 ATT_WARPS: 32-key tiles at 8\n"
       "//       warps, each warp a quarter of the output's 16-row tiles; the same bits as 2 or 4 warps at 32-key tiles);\n"
       "//       ATT_TC 2 (v11's switch by the row's key count, which lost in the engine) removed; ATT_TC_CHAINS (1: v11's\n"
       "//       order) puts the scores' mma in 2 or 4 independent accumulators.\n")


def landing_edits() -> tuple[list, list]:
    """The edits that land the build in kernels/ itself: attn_tc.cuh's (its include guard kept) and attention.cu's
    with the v12 history line after v11's (its measurements are added when it lands)."""
    v11_end = "//       attn_decode_rope is 8,408 SASS instructions against 6,040 / 5,528.\n"
    return TC_EDITS[1:], ATT_EDITS + [(v11_end, v11_end + V12), ("//   v11 (this; ATT_TC 1)", "//   v11 (ATT_TC 1)")]


def generate() -> None:
    tc = BUILD.with_name("attn_tc.cuh")
    if make_variant(ROOT / "kernels" / "attn_tc.cuh", tc, TC_EDITS):
        raise SystemExit("attn_tc.cuh's anchor moved: update TC_EDITS")
    edits = ATT_EDITS + [('#include "attn_tc.cuh"\n', tc.read_text())]
    if make_variant(ROOT / "kernels" / "attention.cu", BUILD, edits, HEADER):
        raise SystemExit("attention.cu's anchor moved: update ATT_EDITS")


if __name__ == "__main__":
    generate()
    print(BUILD)
