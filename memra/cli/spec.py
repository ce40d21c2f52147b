"""`memra spec-check` (registered on memra.cli.common.app): the speculative decoding gate.
Results on stdout, logs on stderr, as everywhere in the CLI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from memra.cli.common import ModelArg, pick_device, _open, app, command, log
from memra.errors import CudaError, MemraError


def _parse_ks(text: str) -> list:
    """'1-8' | '1,2,4' | '1-8,auto' -> [1, ..., 8, 'auto']."""
    ks: list = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if part == "auto":
            ks.append("auto")
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise MemraError(f"--k takes K values like 1-8, 1,2,4 or 1-8,auto, got {text!r}") from None
        if not 1 <= a <= b <= 32:
            raise MemraError(f"--k values must be in 1..32, got {text!r}")
        ks.extend(range(a, b + 1))
    if not ks:
        raise MemraError("--k: no K values given")
    return ks


def _engine(device: str, g, cfg, n_ctx: int):
    if device == "cpu":
        from memra.serve.cpu_engine import CpuRunner

        return CpuRunner(g, cfg, max_len=n_ctx, max_seqs=2)
    from memra.gpu import cuda

    if not cuda.has_gpu():
        raise CudaError("--device gpu: no NVIDIA GPU (or driver) found on this machine; use --device cpu")
    from memra.gpu.runner import Runner

    return Runner(g, cfg, max_len=n_ctx, max_seqs=2)


@app.command("spec-check")
@command
def spec_check(
    model: ModelArg = None,
    spec: Annotated[str, typer.Option("--spec", help="The drafter: lookup[:N1-N2], trim[:L] or "
                                      "draft:PATH.")] = "lookup",
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt file: JSONL with a \"prompt\" "
                                                    "a line, or text with one prompt a line (default: a "
                                                    "built-in set of three).")] = None,
    n: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens generated per prompt.")] = 32,
    ks: Annotated[str, typer.Option("--k", help="Draft lengths to check: 1-8, 1,2,4, 1-8,auto.")] = "1-8",
    chat: Annotated[bool, typer.Option("--chat", help="Wrap each prompt as a user turn in the model's "
                                       "chat template.")] = False,
    greedy_only: Annotated[bool, typer.Option("--greedy-only", help="Skip the seeded temperature-0.8 "
                                              "pass.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of prompt 0 in the seeded pass (prompt i "
                                      "uses seed + i).")] = 1234,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or gpu (default: gpu when "
                                                  "the GPU engine and a GPU are present).")] = None,
    canary: Annotated[bool, typer.Option("--canary", help="Verify with the broken verifier (it accepts "
                                         "one rejected draft token): the check must end red.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the cells, the first "
                                          "difference, the canary) after the lines.")] = False,
) -> None:
    """Speculative decoding gate: every prompt at K = 1..8, greedy and seeded (temperature 0.8),
    compared token for token with plain decode. Ends ALL IDENTICAL or exits 1 naming the first
    difference; a green run also runs its canary, which must turn red."""
    from memra.model.config import read_config
    from memra.session import prompt_ids as session_prompt
    from memra.spec.check import read_prompts, run_check
    from memra.spec.drafters import make_drafter, parse_spec
    from memra.text.tokenizer import Tokenizer

    device = pick_device(device)
    if n < 1:
        raise MemraError(f"-n must be at least 1, got {n}")
    parse_spec(spec)
    k_list = _parse_ks(ks)
    texts = read_prompts(prompts)
    name, path, g = _open(model)
    cfg = read_config(g)
    tok = Tokenizer.from_gguf(g)
    ids = []
    for i, t in enumerate(texts):
        msgs = [{"role": "user", "content": t}] if chat else None
        ids.append(session_prompt(g, tok, prompt=None if chat else t, messages=msgs)[0])
        if not ids[-1]:
            raise MemraError(f"prompt {i + 1} ({t!r}) is empty after tokenization (this model adds no BOS)")
    n_ctx = min(cfg.n_ctx_train, max(len(i) for i in ids) + n + 1)
    t0 = time.perf_counter()
    engine = _engine(device, g, cfg, n_ctx)
    drafter = make_drafter(spec, gguf=g, cfg=cfg, device=device, n_ctx=n_ctx,
                           target=getattr(engine, "model", None))
    log.info("loaded %s on %s in %.2f s", name, device, time.perf_counter() - t0)
    modes = ("greedy",) if greedy_only else ("greedy", "seeded")
    print(f"spec-check {name} on {device}: {drafter.label}, {len(ids)} prompts x {n} tokens, K "
          f"{ks}, {' and '.join(modes)}{' (temperature 0.8)' if not greedy_only else ''}"
          f"{' — CANARY: a verifier that accepts one wrong token' if canary else ''}", flush=True)

    def on_cell(cell):
        print("  " + cell.line(), flush=True)

    try:
        rep = run_check(engine, drafter, ids, n, k_list, modes=modes, canary=canary, seed=seed, on_cell=on_cell)
    finally:
        drafter.close()
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"model": name, "path": str(path), "device": device, "drafter": drafter.label,
                          "n": n, "prompts": len(ids), "ks": k_list, "modes": list(modes), "canary_run": canary,
                          "cells": [asdict(c) for c in rep.cells],
                          "first_difference": asdict(rep.first) if rep.first else None,
                          "identical": rep.identical, "canary": rep.canary}), flush=True)
    if not rep.identical:
        print(rep.first.line(tok, texts), flush=True)
        raise typer.Exit(1)
    if rep.canary == "red":
        print("canary: a verifier that accepts one wrong token turns this check red, as it must", flush=True)
    elif rep.canary == "missed":
        print("canary MISSED: the broken verifier's output compared identical; this check is blind", flush=True)
        raise typer.Exit(1)
    else:
        print("canary: silent (no draft token was ever rejected, so the broken verifier had nothing to "
              "accept)", flush=True, file=sys.stderr)
    print("ALL IDENTICAL", flush=True)
