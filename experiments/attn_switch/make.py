#!/usr/bin/env python3
"""build/attention.cu: kernels/attention.cu with a row filter (README.md): ATT_ROWS 0 every row (kernels/' code), 1
only the rows of fewer than ATT_SWITCH keys, 2 only the rows of ATT_SWITCH keys or more — a row's own key count
(pos + 1, less a sliding window's start), so which module computes a row is the row's alone. attn_decode and
attn_decode_rope leave at once for another module's row, where an empty split leaves: before the PDL wait, the rope,
the append, the ring and the counters, so each row is computed, appended and twinned by exactly one of the two
launches of a step. attn_split (the unfused path) is not filtered: the switch runs on the fused kernels only.

    python3 experiments/attn_switch/make.py             # generate build/attention.cu
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from kernel_edit import build_copy, make_variant  # noqa: E402

BUILD, ARM_FILE, HEADER = build_copy(HERE, "attention.cu")

EXIT = "    if ((int)blockIdx.y >= n_act) return;\n"
FILTER = ("#if ATT_ROWS\n"
          "    // experiments/attn_switch: another module's row (its key count against ATT_SWITCH) leaves here too\n"
          "    if ((ATT_ROWS == 1) == (key_range({p}, window, S).n >= ATT_SWITCH)) return;\n"
          "#endif\n")

EDITS = [
    ("#ifndef ATT_MIN_CHUNK\n#define ATT_MIN_CHUNK 128\n#endif\n",
     "#ifndef ATT_MIN_CHUNK\n#define ATT_MIN_CHUNK 128\n#endif\n"
     "#ifndef ATT_ROWS  // experiments/attn_switch: 0 every row, 1 rows of < ATT_SWITCH keys, 2 rows of >= ATT_SWITCH\n"
     "#define ATT_ROWS 0\n#endif\n"
     "#ifndef ATT_SWITCH\n#define ATT_SWITCH 256\n#endif\n"
     "static_assert(ATT_ROWS >= 0 && ATT_ROWS <= 2 && ATT_SWITCH >= 1, \"ATT_ROWS: 0, 1 or 2; ATT_SWITCH >= 1\");\n"),
    # attn_decode: pos[t] read before the wait
    ("    const int n_act = key_range(pos[t], window, S).n_active;\n" + EXIT,
     "    const int n_act = key_range(pos[t], window, S).n_active;\n" + EXIT + FILTER.format(p="pos[t]")),
    # attn_decode_rope
    ("    const int n_act = key_range(p, window, S).n_active;\n" + EXIT,
     "    const int n_act = key_range(p, window, S).n_active;\n" + EXIT + FILTER.format(p="p")),
]


def main() -> int:
    return make_variant(ROOT / "kernels" / "attention.cu", BUILD, EDITS, HEADER)


if __name__ == "__main__":
    sys.exit(main())
