"""Reading a per-device default table (the half of tuning below the engine).

A table (`<device-slug>.json`, in $MEMRA_HOME/tables or the shipped tune/defaults/) is made
by memra.tune.freeze from receipts:
for each kernel, shape (without batch) and decode batch bucket, the fastest configuration
that passed its check, with the source hash it was measured on. The engine calls `load_table` once at start-up (exact device
name, else same compute capability, else the launchers' built-in defaults: an empty table)
and `lookup` per launcher; entries whose kernel source changed since they were measured
are listed as stale and warned about, but still used: a stale entry names a configuration
that passed its check on older source, and a launcher rejects tunables it no longer knows.

This module is on the start-up path, so it imports nothing heavy (no pandas at import).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

from memra.errors import MemraError
from memra.paths import home_tables_dir, tables_dir
from memra.tune.receipts import normalize_cc, shape_key

log = logging.getLogger("memra.tuning")

TABLE_FORMAT = 1

# Decode batch sizes the engine captures CUDA graphs for (a batch runs in the graph of the
# smallest bucket that holds it, so tables are keyed by the same buckets), and prefill chunks
# (more than 64 rows, up to memra.gpu.plan.PREFILL_CHUNK token rows through the GEMM, which
# wants other tiles than a 64-row decode step): 65..128 rows (prompt tails, mixed server
# steps) and 129..512 (whole chunks). A prefill bucket with no entry for a shape takes the
# next smaller prefill bucket's (PREFILL_BUCKETS_FROM: a table frozen before the 512 bucket
# existed, or a shape its campaign did not reach at 512 rows, keeps its 128-row choice
# rather than falling to the launcher's default).
BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 512)
PREFILL_BUCKETS_FROM = 128


class TableError(MemraError):
    """A default table that cannot be read or does not follow the format."""


class Choice(NamedTuple):
    """What a launcher should run: a variant and its -D tunables."""
    variant: str
    config: dict


def batch_bucket(batch: int, buckets: Iterable[int] = BATCH_BUCKETS) -> int:
    """The smallest bucket holding `batch` (the largest bucket beyond the last one)."""
    buckets = sorted(buckets)
    if batch < 1:
        raise MemraError(f"batch {batch} is not a positive integer")
    for b in buckets:
        if batch <= b:
            return b
    return buckets[-1]


def device_slug(device_name: str) -> str:
    """File stem of a device's table: 'NVIDIA H200' → 'nvidia-h200'."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if not slug:
        raise MemraError(f"device name {device_name!r} has no letters or digits")
    return slug


def combined_hash(hashes) -> str:
    """The hash of an entry over several kernel files ("a+b": memra.tune.dispatch) from theirs, in order."""
    import hashlib

    return hashlib.sha256("+".join(hashes).encode()).hexdigest()[:16]


def src_hash(src: str) -> str:
    """The hash of a kernel file and its headers; of several joined by "+" (an entry that
    compares kernels, memra.tune.dispatch, or a family with a file per implementation), the hash
    of their hashes. MemraError where a file is gone."""
    from memra.gpu.compile import source_hash

    return source_hash(src) if "+" not in src else combined_hash(source_hash(f) for f in src.split("+"))


def _current_hash(src: str) -> str | None:
    """src_hash, None where a kernel file is gone (every entry measured on it is stale)."""
    try:
        return src_hash(src)
    except MemraError:
        return None


# ---------------------------------------------------------------- load and look up


