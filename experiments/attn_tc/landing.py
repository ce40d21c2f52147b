#!/usr/bin/env python3
"""The tensor-core split body's landing, kernels/ side: kernels/attn_ring.cuh with make.py's ring edits,
kernels/attn_tc.cuh (tc_body.cuh), kernels/attention.cu with make.py's edits, the attn_tc.cuh include and v11's
history (ATT_TC 0 by default in the kernel: v10's SASS). The host side (memra.gpu.ops.attention's rule, the
MEMRA_ATT_TC seam, kernel-check, tests) is host.patch. So the landing is, in the checkout that lands it:

    python3 experiments/attn_tc/landing.py . && git apply experiments/attn_tc/host.patch

(any other ROOT: a scratch checkout to try it in). The kernels are made from kernels/ as they are, never kept as
a patch that could drift from make.py's edits.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make  # noqa: E402
from kernel_edit import make_variant  # noqa: E402

HISTORY = """//   v11 (this; ATT_TC 1) split_body's keys on the tensor cores (attn_tc.cuh; experiments/attn_tc): a 16-key slice of
//       every ring tile a warp (ATT_TILE = 16 ATT_WARPS) or a warp pair (ATT_TILE = 8 ATT_WARPS, each warp half the
//       output rows), S^T = K Q^T and O^T += V^T P^T by mma.sync m16n8k16 with q and p as f16 hi + lo, a slice's
//       online softmax in its warp, the slices merged in slice order; the ring's 16-byte chunks XOR-swizzled by
//       row (ldmatrix), V rows past a split's keys zero-filled. A new float order (each row's still fixed by its
//       own keys and split layout: batch-, graph- and chunk-invariant); ATT_TC 0 is v10's code and SASS.
"""


def land(root: Path) -> None:
    ring_edits = [e for e in make.RING_EDITS if e[0] != "#pragma once\n"]
    if make_variant(make.ROOT / "kernels" / "attn_ring.cuh", root / "kernels" / "attn_ring.cuh", ring_edits):
        raise SystemExit("attn_ring.cuh's anchor moved")
    body = (HERE / "tc_body.cuh").read_text()
    (root / "kernels" / "attn_tc.cuh").write_text("// attn_tc.cuh — attention.cu's split body on the tensor cores "
                                                  "(ATT_TC; included by attention.cu after attn_ring.cuh).\n"
                                                  "#pragma once\n" + body)
    edits = make.attention_edits('#include "attn_ring.cuh"\n#include "attn_tc.cuh"\n')
    edits.append(("//   v10 (this) ", "//   v10 "))
    edits.append(("//   dynamic shared memory; bit-neutral; f16 KV only);\n",
                  "//   dynamic shared memory; bit-neutral; f16 KV only); ATT_TC (attn_tc.cuh; 0 default): 1 runs\n"
                  "//   split_body's keys on the tensor cores (v11; the ring, f16 K/V, head 64 or 128, N_GQA <= 8,\n"
                  "//   ATT_TILE = 16 or 8 ATT_WARPS; memra.gpu.ops.attention.tc_supported decides), 2 the rows of\n"
                  "//   ATT_TC_MIN keys or more (default 256; a row's own count), shorter rows the CUDA-core body;\n"))
    edits.append(("\n#include \"common.cuh\"\n", HISTORY + "\n#include \"common.cuh\"\n"))
    if make_variant(make.ROOT / "kernels" / "attention.cu", root / "kernels" / "attention.cu", edits):
        raise SystemExit("attention.cu's anchor moved")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: landing.py ROOT (the checkout whose kernels/ it writes; . lands it here)")
    land(Path(sys.argv[1]))
