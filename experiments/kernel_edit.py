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


def diff_edits(patch: str) -> list[tuple[str, str]]:
    """A unified diff (`diff -u KERNEL VARIANT`) as make_variant edits: each hunk's context and
    removed lines become `old`, its context and added lines `new` (each must occur once)."""
    edits, old, new, in_hunk = [], [], [], False
    for line in patch.splitlines(keepends=True):
        if line.startswith("@@"):
            if in_hunk:
                edits.append(("".join(old), "".join(new)))
            old, new, in_hunk = [], [], True
        elif in_hunk and line.startswith((" ", "-", "+")) and not line.startswith(("--- ", "+++ ")):
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
        elif in_hunk and line.startswith("\\"):
            continue
    if in_hunk:
        edits.append(("".join(old), "".join(new)))
    return edits


def build_from_patch(kernel: str, patch: Path, dst: Path) -> int:
    """dst = kernels/<kernel> with `patch` (a unified diff against it) applied by make_variant;
    `python3 experiments/kernel_edit.py KERNEL PATCH DST` from the shell."""
    root = Path(__file__).resolve().parents[1]
    return make_variant(root / "kernels" / kernel, dst, diff_edits(patch.read_text()))


if __name__ == "__main__":
    sys.exit(build_from_patch(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
