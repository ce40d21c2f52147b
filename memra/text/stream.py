"""Token ids -> released text, one request at a time: streaming detokenization, end-of-
generation tokens, stop strings and the length limit.

    ts = TextStream(tokenizer, stops=["\\n\\n"], stop_ids=eog_ids, max_tokens=64, n_ctx_left=1000)
    text, finish = ts.push(token)     # text newly final ("" while held), finish None until the end

Text is released as it becomes final: UTF-8 split across tokens is held by the tokenizer's
stream decoder, and text that could still grow into a stop string is held here, so a
consumer printing what it gets never prints a stop string or half of one. The CLI's
generation loop (memra.session) and the server's scheduler both feed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class TextStream:
    def __init__(self, tokenizer, stops: Iterable[str] = (), stop_ids: Iterable[int] = (),
                 max_tokens: int = -1, n_ctx_left: int | None = None, min_tokens: int = 0):
        """stop_ids: tokens that end the generation (reported, their text not: control
        tokens); max_tokens: -1 for no limit; n_ctx_left: positions left in the context;
        min_tokens: stop strings are matched only in the text of token min_tokens and later
        (the text before it is released as it comes)."""
        # control tokens put no text into the output (llama.cpp's rendering without special=true)
        self.decoder = tokenizer.stream(skip_special=True)
        self.stops = [s for s in stops if s]
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.n_ctx_left = n_ctx_left
        self.n = 0
        self.out = ""   # decoded text so far
        self.sent = 0   # out[:sent] has been released
        self.finish: str | None = None

    def push(self, token: int) -> tuple[str, str | None]:
        """One generated token: the text it releases and, for the last one, the finish
        reason ("eos", "stop" or "length"). Pushing after the end is an error."""
        if self.finish is not None:
            raise ValueError("the text stream has finished")
        self.n += 1
        finish = None
        if token in self.stop_ids:
            finish = "eos"  # the token is reported; its text (a control token) is not
        else:
            self.out += self.decoder.push(token)
            if self.n == self.max_tokens or (self.n_ctx_left is not None and self.n >= self.n_ctx_left):
                finish = "length"
        if finish is not None:
            self.out += self.decoder.flush()
        stops = self.stops if self.n >= self.min_tokens else []
        if stops:
            hit = min((i for i in (self.out.find(s, self.sent) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                text, self.sent = self.out[self.sent:hit], hit
                self.finish = "stop"
                return text, "stop"
        if finish is not None:
            text, self.sent = self.out[self.sent:], len(self.out)
            self.finish = finish
            return text, finish
        end = len(self.out) - (held_back(self.out[self.sent:], stops) if stops else 0)
        text, self.sent = self.out[self.sent:end], end
        return text, None
