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

Other kinds. `read_receipts` reads every receipt memra writes into one DataFrame with a
`kind` column: `KINDS` below, a literal dict, says per kind what a line must carry and how
`memra research` groups, compares and dates it. A line's kind is its `kind` field (every
writer adds one: "tune", "bench", ...), else its `schema` when that is a name (the matvec
sweeps' "memra.matvec.v1"), else "tune" for schema 1 (tuning receipts written before they
carried a kind), else "record": the free-form lines experiments wrote, kept as they are
(their own `kind` field, if any, moves to `record`). A new kind is one entry in KINDS.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

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
OPTIONAL = ("kind", "campaign", "ops", "peak_gbps")


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
        "kind": "tune", "schema": SCHEMA, "ts": ts or utc_now(), "git_sha": git_sha or "unknown",
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


# ---------------------------------------------------------------- kinds


def _need(row: Mapping, fields: Mapping[str, tuple]) -> list[str]:
    out = []
    for name, types in fields.items():
        if name not in row:
            out.append(f"field {name!r} is missing")
        elif (isinstance(row[name], bool) and bool not in types) or not isinstance(row[name], types):
            out.append(f"field {name!r} has {type(row[name]).__name__} {row[name]!r}")
        elif isinstance(row[name], float) and not math.isfinite(row[name]):
            out.append(f"field {name!r} is {row[name]!r}")
    return out


BENCH_FIELDS: dict[str, tuple] = {
    "engine": (str,), "model": (str,), "test": (str,), "n_prompt": (int,), "n_gen": (int,),
    "n_depth": (int,), "avg_ts": _NUM, "median_ts": _NUM, "stddev_ts": _NUM, "samples_ts": (list,),
    "device": (str,), "git_sha": (str,), "date": (str,), "gate": (str, type(None)),
}


def validate_bench(row: Mapping) -> list[str]:
    """Problems of a `memra bench` receipt (memra.tune.bench.receipt writes them)."""
    if row.get("schema") != 1:
        return [f"bench schema {row.get('schema')!r} is not supported (this memra reads schema 1)"]
    problems = _need(row, BENCH_FIELDS)
    if problems:
        return problems
    if not row["samples_ts"] or not all(isinstance(v, _NUM) and not isinstance(v, bool) and v > 0
                                        for v in row["samples_ts"]):
        problems.append("samples_ts must be a non-empty list of positive numbers")
    if min(row["n_prompt"], row["n_gen"], row["n_depth"]) < 0:
        problems.append("n_prompt, n_gen and n_depth must be >= 0")
    return problems


ENGINE_CHOICE_FIELDS: dict[str, tuple] = {
    "device": (str,), "kernel": (str,), "shape_key": (str,), "batch": (int,), "base_config": (dict,),
    "config": (dict,), "src": (str,), "src_hash": (str,), "gain": _NUM, "evidence": (list,), "git_sha": (str,),
    "ts": (str,),
}


def validate_engine_choice(row: Mapping) -> list[str]:
    """Problems of an engine-choice record: a table entry's configuration chosen by the engine's own A/B
    (`config` against the frozen `base_config`, tg128 `gain` as a fraction, or that of the optional
    `objective` it names (e.g. the step time summed over two depth cells), the bench receipts that show
    it in `evidence`; an optional `group` names the set of entries one A/B changed together, which freeze
    applies all or none), which `memra tune freeze` lays over the entry it names (memra.tune.freeze
    .apply_engine_choices)."""
    if row.get("schema") != 1:
        return [f"engine-choice schema {row.get('schema')!r} is not supported (this memra reads schema 1)"]
    problems = _need(row, ENGINE_CHOICE_FIELDS)
    if problems:
        return problems
    if row["batch"] < 1:
        problems.append("batch must be >= 1")
    if not row["evidence"] or not all(isinstance(e, str) and e for e in row["evidence"]):
        problems.append("evidence must name at least one receipts file")
    if row["config"] == row["base_config"]:
        problems.append("config equals base_config: nothing chosen")
    if "group" in row and not (isinstance(row["group"], str) and row["group"]):
        problems.append("group must be a non-empty string (the records of one A/B's set of entries)")
    return problems


CARRY_FIELDS: dict[str, tuple] = {
    "src": (str,), "from_hash": (str,), "to_hash": (str,), "device": (str,), "arch": (str,), "modules": (int,),
    "receipts": (int,), "git_sha": (str,), "ts": (str,),
}


def validate_carry(row: Mapping) -> list[str]:
    """Problems of a carry record (memra.tune.carry): the receipts of `device` on `src` at `from_hash`
    count as measured at `to_hash`, every module they name having compiled to the same code on `arch`."""
    problems = _need(row, CARRY_FIELDS)
    if not problems and row["from_hash"] == row["to_hash"]:
        problems.append("from_hash equals to_hash: nothing carried")
    return problems


