"""`memra synth`: synthetic GGUFs checked against independent oracles.

- block contents: `gguf.quants.dequantize` (values finite, near the intended scale) and
  gguf's own unpacking of the K-quant sub-scales;
- tensor types of a mix: the real Gemma-3-270M Q4_K_M and SmolLM2-135M Q4_1 files (made by
  llama.cpp's quantizer), and llama.cpp's "more bits" rule written out by hand;
- loading: memra's parser and config, and llama.cpp itself (tests/peer.py), which must load
  every tiny model, tokenize as the source model does, and produce finite log-probs.
"""

import hashlib
import math
from dataclasses import replace

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import Q4_K, dequantize

from memra.model import aliases, synth
from memra.model.config import read_config
from memra.errors import MemraError
from memra.model.gguf import open_gguf

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


# -- blocks -------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", sorted(synth.SYNTH_TYPES), ids=lambda t: t.name)
def test_random_blocks_dequantize_to_the_intended_scale(qtype):
    sigma = 0.02
    n = 256 * 2048
    raw = synth.random_blocks(qtype, n, sigma, seed=7)
    bs, ts = synth.GGML_QUANT_SIZES[qtype]
    assert raw.dtype == np.uint8 and raw.size == n // bs * ts
    x = dequantize(raw, qtype)
    assert x.size == n and np.isfinite(x).all()
    assert abs(x.std() / sigma - 1) < 0.1, x.std()
    assert abs(x.mean()) < 0.25 * sigma, x.mean()  # Q4_0/Q5_0/Q3_K/Q6_K: the -0.5 step bias
    assert len(np.unique(x[:4096])) > 8  # values, not a constant


def test_k_quant_sub_scales_unpack_as_intended():
    raw = synth.random_blocks(T.Q4_K, 256 * 512, 0.02, seed=3).reshape(-1, 144)
    sc, m = Q4_K.get_scale_min(raw[:, 4:16])  # gguf's own unpacking
    assert sc.min() >= 32 and sc.max() <= 63
    assert np.array_equal(m, np.rint(sc * 7.5 / 8).astype(np.uint8))  # centres q's mean 7.5 (dmin = 8 d)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32).ravel()
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32).ravel()
    np.testing.assert_allclose(dmin, 8 * d, rtol=2e-3)

    # Q3_K: 16 six-bit scales stored with +32; synth uses sub-scales 8..31
    raw3 = synth.random_blocks(T.Q3_K, 256 * 64, 0.02, seed=4).reshape(-1, 110)
    for b in range(4):  # a block whose quantized values are all +1 (q3 = 5) reveals d * scale
        blk = raw3[b:b + 1].copy()
        blk[:, 0:32] = 0xFF  # high bit set: offset 0
        blk[:, 32:96] = 0b01010101  # low bits 1 -> q = 1
        d = float(blk[:, 108:110].copy().view(np.float16)[0, 0])
        scales = dequantize(blk, T.Q3_K).reshape(16, 16)[:, 0] / d
        assert np.allclose(scales, np.round(scales)) and scales.min() >= 8 and scales.max() <= 31


def test_bytes_depend_on_seed_not_on_threads(tmp_path):
    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    a = synth.synth(tmp_path / "a.gguf", "llama", "tiny", "Q4_K_M", seed=1, threads=1)
    b = synth.synth(tmp_path / "b.gguf", "llama", "tiny", "Q4_K_M", seed=1, threads=3)
    c = synth.synth(tmp_path / "c.gguf", "llama", "tiny", "Q4_K_M", seed=2, threads=2)
    assert digest(a) == digest(b) != digest(c)


def test_bad_arguments_raise_memra_errors(tmp_path):
    for args in [("llama", "no-such-shape", "Q4_0"), ("mamba", "tiny-llama", "Q4_0"),
                 ("llama", "tiny", "Q7_X"), ("mamba", "tiny", "Q4_0")]:
        with pytest.raises(MemraError):
            synth.synth(tmp_path / "x.gguf", *args)
        assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(MemraError, match="unknown architecture 'mamba'"):  # not "unknown shape 'tiny-mamba'"
        synth.synth(tmp_path / "x.gguf", "mamba", "tiny", "Q4_0")
    # no architecture: the shape's own, llama for `tiny` (issue 15: `memra synth x.gguf` with its defaults)
    assert synth.resolve_shape("tiny", None) == synth.SHAPES["tiny-llama"]
    with pytest.raises(MemraError, match="cannot write"):
        synth.synth(tmp_path / "no-such-dir" / "x.gguf", "llama", "tiny", "Q4_0")


# -- tensor types: llama.cpp's quantizer ------------------------------------------------------

def _real_types(alias):
    g = open_gguf(aliases.resolve(alias))
    try:
        return {n: (T(t.ggml_type), t.shape) for n, t in g.tensors.items()}
    finally:
        g.close()


