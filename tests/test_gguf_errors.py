"""GGUF error paths: a damaged file gives a MemraError naming the file, never another
exception, never a hang.

The file under test is small and written here with the `gguf` package's own writer (the
oracle for what a valid file is): a one-layer llama with a little tokenizer, metadata of
every value type (nested arrays too) and tensors of several types. Then: every cut point of
its header, metadata and tensor-info region; a sample of cut points in the data region (an
error exactly when a tensor's bytes are cut); a few hundred seeded random corruptions;
and one test per named defect. Then the metadata read after the container: hyper-parameters
(memra.model.config), the tokenizer's arrays and flags, the chat template, and `memra run`
on such files (one error line naming the key, never "internal error").
"""

import contextlib
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from memra.cpu.reference import ReferenceModel
from memra.model.aliases import resolve
from memra.model.config import read_config
from memra.errors import (GGUFError, MemraError, ModelNotFoundError, TemplateError, TokenizerError,
                          UnsupportedModelError)
from memra.model.gguf import open_gguf
from memra.model.synth import random_blocks
from memra.text.chat import render_chat
from memra.text.tokenizer import Tokenizer

# name, numpy shape (rows, cols), type
TENSORS = [
    ("token_embd.weight", (16, 32), T.Q8_0),
    ("blk.0.attn_norm.weight", (32,), T.F32),
    ("blk.0.attn_q.weight", (32, 32), T.F16),
    ("blk.0.attn_k.weight", (16, 32), T.Q4_0),
    ("blk.0.attn_v.weight", (16, 32), T.Q4_1),
    ("blk.0.attn_output.weight", (32, 32), T.Q5_0),
    ("blk.0.ffn_norm.weight", (32,), T.F32),
    ("blk.0.ffn_gate.weight", (256, 32), T.Q5_1),
    ("blk.0.ffn_up.weight", (256, 32), T.BF16),
    ("blk.0.ffn_down.weight", (32, 256), T.Q4_K),
    ("output_norm.weight", (32,), T.F32),
    ("output.weight", (16, 32), T.Q8_0),
]


def n_bytes(shape, t):
    bs, ts = GGML_QUANT_SIZES[t]
    return int(np.prod(shape)) // bs * ts


def write_small(path, arch="llama", tensors=TENSORS, kv=None):
    """kv: metadata to change, key -> (value, GGUFValueType[, element type]), or None to leave
    the key out."""
    w = GGUFWriter(path, arch)
    w.add_name("memra error-path test")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_feed_forward_length(256)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(7)
    tokens = ["<unk>", "<s>", "</s>"] + [chr(ord("a") + i) for i in range(13)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(16)])
    w.add_token_types([2, 3, 3] + [1] * 13)
    w.add_bos_token_id(1)
    w.add_add_bos_token(True)
    for i, vt in enumerate([GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16,
                            GGUFValueType.INT16, GGUFValueType.INT64, GGUFValueType.UINT64,
                            GGUFValueType.FLOAT64, GGUFValueType.BOOL]):
        w.add_key_value(f"test.scalar{i}", 1, vt)
    w.add_key_value("test.nested", [[1, 2], [3]], GGUFValueType.ARRAY)
    w.add_key_value("test.strings", ["x", "yy", ""], GGUFValueType.ARRAY, GGUFValueType.STRING)
    for key, v in (kv or {}).items():
        if v is None:
            del w.kv_data[0][key]
        else:
            w.add_key_value(key, *v)
    rng = np.random.default_rng(0)
    for name, shape, t in tensors:
        if t == T.F32:
            data = rng.uniform(0.5, 1.5, shape).astype(np.float32).view(np.uint8)
        else:
            data = random_blocks(t, int(np.prod(shape)), 0.1, seed=len(name))
        w.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = write_small(tmp_path_factory.mktemp("gguf") / "small.gguf")
    g = open_gguf(path)  # the intact file loads and reads as written
    try:
        read_config(g)
        layout = {n: (t.offset, t.n_bytes) for n, t in g.tensors.items()}
        data_offset = g.data_offset
        assert [(n, t.shape, t.ggml_type) for n, t in g.tensors.items()] == \
            [(n, s, t) for n, s, t in TENSORS]
        assert g.metadata["test.nested"][1].tolist() == [3]
    finally:
        g.close()
    return path, path.read_bytes(), data_offset, layout