SERVE_BENCH_FIELDS: dict[str, tuple] = {
    "engine": (str,), "model": (str,), "device": (str,), "git_sha": (str,), "ts": (str,),
    "concurrency": (int,), "requests": (int,), "completed": (int,), "failed": (int,), "max_tokens": (int,),
    "prompt_tokens": _NUM, "output_tokens": (int,), "wall_s": _NUM, "agg_tok_s": _NUM, "req_s": _NUM,
    "ttft_p50_s": _OPT_NUM, "ttft_p95_s": _OPT_NUM, "ttft_p99_s": _OPT_NUM, "tpot_p50_s": _OPT_NUM,
    "tpot_p95_s": _OPT_NUM, "tpot_p99_s": _OPT_NUM, "itl_p50_s": _OPT_NUM, "itl_p95_s": _OPT_NUM,
    "itl_p99_s": _OPT_NUM,
}


def validate_serve_bench(row: Mapping) -> list[str]:
    """Problems of a `memra bench serve` receipt (memra.serve.bench writes them)."""
    if row.get("schema") != 1:
        return [f"serve-bench schema {row.get('schema')!r} is not supported (this memra reads schema 1)"]
    problems = _need(row, SERVE_BENCH_FIELDS)
    if not problems and (row["concurrency"] < 1 or row["completed"] + row["failed"] != row["requests"]):
        problems.append("concurrency must be >= 1 and completed + failed = requests")
    return problems


def _sweep(row: Mapping) -> list[str]:
    return _need(row, {"device": (str,), "type": (str,), "rows": (int,), "cols": (int,),
                       "batch": (int,), "config": (dict,), "ok": (bool,)})


def _pdl(row: Mapping) -> list[str]:
    return _need(row, {"device": (str,), "pdl": (bool,), "layers": (int,), "median_ms": _NUM})


def _kernelcheck(row: Mapping) -> list[str]:
    return _need(row, {"family": (str,), "device": (str,), "last": (str,)})


def _flat_tune(row: Mapping) -> dict:
    rec = {"config_key": config_key(row["config"]), "shape_key": shape_key(row["shape"]),
           "batch": shape_batch(row["shape"])}
    rec.update({f"config.{k}": v for k, v in row["config"].items()})
    rec.update({f"shape.{k}": v for k, v in row["shape"].items() if k != "batch"})
    return rec


def _flat_sweep(row: Mapping) -> dict:
    return {"config_key": config_key(row["config"]),
            **{f"config.{k}": v for k, v in row["config"].items()}}


@dataclass(frozen=True)
class Kind:
    """One kind of receipt: what a line must carry and how `memra research` reads it.

    validate(row) -> problems (empty: a good line); flatten(row) -> extra columns (grouping
    keys derived from nested fields); by: the default summary groups; on: compare's match
    columns; value: the figure summarized and compared, `better` "min" (µs) or "max" (t/s);
    label: the column naming a group's best row; time: the column holding when it ran."""
    name: str
    validate: Callable[[Mapping], list[str]] = lambda row: []
    flatten: Callable[[Mapping], dict] | None = None
    by: tuple[str, ...] = ("file",)
    on: tuple[str, ...] = ()
    value: str | None = None
    better: str = "min"
    label: str | None = None
    time: str | None = None


_TUNE = Kind("tune", validate_receipt, _flat_tune, by=("kernel", "shape_key", "batch", "variant"),
             on=("kernel", "variant", "config_key", "shape_key", "batch"), value="median_us",
             label="config_key", time="ts")
_SWEEP = Kind("matvec-sweep", _sweep, _flat_sweep, by=("type", "rows", "cols", "batch", "path"),
              on=("type", "rows", "cols", "batch", "path", "config_key"), value="median_us",
              label="config_key", time="git_sha")

# key (a line's `kind`, or its `schema` name, see kind_key) -> Kind
KINDS: dict[str, Kind] = {
    "tune": _TUNE,
    "bench": Kind("bench", validate_bench, by=("device", "model", "test", "engine"),
                  on=("device", "model", "test", "engine"), value="median_ts", better="max",
                  label="git_sha", time="date"),
    "serve-bench": Kind("serve-bench", validate_serve_bench, by=("device", "model", "engine", "concurrency"),
                        on=("device", "model", "engine", "concurrency"), value="agg_tok_s", better="max",
                        label="git_sha", time="ts"),
    "memra.matvec.v1": _SWEEP,
    "memra.matvec.pdl.v1": Kind("matvec-pdl", _pdl, by=("device", "layers", "pdl"), value="median_ms",
                                label="git_sha"),
    "memra.kernelcheck.v1": Kind("kernel-check", _kernelcheck, by=("device", "family"), label="last",
                                 time="ts"),
    # experiments/spec_bench.py (plain vs speculative decode, per prompt and a summary line)
    # and experiments/structured_speed.py (constrained vs free decode, per rep and arm)
    "spec-bench/1": Kind("spec-bench", by=("device", "model", "drafter"), label="git", time="ts"),
    "memra.structured-speed/1": Kind("structured-speed", by=("device", "model", "batch", "mode"),
                                     on=("device", "model", "batch", "mode"), value="tok_s", better="max",
                                     label="git_sha", time="ts"),
    "memra.structured-speed-summary/1": Kind("structured-speed-summary", by=("device", "model", "batch"),
                                             label="git_sha", time="ts"),
    "engine-choice": Kind("engine-choice", validate_engine_choice, by=("device", "kernel", "shape_key", "batch"),
                          label="git_sha", time="ts"),
    "record": Kind("record", by=("file", "record"), time="ts"),
    "memra.carry.v1": Kind("carry", validate_carry, by=("device", "src"), label="git_sha", time="ts"),
}


