#!/usr/bin/env python3
"""Land the early trigger as a tunable (kernels/ edited in place; run from the checkout, then commit with the
device's kernel-check receipt and `memra tune carry`'s records):

  matvec.cu  MV_PDL_TRIGGER 2: launch_dependents before the PDL wait (after the pre-wait weight loads / L2
             prefetches are issued); 1 (the default) and 0 compile exactly as before, so `memra tune carry`
             can prove every measured module unchanged and no campaign is needed;
  norm.cu    NORM_PDL_TRIGGER (rmsnorm, add_rmsnorm): 1 after the wait (the default, today's code), 2 before it.

q8.cu has Q8_PDL_TRIGGER since session 46. Which launches take 2 is a per-shape table choice made by the engine's
own tg128 (experiments/engine_tune overlay / choice --group): the early arm won +7.7 % on SmolLM2's shape and lost
1.2 % / 0.8 % on the 1B / 8B (research/2026-12-06-session46 P/), so no single default serves every model.

    python3 experiments/pdl_early/land.py            # edits kernels/matvec.cu and kernels/norm.cu
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make import MV_PAIR, PAIR, ROOT, _sub  # noqa: E402

MV_NEW = ("#if MV_PDL_TRIGGER == 2\n    MEMRA_PDL_LAUNCH();\n#endif\n    MEMRA_PDL_WAIT();\n"
          "#if MV_PDL_TRIGGER == 1\n    MEMRA_PDL_LAUNCH();\n#endif\n")
MV_DOC_OLD = "// MV_PDL_TRIGGER (1) lets the next PDL-launched kernel start once every block is running\n"
MV_DOC_NEW = ("// MV_PDL_TRIGGER (1) lets the next PDL-launched kernel start once every block is running\n"
              "// (1: after this kernel's wait; 2: before it, so the dependant may start while this kernel's\n"
              "// predecessor still runs: experiments/pdl_early, a per-shape engine choice; 0: never)\n")
NORM_NEW = ("#if NORM_PDL_TRIGGER == 2\n    MEMRA_PDL_LAUNCH();\n#endif\n    MEMRA_PDL_WAIT();\n"
            "#if NORM_PDL_TRIGGER == 1\n    MEMRA_PDL_LAUNCH();\n#endif\n")


def edit(name: str, pairs: list[tuple[str, str, int]]) -> None:
    p = ROOT / "kernels" / name
    text = p.read_text()
    for old, new, n in pairs:
        text = _sub(text, old, new, n, name)
    p.write_text(text)
    print(f"kernels/{name}: edited")


def main() -> None:
    edit("matvec.cu", [(MV_PAIR, MV_NEW, 2), (MV_DOC_OLD, MV_DOC_NEW, 1)])
    norm = (ROOT / "kernels" / "norm.cu").read_text()
    anchor = "#include \"common.cuh\"\n"
    if "NORM_PDL_TRIGGER" in norm or norm.count(anchor) != 1:
        raise SystemExit("land.py: kernels/norm.cu already has NORM_PDL_TRIGGER, or its include line is not there once")
    (ROOT / "kernels" / "norm.cu").write_text(norm.replace(anchor, anchor + (
        "\n// NORM_PDL_TRIGGER (1): when rmsnorm / add_rmsnorm let their PDL dependant start: 1 after their wait,\n"
        "// 2 before it (experiments/pdl_early: a per-shape engine choice)\n"
        "#ifndef NORM_PDL_TRIGGER\n#define NORM_PDL_TRIGGER 1\n#endif\n"), 1))
    edit("norm.cu", [(PAIR, NORM_NEW, 2)])


if __name__ == "__main__":
    main()
