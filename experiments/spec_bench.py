"""Plain decode vs speculative decoding, decode tok/s on the GPU, one model load per model.

For each prompt of a prompt set (research/spec-prompts/prompts.jsonl, chat-rendered) the
two arms run interleaved A/B/A/B (plain, then --spec, REPS times) through memra.session.generate,
the same path as `memra run` (plain: the device sampler streaming from chained decode graphs;
spec: drafts verified in one K+1 step each). Every spec run's tokens are compared with the
plain run's (they must be identical; a difference is recorded and counted). One JSONL receipt
line per run, then one summary line per model: the median over prompts of the per-prompt
median tok/s ratio (spec / plain), and the pooled tokens / pooled seconds of each arm.

    python3 experiments/spec_bench.py smollm2-135m --spec lookup --out $OUT/spec-bench.jsonl
    python3 experiments/spec_bench.py gemma3-270m --spec lookup:1-3 --k 6 --reps 3 -n 256

What it showed: (to be filled from the H200 receipts)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _sha() -> str:
    if os.environ.get("MEMRA_GIT_SHA"):
        return os.environ["MEMRA_GIT_SHA"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--spec", default="lookup")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--prompts", default=str(ROOT / "research/spec-prompts/prompts.jsonl"))
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from memra.cli.common import _open
    from memra.gpu.engine import Engine
    from memra.model.config import read_config
    from memra.sampling import Sampler, SamplingParams
    from memra.session import generate, prompt_ids
    from memra.spec.decode import AUTO_MIN_CONF, SpecDecoder, parse_k
    from memra.spec.drafters import make_drafter
    from memra.text.tokenizer import Tokenizer

    name, path, g = _open(a.model)
    cfg = read_config(g)
    tok = Tokenizer.from_gguf(g)
    rows = [json.loads(l) for l in Path(a.prompts).read_text().splitlines() if l.strip()]
    if a.limit:
        rows = rows[: a.limit]
    ids = []
    for r in rows:
        if a.no_chat:
            ids.append(prompt_ids(g, tok, prompt=r["prompt"])[0])
        else:
            ids.append(prompt_ids(g, tok, messages=[{"role": "user", "content": r["prompt"]}])[0])
    n_ctx = min(cfg.n_ctx_train, max(len(i) for i in ids) + a.n + 16)
    eng = Engine(g, cfg, n_ctx=n_ctx)
    k = parse_k(a.k)
    drafter = make_drafter(a.spec, gguf=g, cfg=cfg, device="gpu", n_ctx=n_ctx,
                           min_conf=AUTO_MIN_CONF if k == "auto" else 0.0)
    dev = eng.g.info.name
    out = open(a.out, "a") if a.out else sys.stdout
    base = {"schema": "spec-bench/1", "git": _sha(), "model": name, "device": dev, "drafter": drafter.label,
            "k": k, "n": a.n, "temp": a.temp}

    def one(arm: str, i: int):
        params = SamplingParams(temperature=a.temp, seed=a.seed, max_tokens=a.n)
        spec = SpecDecoder(drafter, k) if arm == "spec" else None
        toks = []
        final = None
        for ev in generate(eng, tok, ids[i], params, n_ctx=n_ctx, sampler=Sampler(params, cfg.n_vocab), spec=spec):
            if ev.done:
                final = ev
                break
            toks.append(ev.token)
        t = final.timings
        return toks, t, (spec.stats.as_dict() if spec else None)

    # warm-up: graphs of both arms captured, kernels loaded
    for arm in ("plain", "spec"):
        one(arm, 0)
    ratios, pooled = [], {"plain": [0, 0.0], "spec": [0, 0.0]}
    diffs = 0
    for i, r in enumerate(rows):
        speeds = {"plain": [], "spec": []}
        ref = None
        for rep in range(a.reps):
            for arm in ("plain", "spec"):
                toks, t, st = one(arm, i)
                if arm == "plain":
                    ref = toks
                same = toks == ref
                diffs += 0 if same else 1
                if t.decode_tok_s:
                    speeds[arm].append(t.decode_tok_s)
                    pooled[arm][0] += t.n_gen - 1
                    pooled[arm][1] += t.decode_s
                line = dict(base, ts=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            prompt=r["id"], kind=r.get("kind"), arm=arm, rep=rep, n_prompt=t.n_prompt,
                            n_gen=t.n_gen, decode_s=t.decode_s, decode_tok_s=t.decode_tok_s,
                            identical_to_plain=same, spec=st)
                print(json.dumps(line), file=out, flush=True)
        if speeds["plain"] and speeds["spec"]:
            ratios.append(statistics.median(speeds["spec"]) / statistics.median(speeds["plain"]))
        print(f"{name} {r['id']:<18} plain {statistics.median(speeds['plain']) if speeds['plain'] else 0:8.1f} "
              f"tok/s  spec {statistics.median(speeds['spec']) if speeds['spec'] else 0:8.1f} tok/s  "
              f"x{ratios[-1] if ratios else 0:.2f}", file=sys.stderr, flush=True)
    summary = dict(base, ts=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), summary=True,
                   prompts=len(rows), reps=a.reps, differences=diffs,
                   median_ratio=statistics.median(ratios) if ratios else None,
                   ratios=[round(x, 4) for x in ratios],
                   pooled_plain_tok_s=pooled["plain"][0] / pooled["plain"][1] if pooled["plain"][1] else None,
                   pooled_spec_tok_s=pooled["spec"][0] / pooled["spec"][1] if pooled["spec"][1] else None)
    print(json.dumps(summary), file=out, flush=True)
    print(f"{name}: median spec/plain x{summary['median_ratio'] or 0:.2f} over {len(rows)} prompts; "
          f"{diffs} runs differed from plain", file=sys.stderr, flush=True)
    drafter.close()
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
