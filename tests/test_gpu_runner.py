"""The runner on the GPU: a sequence's greedy tokens and logits are bit-identical alone and
among 63 co-runners at other positions with other sampling settings (issue 9's batch
invariance), and a captured decode step replays exactly its eager launches at every graph
bucket, on both real models and a synthetic llama-1b."""

from __future__ import annotations

import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]

PROMPT = "The capital of France is Paris. The capital of Germany is"


def _model(name, tmp_path_factory):
    if name.startswith("synth:"):
        from memra.tune.bench import resolve_model

        return resolve_model(name, "smollm2-135m")[1]
    from memra.model.aliases import resolve

    return resolve(name)


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m", "synth:llama-1b:Q4_0"])
def runner(request, tmp_path_factory):
    from memra.gpu.runner import Runner
    from memra.model.gguf import open_gguf
    from memra.text.tokenizer import Tokenizer

    path = _model(request.param, tmp_path_factory)
    ids = Tokenizer.from_gguf(open_gguf(path)).encode(PROMPT, add_special=True, parse_special=True)
    return request.param, Runner(path, max_len=512, max_seqs=64), ids


def test_alone_equals_among_63_co_runners(runner):
    from memra.tune.invariance import batch_invariance

    name, r, ids = runner
    res = batch_invariance(r, ids, n_steps=24, co=63)
    assert res["identical"], f"{name}: {res}"


def test_graph_replay_equals_eager_at_every_bucket(runner):
    from memra.tune.invariance import graph_vs_eager

    name, r, ids = runner
    res = graph_vs_eager(r, ids)
    assert res["identical"], f"{name}: {res}"
