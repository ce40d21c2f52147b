"""Sampling semantics on hand-built distributions (expected values computed by hand)."""

import math
from collections import Counter

import numpy as np
import pytest

from memra.errors import MemraError
from memra.sampling import Sampler, SamplingParams, check_request

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off


def logits_of(probs):
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def draws(params, logits, n=4000, history=()):
    s = Sampler(params, len(logits))
    return Counter(s.sample(logits, history) for _ in range(n))


def assert_freq(count, n, p):
    """Observed count within 5 binomial standard deviations of n*p."""
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= 5 * sd + 1, (count, n * p)


def test_greedy_is_argmax_whatever_the_filters():
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = rng.normal(size=1000).astype(np.float32)
        s = Sampler(SamplingParams(temperature=0, top_k=3, top_p=0.5, min_p=0.2, seed=7), 1000)
        assert s.sample(x, []) == int(np.argmax(x))


def test_same_seed_same_tokens_other_seed_other_tokens():
    x = np.random.default_rng(2).normal(size=500).astype(np.float32)
    p = SamplingParams(temperature=1.0, seed=1234, **OFF)
    s1, s2 = Sampler(p, 500), Sampler(p, 500)
    seq1 = [s1.sample(x) for _ in range(200)]
    seq2 = [s2.sample(x) for _ in range(200)]
    assert seq1 == seq2
    s3 = Sampler(SamplingParams(temperature=1.0, seed=1235, **OFF), 500)
    assert [s3.sample(x) for _ in range(200)] != seq1


def test_unseeded_samplers_differ():
    x = np.zeros(10000, dtype=np.float32)
    p = SamplingParams(temperature=1.0, **OFF)
    assert [Sampler(p, 10000).sample(x) for _ in range(5)] != [Sampler(p, 10000).sample(x) for _ in range(5)]


def test_plain_temperature_draws_follow_the_tempered_softmax():
    x = np.array([1.0, 0.0, -1.0, 0.5], dtype=np.float32)
    n = 8000
    c = draws(SamplingParams(temperature=0.5, seed=3, **OFF), x, n)
    e = np.exp(x / 0.5)
    for tok, p in enumerate(e / e.sum()):
        assert_freq(c[tok], n, p)


def test_top_k_two_only_the_two_largest_appear():
    x = np.array([0.0, 1.0, 2.0, 3.0, 2.9, -5.0], dtype=np.float32)
    c = draws(SamplingParams(temperature=1.0, seed=4, **{**OFF, "top_k": 2}), x)
    assert set(c) == {3, 4}
    n = sum(c.values())
    assert_freq(c[3], n, 1 / (1 + math.exp(-0.1)))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = [0.5, 0.3, 0.15, 0.05]  # cumulative 0.5, 0.8, 0.95, 1.0
    x = logits_of(probs)
    for top_p, kept in [(0.45, [0]), (0.5 - 1e-6, [0]), (0.79, [0, 1]), (0.81, [0, 1, 2]),
                        (0.96, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])]:
        s = Sampler(SamplingParams(temperature=1.0, seed=0, **{**OFF, "top_p": top_p}), 4)
        idx, _ = s.candidates(s.apply_penalties(x, []))
        assert list(idx) == kept, top_p
    n = 6000
    c = draws(SamplingParams(temperature=1.0, seed=5, **{**OFF, "top_p": 0.79}), x, n)
    assert set(c) == {0, 1}
    assert_freq(c[0], n, 0.5 / 0.8)


def test_top_p_judges_the_untempered_distribution():
    # temperature comes last in the chain: a hot temperature must not widen the top-p set
    x = logits_of([0.5, 0.3, 0.15, 0.05])
    n = 6000
    c = draws(SamplingParams(temperature=100.0, seed=6, **{**OFF, "top_p": 0.79}), x, n)
    assert set(c) == {0, 1}
    e = np.exp(x[:2] / 100.0)
    assert_freq(c[0], n, e[0] / e.sum())


def test_top_p_applies_to_what_top_k_left():
    # after top-k=2 the survivors renormalize to 0.625 / 0.375: top_p 0.6 keeps one token
    x = logits_of([0.5, 0.3, 0.15, 0.05])
    c = draws(SamplingParams(temperature=1.0, seed=7, top_k=2, top_p=0.6, min_p=0.0), x, 500)
    assert set(c) == {0}