@pytest.mark.parametrize("alias,arch,shape,quant", [
    ("gemma3-270m", "gemma3", "gemma3-270m", "Q4_K_M"),
    ("smollm2-135m", "llama", "smollm2-135m", "Q4_1"),
])
def test_plan_reproduces_llama_cpp_quantized_files(alias, arch, shape, quant):
    s = synth.SHAPES[shape]
    planned = {tp.name: (tp.ggml_type, tp.shape) for tp in synth.plan(arch, s, quant, s.n_vocab)}
    assert planned == _real_types(alias)


def test_q4_k_m_more_bits_layers_llama3_8b():
    s = synth.SHAPES["llama3-8b"]
    types = {tp.name: tp.ggml_type for tp in synth.plan("llama", s, "Q4_K_M", s.n_vocab)}
    # llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, for n = 32 layers
    more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    for i in range(32):
        want = T.Q6_K if i in more else T.Q4_K
        assert types[f"blk.{i}.attn_v.weight"] == want, i
        assert types[f"blk.{i}.ffn_down.weight"] == want, i
        for k in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{k}.weight"] == T.Q4_K
        assert types[f"blk.{i}.attn_norm.weight"] == T.F32
    assert types["output.weight"] == T.Q6_K
    assert types["token_embd.weight"] == T.Q4_K
    total = sum(tp.n_bytes for tp in synth.plan("llama", s, "Q4_K_M", s.n_vocab))
    assert 4.90e9 < total < 4.94e9  # Llama-3-8B Q4_K_M files are 4.92 GB


def test_q4_k_m_file_on_disk(tiny_models):
    g = open_gguf(tiny_models("llama"))
    try:
        t = {n: T(ti.ggml_type) for n, ti in g.tensors.items()}
    finally:
        g.close()
    # 4 layers: n/8 = 0, 7n/8 = 3 -> layers 2 ((2-0)%3 == 2) and 3 get Q6_K
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(4)] == [T.Q4_K, T.Q4_K, T.Q6_K, T.Q6_K]
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(4)] == [T.Q4_K, T.Q4_K, T.Q6_K, T.Q6_K]
    assert t["output.weight"] == T.Q6_K and t["rope_freqs.weight"] == T.F32


@pytest.mark.parametrize("quant,bulk,head", [("Q4_0", T.Q4_0, T.Q6_K), ("Q8_0", T.Q8_0, T.Q8_0),
                                             ("F16", T.F16, T.F16), ("Q6_K", T.Q6_K, T.Q6_K)])
def test_pure_mixes(quant, bulk, head):
    s = synth.SHAPES["llama-1b"]
    types = {tp.name: tp.ggml_type for tp in synth.plan("llama", s, quant, s.n_vocab)}
    assert types["output.weight"] == head
    assert types["token_embd.weight"] == bulk
    assert {types[f"blk.{i}.{k}.weight"] for i in range(16)
            for k in ("attn_q", "attn_v", "ffn_down")} == {bulk}


# -- loading in memra and llama.cpp -----------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_in_memra(arch, tiny_models):
    shape = synth.SHAPES[f"tiny-{arch}"]
    path = tiny_models(arch)
    g = open_gguf(path)
    try:
        cfg = read_config(g)
        assert (cfg.arch, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.n_ff) == (
            arch, shape.n_embd, shape.n_layer, shape.n_head, shape.n_head_kv, shape.n_ff)
        assert cfg.head_dim == shape.head_size and cfg.n_vocab == 49152
        assert cfg.tied_output == (shape.tied or arch == "gemma3")
        if arch == "gemma3":
            assert cfg.swa_window == shape.sliding_window and not all(cfg.swa_layers)
        assert g.metadata["general.quantization_version"] == 2

        src = open_gguf(aliases.resolve("smollm2-135m"))
        try:
            for k, v in src.metadata.items():
                if k.startswith("tokenizer."):
                    assert np.array_equal(np.asarray(g.metadata[k]), np.asarray(v)), k
        finally:
            src.close()

        for tp in synth.plan(arch, shape, "Q4_K_M", 49152):
            t = g.tensor(tp.name)
            assert (T(t.ggml_type), t.shape) == (tp.ggml_type, tp.shape), tp.name
            x = dequantize(np.asarray(t.data), T(t.ggml_type))
            assert np.isfinite(x).all(), tp.name
            if len(tp.shape) == 2:
                assert abs(x.std() / tp.sigma - 1) < 0.15, (tp.name, x.std(), tp.sigma)
            else:
                assert np.abs(x - tp.center).max() <= tp.sigma * (1 + 1e-6) or tp.kind == "rope_freqs"
    finally:
        g.close()


@pytest.fixture(scope="module")
def peer_cls():
    from peer import LlamaCppPeer

    return LlamaCppPeer


@pytest.mark.parity
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_runs_in_llama_cpp(arch, tiny_models, peer_cls):
    with peer_cls(tiny_models(arch), n_ctx=256) as p:
        ids = p.tokenize("The quick brown fox jumps over the lazy dog")
        r = p.complete(ids, 12, n_probs=2)
    assert len(r["ids"]) == 12
    lp = np.array([[lp for _, lp in top] for top in r["top"] if top is not None])  # None: a byte token
    assert len(lp) >= 8 and lp.shape[1] == 2 and np.isfinite(lp).all()
    assert (lp[:, 0] < 0).any()  # logits are peaked, not one token with certainty everywhere