def kind_key(row: Mapping) -> str:
    """Which KINDS entry a line belongs to (see the module docstring); may be unknown."""
    schema, kind = row.get("schema"), row.get("kind")
    if isinstance(schema, str):
        return schema
    if schema is None:
        return "record"
    if isinstance(kind, str):
        return kind
    return "tune"


def check_line(row) -> tuple[Kind | None, list[str]]:
    """(its Kind, its problems) for one parsed JSON line."""
    if not isinstance(row, Mapping):
        return None, [f"expected a JSON object, found {type(row).__name__}"]
    key = kind_key(row)
    kind = KINDS.get(key)
    if kind is None:
        what = "schema" if isinstance(row.get("schema"), str) else "kind"
        return None, [f"{what} {key!r} is not a receipt kind this memra reads "
                      f"(known: {', '.join(sorted(KINDS))})"]
    return kind, kind.validate(row)


# ---------------------------------------------------------------- reading


RECEIPT_SUFFIXES = (".jsonl", ".json")


def iter_receipts(path: str | os.PathLike):
    """(line number, receipt) for each non-blank line, validated (a bad line raises)."""
    for n, row, _ in iter_lines(path):
        yield n, row


def iter_lines(path: str | os.PathLike, on_error: Callable[[ReceiptError], None] | None = None):
    """(line number, receipt, its Kind) for each non-blank line, validated. A bad line
    raises ReceiptError naming file:line, or with `on_error` is handed to it and skipped."""
    path = Path(path)

    def bad(where: str, message: str):
        e = ReceiptError(where, message)
        if on_error is None:
            raise e
        on_error(e)

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        bad(str(path), f"cannot read receipts ({e.strerror or e})")
        return
    except UnicodeDecodeError:
        bad(str(path), "not UTF-8 text")
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            bad(f"{path}:{n}", f"not JSON ({e.msg} at column {e.colno})")
            continue
        kind, problems = check_line(row)
        if problems:
            bad(f"{path}:{n}", "; ".join(problems))
            continue
        yield n, row, kind


def receipt_files(paths: Iterable[str | os.PathLike],
                  on_error: Callable[[ReceiptError], None] | None = None) -> list[Path]:
    """Expand folders into their *.jsonl files (recursively, sorted); files are taken as
    given, except that one which is plainly no receipts file (a .txt, .log, .md, ...) is an
    error, or with `on_error` reported and skipped (folders skip such files silently)."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(p.rglob("*.jsonl")))
        elif p.exists():
            if p.suffix and p.suffix not in RECEIPT_SUFFIXES:
                e = ReceiptError(str(p), f"not a receipts file ({p.suffix}: receipts are JSON lines, *.jsonl)")
                if on_error is None:
                    raise e
                on_error(e)
                continue
            out.append(p)
        else:
            raise ReceiptError(str(p), "no such receipts file or folder")
    return out


def read_receipts(paths: Iterable[str | os.PathLike] | str | os.PathLike, *,
                  kinds: Iterable[str] | None = None,
                  on_error: Callable[[ReceiptError], None] | None = None):
    """Receipts of every kind from JSONL files (or folders of them) as one pandas DataFrame.

    One row per receipt with every field, plus `kind` (KINDS[...].name), `file`, `line`
    (provenance) and each kind's flattened columns (tune: `config_key`, `shape_key`, `batch`,
    `config.<NAME>`, `shape.<name>`, so `--by config.NWARPS` works). `kinds`: keep only these
    kind names. A malformed line raises ReceiptError (file:line), or with `on_error` is
    handed to it and skipped."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    keep = None if kinds is None else set(kinds)
    records = []
    for path in receipt_files(paths, on_error):
        for n, row, kind in iter_lines(path, on_error):
            if keep is not None and kind.name not in keep:
                continue
            rec = dict(row)
            if kind.name == "record" and "kind" in rec:
                rec["record"] = rec.pop("kind")
            rec["kind"], rec["file"], rec["line"] = kind.name, str(path), n
            if kind.flatten is not None:
                rec.update(kind.flatten(row))
            records.append(rec)
    base = ["kind", "file", "line"]
    if keep is None or "tune" in keep:
        base = list(FIELDS) + base + ["config_key", "shape_key", "batch"]
    df = pd.DataFrame.from_records(records)
    for c in base:
        if c not in df.columns:
            df[c] = pd.Series(dtype=object)
    return df
