"""The GPU engine's orchestration, on the CPU: every kernel launch runs through the numpy
model of its launch contract (tests/gpu_emulator.py), and the engine's results are checked
against the CPU reference (memra.cpu.reference) on tiny synthetic models of each architecture.

This catches what the kernel checks cannot: a wrong buffer, view offset, stride, norm
weight, layer order, rope base per layer, sliding window, KV-cache row or device-side
state update in the engine. The kernels themselves are checked on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.gpu.engine import GPUEngine
from memra.gpu.gate import cross_check, teacher_forced
from memra.errors import ContextOverflowError, MemraError
from memra.model.gguf import open_gguf
from memra.cpu.reference import ReferenceModel, greedy_with_margins
from flatness import assert_not_flat

ARCHS = [("llama", "Q4_K_M"), ("qwen2", "Q8_0"), ("qwen3", "Q4_0"), ("gemma3", "Q4_K_M")]
N_GEN = 24  # crosses tiny-gemma3's 16-token sliding window
PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _reference(path, prompt, n, numerics="q8"):
    """The CPU reference's first logits, greedy tokens and top-2 margins under the numerics
    of the engine path compared with it (q8 path: numerics="q8"; f32 path: "f32")."""
    return greedy_with_margins(ReferenceModel(open_gguf(path), numerics=numerics), prompt, n)


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def case(request, tiny_models):
    arch, quant = request.param
    path = tiny_models(arch, quant)
    first, toks, margins = _reference(path, PROMPT, N_GEN, "q8")
    assert_not_flat(first, f"tiny {arch} {quant}", margins)
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28))  # the default path: q8
    assert eng.path == "q8"
    return arch, path, eng, first, toks, margins


def test_prefill_logits_match_reference(case):
    arch, path, eng, first, _, _ = case
    eng.reset()
    got = eng.prefill(PROMPT)
    # same roundings (q8 activations, f16 K/V) on both sides, only summation order differs; but
    # a 1e-7 difference can flip an activation's 8-bit rounding (the reference's own prefill
    # and decode differ by 1.3e-2 on tiny llama), so the bound is that of the q8 rounding noise,
    # still far below any orchestration mistake (a wrong weight, offset or position moves
    # logits by O(1))
    err = np.max(np.abs(got - first)) / np.max(np.abs(first))
    assert err < 0.05, f"{arch}: prefill logits differ from the reference by {err:.2e}"
    assert int(np.argmax(got)) == int(np.argmax(first))


def _teacher_forced(eng, path, toks, numerics):
    """The engine's decode log-probs on the prompt + the reference's greedy continuation,
    position by position against the reference's (memra.gpu.gate's bounds of the path)."""
    seq = PROMPT + toks
    x, dec = cross_check(eng, seq, min_positions=len(seq), keep=len(seq))
    assert x.verdict == "MATCH", x.line()
    ref = ReferenceModel(open_gguf(path), numerics=numerics)
    return teacher_forced(dec, seq, ref, path=numerics, n=len(seq))


def test_teacher_forced_logprobs_match_reference(case):
    """Every position of the prompt and the reference's 24-token greedy continuation, not
    just the tokens up to a first near-tie."""
    arch, path, eng, _, toks, _ = case
    t = _teacher_forced(eng, path, toks, "q8")
    assert t.verdict == "MATCH" and t.positions == len(PROMPT) + N_GEN, f"{arch}: {t.line()}"


def test_greedy_tokens_follow_the_device_argmax(case):
    """generate_greedy's tokens (argmax on the device, graph replays) are the argmax of the
    engine's own decode logits, step by step."""
    arch, path, eng, _, _, _ = case
    got = eng.generate_greedy(PROMPT, N_GEN)
    eng.reset()
    lg = eng.prefill(PROMPT)
    for i, t in enumerate(got):
        assert t == int(np.argmax(lg)), f"{arch}: token {i}"
        lg = eng.decode(t)


def test_graph_replay_equals_eager(case):
    arch, path, eng, _, toks, _ = case
    eng.reset()
    eng.prefill(PROMPT)
    eager = [eng.decode(t, graph=False) for t in toks[:6]]
    eng.reset()
    eng.prefill(PROMPT)
    graphed = [eng.decode(t, graph=True) for t in toks[:6]]
    for a, b in zip(eager, graphed):
        assert np.array_equal(a, b)


def test_cross_check_and_all_logits(case):
    arch, path, eng, first, _, _ = case
    gate, _ = cross_check(eng, PROMPT)
    assert gate.verdict == "MATCH" and gate.positions == 32, gate.line()
    eng.reset()
    every = eng.prefill(PROMPT, all_logits=True)
    assert every.shape == (len(PROMPT), eng.cfg.n_vocab)
    eng.reset()
    assert np.array_equal(eng.prefill(PROMPT), every[-1])


