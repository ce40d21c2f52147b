"""The reasoning split: a reply's `<think>...</think>` block apart from its content.

    rs = ReasoningStream(opened=prompt_opens_think(rendered))
    reasoning, content = rs.push(text)      # released text of each kind ("" while held)
    reasoning, content = rs.flush()         # at the end: whatever was held
    reasoning, content = split_reasoning(text, opened)   # the whole reply at once

The rule (what `memra serve` puts in `message.reasoning_content`):
- A reply that opens, after optional whitespace, with `<think>` has a think block; so has
  every reply to a prompt whose generation prompt itself ends with `<think>` (templates that
  open the block for the model: `opened`). The block's text, tags excluded and kept exact
  (no stripping), is the reasoning; the text after `</think>`, its leading whitespace
  removed, is the content.
- A block without `</think>` (the token limit, a stop string or the end token came first)
  is all reasoning, whatever the finish: a stream has already sent it as reasoning.
- Any other reply has no block: no reasoning (None) and the content unchanged, leading
  whitespace included. Models that do not think never write the tag, so the split needs no
  template signal beyond `opened`.

Streaming holds back only what may still be a tag: whitespace before a possible `<think>`,
an unfinished `<think>` prefix at the start, an unfinished `</think>` prefix at the end of
the reasoning, and whitespace right after `</think>`. So the concatenated pushes and the
flush equal split_reasoning of the whole text, however the text was cut into pieces.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FORMATS = ("auto", "deepseek", "none")  # the request field reasoning_format (llama-server's spellings)


def prompt_opens_think(rendered: str | None) -> bool:
    """Whether a rendered chat prompt leaves the model inside a think block (its generation
    prompt ends with `<think>`, optionally followed by whitespace)."""
    return bool(rendered) and rendered.rstrip().endswith(THINK_OPEN)


def _prefix_at_end(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningStream:
    """Splits streamed reply text into reasoning and content (the module's rule)."""

    def __init__(self, opened: bool = False):
        self.state = "think" if opened else "start"  # start -> think -> after -> content, or start -> content
        self.buf = ""          # text received and not yet released
        self.found = opened    # a think block was seen (reasoning is a string, maybe empty)

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that `text` releases."""
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            s = self.buf.lstrip()
            if s.startswith(THINK_OPEN):
                self.state, self.found, self.buf = "think", True, s[len(THINK_OPEN):]
            elif not s or THINK_OPEN.startswith(s):
                return "", ""  # whitespace, or what may still become <think>
            else:
                self.state = "content"
        if self.state == "think":
            i = self.buf.find(THINK_CLOSE)
            if i < 0:
                end = len(self.buf) - _prefix_at_end(self.buf, THINK_CLOSE)
                reasoning, self.buf = self.buf[:end], self.buf[end:]
                return reasoning, ""
            reasoning, self.buf, self.state = self.buf[:i], self.buf[i + len(THINK_CLOSE):], "after"
        if self.state == "after":
            s = self.buf.lstrip()
            if not s:
                self.buf = ""
                return reasoning, ""
            self.state, self.buf = "content", s
        content, self.buf = self.buf, ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """(reasoning, content) still held at the end of the reply: an unterminated block's
        tail is reasoning; text that never became `<think>` is content."""
        held, self.buf = self.buf, ""
        if self.state == "think":
            return held, ""
        if self.state == "after":
            return "", ""
        return "", held


def split_reasoning(text: str, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning or None when there is no think block, content) of a whole reply."""
    rs = ReasoningStream(opened)
    r1, c1 = rs.push(text)
    r2, c2 = rs.flush()
    return (r1 + r2 if rs.found else None), c1 + c2
