"""Constrained decoding (memra.text.grammar, llguidance) through `memra serve --device cpu`
and `memra run`, with the official `openai` client.

Oracles: `jsonschema` validates every JSON output against its schema; Python's `re` matches
regex outputs; llguidance's own numpy mask helper checks memra's bit order; the CPU
reference (ReferenceModel) with an llguidance matcher stepped by hand gives the constrained
greedy tokens the server must produce; the unconstrained greedy continuation of the
reference is what an unconstrained request sharing the batch must produce.

The model is a tiny synthetic llama with SmolLM2's vocabulary (random weights: it says
nothing sensible, so the constraint alone makes the output valid, and it is fast)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import jsonschema
import numpy as np
import openai
import pytest

from memra.cpu.reference import ReferenceModel
from memra.model.gguf import open_gguf
from memra.serve.api import ServeConfig, Server
from memra.text.chat import chat_tokens, render_chat
from memra.text.grammar import (GrammarError, allowed, compile_constraint, fill_masks, ll_tokenizer, masked,
                                new_masks)
from memra.text.tokenizer import CONTROL, Tokenizer

ALIAS = "tiny"

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "order": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "status": {"enum": ["open", "paid", "shipped"]},
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                                 "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["sku", "qty"], "additionalProperties": False}}},
            "required": ["id", "status", "items"], "additionalProperties": False},
        "paid": {"type": "boolean"}},
        "required": ["order", "paid"], "additionalProperties": False},
    "choice": {"type": "object", "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]}},
        "required": ["answer", "note"], "additionalProperties": False},
    "list": {"type": "array", "minItems": 2, "maxItems": 4,
             "items": {"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {"type": "boolean"}},
                       "required": ["k", "v"], "additionalProperties": False}},
}


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models("llama")


@pytest.fixture(scope="module")
def tok(model):
    return Tokenizer.from_gguf(open_gguf(model))


@pytest.fixture(scope="module")
def server(model):
    s = Server(ServeConfig(model=str(model), alias=ALIAS, device="cpu", port=0, ctx_size=512, parallel=4))
    s.start_in_thread()
    yield s
    s.stop()


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)


MESSAGES = [{"role": "user", "content": "Describe it as JSON."}]


# -- the tokenizer llguidance walks and the mask's bit order ------------------------------------

def test_llguidance_tokenizer_is_the_gguf_vocabulary(tok):
    llt = ll_tokenizer(tok)
    assert llt.vocab_size == tok.n_vocab
    assert sorted(llt.eos_tokens) == sorted(tok.eog_ids)
    for i in list(range(0, tok.n_vocab, 997)) + sorted(tok.eog_ids):
        if tok.attrs[i] & CONTROL:
            assert llt.is_special_token(i), i
        else:
            assert llt.decode_bytes([i]) == tok.token_bytes(i), i
    text = '{"name": "Ann", "age": 7}'
    assert llt.decode_str(tok.encode(text, add_special=False)) == text


def test_mask_bits_follow_llguidance(tok):
    import llguidance.numpy as lln

    c = compile_constraint(tok, "json_schema", SCHEMAS["choice"])
    m = c.matcher()
    assert m.consume(tok.encode('{"', add_special=False)[0])
    words = new_masks(3, tok.n_vocab)
    fill_masks([(m, 1)], words)
    assert (words[0] == -1).all() and (words[2] == -1).all()  # rows not named are untouched
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(tok.n_vocab).astype(np.float32)
    ref = logits[None].copy()
    lln.apply_token_bitmask_inplace(ref, words[1:2].copy())
    got = masked(logits, words[1])
    np.testing.assert_array_equal(got, ref[0])
    ok = allowed(words[1], tok.n_vocab)
    assert 0 < ok.sum() < tok.n_vocab
    keys = (b'answer": ', b'confidence": ', b'note": ')  # what may follow '{"' under the schema
    for i in np.flatnonzero(ok):
        b = tok.token_bytes(int(i))
        assert any(k.startswith(b) or b.startswith(k) for k in keys), b


def test_json_object_accepts_objects_only(tok):
    c = compile_constraint(tok, "json_object", None)
    m = c.matcher()
    assert m.consume_all(tok.encode('{"a": [1, {"b": null}]}', add_special=False)) and m.accepting
    m = c.matcher()
    assert not m.consume_all(tok.encode('[1, 2]', add_special=False))


@pytest.mark.parametrize("kind,spec,needle", [
    ("json_schema", {"type": "objectx"}, "objectx"),
    ("json_schema", '{"type": "object",', "not valid JSON"),
    ("gbnf", 'root ::= item\n', "item"),
    ("gbnf", 'root ::= "a" (', "grammar"),
    ("regex", "[a-z", "unclosed"),
    ("lark", "start: foo", "foo"),
])
def test_invalid_constraints_name_the_problem(tok, kind, spec, needle):
    with pytest.raises(GrammarError, match=re.escape(needle)):
        compile_constraint(tok, kind, spec)


# -- the server ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "person" else n
                                  for n in sorted(SCHEMAS)])
def test_json_schema_outputs_parse_and_validate(server, name):
    schema = SCHEMAS[name]
    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=300, temperature=1.0, seed=seed,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": name, "schema": schema}})
        ch = r.choices[0]
        assert ch.finish_reason == "stop", ch
        jsonschema.validate(json.loads(ch.message.content), schema)


def test_llama_server_fields_and_json_object(server):
    c = client(server)
    schema = SCHEMAS["person"]
    r = c.completions.create(model=ALIAS, prompt="Person:", max_tokens=200, seed=1, extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    # any JSON object: a random model may not close it within the limit; what it wrote is an object's start
    r = c.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=40, seed=2,
                                  response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    r = c.completions.create(model=ALIAS, prompt="Answer:", max_tokens=20, seed=3,
                             extra_body={"grammar": 'root ::= ("yes" | "no") " " [0-9] [0-9]?'})
    assert re.fullmatch(r"(yes|no) [0-9][0-9]?", r.choices[0].text), r.choices[0].text
    r = c.completions.create(model=ALIAS, prompt="Code:", max_tokens=20, seed=4,
                             extra_body={"regex": r"[A-Z]{2}-[0-9]{3}"})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_streamed_json_schema_output_parses(server):
    schema = SCHEMAS["nested"]
    chunks = client(server).chat.completions.create(
        model=ALIAS, messages=MESSAGES, max_tokens=300, seed=5, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    text, finish = "", None
    for ch in chunks:
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("extra,param,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format", "objectx"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ({"grammar": "root ::= missing"}, "grammar", "missing"),
    ({"regex": "(ab"}, "regex", "regex"),
    ({"regex": "a", "grammar": 'root ::= "a"'}, "regex", "one output constraint"),
])
def test_invalid_constraint_is_a_400_naming_it(server, extra, param, needle):
    c = client(server)
    rf = extra.pop("response_format", None)
    kw = {"response_format": rf} if rf is not None else {}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=5, extra_body=extra, **kw)
    err = e.value.body
    assert err["param"] == param and needle in err["message"], err


@pytest.fixture(scope="module")
def reference(model, tok):
    g = open_gguf(model)
    return ReferenceModel(g, numerics="llamacpp"), g


def _greedy(ref, prompt, n, constraint=None, eog=()):
    """The reference's greedy tokens, masked by a hand-stepped llguidance matcher."""
    m = constraint.matcher() if constraint is not None else None
    cache = ref.new_cache(len(prompt) + n + 1)
    lg = ref.forward(list(prompt), cache)
    words = new_masks(1, lg.size)
    out = []
    for _ in range(n):
        if m is not None:
            m.fill(words[0])
            lg = masked(lg, words[0])
        t = int(np.argmax(lg))
        out.append(t)
        if t in eog:
            break
        if m is not None:
            assert m.consume(t)
            if m.stopped:
                break
        lg = ref.forward([t], cache)
    return out


