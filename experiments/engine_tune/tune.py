#!/usr/bin/env python3
"""engine_tune — a batch-1 matvec entry chosen by the engine's own tg128, not by its launch timed alone.

The table's matvec entries come from campaigns that time one launch in a graph of copies of itself; in the
decode step a launch overlaps its neighbours instead (PDL), and sessions 24-28 found configurations that win
alone and lose in the engine, and the converse (research/2026-12-04-session28). This takes, for each named
shape, the k fastest configurations its campaign receipts measured (research/tune/*.jsonl at the entry's
src_hash) that differ from the shipped one, and writes one candidate table per (shape, configuration): the
shipped table with only that entry replaced. Bit-neutral: a batch-1 matvec's order depends on K only.

    python3 experiments/engine_tune/tune.py tables OUT_DIR -k 2 'matvec cols=4096,rows=4096,type=Q4_K' ...
        -> OUT_DIR/c<i>/nvidia-h200.json and OUT_DIR/index.json [{name, kernel, shape, config, alone_us, shipped}]
    python3 experiments/engine_tune/tune.py report OUT_DIR BENCH.jsonl...
        -> per candidate: its tg128 runs against the shipped runs (the bench receipts name the table they ran)
    python3 experiments/engine_tune/tune.py choice OUT_DIR NAME research/tune/engine-choices-nvidia-h200.jsonl BENCH...
        -> a winner's engine-choice record, which `memra tune freeze` lays over its entry (memra.tune.freeze
           apply_engine_choices): commit BENCH under research/ first, the record names it as evidence
    python3 experiments/engine_tune/tune.py best OUT_DIR BENCH NAME...   -> the candidate gaining most in every pass
    python3 experiments/engine_tune/tune.py overlay OUT_DIR NAME MODEL KERNEL[,KERNEL]:DEFINE=V[,DEFINE=V] ...
        -> one candidate table OUT_DIR/NAME: every batch-1 entry a decode step of MODEL launches (memra.gpu.plan's
           step, the shipped table) of the named kernels with the defines added (session 46: the PDL trigger
           before the wait, experiments/pdl_early), indexed as a group; `choice` then writes one record per
           entry, all with the group's id, which freeze applies all or none
"""
from __future__ import annotations

import copy
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT))

import mv_tables  # noqa: E402

# matvec.cu's built-in tunable values (a receipt may spell a default out, an entry may leave it implicit)
DEFAULTS = {"MV_NWARPS": 4, "MV_ROWS": 1, "MV_KSPLIT": 1, "MV_UNROLL": 1, "MV_PREFETCH": 0, "MV_XSMEM": 0,
            "MV_PDL_TRIGGER": 1, "MV_WLOAD": 0}


def norm(cfg: dict) -> tuple:
    return tuple(sorted({**DEFAULTS, **cfg}.items()))


def receipts(df, kernel: str, key: str, src_hash: str) -> tuple[dict[tuple, float], dict[tuple, dict]]:
    """From the campaign receipts `df` (memra.tune.receipts.read_receipts, kind tune): (config -> the fastest
    median_us measured for it at batch 1 on this kernel source, config -> the configuration as a receipt spelled it:
    what a table entry must say, since the launcher lays an entry over the shape's built-in configuration, whose
    values differ from matvec.cu's defaults)."""
    rows = df[(df["kernel"] == kernel) & (df["shape_key"] == key) & (df["batch"] == 1) & (df["ok"] == True)  # noqa: E712
              & (df["src_hash"] == src_hash)]
    best: dict[tuple, float] = {}
    spelled: dict[tuple, dict] = {}
    for cfg, us in zip(rows["config"], rows["median_us"]):
        c = norm(cfg)
        best[c] = min(best.get(c, float("inf")), float(us))
        spelled.setdefault(c, dict(cfg))
    return best, spelled


def tables(out: Path, k: int, selections: list[str]) -> None:
    from memra.tune.receipts import read_receipts

    df = read_receipts(ROOT / "research" / "tune", kinds=("tune",))
    shipped = json.loads(mv_tables.SHIPPED.read_text())
    index = []
    for sel in selections:
        kernel, key = sel.split(" ", 1)
        e = shipped["entries"][kernel][key]["1"]
        got, spelled = receipts(df, kernel, key, e["src_hash"])
        mine = norm(e["config"])
        ranked = sorted((us, c) for c, us in got.items() if c != mine)[:k]
        print(f"{sel}: shipped {dict(mine)} {got.get(mine, float('nan')):.2f} us alone; {len(got)} configurations")
        for us, c in ranked:
            name = f"c{len(index)}"
            t = copy.deepcopy(shipped)
            t["entries"][kernel][key]["1"]["config"] = spelled[c]
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "nvidia-h200.json").write_text(json.dumps(t, indent=1, sort_keys=True))
            index.append({"name": name, "kernel": kernel, "shape": key, "config": dict(c), "alone_us": us,
                          "shipped": dict(mine), "shipped_alone_us": got.get(mine), "table_config": spelled[c],
                          "base_config": e["config"], "device": shipped["device"], "src": e["src"],
                          "src_hash": e["src_hash"]})
            print(f"  {name}: {dict(c)} {us:.2f} us alone")
    (out / "index.json").write_text(json.dumps(index, indent=1))


