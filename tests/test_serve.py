"""`memra serve --device cpu` as users meet it: the official `openai` client (and httpx for
the raw wire) against a real uvicorn server on a loopback port, SmolLM2 on the CPU engine.

Oracles: the CPU reference's own greedy continuation (ReferenceModel in the llamacpp
numerics, the prompt in one forward pass as `memra run --device cpu` computes it) and its
log-softmax; the tokenizer; the openai client's parsing; prometheus-client's parser;
counts computed by hand from the block size. Nothing here compares the server with a
captured output of itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from memra.cpu.reference import ReferenceModel
from memra.model.aliases import resolve
from memra.model.gguf import open_gguf
from memra.serve.api import ServeConfig, Server
from memra.text.chat import chat_tokens, render_chat
from memra.text.tokenizer import Tokenizer

MODEL = "smollm2-135m"
BLOCK = 16


@pytest.fixture(scope="module")
def ref():
    g = open_gguf(resolve(MODEL))
    m = ReferenceModel(g, numerics="llamacpp")
    tok = Tokenizer.from_gguf(g)
    memo = {}

    def greedy(ids, n, bias=None):
        """(tokens, logits each was chosen from) of the reference's greedy continuation,
        ending at an end-of-generation token. bias: {token id: value} added (in float64) to
        the logits before each argmax, OpenAI's logit_bias; the logits returned are the raw ones."""
        key = (tuple(ids), n, tuple(sorted((bias or {}).items())))
        if key not in memo:
            add = np.zeros(m.cfg.n_vocab)
            for t, v in (bias or {}).items():
                add[t] = v
            cache = m.new_cache(len(ids) + n + 1)
            lg = m.forward(list(ids), cache)
            toks, lgs = [], []
            for i in range(n):
                lgs.append(lg)
                toks.append(int(np.argmax(lg.astype(np.float64) + add)))
                if toks[-1] in tok.eog_ids or i + 1 == n:
                    break
                lg = m.forward([toks[-1]], cache)
            memo[key] = (toks, lgs)
        return memo[key]

    return g, tok, greedy


@pytest.fixture(scope="module")
def server():
    s = Server(ServeConfig(model=MODEL, device="cpu", port=0, ctx_size=256, parallel=4, max_queue=64))
    s.start_in_thread()
    yield s
    s.stop()


def client(s, key="none", **kw):
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=300, **kw)


def completion_ids(tok, text):
    return tok.encode(text, add_special=True, parse_special=True)


def text_of(tok, ids):
    return tok.decode([t for t in ids if t not in tok.eog_ids], skip_special=True)


def metrics_of(s, key=None):
    from prometheus_client.parser import text_string_to_metric_families

    h = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(s.url + "/metrics", headers=h, trust_env=False)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for smp in fam.samples:
            labels = {k: v for k, v in smp.labels.items() if k != "model_name"}
            out[(smp.name, tuple(sorted(labels.items())))] = smp.value
    return out


def metric(ms, name, **labels):
    return ms.get((name, tuple(sorted(labels.items()))), 0.0)


def error_of(r: httpx.Response) -> dict:
    doc = r.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}, doc
    return doc["error"]


# -- completions and chat -------------------------------------------------------------------------

PROMPT = "The capital of France is"


def test_completion_is_the_reference_greedy_continuation(server, ref):
    g, tok, greedy = ref
    r = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    ids = completion_ids(tok, PROMPT)
    want, _ = greedy(ids, 8)
    assert len(want) == 8, "the oracle ended early: pick another prompt"
    c = r.choices[0]
    assert c.text == text_of(tok, want)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8  # max_tokens, exactly
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.total_tokens == len(ids) + 8
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.model == MODEL and r.id.startswith("cmpl-") and r.created > 0
    assert r.system_fingerprint and r.object == "text_completion"


def test_stop_strings_never_leak(server, ref):
    g, tok, greedy = ref
    want = text_of(tok, greedy(completion_ids(tok, PROMPT), 8)[0])
    # two stops that occur in the reference text: the output ends before the earlier one
    a, b = want[3:6], want[8:12]
    assert a and b and a in want and b in want
    cut = min(want.index(a), want.index(b))
    c = client(server)
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[b, a])
    assert r.choices[0].text == want[:cut] and r.choices[0].finish_reason == "stop"
    r1 = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=b)
    assert r1.choices[0].text == want[:want.index(b)] and r1.choices[0].finish_reason == "stop"
    # streamed: the concatenated deltas hold no part of the stop string
    parts, finish = [], None
    for ch in c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=b, stream=True):
        if ch.choices:
            parts.append(ch.choices[0].text)
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == want[:want.index(b)] and finish == "stop"
    # log-probs: the tokens the reply holds (their text begins before the cut), not the stop string's past it,
    # blocking and streamed alike
    ids = greedy(completion_ids(tok, PROMPT), 8)[0]
    starts = [len(text_of(tok, ids[:i])) for i in range(len(ids))]
    kept = [tok.token_bytes(t).decode("utf-8", "replace") for t, o in zip(ids, starts) if o < want.index(b)]
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=b, logprobs=1)
    assert r.choices[0].logprobs.tokens == kept and len(kept) < len(ids)
    streamed = [t for ch in c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=b,
                                                 logprobs=1, stream=True)
                if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert streamed == kept


CHAT = [{"role": "user", "content": "Name a colour."}]


def test_a_developer_message_is_rendered_as_a_system_message(server, ref):
    """OpenAI's "developer" role (its newer name for the system prompt) renders through the template as
    "system" does: the reference's greedy tokens for the system-role prompt."""
    g, tok, greedy = ref
    sys_chat = [{"role": "system", "content": "Answer in one word."}] + CHAT
    ids = chat_tokens(tok, render_chat(g, sys_chat, add_generation_prompt=True))
    want, _ = greedy(ids, 4)
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": "Answer in one word."}] + CHAT, max_tokens=4,
        temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == text_of(tok, want)


