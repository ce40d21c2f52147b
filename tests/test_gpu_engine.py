"""The GPU engine on the GPU: log-probs against the CPU reference (memra.cpu.reference) at
every position of a prompt and a 64-token continuation, teacher-forced, on the real models
and on tiny synthetic models of every architecture; both exactness gates (memra.gpu.gate);
graph replay against eager decode; batch invariance.

The per-position bounds are memra.gpu.gate's TF_BOUND / TF_MEDIAN_BOUND of the engine's
path, set from measurement (experiments/gate_noise.py: the q8 path's activation roundings
flip under any other summation order, so its bound is 0.5 per position, the f32 path's
0.03). Teacher forcing compares every position whatever happened before it, so a near-tie
early in the continuation no longer ends the check (the greedy comparison stopped at the
first divergence where the reference's margin was under 0.05: token 7 of 24 on tiny qwen3).
The continuation is the reference's own greedy one (an independent choice of tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]

PROMPT = "The capital of France is Paris. The capital of Germany is"
TINY_PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _prompt_ids(path):
    from memra.model.gguf import open_gguf
    from memra.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(open_gguf(path)).encode(PROMPT, add_special=True, parse_special=True)


def _teacher_forced(eng, path, ids, n_gen):
    """The engine's decode log-probs on the prompt + the reference's greedy continuation of
    n_gen tokens against the reference's, in the numerics of the engine's path; the gate's
    prefill = decode check over the same positions first."""
    from memra.cpu.reference import ReferenceModel, greedy_with_margins
    from memra.gpu.gate import cross_check, teacher_forced
    from memra.model.gguf import open_gguf

    ref = ReferenceModel(open_gguf(path), numerics=eng.path)
    first, toks, margins = greedy_with_margins(ref, list(ids), n_gen)
    seq = list(ids) + toks
    x, dec = cross_check(eng, seq, min_positions=len(seq), keep=len(seq))
    assert x.verdict == "MATCH", x.line()
    t = teacher_forced(dec, seq, ref, path=eng.path, n=len(seq))
    print(t.line())
    return t, first, margins


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real(request):
    from memra.model.aliases import resolve
    from memra.gpu.engine import GPUEngine

    path = resolve(request.param)
    return request.param, path, GPUEngine(path, n_ctx=512), _prompt_ids(path)


def test_real_model_teacher_forced_against_reference(real):
    """The default (q8) path against the reference in the q8 path's roundings."""
    name, path, eng, ids = real
    t, _, _ = _teacher_forced(eng, path, ids, 64)
    assert t.verdict == "MATCH" and t.positions == len(ids) + 64, f"{name}: {t.line()}"


def test_real_model_f32_path_teacher_forced_against_reference(real):
    from memra.gpu.engine import GPUEngine

    name, path, _, ids = real
    eng = GPUEngine(path, n_ctx=512, matvec_path="f32")
    t, _, _ = _teacher_forced(eng, path, ids, 64)
    assert t.verdict == "MATCH" and t.positions == len(ids) + 64, f"{name}: {t.line()}"


def test_real_model_gates(real):
    """What `memra run` and `memra bench` run before any figure: both gates MATCH."""
    from memra.gpu.gate import run_gates

    name, path, eng, ids = real
    x, t = run_gates(eng, ids)
    print(x.line())
    print(t.line())
    assert x.verdict == "MATCH", x.line()
    assert t.verdict == "MATCH", t.line()


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
def test_tiny_models_teacher_forced_against_reference(tiny_models, arch, quant):
    from flatness import assert_not_flat
    from memra.gpu.engine import GPUEngine
    from memra.gpu.gate import run_gates

    path = tiny_models(arch, quant)
    eng = GPUEngine(path, n_ctx=64)
    t, first, margins = _teacher_forced(eng, path, TINY_PROMPT, 32)
    assert_not_flat(first, f"tiny {arch} {quant}", margins)  # else the comparison says nothing
    assert t.verdict == "MATCH" and t.positions == len(TINY_PROMPT) + 32, f"{arch}: {t.line()}"
    x, tf = run_gates(eng, TINY_PROMPT)
    assert x.verdict == "MATCH" and tf.verdict == "MATCH", (x.line(), tf.line())