@contextlib.contextmanager
def deadline(seconds):
    """Fail (instead of hanging the suite) if the block takes longer than `seconds`."""
    def fire(*_):
        raise TimeoutError(f"took longer than {seconds} s: a hang?")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def load(path):
    """Everything a user's `memra info` touches: parse, config, every tensor's bytes."""
    g = open_gguf(path)
    try:
        read_config(g)
        for t in g.tensors.values():
            int(np.asarray(t.data, dtype=np.uint64).sum())
        return g.metadata
    finally:
        g.close()


def test_every_cut_point_of_the_header_metadata_and_tensor_infos(small, tmp_path):
    _, blob, data_offset, _ = small
    cut = tmp_path / "cut.gguf"
    with deadline(60):
        for n in range(data_offset + 1):
            cut.write_bytes(blob[:n])
            with pytest.raises(GGUFError) as e:
                open_gguf(cut)
            assert str(cut) in str(e.value)


def test_cut_points_in_the_data_region(small, tmp_path):
    _, blob, data_offset, layout = small
    end = max(off + nb for off, nb in layout.values())  # after it: only the writer's padding
    rng = np.random.default_rng(1)
    points = {data_offset + 1, end - 1, end, len(blob) - 1}
    for off, nb in layout.values():
        points |= {off, off + 1, off + nb - 1, off + nb}
    points |= set(rng.integers(data_offset, len(blob), 100).tolist())
    cut = tmp_path / "cut.gguf"
    with deadline(60):
        for n in sorted(p for p in points if data_offset <= p < len(blob)):
            cut.write_bytes(blob[:n])
            if n < end:
                with pytest.raises(GGUFError, match="truncated: tensor") as e:
                    open_gguf(cut)
                assert str(cut) in str(e.value)
            else:
                load(cut)


def test_random_corruptions_load_or_raise_memra_errors(small, tmp_path):
    _, blob, data_offset, _ = small
    bad = tmp_path / "bad.gguf"
    outcomes = {"loaded": 0, "error": 0}
    with deadline(120):
        for seed in range(400):
            rng = np.random.default_rng(seed)
            b = bytearray(blob)
            for _ in range(rng.integers(1, 5)):
                # mostly the structured part, where corruption changes how the file parses
                hi = data_offset if rng.random() < 0.85 else len(b)
                pos = int(rng.integers(0, hi))
                b[pos] = b[pos] ^ (1 << int(rng.integers(0, 8))) if rng.random() < 0.5 else int(rng.integers(0, 256))
            bad.write_bytes(bytes(b))
            try:
                load(bad)
                outcomes["loaded"] += 1
            except MemraError as e:
                assert str(e), seed
                outcomes["error"] += 1
            except Exception as e:  # noqa: BLE001 - the point of the test
                pytest.fail(f"seed {seed}: {type(e).__name__}: {e}")
    assert outcomes["loaded"] > 20 and outcomes["error"] > 100, outcomes  # both paths exercised


# -- named defects ----------------------------------------------------------------------------

def patched(blob, tmp_path, pos, data: bytes):
    b = bytearray(blob)
    b[pos:pos + len(data)] = data
    p = tmp_path / "patched.gguf"
    p.write_bytes(bytes(b))
    return p


def tensor_info_pos(blob, name):
    """Offset of a tensor's info record (its name's length field) in the file."""
    raw = name.encode()
    pos = blob.index(struct.pack("<Q", len(raw)) + raw)
    return pos, pos + 8 + len(raw)  # record start, n_dims field


def test_unknown_tensor_type_names_the_tensor(small, tmp_path):
    _, blob, _, _ = small
    _, nd = tensor_info_pos(blob, "blk.0.attn_k.weight")
    n_dims = struct.unpack_from("<I", blob, nd)[0]
    p = patched(blob, tmp_path, nd + 4 + 8 * n_dims, struct.pack("<I", 250))
    with pytest.raises(GGUFError, match=r"'blk.0.attn_k.weight'.*unknown tensor type 250"):
        open_gguf(p)


