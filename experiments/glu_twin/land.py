#!/usr/bin/env python3
"""The gate+up matvec writing its output's q8 twin (MV_TWIN): kernels/matvec.cu's edit, kept here until a device
session lands it with its kernel-check receipt (a kernels/ edit makes the committed receipt stale).

  mv_q8_glu_twin  (MV_TWIN 1; MV_NWARPS x MV_ROWS = 32, MV_KSPLIT 1): a block owns 32 consecutive output rows, so
                  after the epilogue it holds whole q8 blocks of the down projection's input: its rows' outputs go
                  to shared memory and warp b quantizes batch row b's 32 of them with q8.cuh's q8_quantize_warp
                  (quantize_q8's rule, so the twin's bits are what quantize_q8 would make of y). The plan then drops
                  the step's quantize launch before down (memra.gpu.plan, the table entry's MV_TWIN).
  every other module: the same code (mv_q8_body gains a TWIN template flag and two defaulted pointers that only
                  the twin entry passes; `memra tune carry` / --check compare the built cubins).

    python3 experiments/glu_twin/land.py --check /tmp/gt   # patched kernels/ in /tmp/gt (and /tmp/gt-base), compiled
    python3 experiments/glu_twin/land.py                   # edits kernels/matvec.cu in place
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DOC_OLD = "// MV_XSMEM (0; q8 family) stages the block's activations in shared memory, tile-interleaved\n"
DOC_NEW = ("// MV_TWIN (0; q8 family, _glu): the entry mv_q8_glu_twin (extra arguments tq, ts), a block owning 32\n"
           "// consecutive output rows (MV_NWARPS x MV_ROWS = 32, MV_KSPLIT 1, N % 32 == 0, grid N / 32) also writes\n"
           "// the q8 twin of its rows (tq [nb][N] int8, ts [nb][N / 32]: q8_quantize_warp over each batch row's 32\n"
           "// outputs, the bits quantize_q8 makes of y), so the down projection needs no quantize launch\n"
           "// (experiments/glu_twin; the twin is read by the next launch only, never by this one).\n"
           + DOC_OLD)
DEF_OLD = "#ifndef MV_PDL_TRIGGER\n"
DEF_NEW = "#ifndef MV_TWIN\n#define MV_TWIN 0\n#endif\n" + DEF_OLD
FINISH_END = '''            if (res) v = __fadd_rn(v, res[o]);
            y[o] = v;
        }
    }
}
'''
TWIN_FN = FINISH_END + '''
#if MV_TWIN
#if MV_NWARPS * MV_ROWS != 32 || MV_KSPLIT != 1
#error "MV_TWIN: a block must own 32 output rows (MV_NWARPS x MV_ROWS = 32, MV_KSPLIT 1)"
#endif
// finish()'s epilogue for a GLU block of 32 output rows, then the q8 twin of those rows: the same operations on the
// same values (warp_sum, act(gate) * up, + res), each output also parked in shared memory; warp b quantizes batch
// row b's 32 outputs (q8_quantize_warp: quantize_q8's rule, bit for bit).
template <int B>
MEMRA_DEVICE void finish_twin(float (&acc)[2 * MV_ROWS][B], float* y, const float* res, int row0, int N, int nb,
                              int act, int8_t* tq, Q8Scale* ts) {
    __shared__ float tw[B][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < 2 * MV_ROWS; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = warp_sum(acc[r][b]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) {
            const int row = row0 + r;
#pragma unroll
            for (int b = 0; b < B; ++b) {
                if (b >= nb) break;
                const float gte = acc[r][b], up = acc[MV_ROWS + r][b];
                float v = __fmul_rn(act == 2 ? gelu_tanh_f32(gte) : silu_f32(gte), up);
                const size_t o = (size_t)b * N + row;
                if (res) v = __fadd_rn(v, res[o]);
                y[o] = v;
                tw[b][warp * MV_ROWS + r] = v;
            }
        }
    }
    __syncthreads();
    for (int b = warp; b < nb && b < B; b += MV_NWARPS)
        q8_quantize_warp(tw[b][lane], tq + (size_t)b * N + (size_t)blockIdx.x * 32,
                         ts + (size_t)b * (N / 32) + blockIdx.x);
}
#endif
'''
BODY_OLD = '''template <int B, bool GLU>
MEMRA_DEVICE void mv_q8_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                        float* y, const float* res, int N, int K, int nb, int act) {'''
BODY_NEW = '''template <int B, bool GLU, bool TWIN = false>
MEMRA_DEVICE void mv_q8_body(const uint8_t* __restrict__ bulk, const uint8_t* __restrict__ meta,
                        const int8_t* __restrict__ xq, const Q8Scale* __restrict__ xs,
                        float* y, const float* res, int N, int K, int nb, int act,
                        int8_t* tq = nullptr, Q8Scale* ts = nullptr) {'''
END_OLD = '''    finish<B, GLU>(acc, y, res, row0, N, nb, act);
}
#endif
'''
END_NEW = '''#if MV_TWIN
    if constexpr (TWIN) {
        finish_twin<B>(acc, y, res, row0, N, nb, act, tq, ts);
        return;
    }
#endif
    finish<B, GLU>(acc, y, res, row0, N, nb, act);
}
#endif
'''
ENTRY_OLD = '''    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
#endif
'''
ENTRY_NEW = '''    mv_q8_body<MV_B, true>(bulk, meta, xq, xs, y, res, N, K, nb, act);
}
#if MV_TWIN
extern "C" __global__ void __launch_bounds__(32 * MV_NWARPS)
mv_q8_glu_twin(const uint8_t* bulk, const uint8_t* meta, const int8_t* xq, const Q8Scale* xs, float* y,
               const float* res, int N, int K, int nb, int act, int8_t* tq, Q8Scale* ts) {
    mv_q8_body<MV_B, true, true>(bulk, meta, xq, xs, y, res, N, K, nb, act, tq, ts);
}
#endif
#endif
'''
HIST_OLD = '''#include "common.cuh"
#include "q8.cuh"
#include "qtypes.cuh"
'''
HIST_NEW = '''//  6. MV_TWIN: mv_q8_glu_twin writes the q8 twin of its 32-row block (experiments/glu_twin; the 2026-11-30
//     fold, v2 there, lost on the 1B / 8B and won on SmolLM2's shape: a per-shape engine choice now).
''' + HIST_OLD
PAIRS = [(DOC_OLD, DOC_NEW, 1), (DEF_OLD, DEF_NEW, 1), (FINISH_END, TWIN_FN, 1), (BODY_OLD, BODY_NEW, 1),
         (END_OLD, END_NEW, 1), (ENTRY_OLD, ENTRY_NEW, 1), (HIST_OLD, HIST_NEW, 1)]


def transform(text: str) -> str:
    if "MV_TWIN" in text:
        raise SystemExit("glu_twin: kernels/matvec.cu already has MV_TWIN")
    for old, new, n in PAIRS:
        if text.count(old) != n:
            raise SystemExit(f"glu_twin: matvec.cu: expected {n} x {old[:60]!r}..., found {text.count(old)}")
        text = text.replace(old, new)
    return text


# modules compiled by --check: the twin on the real models' glu shapes' types, and defaults whose cubins must not move
CHECK = [{"MV_TYPE": 3, "MV_B": 1, "MV_NWARPS": 8, "MV_ROWS": 4, "MV_UNROLL": 2, "MV_TWIN": 1},     # Q4_1 (SmolLM2)
         {"MV_TYPE": 6, "MV_B": 1, "MV_NWARPS": 32, "MV_ROWS": 1, "MV_UNROLL": 2, "MV_TWIN": 1},    # Q5_0 (Gemma-3)
         {"MV_TYPE": 12, "MV_B": 8, "MV_NWARPS": 16, "MV_ROWS": 2, "MV_TWIN": 1},                  # Q4_K, 8 rows
         {"MV_TYPE": 3, "MV_B": 1, "MV_NWARPS": 4, "MV_ROWS": 2, "MV_UNROLL": 2},
         {"MV_TYPE": 12, "MV_B": 4, "MV_NWARPS": 4, "MV_ROWS": 1, "MV_PDL_TRIGGER": 2},
         {"MV_TYPE": 14, "MV_B": 1, "MV_NWARPS": 4, "MV_ROWS": 1, "MV_PREFETCH": 1}]


def check(dest: Path) -> None:
    """A patched copy of kernels/ in dest; each CHECK module compiled there (and the non-twin ones compared with
    kernels/' own: their code sections must be identical, as `memra tune carry` compares them)."""
    from memra.gpu.compile import compile_cubin
    from memra.tune.carry import code_sections   # what a module runs: line tables and symbols left out

    base = dest.with_name(dest.name + "-base")   # kernels/ as it is, at a path as long (the cubin names its source)
    for d in (dest, base):
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(ROOT / "kernels", d)
    (dest / "matvec.cu").write_text(transform((ROOT / "kernels" / "matvec.cu").read_text()))
    for d in CHECK:
        new = compile_cubin("matvec.cu", "sm_90a", d, root=dest)
        if d.get("MV_TWIN"):
            print(f"twin {d}: {len(new)} bytes")
            continue
        old = compile_cubin("matvec.cu", "sm_90a", d, root=base)
        same = code_sections(old) == code_sections(new)
        print(f"{'same' if same else 'DIFFERENT'} code {d}")
        if not same:
            raise SystemExit("glu_twin: a module without MV_TWIN changed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", type=Path, help="write a patched copy of kernels/ here and compile it")
    a = ap.parse_args()
    if a.check:
        sys.path.insert(0, str(ROOT))
        check(a.check)
        return
    p = ROOT / "kernels" / "matvec.cu"
    p.write_text(transform(p.read_text()))
    print("kernels/matvec.cu: edited (MV_TWIN)")


if __name__ == "__main__":
    main()