@pytest.mark.slow
def test_constrained_and_free_rows_share_a_batch(server, reference, tok):
    """Two constrained and two free greedy requests at once: each one's tokens are the
    reference's alone (the constrained ones under the hand-stepped matcher)."""
    ref, g = reference
    schema = SCHEMAS["choice"]
    con = compile_constraint(tok, "json_schema", schema)
    prompts = ["Reply in JSON:", "Another one:", "Free text here", "More free text"]
    results = [None] * 4

    def go(i):
        kw = {"extra_body": {"json_schema": schema}} if i < 2 else {}
        results[i] = client(server).completions.create(model=ALIAS, prompt=prompts[i], max_tokens=16,
                                                       temperature=0, logprobs=0, **kw)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i, p in enumerate(prompts):
        ids = tok.encode(p, add_special=True, parse_special=True)
        want = _greedy(ref, ids, 16, con if i < 2 else None, eog=tok.eog_ids)
        text = tok.decode([t for t in want if t not in tok.eog_ids], skip_special=True)
        assert results[i].choices[0].text == text, (i, results[i].choices[0].text, text)
        if i < 2:
            jsonschema.validate(json.loads(text), schema)


# -- the CLI -----------------------------------------------------------------------------------------

def _memra(*args):
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_json_schema_and_errors(model, tmp_path, reference, tok):
    schema = SCHEMAS["person"]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    r = _memra("run", str(model), "-p", "Person:", "-n", "200", "--temp", "0", "--device", "cpu",
               "--json-schema", str(f), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(json.loads(doc["text"]), schema)
    ref, _ = reference
    want = _greedy(ref, doc["prompt_ids"], 200, compile_constraint(tok, "json_schema", schema), tok.eog_ids)
    assert doc["tokens"][:len(want)] == want
    assert 0 < doc["n_forced"] < doc["n_gen"]  # forced tokens were fast-forwarded (MEMRA_FORCED)
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= nothing-here\n")
    r = _memra("run", str(model), "-p", "x", "-n", "5", "--device", "cpu", "--grammar", str(bad))
    assert r.returncode != 0 and "nothing-here" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _memra("run", str(model), "-p", "x", "-n", "5", "--device", "cpu", "--regex", "a", "--grammar", str(bad))
    assert r.returncode != 0 and "not --grammar and --regex" in r.stderr, r.stderr


# -- the GPU runner's mask kernel on the emulated GPU ---------------------------------------------

def test_runner_masks_rows_on_the_device(tiny_models, tok):
    """A decode step (its captured graph) and a prefill's head with constrained and free rows
    side by side, greedy and seeded: each token is the sampling rule applied to the row's own
    logits (taken from an unconstrained step) with the grammar's disallowed tokens at -inf,
    and the logits the rows return are the unmasked ones."""
    from gpu_emulator import FakeGpu

    from memra.gpu.ops.sample import reference_sample
    from memra.gpu.runner import Row, Runner, Sampling

    r = Runner(tiny_models("llama", "Q4_K_M"), gpu=FakeGpu(1 << 28), max_len=64, max_seqs=4)
    con = compile_constraint(tok, "json_schema", SCHEMAS["person"])
    prompts = [tok.encode(p, add_special=False) for p in ("Give JSON:", "More JSON", "free text")]
    sets = [Sampling(0.0), Sampling(1.0, 0, 1.0, 0.0, 99), Sampling(0.0)]
    words = new_masks(3, tok.n_vocab)
    matchers = [con.matcher(), con.matcher()]
    fill_masks([(m, i) for i, m in enumerate(matchers)], words)
    masks = [words[0], words[1], None]

    def expect(lg, s, m, pos):
        x = masked(lg, m) if m is not None else lg
        return int(np.argmax(x)) if s.greedy else reference_sample(x, s.temperature, s.top_k, s.top_p, s.min_p,
                                                                   s.seed, pos)

    for path in ("prefill", "decode"):
        seqs = [r.open() for _ in prompts]
        feed = [p if path == "prefill" else p[:-1] for p in prompts]
        if path == "decode":
            r.step([Row(s, f) for s, f in zip(seqs, feed)])
            feed = [[p[-1]] for p in prompts]
        n0 = [s.n for s in seqs]
        raw = r.step([Row(s, f, logits="last") for s, f in zip(seqs, feed)])
        for s, n in zip(seqs, n0):
            r.rewind(s, n)
        out = r.step([Row(s, f, logits="last", sample=st, mask=m) for s, f, st, m in zip(seqs, feed, sets, masks)])
        for i, (o, s) in enumerate(zip(out, seqs)):
            want = expect(raw[i].logits, sets[i], masks[i], s.n)
            assert o.token == want, (path, i, o.token, want)
            # the logits a masked row returns are the model's (log-probs), not the masked ones
            assert np.array_equal(o.logits, raw[i].logits), (path, i)
            if masks[i] is not None:
                assert allowed(masks[i], tok.n_vocab)[o.token]
        for s in seqs:
            r.close(s)


def test_mask_check_catches_its_canary(monkeypatch):
    """What mask.cu's canary breaks (a word's bits read in reverse), done to the emulator's
    kernel model: the family's checks fail; on the model as it is they pass bit for bit."""
    import gpu_emulator as EMU
    from gpu_emulator import FakeGpu

    from memra.gpu.ops import mask as MK

    g, rng = FakeGpu(1 << 26), np.random.default_rng(3)
    assert all(o.ok for o in MK.checks(g, rng))

    def reversed_bits(g_, k, grid, v):
        logits, n, mask, words, pos = v
        w = g_.mem(mask, np.uint32, grid[1] * int(words))
        saved = w.copy()
        rev = np.zeros_like(w)
        for i in range(32):
            rev |= ((w >> np.uint32(i)) & np.uint32(1)) << np.uint32(31 - i)
        w[:] = rev
        EMU._apply_mask(g_, k, grid, v)
        w[:] = saved

    monkeypatch.setitem(EMU._KERNELS, "apply_mask", reversed_bits)
    outs = list(MK.checks(g, rng))
    assert not any(o.ok for o in outs if "n=33" not in o.name) and "differ" in outs[0].detail
