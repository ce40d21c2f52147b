"""launch: the launch and host contract of kernels/gemm_tile.cu, as the experiments here and in
experiments/slot_order import it; since session 19 it lives in memra/gpu/ops/gemm_tile.py (this
module re-exports it under the names it had before landing)."""
from memra.gpu.ops.gemm_tile import (GEOM, Q4_0, Q4_K, Q6_K, Q8_0, SMEM_MAX, TYPE_NAMES as TYPES,  # noqa: F401
                                     check_config, launch_shape, smem_bytes, tile)
from memra.gpu.ops.gemm_tile import check_shape as check  # noqa: F401
from memra.gpu.ops.gemm_tile import type_config as default_config  # noqa: F401
