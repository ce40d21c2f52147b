"""`memra serve --device gpu` on a real GPU (the H200 stage of experiments/h200_serve.sh):
the openai client against a real uvicorn, the acceptance checks of issue 11.

- isolation: each of 64 requests' greedy tokens, sent all at once, are byte-identical to the
  same request sent alone (the runner alone vs among co-runners is tests/test_gpu_runner.py's);
- prefix cache: a hit gives the tokens of a miss, `cached_tokens` is the whole blocks below
  the last prompt token, another `cache_salt` gets no hit, and across turns the blocks a
  decoded reply wrote are reused with the same tokens as a recomputation."""

from __future__ import annotations

import os
import threading

import openai
import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]

# the H200 script points this at a synthetic model when SmolLM2 was not shipped there
MODEL = os.environ.get("MEMRA_SERVE_TEST_MODEL", "smollm2-135m")
BLOCK = 16


@pytest.fixture(scope="module")
def server():
    from memra.serve.api import ServeConfig, Server

    s = Server(ServeConfig(model=MODEL, device="gpu", port=0, ctx_size=512, parallel=64, max_queue=256))
    s.start_in_thread()
    yield s
    s.stop()


def _client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=600)


PROMPTS = [f"Story {i}: once upon a time in the land of {w}," for i, w in
           enumerate(("river", "stone", "wind", "glass", "salt", "iron", "moss", "ash") * 8)]


def test_64_concurrent_requests_equal_each_alone(server):
    c = _client(server)
    n = 48
    alone = [c.completions.create(model=MODEL, prompt=p, max_tokens=n, temperature=0,
                                  extra_body={"ignore_eos": True, "cache_salt": f"alone-{i}"}).choices[0].text
             for i, p in enumerate(PROMPTS)]
    out = [None] * len(PROMPTS)
    go = threading.Barrier(len(PROMPTS))

    def run(i):
        go.wait()
        out[i] = c.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True, "cache_salt": f"together-{i}"}).choices[0].text

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    assert out == alone


def test_prefix_cache_hit_equals_miss_and_salts_do_not_share(server):
    tok = server.state.tok
    c = _client(server)
    p = ("You are a careful assistant. Answer in one sentence, plainly, without lists or headings. "
         "The question follows after this long shared system prompt that many requests begin with.")
    n = len(tok.encode(p, add_special=True, parse_special=True))
    kw = dict(model=MODEL, prompt=p, max_tokens=32, temperature=0)
    a = c.completions.create(**kw, extra_body={"cache_salt": "s1"})
    b = c.completions.create(**kw, extra_body={"cache_salt": "s1"})
    x = c.completions.create(**kw, extra_body={"cache_salt": "s2"})
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == (n - 1) // BLOCK * BLOCK > 0
    assert x.usage.prompt_tokens_details.cached_tokens == 0
    assert a.choices[0].text == b.choices[0].text == x.choices[0].text
    # turn 2 over turn 1's decoded reply: the same tokens as recomputing it all
    t2 = p + a.choices[0].text + " And why?"
    h = c.completions.create(model=MODEL, prompt=t2, max_tokens=32, temperature=0, extra_body={"cache_salt": "s1"})
    f = c.completions.create(model=MODEL, prompt=t2, max_tokens=32, temperature=0, extra_body={"cache_salt": "s3"})
    if server.state.sched.prefill_exact:  # the reply's blocks too
        assert h.usage.prompt_tokens_details.cached_tokens > (n - 1) // BLOCK * BLOCK
    else:  # MEMRA_ATTN=hybrid: only blocks of prompt rows are shared (memra.serve.scheduler._register)
        assert h.usage.prompt_tokens_details.cached_tokens == n // BLOCK * BLOCK
    assert f.usage.prompt_tokens_details.cached_tokens == 0
    assert h.choices[0].text == f.choices[0].text


def test_n_choices_equal_the_request_alone(server):
    """n = 8 greedy: every choice is the reply of the request alone (the other seven run as decode rows beside
    the first, their prompt's full blocks from its prefix-cache entries)."""
    c = _client(server)
    kw = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=32, temperature=0)
    alone = c.completions.create(**kw, extra_body={"ignore_eos": True, "cache_salt": "n-alone"}).choices[0].text
    r = c.completions.create(**kw, n=8, extra_body={"ignore_eos": True, "cache_salt": "n-eight"})
    assert [ch.index for ch in r.choices] == list(range(8))
    assert [ch.text for ch in r.choices] == [alone] * 8


def test_echo_logprobs_of_a_prompt_do_not_depend_on_what_follows(server):
    """echo + logprobs + max_tokens 0 on the GPU: a prompt's per-token log-probs are the same bits whether it is
    scored alone or as the start of a longer prompt (a row's logits do not depend on its chunk or what follows
    it), the first token's is null, and every listed top alternative is at least as likely as the token."""
    c = _client(server)
    long = " ".join(PROMPTS[:12])
    short = " ".join(PROMPTS[:5])
    a = c.completions.create(model=MODEL, prompt=long, max_tokens=0, echo=True, logprobs=3).choices[0]
    b = c.completions.create(model=MODEL, prompt=short, max_tokens=0, echo=True, logprobs=3).choices[0]
    assert a.text == long and b.text == short
    k = len(b.logprobs.tokens) - 1  # the short prompt's last token may merge with what follows it in the long one
    assert a.logprobs.tokens[:k] == b.logprobs.tokens[:k]
    assert a.logprobs.token_logprobs[:k] == b.logprobs.token_logprobs[:k]
    assert a.logprobs.token_logprobs[0] is None
    for lp, top in zip(a.logprobs.token_logprobs[1:], a.logprobs.top_logprobs[1:]):
        assert lp <= 0 and max(top.values()) >= lp