def overlay(out: Path, name: str, model: str, rules: list[str]) -> None:
    """Candidate NAME: the shipped table with `rules`' defines added to the batch-1 entries of MODEL's decode step
    (rule 'matvec,matvec_glu:MV_PDL_TRIGGER=2'); an entry the step launches without one in the table is listed and
    left out (a choice needs an entry to lay over). Each member keeps the device that timed its entry (the table's,
    or a stand-in's `measured_on`): its choice record names that device, as freeze requires, and says in its
    objective which card the A/B ran on."""
    from memra.gpu.plan import Planner
    from memra.tune.launches import launch_set, model_specs, unexecuted_entries
    from memra.tune.receipts import shape_key

    adds: dict[str, dict] = {}
    for r in rules:
        kernels, defs = r.split(":", 1)
        d = {k: int(v) for k, v in (x.split("=", 1) for x in defs.split(","))}
        for k in kernels.split(","):
            adds.setdefault(k, {}).update(d)
    specs, missing = model_specs([model])
    if missing:
        raise SystemExit(f"overlay: {missing[0]}")
    shipped = json.loads(mv_tables.SHIPPED.read_text())
    plan = Planner(specs[0], shipped, path="q8", sms=int(shipped.get("sms") or 132))
    t = copy.deepcopy(shipped)
    members, absent, seen = [], [], set()
    for L in plan.step(1, decode=True, sampler="none"):
        key = shape_key(L.shape)
        if L.kernel not in adds or (L.kernel, key) in seen:
            continue
        seen.add((L.kernel, key))
        e = t["entries"].get(L.kernel, {}).get(key, {}).get("1")
        if e is None:
            absent.append(f"{L.kernel} {key}")
            continue
        base = dict(e["config"])
        e["config"] = {**base, **adds[L.kernel]}
        members.append({"kernel": L.kernel, "shape": key, "base_config": base, "table_config": dict(e["config"]),
                        "src": e["src"], "src_hash": e["src_hash"],
                        "device": e.get("measured_on", shipped["device"])})
    if not members:
        raise SystemExit(f"overlay: no entry of {sorted(adds)} in {model}'s decode step")
    # the members as the engine launches them (kernel-check's launch cases of the model under t): a rule whose
    # define a launcher drops would A/B the shipped kernel
    mine = {"entries": {}}
    for m in members:
        mine["entries"].setdefault(m["kernel"], {})[m["shape"]] = {"1": t["entries"][m["kernel"]][m["shape"]]["1"]}
    dropped = unexecuted_entries(mine, launch_set(specs, [t], int(t.get("sms") or 132), other_entries=False).values())
    if dropped:
        raise SystemExit(f"overlay: the engine would launch {', '.join(dropped)} without the rule's defines (its "
                         "launcher drops them): the A/B would time the shipped kernel")
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "nvidia-h200.json").write_text(json.dumps(t, indent=1, sort_keys=True))
    idx = json.loads((out / "index.json").read_text()) if (out / "index.json").exists() else []
    idx = [i for i in idx if i["name"] != name] + [{"name": name, "group": True, "model": model, "rules": rules,
                                                     "device": shipped["device"], "entries": members}]
    (out / "index.json").write_text(json.dumps(idx, indent=1))
    print(f"{name}: {len(members)} entries of {model} ({', '.join(sorted({m['kernel'] for m in members}))})"
          + (f"; without a table entry, left as they are: {', '.join(absent)}" if absent else ""))


def _tg128_rows(benches: list[str]):
    """memra's tg128 bench receipts in these files."""
    for f in benches:
        for line in Path(f).read_text().splitlines():
            d = json.loads(line) if line.strip() else {}
            if d.get("test") == "tg128" and d.get("engine") == "memra":
                yield d


