"""experiments/kernel_edit.py: a variant kept as a unified diff against its kernel rebuilds byte for
byte (the attn_fa variants of research/2026-12-03-session25), and a diff whose context no longer
occurs exactly once in the kernel is refused rather than applied somewhere else (an experiment's patch
is measured against the kernel it was made from; it may go stale when the kernel moves on)."""
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from kernel_edit import diff_edits, make_variant  # noqa: E402

KERNEL = "".join(f"line {i}\n" for i in range(40))


def _diff(a: str, b: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "k.cu", "v.cu"))


def test_a_unified_diff_rebuilds_the_variant(tmp_path):
    variant = KERNEL.replace("line 3\n", "line 3\nadded\n").replace("line 30\n", "").replace("line 20", "LINE 20")
    src, dst = tmp_path / "k.cu", tmp_path / "v.cu"
    src.write_text(KERNEL)
    assert make_variant(src, dst, diff_edits(_diff(KERNEL, variant))) == 0
    assert dst.read_text() == variant


def test_a_diff_that_no_longer_matches_is_refused(tmp_path):
    patch = _diff(KERNEL, KERNEL.replace("line 20", "LINE 20"))
    src, dst = tmp_path / "k.cu", tmp_path / "v.cu"
    src.write_text(KERNEL.replace("line 19\n", "line 19 changed\n"))   # the hunk's context moved on
    assert make_variant(src, dst, diff_edits(patch)) == 1 and not dst.exists()