@pytest.mark.parametrize("magic", [b"GGUX", b"\0\0\0\0", b"FUGG"])
def test_bad_magic(small, tmp_path, magic):
    p = patched(small[1], tmp_path, 0, magic)
    with pytest.raises(GGUFError, match="not a GGUF file") as e:
        open_gguf(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_unsupported_version(small, tmp_path, version):
    p = patched(small[1], tmp_path, 4, struct.pack("<I", version))
    with pytest.raises(GGUFError, match=f"unsupported GGUF version {version}"):
        open_gguf(p)


def test_unknown_architecture(tmp_path):
    path = write_small(tmp_path / "arch.gguf", arch="mamba9")
    g = open_gguf(path)
    try:
        with pytest.raises(UnsupportedModelError, match="mamba9") as e:
            read_config(g)
        assert str(path) in str(e.value)
    finally:
        g.close()


def test_missing_architecture(small, tmp_path):
    _, blob, _, _ = small
    key = b"general.architecture"
    p = patched(blob, tmp_path, blob.index(key), b"general.architecturX")
    g = open_gguf(p)
    try:
        with pytest.raises(GGUFError, match="general.architecture is missing"):
            read_config(g)
    finally:
        g.close()


def test_architecture_that_is_not_a_string(tmp_path):
    path = write_small(tmp_path / "arch.gguf", kv={"general.architecture": (7, GGUFValueType.UINT32)})
    g = open_gguf(path)
    try:  # not "general.architecture is missing": it is there, as a number
        with pytest.raises(GGUFError, match="general.architecture is int '7', not a string"):
            read_config(g)
    finally:
        g.close()


@pytest.mark.parametrize("field", [8, 16])  # tensor count, metadata count
@pytest.mark.parametrize("value,message", [(1 << 62, "corrupt header"), ((1 << 64) - 1, "corrupt header"),
                                           (10_000, "corrupt header|truncated")])
def test_absurd_counts_fail_fast(small, tmp_path, field, value, message):
    p = patched(small[1], tmp_path, field, struct.pack("<Q", value))
    with deadline(5), pytest.raises(GGUFError, match=message):
        open_gguf(p)


def test_absurd_string_and_array_lengths_fail_fast(small, tmp_path):
    _, blob, _, _ = small
    # the first key's length, then the token list's element count
    p = patched(blob, tmp_path, 24, struct.pack("<Q", 1 << 60))
    with deadline(5), pytest.raises(GGUFError, match="truncated"):
        open_gguf(p)
    key = b"tokenizer.ggml.tokens"
    count_pos = blob.index(key) + len(key) + 4 + 4  # value type, element type, count
    assert struct.unpack_from("<Q", blob, count_pos)[0] == 16
    for count in (1 << 40, (1 << 64) - 1):
        p = patched(blob, tmp_path, count_pos, struct.pack("<Q", count))
        with deadline(5), pytest.raises(GGUFError, match="tokenizer.ggml.tokens"):
            open_gguf(p)


def test_unknown_metadata_value_type(small, tmp_path):
    _, blob, _, _ = small
    key = b"general.name"
    p = patched(blob, tmp_path, blob.index(key) + len(key), struct.pack("<I", 77))
    with pytest.raises(GGUFError, match="'general.name': unknown value type 77"):
        open_gguf(p)


@pytest.mark.parametrize("n_dims", [0, 5, 1 << 31])
def test_bad_dimension_count(small, tmp_path, n_dims):
    _, blob, _, _ = small
    _, nd = tensor_info_pos(blob, "output.weight")
    p = patched(blob, tmp_path, nd, struct.pack("<I", n_dims))
    with pytest.raises(GGUFError, match=r"'output.weight'.*dimensions|truncated"):
        open_gguf(p)


@pytest.mark.parametrize("dims,message", [
    ((0, 16), "bad shape"),
    ((33, 16), "not a multiple of the block size 32"),
    ((32, 1 << 40), "truncated: tensor 'output.weight'"),
    ((1 << 62, 1 << 62), "output.weight"),  # element count overflows 64 bits
    ((32, (1 << 64) - 1), "output.weight"),
])
def test_bad_tensor_dimensions(small, tmp_path, dims, message):
    _, blob, _, _ = small
    _, nd = tensor_info_pos(blob, "output.weight")
    p = patched(blob, tmp_path, nd + 4, struct.pack("<QQ", *dims))
    with pytest.raises(GGUFError, match=message):
        open_gguf(p)


def test_data_offset_out_of_range_or_misaligned(small, tmp_path):
    _, blob, _, _ = small
    _, nd = tensor_info_pos(blob, "output.weight")
    off_pos = nd + 4 + 16 + 4
    for off, message in [(1 << 60, "truncated: tensor 'output.weight'"), (3, "not aligned"),
                         ((1 << 64) - 32, "output.weight")]:
        p = patched(blob, tmp_path, off_pos, struct.pack("<Q", off))
        with pytest.raises(GGUFError, match=message):
            open_gguf(p)


def test_duplicate_tensor_name(tmp_path):
    tensors = TENSORS[:2] + [("blk.0.attn_norm.weight", (32,), T.F32)]
    path = tmp_path / "dup.gguf"
    # gguf's writer refuses duplicates, so write a distinct name and rename it in place
    tensors[2] = ("blk.0.attn_norm.weighX", (32,), T.F32)
    write_small(path, tensors=tensors)
    blob = path.read_bytes()
    p = patched(blob, tmp_path, blob.index(b"blk.0.attn_norm.weighX"), b"blk.0.attn_norm.weight")
    with pytest.raises(GGUFError, match="appears twice"):
        open_gguf(p)


def test_bad_alignment(tmp_path):
    path = tmp_path / "align.gguf"
    w = GGUFWriter(path, "llama")
    w.add_uint32("general.alignment", 24)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="not a power of two"):
        open_gguf(path)


