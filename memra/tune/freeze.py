"""Making a per-device default table: `freeze` receipts into winners, `write_table`, and
what `memra tune show` prints (`show`, `summarize_table`).

`freeze` turns receipts (see memra.tune.receipts) into `tune/defaults/<device-slug>.json`:
for each kernel, shape (without batch) and decode batch bucket, the fastest configuration
that passed its check, with the source hash it was measured on, the receipt it came from
and its margin over the runner-up. Reading a table at start-up is memra.tune.tables (the
floor below the engine); this half sits above it, beside the tune harness.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Mapping

from memra.atomic import write_atomic
from memra.errors import MemraError
from memra.paths import home_tables_dir, project_root
from memra.tune.receipts import config_key, git_sha, utc_now
from memra.tune.tables import (BATCH_BUCKETS, TABLE_FORMAT, _current_hash, batch_bucket, device_slug,
                               list_tables, load_table, stale_entries)

log = logging.getLogger("memra.tuning")


def timing_of(receipts):
    """Each receipt's timing ("pdl": launched with programmatic dependent launches, memra tune run
    --pdl; "": plain launches, every receipt before the field existed) as a Series of strings."""
    import pandas as pd

    if "timing" not in receipts:
        return pd.Series("", index=receipts.index)
    return receipts["timing"].map(lambda v: v if isinstance(v, str) else "")


def select_timing(receipts, pdl: bool, match: str | None = None):
    """The receipts a freeze compares. Plain (`pdl` false): the plain-timed ones alone. PDL: for
    each device, kernel, shape and batch that has PDL-timed receipts, those alone; elsewhere the
    plain ones (a table needs every family, a PDL campaign times some). Within one entry the two
    timings are never compared. `match` (a regular expression, whole-matched against "kernel
    shape_key", e.g. "matvec cols=2048,rows=2048,type=Q4_0") limits the PDL-timed receipts to the
    entries it names; the plain ones everywhere else."""
    t = timing_of(receipts)
    if not pdl or receipts.empty:
        return receipts[t == ""]
    use = t == "pdl"
    if match is not None:
        rx = re.compile(match)
        use &= (receipts["kernel"].astype(str) + " " + receipts["shape_key"].astype(str)).map(
            lambda k: rx.fullmatch(k) is not None)
    key = receipts[["device", "kernel", "shape_key"]].astype(str).agg("|".join, axis=1) \
        + "|" + receipts["batch"].astype(str)
    return receipts[use | ((t == "") & ~key.isin(set(key[use])))]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def freeze(receipts, device: str, *, current_hashes: Mapping[str, str] | None = None,
           buckets: Iterable[int] = BATCH_BUCKETS, root: Path | None = None,
           builtin=None, min_gain: float = 0.0, keep=None,
           entry_src: Mapping[str, tuple[str, str | None]] | None = None,
           stand_ins: Iterable[str] = ()) -> dict:
    """The default table for `device` from a receipts DataFrame (memra.tune.receipts.read_receipts).

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

    keep(receipt row) -> bool, when given, leaves out the rows it rejects (memra.tune.measure.
    reached: a dispatch job at a row count the engine never launches for its shape).

    entry_src maps a kernel whose entries compare receipts of several kernel files to the
    (src, src_hash) its entries carry instead of the winner's (memra.tune.dispatch.entry_src:
    a dispatch receipt names its path's file, the entry all three).

    stand_ins names other devices of the same compute capability and SM count (an H100 for the
    H200) whose current receipts fill the kernel, shape and batch buckets `device` has no current
    receipts of its own for; such an entry says so (`measured_on`: the device that timed it).
    """
    import pandas as pd

    buckets = tuple(sorted(buckets))
    df = receipts[receipts["device"] == device]
    if df.empty:
        seen = sorted(set(receipts["device"])) if len(receipts) else []
        raise MemraError(f"no receipts for device {device!r}"
                         + (f" (receipts name: {', '.join(seen)})" if seen else ""))
    stand_ins = [d for d in dict.fromkeys(stand_ins) if d != device]
    others = receipts[receipts["device"].isin(stand_ins)]
    if stand_ins:
        cc, sms = str(df.iloc[0]["cc"]), int(df.iloc[0]["sms"])
        for d in stand_ins:
            o = others[others["device"] == d]
            if o.empty:
                raise MemraError(f"--stand-in {d!r}: no receipts of that device")
            if set(o["cc"].astype(str)) != {cc} or set(o["sms"].astype(int)) != {sms}:
                raise MemraError(f"--stand-in {d!r}: not a part like {device!r} (compute capability {cc}, "
                                 f"{sms} SMs); its receipts say cc {sorted(set(o['cc'].astype(str)))}, "
                                 f"SMs {sorted(set(o['sms'].astype(int)))}")
    both = pd.concat([df, others]) if len(others) else df
    if current_hashes is None:
        latest = both.sort_values("ts").groupby("src")["src_hash"].last()
        current_hashes = latest.to_dict()
    current = df["src_hash"] == df["src"].map(current_hashes)
    if (~current).any():
        log.info("freeze: ignoring %d receipts measured on older kernel source", int((~current).sum()))
    df = df[current]
    if len(others):
        others = others[others["src_hash"] == others["src"].map(current_hashes)]

        def _slot(r) -> tuple:
            return r["kernel"], r["shape_key"], batch_bucket(int(r["batch"]), buckets)

        own = set(df.apply(_slot, axis=1)) if len(df) else set()
        fill = others[~others.apply(_slot, axis=1).isin(own)] if len(others) else others
        if len(fill):
            log.info("freeze: %d receipts of %s stand in for %s", len(fill), ", ".join(stand_ins), device)
            df = pd.concat([df, fill])
    if keep is not None and len(df):
        reach = df.apply(lambda r: bool(keep(r)), axis=1)
        if (~reach).any():
            log.info("freeze: leaving out %d receipts of launches no step makes", int((~reach).sum()))
        df = df[reach]

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
            if entry_src and kernel in entry_src:
                entry["src"], entry["src_hash"] = entry_src[kernel]
            if kept:
                entry["kept_builtin"] = True
            if win["device"] != device:
                entry["measured_on"] = win["device"]
            if win.get("timing") == "pdl":  # timed as programmatic dependent launches (tune run --pdl)
                entry["timing"] = "pdl"
            if len(cands) > 1:
                r_score, r_variant, _, r_row, _ = cands[1]
                entry["margin"] = r_score / score - 1.0
                entry["runner_up"] = {"variant": r_variant, "config": dict(r_row["config"]),
                                      "median_us": r_score}
            entries.setdefault(kernel, {}).setdefault(skey, {})[str(bucket)] = entry
    sources = {src: h for src, h in sorted(current_hashes.items()) if src in set(df["src"])}
    for kernel, (src, h) in (entry_src or {}).items():
        if kernel in entries:
            sources[src] = h
    return {
        "format": TABLE_FORMAT,
        "device": device,
        "cc": first["cc"],
        "sms": int(first["sms"]),
        "nvrtc": first["nvrtc"],
        "frozen_at": utc_now(),
        "git_sha": git_sha(),
        "receipts": sorted({_rel(f, root) for f in receipts[receipts["device"] == device]["file"]}
                           | {_rel(f, root) for f in df[df["device"] != device]["file"]}),
        "batch_buckets": list(buckets),
        "sources": sources,
        "entries": entries,
        "no_winner": no_winner,
    }


def apply_engine_choices(table: dict, choices: Iterable[Mapping], current_hash: Callable[[str], str | None],
                         root: Path | None = None, stand_ins: Iterable[str] = ()) -> list[str]:
    """Lay engine-choice records (memra.tune.receipts validate_engine_choice) of the table's device over
    the entries they name, in time order; returns one note per record. A record applies when its entry
    exists, its kernel source is the current one and the entry's frozen configuration is the record's
    `base_config` (what the engine A/B ran against); else the entry keeps the campaign's choice and the
    note says why (re-run the A/B). Records sharing a `group` (several entries changed together in one
    A/B: the gain was measured for the set) apply all or none: one member that cannot apply keeps every
    member's entry as the campaign froze it. An applied entry's `config` becomes the record's and it gains
    `engine_choice` (base_config, gain, evidence, receipt, group); its timing fields stay the base
    configuration's, timed alone: a launch's time alone is not what the choice was made on. Apply them
    before memra.tune.dispatch.launched_keep: a dispatch choice timed with the base configuration no
    longer times a launch the engine makes. A stand-in device's records (freeze's stand_ins) apply to the
    entries its receipts made (`measured_on` it) only."""
    root = root or project_root()
    devices = {table["device"], *stand_ins}
    mine = sorted((c for c in choices if c["device"] in devices), key=lambda c: str(c["ts"]))

    def what(c) -> str:
        return f"engine choice {c['kernel']} {c['shape_key']} batch {c['batch']}"

    def objective(c) -> str:
        return c["objective"] if isinstance(c.get("objective"), str) else "tg128"

    def group(c) -> str | None:   # a records DataFrame gives NaN where a record has none
        return c["group"] if isinstance(c.get("group"), str) and c["group"] else None

    def check(tbl: dict, c) -> tuple[dict | None, str | None]:
        b = str(batch_bucket(int(c["batch"]), tbl["batch_buckets"]))
        entry = tbl["entries"].get(c["kernel"], {}).get(c["shape_key"], {}).get(b)
        if entry is None:
            return None, "the table has no such entry"
        if entry.get("measured_on", tbl["device"]) != c["device"]:
            return None, f"it was made on {c['device']}, the entry on {entry.get('measured_on', tbl['device'])}"
        if current_hash(c["src"]) != c["src_hash"]:
            return None, f"{c['src']} changed since the A/B (re-run it)"
        if dict(entry["config"]) != dict(c["base_config"]):
            return None, (f"the entry's configuration {dict(entry['config'])} is not the A/B's base "
                          f"{dict(c['base_config'])} (re-run it)")
        return entry, None

    def lay(tbl: dict, blocked: Mapping[str, str]) -> list[tuple[Mapping, str | None]]:
        """Each record in time order against tbl as the earlier ones left it: (record, why it did not apply)."""
        out = []
        for c in mine:
            g = group(c)
            entry, why = check(tbl, c)
            if why is None and g in blocked:
                why = f"its group {g!r} is not whole ({blocked[g]})"
            if why is None:
                entry["config"] = dict(c["config"])
                entry["engine_choice"] = {"base_config": dict(c["base_config"]), "gain": float(c["gain"]),
                                          "objective": objective(c), "evidence": list(c["evidence"]),
                                          "receipt": f"{_rel(c['file'], root)}:{int(c['line'])}" if "file" in c
                                          else None}
                if g:
                    entry["engine_choice"]["group"] = g
            out.append((c, why))
        return out

    # with groups, a dry pass on a copy finds those with a member that cannot apply; the real pass leaves them out
    blocked: dict[str, str] = {}
    for c, why in lay(copy.deepcopy(table), {}) if any(group(c) for c in mine) else ():
        if why and group(c) and group(c) not in blocked:
            blocked[group(c)] = f"{what(c)}: {why}"
    notes = []
    for c, why in lay(table, blocked):
        g = group(c)
        if why:
            notes.append(f"{what(c)}: not applied, {why}")
        else:
            notes.append(f"{what(c)}: {dict(c['config'])} (engine {objective(c)} {100 * float(c['gain']):+.1f} % over "
                         f"{dict(c['base_config'])}{f', group {g!r}' if g else ''})")
    return notes


def _opt(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _rel(path, root: Path) -> str:
    p = Path(path).resolve()
    try:
        return p.relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def write_table(table: Mapping, directory: str | os.PathLike | None = None) -> Path:
    """Write a table to <directory>/<device-slug>.json (atomically); returns the path.
    Default directory: $MEMRA_HOME/tables (the source tree's tune/defaults/ only when named)."""
    directory = Path(directory) if directory is not None else home_tables_dir()
    if directory.exists() and not directory.is_dir():
        raise MemraError(f"{directory} is not a folder (a table goes to <folder>/<device>.json)")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{device_slug(table['device'])}.json"
    return write_atomic(path, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def show(device: Mapping | None = None, *, directory: str | os.PathLike | None = None,
         current_hash: Callable[[str], str | None] = _current_hash) -> dict:
    """What `memra tune show` prints. With `device` ({'name', 'cc', 'sms'}): the table this
    device would use, its source and stale list. Without (no GPU): every table on disk,
    each with its stale entries, and `stale` their concatenation. A `directory` that is not a
    folder is a MemraError (not an empty list: "stale: none" would read as a clean table)."""
    if directory is not None and not Path(directory).is_dir():
        raise MemraError(f"--dir {directory}: " + ("not a folder" if Path(directory).exists() else "no such folder"))
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
                             "margin": e.get("margin"), "candidates": e.get("candidates"),
                             "timing": e.get("timing", "plain")
                             + (f", engine {100 * e['engine_choice']['gain']:+.1f} %" if e.get("engine_choice") else "")})
    return rows
