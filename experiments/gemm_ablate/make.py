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

    python3 experiments/gemm_ablate/make.py OUT_DIR
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABLATIONS = {
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
}


def make(out: Path) -> list[str]:
    src = (ROOT / "kernels" / "gemm.cu").read_text()
    names = []
    for name, (old, new) in ABLATIONS.items():
        if src.count(old) != 1:
            raise SystemExit(f"make.py: kernels/gemm.cu no longer has the line of {name!r} once")
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "gemm.cu").write_text(src.replace(old, new))
        names.append(name)
    return names


if __name__ == "__main__":
    print(" ".join(make(Path(sys.argv[1]))))
