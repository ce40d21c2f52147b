"""The two prototypes define one order: gemm_tile2 GT_FORM 1 (experiments/gemm_tile2/model2.chain_ref) and
chain_mv (experiments/chain_mv/chain_ref.chain_ref) compute bit-identical float32 chains on the same Q4_K
weights and q8 activations (two independent references: planes + q4k_row_scalars vs memra.model.quants).

    python3 experiments/chain_mv/xcheck.py      # exit 0 when every case is bit-identical
"""
import sys, numpy as np
from pathlib import Path
E = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(E / "gemm_tile"), str(E / "gemm_tile2"), str(E / "chain_mv"), str(E.parent)]
import tile, model2, chain_ref as CR
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import quantize_q8_ref
rng = np.random.default_rng(11)
tot = 0
for rows, K, nb in ((64, 1024, 5), (48, 4096, 3), (32, 2048, 8)):
    raw = MV.random_weight(tile.Q4_K, rows, K, rng)
    x = tile.make_x(rng, nb, K)
    q, s = quantize_q8_ref(x)
    a = model2.chain_ref(raw, np.arange(rows), q, s["d"], s["s"])
    b = CR.chain_ref(raw, q, s)
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    tot += not same
    print(rows, K, nb, "bit-identical" if same else f"DIFFER {np.sum(a.view(np.uint32) != b.view(np.uint32))} of {a.size}")
sys.exit(tot)
