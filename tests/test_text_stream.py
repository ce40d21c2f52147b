"""memra.text.stream.TextStream on hand-made token texts: what is released when, stop
strings never leak (not even half of one), end-of-generation and length limits."""

from __future__ import annotations

import pytest

from memra.text.stream import TextStream, held_back

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\n", 6: "\n", 7: "END", 9: "<eos>"}


class Tok:
    """A tokenizer whose tokens decode to PIECES (control token 9 to nothing)."""

    def stream(self, skip_special=True):
        class S:
            def push(self, t):
                return "" if t == 9 else PIECES[t]

            def flush(self):
                return ""

        return S()


def run(tokens, **kw):
    ts = TextStream(Tok(), **kw)
    out = []
    for t in tokens:
        text, fin = ts.push(t)
        out.append(text)
        if fin:
            return out, fin
    return out, None


def test_plain_text_is_released_token_by_token():
    assert run([1, 2, 3, 4]) == (["Hel", "lo", " wor", "ld"], None)


def test_text_that_may_start_a_stop_string_is_held_until_decided():
    # "\n\n" is the stop: the first "\n" is held, then the stop hits and nothing of it leaks
    assert run([1, 2, 5, 6, 3], stops=["\n\n"]) == (["Hel", "lo", "", ""], "stop")
    # a "\n" followed by text: released together with that text
    assert run([1, 5, 3], stops=["\n\n"]) == (["Hel", "", "\n wor"], None)
    # a stop string inside one token's text: the text before it comes out, the rest not
    assert run([1, 7, 3], stops=["lEN"]) == (["He", ""], "stop")


def test_min_tokens_matches_stop_strings_only_from_its_token_on():
    # "\n\n" whole before token 4: released as it comes, no stop; from token 4 on the stop holds again
    assert run([5, 6, 1, 5, 6, 3], stops=["\n\n"], min_tokens=4) == (["\n", "\n", "Hel", "", ""], "stop")
    # a stop string inside min_tokens' own token is matched; one that began in text released before is not
    assert run([1, 7, 3], stops=["EN"], min_tokens=2) == (["Hel", ""], "stop")
    assert run([1, 7, 3], stops=["lEN"], min_tokens=2) == (["Hel", "END", " wor"], None)
    # one token earlier the whole stop string is released as text
    assert run([1, 7, 3], stops=["EN"], min_tokens=3) == (["Hel", "END", " wor"], None)


def test_eos_and_length():
    assert run([1, 9, 2], stop_ids=[9]) == (["Hel", ""], "eos")
    assert run([1, 2, 3], max_tokens=2) == (["Hel", "lo"], "length")
    assert run([1, 2, 3], n_ctx_left=1) == (["Hel"], "length")
    ts = TextStream(Tok(), max_tokens=1)
    ts.push(1)
    with pytest.raises(ValueError):
        ts.push(2)


def test_held_back_is_the_longest_proper_prefix_at_the_end():
    assert held_back("abc\n", ["\n\n"]) == 1
    assert held_back("abcST", ["STOP", "TOX"]) == 2
    assert held_back("abc", ["STOP"]) == 0
