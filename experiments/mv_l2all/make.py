#!/usr/bin/env python3
"""Edit a copy of kernels/matvec.cu (in place: meant for the device's disposable copy of the tree)
so that, before the PDL wait, every lane prefetches into L2 all of its units of a matrix no larger
than MV_L2ALL_MAX bytes (default 32 MiB; bigger ones keep the first unit only, as now). Weights are
never written by kernels, so the prefetches may run while the previous kernel still does: a
mid-size matvec (4096 x 4096, 6144 x 4096: 39-65 % of the copy bandwidth at one row in the
H200 table) should then find its weights in L2 when its wait returns. Bits unchanged (a prefetch
moves no data into registers).

    python3 experiments/mv_l2all/make.py kernels/matvec.cu      # on the device copy only
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_edit import make_variant  # noqa: E402

OLD = """    if (u < nu) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            prefetch_l2(wb[r] + (size_t)u * 64 * T::BULK / T::BLK);
            if (T::META) prefetch_l2(wm[r] + (size_t)u * 64 * T::META / T::BLK);
        }
    }
"""
NEW = """    {   // MV_L2ALL (experiments/mv_l2all): a small matrix's every unit of this lane into L2
        const bool all = (size_t)N * (brs + mrs) <= (size_t)MV_L2ALL_MAX;
        for (int uu = u; uu < nu; uu += 32 * MV_KSPLIT) {
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                prefetch_l2(wb[r] + (size_t)uu * 64 * T::BULK / T::BLK);
                if (T::META) prefetch_l2(wm[r] + (size_t)uu * 64 * T::META / T::BLK);
            }
            if (!all) break;
        }
    }
"""
DEF = "#ifndef MV_L2ALL_MAX\n#define MV_L2ALL_MAX (32u << 20)\n#endif\n"


def main() -> int:
    p = Path(sys.argv[1])
    return make_variant(p, p, ((OLD, NEW, 2), ('#include "qtypes.cuh"\n', '#include "qtypes.cuh"\n' + DEF)))


if __name__ == "__main__":
    sys.exit(main())
