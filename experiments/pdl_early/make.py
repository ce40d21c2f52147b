"""Build copies of kernels/ whose kernels let their PDL dependants start earlier (bit-neutral: only when the next
launch starts changes, never what any kernel computes).

Why (session 46, experiments/timeline on the H100, SmolLM2 at depth 64): in a decode step four of a layer's eight
launches reach their `griddepcontrol.wait` only after their predecessor has finished (wait ~0.03 µs, lag 1.3-2.4 µs:
attention after the QKV matvec, gate+up after the FFN norm, the FFN activation's quantize after gate+up, down after
the quantize), so their launch and pre-wait work (weight loads, the attention's position-dependent loads) sit on the
critical path. Two causes:
 - `quantize_q8` (kernels/q8.cu) never calls `griddepcontrol.launch_dependents`, so the down matvec launches only
   when it completes (every other kernel triggers right after its wait);
 - a kernel triggers its dependant only after its own wait, so the dependant can never start before the
   predecessor's predecessor has completed: at most one launch runs ahead.

Arms (`make(arm)` -> the copy's folder; session 46's q8 arm — quantize_q8 triggering after its wait, as every other
kernel does — landed in kernels/q8.cu as Q8_PDL_TRIGGER 1, so base is it now; 771dbd6 holds the arm as measured):
  nq     rmsnorm / add_rmsnorm and quantize_q8 trigger *before* their wait (after their pre-wait loads are issued);
  early  nq, and every matvec.cu kernel too; in both, a kernel that triggers before its wait
         lets its dependant start while its own predecessor still runs.
         Safe when the dependant's pre-wait reads are constants (weights, norm weights, cos/sin) or data written
         before the last kernel that triggers after its wait (the attention, the embed, the sampler: pos, tok, the
         block tables): no chain of early triggers passes one of those, so such data is complete before any kernel
         that reads it pre-wait can start. (Deadlock-free: a grid triggers only when all its blocks run, so every
         launched grid is resident before its dependant launches.)
"""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ARMS = ("base", "nq", "early")   # the q8 arm landed (kernels/q8.cu Q8_PDL_TRIGGER 1): 771dbd6 holds it

Q8_DEFAULT = "#define Q8_PDL_TRIGGER 1\n"
PAIR = "    MEMRA_PDL_WAIT();\n    MEMRA_PDL_LAUNCH();\n"
MV_PAIR = "    MEMRA_PDL_WAIT();\n#if MV_PDL_TRIGGER\n    MEMRA_PDL_LAUNCH();\n#endif\n"


def _sub(text: str, old: str, new: str, count: int, name: str) -> str:
    if text.count(old) != count:
        raise SystemExit(f"pdl_early: {name}: expected {count} x {old!r}, found {text.count(old)}")
    return text.replace(old, new)


def transform(name: str, text: str, arm: str) -> str:
    """One kernel file's text in `arm`."""
    if arm not in ARMS:
        raise SystemExit(f"pdl_early: unknown arm {arm!r} ({', '.join(ARMS)})")
    if arm == "base":
        return text
    if name == "q8.cu":
        return _sub(text, Q8_DEFAULT, "#define Q8_PDL_TRIGGER 2\n", 1, name)
    if name == "norm.cu":
        return _sub(text, PAIR, "    MEMRA_PDL_LAUNCH();\n    MEMRA_PDL_WAIT();\n", 2, name)
    if arm == "early" and name == "matvec.cu":
        return _sub(text, MV_PAIR, "#if MV_PDL_TRIGGER\n    MEMRA_PDL_LAUNCH();\n#endif\n    MEMRA_PDL_WAIT();\n", 2, name)
    return text


def make(arm: str, dst: Path | None = None) -> Path:
    """kernels/ copied into dst (default build/kernels, one folder for every arm: the cubin cache keys on the sources
    and the folder, so a file an arm leaves as it is compiles once for all arms) with `arm`'s edits; returns dst."""
    dst = dst or HERE / "build" / "kernels"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for p in sorted((ROOT / "kernels").iterdir()):
        if p.suffix in (".cu", ".cuh"):
            (dst / p.name).write_text(transform(p.name, p.read_text(), arm))
    return dst


if __name__ == "__main__":
    import sys

    for a in sys.argv[1:] or ARMS:
        print(make(a))
