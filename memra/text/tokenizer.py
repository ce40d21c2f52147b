"""Tokenizers from GGUF metadata, id-identical to llama.cpp's.

Two vocabularies are implemented, each as llama.cpp runs it (src/llama-vocab.cpp):

- `llama` (SentencePiece-style, e.g. Gemma-3): spaces become U+2581, then adjacent symbols
  (UTF-8 characters to start with) are merged greedily by the score of the token they form,
  ties to the leftmost pair; a symbol that is no token falls back to its <0xNN> byte tokens.
- `gpt2` (byte-level BPE, e.g. SmolLM2): the text is split into words by the pre-tokenizer
  of `tokenizer.ggml.pre` (memra.text.pretokenize), each word's bytes are written in the GPT-2
  byte alphabet and merged by merge rank, ties to the leftmost pair.

Before either, special tokens are cut out of the text the way llama.cpp's
tokenizer_st_partition does: every control, unknown and user-defined token, longest first,
splits each remaining text fragment at each of its occurrences (control and unknown tokens
only when parse_special). End-of-generation ids, attribute fix-ups and add_bos/add_eos follow
llama.cpp's loader.

Speed: SentencePiece merging never joins across a U+2581 that follows a character no token
can end on before a U+2581, so the text is cut there and each piece is merged once and
cached; BPE words are cached the same way.
"""

from __future__ import annotations

import codecs
import heapq
import logging
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import Keys

from memra.text import pretokenize
from memra.errors import TokenizerError

if TYPE_CHECKING:
    from memra.model.gguf import GGUFFile

log = logging.getLogger("memra.tokenizer")

# token attributes (llama.h's llama_token_attr bits)
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 1 << 7, 1 << 8
# GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)
_TYPE_TO_ATTR = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}
_SHOWN_AS_TEXT = UNKNOWN | CONTROL | USER_DEFINED
_HIDDEN_WHEN_NOT_SPECIAL = UNKNOWN | CONTROL

SPACE_MARK = "\u2581"  # SentencePiece's visible space

