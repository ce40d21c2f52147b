"""Speculative decoding (memra.spec): the output must be plain decode's token for token.

The oracle is plain decode on the same engine (one token fed, one chosen a step), run
independently of the speculative loop; drafters are checked against hand-worked histories.
The fast tests use a tiny synthetic model on the CPU engine and the emulated GPU runner; the
SmolLM2 gate (K = 1..8, greedy and seeded, and its canary) is marked slow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from memra.errors import MemraError
from memra.gpu.runner import Row, Sampling
from memra.gpu.ops.sample import reference_sample
from memra.model.gguf import open_gguf
from memra.serve.cpu_engine import CpuRunner
from memra.spec.check import run_check
from memra.spec.decode import DeviceTarget, KPolicy, SpecStats, parse_k, plain_stream, spec_stream
from memra.spec.drafters import LookupDrafter, make_drafter, parse_spec, same_vocab

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


# -- the lookup drafter ----------------------------------------------------------------------

def test_lookup_takes_the_longest_ngram_and_its_most_recent_occurrence():
    d = LookupDrafter(1, 3)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    hist = [5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7]
    # suffix (5, 6, 7) occurred at 0..2, followed by 8, 9, 6 ...; (6, 7) more recently at 5..6
    # (followed by 1) but the longer n-gram wins
    assert d.draft(hist, 3) == [8, 9, 6]
    d2 = LookupDrafter(1, 2)
    # with n <= 2 the most recent (6, 7) wins: it was followed by 1, 2, 5
    assert d2.draft(list(hist), 3) == [1, 2, 5]


def test_lookup_never_matches_the_suffix_itself_and_respects_n_min():
    d = LookupDrafter(2, 3)
    assert d.draft([1, 2, 3, 4], 4) == []          # no earlier occurrence of any suffix
    assert d.draft([7, 3, 9, 3], 4) == []          # only a 1-gram repeats; n_min is 2
    assert LookupDrafter(1, 3).draft([7, 3, 9, 3], 2) == [9, 3]
    assert d.draft([1, 2, 3], 0) == []


def test_lookup_follows_a_repeating_pattern_past_the_end_of_the_history():
    d = LookupDrafter(2, 2)
    # (1, 2) at 0..1 continues with 1, 2 which is the suffix itself: the pattern goes on
    assert d.draft([1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]


def test_lookup_index_grows_incrementally_as_a_fresh_one_would_see_it():
    rng = np.random.default_rng(3)
    hist: list[int] = []
    inc = LookupDrafter(1, 4)
    for _ in range(300):
        hist.append(int(rng.integers(0, 6)))
        fresh = LookupDrafter(1, 4).draft(list(hist), 5)
        assert inc.draft(hist, 5) == fresh
    # a different history (a new request) rebuilds the index
    assert inc.draft([9, 8, 9], 2) == [8, 9]


def test_spec_strings_parse_and_bad_ones_are_clear_errors():
    assert parse_spec("lookup") == ("lookup", (2, 4))
    assert parse_spec("lookup:1-3") == ("lookup", (1, 3))
    assert parse_spec("trim") == ("trim", None)
    assert parse_spec("trim:6") == ("trim", 6)
    assert parse_spec("draft:x.gguf") == ("draft", "x.gguf")
    for bad in ("", "lookahead", "lookup:3-1", "trim:x", "trim:0", "draft:"):
        with pytest.raises(MemraError):
            parse_spec(bad)
    assert parse_k("auto") == "auto" and parse_k("3") == 3
    with pytest.raises(MemraError):
        parse_k("0")


class _G:
    def __init__(self, tokens):
        self.metadata = {"tokenizer.ggml.tokens": tokens}


def test_a_draft_model_with_another_vocabulary_is_refused():
    same_vocab(_G(["a", "b"]), _G(["a", "b"]), "d.gguf")
    with pytest.raises(MemraError, match="different vocabulary: 3 tokens, the target 2"):
        same_vocab(_G(["a", "b"]), _G(["a", "b", "c"]), "d.gguf")
    with pytest.raises(MemraError, match="token 1 is 'x' there, 'b' in the target"):
        same_vocab(_G(["a", "b"]), _G(["a", "x"]), "d.gguf")


def test_adaptive_k_grows_on_full_acceptance_and_shrinks_on_poor():
    p = KPolicy("auto")
    k0 = p.k
    p.update(k0, k0)
    assert p.k == k0 + 1
    p.update(p.k, 0)
    p.update(p.k, 1)
    assert p.k == k0 - 1
    for _ in range(20):
        p.update(p.k, p.k)
    assert p.k == 8
    f = KPolicy(3)
    f.update(3, 0)
    assert f.k == 3


# -- the loop on the CPU engine ----------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_engine(tiny_models):
    g = open_gguf(tiny_models("llama", "Q4_K_M"))
    return CpuRunner(g, max_len=128, max_seqs=3)


def _plain(eng, prompt, n, sm):
    t = DeviceTarget(eng, sm)
    try:
        return list(plain_stream(t, prompt, n))
    finally:
        t.close()


class _Oracle:
    """A drafter that knows plain decode's continuation and corrupts every `every`-th
    position it proposes: partial acceptance at every K, rollbacks of every length."""
    label = name = "oracle"

    def __init__(self, prompt, plain, every=3):
        self.p, self.plain, self.every = len(prompt), plain, every

    def draft(self, history, k):
        at = len(history) - self.p
        out = list(self.plain[at:at + k])
        return [t if (at + i) % self.every else (t + 1) % 1000 for i, t in enumerate(out)]

    def close(self):
        pass


@pytest.mark.parametrize("sm", [Sampling(0.0), Sampling(0.8, 40, 0.95, 0.05, 11)], ids=["greedy", "seeded"])
def test_partially_wrong_drafts_are_rolled_back_and_the_output_is_plain_decode(cpu_engine, sm):
    n = 14
    plain = _plain(cpu_engine, PROMPT, n, sm)
    for k in (1, 5):
        st = SpecStats("oracle", k)
        t = DeviceTarget(cpu_engine, sm)
        got = list(spec_stream(t, PROMPT, n, _Oracle(PROMPT, plain), KPolicy(k), st))
        assert t.n == len(PROMPT) + n - 1  # the last token is chosen, never fed
        t.close()
        assert got == plain, k
        assert st.accepted > 0 and st.drafted > st.accepted
    # the canary turns the same comparison red
    t = DeviceTarget(cpu_engine, sm)
    got = list(spec_stream(t, PROMPT, n, _Oracle(PROMPT, plain), KPolicy(4), SpecStats("c", 4), canary=True))
    t.close()
    assert got != plain


def test_verify_chooses_each_position_as_decode_and_a_rewind_forgets_the_rest(cpu_engine):
    eng = cpu_engine
    sm = Sampling(0.9, 0, 1.0, 0.0, 5)
    # the oracle: decode steps feeding their own choices, each drawn at its own position
    b = eng.open()
    eng.step([Row(b, PROMPT)])
    n0 = b.n
    fed, want = [3], []
    for i in range(5):
        lg = eng.step([Row(b, [fed[-1]], logits="last")])[0].logits
        want.append(reference_sample(lg, sm.temperature, sm.top_k, sm.top_p, sm.min_p, sm.seed, n0 + i + 1))
        fed.append(want[-1])
    eng.close(b)
    a = eng.open()
    eng.step([Row(a, PROMPT)])
    # a draft that agrees with every choice is verified whole: one choice per position
    assert eng.verify(a, fed[:5], sm) == want and a.n == n0 + 5
    # a draft wrong from its second token: the engine stops at the first disagreement
    eng.rewind(a, n0)
    wrong = [fed[0], fed[1], (fed[2] + 1) % 100, 4, 4]
    got = eng.verify(a, wrong, sm)
    assert got == want[:2] and a.n == n0 + 2
    # rewinding to the accepted prefix: the next step is what a fresh sequence computes
    eng.rewind(a, n0 + 1)
    nxt = eng.step([Row(a, [want[0]], logits="last")])[0].logits
    c = eng.open()
    ref = eng.step([Row(c, PROMPT + [3, want[0]], logits="last")])[0].logits
    np.testing.assert_array_equal(nxt, ref)
    eng.close(a)
    eng.close(c)


def _check(cpu_engine, tiny_models, prompts, n, ks, **kw):
    g = open_gguf(tiny_models("llama", "Q4_K_M"))
    drafter = make_drafter("trim:1", gguf=g, cfg=cpu_engine.cfg, device="cpu", n_ctx=128,
                           target=cpu_engine.model)
    return run_check(cpu_engine, drafter, prompts, n, ks, **kw)


def test_spec_check_is_identical_and_its_canary_is_red(cpu_engine, tiny_models):
    rep = _check(cpu_engine, tiny_models, [PROMPT], 6, [2, 8])
    assert rep.identical, rep.first
    assert [(c.mode, c.k, c.identical) for c in rep.cells] == [("greedy", 2, 1), ("greedy", 8, 1),
                                                               ("seeded", 2, 1), ("seeded", 8, 1)]
    assert sum(c.drafted for c in rep.cells) > sum(c.accepted for c in rep.cells) > 0
    assert rep.canary == "red"
    broken = _check(cpu_engine, tiny_models, [PROMPT], 6, [4], modes=("greedy",), canary=True)
    assert not broken.identical and broken.first.k == 4 and broken.first.mode == "greedy"


@pytest.mark.slow
def test_spec_check_every_k_from_1_to_8(cpu_engine, tiny_models):
    rep = _check(cpu_engine, tiny_models, [PROMPT, [1, 5, 6, 5, 6, 5, 6]], 10, list(range(1, 9)) + ["auto"])
    assert rep.identical, rep.first
    assert len(rep.cells) == 18 and all(c.identical == c.prompts == 2 for c in rep.cells)
    assert rep.canary == "red"


# -- the emulated GPU runner ---------------------------------------------------------------

@pytest.mark.slow
def test_runner_verify_is_decode_at_every_position_on_the_emulator(tiny_models):
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner

    r = Runner(tiny_models("llama", "Q4_K_M"), gpu=FakeGpu(1 << 28), max_len=96, max_seqs=4)
    for sm in (Sampling(0.0), Sampling(0.8, 40, 0.95, 0.05, 3)):
        plain = _plain(r, PROMPT, 10, sm)
        for rep in range(2):  # the second time the verification step replays its graph
            st = SpecStats("oracle", 4)
            t = DeviceTarget(r, sm)
            got = list(spec_stream(t, PROMPT, 10, _Oracle(PROMPT, plain, every=4), KPolicy(4), st))
            t.close()
            assert got == plain
            assert st.accepted > 0 and st.drafted > st.accepted
        assert any(k[0] == "verify" for k in r._graphs)


# -- memra run --spec on the CPU ----------------------------------------------------------

def _run_json(path, *args):
    from memra.cli import app

    res = CliRunner().invoke(app, ["run", str(path), "--device", "cpu", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_memra_run_spec_gives_plain_runs_tokens_with_a_seed_and_penalties(tiny_models):
    path = tiny_models("llama", "Q4_K_M")
    args = ["-p", "one two one two one two", "-n", "10", "--temp", "0.9", "--seed", "7",
            "--repeat-penalty", "1.3"]
    plain = _run_json(path, *args)
    spec = _run_json(path, *args, "--spec", "trim:1", "--spec-k", "3")
    assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
    assert plain["spec"] is None
    s = spec["spec"]
    assert s["drafter"] == "trim:1" and s["k"] == 3 and s["steps"] > 0 and s["drafted"] >= s["accepted"]


def test_memra_run_refuses_a_bad_spec_before_loading(tiny_models):
    from memra.cli import app

    res = CliRunner().invoke(app, ["run", str(tiny_models("llama", "Q4_K_M")), "--device", "cpu", "-p", "x",
                                   "--spec", "lookahead"])
    assert res.exit_code == 1 and "--spec must be" in res.output


# -- SmolLM2 (slow) --------------------------------------------------------------------------

@pytest.mark.slow
def test_spec_check_smollm2_cpu_all_identical_and_the_canary_red(tmp_path):
    from memra.cli import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("Copy the list exactly.\\nList: red, green, blue, yellow.\\nCopy: red,\n")
    res = CliRunner().invoke(app, ["spec-check", "smollm2-135m", "--device", "cpu", "-n", "12", "--k", "1-8",
                                   "--prompts", str(prompts)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "ALL IDENTICAL"
    assert any(l.startswith("canary: a verifier that accepts one wrong token turns this check red") for l in lines)
    assert sum(1 for l in lines if l.strip().startswith("K=")) == 16
    red = CliRunner().invoke(app, ["spec-check", "smollm2-135m", "--device", "cpu", "-n", "12", "--k", "8",
                                   "--canary", "--greedy-only"])
    assert red.exit_code == 1 and "DIFFERENT:" in red.stdout


@pytest.mark.slow
def test_lookup_accepts_on_an_input_grounded_prompt_smollm2():
    from memra.model.aliases import resolve

    p = "Copy the list exactly.\nList: red, green, blue, yellow, orange, purple.\nCopy: red, green,"
    plain = _run_json(resolve("smollm2-135m"), "-p", p, "-n", "12", "--temp", "0")
    spec = _run_json(resolve("smollm2-135m"), "-p", p, "-n", "12", "--temp", "0", "--spec", "lookup:1-3")
    assert spec["tokens"] == plain["tokens"]
    assert spec["spec"]["accepted"] >= 3 and spec["spec"]["steps"] < 12


# -- the server's scheduler ------------------------------------------------------------------

class _PromptOracle:
    """Drafts each request's plain continuation (found by its prompt), wrong at every
    third position, so the scheduler's speculative steps accept and roll back."""
    label = name = "oracle"

    def __init__(self, plains):
        self.plains = plains  # tuple(prompt) -> plain tokens

    def draft(self, history, k):
        for p, plain in self.plains.items():
            if tuple(history[:len(p)]) == p:
                at = len(history) - len(p)
                return [t if (at + i) % 3 else (t + 1) % 1000 for i, t in enumerate(plain[at:at + k])]
        return []

    def close(self):
        pass