def test_chat_stream_with_usage_and_logprobs(server, ref):
    g, tok, greedy = ref
    ids = chat_tokens(tok, render_chat(g, CHAT, add_generation_prompt=True))
    want, lgs = greedy(ids, 6)
    c = client(server)
    chunks = list(c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, logprobs=True,
                                            top_logprobs=3))
    assert chunks[0].choices[0].delta.role == "assistant"
    body = [ch for ch in chunks if ch.choices]
    text = "".join(ch.choices[0].delta.content or "" for ch in body)
    assert text == text_of(tok, want)
    finish = [ch.choices[0].finish_reason for ch in body if ch.choices[0].finish_reason]
    assert finish == (["stop"] if want[-1] in tok.eog_ids else ["length"])
    # the last chunk: no choices, the whole usage
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(want)
    assert last.usage.prompt_tokens == len(ids)
    assert all(ch.usage is None for ch in chunks[:-1])
    # one log-prob per generated token (an end-of-generation token has none): the reference's
    # log-softmax at the chosen token, and its 3 most likely tokens in order
    lps = [x for ch in body if ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    n_text = len([t for t in want if t not in tok.eog_ids])
    assert len(lps) == n_text
    for x, t, lg in zip(lps, want, lgs):
        ls = lg.astype(np.float64) - np.log(np.exp(lg.astype(np.float64) - lg.max()).sum()) - lg.max()
        assert bytes(x.bytes) == tok.token_bytes(t)
        assert x.logprob == pytest.approx(ls[t], abs=1e-5)
        top = np.argsort(-ls, kind="stable")[:3]
        assert [bytes(y.bytes) for y in x.top_logprobs] == [tok.token_bytes(int(i)) for i in top]
        assert [y.logprob for y in x.top_logprobs] == pytest.approx([ls[i] for i in top], abs=1e-5)
    # blocking, max_completion_tokens: the same reply and log-probs
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=6, temperature=0,
                                  logprobs=True, top_logprobs=3)
    assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
    assert [x.logprob for x in r.choices[0].logprobs.content] == pytest.approx([x.logprob for x in lps], abs=1e-9)
    assert r.usage.completion_tokens == len(want) and r.object == "chat.completion"
    # the system prompt's blocks were computed by the first request: this one reused them
    assert r.usage.prompt_tokens_details.cached_tokens == (len(ids) - 1) // BLOCK * BLOCK


def test_stop_token_ids_end_the_reply(server, ref):
    """vLLM's stop_token_ids: the reply ends at the first of them (finish_reason stop), which is counted in usage
    but is neither in the text nor in the log-probs; ids outside the vocabulary are a 400 naming the field."""
    g, tok, greedy = ref
    want, _ = greedy(completion_ids(tok, PROMPT), 8)
    k = next(i for i in range(2, 8) if want[i] not in want[:i])
    c = client(server)
    for ignore_eos in (False, True):
        r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1,
                                 extra_body={"stop_token_ids": [want[k]], "ignore_eos": ignore_eos})
        ch = r.choices[0]
        assert ch.text == text_of(tok, want[:k]) and ch.finish_reason == "stop"
        assert r.usage.completion_tokens == k + 1
        assert ch.logprobs.tokens == [tok.token_bytes(t).decode("utf-8", "replace") for t in want[:k]]
    for bad in (-1, tok.n_vocab):
        r = httpx.post(server.url + "/v1/completions", trust_env=False,
                       json={"prompt": PROMPT, "max_tokens": 2, "stop_token_ids": [bad]})
        assert r.status_code == 400 and error_of(r)["param"] == "stop_token_ids", r.text


def test_min_tokens_holds_the_end_back(server, ref):
    """vLLM's min_tokens: before it, end-of-generation tokens are not chosen and stop strings not matched. A chat
    reply the reference ends by itself after L tokens runs to min_tokens = max_tokens = L + 3 as the reference's
    greedy argmax with the end-of-generation ids banned; a stop string met before min_tokens does not cut the
    reply; min_tokens above max_tokens, negative, or with an output constraint is a 400 naming it."""
    g, tok, greedy = ref
    msgs = [{"role": "user", "content": "Say hi."}]
    ids = chat_tokens(tok, render_chat(g, msgs, add_generation_prompt=True))
    plain, _ = greedy(ids, 60)
    assert plain[-1] in tok.eog_ids, "the oracle did not end by itself: pick another prompt"
    n = len(plain) + 2
    want, _ = greedy(ids, n, {e: -100 for e in tok.eog_ids})
    assert len(want) == n and not set(want) & set(tok.eog_ids)
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=n, temperature=0,
                                  extra_body={"min_tokens": n})
    assert r.choices[0].message.content == text_of(tok, want) and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == n
    # a stop string inside the first tokens: cut without min_tokens, not with it
    head = text_of(tok, plain[:3])
    stop = head[-3:]
    kw = dict(model=MODEL, messages=msgs, max_tokens=8, temperature=0, stop=[stop])
    assert c.chat.completions.create(**kw).choices[0].finish_reason == "stop"
    r = c.chat.completions.create(**kw, extra_body={"min_tokens": 8})
    assert r.choices[0].message.content == text_of(tok, plain[:8]) and r.choices[0].finish_reason == "length"
    for extra in ({"min_tokens": 9}, {"min_tokens": -1}, {"min_tokens": 2, "response_format": {"type": "json_object"}}):
        rr = httpx.post(server.url + "/v1/chat/completions", trust_env=False,
                        json={"messages": msgs, "max_tokens": 8, **extra})
        assert rr.status_code == 400 and error_of(rr)["param"] == "min_tokens", rr.text


def test_completion_logprobs(server, ref):
    g, tok, greedy = ref
    ids = completion_ids(tok, PROMPT)
    want, lgs = greedy(ids, 8)
    r = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == [tok.token_bytes(t).decode("utf-8", "replace") for t in want[:3]]
    for j in range(3):
        lg = lgs[j].astype(np.float64)
        ls = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
        assert lp.token_logprobs[j] == pytest.approx(ls[want[j]], abs=1e-5)
        top = np.argsort(-ls, kind="stable")[:2]
        assert list(lp.top_logprobs[j].values()) == pytest.approx([ls[i] for i in top], abs=1e-5)
    assert lp.text_offset == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]


ECHO = ("The quick brown fox jumps over the lazy dog, and then it runs across the wide green field towards "
        "the old stone bridge where the miller waits for the evening cart, counting every sack of grain twice")