def read_table(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TableError(f"{path}: cannot read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TableError(f"{path}: not a JSON table ({e})") from None
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise TableError(f"{path}: not a memra default table of format {TABLE_FORMAT}")
    for field in ("device", "cc", "entries"):
        if field not in table:
            raise TableError(f"{path}: field {field!r} is missing")
    for kernel, shapes in table["entries"].items():
        for skey, by_batch in shapes.items():
            for b, e in by_batch.items():
                if not (b.isdigit() and isinstance(e, dict) and isinstance(e.get("variant"), str)
                        and isinstance(e.get("config"), dict) and "src" in e and "src_hash" in e):
                    raise TableError(f"{path}: bad entry {kernel} [{skey}] batch {b}")
    table["path"] = str(path)
    return table


def table_dirs() -> list[Path]:
    """Where the engine looks for tables, first match first: the tables this machine froze
    ($MEMRA_HOME/tables, `memra tune freeze`'s default), then the shipped tune/defaults/."""
    return [home_tables_dir(), tables_dir()]


def list_tables(directory: str | os.PathLike | None = None) -> list[dict]:
    """Every table in `directory`, or (None) in table_dirs() in their order."""
    dirs = [Path(directory)] if directory is not None else table_dirs()
    return [read_table(p) for d in dirs if d.is_dir() for p in sorted(d.glob("*.json"))]


def builtin_table() -> dict:
    """No entries: every launcher uses its own built-in default configuration."""
    return {"format": TABLE_FORMAT, "device": None, "cc": None, "entries": {},
            "path": None, "stale": []}


def stale_entries(table: Mapping, current_hash: Callable[[str], str | None] = _current_hash) -> list[dict]:
    """Entries measured on kernel source that has changed since (or is gone)."""
    out, hashes = [], {}
    for kernel, shapes in sorted(table.get("entries", {}).items()):
        for skey, by_batch in sorted(shapes.items()):
            for b, e in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
                src = e["src"]
                if src not in hashes:
                    hashes[src] = current_hash(src)
                if hashes[src] != e["src_hash"]:
                    out.append({"kernel": kernel, "shape": skey, "batch": int(b), "src": src,
                                "table_hash": e["src_hash"], "current_hash": hashes[src]})
    return out


def _same_device(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def select_table(tables: list[dict], device_name: str, cc, sms: int | None = None) -> tuple[dict | None, str]:
    """(table, 'exact' | 'cc') for this device, or (None, 'builtin')."""
    for t in tables:
        if _same_device(t["device"], device_name):
            return t, "exact"
    cc = normalize_cc(cc)
    same = [t for t in tables if normalize_cc(t["cc"]) == cc]
    if same:
        # several of the same architecture (H100 and H200 tables on an unknown sm_90 part):
        # the nearest SM count is the likeliest to share the winners
        same.sort(key=lambda t: (abs(int(t.get("sms") or 0) - sms) if sms else 0, t["path"]))
        return same[0], "cc"
    return None, "builtin"


def load_table(device_name: str, cc, *, sms: int | None = None,
               directory: str | os.PathLike | None = None,
               current_hash: Callable[[str], str | None] = _current_hash) -> tuple[dict, str]:
    """The table this device runs with, and where it came from: 'exact' (a table frozen on
    a device of this name), 'cc' (one of the same compute capability) or 'builtin' (none:
    an empty table, launchers use their own defaults). Logs which, and warns about stale
    entries; the table's 'stale' key lists them."""
    table, source = select_table(list_tables(directory), device_name, cc, sms)
    if table is None:
        log.info("tuning: no table for %s (cc %s): launchers use their built-in defaults",
                 device_name, normalize_cc(cc))
        return builtin_table(), "builtin"
    log.info("tuning: %s table %s (frozen on %s) for %s", source, table["path"],
             table["device"], device_name)
    table["stale"] = stale_entries(table, current_hash)
    if table["stale"]:
        kernels = sorted({s["kernel"] for s in table["stale"]})
        log.warning("tuning: %d entries of %s were measured on kernel source that has changed "
                    "since (%s); re-run `memra tune` and `memra tune freeze`",
                    len(table["stale"]), table["path"], ", ".join(kernels))
    return table, source


def resolve_table(which: str | None, device_name: str, cc, *, sms: int | None = None,
                  directory: str | os.PathLike | None = None,
                  current_hash: Callable[[str], str | None] = _current_hash) -> tuple[dict, str]:
    """The table a run asked for: 'auto' (load_table: exact → cc → builtin), 'builtin' (no table: the
    A arm of a tuned-vs-defaults benchmark), or a table file; None: $MEMRA_TUNE_TABLE, else 'auto'
    (docs/FLAGS.md; every engine entry — runner, `memra bench`, `memra profile` — asks here)."""
    if which is None:
        which = os.environ.get("MEMRA_TUNE_TABLE") or "auto"
    if which == "auto":
        return load_table(device_name, cc, sms=sms, directory=directory, current_hash=current_hash)
    if which == "builtin":
        log.info("tuning: built-in launcher defaults (asked for)")
        return builtin_table(), "builtin"
    table = read_table(which)
    table["stale"] = stale_entries(table, current_hash)
    log.info("tuning: table %s (frozen on %s), as asked", table["path"], table["device"])
    if table["stale"]:
        log.warning("tuning: %d entries of %s were measured on kernel source that has changed since",
                    len(table["stale"]), table["path"])
    return table, "file"


def lookup(table: Mapping, kernel: str, shape: Mapping | str, batch: int = 1) -> Choice | None:
    """The frozen choice for a kernel at a shape and batch, or None (launcher default).

    An entry applies to the shape and batch bucket it was measured at only (no extrapolation
    to other shapes or decode buckets); a prefill bucket (from PREFILL_BUCKETS_FROM rows)
    without one takes the next smaller prefill bucket's. A configuration never changes a
    row's bits (the families refuse those that would), only its speed."""
    by_batch = table.get("entries", {}).get(kernel, {}).get(shape_key(shape))
    if not by_batch:
        return None
    buckets = sorted(table.get("batch_buckets") or BATCH_BUCKETS)
    b = batch_bucket(batch, buckets)
    for x in [b] + [x for x in reversed(buckets) if PREFILL_BUCKETS_FROM <= x < b]:
        e = by_batch.get(str(x))
        if e is not None:
            return Choice(e["variant"], dict(e["config"]))
    return None
