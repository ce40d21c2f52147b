#!/usr/bin/env python3
"""selfcheck (CPU, seconds): the parts of gemm_tile.cu that a SASS count cannot vouch for.

1. Q6_K's A-word build: the LOP3 immediates of sel_nib / and_m as written in gemm_tile.cu (parsed by
   experiments/gemm_tile2_q6k/model_q6k.kernel_lop3, the check that caught session 16's 0x88 slip),
   evaluated bit by bit on random and edge words for all four quarters against build_s_intent (q - 32).
2. launch.py: every default configuration passes check_config, the 8B shapes pass check(), and the
   host contract refuses what it must (N not a multiple of OBM, K % 256 / % 512, nb 0).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile2_q6k"))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile2"))
import launch  # noqa: E402
import model_q6k as M6  # noqa: E402


def lop3_check() -> int:
    M6._LOP3 = M6.kernel_lop3(ROOT / "kernels" / "gemm_tile.cu")
    print("gemm_tile.cu LOP3 helpers:", {k: (v[0], hex(v[1])) for k, v in M6._LOP3.items()})
    rng = np.random.default_rng(1)
    L = np.concatenate([rng.integers(0, 2 ** 32, 200000, dtype=np.uint64),
                        np.array([0, 0xFFFFFFFF, 0x0F0F0F0F, 0xF0F0F0F0], dtype=np.uint64)])
    H = np.concatenate([rng.integers(0, 2 ** 32, 200000, dtype=np.uint64),
                        np.array([0xFFFFFFFF, 0, 0xAAAAAAAA, 0x55555555], dtype=np.uint64)])
    bad = 0
    for g in range(4):
        a, b = M6.build_s(L, H, g), M6.build_s_intent(L, H, g)
        n = int(np.count_nonzero(a != b))
        print(f"  build_s quarter {g}: {len(L)} words, {n} differ from q - 32")
        bad += n
    # the mutation the check exists for: and_m with LUT 0x88 must be caught
    n = int(np.count_nonzero(M6.build_s(L, H, 0, mut=("andlut",)) != M6.build_s_intent(L, H, 0)))
    print(f"  mutation and_m LUT 0x88: {n} words differ (must be > 0)")
    return bad + (n == 0)


def contract_check() -> int:
    bad = 0
    for t in (launch.Q4_0, launch.Q8_0, launch.Q4_K, launch.Q6_K):
        c = launch.default_config(t)
        launch.check_config(t, c)
        for N, K, glu in ((14336, 4096, True), (4096, 14336, False), (6144, 4096, False), (1024, 4096, False),
                          (4096, 4096, False)):
            launch.check(t, c, N, K, 512, glu)
            launch.check(t, c, N, K, 1, glu)
        for N, K, nb, glu in ((4096 + 64, 4096, 8, False), (4096, 4096 + 128, 8, False), (4096, 4096, 0, False),
                              (14336 + 32, 4096, 8, True)):
            try:
                launch.check(t, c, N, K, nb, glu)
                print(f"  FAIL {launch.TYPES[t]} N={N} K={K} nb={nb} glu={glu} accepted")
                bad += 1
            except ValueError:
                pass
        if t == launch.Q6_K:
            try:
                launch.check(t, c, 4096, 4096 + 256, 8, False)
                print("  FAIL Q6_K K % 512 != 0 accepted")
                bad += 1
            except ValueError:
                pass
        print(f"  {launch.TYPES[t]} default {c}: contract checks ok" if not bad else "")
    return bad


def main() -> int:
    bad = lop3_check() + contract_check()
    print("selfcheck PASSED" if not bad else f"selfcheck FAILED ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