def _log_softmax(lg) -> np.ndarray:
    x = np.asarray(lg, np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def _prompt_logits(g, ids) -> list:
    """The reference's logits after each prompt position, one position at a time."""
    m = ReferenceModel(g, numerics="llamacpp")
    cache = m.new_cache(len(ids) + 1)
    return [m.forward([t], cache) for t in ids]


def test_echo_with_logprobs_scores_the_prompt(server, ref):
    """Completions' echo with logprobs and max_tokens 0 (how evaluation harnesses score a text): the reply is the
    prompt's text, every prompt token listed with the reference's log-softmax of the position before it (the
    first token's null), its top alternatives and offsets into the text; no token generated. The prompt is
    computed whole even when the prefix cache holds it (a hit would leave positions without logits)."""
    g, tok, greedy = ref
    ids = completion_ids(tok, ECHO)
    assert len(ids) > 2 * BLOCK  # full blocks the prefix cache could have offered
    lgs = _prompt_logits(g, ids)
    c = client(server)
    salt = f"echo-{time.time()}"
    c.completions.create(model=MODEL, prompt=ECHO, max_tokens=1, temperature=0, extra_body={"cache_salt": salt})
    r = c.completions.create(model=MODEL, prompt=ECHO, max_tokens=0, echo=True, logprobs=2,
                             extra_body={"cache_salt": salt})
    ch = r.choices[0]
    assert ch.text == tok.decode(ids, skip_special=True) == ECHO
    assert ch.finish_reason == "length" and r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    lp = ch.logprobs
    assert lp.tokens == [tok.token_bytes(t).decode("utf-8", "replace") for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        ls = _log_softmax(lgs[i - 1])
        assert lp.token_logprobs[i] == pytest.approx(ls[ids[i]], abs=1e-5)
        top = np.argsort(-ls, kind="stable")[:2]
        assert list(lp.top_logprobs[i].keys()) == [tok.token_bytes(int(t)).decode("utf-8", "replace") for t in top]
        assert list(lp.top_logprobs[i].values()) == pytest.approx([ls[t] for t in top], abs=1e-5)
    assert all(ch.text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_then_the_reply(server, ref):
    """echo with max_tokens > 0: the prompt's text then the reference's greedy reply, blocking and streamed; with
    logprobs the reply's entries follow the prompt's, their offsets past the prompt's text; n = 2 choices each
    carry the prompt (the second takes the first's prompt log-probs)."""
    g, tok, greedy = ref
    ids = completion_ids(tok, ECHO)
    want, lgs = greedy(ids, 4)
    reply = text_of(tok, want)
    c = client(server)
    r = c.completions.create(model=MODEL, prompt=ECHO, max_tokens=4, temperature=0, echo=True, logprobs=1, n=2)
    for ch in r.choices:
        assert ch.text == ECHO + reply
        lp = ch.logprobs
        assert len(lp.tokens) == len(ids) + len(want) and lp.token_logprobs[0] is None
        assert lp.token_logprobs[len(ids)] == pytest.approx(_log_softmax(lgs[0])[want[0]], abs=1e-5)
        assert lp.text_offset[len(ids)] == len(ECHO)
        assert all(ch.text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens))
    assert r.choices[0].logprobs == r.choices[1].logprobs
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 2 * len(want)
    for logprobs in (None, 1):
        parts, offs = [], []
        for ch in c.completions.create(model=MODEL, prompt=ECHO, max_tokens=4, temperature=0, echo=True,
                                       logprobs=logprobs, stream=True):
            if ch.choices:
                parts.append(ch.choices[0].text)
                if ch.choices[0].logprobs:
                    offs += ch.choices[0].logprobs.text_offset
        assert parts[0] == ECHO and "".join(parts) == ECHO + reply
        if logprobs:
            assert len(offs) == len(ids) + len(want) and offs[len(ids)] == len(ECHO)
    # max_tokens 0 asks for the prompt alone: without echo there would be nothing to return
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=ECHO, max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def test_logit_bias_is_the_reference_greedy_continuation_of_the_biased_logits(server, ref):
    """OpenAI's logit_bias: greedy replies are the reference's argmax of logits + bias at every step (the
    oracle adds the bias to the reference's logits itself); the log-probs stay the raw logits'."""
    g, tok, greedy = ref
    ids = completion_ids(tok, PROMPT)
    plain, lgs = greedy(ids, 6)
    c = client(server)
    # +100 on a token the model would not choose first: the reply begins with it
    (london,) = tok.encode(" London", add_special=False)
    assert plain[0] != london
    want, _ = greedy(ids, 6, {london: 100})
    assert want[0] == london
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                             logit_bias={str(london): 100}, logprobs=1)
    assert r.choices[0].text == text_of(tok, want) and r.choices[0].text.startswith(" London")
    # the first token's log-prob is the raw distribution's (London's unbiased log-softmax), not ~0
    lg = lgs[0].astype(np.float64)
    ls = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
    assert r.choices[0].logprobs.token_logprobs[0] == pytest.approx(ls[london], abs=1e-5)
    assert ls[london] < -1.0
    # -100 on the unbiased first choice removes it; the continuation is the biased reference's, which
    # differs from the unbiased one
    want, _ = greedy(ids, 6, {plain[0]: -100})
    assert want[0] != plain[0] and len(want) == 6
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={str(plain[0]): -100})
    assert r.choices[0].text == text_of(tok, want) != text_of(tok, plain)
    # chat, two biases at once, streamed
    cids = chat_tokens(tok, render_chat(g, CHAT, add_generation_prompt=True))
    cplain, _ = greedy(cids, 4)
    bias = {cplain[0]: -100, cplain[1]: 3.5}
    want, _ = greedy(cids, 4, bias)
    assert want != cplain
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, stream=True,
        logit_bias={str(k): v for k, v in bias.items()}) if ch.choices)
    assert text == text_of(tok, want)
    # an empty map changes nothing: the unbiased reference
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={})
    assert r.choices[0].text == text_of(tok, plain)


def test_logit_bias_plus_100_under_sampling(server, ref):
    """Seeded sampling, every filter off, with a +100 bias: every token is the biased one (any other has a
    weight below e^-60 against it where the raw logits span less than 40, checked at the first position),
    drawn by the host sampler as penalties are."""
    g, tok, greedy = ref
    (london,) = tok.encode(" London", add_special=False)
    lg = greedy(completion_ids(tok, PROMPT), 1)[1][0]
    assert lg.max() - lg[london] < 40  # the margin the docstring's bound relies on, at the first position
    r = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=5,
                                          top_p=1.0, logit_bias={str(london): 100},
                                          extra_body={"top_k": 0, "min_p": 0.0})
    assert r.choices[0].text == " London" * 4


