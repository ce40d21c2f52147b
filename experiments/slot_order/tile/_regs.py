"""ptxas registers / spills of the slot-order tile (kernels/gemm_tile.cu + gemm_tile.patch,
written to build/gemm_tile.cu; needs `patch`) builds (NVRTC, sm_90a):
    python3 experiments/slot_order/tile/_regs.py MV_TYPE=12 GT_ORDER=1 [GT_TOT=1 GT_WN=2 ...]"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "gemm_tile"))
from tile import compile_module, ptxas_info  # noqa: E402


def source() -> Path:
    """build/gemm_tile.cu: tile_land's kernel with the slot order patched in."""
    out = HERE / "build" / "gemm_tile.cu"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["patch", "-s", "-o", str(out), str(HERE.parents[2] / "kernels" / "gemm_tile.cu"),
                    str(HERE / "gemm_tile.patch")], check=True)
    return out


def regs(defs: dict) -> dict:
    _, log = compile_module(defs, source())
    return {fn: ptxas_info(log, fn) for fn in ("gemm_tile", "gemm_tile_glu")}


if __name__ == "__main__":
    d = dict(a.split("=") for a in sys.argv[1:])
    try:
        print(" ".join(sys.argv[1:]), regs(d))
    except Exception as e:   # the NVRTC log
        print(" ".join(sys.argv[1:]), "FAILED", str(e)[-3000:])
