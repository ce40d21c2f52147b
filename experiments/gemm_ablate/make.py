#!/usr/bin/env python3
"""Ablations of kernels/gemm.cu: what each part of a unit's work costs, measured by taking it
out (timing only: every ablation changes the results, so gemm_check's bit checks fail by
design). Writes OUT_DIR/<name>/gemm.cu for each:

  float-min   G<T>::accum (the exact per-unit float formula, ~10 instructions an output and
              unit) replaced by one I2F + FMA + add that still reads the row scalars and the
              activation scale (so their computation and loads stay)
  no-unpack   the A fragments taken from the raw bulk words (no nibble / high-bit unpacking)
  no-weights  the weight bulk not staged (cp.async of the bulk skipped; meta, activations and
              scales still staged): the weight copies' cost
  no-merge    the slot structure taken out: merge() (a finished slot's partials added into the
              pending butterfly levels, the levels past GM_LREG in shared memory) does nothing,
              so each output keeps one running partial over all its units — what the exact
              order's 32 slots cost in this kernel (and so what a canonical order with fewer
              slots, which mv_q8's final combine may adopt, could give back)
  free        float-min + no-merge: a free-order kernel's bound with this staging and tiling
  skeleton    all four: what is left is the staging of activations/meta, the ldmatrix, the
              IMMAs and the loop — the bound of any rewrite that keeps this structure

    python3 experiments/gemm_ablate/make.py OUT_DIR
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = {
    "float-min": (
        "                        P[o] = GT::accum(P[o], rq[e >> 1], ints, sv[ni][e & 1]);",
        "                        {\n"
        "                            int s_ = 0;\n"
        "                            for (int k = 0; k < T::NI; ++k) s_ += ints[k];\n"
        "                            const float r0_ = __int_as_float(*reinterpret_cast<const int*>(&rq[e >> 1]));\n"
        "                            P[o] = __fadd_rn(P[o], __fmaf_rn(r0_, sv[ni][e & 1][0].d, (float)s_));\n"
        "                        }"),
    "no-unpack": (
        "                GT::afrag(q, w, tig, a);",
        "                for (int k_ = 0; k_ < GT::NK; ++k_)\n"
        "                    for (int r_ = 0; r_ < AR; ++r_) a[k_][r_] = q[(k_ * AR + r_ / 2) % GT::NCH][r_ & 1];"),
    "no-weights": (
        "            cp16(st + r * GT::WBS + 16 * c, bulk + row * brs + GT::chunk(u, c));",
        "            (void)row;"),
    "no-merge": (
        "        const int tz = __ffs(~j) - 1;   // trailing ones of j (warp-uniform)",
        "        (void)j; return;\n        const int tz = __ffs(~j) - 1;"),
}
ABLATIONS = {name: [name] for name in PARTS}
ABLATIONS["free"] = ["float-min", "no-merge"]
ABLATIONS["skeleton"] = ["float-min", "no-unpack", "no-weights", "no-merge"]


def make(out: Path) -> list[str]:
    src = (ROOT / "kernels" / "gemm.cu").read_text()
    names = []
    for name, parts in ABLATIONS.items():
        text = src
        for part in parts:
            old, new = PARTS[part]
            if text.count(old) != 1:
                raise SystemExit(f"make.py: kernels/gemm.cu no longer has the line of {part!r} once")
            text = text.replace(old, new)
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "gemm.cu").write_text(text)
        names.append(name)
    return names


if __name__ == "__main__":
    print(" ".join(make(Path(sys.argv[1]))))