def test_unknown_fields_are_ignored_and_models_listed(server):
    c = client(server)
    r = c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0,
                             extra_body={"frobnicate": {"x": [1, 2]}, "mirostat": 2})
    assert r.usage.completion_tokens == 1
    assert [m.id for m in c.models.list().data] == [MODEL]


# -- errors ---------------------------------------------------------------------------------------

def test_models_retrieve_and_the_fields_not_implemented(server):
    """`client.models.retrieve` (GET /v1/models/{id}) answers the served model and 404s another; OpenAI fields that
    would change the reply and are not implemented (best_of > 1) are a 400 naming them, not silently ignored; their
    neutral values pass."""
    c = client(server)
    m = c.models.retrieve(server.state.alias)
    assert m.id == server.state.alias and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, best_of=2)
    assert e.value.body["param"] == "best_of"
    r = c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0, logit_bias={}, best_of=1)
    assert r.usage.completion_tokens == 1


def test_errors_are_openai_objects(server):
    c = client(server)
    for n in (0, 65):  # n > 1 is served (below), up to the 64 choices a request may ask for
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=n)
        assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:  # 33 prompts x 2 samples
        c.completions.create(model=MODEL, prompt=["Hi"] * 33, max_tokens=2, n=2)
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=CHAT, temperature=-1)
    assert e.value.body["param"] == "temperature" and "temperature" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="word " * 400, max_tokens=2)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    assert "--ctx-size" in e.value.body["message"]  # what can be raised: the server's flag
    with pytest.raises(openai.BadRequestError) as e:  # fits alone, not with max_tokens (ctx 256)
        c.completions.create(model=MODEL, prompt="Hi", max_tokens=300)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    for n in (0, 300):  # chat's max_completion_tokens is named as sent
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=n)
        assert e.value.body["param"] == "max_completion_tokens"
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-4o", prompt="Hi", max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    # the raw wire: the shape, a malformed body, a wrong type, an unknown route
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "Hi", "max_tokens": ',
                   headers={"Content-Type": "application/json"}, trust_env=False)
    assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": "not a list"}, trust_env=False)
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": "many"}, trust_env=False)
    assert r.status_code == 400 and error_of(r)["param"] == "max_tokens"
    # logit_bias: a key that is not a token id, an id beyond the vocabulary, a value out of [-100, 100] or not
    # a number, chat and completions alike
    n_vocab = server.state.tok.n_vocab
    for bias, needle in (({"hello": 1}, "'hello' is not a token id"), ({"-5": 1}, "'-5' is not a token id"),
                         ({"1.5": 1}, "'1.5' is not a token id"), ({"": 1}, "is not a token id"),
                         ({str(n_vocab): 1}, f"token id {n_vocab} is outside the vocabulary [0, {n_vocab})"),
                         ({"9" * 5000: 1}, "(5000 digits) is outside the vocabulary"),  # more than int() converts
                         ({"42": 100.5}, "[-100, 100]"), ({"42": -101}, "[-100, 100]"),
                         ({"42": "a lot"}, "logit_bias"), ({"42": [1]}, "logit_bias")):
        for route, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": CHAT})):
            r = httpx.post(server.url + route, json={**body, "max_tokens": 1, "logit_bias": bias}, trust_env=False)
            assert r.status_code == 400, (bias, r.text)
            assert error_of(r)["param"] == "logit_bias" and needle in error_of(r)["message"], (bias, r.text)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "logit_bias": [1, 2]},
                   trust_env=False)
    assert r.status_code == 400 and error_of(r)["param"] == "logit_bias"
    r = httpx.post(server.url + "/v1/completions", trust_env=False, json={
        "prompt": "Hi", "max_tokens": 1, "temperature": 0, "logit_bias": {str(n_vocab - 1): -100, "0": 100}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1  # both bounds are inside
    r = httpx.get(server.url + "/v1/nothing", trust_env=False)
    assert r.status_code == 404 and error_of(r)["message"]
    # an assistant's earlier tool call whose function is not an object
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = httpx.post(server.url + "/v1/chat/completions", trust_env=False, json={
        "messages": CHAT + [{"role": "assistant", "tool_calls": [{"id": "1", "function": "f"}]}], "tools": tools})
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    # suffix (text after the insertion point) is refused, as echo is, rather than ignored
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "def f(", "suffix": "):", "max_tokens": 2},
                   trust_env=False)
    assert r.status_code == 400 and error_of(r)["param"] == "suffix"
    # a role OpenAI's API does not have, and a message without content, are 400s naming the message (an
    # assistant's that calls tools may leave content out: above)
    for msgs, param in (([{"role": "wizard", "content": "Hi"}], "messages[0].role"),
                        (CHAT + [{"role": "user"}], f"messages[{len(CHAT)}].content"),
                        (CHAT + [{"role": "assistant", "content": None}, {"role": "user", "content": "Hi"}],
                         f"messages[{len(CHAT)}].content"),
                        (CHAT + [{"role": "user", "content": []}], f"messages[{len(CHAT)}].content")):
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}, trust_env=False)
        assert r.status_code == 400 and error_of(r)["param"] == param, r.text
    # and the engine is healthy after all of it
    assert httpx.get(server.url + "/health", trust_env=False).status_code == 200
    assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0).usage.completion_tokens == 1


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_it(server):
    """A prompt of more bytes than the context's tokens can hold (the longest vocabulary entry's bytes a token) is a
    400 without tokenizing it: the tokenizer is pure Python, a megabyte of text would hold it for seconds. The
    message counts bytes (the pre-check's), not tokens (the tokenized check's)."""
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="word " * 40_000, max_tokens=2)
    body = e.value.body
    assert (body["code"], body["param"]) == ("context_length_exceeded", "prompt") and "bytes" in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 40_000}])
    body = e.value.body
    assert (body["code"], body["param"]) == ("context_length_exceeded", "messages") and "bytes" in body["message"]
    assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0).usage.completion_tokens == 1


