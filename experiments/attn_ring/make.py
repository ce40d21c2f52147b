#!/usr/bin/env python3
"""Write build/attention.cu: kernels/attention.cu with split_body's K/V rows staged through a
shared-memory ring by cp.async when ATT_RING (stages, 2 or 3) is defined non-zero. Every edit is
a marker replacement on a copy of kernels/attention.cu (each marker must occur once), so the
prototype shares attention.cu's code and its arithmetic; with ATT_RING 0 (the default) the copy
compiles to attention.cu's kernels (check: SASS identical). Only where a K/V chunk comes from
changes: `K_LD(kv_slot(bt, tile0 + key), ch)` / `V_LD(kv_slot(bt, tile0 + k), vc)` become
shared-memory reads of the tile's stage (K_SRC / V_SRC), the early V rows (vpre) are dropped
(the ring has them), the loop's tail barrier moves to its head (after the cp.async wait), and
the key-group sum's `red` lives in the ring (the ring is idle after the loop). ring.cuh holds the
ring's state and its cp.async issue / table lookahead.

    python3 experiments/attn_ring/make.py [OUT_FILE]
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC_TEXT = (ROOT / "kernels" / "attention.cu").read_text()

PATCHES = (
    # the ring's helpers, after the includes (ring.cuh defines ATT_RING 0 when unset)
    ('#include "kv.cuh"\n', '#include "kv.cuh"\n#include "smem_stage.cuh"\n'),
    ("constexpr int RED_R = KG * G * D <= RED_CAP ? KG : RED_CAP / (G * D);\n",
     "constexpr int RED_R = KG * G * D <= RED_CAP ? KG : RED_CAP / (G * D);\n"
     '#include "../experiments/attn_ring/ring.cuh"\n'),
    # red: in the ring when ATT_RING (RING_RED: the declaration)
    ("    __shared__ __align__(16) float red[RED_R][G * D];\n", "    RING_RED;\n"),
    # the ring's state and prologue once the table row is known
    ("    const int* bt = block_table + (size_t)s * max_blocks;\n",
     "    const int* bt = block_table + (size_t)s * max_blocks;\n    RING_PROLOGUE;\n"),
    # the loop head: wait for tile t, barrier, issue tile t + ATT_RING - 1, look up t + ATT_RING
    ("        const int nt = min(ATT_TILE, k1 - tile0);\n",
     "        const int nt = min(ATT_TILE, k1 - tile0);\n        RING_TILE_HEAD;\n"),
    # the early V rows: none with the ring (they are in shared memory already)
    ("        for (int i = 0; i < VB; i++) {\n            const int k = kg + i * KG;\n            vpre[i] =",
     "        for (int i = 0; i < (ATT_RING ? 0 : VB); i++) {\n            const int k = kg + i * KG;\n            vpre[i] ="),
    ("                          ? V_LD(kv_slot(bt, tile0 + k), vc)\n                          : make_uint4",
     "                          ? V_SRC(k, vc)\n                          : make_uint4"),
    ("                    vraw[i] = i0 == 0 ? vpre[i]\n", "                    vraw[i] = i0 == 0 && !ATT_RING ? vpre[i]\n"),
    ("                                  ? V_LD(kv_slot(bt, tile0 + k), vc)\n",
     "                                  ? V_SRC(k, vc)\n"),
    ("                                     ? K_LD(kv_slot(bt, tile0 + key), ch)\n",
     "                                     ? K_SRC(key, ch)\n"),
    # the fused entries' launch bounds: RING_LB (ring.cuh: a minimum of blocks where ptxas spilled)
    ('extern "C" __global__ void __launch_bounds__(NT)\n    attn_decode(',
     'extern "C" __global__ void RING_LB\n    attn_decode('),
    ('extern "C" __global__ void __launch_bounds__(NT)\n    attn_decode_rope(',
     'extern "C" __global__ void RING_LB\n    attn_decode_rope('),
    # the tail barrier: the next tile's head barrier takes its place (one after the loop)
    ("        __syncthreads();\n    }\n\n    // sum the key groups",
     "        RING_TILE_TAIL;\n    }\n    RING_AFTER_LOOP;\n\n    // sum the key groups"),
)


def make(out: Path) -> None:
    src = SRC_TEXT
    for old, new in PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"make.py: kernels/attention.cu no longer has {old[:70]!r} once ({src.count(old)})")
        src = src.replace(old, new)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file() or out.read_text() != src:
        out.write_text(src)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "build" / "attention.cu")
