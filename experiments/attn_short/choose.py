#!/usr/bin/env python3
"""attn_short's engine choice from h200_session49.sh STAGE s / t's tg128 arms (experiments/h200_common.sh env_arms).

Each arm is an environment setting (MEMRA_ATT_SWITCH0=KEYS[:X=N,...] or MEMRA_ATT_SWITCH=KEYS:X=N,...) run
alternately with the table ("table") on one bench command (model, depth); a receipt's tag is "<command> <arm>". An arm
is chosen for a model when every one of its runs beats the median table run of its command in every command that
measured it (depth 0, and depth 128 where measured); of several, the largest smallest gain at depth 0. The choice
becomes an engine-choice record on the model's attn_decode entry (memra.tune.receipts validate_engine_choice): the
entry's configuration with the arm's `switch0` / `short0` (or `switch` / `short`) laid over it, the depth-0 gain, the
bench receipts as evidence; `memra tune freeze` then lays it over the entry.

    python3 experiments/attn_short/choose.py BENCH.jsonl EVIDENCE_PATH RECORDS.jsonl [--dry]
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# the bench command's model -> the attn_decode entry its decode steps read (head shape at the table's ctx)
ENTRY = {"gemma3-270m": "ctx=64,head_dim=256,n_head=4,n_head_kv=1",
         "synth:llama3-8b:Q4_K_M": "ctx=64,head_dim=128,n_head=32,n_head_kv=8",
         "smollm2-135m": "ctx=64,head_dim=64,n_head=9,n_head_kv=3",
         "synth:llama-1b:Q4_0": "ctx=64,head_dim=64,n_head=32,n_head_kv=8"}


def overlay(arm: str) -> dict:
    """The entry keys an env arm sets: MEMRA_ATT_SWITCH0 -> switch0 (+ short0), MEMRA_ATT_SWITCH -> switch + short."""
    var, _, val = arm.partition("=")
    head, _, rest = val.partition(":")
    over = {k: int(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}
    if var == "MEMRA_ATT_SWITCH0":
        return {"switch0": int(head), **({"short0": over} if over else {})}
    if var == "MEMRA_ATT_SWITCH":
        return {"switch": int(head), "short": over}
    raise SystemExit(f"choose.py: no entry keys for arm {arm!r}")


def runs(bench: Path) -> dict[tuple[str, str], list[float]]:
    """(command, arm) -> the median t/s of each tg128 run."""
    out: dict[tuple[str, str], list[float]] = {}
    for line in bench.read_text().splitlines():
        d = json.loads(line)
        # "tg128" at depth 0, "tg128 @ d128" at depth (session 50's first run read depth 0 alone: the depth
        # cell's loss went unseen and Gemma-3's switch0 was written; the record was taken out by hand)
        if d.get("kind") != "bench" or not str(d.get("test", "")).startswith("tg128") or d.get("gate") != "MATCH":
            continue
        cmd, _, arm = d["tag"].rpartition(" ")
        out.setdefault((cmd, arm), []).append(float(d["median_ts"]))
    return out


def choose(bench: Path) -> dict[str, tuple[str, float, str]]:
    """model -> (arm, depth-0 gain, what was measured), for the models an arm wins on."""
    r = runs(bench)
    by_model: dict[str, dict[str, list[tuple[str, float]]]] = {}
    notes: dict[str, list[str]] = {}
    for (cmd, arm), v in r.items():
        if arm == "table" or (cmd, "table") not in r:
            continue
        base = statistics.median(r[(cmd, "table")])
        gain = min(v) / base - 1
        model = cmd.split()[0]
        by_model.setdefault(model, {}).setdefault(arm, []).append((cmd, gain))
        notes.setdefault(model, []).append(f"{cmd}: table {' / '.join(f'{x:.2f}' for x in r[(cmd, 'table')])} -> "
                                           f"{arm} {' / '.join(f'{x:.2f}' for x in v)} t/s ({100 * gain:+.2f} %)")
    out = {}
    for model, arms in by_model.items():
        ok = {a: next((g for c, g in cells if " -d " not in c), None) for a, cells in arms.items()
              if all(g > 0 for _, g in cells)}
        ok = {a: g for a, g in ok.items() if g is not None}
        if ok:
            a = max(ok, key=ok.get)
            out[model] = (a, ok[a], "; ".join(notes[model]))
    for model, n in notes.items():
        print(f"{model}: {'chosen ' + out[model][0] if model in out else 'nothing chosen'}\n  " + "\n  ".join(n))
    return out


def main() -> int:
    from memra.tune.receipts import git_sha, utc_now, validate_engine_choice

    bench, evidence, records = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    dry = "--dry" in sys.argv
    table = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())
    card = " / ".join(sorted({json.loads(x).get("device", "?") for x in bench.read_text().splitlines()}))
    sess = re.search(r"session(\d+)", evidence)   # the run's session, from its evidence folder
    when = f"session {sess.group(1)}" if sess else evidence
    for model, (arm, gain, what) in choose(bench).items():
        e = table["entries"]["attn_decode"][ENTRY[model]]["1"]
        rec = {"schema": 1, "kind": "engine-choice", "device": table["device"], "kernel": "attn_decode",
               "shape_key": ENTRY[model], "batch": 1, "base_config": e["config"],
               "config": {**e["config"], **overlay(arm)}, "src": e["src"], "src_hash": e["src_hash"],
               "gain": round(gain, 5), "evidence": [evidence], "model": model, "git_sha": git_sha(), "ts": utc_now(),
               "objective": f"tg128, kernels/attn_short.cu ({arm}) against the table, arms alternating on {card} "
                            f"(the H200 table by compute capability; {when}): {what}; the gain is the depth-0 "
                            "cell's smallest run against its median table run"}
        bad = validate_engine_choice(rec)
        if bad:
            raise SystemExit(f"{model}: {bad}")
        print(json.dumps(rec, sort_keys=True))
        if not dry:
            with open(records, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
