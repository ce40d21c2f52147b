"""Candidate tables for decode-matvec engine A/Bs (experiments/mv_preload, experiments/mv_early): the shipped H200
table with extra -D tunables laid over the batch-1 matvec / matvec_glu entries a group picks, nothing else changed.

    write(out_dir, {"group": pick})   -> out_dir/<group>/nvidia-h200.json
pick(kernel, shape) returns the tunables to add to that entry ({} or None: leave it)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from memra.tune.receipts import shape_key, shape_of_key  # noqa: E402

SHIPPED = ROOT / "tune" / "defaults" / "nvidia-h200.json"


def shape(key: str) -> dict:
    """'cols=4096,rows=6144,type=Q8_0' -> {'cols': 4096, 'rows': 6144, 'type': 'Q8_0'}"""
    return {k: (v if k == "type" else int(v)) for k, v in shape_of_key(key).items()}


def mid_size(kernel: str, s: dict) -> bool:
    """The 8B's 4096-wide non-GLU matvecs short of the LM head: attn_output, QKV and its parts."""
    return kernel == "matvec" and s["cols"] == 4096 and s["rows"] < 100_000


def write(out: Path, groups: dict[str, Callable[[str, dict], dict | None]]) -> None:
    for group, pick in groups.items():
        t = json.loads(SHIPPED.read_text())
        n = 0
        for kernel in ("matvec", "matvec_glu"):
            for key, buckets in t["entries"][kernel].items():
                e = buckets.get("1")
                if e and (extra := pick(kernel, shape(key))):
                    e["config"] = {**e["config"], **extra}
                    n += 1
                    print(f"{group}: {kernel} {key} {e['config']}")
        d = out / group
        d.mkdir(parents=True, exist_ok=True)
        (d / "nvidia-h200.json").write_text(json.dumps(t, indent=1, sort_keys=True))
        print(f"{group}: {n} entries -> {d / 'nvidia-h200.json'}")


def main(argv: list[str]) -> None:
    """python3 experiments/mv_tables.py OUT_DIR GROUP 'KERNEL SHAPE_REGEX' KEY=VALUE...: one candidate group whose
    batch-1 entries of KERNEL (matvec or matvec_glu) with a shape key matching SHAPE_REGEX whole get KEY=VALUE."""
    out, group, sel, *sets = argv
    kernel, rx = sel.split(" ", 1)
    extra = {k: int(v) for k, v in (s.split("=", 1) for s in sets)}
    write(Path(out), {group: lambda kn, s: extra if kn == kernel and re.fullmatch(rx, shape_key(s)) else {}})


if __name__ == "__main__":
    main(sys.argv[1:])