@pytest.mark.parity
@pytest.mark.parametrize("source,arch,special", [("smollm2-135m", "qwen3", "<|im_start|>"),
                                                 pytest.param("gemma3-270m", "gemma3", "<start_of_turn>",
                                                              marks=pytest.mark.slow)])  # 5-15 s: the 262k vocabulary
def test_copied_tokenizer_tokenizes_like_its_source(tiny_models, peer_cls, source, arch, special):
    text = f"Héllo 🤖 wörld {special}user\n  def f(x):\treturn x**2  # 12345"
    with peer_cls(aliases.resolve(source), n_ctx=256) as p:
        want = p.tokenize(text)
    with peer_cls(tiny_models(arch, tokenizer_from=source), n_ctx=256) as p:
        assert p.tokenize(text) == want
        r = p.complete(want, 4, n_probs=2)
    assert len(r["ids"]) == 4 and all(math.isfinite(lp) for top in r["top"] if top for _, lp in top)


@pytest.mark.parity
def test_padded_vocabulary(tmp_path, monkeypatch, peer_cls):
    # a real shape's vocabulary larger than the tokenizer's: padded with unused tokens
    monkeypatch.setitem(synth.SHAPES, "tiny-pad", replace(synth.SHAPES["tiny-llama"], n_vocab=50000))
    path = synth.synth(tmp_path / "pad.gguf", "llama", "tiny-pad", "Q4_0")
    g = open_gguf(path)
    try:
        toks = g.metadata["tokenizer.ggml.tokens"]
        types = g.metadata["tokenizer.ggml.token_type"]
        assert len(toks) == len(types) == 50000 == g.tensor("token_embd.weight").shape[0]
        assert toks[49152] == "<unused_0>" and toks[-1] == "<unused_847>"
        assert set(types[49152:].tolist()) == {synth.TOKEN_UNUSED}
        assert read_config(g).n_vocab == 50000
    finally:
        g.close()
    with peer_cls(path, n_ctx=128) as p:
        r = p.complete(p.tokenize("Hello"), 4, n_probs=2)
    assert len(r["ids"]) == 4
    assert all(math.isfinite(lp) for top in r["top"] if top for _, lp in top)


@pytest.mark.parity
def test_utf8_safe_tokenizer_streams_whole_utf8_and_tokenizes_ascii_as_before(tmp_path, peer_cls):
    """`memra synth --tokenizer-only --utf8-safe`: the byte-level tokens that are not whole
    UTF-8 on their own (checked here with Python's decoder on the source's token bytes) and
    only those are renamed <0xHEX>; every token is then whole UTF-8; ASCII text tokenizes as
    with the source, in memra and in llama.cpp, which detokenizes a renamed token to its name."""
    from typer.testing import CliRunner

    from memra.cli import app
    from memra.text.tokenizer import Tokenizer

    src = aliases.resolve("smollm2-135m")
    r = CliRunner().invoke(app, ["synth", str(tmp_path / "safe.gguf"), "--tokenizer-only", "--utf8-safe"])
    assert r.exit_code == 0, r.output
    path = synth.synth(tmp_path / "tiny.gguf", "llama", "tiny-llama", "Q4_0", tokenizer_from=str(tmp_path / "safe.gguf"))
    tok = {}
    for name, p in (("src", src), ("safe", path)):
        g = open_gguf(p)
        try:
            tok[name] = Tokenizer.from_gguf(g)
        finally:
            g.close()

    from test_tokenizer import _valid_utf8 as whole

    n = len(tok["src"].tokens)
    broken = [i for i in range(n) if not whole(tok["src"].token_bytes(i))]
    renamed = [i for i in range(n) if tok["safe"].tokens[i] != tok["src"].tokens[i]]
    assert broken and renamed == broken
    assert all(tok["safe"].tokens[i] == f"<0x{tok['src'].token_bytes(i).hex().upper()}>" for i in renamed)
    assert all(whole(tok["safe"].token_bytes(i)) for i in range(len(tok["safe"].tokens)))
    text = "Request 7: river garden window, music (1999) & the lazy dog's engine!"
    want = tok["src"].encode(text, add_special=False)
    assert tok["safe"].encode(text, add_special=False) == want
    with peer_cls(path, n_ctx=128) as p:
        assert p.tokenize(text, add_special=False) == want
        assert p.detokenize(renamed[:3]) == "".join(tok["safe"].tokens[i] for i in renamed[:3])
    r = CliRunner().invoke(app, ["synth", str(tmp_path / "x.gguf"), "--utf8-safe"])
    assert r.exit_code == 1 and "--tokenizer-only" in r.output and not (tmp_path / "x.gguf").exists()