def test_deeply_nested_arrays_fail_cleanly(tmp_path):
    # an array of arrays of arrays ... 5000 deep: a clear error, not a RecursionError
    depth = 5000
    body = b""
    for _ in range(depth):
        body = struct.pack("<IQ", GGUFValueType.ARRAY, 1) + body
    body += struct.pack("<IQ", GGUFValueType.UINT8, 0)
    key = b"test.deep"
    blob = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<I", GGUFValueType.ARRAY) + body)
    p = tmp_path / "deep.gguf"
    p.write_bytes(blob)
    with pytest.raises(GGUFError, match="test.deep"):
        open_gguf(p)


def test_not_a_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        open_gguf(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="cannot open"):
        open_gguf(tmp_path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFError, match="truncated"):
        open_gguf(empty)


def test_duplicate_metadata_key(small, tmp_path):
    _, blob, _, _ = small
    # two keys of one name: which value is meant? (llama.cpp refuses the file too)
    p = patched(blob, tmp_path, blob.index(b"test.scalar1"), b"test.scalar0")
    with pytest.raises(GGUFError, match="metadata key 'test.scalar0' appears twice"):
        open_gguf(p)


def test_overlapping_tensor_data(small, tmp_path):
    _, blob, _, layout = small
    _, nd = tensor_info_pos(blob, "output.weight")
    off_pos = nd + 4 + 16 + 4
    assert layout["token_embd.weight"][1] == layout["output.weight"][1]  # same size, Q8_0 16 x 32
    p = patched(blob, tmp_path, off_pos, struct.pack("<Q", 0))  # output.weight's bytes = token_embd's
    with pytest.raises(GGUFError, match=r"tensor '(output|token_embd)\.weight' .* overlaps tensor "
                                        r"'(output|token_embd)\.weight'"):
        open_gguf(p)


def test_bool_alignment(tmp_path):
    path = tmp_path / "align.gguf"
    w = GGUFWriter(path, "llama")
    w.add_bool("general.alignment", True)  # not 1: a bool where a uint32 belongs
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="general.alignment = True is not a power of two"):
        open_gguf(path)


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with deadline(5):  # open() of a FIFO waits for a writer: never reached
        with pytest.raises(GGUFError, match="not a regular file \\(a named pipe\\)"):
            open_gguf(fifo)
        with pytest.raises(ModelNotFoundError, match="pipe.gguf is not a regular file"):
            resolve(fifo)
    with pytest.raises(GGUFError, match="not a regular file \\(a character device\\)"):
        open_gguf(os.devnull)  # not "truncated: 0 bytes"


