"""Variants of a kernel made from it by checked text edits (experiments/*/make.py): each edit's
old text must occur exactly the given number of times, so a variant never silently drifts from
the kernel it is measured against."""
from __future__ import annotations

import sys
from pathlib import Path


def make_variant(src: Path, dst: Path, edits, header: str = "") -> int:
    """Write `header` + src with every (old, new[, count]) edit applied to dst; 1 (and a message
    on stderr) when an old text does not occur exactly `count` (default 1) times."""
    text = src.read_text()
    for e in edits:
        old, new, count = (*e, 1) if len(e) == 2 else e
        if text.count(old) != count:
            print(f"{src}: expected {count} of {old.strip()[:70]!r}, found {text.count(old)}", file=sys.stderr)
            return 1
        text = text.replace(old, new)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(header + text)
    print(dst, file=sys.stderr)   # stderr: a probe's stdout is its JSONL receipt
    return 0
