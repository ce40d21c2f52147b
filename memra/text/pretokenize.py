"""BPE pre-tokenization: the word splits llama.cpp makes for each `tokenizer.ggml.pre`.

llama.cpp applies, per pre-tokenizer type, a list of regular expressions one after another:
each splits every piece the previous ones produced into matches and the gaps between them.
How each expression runs decides the ids, so memra reproduces the three ways llama.cpp runs them:

- the GPT-2 and Llama-3 expressions have hand-written matchers in llama.cpp, driven by
  Unicode category and whitespace tables that llama.cpp generated with the `regex` package.
  They behave as the expressions themselves, so memra runs those expressions with `regex`
  (`\\s`, `\\p{L}`, `\\p{N}` as `regex` defines them);
- any other expression using a Unicode category runs through `std::regex` on a *collapsed*
  text: every code point >= 128 replaced by one byte standing for its category (0xD1 number,
  0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything else, 0x0B for
  whitespace), and each `\\p{..}` in the expression by that byte plus its ASCII members.
  memra builds the same collapsed text and the same collapsed expression;
- an expression without categories runs through `std::wregex` on the code points, non-ASCII
  whitespace replaced by 0x0B.

Both `std::regex` routes use ECMAScript rules with the C locale, where `\\s` is exactly
[\\t\\n\\v\\f\\r ]; memra spells that class out instead of letting `regex` widen it.
Then each word's UTF-8 bytes are mapped to the GPT-2 byte alphabet (`byte_encode`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import regex

from memra.errors import TokenizerError

# -- the expressions, as llama.cpp writes them ------------------------------------------------

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_CI = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?|"
         r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|"
          r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"

_SMOLLM = ["\\p{N}", GPT2]
_DEFAULT = ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"]


@dataclass(frozen=True)
class PreTokenizer:
    """What a `tokenizer.ggml.pre` value means to llama.cpp's BPE tokenizer."""
    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is taken whole
    add_bos: bool = False  # the default before tokenizer.ggml.add_bos_token overrides it
    no_bos: bool = False  # the pre-tokenizer clears the BOS id (chatglm)


