"""The tile GEMM's launcher and kernel-check family: landed as memra/gpu/ops/gemm_tile.py (session 19);
re-exported for experiments/slot_order/tile/check.py."""
from memra.gpu.ops.gemm_tile import *  # noqa: F401,F403
from memra.gpu.ops.gemm_tile import against_chain, check_case  # noqa: F401
from memra.gpu.ops.matvec import type_defines as _defines  # noqa: F401
