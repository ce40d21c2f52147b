"""The `memra` command line, run as a user runs it (a subprocess), checked against independent
oracles: the `gguf` package's own reader for `info`, llama.cpp (tests/peer.py) for
`tokenize`, `run` and chat-template rendering."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from memra import aliases

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


def test_missing_file_unknown_alias_and_bad_flag_values(tmp_path):
    assert_one_error_line(memra("info", str(tmp_path / "nope.gguf")), "nope.gguf", "no such file")
    assert_one_error_line(memra("info", "no-such-model"), "no-such-model")
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"hello world, not a model at all")
    assert_one_error_line(memra("info", str(not_gguf)), "not a GGUF file")
    assert_one_error_line(memra("run", str(not_gguf), "-p", "x"), "not a GGUF file")


def test_debug_log_shows_the_traceback(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF")
    r = memra("info", str(bad), env={"MEMRA_LOG": "debug"})
    assert r.returncode == 1
    assert "memra: error:" in r.stderr and ("Traceback" in r.stderr or "GGUFError" in r.stderr)
    assert len(r.stderr.strip().split("\n")) > 1


# -- info -------------------------------------------------------------------------------------

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
