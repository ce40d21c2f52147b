"""The CPU reference's building blocks against hand-written formulations, its prefill against
its own decode, and its errors. (Parity with llama.cpp: test_parity_models.py, test_parity_synth.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from memra.cpu import llamacpp as LC
from memra.cpu import reference as R
from memra.model.aliases import resolve
from memra.errors import ContextOverflowError, GGUFError, MemraError
from memra.model.gguf import open_gguf


@pytest.fixture(scope="module")
def smollm():
    return R.ReferenceModel(open_gguf(resolve("smollm2-135m")))


# --- building blocks against scalar loops ------------------------------------------------------

def test_rms_norm_by_hand():
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    w = np.array([0.5, 1.0, 2.0, -1.0], np.float32)
    eps = 1e-5
    want = [x[0, i] / math.sqrt(sum(v * v for v in x[0]) / 4 + eps) * w[i] for i in range(4)]
    np.testing.assert_allclose(R.rms_norm(x, w, eps)[0], want, rtol=1e-6)


def test_gelu_and_silu_by_formula():
    x = np.linspace(-12, 12, 97).astype(np.float32)
    xd = x.astype(np.float64)
    gelu = 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
    np.testing.assert_allclose(R.gelu_tanh(x), gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(R.silu(x), xd / (1 + np.exp(-xd)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_by_hand(neox):
    rng = np.random.default_rng(0)
    head_dim, rope_dim, base, scale = 8, 6, 10000.0, 0.5
    factors = np.array([1.0, 2.0, 4.0], np.float32)
    x = rng.standard_normal((3, 2, head_dim)).astype(np.float32)
    pos = np.array([0, 7, 1000])
    inv = R.rope_inv_freq(rope_dim, base, scale, factors)
    got = R.rope(x, pos, inv, neox)
    want = x.astype(np.float64).copy()
    for t in range(3):
        for i in range(rope_dim // 2):
            theta = pos[t] * base ** (-2 * i / rope_dim) * scale / factors[i]
            a, b = (i, i + rope_dim // 2) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[t, :, a].astype(np.float64), x[t, :, b].astype(np.float64)
            want[t, :, a] = x0 * math.cos(theta) - x1 * math.sin(theta)
            want[t, :, b] = x0 * math.sin(theta) + x1 * math.cos(theta)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[..., rope_dim:], x[..., rope_dim:])  # unrotated tail


def test_attention_against_a_loop(tiny_models):
    """Causal + sliding-window GQA attention (queries in chunks) = a per-query, per-head loop."""
    m = R.ReferenceModel(open_gguf(tiny_models("gemma3", "F32")))
    c = m.cfg
    assert c.swa_window == 16 and c.is_swa(0) and not c.is_swa(5)
    rng = np.random.default_rng(1)
    n = 40
    cache = m.new_cache(64)
    for il in (0, 5):  # a sliding-window layer and a global one
        cache.k[il][:, :n] = rng.standard_normal((c.n_head_kv, n, c.head_dim))
        cache.v[il][:, :n] = rng.standard_normal((c.n_head_kv, n, c.head_dim_v))
        q = rng.standard_normal((n, c.n_head, c.head_dim)).astype(np.float32)
        pos = np.arange(n)
        old = R._Q_CHUNK
        R._Q_CHUNK = 7  # several query chunks, each with its own key range
        try:
            got = m._attention(il, q, pos, cache).reshape(n, c.n_head, c.head_dim_v)
        finally:
            R._Q_CHUNK = old
        for p in range(n):
            lo = p - c.swa_window + 1 if c.is_swa(il) else 0
            keys = [j for j in range(n) if max(lo, 0) <= j <= p]
            for h in range(c.n_head):
                kv = h // c.n_gqa
                s = np.array([q[p, h] @ cache.k[il][kv, j] for j in keys], np.float64) * c.scale
                pr = np.exp(s - s.max())
                pr /= pr.sum()
                want = sum(pr[i] * cache.v[il][kv, j] for i, j in enumerate(keys))
                np.testing.assert_allclose(got[p, h], want, rtol=1e-4, atol=1e-5)


def test_config_switches_of_real_models(smollm):
    c = smollm.cfg
    assert (c.arch, c.rope_neox, c.tied_output, c.act) == ("llama", False, True, "silu")
    g = R.ReferenceModel(open_gguf(resolve("gemma3-270m"))).cfg
    assert (g.rope_neox, g.qk_norm, g.post_norms, g.act, g.swa_window) == (True, True, True, "gelu_tanh", 512)
    assert g.embd_scale == pytest.approx(math.sqrt(640)) and g.scale == 1 / 16


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                   "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_codes_matvec_equals_float_weights(qtype):
    """Decode's matvec on int8 codes = x @ W^T on the dequantized weights (float rounding only)."""
    from gguf.constants import GGMLQuantizationType as T
    from test_quants import random_blocks

    from memra.model.quants import decompose, dequantize

    t = T[qtype]
    rng = np.random.default_rng(int(t))
    rows, cols = 37, 512
    from gguf.constants import GGML_QUANT_SIZES
    bs, ts = GGML_QUANT_SIZES[t]
    raw = random_blocks(t, rows * cols // bs, rng)
    w = dequantize(raw, int(t), (rows, cols)).astype(np.float64)
    c = decompose(raw, int(t), (rows, cols))
    for n in (1, 2):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        out = np.empty((n, rows), np.float32)
        R._codes_matvec(c.q, c.scale, R._NO_MIN if c.minv is None else c.minv, c.group, x, out)
        want = x.astype(np.float64) @ w.T
        bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w).T) + 1e-30
        assert np.all(np.abs(out - want) <= bound), np.max(np.abs(out - want) / bound)


