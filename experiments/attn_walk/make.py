#!/usr/bin/env python3
"""Write build/attention.cu: kernels/attention.cu with split_body given an explicit (split, S)
(two trailing parameters whose defaults, -1 and 0, keep blockIdx.y and gridDim.y: every existing
caller compiles as before), decode_body's merge of a row's partials and its q8 twin moved
unchanged into functions (merge_splits, twin_row) that decode_body calls, and walk.cuh
(attn_walk, which calls them too) appended, so the new kernel compiles in the same file as attn_decode and shares its code. If it
lands, kernels/attention.cu takes these edits as they are.

    python3 experiments/attn_walk/make.py [OUT_FILE]
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC_TEXT = (ROOT / "kernels" / "attention.cu").read_text()


def _block(start: str, end: str) -> str:
    """The lines of kernels/attention.cu from the one starting with `start` through the first
    following one equal to `end` (decode_body's merge and q8 twin, moved into functions as they
    are)."""
    i = SRC_TEXT.index(start)
    j = SRC_TEXT.index(end, i) + len(end)
    return SRC_TEXT[i:j]


MERGE_BODY = _block("        const size_t base = ((size_t)t * n_head + (size_t)hb * G) * S;",
                    "            ob[i] = num * inv_den[g];\n        }\n")
TWIN_BODY = _block("        int8_t* q8 = xq + (size_t)t * n_head * D + (size_t)hb * G * D;",
                   "                      active, i4, q8, s8);\n        }\n")


def _dedent(text: str) -> str:
    return "".join(line[4:] if line.startswith("    ") else line for line in text.splitlines(keepends=True))


MERGE_FN = """// The merge of token t's n_act split partials (head block hb, S splits a row) into orow and the
// staged copy ob, in split order: decode_body's last block runs it (so does attn_walk).
static __device__ __forceinline__ void merge_splits(const float* __restrict__ part_o,
                                                    const float* __restrict__ part_ml, int t, int hb, int S,
                                                    int n_act, float* orow, float* ob) {
    __shared__ float w_s[G][MAX_SPLITS];
    __shared__ float inv_den[G];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_head = gridDim.x * G;
""" + _dedent(MERGE_BODY) + """}

// decode_body's q8 twin of the row it wrote (staged in ob), 8 lanes per block of 32
static __device__ __forceinline__ void twin_row(int8_t* __restrict__ xq, Q8Scale* __restrict__ xs, int t, int hb,
                                                const float* ob) {
    const int tid = threadIdx.x;
    const int n_head = gridDim.x * G;
""" + _dedent(TWIN_BODY) + """}

"""
PATCHES = (
    ("    __shared__ float w_s[G][MAX_SPLITS];\n    __shared__ float inv_den[G];\n    __shared__ int s_last;\n",
     "    __shared__ int s_last;\n"),
    (MERGE_BODY, "        merge_splits(part_o, part_ml, t, hb, S, n_act, orow, ob);\n"),
    (TWIN_BODY, "        twin_row(xq, xs, t, hb, ob);\n"),
    ("// The body of attn_decode after the PDL wait", MERGE_FN + "// The body of attn_decode after the PDL wait"),
    ("    float* ob, const float* qsm = nullptr) {",
     "    float* ob, const float* qsm = nullptr, int split_arg = -1, int S_arg = 0) {"),
    ("    const int hb = blockIdx.x, split = blockIdx.y, t = blockIdx.z, S = gridDim.y;\n    const int n_head = gridDim.x * G;\n    const int kvh",
     "    const int hb = blockIdx.x, t = blockIdx.z;\n    const int split = split_arg >= 0 ? split_arg : (int)blockIdx.y;\n"
     "    const int S = split_arg >= 0 ? S_arg : (int)gridDim.y;\n    const int n_head = gridDim.x * G;\n    const int kvh"),
)


def make(out: Path) -> None:
    src = SRC_TEXT
    for old, new in PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"make.py: kernels/attention.cu no longer has {old[:60]!r} once")
        src = src.replace(old, new)
    text = src + "\n// ---- experiments/attn_walk/walk.cuh ----\n" + (HERE / "walk.cuh").read_text()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "build" / "attention.cu")
