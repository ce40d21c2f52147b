"""The GPU engine on the GPU: greedy tokens against the CPU reference (memra.cpu.reference) on
the real models and on tiny synthetic models of every architecture, the argmax gate,
graph replay against eager decode, and batch invariance."""

from __future__ import annotations

import numpy as np
import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]

NEAR_TIE = 0.05
PROMPT = "The capital of France is Paris. The capital of Germany is"


def _prompt_ids(path):
    from memra.model.gguf import open_gguf
    from memra.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(open_gguf(path)).encode(PROMPT, add_special=True, parse_special=True)


def _reference_greedy(path, prompt, n, numerics):
    """The CPU reference's greedy tokens under the numerics of the engine path it checks
    (q8 path: numerics="q8", f32 path: "f32")."""
    from memra.model.gguf import open_gguf
    from memra.cpu.reference import ReferenceModel, greedy_with_margins

    _, toks, margins = greedy_with_margins(ReferenceModel(open_gguf(path), numerics=numerics), prompt, n)
    return toks, margins


def _assert_same_or_near_tie(name, got, ref, margins):
    if got == ref:
        return
    i = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
    assert margins[i] < NEAR_TIE, (f"{name}: greedy token {i} is {got[i]}, the CPU reference's is {ref[i]} "
                                   f"(reference top-2 margin {margins[i]:.3f} is not a near-tie)")


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real(request):
    from memra.model.aliases import resolve
    from memra.gpu.engine import GPUEngine

    path = resolve(request.param)
    return request.param, path, GPUEngine(path, n_ctx=512), _prompt_ids(path)


def test_real_model_greedy_matches_reference(real):
    """The default (q8) path against the CPU reference in exact float32 math and in the q8
    path's roundings. Rounding activations to 8 bits moves logits by ~0.1-0.3 (and a 1e-5
    float-order difference can flip a rounding), so at a position where exact math is
    undecided the two references themselves split: on this prompt they part at token 25
    on both models, where the f32 margin is 0.027 (Gemma-3) and 0.024 (SmolLM2) but the q8
    reference's 0.074 and 0.15. So: the GPU's first divergence from the f32 reference must
    be a near-tie of f32; its first divergence from the q8 reference must be a near-tie of
    q8, unless there it follows the f32 reference (the split above)."""
    name, path, eng, ids = real
    _assert_tracks_references(name, path, ids, eng.generate_greedy(ids, 64), eng.path)


def _assert_tracks_references(name, path, ids, got, engine_path):
    f32, f32_margins = _reference_greedy(path, ids, len(got), "f32")
    _assert_same_or_near_tie(name + " vs f32 reference", got, f32, f32_margins)
    if engine_path == "f32":
        return
    q8, q8_margins = _reference_greedy(path, ids, len(got), engine_path)
    if got != q8:
        i = next(i for i, (a, b) in enumerate(zip(got, q8)) if a != b)
        if got[:i + 1] != f32[:i + 1]:
            _assert_same_or_near_tie(name + " vs q8 reference", got, q8, q8_margins)


def test_real_model_f32_path_greedy_matches_reference(real):
    from memra.gpu.engine import GPUEngine

    name, path, _, ids = real
    ref, margins = _reference_greedy(path, ids, 64, "f32")
    eng = GPUEngine(path, n_ctx=512, matvec_path="f32")
    _assert_same_or_near_tie(name, eng.generate_greedy(ids, 64), ref, margins)


def test_real_model_argmax_gate(real):
    from memra.gpu.engine import argmax_gate

    name, path, eng, ids = real
    gate = argmax_gate(eng, ids)
    assert gate.verdict in ("MATCH", "NEAR-TIE"), gate.line()


def test_graph_replay_bit_identical_to_eager(real):
    """256 decode steps: graph replays and eager launches give the same logits, bit for bit."""
    name, path, eng, ids = real
    eng.reset()
    eng.prefill(ids)
    toks = eng.generate_greedy(ids, 256)  # a realistic token stream to teacher-force
    eng.reset()
    eng.prefill(ids)
    eager = [eng.decode(t, graph=False) for t in toks]
    eng.reset()
    eng.prefill(ids)
    for i, t in enumerate(toks):
        assert np.array_equal(eng.decode(t, graph=True), eager[i]), f"{name}: step {i} differs"


def test_batch_invariance(real):
    from memra.gpu.engine import GPUEngine

    name, path, eng, ids = real
    alone = eng.generate_greedy(ids, 32)
    others = [ids[: max(1, len(ids) // 2)], list(reversed(ids))]
    batched = GPUEngine(path, n_ctx=512, batch=3).generate_greedy_batch([others[0], ids, others[1]], 32)
    assert batched[1] == alone


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("qwen2", "Q8_0"), ("qwen3", "Q4_0"),
                                        ("gemma3", "Q4_K_M")])
def test_tiny_models_greedy_matches_reference(tiny_models, arch, quant):
    from memra.gpu.engine import GPUEngine, argmax_gate

    path = tiny_models(arch, quant)
    ids = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]
    eng = GPUEngine(path, n_ctx=64)
    _assert_tracks_references(arch, path, ids, eng.generate_greedy(ids, 32), eng.path)
    assert argmax_gate(eng, ids).verdict == "MATCH"
