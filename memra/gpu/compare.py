"""Output comparison: the one place that says whether a kernel's output matches its
reference. Every family's check (memra/gpu/ops/*: kernel-check's `checks`/`canaries` and the
tune harness's `case.check()`) returns an `Outcome` made here; the launchers' modules
import this, never the harnesses (memra.tune.kernelcheck, memra.tune.measure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class Outcome:
    name: str
    ok: bool
    detail: str
    err: float = math.inf  # compare's relative error (0 for an exact match); inf when none


def compare(name: str, got: np.ndarray, ref: np.ndarray, tol: float, kind: str = "rel") -> Outcome:
    """Compare a kernel output with its reference.

    kind: "rel"   ||got - ref|| / ||ref|| (float64) <= tol
          "max"   max |got - ref| / max |ref| <= tol
          "exact" identical values (ints, indices, bit-exact paths)
    Any NaN/inf in `got` where `ref` is finite fails: outputs are poisoned with NaN before
    each launch, so an element the kernel never wrote shows up here."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        return Outcome(name, False, f"shape {got.shape} != reference {ref.shape}")
    if kind == "exact":
        bad = int(np.count_nonzero(got != ref))
        return Outcome(name, bad == 0, f"{bad} of {ref.size} differ", 0.0 if bad == 0 else math.inf)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    unwritten = int(np.count_nonzero(~np.isfinite(g) & np.isfinite(r)))
    if unwritten:
        return Outcome(name, False, f"{unwritten} of {r.size} outputs not finite (unwritten?)")
    if kind == "rel":
        den = float(np.linalg.norm(r)) or 1.0
        err = float(np.linalg.norm(g - r)) / den
    elif kind == "max":
        den = float(np.max(np.abs(r))) or 1.0
        err = float(np.max(np.abs(g - r))) / den
    else:
        raise ValueError(f"unknown comparison kind {kind!r}")
    return Outcome(name, err <= tol, f"err={err:.2e} tol={tol:.0e}", err)


def bits_differ(got: np.ndarray, want: np.ndarray) -> int:
    """How many float32 values of got and want differ in their bits."""
    return int(np.count_nonzero(np.asarray(got).view(np.uint32) != np.asarray(want).view(np.uint32)))


def rows_alone(name: str, plain: np.ndarray, run_rows, err: float) -> Outcome | None:
    """The batch-invariance half of a matmul family's kernel-check: the first and the last third of an nb-row
    launch's rows launched alone (run_rows(r0, n) -> their outputs [n, ...]) against that launch's bits `plain`;
    a failing Outcome on the first that differs, else None."""
    nb = plain.shape[0]
    c = max(1, nb // 3)
    for r0 in ((0, nb - c) if nb > 1 else ()):
        part = run_rows(r0, c)
        bad = bits_differ(part, plain[r0:r0 + c])
        if bad:
            return Outcome(name, False, f"rows {r0}..{r0 + c - 1} launched alone: {bad} of {part.size} values "
                                        f"differ from the {nb}-row launch's bits", err)
    return None


def epilogue(name: str, got: np.ndarray, ref: np.ndarray, want: np.ndarray, what: str, tol: float) -> Outcome:
    """The epilogue half of a matmul family's kernel-check: a glu or residual launch's outputs against their float64
    reference at tol ("max"), then bit for bit against `want` (what the plain launch's bits give through the
    engine's own epilogue: act_mul's, fl(plain + r))."""
    o = compare(name, got, ref, tol, kind="max")
    if not o.ok:
        return o
    bad = bits_differ(got, want)
    if bad:
        return Outcome(name, False, f"{bad} of {got.size} values differ from {what}", o.err)
    return Outcome(name, True, o.detail + f"; rows alone bit for bit; = {what} bit for bit", o.err)


def tune_check(name: str, got: np.ndarray, ref: np.ndarray, bits: np.ndarray, tol: float) -> tuple[bool, float, str]:
    """A tune job's check (memra/tune/measure.py's (ok, max_err, detail)) of a matmul family whose outputs do not
    depend on the configuration: the first ref.shape[1] output columns of `got` against their float64 reference
    `ref` at tol ("max"), every output finite (a poisoned output left unwritten is not), then every output's bits
    against `bits` (uint32: the built-in configuration's launch on the same inputs)."""
    R = ref.shape[1]
    o = compare(name, got[:, :R], ref, tol, kind="max")
    if not o.ok:
        return False, o.err, o.detail
    unwritten = int(np.count_nonzero(~np.isfinite(got)))
    if unwritten:
        return False, o.err, f"{unwritten} of {got.size} outputs not finite (unwritten?)"
    diff = int(np.count_nonzero(got.view(np.uint32) != bits))
    if diff:
        return False, o.err, f"{diff} of {got.size} values differ from the built-in configuration's bits"
    return True, o.err, o.detail + f" ({R} rows); = the built-in configuration's bits"
