"""`memra run --json --logprobs N`: each generated token's log-probability and its N most
likely alternatives, the server's numbers under the server's definition
(memra.sampling.logprob_entry: the raw logits of the token's position, before penalties,
temperature and any constraint mask, in float64).

Oracles, each independent of the code under test:
- the server (`memra serve --device cpu`) through the official openai client, greedy, with
  `logprobs`/`top_logprobs` (its CPU engine computes one position at a time, the CLI's CPU
  reference prefills the prompt in one batch: the numbers agree to float rounding);
- a log-softmax written out here over the logits of the reference model (memra.cpu.reference)
  teacher-forced over the CLI's tokens: the same forwards as the CLI, so to float64 rounding;
- on the emulated GPU (tests/gpu_emulator.py): the same hand log-softmax over the GPU engine's
  teacher-forced logits, the CLI's tokens without --logprobs (the device sampler still draws
  them), and the server's scheduler on the emulated runner with a `logprobs` request.
The model is a tiny synthetic llama with SmolLM2's vocabulary."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from memra.cli import app
from memra.cpu.reference import ReferenceModel
from memra.model.gguf import open_gguf
from memra.text.tokenizer import Tokenizer

PROMPT = "Tell me about the sea"
REGEX = r"(yes|no|maybe), [a-z]{2,6}\."


@pytest.fixture(scope="module")
def path(tiny_models):
    # Q8_0: llama.cpp's CPU kernels for it round a batched prompt as one position at a time
    # (its Q4_K / Q6_K gemms do not), so the CLI's CPU reference and the server's CPU engine
    # compute the same logits
    return tiny_models("llama", "Q8_0")


@pytest.fixture(scope="module")
def tok(path):
    return Tokenizer.from_gguf(open_gguf(path))


def _run(*args) -> dict:
    res = CliRunner().invoke(app, ["run", *map(str, args), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(next(x for x in res.stdout.splitlines() if x.startswith("{")))


def _log_softmax(lg) -> np.ndarray:
    x = np.asarray(lg, np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def _teacher_forced(model, prompt, tokens) -> list[np.ndarray]:
    """The logits each of `tokens` was chosen from: the prompt's forward, then one token a
    forward (what memra run does on either engine)."""
    cache = model.new_cache(len(prompt) + len(tokens) + 1)
    out = [np.array(model.forward(list(prompt), cache), np.float32)]
    for t in tokens[:-1]:
        out.append(np.array(model.forward([t], cache), np.float32))
    return out


def _check_against(doc, tok, logits, k, tol):
    """Every entry of doc's logprobs: the token, its log-prob and the top k (ids, bytes,
    values, best first with ties by id) under a hand log-softmax of `logits`."""
    assert len(doc["logprobs"]) == len(doc["tokens"]) == len(logits)
    for e, t, lg in zip(doc["logprobs"], doc["tokens"], logits):
        ls = _log_softmax(lg)
        assert e["id"] == t and bytes(e["bytes"]) == tok.token_bytes(t)
        assert e["token"] == tok.token_bytes(t).decode("utf-8", "replace")
        assert e["logprob"] == pytest.approx(ls[t], abs=tol)
        top = np.lexsort((np.arange(ls.size), -ls))[:k]
        assert [x["id"] for x in e["top_logprobs"]] == [int(i) for i in top]
        assert [bytes(x["bytes"]) for x in e["top_logprobs"]] == [tok.token_bytes(int(i)) for i in top]
        assert [x["logprob"] for x in e["top_logprobs"]] == pytest.approx([ls[i] for i in top], abs=tol)


# -- the flag's checks (nothing is loaded) ---------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--json", "--logprobs", "21"], "--logprobs must be in [0, 20]"),
    (["--json", "--logprobs", "-1"], "--logprobs must be in [0, 20]"),
    (["--logprobs", "3"], "--logprobs needs --json"),
    (["--json", "--logprobs", "3", "--spec", "lookup"], "--logprobs cannot be used with --spec"),
])
def test_bad_logprobs_are_refused_before_loading(args, needle):
    res = CliRunner().invoke(app, ["run", "/nonexistent/model.gguf", "-p", "x", "--device", "cpu", *args])
    assert res.exit_code == 1 and needle in res.output and "Traceback" not in res.output, res.output


def test_session_refuses_bad_logprobs(path, tok):
    from memra.errors import MemraError
    from memra.sampling import SamplingParams
    from memra.session import generate

    ref = ReferenceModel(open_gguf(path), numerics="llamacpp")
    for bad in (21, -1, True, 2.0):
        with pytest.raises(MemraError, match="logprobs must be an integer"):
            list(generate(ref, tok, [1, 2], SamplingParams(max_tokens=2), logprobs=bad))
    with pytest.raises(MemraError, match="speculative"):
        list(generate(ref, tok, [1, 2], SamplingParams(max_tokens=2), logprobs=1, spec=object()))


def test_one_definition_of_a_logprob():
    """The server's scheduler and memra run call the same function, and bound N alike."""
    import memra.sampling as S
    import memra.serve.api as api
    import memra.serve.scheduler as sch

    assert sch.logprob_entry is S.logprob_entry
    assert api.MAX_TOP_LOGPROBS == S.MAX_TOP_LOGPROBS == 20
    lg = np.array([1.0, 3.0, 3.0, -2.0], np.float32)
    lp, top = S.logprob_entry(lg, 3, 3)
    ls = _log_softmax(lg)
    assert lp == pytest.approx(ls[3], abs=1e-12)
    assert [i for i, _ in top] == [1, 2, 0]  # best first, a tie by id
    assert S.logprob_entry(lg, 0, 0)[1] == []


