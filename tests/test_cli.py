"""The `memra` command line, run as a user runs it (a subprocess), checked against independent
oracles: the `gguf` package's own reader for `info`, llama.cpp (tests/peer.py) for
`tokenize`, `run` and chat-template rendering."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from memra.model import aliases

ROOT = Path(__file__).resolve().parent.parent
NEAR_TIE = 0.05  # llama.cpp's own top-2 log-prob margin below which a greedy divergence is a tie


def memra(*args, stdin=None, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("MEMRA_LOG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True,
                          cwd=ROOT, env=e, input=stdin, timeout=600)


def assert_one_error_line(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("memra: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="module")
def smol_path():
    return aliases.resolve("smollm2-135m")


@pytest.fixture(scope="module")
def gemma_path():
    return aliases.resolve("gemma3-270m")


# -- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cut", [0, 10, 23, 1000, 400_000, 5_000_000, -1])
def test_info_on_a_truncated_gguf_is_one_clear_line(tmp_path, smol_path, cut):
    data = smol_path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:-1])
    r = memra("info", str(bad))
    assert_one_error_line(r, str(bad))
    assert r.stdout == ""


@pytest.mark.slow
def test_missing_file_unknown_alias_and_bad_flag_values(tmp_path):
    assert_one_error_line(memra("info", str(tmp_path / "nope.gguf")), "nope.gguf", "no such file")
    assert_one_error_line(memra("info", "no-such-model"), "no-such-model")
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"hello world, not a model at all")
    assert_one_error_line(memra("info", str(not_gguf)), "not a GGUF file")
    assert_one_error_line(memra("run", str(not_gguf), "-p", "x"), "not a GGUF file")
    assert_one_error_line(memra("run", "-p", "x", "--device", "tpu"), "--device", "tpu")
    assert_one_error_line(memra("run", "-p", "x", "--device", "cpu", "--top-p", "-1"), "--top-p")
    assert_one_error_line(memra("run", "-p", "one two three four", "--device", "cpu", "--ctx", "2"), "context")


@pytest.mark.parametrize("flag", ["--json-schema", "--grammar"])
def test_constraint_file_that_is_not_utf8_is_one_clear_line(tmp_path, smol_path, flag):
    f = tmp_path / "latin1.txt"
    f.write_bytes('{"description": "caf\u00e9"}'.encode("latin-1"))  # was: internal error: UnicodeDecodeError
    r = memra("run", str(smol_path), "-p", "x", "-n", "2", "--device", "cpu", flag, str(f))
    assert_one_error_line(r, flag, str(f), "not UTF-8 text (byte 0xe9 at offset 20)")
    assert "internal error" not in r.stderr


def test_debug_log_shows_the_traceback(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF")
    r = memra("info", str(bad), env={"MEMRA_LOG": "debug"})
    assert r.returncode == 1
    assert "memra: error:" in r.stderr and ("Traceback" in r.stderr or "GGUFError" in r.stderr)
    assert len(r.stderr.strip().split("\n")) > 1


# -- info -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_info_json_agrees_with_the_gguf_package():
    # GGUFReader takes ~10 s per file here (it materializes every vocabulary string), so one
    # model; the gemma3 file's facts are checked against its model card below
    from gguf import GGUFReader

    alias = "smollm2-135m"
    path = aliases.resolve(alias)
    r = memra("info", alias, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    reader = GGUFReader(str(path))
    assert doc["architecture"] == str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    assert doc["n_tensors"] == len(reader.tensors)
    assert doc["params"] == sum(int(t.n_elements) for t in reader.tensors)
    assert doc["file_bytes"] == path.stat().st_size
    assert {k: v["tensors"] for k, v in doc["tensor_types"].items()} == \
        dict(Counter(t.tensor_type.name for t in reader.tensors))
    assert doc["config"]["n_layer"] == int(reader.fields[f"{doc['architecture']}.block_count"].parts[-1][0])
    assert doc["tokenizer"]["n_vocab"] == len(reader.fields["tokenizer.ggml.tokens"].data)


def test_info_gemma3_270m_matches_its_model_card():
    r = memra("info", "gemma3-270m", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    c = doc["config"]
    # Gemma-3-270M: 18 layers, width 640, 4 query heads / 1 KV head of 256, FFN 2048,
    # 262144-token vocabulary, sliding window 512 with every 6th layer global, ~268 M params
    assert (c["arch"], c["n_layer"], c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_ff"]) == \
        ("gemma3", 18, 640, 4, 1, 256, 2048)
    assert c["n_vocab"] == doc["tokenizer"]["n_vocab"] == 262144
    assert c["swa_window"] == 512 and c["swa_layers"] == [i % 6 != 5 for i in range(18)]
    assert 260e6 < doc["params"] < 275e6
    assert doc["tokenizer"]["model"] == "llama" and doc["tokenizer"]["chat_template"] is False
    r = memra("info", "gemma3-270m")
    assert r.returncode == 0, r.stderr
    for needle in ("gemma3", "Q4_K", "Q6_K", "n_layer", "262144", "no (built-in turn format)"):
        assert needle in r.stdout, needle


def test_pull_prints_the_cached_path(smol_path):
    r = memra("pull", "smollm2-135m")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == smol_path
    r = memra("pull")
    assert r.returncode == 0 and "smollm2-135m" in r.stdout and "gemma3-270m" in r.stdout


# -- tokenize, run and chat against llama.cpp -------------------------------------------------

@pytest.fixture(scope="module")
def smol_peer(smol_path):
    from peer import LlamaCppPeer

    with LlamaCppPeer(smol_path) as p:
        yield p


@pytest.fixture(scope="module")
def gemma_peer(gemma_path):
    from peer import LlamaCppPeer

    with LlamaCppPeer(gemma_path) as p:
        yield p


def peer_pieces(peer, text):
    r = peer._http.post("/tokenize", json={"content": text, "add_special": True, "parse_special": True,
                                           "with_pieces": True})
    r.raise_for_status()
    return [t["piece"] for t in r.json()["tokens"]]


def apply_template(peer, messages):
    r = peer._http.post("/apply-template", json={"messages": messages})
    r.raise_for_status()
    return r.json()["prompt"]


def assert_greedy_matches(ours, theirs):
    """Identical, or the first divergence falls where llama.cpp's own top-2 margin is a near-tie."""
    ids = theirs["ids"][:len(ours)]
    for i, (a, b) in enumerate(zip(ours, ids)):
        if a != b:
            top = theirs["top"][i]
            assert top is not None, f"diverged at {i} where llama.cpp reports no probabilities: ours {a}, theirs {b}"
            margin = top[0][1] - top[1][1]
            assert margin < NEAR_TIE, f"diverged at {i}: ours {a}, llama.cpp {b} (margin {margin:.3f})"
            return
    assert ours == ids


