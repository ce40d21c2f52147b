"""Tokenizers against llama.cpp (xllamacpp's /tokenize and /detokenize) on both real models.

The corpus (tests/data/tokenizer_corpus.py) is tokenized by memra and by llama.cpp with every
combination of add_special / parse_special; ids must be identical. Pre-tokenizers the real
models do not use are checked on copies of SmolLM2's GGUF whose tokenizer.ggml.pre was
rewritten (llama.cpp then splits with that pre-tokenizer's expressions), and SentencePiece's
space prefix on a copy of Gemma-3's GGUF with add_space_prefix switched on.
"""

from __future__ import annotations

import random
import runpy
import struct
from pathlib import Path

import pytest

from memra.model import aliases
from memra.errors import TokenizerError
from memra.model.gguf import open_gguf
from memra.text.tokenizer import Tokenizer

CORPUS: list[str] = runpy.run_path(str(Path(__file__).parent / "data" / "tokenizer_corpus.py"))["CORPUS"]
MODELS = ["smollm2-135m", "gemma3-270m"]


def _peer(path, **kw):
    pytest.importorskip("xllamacpp", reason="llama.cpp oracle (pip install xllamacpp) is not installed")
    from tests.peer import LlamaCppPeer
    return LlamaCppPeer(path, **kw)


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    """(memra tokenizer, llama.cpp peer) for one real model, the peer started once."""
    path = aliases.resolve(request.param)
    with open_gguf(path) as g:
        tok = Tokenizer.from_gguf(g)
    with _peer(path, n_ctx=512) as peer:
        yield tok, peer


def _mismatches(tok, peer, texts, add_special, parse_special):
    bad = []
    for s in texts:
        mine, theirs = tok.encode(s, add_special, parse_special), peer.tokenize(s, add_special, parse_special)
        if mine != theirs:
            bad.append((s[:60], mine[:24], theirs[:24]))
    return bad


def test_corpus_is_broad():
    assert len(CORPUS) >= 60
    assert "" in CORPUS and any(len(s) > 1000 for s in CORPUS)


# -- ids identical to llama.cpp -----------------------------------------------------------------

@pytest.mark.parity
def test_ids_identical_to_llama_cpp(pair):
    tok, peer = pair
    assert _mismatches(tok, peer, CORPUS, True, True) == []


@pytest.mark.parity
@pytest.mark.parametrize("add_special,parse_special", [(True, False), (False, True), (False, False)])
def test_ids_identical_with_special_flags(pair, add_special, parse_special):
    tok, peer = pair
    assert _mismatches(tok, peer, CORPUS, add_special, parse_special) == []


@pytest.mark.parity
def test_acceptance_gemma_special_text():
    # the ids llama.cpp gives for the acceptance string (BOS, H, é, llo, ▁, 🤖, ▁, <start_of_turn>)
    with open_gguf(aliases.resolve("gemma3-270m")) as g:
        tok = Tokenizer.from_gguf(g)
    assert tok.encode("Héllo 🤖 <start_of_turn>") == [2, 236814, 7869, 844, 236743, 246143, 236743, 105]


@pytest.mark.parity
def test_special_text_is_parsed_only_when_asked(pair):
    tok, peer = pair
    text = "<|im_start|>" if tok.kind == "bpe" else "<start_of_turn>"
    (special,) = peer.tokenize(text, add_special=False, parse_special=True)
    assert tok.encode(text, add_special=False) == [special]
    assert tok.is_special(special)
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert plain == peer.tokenize(text, add_special=False, parse_special=False)


# pieces random strings are drawn from: whitespace kinds, contractions, digits, symbols, accents,
# combining marks, zero-width and exotic spaces, CJK, emoji sequences, special-token text and
# fragments of it, and the vocabularies' own markers (U+2581, the GPT-2 byte letters, <0xNN>)
_POOL = (list(" \t\n\r") * 6 + list("abcXYZ'sStTdDmMlLrReEvV0123456789.,;:!?-_()[]{}<>|/\\\"$%^&*+=`~@#")
         + list("éÉüßñçøÆœ") + ["e\u0301", "\u200d", "\u200b", "\u00a0", "\u3000", "\u2028", "\x85", "\x0b", "\x0c",
                                  "\x1c", "\x00"]
         + list("日本語中文한국어ひらがなカタカナ") + ["🤖", "👍🏽", "👩\u200d💻", "🦩", "❤️", "🇫🇷", "𝕳", "ꙮ", "½", "²", "٣", "Ⅻ"]
         + ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<|endoftext|>",
            "<unused12>", "  ", "\n\n", "\u2581", "Ġ", "<0x41>", "<table>", "</td>", "'ll", "'RE", "<|im_", "_of_turn>"])