# token texts llama.cpp recognises (src/llama-vocab.cpp, the loader's text-based detection)
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<｜end▁of▁sentence｜>", "[e~["))
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _meta_id(md: dict, key: str, n_vocab: int, default: int | None) -> int | None:
    """A special-token id from metadata; out-of-range ids fall back to the default, as llama.cpp."""
    if default is not None and not 0 <= default < n_vocab:
        default = None
    v = md.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or not 0 <= v < n_vocab:
        log.warning("bad special token %s = %r, using %r", key, v, default)
        return default
    return v


def _described(v) -> str:
    """A metadata value's GGUF type (and a short value), for error messages."""
    if isinstance(v, np.ndarray):
        return f"an array of {len(v)} {v.dtype.name}"
    if isinstance(v, list):
        kinds = sorted({"strings" if isinstance(x, str) else "arrays" for x in v})
        return f"an array of {len(v)} {' and '.join(kinds) or 'values'}"
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


class StreamDecoder:
    """Turns a stream of token ids into text, holding back an incomplete UTF-8 tail."""

    def __init__(self, tokenizer: "Tokenizer", skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (possibly empty)."""
        return self._utf8.decode(self._tok._piece_bytes(token_id, self._skip), final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete UTF-8 sequence becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


class Tokenizer:
    """A GGUF's tokenizer: `encode` gives llama.cpp's ids, `decode` its text."""

    def __init__(self, *, model: str, tokens: list[str], scores, token_types, merges: list[str] | None,
                 pre: str | None, metadata: dict):
        md = metadata
        self.model = model
        self.n_vocab = n = len(tokens)
        self.tokens = tokens
        if model == "llama":
            self.kind = "spm"
            defaults = dict(bos=1, eos=2, unk=0)
            add_bos, add_eos, self.add_space_prefix = True, False, True
            self.pre = None
        elif model == "gpt2":
            self.kind = "bpe"
            defaults = dict(bos=11, eos=11, unk=None)
            self.pre = pretokenize.pre_tokenizer(pre if pre is not None else "default")
            if pre is None:
                log.warning("GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer")
            add_bos, add_eos, self.add_space_prefix = self.pre.add_bos, False, False
            if self.pre.no_bos:
                defaults["bos"] = None
        else:
            raise TokenizerError(f"tokenizer.ggml.model = {model!r} is not supported "
                                 f"(memra implements 'llama' (SentencePiece) and 'gpt2' (BPE))")
        if model == "llama":
            self.add_space_prefix = bool(md.get(Keys.Tokenizer.ADD_PREFIX, True))

        # vocabulary: text -> id (every token, as llama.cpp's token_to_id)
        if "" in tokens:
            for i, t in enumerate(tokens):
                if t == "":
                    tokens[i] = f"[EMPTY_{i}]"
        self.vocab: dict[str, int] = dict(zip(tokens, range(n)))
        if len(self.vocab) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise TokenizerError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
                seen[t] = i
        if scores is not None and len(scores) < n:
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        self.scores = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n
        if token_types is not None and len(token_types) < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(token_types)} entries for {n} tokens")
        types = [int(t) for t in token_types[:n]] if token_types is not None else [1] * n
        self.attrs = [_TYPE_TO_ATTR.get(t, UNDEFINED) for t in types]

        # BPE merge ranks: the first rank of a pair wins, as llama.cpp's emplace
        self.ranks: dict[tuple[str, str], int] = {}
        if self.kind == "bpe":
            if merges is None:
                raise TokenizerError("BPE tokenizer without tokenizer.ggml.merges")
            for r, m in enumerate(merges):
                p = m.find(" ", 1)
                pair = (m[:p], m[p + 1:]) if p >= 0 else ("", "")
                self.ranks.setdefault(pair, r)

        # special ids: model defaults, then metadata
        T = Keys.Tokenizer
        self.bos_id = _meta_id(md, T.BOS_ID, n, defaults["bos"])
        self.eos_id = _meta_id(md, T.EOS_ID, n, defaults["eos"])
        self.unk_id = _meta_id(md, T.UNK_ID, n, defaults["unk"])
        self.eot_id = _meta_id(md, T.EOT_ID, n, None)
        self.eom_id = _meta_id(md, T.EOM_ID, n, None)
        self.pad_id = _meta_id(md, T.PAD_ID, n, None)
        fim_pad = _meta_id(md, T.FIM_PAD_ID, n, None)
        fim_rep = _meta_id(md, T.FIM_REP_ID, n, None)
        fim_sep = _meta_id(md, T.FIM_SEP_ID, n, None)
        v = md.get(T.ADD_BOS)
        self.add_bos = bool(v) if v is not None else add_bos
        v = md.get(T.ADD_EOS)
        self.add_eos = bool(v) if v is not None else add_eos
        if self.add_bos and self.bos_id is None:
            raise TokenizerError(f"{T.ADD_BOS} is true, but {T.BOS_ID} is not set")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError(f"{T.ADD_EOS} is true, but {T.EOS_ID} is not set")

        # text-based detection of end-of-turn / fill-in-middle tokens; each found one is made a
        # control token (llama.cpp scans a hash map; memra takes the lowest id where it matters)
        def detect(current, texts):
            if current is not None:
                return current
            ids = sorted(self.vocab[t] for t in texts if t in self.vocab)
            if ids:
                self.attrs[ids[0]] |= CONTROL
                return ids[0]
            return None

        self.eot_id = detect(self.eot_id, _EOT_TEXTS)
        self.eom_id = detect(self.eom_id, _EOM_TEXTS)
        fim_pad = detect(fim_pad, _FIM_PAD_TEXTS)
        fim_rep = detect(fim_rep, _FIM_REP_TEXTS)
        fim_sep = detect(fim_sep, _FIM_SEP_TEXTS)
        for i, a in enumerate(self.attrs):
            if a & CONTROL and "unused" in tokens[i]:
                self.attrs[i] |= UNUSED

        eog = {i for i in (fim_pad, fim_rep, fim_sep) if i is not None}
        for t in _EOG_TEXTS:
            i = self.vocab.get(t)
            if i is not None:
                eog.add(i)
                self.attrs[i] |= CONTROL
        for t in _ALWAYS_USER_DEFINED:
            if t in self.vocab:
                self.attrs[self.vocab[t]] = USER_DEFINED
        eog |= {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        texts = {self.tokens[i] for i in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or ({"<|calls|>", "<|flush|>"} <= texts)):
            end = self.vocab["<|end|>"]
            eog.discard(end)
            self.attrs[end] = USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            s = self.vocab["</s>"]
            eog.discard(s)
            self.attrs[s] = NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

        name = str(md.get("general.name", "")).lower()
        if "phi-3" in name or "phi3" in name:
            for i, a in enumerate(self.attrs):
                if a & _SHOWN_AS_TEXT:
                    self.attrs[i] |= RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in self.vocab:
                    i = self.vocab[t]
                    self.attrs[i] = self.attrs[i] | RSTRIP if on else self.attrs[i] & ~RSTRIP
        elif "modern-bert" in name and "[MASK]" in self.vocab:
            self.attrs[self.vocab["[MASK]"]] |= LSTRIP

        self._bytes_cache: dict[int, bytes] = {}
        self._encoder_ready = False  # the encoder's tables are built on first use
        self._init_lock = threading.Lock()

    def _init_encoder(self) -> None:
        self._init_special_matcher()
        if self.kind == "spm":
            self._init_spm()
        else:
            self._splitter = pretokenize.Splitter(self.pre)
            self._word_cache: dict[str, tuple[int, ...]] = {}
        self._encoder_ready = True

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, g: "GGUFFile") -> "Tokenizer":
        md = g.metadata
        T = Keys.Tokenizer
        model = md.get(T.MODEL)
        if model is None:
            raise TokenizerError(f"{g.path}: metadata {T.MODEL} is missing (the file has no tokenizer)")
        tokens = md.get(T.LIST)
        if tokens is None or (isinstance(tokens, list) and not tokens):
            raise TokenizerError(f"{g.path}: metadata {T.LIST} is missing or empty")

        def expect(key: str, ok, what: str) -> None:
            v = md.get(key)
            if v is not None and not ok(v):
                raise TokenizerError(f"{g.path}: metadata {key} is {_described(v)}, expected {what}")

        def strings(v) -> bool:
            return isinstance(v, list) and all(isinstance(t, str) for t in v)

        expect(T.MODEL, lambda v: isinstance(v, str), "a string")
        expect(T.LIST, strings, "an array of strings")
        expect(T.SCORES, lambda v: isinstance(v, np.ndarray) and v.dtype.kind in "fiu", "an array of numbers")
        expect(T.TOKEN_TYPE, lambda v: isinstance(v, np.ndarray) and v.dtype.kind in "iu", "an array of integers")
        expect(T.MERGES, strings, "an array of strings")
        for key in (T.ADD_BOS, T.ADD_EOS, T.ADD_PREFIX):
            expect(key, lambda v: isinstance(v, bool), "a bool")
        try:
            return cls(model=model, tokens=list(tokens), scores=md.get(T.SCORES), token_types=md.get(T.TOKEN_TYPE),
                       merges=md.get(T.MERGES), pre=md.get(T.PRE), metadata=md)
        except TokenizerError as e:
            raise TokenizerError(f"{g.path}: {e}") from None

    def _init_special_matcher(self) -> None:
        """Special tokens in llama.cpp's partition order, and a trie regex that finds them."""
        special = [i for i, a in enumerate(self.attrs) if a & _SHOWN_AS_TEXT]
        # llama.cpp sorts by length, longest first (ties: unspecified there; memra: by id)
        special.sort(key=lambda i: (-len(self.tokens[i]), i))
        self._special_order = {i: k for k, i in enumerate(special)}
        self._special_by_text = {self.tokens[i]: i for i in special}
        trie: dict = {}
        for i in special:
            node = trie
            for ch in self.tokens[i]:
                node = node.setdefault(ch, {})
            node[""] = True

        def build(node) -> str:
            kids = [re.escape(ch) + build(sub) for ch, sub in sorted(node.items()) if ch != ""]
            if not kids:
                return ""
            body = kids[0] if len(kids) == 1 else "(?:" + "|".join(kids) + ")"
            return f"(?:{body})?" if "" in node else body

        # at each position: the longest special token starting there (the trie is greedy)
        self._special_re = re.compile("(?=(" + build(trie) + "))", re.DOTALL) if special else None

    def _init_spm(self) -> None:
        # characters some token has right before a U+2581: no cut may follow them
        # (the separator may add itself to the set: an extra glue character only means fewer cuts)
        joined = "\x00".join(t for t in self.tokens if SPACE_MARK in t[1:])
        glue = set(re.findall(f"([^{SPACE_MARK}]){SPACE_MARK}", joined)) | {SPACE_MARK}
        cls = "".join(sorted(re.escape(c) for c in glue))
        self._spm_cut = re.compile(f"(?<=[^{cls}])(?={SPACE_MARK})")
        self._chunk_cache: dict[str, tuple[int, ...]] = {}
        self._byte_ids = []
        for b in range(256):
            i = self.vocab.get(f"<0x{b:02X}>")
            if i is None:  # llama.cpp falls back to the byte itself as a token text
                i = self.vocab.get(chr(b) if b < 128 else chr(0xDC00 + b))
            self._byte_ids.append(i)

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` as llama.cpp's llama_tokenize(add_special, parse_special)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes text (str), got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: invalid UTF-8, which llama.cpp reads as U+FFFD
            text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        if not self._encoder_ready:
            with self._init_lock:
                if not self._encoder_ready:
                    self._init_encoder()
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        fragments = self._partition(text, parse_special) if text else []
        if self.kind == "spm":
            prev_special = True
            for f in fragments:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        f = " " + f
                    self._spm_encode(f.replace(" ", SPACE_MARK), out)
                    prev_special = False
        else:
            for f in fragments:
                if isinstance(f, int):
                    out.append(f)
                else:
                    self._bpe_encode(f, out)
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of the text exactly as llama.cpp's tokenizer_st_partition."""
        if self._special_re is None:
            return [text]
        found = set()
        for longest in {m.group(1) for m in self._special_re.finditer(text)}:
            for k in range(1, len(longest) + 1):
                i = self._special_by_text.get(longest[:k])
                if i is not None:
                    found.add(i)
        if not parse_special:
            found = {i for i in found if not self.attrs[i] & _HIDDEN_WHEN_NOT_SPECIAL}
        if not found:
            return [text]
        frags: list[tuple[int, int] | int] = [(0, len(text))]
        for tid in sorted(found, key=self._special_order.__getitem__):
            tt, attr = self.tokens[tid], self.attrs[tid]
            n = len(tt)
            out: list[tuple[int, int] | int] = []
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                start, end = f
                while True:
                    at = text.find(tt, start, end)
                    if at < 0:
                        out.append((start, end))
                        break
                    left_end = at
                    if attr & LSTRIP:
                        while left_end > start and text[left_end - 1] in " \t\n\v\f\r":
                            left_end -= 1
                    if left_end > start:
                        out.append((start, left_end))
                    out.append(tid)
                    start = at + n
                    if attr & RSTRIP:
                        while start < end and text[start] in " \t\n\v\f\r":
                            start += 1
                    if start >= end:
                        break
            frags = out
        return [f if isinstance(f, int) else text[f[0]:f[1]] for f in frags]

    # SentencePiece ---------------------------------------------------------------------------
    def _spm_encode(self, text: str, out: list[int]) -> None:
        cache = self._chunk_cache
        for chunk in self._spm_cut.split(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = self._spm_chunk(chunk)
                if len(cache) < 200_000:
                    cache[chunk] = ids
            out.extend(ids)

    def _spm_chunk(self, text: str) -> tuple[int, ...]:
        """llama.cpp's llm_tokenizer_spm_session: best-score bigram merges over characters."""
        vocab, scores = self.vocab, self.scores
        sym = list(text)
        n = len(sym)
        if n == 0:
            return ()
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(1, n):
            t = sym[i - 1] + sym[i]
            tid = vocab.get(t)
            if tid is not None:
                heap.append((-scores[tid], i - 1, i, len(t)))
        heapq.heapify(heap)

        def add(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                t = sym[left] + sym[right]
                tid = vocab.get(t)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, right, len(t)))

        while heap:
            _, left, right, size = heapq.heappop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue  # one side has changed since this pair was queued
            sym[left] = ls + rs
            sym[right] = ""
            nxt[left] = r2 = nxt[right]
            if r2 >= 0:
                prv[r2] = left
            add(prv[left], left)
            add(left, r2)

        ids: list[int] = []
        i = 0
        while i != -1:
            s = sym[i]
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:
                for b in s.encode("utf-8", "surrogateescape"):
                    bid = self._byte_ids[b]
                    if bid is None:
                        raise TokenizerError(f"no byte token for 0x{b:02X} (needed for {s!r})")
                    ids.append(bid)
            i = nxt[i]
        return tuple(ids)

    # BPE -----------------------------------------------------------------------------------------
    def _bpe_encode(self, text: str, out: list[int]) -> None:
        cache = self._word_cache
        for word in self._splitter.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(pretokenize.byte_encode(word))
                if len(cache) < 200_000:
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        """llama.cpp's llm_tokenizer_bpe_session on one word: lowest-rank merges first."""
        vocab, ranks = self.vocab, self.ranks
        if self.pre.ignore_merges and word in vocab:
            return (vocab[word],)
        sym = list(word)
        n = len(sym)
        if n > 1:
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            prv = list(range(-1, n - 1))
            heap = []
            for i in range(1, n):
                r = ranks.get((sym[i - 1], sym[i]))
                if r is not None:
                    heap.append((r, i - 1, i, sym[i - 1] + sym[i]))
            heapq.heapify(heap)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                ls, rs = sym[left], sym[right]
                if not ls or not rs or ls + rs != merged:
                    continue  # outdated pair
                sym[left] = merged
                sym[right] = ""
                nxt[left] = r2 = nxt[right]
                if r2 >= 0:
                    prv[r2] = left
                p = prv[left]
                if p >= 0:
                    r = ranks.get((sym[p], merged))
                    if r is not None:
                        heapq.heappush(heap, (r, p, left, sym[p] + merged))
                if r2 >= 0:
                    r = ranks.get((merged, sym[r2]))
                    if r is not None:
                        heapq.heappush(heap, (r, left, r2, merged + sym[r2]))
        ids: list[int] = []
        for s in sym:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:
                # llama.cpp looks each UTF-8 byte up as a one-byte token text and drops misses
                for b in s.encode("utf-8"):
                    tid = vocab.get(chr(b)) if b < 128 else None
                    if tid is not None:
                        ids.append(tid)
        return tuple(ids)

    # -- decoding -----------------------------------------------------------------------------
    def _check(self, token_id: int) -> int:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            token_id = int(token_id)  # numpy integers
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is out of range (vocabulary has {self.n_vocab} tokens)")
        return token_id

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this token puts into text (llama.cpp's token_to_piece with special=true)."""
        token_id = self._check(token_id)
        b = self._bytes_cache.get(token_id)
        if b is None:
            b = self._bytes_cache[token_id] = self._make_bytes(token_id)
        return b

    def _make_bytes(self, i: int) -> bytes:
        text, attr = self.tokens[i], self.attrs[i]
        if attr & _SHOWN_AS_TEXT:
            return text.encode("utf-8", "surrogateescape")
        if attr & NORMAL:
            if self.kind == "spm":
                return text.replace(SPACE_MARK, " ").encode("utf-8", "surrogateescape")
            out = bytearray()
            for ch in text:
                b = pretokenize.CHAR_TO_BYTE.get(ch)
                if b is not None:
                    out.append(b)
                else:  # llama.cpp's llama_decode_text marks characters outside the byte alphabet
                    raw = ch.encode("utf-8", "surrogateescape")
                    out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
            return bytes(out)
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def _piece_bytes(self, token_id: int, skip_special: bool) -> bytes:
        token_id = self._check(token_id)
        if skip_special and self.attrs[token_id] & _HIDDEN_WHEN_NOT_SPECIAL:
            return b""
        return self.token_bytes(token_id)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of the ids: their pieces joined (as llama.cpp's /detokenize), invalid UTF-8 as U+FFFD.

        skip_special drops control and unknown tokens (user-defined ones are text)."""
        return b"".join(self._piece_bytes(i, skip_special) for i in ids).decode("utf-8", "replace")

    def piece(self, token_id: int) -> str:
        """Display form: the token's text, or <0xNN> escapes where its bytes are not valid UTF-8."""
        b = self.token_bytes(token_id)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{x:02X}>" for x in b)

    def is_special(self, token_id: int) -> bool:
        """Control or unknown tokens: those llama.cpp hides when rendering without special=true.

        User-defined tokens (Gemma's newline and space runs, HTML tags) are ordinary text."""
        return bool(self.attrs[self._check(token_id)] & _HIDDEN_WHEN_NOT_SPECIAL)

    def is_user_defined(self, token_id: int) -> bool:
        return bool(self.attrs[self._check(token_id)] & USER_DEFINED)

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    def __repr__(self) -> str:
        kind = "SentencePiece" if self.kind == "spm" else f"BPE/{self.pre.name}"
        return f"Tokenizer({kind}, {self.n_vocab} tokens, bos={self.bos_id}, eos={self.eos_id})"


def utf8_safe_tokens(tok: Tokenizer) -> list[str]:
    """tok's byte-level BPE vocabulary with every token whose bytes are not whole UTF-8 on
    their own (pieces of multi-byte characters: 313 of SmolLM2's 49152) renamed "<0xHEX>" of
    its bytes (printable ASCII, which the byte-level alphabet maps to itself). A random model
    over it streams valid UTF-8 whatever it samples, so a server that rejects invalid UTF-8
    mid-stream (llama-server b10605 ends such a stream with an error event) completes every
    request; ASCII text tokenizes as before (those pieces only come from non-ASCII bytes)."""
    if tok.kind != "bpe":
        raise TokenizerError(f"only byte-level BPE vocabularies are rewritten, not {tok.kind!r}")
    tokens = list(tok.tokens)
    taken = set(tokens)
    for i in range(len(tokens)):
        b = tok.token_bytes(i)
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            name = f"<0x{b.hex().upper()}>"
            if name in taken:
                raise TokenizerError(f"token {name!r} already exists") from None
            tokens[i] = name
            taken.add(name)
    return tokens
