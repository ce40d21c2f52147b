"""The speculative decoding gate (`memra spec-check`): a prompt set decoded at K = 1..8,
greedy and seeded at temperature 0.8, every output compared token for token with plain
decode on the same engine (one token fed and one chosen per step, the decode path). It ends
ALL IDENTICAL or names the first difference. Its canary, a verifier that accepts one
rejected draft token, must turn it red: the gate runs the canary itself after a green run
and reports whether it fired and was caught (a check that cannot see a wrong token is no
check).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from memra.errors import MemraError
from memra.paths import read_text
from memra.spec.decode import DeviceTarget, KPolicy, SpecStats, plain_stream, spec_stream

# input-grounded prompts (the text to continue is in the prompt), so lookup has something
# to find; research/spec-prompts/ holds the benchmark set
BUILTIN_PROMPTS = [
    "Rewrite the sentence in the past tense.\nSentence: The cat sits on the mat and watches the birds "
    "in the garden.\nPast tense: The cat",
    "Copy the function and rename `total` to `acc`.\n\ndef add_all(xs):\n    total = 0\n    for x in xs:\n"
    "        total += x\n    return total\n\nRenamed:\n\ndef add_all(xs):\n",
    "Summarize: The meeting moved from Monday to Wednesday because the projector in room 4 is broken; "
    "room 4 will be repaired on Tuesday.\nSummary: The meeting",
]

GREEDY_SEED = None
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


@dataclass
class Cell:
    mode: str  # "greedy" | "seeded"
    k: object
    prompts: int = 0
    identical: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        rate = f"{100 * self.accepted / self.drafted:.0f}%" if self.drafted else "-"
        return (f"K={self.k!s:<4} {self.mode:<6}  {self.identical}/{self.prompts} identical · {self.tokens} tokens "
                f"in {self.steps} steps · accepted {self.accepted}/{self.drafted} ({rate}) · {self.seconds:.2f} s")


@dataclass
class Difference:
    prompt: int
    mode: str
    k: object
    index: int
    spec_token: int | None
    plain_token: int | None

    def line(self, tokenizer=None, prompts=None) -> str:
        def piece(t):
            if t is None:
                return "(none: the output ended)"
            if tokenizer is None:
                return str(t)
            return f"{t} {tokenizer.token_bytes(t).decode('utf-8', 'replace')!r}"
        where = f"prompt {self.prompt}"
        if prompts is not None:
            where += f" ({_short(prompts[self.prompt])!r})"
        return (f"DIFFERENT: {where}, {self.mode}, K={self.k}: generated token {self.index} is "
                f"{piece(self.spec_token)} with speculation, {piece(self.plain_token)} in plain decode")


@dataclass
class Report:
    cells: list[Cell] = field(default_factory=list)
    first: Difference | None = None
    canary: str | None = None  # "red" | "silent" (never fired) | "missed" (fired, not caught) | None

    @property
    def identical(self) -> bool:
        return self.first is None


def _short(s: str, n: int = 48) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            return i
    return None


def read_prompts(path: str | Path | None) -> list[str]:
    """A prompt file: JSONL ({"prompt": ...} a line) or plain text, one prompt a line (a
    literal \\n inside a line is a newline)."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    p = Path(path)
    text = read_text(p, f"--prompts {path}")
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            prompt = doc.get("prompt") if isinstance(doc, dict) else doc
            if not isinstance(prompt, str):
                raise MemraError(f"--prompts {path}:{i}: not a JSON object with a \"prompt\" string")
            out.append(prompt)
        else:
            out.append(line.replace("\\n", "\n"))
    if not out:
        raise MemraError(f"--prompts {path}: no prompts in the file")
    return out


def samplings(seed: int = 1234):
    from memra.gpu.runner import Sampling

    return [("greedy", lambda i: Sampling(0.0)),
            ("seeded", lambda i: Sampling(SAMPLED["temperature"], SAMPLED["top_k"], SAMPLED["top_p"],
                                          SAMPLED["min_p"], seed + i))]


def run_check(engine, drafter, prompts: list[list[int]], n: int, ks, *, modes=("greedy", "seeded"),
              canary: bool = False, seed: int = 1234, on_cell=None, self_canary: bool = True) -> Report:
    """Compare speculative with plain decode for every prompt (token ids), mode and K.
    canary: run every cell with the broken verifier (the result must be a difference).
    self_canary: after an all-identical run, run the canary at the largest K and record
    whether it was caught (report.canary)."""
    rep = Report()
    sm_of = dict(samplings(seed))
    for mode in modes:
        plains = []
        for i, ids in enumerate(prompts):
            t = DeviceTarget(engine, sm_of[mode](i))
            try:
                plains.append(list(plain_stream(t, ids, n)))
            finally:
                t.close()
        for k in ks:
            cell = Cell(mode, k)
            for i, ids in enumerate(prompts):
                st = SpecStats(getattr(drafter, "label", "?"), k)
                t = DeviceTarget(engine, sm_of[mode](i))
                t0 = time.perf_counter()
                try:
                    got = list(spec_stream(t, ids, n, drafter, KPolicy(k), st, canary=canary))
                finally:
                    t.close()
                cell.seconds += time.perf_counter() - t0
                cell.prompts += 1
                cell.tokens += len(got)
                cell.drafted += st.drafted
                cell.accepted += st.accepted
                cell.steps += st.steps
                d = _first_diff(got, plains[i])
                if d is None:
                    cell.identical += 1
                elif rep.first is None:
                    rep.first = Difference(i, mode, k, d, got[d] if d < len(got) else None,
                                           plains[i][d] if d < len(plains[i]) else None)
            rep.cells.append(cell)
            if on_cell is not None:
                on_cell(cell)
    if self_canary and not canary and rep.identical:
        rep.canary = canary_probe(engine, drafter, prompts, n, max(k for k in ks if k != "auto") if
                                  any(k != "auto" for k in ks) else 8, seed)
    return rep


def canary_probe(engine, drafter, prompts, n: int, k: int, seed: int = 1234) -> str:
    """Run the broken verifier (greedy, then seeded) until it fires; "red" when the
    comparison then sees a difference, "missed" when it does not, "silent" when no draft
    token was ever rejected (the canary had nothing to accept)."""
    for mode, make in samplings(seed):
        for i, ids in enumerate(prompts):
            t = DeviceTarget(engine, make(i))
            try:
                plain = list(plain_stream(t, ids, n))
            finally:
                t.close()
            st = SpecStats("canary", k)
            t = DeviceTarget(engine, make(i))
            try:
                got = list(spec_stream(t, ids, n, drafter, KPolicy(k), st, canary=True))
            finally:
                t.close()
            if st.drafted > st.accepted and st.steps:
                # the canary fired if some step rejected a draft token before the end
                return "red" if _first_diff(got, plain) is not None else "missed"
    return "silent"