def test_the_byte_bound_holds_for_each_prompt_of_a_list(tiny_models):
    """The bytes pre-check bounds each prompt of a list (each is its own sequence), not their sum: four prompts that
    each fit a context of 64 tokens, whose bytes together exceed 64 x the longest vocabulary entry's, are four
    choices, each its prompt's reply alone (a tiny model, the SmolLM2 tokenizer: long whitespace tokens)."""
    s = Server(ServeConfig(model=str(tiny_models("llama", "Q8_0")), device="cpu", port=0, ctx_size=64))
    s.start_in_thread()
    try:
        tok = s.state.tok
        max_piece = max(len(t.encode("utf-8", "surrogatepass")) for t in tok.tokens)
        widest = max(range(tok.n_vocab), key=lambda i: len(tok.token_bytes(i)))
        unit = "a" + tok.decode([widest]) * 10 + "a"
        prompts = [unit * 4, unit * 4 + "b", unit * 4 + "c", unit * 4 + "d"]
        assert all(len(completion_ids(tok, p)) < 63 for p in prompts)
        assert sum(len(p.encode()) for p in prompts) > 64 * max_piece  # the premise: the sum would be refused
        c = client(s)
        kw = dict(model=s.state.alias, max_tokens=1, temperature=0)
        alone = [c.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
        r = c.completions.create(prompt=prompts, **kw)
        assert [ch.text for ch in r.choices] == alone
        assert r.usage.prompt_tokens == sum(len(completion_ids(tok, p)) for p in prompts)
    finally:
        s.stop()


def test_strings_that_are_not_unicode_neither_wedge_nor_500(server):
    """JSON's \\ud800 escape is a lone surrogate, a str Python cannot encode as UTF-8: as a
    cache_salt it names a namespace like any other (the queue keeps moving), as a regex it is
    a 400 naming the field."""
    url, hdr = server.url + "/v1/completions", {"Content-Type": "application/json"}
    r = httpx.post(url, content=b'{"prompt": "' + b"Hi " * 20 + b'", "max_tokens": 2, "cache_salt": "a\\ud800"}',
                   headers=hdr, trust_env=False, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    r = httpx.post(url, content=b'{"prompt": "Hi", "max_tokens": 2, "regex": "\\ud800"}', headers=hdr,
                   trust_env=False, timeout=60)
    assert r.status_code == 400 and error_of(r)["param"] == "regex"
    r = client(server).completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0)
    assert r.usage.completion_tokens == 1


def test_tokenize_and_detokenize(server, ref):
    g, tok, _ = ref
    text = "Hello, world! <|im_start|>"
    r = httpx.post(server.url + "/tokenize", json={"content": text}, trust_env=False).json()
    assert r["tokens"] == tok.encode(text, add_special=False, parse_special=True)
    r2 = httpx.post(server.url + "/tokenize", json={"content": text, "with_pieces": True}, trust_env=False).json()
    assert [p["id"] for p in r2["tokens"]] == r["tokens"]
    d = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, trust_env=False).json()
    assert d["content"] == tok.decode(r["tokens"])