@pytest.mark.parity
def test_random_strings_vs_llama_cpp(pair):
    tok, peer = pair
    rng = random.Random(20260)
    flags = [(True, True), (False, False), (True, False), (False, True)]
    bad = []
    for k in range(400):
        s = "".join(rng.choice(_POOL) for _ in range(rng.randint(1, 40)))
        a, p = flags[k % 4]
        mine, theirs = tok.encode(s, a, p), peer.tokenize(s, a, p)
        if mine != theirs:
            bad.append((s, a, p, mine, theirs))
    assert bad == []


# -- decoding -------------------------------------------------------------------------------

@pytest.mark.parity
def test_decode_matches_llama_cpp_detokenize(pair):
    tok, peer = pair
    for s in CORPUS:
        ids = peer.tokenize(s)
        assert tok.decode(ids) == peer.detokenize(ids), s[:60]


def test_round_trip(pair):
    tok, _ = pair
    bos = tok.piece(tok.bos_id) if tok.add_bos else ""
    for s in CORPUS:
        if tok.kind == "spm" and "\u2581" in s:
            continue  # SentencePiece writes spaces as U+2581: a literal one comes back as a space
        assert tok.decode(tok.encode(s, add_special=False, parse_special=False)) == s
        assert tok.decode(tok.encode(s)) == bos + s
        # skip_special drops control tokens only; Gemma's newline/space-run tokens are text
        if not any(t in s for t in ("<|", "<start", "<end", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
                                     "<unused", "<repo_name>", "<file_sep>", "</s>")):
            assert tok.decode(tok.encode(s), skip_special=True) == s


@pytest.mark.parity
def test_pieces_match_llama_cpp(pair):
    tok, peer = pair
    text = "Héllo 🤖 <|im_start|><start_of_turn> 𝕳\n\n  x"
    r = peer._http.post("/tokenize", json={"content": text, "add_special": True, "parse_special": True,
                                           "with_pieces": True})
    r.raise_for_status()
    for item in r.json()["tokens"]:
        i, p = item["id"], item["piece"]
        if isinstance(p, str):
            assert tok.piece(i) == p
        else:  # llama.cpp lists the bytes of a piece that is not valid UTF-8
            assert tok.token_bytes(i) == bytes(p)
            assert tok.piece(i) == "".join(f"<0x{b:02X}>" for b in p)


@pytest.mark.parity
def test_stream_decoder_holds_back_split_utf8(pair):
    tok, peer = pair
    # llama.cpp splits these characters' UTF-8 over several tokens: byte-fallback tokens in
    # Gemma's SentencePiece vocabulary, byte-level pieces in SmolLM2's BPE
    text = "a🦩b 𝕳 ꙮ"
    ids = peer.tokenize(text, add_special=False, parse_special=False)
    split = [i for i in ids if not _valid_utf8(tok.token_bytes(i))]
    assert len(split) >= 2, "the oracle no longer splits a character across tokens; pick another"
    dec = tok.stream()
    outs = [dec.push(i) for i in ids]
    assert "".join(outs) + dec.flush() == text == peer.detokenize(ids)
    assert all("\ufffd" not in o for o in outs)
    assert any(tok.token_bytes(i) and o == "" for i, o in zip(ids, outs))  # something was held back
    # an incomplete tail at the end becomes one replacement character
    dec = tok.stream()
    held = "".join(dec.push(i) for i in ids[:ids.index(split[0]) + 1])
    assert held == text[:len(held)] and dec.flush() == "\ufffd"


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# -- metadata-derived facts -----------------------------------------------------------------

@pytest.mark.parity
def test_eog_ids(pair):
    """End-of-generation ids by llama.cpp's loader rules (src/llama-vocab.cpp): eos, end-of-turn
    texts, and the fill-in-middle repo/pad/sep tokens (SmolLM2's <reponame> counts as FIM repo);
    Gemma's </s> is made an end-of-generation token by text (llama.cpp logs the override)."""
    tok, peer = pair

    def ids(*texts):
        out = set()
        for t in texts:
            (i,) = peer.tokenize(t, add_special=False, parse_special=True)
            out.add(i)
        return out

    if tok.kind == "bpe":
        assert tok.eog_ids == ids("<|endoftext|>", "<|im_end|>", "<reponame>")
        assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (1, 2, False, False)
    else:
        assert tok.eog_ids == ids("<eos>", "<end_of_turn>", "</s>")
        assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (2, 1, True, False)
    assert tok.n_vocab == len(tok.tokens)


# -- other pre-tokenizers and the SentencePiece space prefix, on rewritten copies ---------------

