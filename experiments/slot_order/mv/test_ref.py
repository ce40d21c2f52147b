"""CPU tests of ref.py (run: python3 -m pytest -q experiments/slot_order/mv/test_ref.py)."""
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))
import ref  # noqa: E402
from memra.gpu.ops import matvec as MV  # noqa: E402
from memra.gpu.q8 import quantize_q8_ref  # noqa: E402


def _case(t, rows, K, nb, seed):
    rng = np.random.default_rng(seed)
    raw = MV.random_weight(t, rows, K, rng)
    x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
    q, s = quantize_q8_ref(x)
    return raw, q.reshape(nb, K), s["d"].reshape(nb, -1), s["s"].reshape(nb, -1)


def _rel(y, r):
    return float(np.linalg.norm(y.astype(np.float64) - r) / np.linalg.norm(r))


@pytest.mark.parametrize("t", ref.TYPES)
def test_arms_near_float64(t):
    raw, q, d, s = _case(t, 24, 4096, 3, t)   # 64 units: two a lane
    r64 = ref.float64_ref(raw, t, q, d)
    arms = {(f, c): ref.arm_raw(raw, t, q, d, s, f, c) for f, c in ((0, 0), (1, 0), (1, 1))}
    for y in arms.values():
        assert y.dtype == np.float32 and y.shape == r64.shape
        assert _rel(y, r64) < 1e-4
    # the butterfly and the left fold round differently somewhere
    assert np.any(arms[(0, 0)].view(np.uint32) != arms[(1, 0)].view(np.uint32))


@pytest.mark.parametrize("t", (2, 8))
def test_short_k(t):
    """K = 576: 9 units, lanes 9..31 empty (+0 slots)."""
    raw, q, d, s = _case(t, 16, 576, 2, 7)
    r64 = ref.float64_ref(raw, t, q, d)
    for f, c in ((0, 0), (1, 0), (1, 1)):
        assert _rel(ref.arm_raw(raw, t, q, d, s, f, c), r64) < 1e-5


def test_q6k_unit_layout():
    """The Q6_K emulation's lane slots sum (float64) to the product: every 16-half counted once."""
    raw, q, d, s = _case(14, 8, 2048, 2, 3)
    v = ref.lane_slots(raw, 14, q, d, s).astype(np.float64).sum(0).T
    assert _rel(v, ref.float64_ref(raw, 14, q, d)) < 1e-5


def test_fold_order():
    v = np.zeros((32, 1, 1), np.float32)
    v[0], v[1], v[2] = 1.0, 2.0 ** 24, -(2.0 ** 24)
    assert ref.left_fold(v)[0, 0] == 0.0          # (1 + 2^24) rounds to 2^24, then - 2^24
    assert ref.butterfly(v)[0, 0] == 1.0          # 1 meets 0 (slot 16) first; 2^24 - 2^24 = 0 (slots 1, 2: level 2)


def test_q6k_pair_exchange_model():
    """make.py's Q6_K MV_CHAINF, modelled from mv_q8's unit layout (group g of unit u = 16-half
    h = 16 sb + 8 n + 2 g + (j & 1)), the lane pair swapping sc * I, then the left fold: = slot_chain."""
    from memra.gpu.chain import fma32
    raw, q, d, s = _case(14, 8, 4096, 2, 11)
    rows, (nb, K) = raw.shape[0], q.shape
    w = ref.Q.decompose(raw, 14, (rows, K)).q.astype(np.int64)
    I16 = np.einsum("rhk,bhk->rbh", w.reshape(rows, -1, 16), q.astype(np.int64).reshape(nb, -1, 16))
    sc16 = raw.reshape(rows, -1, 210)[:, :, 192:208].view(np.int8).astype(np.int64).reshape(rows, -1)
    dd = ref._f16(raw, rows, 210, 208)

    def P(u):   # the lane's sc[g] * ints[g], g = 0..3
        sb, j = u // 4, u % 4
        return [sc16[:, 16 * sb + 8 * (j // 2) + 2 * g + (j & 1), None] * I16[:, :, 16 * sb + 8 * (j // 2) + 2 * g + (j & 1)]
                for g in range(4)]
    slots = np.zeros((32, rows, nb), np.float32)
    for u in range(K // 64):
        own, other, odd = P(u), P(u ^ 1), u & 1
        sb, n = u // 4, (u % 4) // 2
        for k, g in enumerate((2, 3) if odd else (0, 1)):
            J = own[g] + other[g]
            blk = 8 * sb + 4 * n + g
            p = (J.astype(np.float64) * dd[:, sb, None]).astype(np.float32)
            slots[u % 32] = fma32(p, d[None, :, blk], slots[u % 32])
    got = ref.left_fold(slots).T
    want = ref.slot_chain(raw, 14, q, d, s)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