def test_streamed_content_around_a_tool_call_is_the_blocking_content(server):
    """Text after a tool call is content in both modes (a regex makes the model write
    text, a call, then more text)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], tools=tools, max_tokens=40, temperature=0,
              extra_body={"regex": r'Sure\. <tool_call>\{"name": "f", "arguments": \{\}\}</tool_call> Done\.'})
    c = client(server)
    b = c.chat.completions.create(**kw).choices[0]
    assert b.finish_reason == "tool_calls" and b.message.tool_calls[0].function.name == "f"
    assert b.message.content == "Sure.  Done."
    content, names, finish = "", [], None
    for ch in c.chat.completions.create(stream=True, **kw):
        for x in ch.choices:
            content += x.delta.content or ""
            names += [d.function.name for d in x.delta.tool_calls or [] if d.function.name]
            finish = x.finish_reason or finish
    assert finish == "tool_calls" and names == ["f"]
    assert content == b.message.content

# -- metrics --------------------------------------------------------------------------------------

def test_metrics_exposition(server):
    before = metrics_of(server)
    r = client(server).completions.create(model=MODEL, prompt="One two three", max_tokens=3, temperature=0)
    after = metrics_of(server)
    names = {k[0] for k in after}
    for n in ("memra:num_requests_running", "memra:num_requests_waiting", "memra:kv_cache_usage_perc",
              "memra:prefix_cache_queries_total", "memra:prefix_cache_hits_total", "memra:prompt_tokens_total",
              "memra:generation_tokens_total", "memra:time_to_first_token_seconds_bucket",
              "memra:inter_token_latency_seconds_count", "memra:e2e_request_latency_seconds_sum",
              "memra:request_queue_time_seconds_count"):
        assert n in names, n

    def d(name, **kw):
        return metric(after, name, **kw) - metric(before, name, **kw)

    assert d("memra:prompt_tokens_total") == r.usage.prompt_tokens
    assert d("memra:generation_tokens_total") == 3
    assert d("memra:prefix_cache_queries_total") == r.usage.prompt_tokens
    assert d("memra:time_to_first_token_seconds_count") == 1
    assert d("memra:inter_token_latency_seconds_count") == 2  # gaps between 3 tokens
    assert d("memra:e2e_request_latency_seconds_count") == 1
    assert d("memra:request_success_total", finished_reason="length") == 1
    assert metric(after, "memra:num_requests_running") == 0
    assert 0 <= metric(after, "memra:kv_cache_usage_perc") <= 1
    # a bucket count is cumulative and ends at the total
    assert metric(after, "memra:time_to_first_token_seconds_bucket", le="+Inf") == \
        metric(after, "memra:time_to_first_token_seconds_count")


# -- prefix cache ---------------------------------------------------------------------------------

LONG = ("In the quiet village by the river, the old miller kept a ledger of every sack of grain "
        "he ground, and on the first page of that worn leather book, in a careful and steady hand, he wrote")


@pytest.mark.slow
def test_prefix_cache_hit_and_salt_isolation(server, ref):
    g, tok, _ = ref
    n = len(completion_ids(tok, LONG))
    assert n > 2 * BLOCK
    hit = (n - 1) // BLOCK * BLOCK  # whole blocks, the last prompt token recomputed
    c = client(server)
    kw = dict(model=MODEL, prompt=LONG, max_tokens=4, temperature=0)
    a = c.completions.create(**kw, extra_body={"cache_salt": "tenant-a"})
    b = c.completions.create(**kw, extra_body={"cache_salt": "tenant-a"})
    x = c.completions.create(**kw, extra_body={"cache_salt": "tenant-b"})
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == hit
    assert x.usage.prompt_tokens_details.cached_tokens == 0  # another namespace shares nothing
    assert a.choices[0].text == b.choices[0].text == x.choices[0].text


# -- several choices: n > 1 and lists of prompts -------------------------------------------------------

def test_n_choices_share_the_prompt_and_each_is_the_reference(server, ref):
    """n = 3, greedy: three choices indexed 0..2, each the reference's continuation; the prompt counted once in
    usage; choices 1 and 2 start after choice 0 has its first token and find the prompt's full blocks in the
    prefix cache (its hit counter grows by their whole blocks), so the prompt is computed once."""
    g, tok, greedy = ref
    ids = completion_ids(tok, LONG)
    want, _ = greedy(ids, 5)
    hit = (len(ids) - 1) // BLOCK * BLOCK
    c = client(server)
    salt = f"n3-{time.time()}"  # a namespace of its own: nothing cached before
    before = metric(metrics_of(server), "memra:prefix_cache_hits_total")
    r = c.completions.create(model=MODEL, prompt=LONG, max_tokens=5, temperature=0, n=3,
                             extra_body={"cache_salt": salt})
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [text_of(tok, want)] * 3
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3 * len(want)
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # the first choice's: nothing was cached
    assert metric(metrics_of(server), "memra:prefix_cache_hits_total") - before == 2 * hit


def test_n_seeded_samples(server):
    """Seeded sampling with n = 2: choice 0 samples what the same request with n = 1 samples, choice 1 what n = 1
    samples with the seed memra derives for it (memra.serve.api._choice_params); both are reproducible."""
    from memra.sampling import SamplingParams
    from memra.serve.api import _choice_params

    c = client(server)
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=1.0,
              extra_body={"top_k": 0, "min_p": 0})
    r = c.completions.create(**kw, n=2, seed=1234)
    one = c.completions.create(**kw, seed=1234)
    seed1 = _choice_params(SamplingParams(seed=1234), 1).seed
    assert seed1 != 1234
    two = c.completions.create(**kw, seed=seed1)
    assert [ch.text for ch in r.choices] == [one.choices[0].text, two.choices[0].text]
    assert [ch.text for ch in c.completions.create(**kw, n=2, seed=1234).choices] == [ch.text for ch in r.choices]


def test_n_streamed_chat_with_usage(server, ref):
    """A streamed chat with n = 2: every chunk names its choice; each choice opens with the role, carries the
    reference's text and ends with one finish_reason; the usage chunk counts the prompt once."""
    g, tok, greedy = ref
    ids = chat_tokens(tok, render_chat(g, CHAT, add_generation_prompt=True))
    want, _ = greedy(ids, 6)
    chunks = list(client(server).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True}))
    body = [ch for ch in chunks if ch.choices]
    for i in (0, 1):
        mine = [ch.choices[0] for ch in body if ch.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert "".join(x.delta.content or "" for x in mine) == text_of(tok, want)
        assert [x.finish_reason for x in mine if x.finish_reason] == \
            (["stop"] if want[-1] in tok.eog_ids else ["length"])
    assert {ch.choices[0].index for ch in body} == {0, 1}
    last = chunks[-1]
    assert last.choices == [] and last.usage.prompt_tokens == len(ids)
    assert last.usage.completion_tokens == 2 * len(want)


def test_a_list_of_prompts_gives_a_choice_each(server, ref):
    """prompt as a list (of strings, or of token-id lists) with n = 2: choice i n + j is prompt i's; each the
    reference's greedy continuation of its own prompt."""
    g, tok, greedy = ref
    texts = ["The capital of France is", "List the planets:"]
    wants = [greedy(completion_ids(tok, t), 4)[0] for t in texts]
    c = client(server)
    for prompt in (texts, [completion_ids(tok, t) for t in texts]):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, n=2)
        assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
        assert [ch.text for ch in r.choices] == [text_of(tok, w) for w in wants for _ in range(2)]
        assert r.usage.prompt_tokens == sum(len(completion_ids(tok, t)) for t in texts)


@pytest.mark.slow
def test_prefix_cache_across_turns_with_a_decoded_reply(server, ref):
    """Turn 2 reuses blocks whose K/V turn 1 wrote while decoding its reply: the same tokens
    as a run that recomputes everything (another salt)."""
    g, tok, _ = ref
    by_bytes = {}
    for i in range(tok.n_vocab):
        by_bytes.setdefault(tok.token_bytes(i), i)
    p1 = "Write one sentence about the sea and the wind:"
    ids1 = completion_ids(tok, p1)
    c = client(server)
    salt = {"cache_salt": "turns"}
    t1 = c.completions.create(model=MODEL, prompt=p1, max_tokens=24, temperature=0, logprobs=0, extra_body=salt)
    gen = [by_bytes[t.encode("utf-8")] if t.encode("utf-8") in by_bytes else None
           for t in t1.choices[0].logprobs.tokens]
    p2 = p1 + t1.choices[0].text + "\nNow one about the land:"
    ids2 = completion_ids(tok, p2)
    # what the cache holds: turn 1's prompt and reply, but the reply's last token (never fed)
    held = ids1 + gen[:-1]
    lcp = 0
    while lcp < min(len(held), len(ids2)) and held[lcp] == ids2[lcp]:
        lcp += 1
    expect = min(lcp, len(ids2) - 1) // BLOCK * BLOCK
    assert expect > len(ids1) // BLOCK * BLOCK, "the reply must fill a block for this test"
    t2 = c.completions.create(model=MODEL, prompt=p2, max_tokens=4, temperature=0, extra_body=salt)
    fresh = c.completions.create(model=MODEL, prompt=p2, max_tokens=4, temperature=0,
                                 extra_body={"cache_salt": "fresh"})
    assert t2.usage.prompt_tokens_details.cached_tokens == expect
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert t2.choices[0].text == fresh.choices[0].text


# -- continuous batching --------------------------------------------------------------------------