# --- prefill, decode and the cache ---------------------------------------------------------------

def _decode_vs_prefill(model, tokens):
    full = model.forward(tokens, model.new_cache(len(tokens)), all_logits=True)
    cache = model.new_cache(len(tokens))
    steps = np.stack([model.forward([t], cache) for t in tokens])
    assert cache.pos == len(tokens)
    scale = np.abs(full).max(axis=-1, keepdims=True)
    assert np.all(np.abs(steps - full) <= 1e-4 * scale), np.abs(steps - full).max()
    return full


def test_decode_equals_prefill_smollm(smollm):
    ids = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282,
           4723, 216, 35, 34, 33]
    full = _decode_vs_prefill(smollm, ids)
    assert full.shape == (len(ids), 49152) and full.dtype == np.float32
    # a last-position call = the last row of all_logits (one output row instead of many: BLAS
    # may order the sums differently)
    last = smollm.forward(ids, smollm.new_cache(32))
    np.testing.assert_allclose(last, full[-1], rtol=0, atol=1e-5 * np.abs(full[-1]).max())


@pytest.mark.parametrize("arch, quant", [("qwen2", "F32"), ("qwen3", "F32"), ("gemma3", "F32"), ("llama", "F32"),
                                         ("gemma3", "Q4_K_M"), ("llama", "Q2_K"), ("qwen3", "Q5_1")])
def test_decode_equals_prefill_tiny(tiny_models, arch, quant):
    # gemma3: 40 tokens cross the 16-token window; llama: rope frequency factors; qwen2: QKV bias;
    # quantized: decode multiplies int8 codes, prefill the float32 weights
    m = R.ReferenceModel(open_gguf(tiny_models(arch, quant)))
    ids = np.random.default_rng(2).integers(0, m.cfg.n_vocab, 40).tolist()
    _decode_vs_prefill(m, ids)


def test_prefill_in_chunks_equals_one_prefill(tiny_models):
    m = R.ReferenceModel(open_gguf(tiny_models("gemma3", "F32")))
    ids = np.random.default_rng(3).integers(0, m.cfg.n_vocab, 45).tolist()
    whole = m.forward(ids, m.new_cache(64), all_logits=True)
    cache = m.new_cache(64)
    parts = [m.forward(ids[a:b], cache, all_logits=True) for a, b in [(0, 13), (13, 14), (14, 45)]]
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())


def test_sliding_window_forgets_old_tokens(tiny_models):
    """On a model whose layers all use the window, a token further back than the layers can
    relay (n_layer * (window - 1)) cannot change the last logits; within the window it does."""
    import dataclasses

    m = R.ReferenceModel(open_gguf(tiny_models("gemma3", "F32")))
    c = dataclasses.replace(m.cfg, swa_layers=(True,) * m.cfg.n_layer)
    m = R.ReferenceModel(m.g, c)
    reach = c.n_layer * (c.swa_window - 1)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, c.n_vocab, reach + 3).tolist()
    base = m.forward(ids, m.new_cache(len(ids)))
    far = list(ids)
    far[1] = (far[1] + 1) % c.n_vocab  # position 1 is beyond reach of the last position
    np.testing.assert_array_equal(m.forward(far, m.new_cache(len(ids))), base)
    near = list(ids)
    near[-3] = (near[-3] + 1) % c.n_vocab
    assert np.abs(m.forward(near, m.new_cache(len(ids))) - base).max() > 1e-3