# -- hyper-parameters, tokenizer and chat template metadata -----------------------------------

def config_of(path):
    g = open_gguf(path)
    try:
        return read_config(g)
    finally:
        g.close()


V = GGUFValueType


@pytest.mark.parametrize("key,value,message", [
    # wrong types: were ValueError / TypeError out of int() and float()
    ("llama.block_count", ("four", V.STRING), "llama.block_count = 'four' is not an integer"),
    ("llama.context_length", ("x", V.STRING), "llama.context_length = 'x' is not an integer"),
    ("llama.vocab_size", ("x", V.STRING), "llama.vocab_size = 'x' is not an integer"),
    ("llama.embedding_length", (["a", "b"], V.ARRAY, V.STRING), "embedding_length = an array of 2 is not"),
    ("llama.embedding_length", (32.5, V.FLOAT32), "embedding_length = 32.5 is not an integer"),
    ("llama.embedding_length", (True, V.BOOL), "embedding_length = True is not an integer"),
    ("llama.rope.freq_base", ("big", V.STRING), "llama.rope.freq_base = 'big' is not a number"),
    # zero head counts: were ZeroDivisionError
    ("llama.attention.head_count", (0, V.UINT32), "head_count = 0 is out of range"),
    ("llama.attention.head_count_kv", (0, V.UINT32), "head_count_kv = 0 is out of range"),
    # sizes that are zero or negative: were misread ("does not fit head size 0") or loaded
    ("llama.block_count", (0, V.UINT32), "llama.block_count = 0 is out of range"),
    ("llama.embedding_length", (0, V.UINT32), "llama.embedding_length = 0 is out of range"),
    ("llama.embedding_length", (-32, V.INT32), "llama.embedding_length = -32 is out of range"),
    ("llama.attention.key_length", (0, V.UINT32), "key_length = 0 is out of range"),
    ("llama.feed_forward_length", (0, V.UINT32), "feed_forward_length = 0 is out of range"),
    ("llama.context_length", (0, V.UINT32), "llama.context_length = 0 is out of range"),
    ("llama.rope.dimension_count", (-2, V.INT32), "rope.dimension_count = -2 is out of range"),
    ("llama.rope.dimension_count", (0, V.UINT32), "rope.dimension_count = 0 is out of range"),  # was 1 / 0
    ("llama.attention.head_count", (3, V.UINT32), "embedding_length 32 is not a multiple of "
                                                  "llama.attention.head_count 3"),
    # numbers that made every logit NaN (or a silent no-op) and still generated text
    ("llama.rope.freq_base", (float("nan"), V.FLOAT32), "rope.freq_base = nan is out of range"),
    ("llama.rope.freq_base", (0.0, V.FLOAT32), "rope.freq_base = 0.0 is out of range"),
    ("llama.rope.freq_base", (-1.0, V.FLOAT32), "rope.freq_base = -1.0 is out of range"),
    ("llama.rope.freq_base", (float("inf"), V.FLOAT32), "rope.freq_base = inf is out of range"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), V.FLOAT32), "epsilon = nan is out of range"),
    ("llama.attention.layer_norm_rms_epsilon", (-1.0, V.FLOAT32), "epsilon = -1.0 is out of range"),
    ("llama.rope.scaling.factor", (-2.0, V.FLOAT32), "rope.scaling.factor = -2.0 is out of range"),
    # a vocabulary size the tokenizer does not have: sampled ids past the tokens failed mid-text
    ("llama.vocab_size", (20, V.UINT32), "llama.vocab_size = 20 does not match the 16 tokens"),
])
def test_bad_hyper_parameter_names_the_key(tmp_path, key, value, message):
    kv = {key: value}
    if key == "llama.rope.scaling.factor":
        kv["llama.rope.scaling.type"] = ("linear", V.STRING)
    path = write_small(tmp_path / "hp.gguf", kv=kv)
    with pytest.raises(GGUFError, match=None) as e:
        config_of(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_absurd_block_count_fails_fast(tmp_path):
    # the CPU engine built a table of every layer's tensors before finding one missing: 2^31
    # entries (minutes and gigabytes) for one flipped byte
    path = write_small(tmp_path / "layers.gguf", kv={"llama.block_count": (1 << 31, V.UINT32)})
    with deadline(5), pytest.raises(GGUFError, match=r"block_count = 2147483648, but the file has tensors "
                                                      r"of 1 layers"):
        config_of(path)


@pytest.mark.parametrize("key,value,message", [
    ("tokenizer.ggml.model", (["llama"], V.ARRAY, V.STRING),  # was: "truth value of an array is ambiguous"
     "tokenizer.ggml.model is an array of 1 strings, expected a string"),
    ("tokenizer.ggml.tokens", (list(range(16)), V.ARRAY, V.INT32),
     "tokenizer.ggml.tokens is an array of 16 int32, expected an array of strings"),
    ("tokenizer.ggml.scores", (["x"] * 16, V.ARRAY, V.STRING),
     "tokenizer.ggml.scores is an array of 16 strings, expected an array of numbers"),
    ("tokenizer.ggml.scores", ("abc", V.STRING), "tokenizer.ggml.scores is str 'abc', expected an array"),
    ("tokenizer.ggml.token_type", (1, V.INT32), "tokenizer.ggml.token_type is int 1, expected an array"),
    ("tokenizer.ggml.token_type", (["a"] * 16, V.ARRAY, V.STRING),
     "tokenizer.ggml.token_type is an array of 16 strings, expected an array of integers"),
    ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.INT32),
     "tokenizer.ggml.merges is an array of 2 int32, expected an array of strings"),
    ("tokenizer.ggml.merges", ("a b", V.STRING), "tokenizer.ggml.merges is str 'a b', expected"),
    # bool("false") is True: the string was read as "add a BOS"
    ("tokenizer.ggml.add_bos_token", ("false", V.STRING),
     "tokenizer.ggml.add_bos_token is str 'false', expected a bool"),
])
def test_bad_tokenizer_metadata_names_the_key(tmp_path, key, value, message):
    path = write_small(tmp_path / "tok.gguf", kv={key: value})
    g = open_gguf(path)
    try:
        with pytest.raises(TokenizerError, match=None) as e:
            Tokenizer.from_gguf(g)
    finally:
        g.close()
    assert message in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("template,message", [
    ((5, V.UINT32), "metadata tokenizer.chat_template is int '5', not text"),  # was TypeError
    ((["{{ x }}", "y"], V.ARRAY, V.STRING), "tokenizer.chat_template is list"),
    (([1, 2], V.ARRAY, V.INT32), "tokenizer.chat_template is ndarray"),  # was "truth value ... is ambiguous"
    (("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", V.STRING), "recursed too deeply"),  # RecursionError
    (("{% for i in range(10**12) %}x{% endfor %}", V.STRING), "Range too big"),  # OverflowError
    (("{{ 'x' * 10**11 }}", V.STRING), "repeating a str of length 1 100000000000 times"),  # 100 GB
    (("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", V.STRING),
     "ran more than 1,000,000 steps"),  # 10^10 iterations: hours
    (("{% set s = 'ab' * 500000 %}{% for a in s %}{% for b in s %}{{ loop.index }}{% endfor %}{% endfor %}",
      V.STRING), "ran more than 1,000,000 steps"),
])
def test_bad_chat_template_is_a_template_error(tmp_path, template, message):
    path = write_small(tmp_path / "tmpl.gguf", kv={"tokenizer.chat_template": template})
    g = open_gguf(path)
    try:
        with deadline(10), pytest.raises(TemplateError, match=None) as e:
            render_chat(g, [{"role": "user", "content": "hi"}])
    finally:
        g.close()
    assert message in str(e.value)


