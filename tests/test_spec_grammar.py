"""Speculative decoding under an output constraint (memra.spec.decode.cut_draft,
DraftGrammar): drafts cut at the first token the grammar rejects, every verification row
under its position's mask, the output plain constrained decoding's token for token.

Oracles: plain constrained decoding without speculation, written out by hand in
tests/test_forced.py (_plain_host: memra run's host sampler, one position at a time;
_device_oracle: the engines' sampling rule) and the same code paths with --spec off; the
masks against a matcher walked by hand. The drafter knows the plain continuation and
corrupts it — with a control token no grammar accepts (the cut) and with an allowed but
different token (a rejection by verification) — so both paths are exercised."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from memra.model.gguf import open_gguf
from memra.sampling import Sampler, SamplingParams
from memra.spec.decode import SpecDecoder, cut_draft
from memra.text.grammar import allowed, new_masks
from memra.text.tokenizer import CONTROL

# path, tok, con: test_forced's module fixtures (the tiny llama Q4_K_M, its tokenizer, the schema)
from test_forced import (GREEDY, PENALIZED, SCHEMA, SEEDED, _device_oracle, _plain_host,  # noqa: F401
                         con, path, run_requests, tok)


def _bad(tok):
    """A control token that is no end-of-generation id: no grammar text matches it."""
    return next(i for i in range(tok.n_vocab) if tok.attrs[i] & CONTROL and i not in tok.eog_ids)


class _Corrupting:
    """Drafts the plain continuation of `prompt` (found in the history), with every
    `every`-th position replaced: alternately by a token the grammar never allows and by the
    plain token + 1 (mostly allowed where several are, a wrong guess). Counts what it
    proposed."""
    name = label = "corrupting"

    def __init__(self, prompt, plain, bad, every=4):
        self.prompt, self.plain, self.bad, self.every = list(prompt), list(plain), bad, every
        self.proposed = 0

    def draft(self, history, k):
        at = len(history) - len(self.prompt)
        out = []
        for i, t in enumerate(self.plain[at:at + k]):
            p = at + i
            if p % self.every == self.every - 1:
                t = self.bad if (p // self.every) % 2 == 0 else (t + 1) % 49152
            out.append(t)
        self.proposed += len(out)
        return out

    def close(self):
        pass


def test_cut_draft_stops_at_the_first_rejected_token_and_rolls_back(tok, con):
    """cut_draft keeps the longest prefix the grammar accepts (and nothing after a token
    that completes it); mask row i is the matcher's mask after the kept draft[:i] (walked
    here by hand); the matcher is where it was afterwards."""
    m, walk = con.matcher(), con.matcher()
    doc = tok.encode('{"order": {"id": 12, "status": "paid", "currency": "EUR", "items": [{"sku": "ABC12", '
                     '"qty": 3}]}, "paid": true}', add_special=False)
    assert m.consume_all(doc[:3]) and walk.consume_all(doc[:3])
    before = new_masks(1, tok.n_vocab)[0]
    m.fill(before)
    bad = _bad(tok)
    for draft, n_keep in ((doc[3:9], 6), (doc[3:6] + [bad] + doc[6:9], 3), ([bad], 0), ([], 0)):
        kept, masks = cut_draft(m, draft, tok.n_vocab)
        assert kept == draft[:n_keep] and masks.shape == (n_keep + 1, (tok.n_vocab + 31) // 32)
        w = con.matcher()
        assert w.consume_all(doc[:3])
        row = new_masks(1, tok.n_vocab)[0]
        for i in range(n_keep + 1):
            w.fill(row)
            np.testing.assert_array_equal(masks[i], row)
            if i < n_keep:
                assert allowed(row, tok.n_vocab)[kept[i]] and w.consume(kept[i])
        after = new_masks(1, tok.n_vocab)[0]
        m.fill(after)
        np.testing.assert_array_equal(after, before)  # rolled back
    # a draft that completes the document and runs on: cut after the closing token
    m2 = con.matcher()
    assert m2.consume_all(doc[:-2])
    kept, masks = cut_draft(m2, doc[-2:] + [5, 6], tok.n_vocab)
    assert kept == doc[-2:] and not m2.stopped
    assert set(np.flatnonzero(allowed(masks[-1], tok.n_vocab))) <= set(tok.eog_ids)


# -- memra run: session.generate with a SpecDecoder --------------------------------------------------

def _run(model, tok, prompt, con, params, n_ctx, spec=None):
    from memra.session import generate

    evs = list(generate(model, tok, prompt, params, n_ctx=n_ctx, constraint=con, spec=spec,
                        sampler=Sampler(params, tok.n_vocab)))
    return [e.token for e in evs[:-1]], evs[-1]


@pytest.fixture(scope="module")
def ref(path):
    from memra.cpu.reference import ReferenceModel

    return ReferenceModel(open_gguf(path), numerics="llamacpp")


@pytest.fixture(scope="module")
def gpu_engine(path):
    from gpu_emulator import FakeGpu

    from memra.gpu.engine import GPUEngine

    return GPUEngine(path, gpu=FakeGpu(1 << 28), n_ctx=160)


@pytest.mark.parametrize("engine,kw", [("cpu", SEEDED), pytest.param("cpu", GREEDY, marks=pytest.mark.slow),
                                       ("gpu", GREEDY), pytest.param("gpu", SEEDED, marks=pytest.mark.slow),
                                       pytest.param("gpu", PENALIZED, marks=pytest.mark.slow)])
def test_memra_run_spec_with_grammar_is_plain_constrained_decoding(ref, gpu_engine, tok, con, engine, kw):
    """memra run --spec with --json-schema (session.generate), on the CPU reference and the
    emulated GPU engine (drafts verified in one step there: forward_run), greedy, seeded
    and penalized: the hand-written oracle's tokens; drafts were cut by the grammar and
    rejected by verification, and accepted."""
    model = ref if engine == "cpu" else gpu_engine
    prompt = tok.encode("Order as JSON:", add_special=True)
    params = SamplingParams(max_tokens=70, **kw)
    want = _plain_host(model, tok, prompt, con, params, 160)
    drafter = _Corrupting(prompt, want, _bad(tok))
    dec = SpecDecoder(drafter, 4)
    got, end = _run(model, tok, prompt, con, params, 160, dec)
    assert got == want
    s = dec.stats
    assert drafter.proposed > s.drafted > s.accepted > 10  # cut by the grammar, then rejected
    assert s.steps < len(want) // 2
    if end.finish_reason in ("eos", "stop"):
        jsonschema.validate(json.loads(tok.decode([t for t in got if t not in tok.eog_ids])), SCHEMA)


def test_cli_spec_with_json_schema_runs(path, tok, tmp_path):
    """The CLI no longer refuses --spec with --json-schema: the tokens are those without
    --spec (the CPU reference, a seed)."""
    from typer.testing import CliRunner

    from memra.cli import app

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    args = ["run", str(path), "--device", "cpu", "--json", "-p", "Order as JSON:", "-n", "30", "--temp", "0.9",
            "--seed", "7", "--json-schema", str(schema)]
    outs = []
    for extra in ([], ["--spec", "lookup", "--spec-k", "4"]):
        res = CliRunner().invoke(app, args + extra)
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert outs[1]["tokens"] == outs[0]["tokens"] and outs[1]["spec"]["steps"] > 0


# -- the server's scheduler -------------------------------------------------------------------------

def _sched_run(engine, tok, reqs, spec=None, metrics=None):
    from memra.serve.scheduler import Scheduler

    sched = Scheduler(engine, tok, max_queue=8, max_batched_tokens=64, spec=spec, metrics=metrics)

    return [out for out, _ in run_requests(sched, reqs)]


@pytest.mark.parametrize("kw", [GREEDY, pytest.param(SEEDED, marks=pytest.mark.slow)], ids=["greedy", "seeded"])
def test_scheduler_spec_with_grammar_is_plain_constrained_decoding(path, tok, con, kw, monkeypatch):
    """The server's scheduler on the emulated GPU runner, --spec with a constrained request
    alone (every decode step speculates): the tokens of the same scheduler without --spec and
    without fast-forward (MEMRA_FORCED=0: one masked decode step a token; the emulator's
    numerics are not the CPU reference's), drafts cut by the grammar, verified under masks,
    accepted."""
    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner
    from memra.serve.metrics import Metrics
    from memra.serve.scheduler import GenRequest
    from memra.spec.decode import SpecServing

    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=160, max_seqs=2)
    prompt = tok.encode("Give JSON:", add_special=False)
    monkeypatch.setenv("MEMRA_FORCED", "0")
    (want,) = _sched_run(r, tok, [GenRequest(prompt, SamplingParams(max_tokens=70, **kw), constraint=con)])
    monkeypatch.setenv("MEMRA_FORCED", "1")
    drafter = _Corrupting(prompt, want, _bad(tok))
    m = Metrics("tiny")
    spec = SpecServing("oracle", 4, 1, lambda: drafter)
    calls = []
    real = r.verify
    r.verify = lambda *a, **k: calls.append(k.get("masks") is not None) or real(*a, **k)
    try:
        (got,) = _sched_run(r, tok, [GenRequest(prompt, SamplingParams(max_tokens=70, **kw), constraint=con)],
                            spec, m)
    finally:
        del r.verify
    assert got == want
    text = m.render().decode()
    drafted = float(next(l.split()[-1] for l in text.splitlines() if l.startswith("memra:spec_draft_tokens_total")))
    acc = float(next(l.split()[-1] for l in text.splitlines() if l.startswith("memra:spec_accepted_tokens_total")))
    assert drafter.proposed > drafted >= acc > 5  # cut by the grammar
    assert calls and all(calls)  # every verification under masks


@pytest.mark.slow
def test_server_spec_with_json_schema_through_the_openai_client(path, ref, tok, con):
    """memra serve --spec lookup on the CPU engine: a json_schema completion (seeded) is the
    device rule's plain constrained decoding, blocking and streamed; drafts were verified."""
    import httpx
    import openai

    from memra.serve.api import ServeConfig, Server

    s = Server(ServeConfig(model=str(path), alias="tiny", device="cpu", port=0, ctx_size=256, parallel=1,
                           spec="lookup", spec_k="4"))
    s.start_in_thread()
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)
        # JSON in the prompt: the lookup drafter finds its n-grams again in the output
        prompt = ('Order as JSON: {"order": {"id": 12, "status": "paid", "currency": "EUR", "items": '
                  '[{"sku": "ABC12", "qty": 3}]}, "paid": true}\nAnother one:')
        ids = tok.encode(prompt, add_special=True, parse_special=True)
        want = _device_oracle(ref, tok, con, ids, SEEDED, 60)
        want_text = tok.decode([t for t in want if t not in tok.eog_ids], skip_special=True)
        kw = dict(model="tiny", prompt=prompt, max_tokens=60, temperature=SEEDED["temperature"],
                  top_p=SEEDED["top_p"], seed=SEEDED["seed"],
                  extra_body={"json_schema": SCHEMA, "top_k": SEEDED["top_k"], "min_p": SEEDED["min_p"]})
        assert c.completions.create(**kw).choices[0].text == want_text
        pieces = [ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices]
        assert "".join(pieces) == want_text
        metrics = httpx.get(s.url + "/metrics", trust_env=False).text
        drafted = sum(float(l.split()[-1]) for l in metrics.splitlines()
                      if l.startswith("memra:spec_draft_tokens_total"))
        assert drafted > 0
    finally:
        s.stop()