@pytest.mark.slow
def test_concurrent_requests_are_isolated(server, ref):
    """Each request's greedy tokens: the reference's, alone and among concurrent requests
    that share the running batch (prefill chunks and decode rows in the same steps)."""
    g, tok, greedy = ref
    prompts = ["Once upon a time", "The best way to cook rice is", "def fibonacci(n):", "Dear Sir or Madam,"]
    c = client(server)
    want = [text_of(tok, greedy(completion_ids(tok, p), 6)[0]) for p in prompts]
    steps0 = server.state.sched.steps
    alone = [c.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text
             for p in prompts]
    steps_alone = server.state.sched.steps - steps0
    out = [None] * len(prompts)
    go = threading.Barrier(len(prompts))

    def run(i):
        go.wait()
        out[i] = c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=6, temperature=0).choices[0].text

    steps0 = server.state.sched.steps
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    steps_together = server.state.sched.steps - steps0
    assert alone == want
    assert out == want
    assert steps_together < steps_alone  # they did share steps


@pytest.mark.parametrize("n", [1, 3])
def test_a_disconnect_frees_its_blocks(server, n):
    """A streaming client that goes away cancels its request (with n choices, every one of them)."""
    kv = server.state.engine.kv
    before = metrics_of(server)
    body = {"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 200, "temperature": 0,
            "stream": True, "n": n}
    with httpx.Client(trust_env=False, timeout=60) as h:
        with h.stream("POST", server.url + "/v1/completions", json=body) as r:
            got = 0
            for line in r.iter_lines():
                if line.startswith("data:") and '"text"' in line:
                    got += 1
                    if got == 2:
                        break
    t_end = time.time() + 30
    while time.time() < t_end and (server.state.sched.n_running or (kv.alloc.ref != 0).any()):
        time.sleep(0.1)
    assert server.state.sched.n_running == 0
    assert (kv.alloc.ref == 0).all() and kv.alloc.n_free == kv.alloc.n_blocks
    after = metrics_of(server)
    assert metric(after, "memra:request_success_total", finished_reason="abort") - \
        metric(before, "memra:request_success_total", finished_reason="abort") == n
    assert metric(after, "memra:generation_tokens_total") - metric(before, "memra:generation_tokens_total") < 200 * n



@pytest.mark.parametrize("n", [1, 2])
def test_a_blocking_disconnect_cancels_while_tokens_flow(server, n):
    """A blocking request whose client is gone is cancelled within a moment even while its
    tokens keep arriving (the disconnect is checked on a clock, not only when the queue is
    quiet); with n choices, every one of them."""
    kv = server.state.engine.kv
    sched = server.state.sched
    before = metrics_of(server)
    body = json.dumps({"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 200,
                       "temperature": 0, "ignore_eos": True, "n": n}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    t_end = time.time() + 60
    while time.time() < t_end and not (sched.running and len(sched.running[0].generated) >= 8):
        time.sleep(0.02)  # decoding, tokens flowing
    s.close()
    t_closed = time.time()
    while time.time() < t_closed + 60 and (sched.n_running or (kv.alloc.ref != 0).any()):
        time.sleep(0.05)
    assert time.time() - t_closed < 5
    assert sched.n_running == 0 and (kv.alloc.ref == 0).all()
    after = metrics_of(server)
    assert metric(after, "memra:request_success_total", finished_reason="abort") - \
        metric(before, "memra:request_success_total", finished_reason="abort") == n
    assert metric(after, "memra:generation_tokens_total") - metric(before, "memra:generation_tokens_total") < 200 * n


# -- keys and the queue ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    s = Server(ServeConfig(model=MODEL, device="cpu", port=0, ctx_size=128, parallel=1, max_queue=1,
                           api_keys=["key-one", "key-two"]))
    s.start_in_thread()
    yield s
    s.stop()


def test_keys(keyed):
    with pytest.raises(openai.AuthenticationError) as e:
        client(keyed, "wrong").completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "Hi"}, trust_env=False)
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    # without a key a malformed body is a 401 too: nothing is said about the body
    for body in (b'{"prompt": ', b'{"prompt": 5}'):
        r = httpx.post(keyed.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"},
                       trust_env=False)
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key", body
    assert httpx.get(keyed.url + "/metrics", trust_env=False).status_code == 401
    assert httpx.get(keyed.url + "/health", trust_env=False).status_code == 200  # no key needed
    metrics_of(keyed, "key-two")
    r = client(keyed, "key-one").completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0)
    assert r.usage.completion_tokens == 1


@pytest.mark.slow
def test_keys_are_namespaces(keyed, ref):
    g, tok, _ = ref
    p = "A key names a tenant: the cache of one is never the cache of another one."
    n = len(completion_ids(tok, p))
    assert n > BLOCK
    kw = dict(model=MODEL, prompt=p, max_tokens=1, temperature=0)
    one = client(keyed, "key-one")
    assert one.completions.create(**kw).usage.prompt_tokens_details.cached_tokens == 0
    assert one.completions.create(**kw).usage.prompt_tokens_details.cached_tokens == (n - 1) // BLOCK * BLOCK
    assert client(keyed, "key-two").completions.create(**kw).usage.prompt_tokens_details.cached_tokens == 0


def test_a_full_queue_answers_429(keyed):
    """--parallel 1 --max-queue 1: one request runs, one waits, the third gets 429 with
    Retry-After (the openai client would retry it; here it must not)."""
    h = httpx.Client(trust_env=False, timeout=120, headers={"Authorization": "Bearer key-one"})
    body = {"model": MODEL, "prompt": "List the planets:", "max_tokens": 60, "temperature": 0, "stream": True}
    waiting = {}
    with h.stream("POST", keyed.url + "/v1/completions", json=body) as running:
        lines = running.iter_lines()  # kept open: closing the iterator closes the connection
        while '"text"' not in next(lines):
            pass  # until admitted and decoding
        th = threading.Thread(target=lambda: waiting.setdefault(
            "r", client(keyed, "key-one").completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)))
        th.start()
        t_end = time.time() + 30
        while time.time() < t_end and metric(metrics_of(keyed, "key-one"), "memra:num_requests_waiting") < 1:
            time.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as e:
            client(keyed, "key-one").completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        assert e.value.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
        assert e.value.body["type"] == "rate_limit_exceeded"
    # the running stream is gone: the waiting request runs
    th.join(120)
    assert waiting["r"].usage.completion_tokens == 2
    h.close()


