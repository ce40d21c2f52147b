"""Tuning receipts: one JSON line per kernel measurement, kept forever (losers and failures too).

A receipt records what ran (kernel, variant, `-D` config, shape, kernel source file and its
hash), where (device name, compute capability, SM count, NVRTC version, git sha), how well
it did (median / p20 / p80 µs over `reps` timed runs, bytes moved, GB/s and % of the
device's measured peak) and whether it was right (`max_err` against the CPU reference,
`ok`, `error`). A configuration that fails its check or does not compile is recorded with
`ok: false`, its error text, and no timings.

Every line written goes through `validate_receipt`, and `read_receipts` applies the same
rules, so a malformed line is reported with its file and line number instead of surfacing
later as a puzzling pandas error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping

from memra.errors import MemraError

log = logging.getLogger("memra.tuning")

SCHEMA = 1

# field -> accepted Python types (None allowed where the tuple has type(None))
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
FIELDS: dict[str, tuple] = {
    "schema": (int,),
    "ts": (str,),
    "git_sha": (str,),
    "kernel": (str,),
    "variant": (str,),
    "config": (dict,),
    "shape": (dict,),
    "src": (str,),  # kernel source file under kernels/ (what src_hash covers)
    "device": (str,),
    "cc": (str,),
    "sms": (int,),
    "nvrtc": (str,),
    "src_hash": (str,),
    "median_us": _OPT_NUM,
    "p20_us": _OPT_NUM,
    "p80_us": _OPT_NUM,
    "reps": (int, type(None)),
    "bytes": (int, type(None)),
    "gbps": _OPT_NUM,
    "pct_peak": _OPT_NUM,
    "max_err": _OPT_NUM,
    "ok": (bool,),
    "error": (str, type(None)),
}
TIMING_FIELDS = ("median_us", "p20_us", "p80_us", "reps", "gbps", "pct_peak")
# optional fields a receipt may carry; anything else is kept but not interpreted
OPTIONAL = ("campaign", "ops", "peak_gbps")


class ReceiptError(MemraError):
    """A receipt line that does not follow the schema."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}")


def normalize_cc(cc) -> str:
    """Compute capability as 'major.minor' from (9, 0), '9.0', 90, '90', 'sm_90a'."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    s = str(cc).strip().lower()
    if s.startswith("sm_"):
        s = s[3:].rstrip("abcdefghijklmnopqrstuvwxyz")
    if "." in s:
        major, minor = s.split(".", 1)
        if major.isdigit() and minor.isdigit():
            return f"{int(major)}.{int(minor)}"
    elif s.isdigit() and len(s) >= 2:
        return f"{int(s[:-1])}.{int(s[-1])}"
    raise MemraError(f"bad compute capability {cc!r} (expected e.g. '9.0' or (9, 0))")


def shape_key(shape: Mapping | str) -> str:
    """Canonical text of a shape without its batch: 'cols=4096,rows=4096,type=Q4_K'.
    Tables are keyed by this and by the batch bucket separately."""
    if isinstance(shape, str):
        return shape
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape) if k != "batch")


def shape_of_key(key: str) -> dict[str, str]:
    """shape_key's inverse, values left as text: {'cols': '4096', 'rows': '4096', ...}."""
    return dict(kv.split("=", 1) for kv in key.split(",")) if key else {}