@pytest.mark.parity
@pytest.mark.parametrize("text", ["Héllo 🤖 <start_of_turn>", "  two  spaces\n\nand <end_of_turn> 123"])
def test_tokenize_gemma_equals_llama_cpp(gemma_peer, text):
    r = memra("tokenize", "gemma3-270m", "--text", text, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ids"] == gemma_peer.tokenize(text)
    assert doc["pieces"] == peer_pieces(gemma_peer, text)


@pytest.mark.parity
def test_tokenize_smollm2_equals_llama_cpp_and_reads_stdin(smol_peer):
    text = "def f(x):\n    return x ** 2  # ünïcode <|im_start|>"
    r = memra("tokenize", "smollm2-135m", "--text", "-", "--json", stdin=text)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ids"] == smol_peer.tokenize(text)
    assert doc["pieces"] == peer_pieces(smol_peer, text)


@pytest.mark.parity
def test_run_greedy_equals_llama_cpp(smol_peer):
    prompt = "The capital of France is"
    r = memra("run", "smollm2-135m", "--prompt", prompt, "-n", "16", "--temp", "0", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["prompt_ids"] == smol_peer.tokenize(prompt)
    theirs = smol_peer.complete(prompt, 16)
    assert len(doc["tokens"]) == 16 and doc["finish_reason"] == "length"
    assert_greedy_matches(doc["tokens"], theirs)
    assert doc["device"] == "cpu" and doc["model"] == "smollm2-135m"
    assert doc["prefill_tok_s"] > 0 and doc["decode_tok_s"] > 0
    if doc["tokens"] == theirs["ids"]:
        assert doc["text"] == theirs["text"]


@pytest.mark.parity
def test_run_chat_prompt_equals_llama_cpp_template(smol_peer):
    r = memra("run", "smollm2-135m", "--system", "Answer in one word.", "-p", "Capital of France?",
              "-n", "1", "--temp", "0", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    expected = apply_template(smol_peer, [{"role": "system", "content": "Answer in one word."},
                                          {"role": "user", "content": "Capital of France?"}])
    assert doc["chat"] is True and doc["prompt"] == expected
    assert doc["prompt_ids"] == smol_peer.tokenize(expected)
    assert_greedy_matches(doc["tokens"], smol_peer.complete(expected, 1))


@pytest.mark.slow
@pytest.mark.parity
def test_run_chat_gemma_turns_with_one_bos(gemma_peer):
    r = memra("run", "gemma3-270m", "--chat", "-p", "Say hi.", "-n", "1", "--temp", "0",
              "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["prompt"] == "<start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n"
    assert doc["prompt_ids"] == gemma_peer.tokenize(doc["prompt"])
    assert doc["prompt_ids"].count(2) == 1 and doc["prompt_ids"][0] == 2  # <bos>


@pytest.mark.slow
def test_run_seeded_sampling_is_reproducible():
    # no MODEL: the default, smollm2-135m
    args = ["run", "-p", "Once upon a time", "-n", "6", "--temp", "1.0", "--device", "cpu", "--json"]
    a, b, c = (memra(*args, "--seed", s) for s in ("42", "42", "7"))
    for r in (a, b, c):
        assert r.returncode == 0, r.stderr
    ta, tb, tc = (json.loads(r.stdout)["tokens"] for r in (a, b, c))
    assert ta == tb and len(ta) == 6
    assert json.loads(a.stdout)["sampling"]["seed"] == 42
    assert json.loads(a.stdout)["model"] == "smollm2-135m"
    assert ta != tc


@pytest.mark.parity
def test_run_streams_text_and_stops_at_a_stop_string(smol_peer):
    prompt = "The capital of France is"
    assert smol_peer.complete(prompt, 4)["text"].startswith(" Paris.")  # llama.cpp's greedy text
    r = memra("run", "smollm2-135m", "-p", prompt, "-n", "8", "--temp", "0", "--device", "cpu", "--stop", ".")
    assert r.returncode == 0, r.stderr
    assert r.stdout == " Paris\n"
    assert "stop" in r.stderr


# -- --logit-bias -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, want", [(["15043+1"], {15043: 1.0}), (["15043-1"], {15043: -1.0}),
                                        (["7+0.5", "8-100", "9+1e2"], {7: 0.5, 8: -100.0, 9: 100.0}),
                                        (["0-.25"], {0: -0.25}), ([], {})])
def test_logit_bias_spellings(spec, want):
    from memra.cli.run import _logit_bias

    assert _logit_bias(spec) == want


@pytest.mark.parametrize("spec, needles", [
    ("15043", ["--logit-bias", "'15043'", "TOKEN_ID(+/-)BIAS"]),
    ("abc+1", ["--logit-bias", "TOKEN_ID(+/-)BIAS"]),
    ("15043+", ["TOKEN_ID(+/-)BIAS"]),
    ("15043+-1", ["TOKEN_ID(+/-)BIAS"]),
    ("15043*2", ["TOKEN_ID(+/-)BIAS"]),
    ("15043+nan", ["TOKEN_ID(+/-)BIAS"]),
    ("15043+1.2.3", ["TOKEN_ID(+/-)BIAS"]),
    ("15043-inf", ["--logit-bias", "finite", "[-100, 100]"]),
    ("15043+150", ["--logit-bias", "[-100, 100]", "150"]),
    ("15043-100.5", ["--logit-bias", "[-100, 100]"]),
    ("9" * 5000 + "+1", ["--logit-bias", "5000 digits", "outside any vocabulary"]),
])
def test_bad_logit_bias_is_one_clear_line_before_the_model_is_read(tmp_path, spec, needles):
    # a model path that does not exist: the flag fails first
    r = memra("run", str(tmp_path / "none.gguf"), "-p", "x", "--device", "cpu", "--logit-bias", spec)
    assert_one_error_line(r, *needles)
    assert "none.gguf" not in r.stderr


def test_logit_bias_twice_for_one_token_and_beyond_the_vocabulary(smol_path):
    assert_one_error_line(memra("run", "-p", "x", "--device", "cpu", "--logit-bias", "5+1", "--logit-bias", "5-1"),
                          "--logit-bias", "token 5 twice")
    # smollm2-135m has 49152 tokens: the id is refused once the vocabulary is read, before any weight loads
    r = memra("run", str(smol_path), "-p", "x", "--device", "cpu", "--logit-bias", "49152+1")
    assert_one_error_line(r, "--logit-bias", "token id 49152 is outside the vocabulary [0, 49152)")


def test_run_logit_bias_chooses_the_biased_token():
    """" Paris" (7042) is smollm2's greedy token after the prompt; +100 on " London" (4528) makes it the first
    token, -100 on " Paris" removes it."""
    args = ["run", "smollm2-135m", "-p", "The capital of France is", "-n", "2", "--temp", "0", "--device", "cpu",
            "--json"]
    plain, london, no_paris = (memra(*args, *extra) for extra in ([], ["--logit-bias", "4528+100"],
                                                                   ["--logit-bias", "7042-100"]))
    for r in (plain, london, no_paris):
        assert r.returncode == 0, r.stderr
    assert json.loads(plain.stdout)["tokens"][0] == 7042
    doc = json.loads(london.stdout)
    assert doc["tokens"][0] == 4528 and doc["text"].startswith(" London")
    assert doc["sampling"]["logit_bias"] == {"4528": 100.0}
    assert json.loads(no_paris.stdout)["tokens"][0] != 7042