def test_choices_refused_by_the_queue_leave_nothing_behind(keyed):
    """n = 3 on --parallel 1 --max-queue 1: choice 0 runs, choice 1 waits, choice 2 finds the queue full: the
    request is a 429 and the two choices it started are cancelled (nothing left running or waiting; the next
    request is served)."""
    c = client(keyed, "key-one")
    aborted = metric(metrics_of(keyed, "key-one"), "memra:request_success_total", finished_reason="abort")
    with pytest.raises(openai.RateLimitError) as e:
        c.completions.create(model=MODEL, prompt="List the planets:", max_tokens=100, temperature=0, n=3)
    assert e.value.status_code == 429
    t_end = time.time() + 30
    while time.time() < t_end:
        ms = metrics_of(keyed, "key-one")
        if metric(ms, "memra:num_requests_running") == 0 and metric(ms, "memra:num_requests_waiting") == 0:
            break
        time.sleep(0.05)
    assert metric(ms, "memra:num_requests_running") == 0 and metric(ms, "memra:num_requests_waiting") == 0
    # both started choices were cancelled (not run to their 100 tokens)
    assert metric(ms, "memra:request_success_total", finished_reason="abort") - aborted == 2
    assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens == 2


# -- lifecycle ------------------------------------------------------------------------------------

def test_loading_answers_503(tiny_models):
    s = Server(ServeConfig(model=str(tiny_models("llama", "Q8_0")), device="cpu", port=0, ctx_size=64))
    s.start_in_thread(load=False)  # uvicorn without its engine: still loading
    try:
        for path in ("/health", "/readyz"):
            r = httpx.get(s.url + path, trust_env=False)
            assert r.status_code == 503 and error_of(r)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi"}, trust_env=False)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        assert error_of(r)["code"] == "model_loading"
        s.start_engine()
        assert httpx.get(s.url + "/readyz", trust_env=False).status_code == 200
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0},
                       trust_env=False)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        s.stop()


def test_a_public_bind_without_a_key_refuses_to_start():
    r = subprocess.run([sys.executable, "-m", "memra", "serve", MODEL, "--host", "0.0.0.0", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "without an API key" in r.stderr


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigterm_drains_and_exits_0(ref):
    """SIGTERM while a stream runs: /readyz and new requests answer 503, the stream ends with
    all its tokens, the process exits 0."""
    g, tok, greedy = ref
    port = _free_port()
    env = {**os.environ, "MEMRA_PORT": str(port), "MEMRA_DEVICE": "cpu", "MEMRA_CTX_SIZE": "128"}
    p = subprocess.Popen([sys.executable, "-m", "memra", "serve", MODEL, "--drain-timeout", "60"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t_end = time.time() + 180
        while time.time() < t_end:
            try:
                if httpx.get(url + "/readyz", trust_env=False, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.3)
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        stream = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                      stream_options={"include_usage": True})
        it = iter(stream)
        chunks = [next(it)]
        p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        r = httpx.get(url + "/readyz", trust_env=False)
        assert r.status_code == 503
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
        assert e.value.body["code"] == "draining"
        chunks += list(it)
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        want = greedy(completion_ids(tok, PROMPT), 40)[0]
        assert chunks[-1].usage.completion_tokens == len(want)
        assert text == text_of(tok, want)
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- memra bench serve ----------------------------------------------------------------------------

def test_bench_serve_cells_default_to_two_waves_and_at_least_16_requests():
    from memra.serve.bench import cell_requests

    assert [cell_requests(c) for c in (1, 8, 32, 64)] == [16, 16, 64, 128]


@pytest.mark.slow
def test_bench_serve_receipts(server, tmp_path):
    from typer.testing import CliRunner

    from memra.cli import app
    from memra.tune.receipts import read_receipts

    out = tmp_path / "serve.jsonl"
    r = CliRunner().invoke(app, ["bench", "serve", server.url, "-c", "2", "--requests", "3", "--prompt-tokens", "12",
                                 "--max-tokens", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = read_receipts(out)
    assert list(df["kind"]) == ["serve-bench"]
    row = df.iloc[0]
    assert row["engine"] == "memra" and row["model"] == MODEL and row["device"] == "cpu"
    assert row["completed"] == 3 and row["failed"] == 0 and row["output_tokens"] == 12  # 3 x 4, ignore_eos
    assert row["agg_tok_s"] == pytest.approx(12 / row["wall_s"], rel=1e-2)
    assert 8 <= row["prompt_tokens"] <= 12
    assert row["ttft_p50_s"] <= row["ttft_p95_s"] <= row["ttft_p99_s"] <= row["lat_p99_s"]
    bad = CliRunner().invoke(app, ["bench", "serve", "http://10.1.2.3:8080", "--out", str(out)])
    assert bad.exit_code == 1 and "loopback" in bad.output


def test_bench_serve_counts_broken_streams_as_failed():
    """A stream that carries an error event, or ends without `data: [DONE]`, is a failed request
    (its tokens are not counted), as a server that fails mid-stream (an exception while it
    writes a chunk) reports it; a whole stream is a success."""
    import asyncio

    from memra.serve.bench import run_cell

    tok = 'data: {"choices": [{"text": "a"}]}\n\n'
    usage = 'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
    bodies = {"whole": tok * 3 + usage + "data: [DONE]\n\n",
              "error": tok * 2 + 'data: {"error": {"message": "invalid UTF-8 byte", "code": 500}}\n\n',
              "cut": tok * 2}

    def handler(request):
        kind = json.loads(request.content)["prompt"]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies[kind].encode())

    real = httpx.AsyncClient

    class Client(real):
        def __init__(self, **kw):
            kw.pop("limits", None)
            super().__init__(transport=httpx.MockTransport(handler), **kw)

    try:
        httpx.AsyncClient = Client
        row = asyncio.run(run_cell("http://127.0.0.1:9", None, [("whole", 5), ("error", 5), ("cut", 5)], 1, 3, 10))
    finally:
        httpx.AsyncClient = real
    assert row["completed"] == 1 and row["failed"] == 2 and row["output_tokens"] == 3
    assert row["errors"] == ["stream ended before data: [DONE]", "stream error: invalid UTF-8 byte"]
