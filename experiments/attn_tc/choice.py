#!/usr/bin/env python3
"""The 8B's attn_decode entry chosen by the engine on both depth cells (research/2026-12-04-session31 c/): one
configuration serves every depth (it sets a row's bits), so an A/B runs tg128 at depth 0 and 4,096 on tables that
differ from the frozen one in this entry only, and the arm of the least summed step time over the two cells wins.
An arm is named by its configuration: t<ATT_TILE>[w<ATT_WARPS>]h<hpb>[r<ATT_RING>] (warps 8 unless given), e.g.
t64h1, t32w4h1, t32h1r2; `frozen` is the table as frozen.

    python3 experiments/attn_tc/choice.py tables /tmp t64h1 t32w4h1          # /tmp/<arm>.json for --tune-table
    python3 experiments/attn_tc/choice.py winner BENCH.jsonl                   # the arm of the least summed time
    python3 experiments/attn_tc/choice.py record research/2026-12-04-session31/c/bench-choice.jsonl \
        research/tune/engine-choices-nvidia-h200.jsonl

`record` appends the winner as an engine-choice record (memra.tune.receipts validate_engine_choice; `gain` = the
summed step time's, the objective named in the record), which `memra tune freeze` lays over the entry while the
campaign still freezes it to the A/B's base. Bench receipts name their arm as the tag's third word
(h200_session31.sh / h200_session33.sh: "attn table ARM dDEPTH").
"""
from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "ctx=64,head_dim=128,n_head=32,n_head_kv=8"
DEPTHS = (0, 4096)
TABLE = ROOT / "tune" / "defaults" / "nvidia-h200.json"


def arm_config(name: str) -> dict:
    """The attn_decode configuration an arm's name spells (t64h1 -> 64-key tiles, 8 warps, 1 head a block)."""
    m = re.fullmatch(r"t(\d+)(?:w(\d+))?h(\d+)(?:r(\d+))?", name)
    if not m:
        raise SystemExit(f"arm {name!r} is not t<tile>[w<warps>]h<hpb>[r<ring>]")
    tile, warps, hpb, ring = m.groups()
    cfg = {"ATT_TILE": int(tile), "ATT_WARPS": int(warps or 8), "hpb": int(hpb)}
    return {**cfg, "ATT_RING": int(ring)} if ring else cfg


def tables(out_dir: str, *arms: str) -> None:
    """out_dir/<arm>.json: the frozen table with only the 8B's entry set to each arm's configuration."""
    for a in arms:
        t = json.loads(TABLE.read_text())
        t["entries"]["attn_decode"][KEY]["1"]["config"] = arm_config(a)
        (Path(out_dir) / f"{a}.json").write_text(json.dumps(t, indent=1))


def step_costs(bench: str) -> tuple[dict, dict]:
    """(arm -> summed µs a token over DEPTHS, (arm, depth) -> µs a token of each run) of an A/B's receipts; arms
    that lack a depth are left out."""
    step = collections.defaultdict(list)
    for line in open(bench):
        r = json.loads(line)
        step[(r["tag"].split()[2], r["n_depth"])].append(1e6 / r["median_ts"])
    cost = {a: sum(sum(step[(a, d)]) / len(step[(a, d)]) for d in DEPTHS)
            for a in {a for a, _ in step} if all((a, d) in step for d in DEPTHS)}
    return cost, step


def record(bench: str, to: str) -> None:
    sys.path.insert(0, str(ROOT))
    from memra.tune.receipts import validate_engine_choice
    from memra.gpu.compile import source_hash

    cost, step = step_costs(bench)
    for a in sorted(cost, key=cost.get):
        print(f"{a}: " + " + ".join(f"{sum(step[(a, d)]) / len(step[(a, d)]):.2f}" for d in DEPTHS)
              + f" = {cost[a]:.2f} µs")
    win = min(cost, key=cost.get)
    if win == "frozen":
        print("the frozen configuration wins: no record")
        return
    frozen = json.loads(TABLE.read_text())
    entry = frozen["entries"]["attn_decode"][KEY]["1"]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rec = {"schema": 1, "kind": "engine-choice", "device": "NVIDIA H200", "kernel": "attn_decode", "shape_key": KEY,
           "batch": 1, "base_config": entry.get("engine_choice", {}).get("base_config", entry["config"]),
           "config": arm_config(win), "src": "attention.cu", "src_hash": source_hash("attention.cu"),
           "gain": round(cost["frozen"] / cost[win] - 1, 5),
           "objective": "tg128 step time summed over depth 0 and 4096", "model": "synthetic llama3-8b Q4_K_M",
           "evidence": [str(Path(bench).resolve().relative_to(ROOT))], "git_sha": sha,
           "ts": max(json.loads(x)["date"] for x in open(bench))}
    problems = validate_engine_choice(rec)
    if problems:
        raise SystemExit("; ".join(problems))
    with open(to, "a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
    print(f"{win}: {rec['config']} over {rec['base_config']}, gain {100 * rec['gain']:+.2f} % -> {to}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["tables"]:
        tables(*sys.argv[2:])
    elif sys.argv[1:2] == ["winner"]:
        c, _ = step_costs(sys.argv[2])
        print(min(c, key=c.get))
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:4])
    else:
        raise SystemExit(__doc__)