@pytest.mark.parametrize("bos", [("1", V.STRING), (float("nan"), V.FLOAT32), ([1, 2], V.ARRAY, V.INT32)])
def test_special_token_id_of_the_wrong_type_names_no_token_in_the_template(tmp_path, bos):
    # the tokenizer warns and falls back (as llama.cpp); the template's bos_token was int(id): ValueError
    path = write_small(tmp_path / "bos.gguf", kv={"tokenizer.ggml.bos_token_id": bos,
                                                  "tokenizer.chat_template": ("[{{ bos_token }}]", V.STRING)})
    g = open_gguf(path)
    try:
        assert render_chat(g, [{"role": "user", "content": "hi"}]) == "[]"
    finally:
        g.close()


# -- the command line: one line naming the problem, never "internal error" ---------------------

def memra_cli(*args):
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MEMRA_LOG", None)
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True,
                          cwd=root, env=env, timeout=120)


@pytest.mark.parametrize("kv,extra,needle", [
    ({"llama.attention.head_count_kv": (0, V.UINT32)}, (), "head_count_kv = 0 is out of range"),
    ({"llama.block_count": ("four", V.STRING)}, (), "llama.block_count = 'four' is not an integer"),
    ({"tokenizer.ggml.scores": (["x"] * 16, V.ARRAY, V.STRING)}, (), "tokenizer.ggml.scores is an array"),
    ({"tokenizer.chat_template": ("{% for i in range(10**12) %}x{% endfor %}", V.STRING)}, ("--chat",),
     "Range too big"),
])
def test_cli_run_on_bad_metadata_is_one_clear_line(tmp_path, kv, extra, needle):
    path = write_small(tmp_path / "bad.gguf", kv=kv)
    r = memra_cli("run", str(path), "-p", "abc", "-n", "2", "--device", "cpu", *extra)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("memra: error: "), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert needle in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("numerics", ["f32", "llamacpp"])
