"""The flatness guard: a synthetic model whose logits are nearly flat makes every comparison
against it vacuous (any two engines agree to a small |Δ log-prob|, and every top-2 margin is
a near-tie that excuses any divergence). Tests that use a synthetic model as an oracle
assert its logits are peaked first.

Measured on the tiny synthetic models (memra synth --shape tiny, every architecture and
weight mix the tests use; the q8 reference over a 10-token prompt and 22 greedy tokens):
the logits' standard deviation over the vocabulary is 3.9 to 4.1 at every position, the
median top-1 probability 0.15 to 0.45, the median top-2 logit margin 0.10 to 0.86. The
bounds below sit 3 to 5 times under those, far above a flat model (standard deviation
-> 0, top-1 probability -> 1 / n_vocab, margins -> 0)."""

from __future__ import annotations

import numpy as np

MIN_STD = 1.0        # logits' standard deviation over the vocabulary, every position
MIN_TOP_P = 0.03     # median top-1 probability
MIN_MARGIN = 0.03    # median top-2 logit margin


def spread(logits) -> dict:
    L = np.atleast_2d(np.asarray(logits, np.float64))
    m = L.max(-1, keepdims=True)
    p_top = 1.0 / np.exp(L - m).sum(-1)
    top2 = np.sort(L, axis=-1)[:, -2:]
    return {"std_min": float(L.std(-1).min()), "p_top_median": float(np.median(p_top)),
            "margin_median": float(np.median(top2[:, 1] - top2[:, 0]))}


def assert_not_flat(logits, what: str = "the oracle", margins=None) -> None:
    """logits: [positions, n_vocab] (or one position); margins: top-2 margins of more
    positions (e.g. greedy_with_margins'), used for the margin median when given."""
    s = spread(logits)
    if margins is not None:
        s["margin_median"] = float(np.median(margins))
    assert s["std_min"] >= MIN_STD and s["p_top_median"] >= MIN_TOP_P and s["margin_median"] >= MIN_MARGIN, (
        f"{what}: logits too flat for a meaningful comparison ({s}; need std >= {MIN_STD}, median top-1 "
        f"probability >= {MIN_TOP_P}, median top-2 margin >= {MIN_MARGIN})")