def test_min_p_threshold_is_relative_to_the_top_token():
    probs = [0.4, 0.3, 0.2, 0.1]
    x = logits_of(probs)
    for min_p, kept in [(0.2, [0, 1, 2, 3]), (0.3, [0, 1, 2]), (0.55, [0, 1]), (0.9, [0])]:
        s = Sampler(SamplingParams(temperature=1.0, seed=0, **{**OFF, "min_p": min_p}), 4)
        idx, _ = s.candidates(s.apply_penalties(x, []))
        assert list(idx) == kept, min_p
    n = 6000
    c = draws(SamplingParams(temperature=1.0, seed=8, **{**OFF, "min_p": 0.55}), x, n)
    assert set(c) == {0, 1}
    assert_freq(c[0], n, 0.4 / 0.7)


def test_penalties_hand_computed():
    x = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    hist = [0, 0, 1, 3]
    p = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.5, repeat_last_n=64)
    got = Sampler(p, 4).apply_penalties(x, hist)
    # 0: 2/2 - 2*0.1 - 0.5; 1: -1*2 - 0.1 - 0.5; 2: untouched; 3: 3/2 - 0.1 - 0.5
    np.testing.assert_allclose(got, [0.3, -2.6, 0.5, 0.9], rtol=0, atol=1e-6)
    # the window: only the last token (3) is penalized
    p.repeat_last_n = 1
    np.testing.assert_allclose(Sampler(p, 4).apply_penalties(x, hist), [2.0, -1.0, 0.5, 0.9], atol=1e-6)
    p.repeat_last_n = 0
    np.testing.assert_allclose(Sampler(p, 4).apply_penalties(x, hist), x, atol=0)


def test_repeat_penalty_changes_the_greedy_choice():
    x = np.array([3.0, 2.9], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0), 2).sample(x, [0]) == 0
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=1.1), 2).sample(x, [0]) == 1


@pytest.mark.parametrize("bad", [dict(repeat_penalty=0.0), dict(top_p=-0.1), dict(min_p=1.5),
                                 dict(temperature=float("nan")), dict(max_tokens=-2),
                                 dict(stop=[""]), dict(repeat_last_n=-2)])
def test_bad_parameters_are_rejected(bad):
    with pytest.raises(MemraError):
        Sampler(SamplingParams(**bad), 4)


def test_logits_of_the_wrong_size_are_rejected():
    with pytest.raises(MemraError, match="vocabulary"):
        Sampler(SamplingParams(), 5).sample(np.zeros(4, dtype=np.float32))


# -- logit bias (OpenAI's logit_bias; the chain's first step) ------------------------------------

def test_logit_bias_flips_the_greedy_argmax():
    x = np.array([1.0, 3.0, 2.5, 0.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0), 4).sample(x) == 1
    # 2.5 + 0.75 = 3.25 > 3.0
    assert Sampler(SamplingParams(temperature=0, logit_bias={2: 0.75}), 4).sample(x) == 2
    # 2.5 + 0.25 = 2.75 < 3.0: still token 1
    assert Sampler(SamplingParams(temperature=0, logit_bias={2: 0.25}), 4).sample(x) == 1
    # a bias on the argmax itself lowers it under the next: 3.0 - 1 = 2.0 < 2.5
    assert Sampler(SamplingParams(temperature=0, logit_bias={1: -1}), 4).sample(x) == 2


def test_a_minus_100_bias_removes_the_argmax():
    x = np.array([5.0, 20.0, 4.0, -3.0], dtype=np.float32)
    p = SamplingParams(temperature=0, logit_bias={1: -100})
    assert Sampler(p, 4).sample(x) == 0  # 20 - 100 = -80: token 0 (5.0) is the largest left
    # sampled: token 1's weight is e^-80 against e^5 + e^4 + e^-3, never drawn in 4000 draws
    c = draws(SamplingParams(temperature=1.0, seed=11, logit_bias={1: -100}, **OFF), x)
    assert 1 not in c
    n = sum(c.values())
    e = np.exp([5.0, 4.0, -3.0])
    assert_freq(c[0], n, e[0] / e.sum())