# --- errors -------------------------------------------------------------------------------------

def test_context_overflow(smollm):
    cache = smollm.new_cache(4)
    smollm.forward([1, 2, 3], cache)
    with pytest.raises(ContextOverflowError, match="3 cached \\+ 2 new tokens exceed the context of 4"):
        smollm.forward([4, 5], cache)
    assert cache.pos == 3
    smollm.forward([4], cache)
    with pytest.raises(ContextOverflowError):
        smollm.forward([5], cache)


def test_a_cache_that_cannot_fit_is_refused_before_it_is_allocated(smollm, monkeypatch):
    """SmolLM2's float32 KV cache: 30 layers x 3 KV heads x (64 + 64) x 4 bytes a position
    (46,080: hand-computed), refused with the sizes when MemAvailable is smaller."""
    assert R.kv_cache_bytes(smollm.cfg, 1) == 30 * 3 * 128 * 4
    monkeypatch.setattr(R, "available_memory", lambda: 100 * 2**20)
    with pytest.raises(ContextOverflowError, match=r"a context of 4096 tokens needs 0\.18 GiB .* 0\.10 GiB available"):
        smollm.new_cache(4096)
    assert smollm.new_cache(2048).n_ctx == 2048  # 94 MB: fits
    monkeypatch.setattr(R, "available_memory", lambda: None)  # no /proc/meminfo: not checked
    assert smollm.new_cache(4096).n_ctx == 4096


@pytest.mark.parametrize("bad, msg", [
    ([1, -1], "token id -1 at index 1 is outside the vocabulary"),
    ([49152], "token id 49152 at index 0 is outside the vocabulary \\[0, 49152\\)"),
    ([], "non-empty"),
    ([1.5], "integers"),
    ([[1, 2]], "1-D"),
])
def test_bad_tokens(smollm, bad, msg):
    with pytest.raises(MemraError, match=msg):
        smollm.forward(bad, smollm.new_cache(8))


def test_missing_or_misshapen_tensor(tiny_models):
    import dataclasses

    g = open_gguf(tiny_models("qwen2", "F32"))
    cfg = R.ReferenceModel(g).cfg
    with pytest.raises(GGUFError, match="blk.0.attn_q_norm.weight' is missing"):
        R.ReferenceModel(g, dataclasses.replace(cfg, qk_norm=True))
    with pytest.raises(GGUFError, match="blk.0.attn_q.weight' has shape"):
        R.ReferenceModel(g, dataclasses.replace(cfg, n_head=cfg.n_head * 2))


# --- numerics modes: the roundings against hand-computed cases ----------------------------------

def test_numerics_mode_checked(smollm):
    with pytest.raises(MemraError, match="numerics"):
        R.ReferenceModel(smollm.g, numerics="fp8")


def test_q8_llamacpp_rounds_half_to_even_with_f16_scale():
    # amax 127 -> id = 127/127 = 1: 62.5 -> 62 and 63.5 -> 64 (AVX2 round-to-nearest-even,
    # not the reference quantizer's roundf), d stored as f16; q8_1 also stores s = f16(d * sum q)
    x = np.zeros(32, np.float32)
    x[:4] = [127.0, 62.5, 63.5, -0.5]
    xh, d16, q, s16 = LC.q8_llamacpp(x[None], with_sum=True)
    assert q[0, 0, :4].tolist() == [127, 62, 64, 0]
    assert d16[0, 0] == np.float32(np.float16(1.0)) and s16[0, 0] == np.float16(253.0)
    np.testing.assert_array_equal(xh[0, :4], [127, 62, 64, 0])
    y = np.full(32, 0.1, np.float32)  # d = 0.1/127 is not an f16 value: x_hat = q * f16(d)
    xh, d16, _, _ = LC.q8_llamacpp(y[None])
    assert d16[0, 0] == np.float32(np.float16(np.float32(0.1) / np.float32(127)))
    np.testing.assert_array_equal(xh[0], np.float32(127) * d16[0, 0])


