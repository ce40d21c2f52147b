"""Compile kernels/attention.cu with ATT_EARLY 1 in every valid configuration (NVRTC, sm_90a, no GPU):
head 64 / 128 / 256 x heads a block 1 / 3 / 4 x 4 / 8 warps x tile 32 / 64 x ring 0 / 2 / 3; a
configuration that does not build with ATT_EARLY 0 either is skipped. Run from the repository root:
PYTHONPATH=. python3 experiments/attn_early/compile.py"""
import itertools, sys
from memra.gpu.compile import compile_cubin
from memra.gpu.ops import attention as ATT
ok = skip = 0
for D, G, W, T, ring in itertools.product([64, 128, 256], [1, 3, 4], [4, 8], [32, 64], [0, 2, 3]):
    cfg = {"ATT_WARPS": W, "ATT_TILE": T, "ATT_RING": ring}
    try:
        d = ATT.module_defines(D, G, cfg)
        compile_cubin("attention.cu", "sm_90a", {**d, "ATT_EARLY": 0})
    except Exception:
        skip += 1
        continue
    try:
        compile_cubin("attention.cu", "sm_90a", {**d, "ATT_EARLY": 1})
        ok += 1
    except Exception as e:
        print("FAIL", D, G, W, T, ring, str(e)[:800]); sys.exit(1)
print("compiled", ok, "skipped (invalid without ATT_EARLY too)", skip)