def test_sampling_reproducible_and_seeded(case):
    arch, path, eng, _, _, _ = case
    a = eng.generate(PROMPT, 8, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    b = eng.generate(PROMPT, 8, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    c = eng.generate(PROMPT, 8, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=12)
    assert a == b
    assert a != c
    greedy = eng.generate(PROMPT, 8, temperature=0.0, seed=5)
    assert greedy == eng.generate_greedy(PROMPT, 8)


def test_reference_protocol(case):
    """new_cache/forward as memra.session drives the CPU reference."""
    arch, path, eng, first, toks, _ = case
    cache = eng.new_cache(48)
    got = eng.forward(PROMPT, cache)
    assert cache.pos == len(PROMPT)
    nxt = eng.forward([toks[0]], cache)
    assert cache.pos == len(PROMPT) + 1
    eng.reset()
    eng.prefill(PROMPT)
    assert np.array_equal(eng.decode(toks[0]), nxt)
    eng.reset()
    assert np.array_equal(eng.prefill(PROMPT), got)


def test_batch_invariance(tiny_models):
    """A sequence's greedy tokens are the same alone and next to another sequence."""
    path = tiny_models("qwen3", "Q4_0")
    other = [1, 5, 9, 200, 3000]
    alone = GPUEngine(path, n_ctx=48, gpu=FakeGpu(1 << 28)).generate_greedy(PROMPT, 10)
    pair = GPUEngine(path, n_ctx=48, batch=2, gpu=FakeGpu(1 << 28)).generate_greedy_batch([PROMPT, other], 10)
    assert pair[0] == alone


def test_bad_input(tiny_models):
    eng = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=16, gpu=FakeGpu(1 << 28))
    with pytest.raises(MemraError, match="outside the vocabulary"):
        eng.prefill([1, 10 ** 7])
    with pytest.raises(ContextOverflowError):
        eng.prefill(list(range(1, 18)))
    with pytest.raises(ContextOverflowError):
        eng.generate_greedy(PROMPT, 10)


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("gemma3", "Q4_K_M")])
def test_f32_path(tiny_models, arch, quant):
    """The rollback path (float32 activations): logits and greedy tokens against the float32
    reference (numerics="f32"; the engine's K/V stay f16), prefill = decode, graph = eager."""
    path = tiny_models(arch, quant)
    first, toks, margins = _reference(path, PROMPT, 12, "f32")
    assert_not_flat(first, f"tiny {arch} {quant}", margins)
    eng = GPUEngine(path, n_ctx=48, gpu=FakeGpu(1 << 28), matvec_path="f32")
    got = eng.prefill(PROMPT)
    err = np.max(np.abs(got - first)) / np.max(np.abs(first))
    assert err < 2e-3, f"{arch}: f32-path prefill logits off by {err:.2e}"
    t = _teacher_forced(eng, path, toks, "f32")
    assert t.verdict == "MATCH" and t.positions == len(PROMPT) + 12, f"{arch}: {t.line()}"
    eng.reset()
    eng.prefill(PROMPT)
    eager = [eng.decode(t, graph=False) for t in toks[:4]]
    eng.reset()
    eng.prefill(PROMPT)
    assert all(np.array_equal(eng.decode(t), e) for t, e in zip(toks[:4], eager))


def test_q8_reference_differs_from_f32(tiny_models):
    """The q8 numerics are not a no-op, and they are the engine's: the q8 engine's logits equal
    the q8 reference's token-by-token decode (whose float32 row sums come closest to the
    kernels' order: no rounding flips here) to 1e-5, and sit 1e-2 off the float32 reference."""
    path = tiny_models("llama", "Q4_K_M")
    f32, _, _ = _reference(path, PROMPT, 0, "f32")
    m = ReferenceModel(open_gguf(path), numerics="q8")
    cache = m.new_cache(len(PROMPT))
    for t in PROMPT:
        q8 = m.forward([t], cache)
    got = GPUEngine(path, n_ctx=48, gpu=FakeGpu(1 << 28), matvec_path="q8", attn="decode").prefill(PROMPT)
    scale = np.max(np.abs(f32))
    assert np.max(np.abs(got - q8)) / scale < 1e-5
    assert np.max(np.abs(got - f32)) / scale > 1e-3


class _LogitsOnly:
    """The engine without its device-side stream: memra.session samples every token on
    the CPU from the logits."""

    def __init__(self, eng):
        self.eng = eng

    def new_cache(self, n_ctx):
        return self.eng.new_cache(n_ctx)

    def forward(self, tokens, cache):
        return self.eng.forward(tokens, cache)


def test_generate_streams_tokens_from_the_device(case):
    """memra.session on the GPU engine takes the ids the device chose (read back in chunks):
    greedy equals the logits-per-token path and generate_greedy; seeded draws equal
    generate's; a penalty falls back to the CPU sampler."""
    from memra.session import generate
    from memra.sampling import SamplingParams
    from memra.text.tokenizer import Tokenizer

    arch, path, eng, _, toks, _ = case
    tok = Tokenizer.from_gguf(open_gguf(path))

    def run(model, **kw):
        p = SamplingParams(max_tokens=20, **kw)
        return [ev.token for ev in generate(model, tok, PROMPT, p, n_ctx=40, ignore_eos=True) if not ev.done]

    greedy = run(eng, temperature=0.0)
    assert greedy == run(_LogitsOnly(eng), temperature=0.0) == eng.generate_greedy(PROMPT, 20)
    drawn = run(eng, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    assert drawn == eng.generate(PROMPT, 20, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    # a repetition penalty needs the logits on the CPU: same tokens as the logits-only path
    pen = dict(temperature=0.0, repeat_penalty=1.3)
    assert run(eng, **pen) == run(_LogitsOnly(eng), **pen)