# -- the CPU reference: the hand log-softmax and the server ----------------------------------------

@pytest.mark.parametrize("extra", [pytest.param(["--temp", "0"], marks=pytest.mark.slow),
                                   ["--temp", "1.2", "--seed", "9", "--repeat-penalty", "1.5"]],
                         ids=["greedy", "seeded-penalized"])
def test_cli_cpu_logprobs_are_the_reference_log_softmax(path, tok, extra):
    """Greedy, and seeded with penalties (the logprobs are the raw logits', not the penalized
    ones): the teacher-forced reference's log-softmax at every token, to float64 rounding;
    the tokens are those of the same run without --logprobs."""
    ref = ReferenceModel(open_gguf(path), numerics="llamacpp")
    args = [path, "-p", PROMPT, "-n", "8", "--ignore-eos", "--device", "cpu", *extra]
    doc = _run(*args, "--logprobs", "3")
    plain = _run(*args)
    assert doc["tokens"] == plain["tokens"] and plain["logprobs"] is None
    _check_against(doc, tok, _teacher_forced(ref, doc["prompt_ids"], doc["tokens"]), 3, 1e-9)


@pytest.fixture(scope="module")
def server(path):
    from memra.serve.api import ServeConfig, Server

    s = Server(ServeConfig(model=str(path), alias="tiny", device="cpu", port=0, ctx_size=256, parallel=2))
    s.start_in_thread()
    yield s
    s.stop()


def _client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _same_as_chat(doc, content):
    """doc's logprobs against the server's chat `logprobs.content` (an entry per token)."""
    assert len(content) == len(doc["logprobs"])
    for e, c in zip(doc["logprobs"], content):
        assert e["token"] == c.token and e["bytes"] == c.bytes
        assert e["logprob"] == c.logprob
        assert [x["bytes"] for x in e["top_logprobs"]] == [y.bytes for y in c.top_logprobs]
        assert [x["token"] for x in e["top_logprobs"]] == [y.token for y in c.top_logprobs]
        assert [x["logprob"] for x in e["top_logprobs"]] == [y.logprob for y in c.top_logprobs]


def test_cli_cpu_logprobs_match_the_server(server, path, tok):
    """A chat turn, greedy, 3 alternatives: the CLI's tokens, texts, bytes and numbers are the
    server's (chat logprobs through the openai client); with --logprobs 0 the server's
    completion endpoint's with logprobs=0 for the same prompt: equal floats (the server's CPU engine computes the prompt
    one position at a time, the CLI's reference in one batch: the same bits on this Q8_0
    model)."""
    n = 10
    doc = _run(path, "-p", PROMPT, "--chat", "-n", n, "--temp", "0", "--ignore-eos", "--device", "cpu",
               "--logprobs", "3")
    r = _client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=n, temperature=0, logprobs=True, top_logprobs=3,
                                                extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == len(doc["tokens"]) == n
    assert r.choices[0].message.content == doc["text"]
    _same_as_chat(doc, r.choices[0].logprobs.content)
    # N = 0: the chosen token's log-prob alone, as the server's logprobs=0
    doc = _run(path, "-p", PROMPT, "-n", n, "--temp", "0", "--ignore-eos", "--device", "cpu", "--logprobs", "0")
    c = _client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=n, temperature=0, logprobs=0,
                                           extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert c.choices[0].text == doc["text"] and len(doc["logprobs"]) == n
    assert lp.tokens == [e["token"] for e in doc["logprobs"]]
    assert lp.token_logprobs == [e["logprob"] for e in doc["logprobs"]]
    assert all(e["top_logprobs"] == [] for e in doc["logprobs"]) and lp.top_logprobs == [{}] * n