def _string_field(buf: bytearray, key: str) -> tuple[int, int]:
    """(offset of the value's length, value length) of a string metadata entry."""
    k = key.encode()
    at = buf.find(struct.pack("<Q", len(k)) + k + struct.pack("<I", 8))
    assert at > 0, key
    pos = at + 8 + len(k) + 4
    return pos, struct.unpack_from("<Q", buf, pos)[0]


def _with_pre(src: Path, dst: Path, pre: str) -> None:
    """Copy of src with tokenizer.ggml.pre = pre; general.name absorbs the length change so that
    tensor offsets stay where they are."""
    buf = bytearray(src.read_bytes())
    ppos, plen = _string_field(buf, "tokenizer.ggml.pre")
    npos, nlen = _string_field(buf, "general.name")
    new = pre.encode()
    delta = len(new) - plen
    name = bytes(buf[npos + 8:npos + 8 + nlen])
    assert len(name) > delta
    name = name[:nlen - delta] if delta > 0 else name + b" " * -delta
    for pos, n, val in sorted([(ppos, plen, new), (npos, nlen, name)], reverse=True):
        buf[pos:pos + 8 + n] = struct.pack("<Q", len(val)) + val
    dst.write_bytes(buf)


# one per way llama.cpp runs an expression: its GPT-2 and Llama-3 matchers, std::regex on the
# category-collapsed text, std::wregex on non-ASCII ranges, and pipelines mixing them
OTHER_PRES = ["default", "gpt-2", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-v3", "gpt-4o", "poro-chat"]


@pytest.mark.parity
@pytest.mark.slow
@pytest.mark.parametrize("pre", OTHER_PRES)
def test_other_pre_tokenizers_vs_llama_cpp(pre, tmp_path):
    path = tmp_path / f"smollm-{pre}.gguf"
    _with_pre(aliases.resolve("smollm2-135m"), path, pre)
    with open_gguf(path) as g:
        assert g.metadata["tokenizer.ggml.pre"] == pre
        tok = Tokenizer.from_gguf(g)
    with _peer(path, n_ctx=256) as peer:
        assert _mismatches(tok, peer, CORPUS, True, True) == []
        assert _mismatches(tok, peer, CORPUS, False, False) == []
    path.unlink()


@pytest.mark.parity
@pytest.mark.slow
def test_spm_space_prefix_vs_llama_cpp(tmp_path):
    buf = bytearray(aliases.resolve("gemma3-270m").read_bytes())
    k = b"tokenizer.ggml.add_space_prefix"
    at = buf.find(struct.pack("<Q", len(k)) + k + struct.pack("<I", 7))  # a bool entry
    assert at > 0
    buf[at + 8 + len(k) + 4] = 1
    path = tmp_path / "gemma-space-prefix.gguf"
    path.write_bytes(buf)
    del buf
    with open_gguf(path) as g:
        tok = Tokenizer.from_gguf(g)
    assert tok.add_space_prefix
    with _peer(path, n_ctx=256) as peer:
        for flags in [(True, True), (False, False), (True, False)]:
            assert _mismatches(tok, peer, CORPUS, *flags) == []
    path.unlink()


# -- bad input ------------------------------------------------------------------------------

def _tiny(**kw):
    args = dict(model="gpt2", tokens=["a", "b", "ab"], scores=None, token_types=None, merges=["a b"],
                pre="gpt-2", metadata={})
    args.update(kw)
    return Tokenizer(**args)


def test_tiny_bpe_merges():
    tok = _tiny()
    assert tok.encode("abab", add_special=False) == [2, 2]
    assert tok.encode("ba", add_special=False) == [1, 0]


@pytest.mark.parametrize("kw,needle", [
    (dict(model="t5"), "tokenizer.ggml.model = 't5'"),
    (dict(pre="no-such-pre"), "tokenizer.ggml.pre = 'no-such-pre'"),
    (dict(tokens=["a", "a"]), "duplicate token"),
    (dict(merges=None), "merges"),
    (dict(metadata={"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 99}), "bos_token_id"),
])
def test_bad_metadata_raises(kw, needle):
    with pytest.raises(TokenizerError, match=None) as e:
        _tiny(**kw)
    assert needle in str(e.value)


def test_bad_ids_and_text():
    tok = _tiny()
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([0, 3])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.piece(-1)
    with pytest.raises(TokenizerError, match="takes text"):
        tok.encode(b"ab")


def test_gguf_without_tokenizer_names_the_file(tmp_path):
    from gguf import GGUFWriter
    path = tmp_path / "notok.gguf"
    w = GGUFWriter(str(path), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(path) as g, pytest.raises(TokenizerError, match="notok.gguf.*tokenizer.ggml.model"):
        Tokenizer.from_gguf(g)