def config_key(config: Mapping) -> str:
    """Canonical text of a -D configuration: 'NWARPS=4,ROWS=2' ('' when empty)."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def shape_batch(shape: Mapping) -> int:
    return int(shape.get("batch", 1))


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def git_sha(repo: Path | None = None) -> str:
    """HEAD of the checkout memra runs from, '+dirty' when tracked files are modified;
    $MEMRA_GIT_SHA where the tree is a copy without git history (a GPU machine given a
    copy of the checkout); else 'unknown' (an installed wheel)."""
    if os.environ.get("MEMRA_GIT_SHA"):
        return os.environ["MEMRA_GIT_SHA"]
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float, str, bool))


def validate_receipt(row: Mapping) -> list[str]:
    """The problems of one receipt (empty when it follows the schema)."""
    if not isinstance(row, Mapping):
        return [f"expected a JSON object, found {type(row).__name__}"]
    problems = []
    if row.get("schema") != SCHEMA:
        return [f"schema {row.get('schema')!r} is not supported (this memra reads schema {SCHEMA})"]
    for name, types in FIELDS.items():
        if name not in row:
            problems.append(f"field {name!r} is missing")
            continue
        v = row[name]
        # bool is an int in Python: do not let true pass as a number or a number as ok
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            problems.append(f"field {name!r} has {type(v).__name__} {v!r}")
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append(f"field {name!r} is {v!r}")
    if problems:
        return problems
    for name in ("kernel", "variant", "src", "device", "src_hash"):
        if not row[name]:
            problems.append(f"field {name!r} is empty")
    for name in ("config", "shape"):
        bad = [k for k, v in row[name].items() if not _is_scalar(v)]
        if bad:
            problems.append(f"{name} values must be numbers or strings (see {', '.join(bad)})")
    b = row["shape"].get("batch", 1)
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        problems.append(f"shape batch {b!r} is not a positive integer")
    if row["ok"]:
        missing = [f for f in ("median_us", "p20_us", "p80_us", "reps") if row[f] is None]
        if missing:
            problems.append(f"ok receipt without {', '.join(missing)}")
        elif not (0 < row["p20_us"] <= row["median_us"] <= row["p80_us"]) or row["reps"] < 1:
            problems.append(f"timings out of order: p20 {row['p20_us']} median {row['median_us']} "
                            f"p80 {row['p80_us']} reps {row['reps']}")
        if row["error"]:
            problems.append("ok receipt carries an error")
    else:
        if not row["error"]:
            problems.append("failed receipt (ok false) without an error text")
        timed = [f for f in TIMING_FIELDS if row[f] is not None]
        if timed:
            problems.append(f"failed receipt carries timings ({', '.join(timed)}): "
                            f"a failing configuration is never timed")
    return problems


def make_receipt(*, kernel: str, variant: str, config: Mapping, shape: Mapping, src: str,
                 src_hash: str, device: str, cc, sms: int, nvrtc: str, ok: bool,
                 median_us: float | None = None, p20_us: float | None = None,
                 p80_us: float | None = None, reps: int | None = None,
                 bytes: int | None = None, max_err: float | None = None,
                 error: str | None = None, peak_gbps: float | None = None,
                 git_sha: str | None = None, ts: str | None = None, **extra) -> dict:
    """One receipt, with gbps and pct_peak derived from bytes, median_us and peak_gbps.
    Raises ReceiptError when the result would not validate (e.g. ok without timings)."""
    gbps = pct = None
    if ok and bytes is not None and median_us:
        gbps = bytes / median_us / 1e3  # bytes per µs → GB/s
        if peak_gbps:
            pct = 100.0 * gbps / peak_gbps
    row = {
        "schema": SCHEMA, "ts": ts or utc_now(), "git_sha": git_sha or "unknown",
        "kernel": kernel, "variant": variant, "config": dict(config), "shape": dict(shape),
        "src": src, "device": device, "cc": normalize_cc(cc), "sms": int(sms),
        "nvrtc": str(nvrtc), "src_hash": src_hash,
        "median_us": _f(median_us), "p20_us": _f(p20_us), "p80_us": _f(p80_us),
        "reps": None if reps is None else int(reps), "bytes": None if bytes is None else int(bytes),
        "gbps": gbps, "pct_peak": pct, "max_err": _f(max_err), "ok": bool(ok),
        "error": error or None,
    }
    if peak_gbps is not None:
        row["peak_gbps"] = float(peak_gbps)
    row.update(extra)
    problems = validate_receipt(row)
    if problems:
        raise ReceiptError(f"receipt {kernel}/{variant} [{config_key(config)}] "
                           f"[{shape_key(shape)}]", "; ".join(problems))
    return row


def _f(v):
    return None if v is None else float(v)


def append_receipts(path: str | os.PathLike, rows: Iterable[Mapping]) -> int:
    """Append receipts to a JSONL file (created with its folder), one line each, flushed
    to disk so an interrupted campaign keeps what it measured. Returns the count."""
    path = Path(path)
    rows = list(rows)
    for i, r in enumerate(rows):
        problems = validate_receipt(r)
        if problems:
            raise ReceiptError(f"receipt #{i} for {path}", "; ".join(problems))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return len(rows)


def iter_receipts(path: str | os.PathLike):
    """(line number, receipt) for each non-blank line, validated."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ReceiptError(str(path), f"cannot read receipts ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ReceiptError(str(path), "not UTF-8 text") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReceiptError(f"{path}:{n}", f"not JSON ({e.msg} at column {e.colno})") from None
        problems = validate_receipt(row)
        if problems:
            raise ReceiptError(f"{path}:{n}", "; ".join(problems))
        yield n, row


def receipt_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand folders into their *.jsonl files (sorted); files are taken as given."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(p.rglob("*.jsonl")))
        elif p.exists():
            out.append(p)
        else:
            raise ReceiptError(str(p), "no such receipts file or folder")
    return out


def read_receipts(paths: Iterable[str | os.PathLike] | str | os.PathLike):
    """Receipts from JSONL files (or folders of them) as a pandas DataFrame.

    One row per receipt with every field, plus: `file`, `line` (provenance), `config_key`,
    `shape_key`, `batch` (for grouping) and flattened `config.<NAME>` / `shape.<name>`
    columns (so `--by config.NWARPS` works)."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records = []
    for path in receipt_files(paths):
        for n, row in iter_receipts(path):
            rec = dict(row)
            rec["file"], rec["line"] = str(path), n
            rec["config_key"] = config_key(row["config"])
            rec["shape_key"] = shape_key(row["shape"])
            rec["batch"] = shape_batch(row["shape"])
            for k, v in row["config"].items():
                rec[f"config.{k}"] = v
            for k, v in row["shape"].items():
                if k != "batch":
                    rec[f"shape.{k}"] = v
            records.append(rec)
    base = list(FIELDS) + ["file", "line", "config_key", "shape_key", "batch"]
    df = pd.DataFrame.from_records(records)
    for c in base:
        if c not in df.columns:
            df[c] = pd.Series(dtype=object)
    return df
