"""Run the memra CLI with one kernel file's modules compiled from an experiment's build copy
(experiments/*/ab.py): every module the engine asks of `kernel_file` comes from `arm_file` (relative
to kernels/) with `defines` added to its configuration's, kernels/ untouched. The receipts of
`memra bench` carry `seams` so `memra research board` leaves them off the boards."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def route(kernel_file: str, arm_file: str, defines: dict) -> None:
    """From now on every module this process asks of `kernel_file` comes from `arm_file`, `defines` added."""
    from memra.gpu import cuda

    module = cuda.Gpu.module

    def arm_module(self, name, d=None):
        if name == kernel_file:
            return module(self, arm_file, {**(d or {}), **defines})
        return module(self, name, d)

    cuda.Gpu.module = arm_module


def run(kernel_file: str, arm_file: str, defines: dict, seams: dict, argv: list[str]) -> None:
    from memra.tune import bench as TB

    route(kernel_file, arm_file, defines)
    base = TB.seams
    TB.seams = lambda: {**base(), **seams}

    from memra.cli import app

    app(prog_name="memra", args=argv)