def _pre(names, regexes, **kw) -> dict[str, PreTokenizer]:
    return {n: PreTokenizer(n, tuple(regexes), **kw) for n in names}


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_pre(["default", ""], _DEFAULT),
    **_pre(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
           [LLAMA3], ignore_merges=True, add_bos=True),
    **_pre(["dbrx", "smaug-bpe"], [LLAMA3]),
    **_pre(["glm4", "chatglm-bpe"], [LLAMA3], no_bos=True),
    **_pre(["deepseek-coder"], ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"]),
    **_pre(["deepseek-v3"], ["\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                             "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                             "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]),
    **_pre(["falcon"], ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"]),
    **_pre(["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
           _SMOLLM),
    **_pre(["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
            "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4",
            "trillion", "granite-docling"], [GPT2]),
    **_pre(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"],
           [QWEN2]),
    **_pre(["grok-2"], [QWEN2]),
    **_pre(["poro-chat", "bloom", "gpt3-finnish"], [_BLOOM]),
    **_pre(["viking"], [_BLOOM, "\\p{N}"]),
    **_pre(["tekken"], [TEKKEN], ignore_merges=True, add_bos=True),
    **_pre(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [GPT4O]),
    **_pre(["seed-coder"], [r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
                            r"\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"]),
    **_pre(["bailingmoe", "bailingmoe2", "llada-moe"],
           [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]|\s+(?!\S)|\s+"]),
    **_pre(["ufakzeka"], [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
}


def pre_tokenizer(name: str) -> PreTokenizer:
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise TokenizerError(f"unknown BPE pre-tokenizer tokenizer.ggml.pre = {name!r} "
                             f"(memra knows: {', '.join(sorted(n for n in PRE_TOKENIZERS if n))})")
    return pre


# -- code point classes as llama.cpp's tables have them ----------------------------------------

# llama.cpp's tables (src/unicode-data.cpp) are Unicode 15.1; `regex` knows later versions. The code
# points Unicode 16.0 and 17.0 assigned (ranges may span code points unassigned in both) have no
# category and no whitespace flag in llama.cpp, so they are written as U+FDD0 (a noncharacter,
# unassigned in every version) before `regex` classifies them, and collapse to the 0xD0 fallback.
_NEWER_THAN_TABLES = re.compile(
    "[\u088F\u0897\u0C5C\u0CDC\u1ACF-\u1AEB\u1B4E-\u1B4F\u1B7F\u1C89-\u1C8A\u20C1\u2427-\u2429\u2B96"
    "\u31E4-\u31E5\uA7CB-\uA7CF\uA7D2\uA7D4\uA7DA-\uA7F1\uFBC3-\uFBD2\uFD90-\uFD91\uFDC8-\uFDCE"
    "\U000105C0-\U000105F3\U00010940-\U00010959\U00010D40-\U00010D8F\U00010EC2-\U00010EFC"
    "\U00011380-\U000113E2\U000116D0-\U000116E3\U00011B60-\U00011BF9\U00011DB0-\U00011DE9\U00011F5A"
    "\U00013460-\U000143FA\U00016100-\U00016139\U00016D40-\U00016D79\U00016EA0-\U00016ED3"
    "\U00016FF2-\U00016FF6\U000187F8-\U000187FF\U00018CFF\U00018D09-\U00018DF2\U0001CC00-\U0001CEF0"
    "\U0001E5D0-\U0001E6FF\U0001F6D8\U0001F777-\U0001F77A\U0001F8B2-\U0001F8D8\U0001FA54-\U0001FA57"
    "\U0001FA89-\U0001FA8F\U0001FABE\U0001FAC6-\U0001FACD\U0001FADC-\U0001FADF\U0001FAE9-\U0001FAEF"
    "\U0001FBCB-\U0001FBEF\U0001FBFA\U0002B73A-\U0002B73F\U0002CEA2-\U0002CEAD\U000323B0-\U00033479]")

_WS = regex.compile(r"\s")
_CATEGORIES = [(regex.compile(r"\p{N}"), "\xd1"), (regex.compile(r"\p{L}"), "\xd2"),
               (regex.compile(r"\p{P}"), "\xd3"), (regex.compile(r"\p{M}"), "\xd4"),
               (regex.compile(r"\p{S}"), "\xd5")]


class _Collapse(dict):
    """str.translate table: code point -> its one-character stand-in (computed on first use)."""

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        if cp < 128:
            out = ch
        elif _WS.match(ch):
            out = "\x0b"
        else:
            out = next((c for rx, c in _CATEGORIES if rx.match(ch)), "\xd0")
        self[cp] = out
        return out


class _AsTables(dict):
    """str.translate table: a code point newer than llama.cpp's tables -> U+FDD0, any other -> itself
    (computed on first use)."""

    def __missing__(self, cp: int) -> int:
        out = 0xFDD0 if _NEWER_THAN_TABLES.match(chr(cp)) else cp
        self[cp] = out
        return out


class _WideSpace(dict):
    """str.translate table for the std::wregex route: non-ASCII whitespace -> 0x0B."""

    def __missing__(self, cp: int) -> str:
        out = "\x0b" if cp >= 128 and _WS.match(chr(cp)) else chr(cp)
        self[cp] = out
        return out


_COLLAPSE = _Collapse()
_WIDE = _WideSpace()
_AS_TABLES = _AsTables()

# what each \p{..} becomes in a collapsed expression: its stand-in byte and its ASCII members
# (llama.cpp lists "~" among the symbols since late 2025; the xllamacpp build has it)
_UCAT = {"N": "\xd10-9", "L": "\xd2A-Za-z", "P": "\xd3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", "M": "\xd4",
         "S": "\xd5\\$\\+<->\\^`\\|~"}
_UCAT_NAMES = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S", "Lu": "L", "Ll": "L", "Lt": "L", "Lm": "L", "Lo": "L"}
_C_SPACE = "\\t\\n\\x0b\\x0c\\r "  # ECMAScript \s in the C locale


def _ecmascript_to_regex(expr: str, collapse: bool) -> str:
    """Rewrite an expression as llama.cpp hands it to std::regex, in `regex` syntax.

    With `collapse`, each \\p{..} becomes its collapsed class (as llama.cpp rewrites it).
    \\s, \\S, \\d and an unescaped $ get their ECMAScript/C-locale meaning.
    """
    out, i, inside = [], 0, False
    while i < len(expr):
        c = expr[i]
        if c == "\\" and i + 1 < len(expr):
            n = expr[i + 1]
            if n == "p" and expr.startswith("{", i + 2):
                close = expr.find("}", i + 3)
                name = expr[i + 3:close]
                if not collapse or name not in _UCAT_NAMES:
                    raise TokenizerError(f"pre-tokenizer expression uses \\p{{{name}}}, which memra cannot run")
                cls = _UCAT[_UCAT_NAMES[name]]
                out.append(cls if inside else "[" + cls + "]")
                i = close + 1
                continue
            if n == "s":
                out.append(_C_SPACE if inside else "[" + _C_SPACE + "]")
            elif n == "S":
                if inside:
                    raise TokenizerError("\\S inside a character class is not supported")
                out.append("[^" + _C_SPACE + "]")
            elif n == "d":
                out.append("0-9" if inside else "[0-9]")
            else:
                out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"  # ECMAScript $ (no multiline) is the very end; Python's also matches before a final \n
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Step:
    pattern: regex.Pattern
    subject: str  # "text" (the code points), "collapsed" or "wide"


def _compile_step(expr: str) -> _Step:
    if expr == GPT2:
        # llama.cpp's matcher also takes a whitespace run it cannot end early (the regex's \s+ tail)
        return _Step(regex.compile(GPT2 + r"|\s+"), "text")
    if expr in (LLAMA3, LLAMA3_CI):
        return _Step(regex.compile(LLAMA3), "text")
    if "\\p{" in expr:
        if any(ord(ch) >= 128 for ch in expr):
            raise TokenizerError("pre-tokenizer expression mixes \\p{..} and non-ASCII characters")
        return _Step(regex.compile(_ecmascript_to_regex(expr, collapse=True)), "collapsed")
    return _Step(regex.compile(_ecmascript_to_regex(expr, collapse=False)), "wide")


class Splitter:
    """Splits text into the words llama.cpp's BPE tokenizer merges, for one pre-tokenizer."""

    def __init__(self, pre: PreTokenizer):
        self.pre = pre
        self.steps = [_compile_step(e) for e in pre.regexes]
        self._needs = {s.subject for s in self.steps}

    def split(self, text: str) -> list[str]:
        if not text:
            return []
        # the table-classified subjects see code points newer than llama.cpp's tables as U+FDD0 (the words
        # keep them); the std::wregex route ("wide") classifies the text itself
        seen = text if text.isascii() else text.translate(_AS_TABLES)
        subjects = {"text": seen}
        if "collapsed" in self._needs:
            subjects["collapsed"] = seen.translate(_COLLAPSE)
        if "wide" in self._needs:
            subjects["wide"] = text.translate(_WIDE)
        spans = [(0, len(text))]
        for step in self.steps:
            subject, finditer = subjects[step.subject], step.pattern.finditer
            out = []
            for start, end in spans:
                prev = start
                for m in finditer(subject, start, end):
                    s, e = m.span()
                    if s == e:
                        continue
                    if s > prev:
                        out.append((prev, s))
                    out.append((s, e))
                    prev = e
                if prev < end:
                    out.append((prev, end))
            spans = out
        return [text[s:e] for s, e in spans]


# -- GPT-2 byte alphabet -----------------------------------------------------------------------

def _byte_alphabet() -> list[str]:
    """Byte -> the printable character GPT-2's vocabulary writes it as."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR: list[str] = _byte_alphabet()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_ALPHABET = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """The word's UTF-8 bytes written in the GPT-2 byte alphabet."""
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ALPHABET)
