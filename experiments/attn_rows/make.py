#!/usr/bin/env python3
"""Write attention.cu with ATT_ROWS (experiments/attn_rows/README.md) from kernels/attention.cu:
attn_decode walks ATT_ROWS consecutive token rows a block, one after the other, each through the
unchanged decode_body / split_body (so each row's arithmetic, and bits, are attn_decode's), the
row index coming from a shared variable the kernel sets instead of blockIdx.z. Rows of one
sequence read nearly the same K/V prefix, so a block's later rows find it in L1. Made from the
kernel each time (checked edits), so the variant differs in the row walk and nothing else.

    python3 experiments/attn_rows/make.py OUT_FILE
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_edit import make_variant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EDITS = (
    ("#define NEG_INF __int_as_float(0xff800000)\n",
     "#define NEG_INF __int_as_float(0xff800000)\n"
     "#ifndef ATT_ROWS\n#define ATT_ROWS 1\n#endif\n"
     "// the token row of the block's current pass (ATT_ROWS > 1: attn_decode's row walk sets it)\n"
     "__shared__ int att_row_s;\n"
     "static __device__ __forceinline__ int att_row() { return ATT_ROWS > 1 ? att_row_s : (int)blockIdx.z; }\n"),
    ("    const int hb = blockIdx.x, split = blockIdx.y, t = blockIdx.z, S = gridDim.y;",
     "    const int hb = blockIdx.x, split = blockIdx.y, t = att_row(), S = gridDim.y;"),
    ("    const int hb = blockIdx.x, t = blockIdx.z, S = gridDim.y;\n    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;\n    const int n_head = gridDim.x * G;",
     "    const int hb = blockIdx.x, t = att_row(), S = gridDim.y;\n    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;\n    const int n_head = gridDim.x * G;"),
    ("""    const int t = blockIdx.z, S = gridDim.y;
    // pos is written two or more launches back (common.cuh: safe before the wait), so an
    // empty split leaves without waiting: nothing to add, nothing to count
    const int n_act = key_range(pos[t], window, S).n_active;
    if ((int)blockIdx.y >= n_act) return;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    decode_body(q, kcache, vcache, part_o, part_ml, counters, out, xq, xs, pos, seq, block_table, max_blocks, n_kv,
                qpk, window, scale, softcap, n_act, nullptr);""",
     """#if ATT_ROWS > 1
    // rows blockIdx.z * ATT_ROWS + r, one after the other (the grid's z is n_tokens / ATT_ROWS)
    const int S = gridDim.y;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    for (int r = 0; r < ATT_ROWS; ++r) {
        const int t = blockIdx.z * ATT_ROWS + r;
        const int n_act = key_range(pos[t], window, S).n_active;
        if ((int)blockIdx.y >= n_act) continue;   // block-uniform
        if (threadIdx.x == 0) att_row_s = t;
        __syncthreads();
        decode_body(q, kcache, vcache, part_o, part_ml, counters, out, xq, xs, pos, seq, block_table, max_blocks,
                    n_kv, qpk, window, scale, softcap, n_act, nullptr);
        __syncthreads();   // the row's shared arrays read before the next row writes them
    }
#else
    const int t = blockIdx.z, S = gridDim.y;
    // pos is written two or more launches back (common.cuh: safe before the wait), so an
    // empty split leaves without waiting: nothing to add, nothing to count
    const int n_act = key_range(pos[t], window, S).n_active;
    if ((int)blockIdx.y >= n_act) return;
    MEMRA_PDL_WAIT();
    MEMRA_PDL_LAUNCH();
    decode_body(q, kcache, vcache, part_o, part_ml, counters, out, xq, xs, pos, seq, block_table, max_blocks, n_kv,
                qpk, window, scale, softcap, n_act, nullptr);
#endif"""),
)
HEADER = """// attention.cu with ATT_ROWS token rows a block in attn_decode, made by
// experiments/attn_rows/make.py from kernels/attention.cu (attn_split and attn_decode_rope:
// ATT_ROWS 1 only).
"""


def main() -> int:
    return make_variant(ROOT / "kernels" / "attention.cu", Path(sys.argv[1]), EDITS, HEADER)


if __name__ == "__main__":
    sys.exit(main())
