#!/usr/bin/env python3
"""Write gemm.cu in plain K order (the free-order arm of experiments/gemm_free/ab.sh) from
kernels/gemm.cu: each warp group folds its units u = k, k + WK, ... in increasing u into one
partial per output (no bit-reversed slot walk, no stack of pending butterfly levels, no merges).
Made from the kernel each time, so the two arms differ in the order and nothing else.

    python3 experiments/gemm_free/make.py OUT_DIR     # writes OUT_DIR/gemm.cu
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_edit import make_variant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EDITS = (   # (kernels/gemm.cu text, free-order text): each must occur exactly once
    ("constexpr int NLEAF = 1 << LV;       // slots per group",
     "constexpr int NLEAF = 1;            // free order: one leaf, the group's units in order"),
    ("auto slot = [](int k, int j) { return k + GM_WK * (int)(__brev((unsigned)j) >> (32 - LV)); };",
     "auto slot = [](int k, int) { return k; };"),
    ("                pu[k] += 32;\n", "                pu[k] += GM_WK;\n"),
    ("        cu += 32;\n", "        cu += GM_WK;\n"),
    ("    auto merge = [&](int j) {\n        const int tz",
     "    auto merge = [&](int j) {\n        if (true) return;   // free order: nothing pending\n        const int tz"),
)
HEADER = """// gemm.cu in plain K order, made by experiments/gemm_free/make.py from kernels/gemm.cu (the
// free-order arm of experiments/gemm_free/ab.sh): batch- and chunk-invariant, not mv_q8's bits.
"""


def main() -> int:
    return make_variant(ROOT / "kernels" / "gemm.cu", Path(sys.argv[1]) / "gemm.cu", EDITS, HEADER)


if __name__ == "__main__":
    sys.exit(main())