def test_nan_weights_are_an_error_naming_the_tensor(small, tmp_path, numerics):
    _, blob, _, layout = small
    off, nb = layout["output_norm.weight"]  # F32: one NaN among the 32 values
    p = patched(blob, tmp_path, off + 4 * 5, struct.pack("<f", float("nan")))
    g = open_gguf(p)
    try:  # was: NaN logits, sampled as token 0 with numpy's warnings, exit 0
        model = ReferenceModel(g, numerics=numerics)
        with pytest.raises(GGUFError, match=r"tensor 'output_norm.weight' holds NaN or infinite values") as e:
            model.forward([1, 4, 5], model.new_cache(8))
        assert str(p) in str(e.value)
    finally:
        g.close()


@pytest.mark.parametrize("name,value", [("blk.0.ffn_down.weight", 3), ("blk.1.attn_q.weight", 1),
                                        ("output_norm.weight", 3)])
def test_gpu_engine_refuses_nonfinite_weights_at_load(tiny_models, tmp_path, name, value):
    """The GPU engine (on the emulator) reads every weight's float fields at load: an infinity in a
    block's scale or a NaN in a norm is a GGUFError naming the tensor (it ran as garbage tokens)."""
    from gpu_emulator import FakeGpu
    from memra.gpu.engine import GPUEngine

    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    try:
        t = g.tensors[name]
        off, qtype = t.offset, t.ggml_type
    finally:
        g.close()
    blob = bytearray(Path(path).read_bytes())
    # the value-th block's d (ggml-common.h: Q4_K's first field, Q6_K's last two bytes), or a float
    at, bad = {T.Q4_K: (144 * value, np.float16(np.inf)), T.Q6_K: (210 * value + 208, np.float16(-np.inf)),
               T.F32: (4 * value, np.float32(np.nan))}[qtype]
    blob[off + at:off + at + bad.nbytes] = np.array([bad]).tobytes()
    p = tmp_path / "nonfinite.gguf"
    p.write_bytes(bytes(blob))
    GPUEngine(path, n_ctx=32, gpu=FakeGpu(1 << 28))  # the intact file loads
    with pytest.raises(GGUFError, match=f"tensor '{re.escape(name)}' holds NaN or infinite values") as e:
        GPUEngine(p, n_ctx=32, gpu=FakeGpu(1 << 28))
    assert str(p) in str(e.value)