@pytest.mark.slow
def test_cli_constrained_logprobs_are_raw_and_not_fast_forwarded(server, path, tok):
    """--regex with --logprobs: the tokens of the run without it, no token fast-forwarded
    (each forced token gets its own position's logits, as the server does for such requests),
    the numbers of the raw logits — some top alternatives are tokens the constraint forbade —
    and the server's for the same constrained request."""
    from memra.text.grammar import allowed, compile_constraint, new_masks

    args = [path, "-p", PROMPT, "-n", "40", "--temp", "0", "--device", "cpu", "--regex", REGEX]
    plain = _run(*args)
    doc = _run(*args, "--logprobs", "3")
    assert doc["tokens"] == plain["tokens"] and plain["n_forced"] > 0 and doc["n_forced"] == 0
    ref = ReferenceModel(open_gguf(path), numerics="llamacpp")
    toks = doc["tokens"]
    end = toks[-1] in tok.eog_ids  # the constraint completed: its end token took no model step
    assert end and doc["logprobs"][-1] is None
    body = dict(doc, tokens=toks[:-1], logprobs=doc["logprobs"][:-1])
    _check_against(body, tok, _teacher_forced(ref, doc["prompt_ids"], body["tokens"]), 3, 1e-9)
    m, words = compile_constraint(tok, "regex", REGEX).matcher(), new_masks(1, tok.n_vocab)
    forbidden = 0
    for e in body["logprobs"]:
        m.fill(words[0])
        ok = allowed(words[0], tok.n_vocab)
        forbidden += sum(not ok[x["id"]] for x in e["top_logprobs"])
        assert m.consume(e["id"])
    assert forbidden > 0
    c = _client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, logprobs=3,
                                           extra_body={"regex": REGEX})
    lp = c.choices[0].logprobs
    assert c.choices[0].text == doc["text"]
    assert lp.tokens == [e["token"] for e in body["logprobs"]]
    assert lp.token_logprobs == [e["logprob"] for e in body["logprobs"]]


# -- the GPU engine on the emulated GPU ------------------------------------------------------------

@pytest.fixture
def gpu_cli(monkeypatch, tiny_models):
    """`memra run --device gpu` in-process on the emulated engine (tests/test_gates.py's)."""
    from gpu_emulator import install

    return install(monkeypatch)


def _scheduler_logprobs(runner, tok, prompt, params, k):
    """The server's scheduler on a runner: one request with logprobs; its (tokens, entries)."""
    from memra.serve.scheduler import GenRequest, Scheduler

    sched = Scheduler(runner, tok, max_queue=4, max_batched_tokens=64)
    req = GenRequest(list(prompt), params, logprobs=k, ignore_eos=True)

    async def go():
        sched.submit(req)
        out = []
        async for ev in req.events():
            if ev[0] == "token":
                out.extend((t, lp) for t, lp, _ in ev[3])   # the tokens whose text the event releases
            elif ev[0] == "error":
                raise AssertionError(ev)
        return out

    sched.start()
    try:
        return asyncio.run(go())
    finally:
        sched.stop()


@pytest.mark.slow
def test_cli_gpu_logprobs_emulated(gpu_cli, path, tok):
    """--device gpu, seeded on the device sampler: the tokens of the run without --logprobs;
    the numbers are the hand log-softmax of the GPU engine's teacher-forced logits and the
    server's scheduler's for the same request on the emulated runner (tokens and entries)."""
    from memra.gpu.engine import GPUEngine
    from memra.gpu.runner import Runner
    from memra.sampling import SamplingParams

    n = 8
    args = [path, "-p", PROMPT, "-n", n, "--temp", "0.9", "--seed", "5", "--top-k", "20", "--ignore-eos",
            "--device", "gpu"]
    doc = _run(*args, "--logprobs", "3")
    plain = _run(*args)
    assert doc["tokens"] == plain["tokens"] and len(doc["tokens"]) == n
    eng = GPUEngine(path, gpu=gpu_cli, n_ctx=64)
    _check_against(doc, tok, _teacher_forced(eng, doc["prompt_ids"], doc["tokens"]), 3, 1e-9)
    params = SamplingParams(temperature=0.9, seed=5, top_k=20, top_p=0.95, min_p=0.05, max_tokens=n)
    got = _scheduler_logprobs(Runner(path, gpu=gpu_cli, max_len=64, max_seqs=2), tok, doc["prompt_ids"], params, 3)
    assert [t for t, _ in got] == doc["tokens"]
    for (t, (lp, top)), e in zip(got, doc["logprobs"]):
        assert lp == e["logprob"]
        assert top == [(x["id"], x["logprob"]) for x in e["top_logprobs"]]
