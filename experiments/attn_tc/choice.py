#!/usr/bin/env python3
"""The 8B's attn_decode entry chosen by the engine on both depth cells (research/2026-12-04-session31 c/):
one configuration serves every depth (it sets a row's bits), so the A/B (experiments/h200_session31.sh STAGE c:
tg128 at depth 0 and 4,096, the frozen table against tables with only this entry changed) picks the arm of the
least summed step time over the two cells, and this appends it as an engine-choice record (memra.tune.receipts
validate_engine_choice; `gain` = the summed step time's, the objective named in the record), which `memra tune
freeze` lays over the entry while the campaign still freezes it to the A/B's base.

    python3 experiments/attn_tc/choice.py research/2026-12-04-session31/c/bench-choice.jsonl \
        research/tune/engine-choices-nvidia-h200.jsonl
"""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "ctx=64,head_dim=128,n_head=32,n_head_kv=8"
ARMS = {"t64h1": {"ATT_TILE": 64, "ATT_WARPS": 8, "hpb": 1}, "t64h2": {"ATT_TILE": 64, "ATT_WARPS": 8, "hpb": 2}}
DEPTHS = (0, 4096)


def main(bench: str, to: str) -> None:
    sys.path.insert(0, str(ROOT))
    from memra.tune.receipts import validate_engine_choice
    from memra.tune.tables import _current_hash

    step = collections.defaultdict(list)   # (arm, depth) -> µs a token of each run
    for line in open(bench):
        r = json.loads(line)
        step[(r["tag"].split()[2], r["n_depth"])].append(1e6 / r["median_ts"])
    cost = {a: sum(sum(step[(a, d)]) / len(step[(a, d)]) for d in DEPTHS)
            for a in {a for a, _ in step} if all((a, d) in step for d in DEPTHS)}
    for a in sorted(cost, key=cost.get):
        print(f"{a}: " + " + ".join(f"{sum(step[(a, d)]) / len(step[(a, d)]):.2f}" for d in DEPTHS)
              + f" = {cost[a]:.2f} µs")
    win = min(cost, key=cost.get)
    if win == "frozen":
        print("the frozen configuration wins: no record")
        return
    frozen = json.loads((ROOT / "tune/defaults/nvidia-h200.json").read_text())
    entry = frozen["entries"]["attn_decode"][KEY]["1"]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rec = {"schema": 1, "kind": "engine-choice", "device": "NVIDIA H200", "kernel": "attn_decode", "shape_key": KEY,
           "batch": 1, "base_config": entry.get("engine_choice", {}).get("base_config", entry["config"]),
           "config": ARMS[win], "src": "attention.cu", "src_hash": _current_hash("attention.cu"),
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
    main(*sys.argv[1:3])
