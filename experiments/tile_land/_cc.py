"""One NVRTC compile with ptxas -v (experiments/gemm_tile/tile.py's compile_module):
    python3 experiments/tile_land/_cc.py kernels/gemm_tile.cu MV_TYPE=12 GT_PF=2"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm_tile"))
from tile import compile_module  # noqa: E402

if __name__ == "__main__":
    t = time.time()
    cub, log = compile_module(dict(a.split("=") for a in sys.argv[2:]), Path(sys.argv[1]))
    print(log[-3000:])
    print(f"{time.time() - t:.1f} s")
