"""Per-device default tables: freeze receipts into winners, load the table at start-up.

`freeze` turns receipts (see memra.receipts) into `tune/defaults/<device-slug>.json`: for
each kernel, shape (without batch) and decode batch bucket, the fastest configuration that
passed its check, with the source hash it was measured on, the receipt it came from and its
margin over the runner-up. The engine calls `load_table` once at start-up (exact device
name, else same compute capability, else the launchers' built-in defaults: an empty table)
and `lookup` per launcher; entries whose kernel source changed since they were measured
are listed as stale and warned about, but still used: a stale entry names a configuration
that passed its check on older source, and a launcher rejects tunables it no longer knows.

This module is on the start-up path, so it imports nothing heavy (no pandas at import).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

from .atomic import write_atomic
from .errors import MemraError
from .receipts import config_key, git_sha, normalize_cc, shape_key, utc_now

log = logging.getLogger("memra.tuning")

TABLE_FORMAT = 1

# Decode batch sizes the engine captures CUDA graphs for; a batch runs in the graph of the
# smallest bucket that holds it, so tables are keyed by the same buckets. The engine
# imports this tuple rather than keeping its own.
BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


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


def tables_dir() -> Path:
    """tune/defaults of the checkout memra runs from, else the copy shipped in the wheel."""
    d = Path(__file__).resolve().parent.parent / "tune" / "defaults"
    if d.is_dir():
        return d
    try:
        from importlib.resources import files

        return Path(str(files("memra.defaults")))
    except (ModuleNotFoundError, TypeError):
        return d


def _current_hash(src: str) -> str | None:
    from .compile import source_hash

    try:
        return source_hash(src)
    except MemraError:
        return None  # the kernel file is gone: every entry measured on it is stale


# ---------------------------------------------------------------- freeze


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def freeze(receipts, device: str, *, current_hashes: Mapping[str, str] | None = None,
           buckets: Iterable[int] = BATCH_BUCKETS, root: Path | None = None,
           builtin=None, min_gain: float = 0.0) -> dict:
    """The default table for `device` from a receipts DataFrame (memra.receipts.read_receipts).

    Only receipts of `device` count, and only those measured on the kernel source that is
    current: `current_hashes` maps a kernel file to its hash (normally the files on disk);
    without it, each kernel file's most recently measured hash is taken as current. Only
    ok rows compete. A configuration measured several times scores the median of its
    medians. `margin` = runner-up median / winner median - 1 (None when nothing else ran).

    builtin(receipt row) -> bool tells whether a row's configuration is what the launcher
    runs without a table. When that configuration was measured and the fastest one beats it
    by less than `min_gain` (a fraction), the entry keeps the built-in configuration
    (`kept_builtin`: true, the harness's winner as `runner_up`): a campaign times kernels
    alone, and a lead smaller than its error against the kernel inside the decode graph is
    not evidence enough to leave the default.
    """
    buckets = tuple(sorted(buckets))
    df = receipts[receipts["device"] == device]
    if df.empty:
        seen = sorted(set(receipts["device"])) if len(receipts) else []
        raise MemraError(f"no receipts for device {device!r}"
                         + (f" (receipts name: {', '.join(seen)})" if seen else ""))
    if current_hashes is None:
        latest = df.sort_values("ts").groupby("src")["src_hash"].last()
        current_hashes = latest.to_dict()
    current = df["src_hash"] == df["src"].map(current_hashes)
    if (~current).any():
        log.info("freeze: ignoring %d receipts measured on older kernel source", int((~current).sum()))
    df = df[current]

    first = df.iloc[0] if len(df) else receipts[receipts["device"] == device].iloc[0]
    root = root or Path(__file__).resolve().parent.parent
    entries: dict[str, dict[str, dict[str, dict]]] = {}
    no_winner = []
    for (kernel, skey), group in df.groupby(["kernel", "shape_key"], sort=True):
        for bucket in buckets:
            rows = group[group["batch"].map(lambda b: batch_bucket(b, buckets)) == bucket]
            if rows.empty:
                continue
            ok = rows[rows["ok"]]
            if ok.empty:
                no_winner.append({"kernel": kernel, "shape": skey, "batch": bucket,
                                  "failed": int(len(rows))})
                continue
            cands = []
            for (variant, ckey), c in ok.groupby(["variant", "config_key"], sort=True):
                score = _median([float(x) for x in c["median_us"]])
                best = c.iloc[(c["median_us"] - score).abs().argmin()]  # the receipt nearest the score
                cands.append((score, variant, ckey, best, len(c)))
            cands.sort(key=lambda t: (t[0], t[1], t[2]))
            kept = False
            if builtin is not None and min_gain > 0:
                base = next((i for i, c in enumerate(cands) if builtin(c[3])), None)
                if base and cands[base][0] < cands[0][0] * (1.0 + min_gain):
                    cands.insert(0, cands.pop(base))
                    kept = True
            score, variant, _, win, n_meas = cands[0]
            failed = rows[~rows["ok"]].groupby(["variant", "config_key"]).ngroups
            entry = {
                "variant": variant, "config": dict(win["config"]),
                "median_us": score, "p20_us": float(win["p20_us"]), "p80_us": float(win["p80_us"]),
                "gbps": _opt(win["gbps"]), "pct_peak": _opt(win["pct_peak"]),
                "src": win["src"], "src_hash": win["src_hash"],
                "receipt": f"{_rel(win['file'], root)}:{int(win['line'])}",
                "measurements": n_meas, "candidates": len(cands), "failed": failed,
                "margin": None, "runner_up": None,
            }
            if kept:
                entry["kept_builtin"] = True
            if len(cands) > 1:
                r_score, r_variant, _, r_row, _ = cands[1]
                entry["margin"] = r_score / score - 1.0
                entry["runner_up"] = {"variant": r_variant, "config": dict(r_row["config"]),
                                      "median_us": r_score}
            entries.setdefault(kernel, {}).setdefault(skey, {})[str(bucket)] = entry
    sources = {src: h for src, h in sorted(current_hashes.items()) if src in set(df["src"])}
    return {
        "format": TABLE_FORMAT,
        "device": device,
        "cc": first["cc"],
        "sms": int(first["sms"]),
        "nvrtc": first["nvrtc"],
        "frozen_at": utc_now(),
        "git_sha": git_sha(),
        "receipts": sorted({_rel(f, root) for f in receipts[receipts["device"] == device]["file"]}),
        "batch_buckets": list(buckets),
        "sources": sources,
        "entries": entries,
        "no_winner": no_winner,
    }


def _opt(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _rel(path, root: Path) -> str:
    p = Path(path).resolve()
    try:
        return p.relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def write_table(table: Mapping, directory: str | os.PathLike | None = None) -> Path:
    """Write a table to <directory>/<device-slug>.json (atomically); returns the path."""
    directory = Path(directory) if directory is not None else tables_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{device_slug(table['device'])}.json"
    return write_atomic(path, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode("utf-8"))


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


def list_tables(directory: str | os.PathLike | None = None) -> list[dict]:
    directory = Path(directory) if directory is not None else tables_dir()
    if not directory.is_dir():
        return []
    return [read_table(p) for p in sorted(directory.glob("*.json"))]


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
    """The table a run asked for: None or 'auto' (load_table: exact → cc → builtin),
    'builtin' (no table: the A arm of a tuned-vs-defaults benchmark), or a table file."""
    if which in (None, "auto"):
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

    An entry applies to the shape and batch bucket it was measured at only: no
    extrapolation to other shapes or buckets."""
    by_batch = table.get("entries", {}).get(kernel, {}).get(shape_key(shape))
    if not by_batch:
        return None
    buckets = table.get("batch_buckets") or BATCH_BUCKETS
    e = by_batch.get(str(batch_bucket(batch, buckets)))
    return None if e is None else Choice(e["variant"], dict(e["config"]))


def show(device: Mapping | None = None, *, directory: str | os.PathLike | None = None,
         current_hash: Callable[[str], str | None] = _current_hash) -> dict:
    """What `memra tune show` prints. With `device` ({'name', 'cc', 'sms'}): the table this
    device would use, its source and stale list. Without (no GPU): every table on disk,
    each with its stale entries, and `stale` their concatenation."""
    if device is not None:
        table, source = load_table(device["name"], device["cc"], sms=device.get("sms"),
                                   directory=directory, current_hash=current_hash)
        return {"gpu": dict(device), "source": source, "tables": [table] if table["path"] else [],
                "stale": table["stale"]}
    tables = list_tables(directory)
    stale = []
    for t in tables:
        t["stale"] = stale_entries(t, current_hash)
        stale.extend({"table": t["path"], **s} for s in t["stale"])
    return {"gpu": None, "source": None, "tables": tables, "stale": stale}


def summarize_table(table: Mapping) -> list[dict]:
    """One flat row per entry (for printing)."""
    rows = []
    for kernel, shapes in sorted(table.get("entries", {}).items()):
        for skey, by_batch in sorted(shapes.items()):
            for b, e in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
                rows.append({"kernel": kernel, "shape": skey, "batch": int(b),
                             "variant": e["variant"], "config": config_key(e["config"]),
                             "median_us": e.get("median_us"), "gbps": e.get("gbps"),
                             "margin": e.get("margin"), "candidates": e.get("candidates")})
    return rows