def test_a_plus_100_bias_forces_a_token_under_sampling():
    x = np.array([0.0, 2.0, 1.0, -1.0], dtype=np.float32)
    c = draws(SamplingParams(temperature=1.0, seed=12, logit_bias={3: 100}, **OFF), x, 500)
    assert set(c) == {3}


def test_logit_bias_changes_what_the_filters_see():
    # top_k=1 keeps the argmax of the biased logits: 0.5 + 2 = 2.5 beats 2.0
    x = np.array([2.0, 0.5, 1.0], dtype=np.float32)
    c = draws(SamplingParams(temperature=1.0, seed=13, top_k=1, top_p=1.0, min_p=0.0, logit_bias={1: 2}), x, 300)
    assert set(c) == {1}


def test_logit_bias_is_applied_before_the_penalties():
    # token 0 (logit 0.5) is in the history, repeat_penalty 2, bias +1 on token 0, token 1 at 1.0:
    #   bias first (llama.cpp's order): (0.5 + 1) / 2 = 0.75 < 1.0 -> token 1
    #   penalty first would give:        0.5 / 2 + 1 = 1.25 > 1.0 -> token 0
    x = np.array([0.5, 1.0], dtype=np.float32)
    p = SamplingParams(temperature=0, repeat_penalty=2.0, logit_bias={0: 1.0})
    assert Sampler(p, 2).sample(x, [0]) == 1
    # a negative bias that turns the logit negative: the repeat penalty then multiplies it
    #   bias first: (0.5 - 1) * 2 = -1.0 < -0.8 -> token 1; penalty first: 0.5 / 2 - 1 = -0.75 > -0.8 -> token 0
    x = np.array([0.5, -0.8], dtype=np.float32)
    p = SamplingParams(temperature=0, repeat_penalty=2.0, logit_bias={0: -1.0})
    assert Sampler(p, 2).sample(x, [0]) == 1
    # without the history the same bias leaves token 0 first: 0.5 - 1 = -0.5 > -0.8
    assert Sampler(p, 2).sample(x, []) == 0


def test_logit_bias_leaves_the_callers_logits_alone():
    x = np.array([1.0, 2.0], dtype=np.float32)
    Sampler(SamplingParams(temperature=0, logit_bias={0: 5}), 2).sample(x)
    np.testing.assert_array_equal(x, [1.0, 2.0])


@pytest.mark.parametrize("bias, needle", [({-1: 1.0}, "-1 is not a token id"),
                                          ({"5": 1.0}, "'5' is not a token id"),
                                          ({1.5: 1.0}, "1.5 is not a token id"),
                                          ({True: 1.0}, "True is not a token id"),
                                          ({1: 100.5}, "[-100, 100]"),
                                          ({1: -101}, "[-100, 100]"),
                                          ({1: float("-inf")}, "finite"),
                                          ({1: float("nan")}, "finite"),
                                          ({1: "1"}, "finite")])
def test_bad_logit_bias_is_rejected_naming_the_field(bias, needle):
    with pytest.raises(MemraError, match="logit_bias") as e:
        SamplingParams(logit_bias=bias).validate()
    assert needle in str(e.value)
    with pytest.raises(MemraError, match="--logit-bias"):
        SamplingParams(logit_bias=bias).validate({"logit_bias": "--logit-bias"})


def test_logit_bias_bounds_are_inclusive_and_an_id_beyond_the_vocabulary_is_an_error():
    SamplingParams(logit_bias={0: -100, 3: 100}).validate()
    Sampler(SamplingParams(logit_bias={0: -100, 3: 100}), 4)
    with pytest.raises(MemraError, match=r"logit_bias: token id 4 is outside the vocabulary \[0, 4\)"):
        Sampler(SamplingParams(logit_bias={4: 1.0}), 4)
    SamplingParams(logit_bias={4: 1.0}).validate()  # without a vocabulary size only the id's form is checked
    with pytest.raises(MemraError, match="outside the vocabulary"):
        check_request(SamplingParams(logit_bias={4: 1.0}), n_vocab=4)


def test_only_penalties_or_a_bias_need_the_host_sampler():
    assert not SamplingParams().host_only
    assert not SamplingParams(logit_bias={}).host_only
    assert SamplingParams(logit_bias={3: 0.0}).host_only
    assert SamplingParams(repeat_penalty=1.1).host_only
    assert SamplingParams(presence_penalty=0.5).host_only
