"""The generation loop against a scripted model: stop reasons, stop strings, context, history.

The fake model emits a fixed token script (one-hot logits), so every expected event is known
by hand; the real engine's tokens are checked against llama.cpp in test_cli.py."""

import codecs

import numpy as np
import pytest

from memra.errors import ContextOverflowError, MemraError
from memra.session import generate
from memra.sampling import SamplingParams

EOS = 0


class FakeTokenizer:
    def __init__(self, pieces):
        self.pieces = [p.encode() if isinstance(p, str) else p for p in pieces]
        self.n_vocab = len(pieces)
        self.eog_ids = frozenset({EOS})

    def stream(self, skip_special=False):
        tok = self

        class Stream:
            dec = codecs.getincrementaldecoder("utf-8")("replace")

            def push(self, i):
                return self.dec.decode(tok.pieces[i])

            def flush(self):
                return self.dec.decode(b"", final=True)

        return Stream()


class Cache:
    def __init__(self, n_ctx):
        self.pos, self.n_ctx = 0, n_ctx


class ScriptModel:
    """Returns logits whose argmax is the next token of `script` (then repeats the last)."""

    def __init__(self, script, n_vocab, base=None):
        self.script, self.n_vocab, self.calls = list(script), n_vocab, []
        self.base = base

    def new_cache(self, n_ctx):
        return Cache(n_ctx)

    def forward(self, tokens, cache):
        assert cache.pos + len(tokens) <= cache.n_ctx
        self.calls.append((cache.pos, list(tokens)))
        cache.pos += len(tokens)
        if self.base is not None:
            return self.base.copy()
        step = len(self.calls) - 1
        x = np.zeros(self.n_vocab, dtype=np.float32)
        x[self.script[min(step, len(self.script) - 1)]] = 10.0
        return x


PIECES = ["<eos>", "Hel", "lo", " wor", "ld", "!", "a", "b", "c"]


def run(script, prompt=(1,), **kw):
    n_ctx = kw.pop("n_ctx", None)
    ignore_eos = kw.pop("ignore_eos", False)
    model = ScriptModel(script, len(PIECES))
    params = SamplingParams(temperature=0, **kw)
    events = list(generate(model, FakeTokenizer(PIECES), list(prompt), params, n_ctx=n_ctx,
                           ignore_eos=ignore_eos))
    return events, model


def test_max_tokens_and_protocol():
    events, model = run([1, 2, 3, 4, 5], prompt=[6, 7], max_tokens=3)
    assert [e.token for e in events] == [1, 2, 3, None]
    assert "".join(e.text for e in events) == "Hello wor"
    assert events[-1].finish_reason == "length" and events[-1].done
    # one prefill of the prompt, then one token at a time at the next position
    assert model.calls == [(0, [6, 7]), (2, [1]), (3, [2])]
    t = events[-1].timings
    assert (t.n_prompt, t.n_gen) == (2, 3)
    assert t.prefill_tok_s > 0 and t.decode_tok_s > 0


def test_eos_stops_and_is_reported_without_text():
    events, _ = run([1, 2, EOS, 4], max_tokens=10)
    assert [e.token for e in events] == [1, 2, EOS, None]
    assert "".join(e.text for e in events) == "Hello"
    assert events[-1].finish_reason == "eos"


def test_ignore_eos_and_extra_stop_ids():
    events, _ = run([1, EOS, 4], max_tokens=4, ignore_eos=True)
    assert [e.token for e in events] == [1, EOS, 4, 4, None]
    assert events[-1].finish_reason == "length"
    events, _ = run([1, 2, 4, 5], max_tokens=10, stop_ids=[4])
    assert [e.token for e in events] == [1, 2, 4, None] and events[-1].finish_reason == "eos"


def test_stop_string_cuts_the_text_and_holds_back_its_prefix():
    events, _ = run([1, 2, 3, 4, 5], max_tokens=10, stop=["o wo"])
    # "Hel" released; "Hello" ends with "o" (could open "o wo"): hold it; then the stop hits
    assert [(e.token, e.text) for e in events[:-1]] == [(1, "Hel"), (2, "l"), (3, "")]
    assert events[-1].finish_reason == "stop"


def test_held_back_text_is_released_when_the_stop_never_completes():
    events, _ = run([6, 7, 6], max_tokens=3, stop=["bc", "xyz"])
    assert [(e.token, e.text) for e in events[:-1]] == [(6, "a"), (7, ""), (6, "ba")]
    events, _ = run([6, 7], max_tokens=2, stop=["bc"])
    assert [(e.token, e.text) for e in events[:-1]] == [(6, "a"), (7, "b")]
    assert events[-1].finish_reason == "length"


def test_stop_string_inside_one_token_and_earliest_wins():
    events, _ = run([1, 2, 3], max_tokens=10, stop=["wor", "ll"])
    assert "".join(e.text for e in events) == "He"
    assert events[-1].finish_reason == "stop"


def test_context_limits_generation_and_overflow_is_an_error():
    events, model = run([1, 2, 3, 4, 5, 6], prompt=[6, 7, 8], n_ctx=5, max_tokens=-1)
    assert [e.token for e in events] == [1, 2, None]
    assert events[-1].finish_reason == "length"
    with pytest.raises(ContextOverflowError):
        run([1], prompt=[6, 7, 8], n_ctx=3, max_tokens=1)
    with pytest.raises(MemraError, match="empty"):
        run([1], prompt=[], max_tokens=1)
    with pytest.raises(MemraError, match="vocabulary"):
        run([1], prompt=[99], max_tokens=1)


def test_penalty_history_includes_the_prompt():
    base = np.full(len(PIECES), -5.0, dtype=np.float32)
    base[6], base[7] = 3.0, 2.9
    model = ScriptModel([], len(PIECES), base=base)
    params = SamplingParams(temperature=0, repeat_penalty=1.1, max_tokens=1)
    events = list(generate(model, FakeTokenizer(PIECES), [6], params))
    assert events[0].token == 7  # token 6 (in the prompt) was penalized below token 7


class DeviceSamplingModel(ScriptModel):
    """A ScriptModel that, like the GPU engine, can also choose its tokens itself (`stream`): the
    device sampler's argmax of the raw logits, which knows nothing of penalties or a logit bias."""

    def stream(self, prompt, n, **kw):
        self.streamed = kw
        for _ in range(n):
            yield int(np.argmax(self.base))


def test_a_logit_bias_is_sampled_on_the_host_not_by_the_engine_sampler():
    base = np.full(len(PIECES), -5.0, dtype=np.float32)
    base[6], base[7] = 3.0, 2.0
    # no bias: the engine's own sampler chooses (token 6, the raw argmax)
    model = DeviceSamplingModel([], len(PIECES), base=base)
    events = list(generate(model, FakeTokenizer(PIECES), [1], SamplingParams(temperature=0, max_tokens=2)))
    assert [e.token for e in events[:-1]] == [6, 6] and model.streamed and not model.calls
    # +1.5 on token 7: 2.0 + 1.5 = 3.5 > 3.0, chosen by the host sampler from the forwards' logits
    model = DeviceSamplingModel([], len(PIECES), base=base)
    params = SamplingParams(temperature=0, max_tokens=2, logit_bias={7: 1.5})
    events = list(generate(model, FakeTokenizer(PIECES), [1], params))
    assert [e.token for e in events[:-1]] == [7, 7] and not hasattr(model, "streamed") and len(model.calls) == 2