def test_q8_k_uses_the_signed_maximum():
    # ggml quantize_row_q8_K: iscale = -127/max with max the signed value of largest magnitude
    x = np.linspace(-1, 1, 256).astype(np.float32) * np.float32(0.5)
    x[7] = -4.0
    xh = LC.q8_k_llamacpp(x[None])[0]
    iscale = np.float32(-127) / np.float32(-4.0)
    want = np.minimum(np.rint(iscale * x), 127) * (np.float32(1) / iscale)
    np.testing.assert_array_equal(xh, want.astype(np.float32))
    assert xh[7] == -4.0


def test_q8_gpu_rule_divides_by_d():
    # kernels/q8.cuh: d = amax/127, q = rint(x / d); an all-zero block stays zero
    x = np.zeros((1, 64), np.float32)
    x[0, :3] = [3.0, 1.5, -0.75]
    d = np.float32(3.0) / np.float32(127)
    want = np.rint(x[0, :3] / d) * d
    got = R.q8_gpu(x)
    np.testing.assert_array_equal(got[0, :3], want.astype(np.float32))
    assert not got[0, 32:].any()


def test_gelu_f16_table_by_hand():
    x = np.array([-12.0, -10.0, 0.3, 1.7, 10.0, 11.5], np.float32)
    got = LC.gelu_f16_table(x)
    h = x[2:4].astype(np.float16).astype(np.float64)
    g = 0.5 * h * (1 + np.tanh(0.7978845608028654 * h * (1 + 0.044715 * h * h)))
    assert got[0] == 0 and got[1] == 0 and got[4] == 10.0 and got[5] == 11.5
    np.testing.assert_array_equal(got[2:4], g.astype(np.float16).astype(np.float32))


def test_f16_accumulator_attention_against_a_loop():
    """llama.cpp's per-row flash attention, written again as a scalar loop over keys."""
    rng = np.random.default_rng(3)
    n_head, n_kv, hd, T = 4, 2, 32, 6
    k = R.round_f16(rng.standard_normal((n_kv, T, hd)).astype(np.float32))
    v = R.round_f16(rng.standard_normal((n_kv, T, hd)).astype(np.float32))
    q = R.round_f16(rng.standard_normal((2, n_head, hd)).astype(np.float32))
    pos = np.array([T - 2, T - 1])
    got = LC.attention_f16_acc(q, pos, k, v, n_head // n_kv, 0, np.float32(0.25)).reshape(2, n_head, hd)
    for t in range(2):
        for h in range(n_head):
            M, S, acc = -np.inf, np.float32(0), np.zeros(hd, np.float16)
            for j in range(pos[t] + 1):
                s = np.float32(np.dot(q[t, h].astype(np.float64), k[h // 2, j].astype(np.float64))) * np.float32(0.25)
                ms, vs = np.float32(1), np.float32(1)
                if s > M:
                    ms, M = np.float32(np.exp(np.float64(M - s))), s
                    acc = (acc.astype(np.float32) * ms).astype(np.float16)
                else:
                    vs = np.float32(np.exp(np.float64(s - M)))
                acc = (acc.astype(np.float64) + v[h // 2, j].astype(np.float64) * vs).astype(np.float32).astype(np.float16)
                S = np.float32(S * ms + vs)
            np.testing.assert_allclose(got[t, h], acc.astype(np.float32) / S, rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("numerics", ["llamacpp", "q8"])
def test_rounded_numerics_stay_near_f32(smollm, numerics):
    """The 8-bit modes move SmolLM2's logits a little, never a lot (a wrong rounding rule or
    a wrong activation moves them by O(1))."""
    ids = [1, 504, 3575, 282, 4649, 314]
    f32 = smollm.forward(ids, smollm.new_cache(8), all_logits=True)
    m = R.ReferenceModel(smollm.g, numerics=numerics)
    got = m.forward(ids, m.new_cache(8), all_logits=True)
    d = np.abs(R.log_softmax(got) - R.log_softmax(f32))[np.arange(6), f32.argmax(-1)]
    assert 1e-4 < np.median(d) < 0.1, d


def test_available_memory_without_meminfo_takes_sysconf(monkeypatch):
    """No /proc/meminfo (another POSIX kernel): the free pages sysconf reports, so a cache that cannot fit
    is still refused."""
    import builtins
    import os

    real_open = builtins.open

    def no_meminfo(path, *a, **kw):
        if str(path) == "/proc/meminfo":
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_meminfo)
    got, free = R.available_memory(), os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert got is not None and abs(got - free) <= 0.1 * free  # free pages move between the two reads