def test_the_scheduler_speculates_small_batches_and_gives_plain_decode_tokens(tiny_models):
    import asyncio

    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner
    from memra.sampling import SamplingParams
    from memra.serve.metrics import Metrics
    from memra.serve.scheduler import GenRequest, Scheduler
    from memra.spec.decode import SpecServing
    from memra.text.tokenizer import Tokenizer

    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    runner = Runner(path, max_len=96, max_seqs=4, gpu=FakeGpu(1 << 28))
    prompts = [PROMPT, [1, 300, 301, 302, 303, 304, 305]]
    n_gen = 7
    params = [SamplingParams(temperature=0, max_tokens=n_gen), SamplingParams(temperature=0.8, seed=9,
                                                                             max_tokens=n_gen)]
    sms = [Sampling(0.0), Sampling(0.8, 40, 0.95, 0.05, 9)]
    want = {(tuple(p), i): _plain(runner, p, n_gen, sm) for p in prompts for i, sm in enumerate(sms)}
    m = Metrics("tiny")
    oracles = [_PromptOracle({tuple(p): want[(tuple(p), i)] for p in prompts}) for i in range(2)]
    spec = SpecServing("oracle", 4, 1, None)
    sched = Scheduler(runner, Tokenizer.from_gguf(g), max_queue=8, max_batched_tokens=64, metrics=m, spec=spec)

    async def run(reqs):
        for r in reqs:
            sched.submit(r)

        async def one(r):
            return [ev[1] async for ev in r.events() if ev[0] == "token"]
        return await asyncio.gather(*(one(r) for r in reqs))

    sched.start()
    try:
        for i in range(2):
            spec.new_drafter = lambda i=i: oracles[i]
            p = prompts[i]  # alone: every decode step speculates
            got = asyncio.run(run([GenRequest(p, params[i], ignore_eos=True)]))[0]
            assert got == want[(tuple(p), i)], (i, p)
            # together (two decoding > --spec-max-batch 1): plain batched rows, same tokens
            got = asyncio.run(run([GenRequest(p, params[i], ignore_eos=True) for p in prompts]))
            assert got == [want[(tuple(p), i)] for p in prompts]
    finally:
        sched.stop()
    text = m.render().decode()
    drafted = float(next(l.split()[-1] for l in text.splitlines() if l.startswith("memra:spec_draft_tokens_total")))
    acc = float(next(l.split()[-1] for l in text.splitlines() if l.startswith("memra:spec_accepted_tokens_total")))
    assert drafted > acc > 0


def test_memra_runs_gpu_path_session_generate_with_spec_on_the_emulator(tiny_models):
    """memra run --device gpu's path: session.generate over the GPU engine (plain: the
    device sampler streaming from chained decode graphs) vs a SpecDecoder (verification
    steps on the same engine): the same tokens, greedy and seeded."""
    from gpu_emulator import FakeGpu
    from memra.gpu.engine import GPUEngine
    from memra.sampling import Sampler, SamplingParams
    from memra.session import generate
    from memra.spec.decode import SpecDecoder
    from memra.text.tokenizer import Tokenizer

    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    tok = Tokenizer.from_gguf(g)
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28))

    def run(params, spec=None):
        evs = generate(eng, tok, PROMPT, params, n_ctx=64, ignore_eos=True, sampler=Sampler(params, eng.cfg.n_vocab),
                       spec=spec)
        return [e.token for e in evs if not e.done]

    for params in (SamplingParams(temperature=0, max_tokens=8), SamplingParams(temperature=0.8, seed=4, max_tokens=8)):
        plain = run(params)
        dec = SpecDecoder(_Oracle(PROMPT, plain), 3)
        assert run(params, dec) == plain
        assert dec.stats.accepted > 0 and dec.stats.drafted > dec.stats.accepted
