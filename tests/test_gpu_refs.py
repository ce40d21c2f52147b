"""CPU checks of the numpy references the GPU kernels are held to (memra/gpu/ops/*.py).

kernel-check compares the device kernels with these references exactly or to float
rounding, so a reference that is itself wrong would let a wrong kernel pass. Here each is
checked against an independent formulation: the sampler's rule against plain softmax
probabilities and llama.cpp's filter definitions, the split-KV attention reference against
the CPU model's attention.
"""

from __future__ import annotations

import numpy as np
import pytest

from memra.gpu.ops import sample as S

# -- sampling -----------------------------------------------------------------------------


def _softmax(x, t=1.0):
    z = np.asarray(x, np.float64) / t
    e = np.exp(z - z.max())
    return e / e.sum()


def _draws(logits, n, **kw):
    return np.array([S.reference_sample(logits, seed=1234, position=i, **kw) for i in range(n)])


def test_greedy_cases_are_argmax():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(500).astype(np.float32)
    x[[17, 300]] = x.max() + 1  # tie: the smaller index
    for kw in ({"temp": 0.0, "top_k": 40}, {"temp": -1.0, "top_k": 0}, {"temp": 0.9, "top_k": 1}):
        assert S.reference_sample(x, top_p=0.9, min_p=0.0, seed=1, position=0, **kw) == 17


def test_plain_distribution_matches_softmax():
    """temp 1, no filters: draw frequencies follow softmax(logits) (chi-square, 7 dof)."""
    x = np.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2], np.float32)
    n = 6000
    counts = np.bincount(_draws(x, n, temp=1.0, top_k=0, top_p=1.0, min_p=0.0), minlength=8)
    expect = _softmax(x) * n
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 24.3, f"chi2 {chi2:.1f} (p < 0.001 at 7 dof)"


def test_temperature_reshapes_the_distribution():
    x = np.array([1.0, 0.0, -0.5, 0.5], np.float32)
    n = 5000
    counts = np.bincount(_draws(x, n, temp=0.5, top_k=0, top_p=1.0, min_p=0.0), minlength=4)
    expect = _softmax(x, 0.5) * n
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 16.3, f"chi2 {chi2:.1f} (p < 0.001 at 3 dof)"


def test_filters_keep_what_llamacpp_keeps():
    """top-k, then top-p on the untempered softmax of the survivors, then min-p relative to
    the top probability: every draw lies in the set computed here by sorting."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(2000) * 2).astype(np.float32)
    order = np.argsort(-x, kind="stable")
    for top_k, top_p, min_p in ((40, 1.0, 0.0), (0, 0.8, 0.0), (50, 0.9, 0.05), (0, 1.0, 0.2)):
        keep = order[:top_k] if top_k > 0 else order
        if top_p < 1.0:
            p = _softmax(x[keep])
            cut = int(np.searchsorted(np.cumsum(p), top_p)) + 1  # smallest prefix reaching top_p
            keep = keep[:cut]
        if min_p > 0.0:
            p = _softmax(x)
            keep = keep[p[keep] >= min_p * p.max()]
        allowed = set(keep.tolist())
        got = set(_draws(x, 400, temp=1.3, top_k=top_k, top_p=top_p, min_p=min_p).tolist())
        assert got <= allowed, f"top_k={top_k} top_p={top_p} min_p={min_p}: drew {sorted(got - allowed)[:5]}"
        if len(allowed) > 3:
            assert len(got) > 1  # it does sample, not only the argmax


def test_draws_are_seeded():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    kw = dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = [S.reference_sample(x, seed=5, position=i, **kw) for i in range(20)]
    b = [S.reference_sample(x, seed=5, position=i, **kw) for i in range(20)]
    c = [S.reference_sample(x, seed=6, position=i, **kw) for i in range(20)]
    assert a == b and a != c


def test_uniform_is_uniform():
    u = np.array([S.uniform(99, i) for i in range(20000)])
    assert 0.0 <= u.min() and u.max() < 1.0
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist - 2000) < 200)


# -- attention -------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [0, 5])
def test_attention_reference_matches_cpu_model(window):
    """The kernel-check reference (per token, per head, float64) against memra.cpu.reference's
    batched causal/sliding-window attention on the same cache."""
    from types import SimpleNamespace

    from memra.gpu.ops.attention import reference
    from memra.cpu.reference import ReferenceModel

    rng = np.random.default_rng(3)
    n_kv, G, D, n = 2, 3, 16, 12
    K = rng.standard_normal((n_kv, n, D)).astype(np.float32)
    V = rng.standard_normal((n_kv, n, D)).astype(np.float32)
    q = rng.standard_normal((n, n_kv * G, D)).astype(np.float32)
    pos = np.arange(n)
    cfg = SimpleNamespace(swa_window=window, n_head=n_kv * G, n_head_kv=n_kv, n_gqa=G, head_dim=D,
                          head_dim_v=D, scale=D ** -0.5, is_swa=lambda il: window > 0)
    model = ReferenceModel.__new__(ReferenceModel)
    model.cfg = cfg
    model.numerics = "f32"  # the exact float32 attention
    cache = SimpleNamespace(k=[K], v=[V])
    cpu = ReferenceModel._attention(model, 0, q, pos, cache)
    mine = reference(q, K.transpose(1, 0, 2)[None], V.transpose(1, 0, 2)[None], pos, None, n_kv, window, D ** -0.5)
    np.testing.assert_allclose(mine, cpu, rtol=1e-5, atol=1e-6)