def tg128(out: Path, benches: list[str]) -> dict[str, list[float]]:
    """'MODEL|NAME' -> the tg128 medians of the runs whose table was OUT/NAME/... ('shipped': any other)."""
    runs: dict[str, list[float]] = {}
    for d in _tg128_rows(benches):
        tb = Path(str(d.get("table") or "").removeprefix("file:"))
        name = tb.parent.name if tb.parent.parent.name == out.name else "shipped"   # OUT/<name>/<device>.json
        runs.setdefault(f"{d['model']}|{name}", []).append(d["median_ts"])
    return runs


def _gain(runs: dict[str, list[float]], name: str) -> tuple[str, float] | None:
    """(model, gain) of candidate NAME: its smallest run over the median shipped run of its model, less 1 (positive
    only when every pass gains); None without runs of both."""
    for key, v in runs.items():
        model, n = key.split("|")
        if n == name and runs.get(f"{model}|shipped"):
            return model, min(v) / statistics.median(runs[f"{model}|shipped"]) - 1
    return None


def choice(out: Path, name: str, benches: list[str], to: Path) -> None:
    """Append candidate NAME's engine-choice record (memra.tune.receipts validate_engine_choice) to `to`: its
    entry's configuration against the shipped one, the tg128 gain its runs in BENCH show (every pass must
    gain: the smallest ratio of a candidate run to the median shipped run is the gain recorded). An overlay
    candidate writes one record per entry, all with one `group` id and the set's gain."""
    from memra.tune.receipts import git_sha, utc_now

    c = next(i for i in json.loads((out / "index.json").read_text()) if i["name"] == name)
    model, gain = _gain(tg128(out, benches), name) or (None, 0.0)
    if gain <= 0:
        raise SystemExit(f"{name}: no gain in every pass ({gain:+.2%}): no choice recorded")
    ts = utc_now()
    members = c["entries"] if c.get("group") else [c]
    group = f"{name} {model} {ts}" if c.get("group") else None
    cards = sorted({d.get("device") for d in _tg128_rows(benches) if d["model"] == model} - {None})
    objective = (f"tg128 of {model}, the group's {len(members)} entries changed together, on {' / '.join(cards)}"
                 if group else None)
    with open(to, "a") as f:
        for m in members:
            rec = {"schema": 1, "kind": "engine-choice", "device": m.get("device", c["device"]), "kernel": m["kernel"],
                   "shape_key": m["shape"], "batch": 1, "base_config": m["base_config"], "config": m["table_config"],
                   "src": m["src"], "src_hash": m["src_hash"], "gain": round(gain, 5),
                   "evidence": [str(Path(b)) for b in benches], "model": model, "git_sha": git_sha(), "ts": ts}
            if group:
                rec["group"], rec["objective"] = group, objective
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    print(f"{name}: {len(members)} record(s), {gain:+.2%} on {model} -> {to}")


def best(out: Path, benches: list[str], names: list[str]) -> str:
    """Of candidates `names` (one model's), the one whose every run beats the median shipped run by the most, or ''
    when none gains in every pass."""
    runs = tg128(out, benches)
    gains = {n: g[1] for n in names if (g := _gain(runs, n))}
    n, g = max(gains.items(), key=lambda kv: kv[1]) if gains else ("", 0.0)
    return n if g > 0 else ""


def report(out: Path, benches: list[str]) -> None:
    """Each bench receipt's `table` ("file:PATH") names the table it ran: OUT_DIR/<name>/... or another (shipped)."""
    runs = tg128(out, benches)
    for key, v in sorted(runs.items()):
        model, name = key.split("|")
        base = runs.get(f"{model}|shipped")
        rel = f"{100 * (statistics.median(v) / statistics.median(base) - 1):+.2f} %" if base and name != "shipped" else ""
        print(f"{model:40s} {name:8s} {' / '.join(f'{x:.1f}' for x in v):30s} {rel}")


if __name__ == "__main__":
    cmd, out, *rest = sys.argv[1:]
    if cmd == "tables":
        kk = 2
        if rest[:1] == ["-k"]:
            kk, rest = int(rest[1]), rest[2:]
        tables(Path(out), kk, rest)
    elif cmd == "choice":   # choice OUT NAME TO BENCH...
        choice(Path(out), rest[0], rest[2:], Path(rest[1]))
    elif cmd == "best":   # best OUT BENCH NAME...: prints the winner's name (or nothing)
        print(best(Path(out), [rest[0]], rest[1:]))
    elif cmd == "overlay":   # overlay OUT NAME MODEL RULE...
        overlay(Path(out), rest[0], rest[1], rest[2:])
    else:
        report(Path(out), rest)
