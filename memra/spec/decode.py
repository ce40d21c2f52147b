"""The speculative decoding loop: draft K tokens, verify them in one step of the target,
keep the longest prefix whose every token equals what plain decode would have chosen there,
roll the rest back.

    target = DeviceTarget(runner, Sampling(0.8, seed=7))
    for tok in spec_stream(target, prompt, 128, LookupDrafter(), KPolicy("auto"), stats):
        ...

Exactness: verification feeds [last accepted token] + draft (one row of K+1 tokens) and
gets back, for each position t, the token the sampler chooses from the logits there; that
token is a function of (logits, seed, t) only (the device sampler's counter-based draw), and
the logits at t are plain decode's as long as every draft token before t was accepted. So
draft token i is accepted iff it equals the token chosen after the row's token i, the first
disagreeing choice is emitted in its place (plain decode's token there), and the output is
plain decode's token for token, greedy or seeded. Rejected positions are rewound in the KV
cache (runner.rewind).

Targets:
- DeviceTarget: a runner (memra.gpu.runner.Runner, memra.serve.cpu_engine.CpuRunner) with
  `verify(seq, tokens, sampling)`; sampling by the device rule.
- HostTarget: a model with the CPU reference's protocol (`new_cache`, `forward`) and a host
  Sampler (memra.sampling, PCG64 and penalties): one position at a time, the sampler called
  exactly as plain decode calls it (once per emitted token, with the same history), so it
  stays exact with a stateful random stream and history-dependent penalties. This is what
  `memra run --device cpu --spec` uses, so its output equals `memra run --device cpu`'s.

KPolicy: a fixed K (the gates) or "auto": K grows by one after a step that accepted its
whole draft, shrinks by one after a step that accepted less than half of it (1..k_max);
model drafters also cut a draft short when their top-1 probability drops below a threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memra.errors import MemraError

K_MAX = 8
K_AUTO_START = 4
AUTO_MIN_CONF = 0.5  # model drafters' confidence cut under --spec-k auto


@dataclass
class SpecStats:
    drafter: str
    k: object  # the K setting: an int or "auto"
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification steps (including those with an empty draft)
    k_hist: dict = field(default_factory=dict)  # K used -> steps (auto)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "drafted": self.drafted, "accepted": self.accepted,
                "steps": self.steps}


class KPolicy:
    def __init__(self, k="auto", k_max: int = K_MAX):
        if k == "auto" or k is None:
            self.fixed = False
            self.k_max = int(k_max)
            self.k = min(K_AUTO_START, self.k_max)
        else:
            k = int(k)
            if not 1 <= k <= 64 - 1:
                raise MemraError(f"--spec-k must be auto or 1..63, got {k}")
            self.fixed, self.k, self.k_max = True, k, k
        self.setting = "auto" if not self.fixed else self.k

    def update(self, drafted: int, accepted: int) -> None:
        if self.fixed or drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.k + 1, self.k_max)
        elif 2 * accepted < drafted:
            self.k = max(self.k - 1, 1)


def parse_k(text) -> object:
    if text is None or str(text).strip().lower() == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        raise MemraError(f"--spec-k must be auto or a draft length 1..8, got {text!r}") from None
    if not 1 <= k <= 32:
        raise MemraError(f"--spec-k must be auto or a draft length 1..32, got {k}")
    return k


# -- targets ---------------------------------------------------------------------------------

class DeviceTarget:
    """One sequence of a runner; tokens chosen by the device sampler's rule."""

    def __init__(self, runner, sampling, seq=None):
        self.runner, self.sampling = runner, sampling
        self.own = seq is None
        self.seq = runner.open() if seq is None else seq
        self.max_len = runner.max_len

    @property
    def n(self) -> int:
        return self.seq.n

    def prefill(self, prompt) -> int:
        from memra.gpu.runner import Row

        return self.runner.step([Row(self.seq, list(prompt), sample=self.sampling)])[0].token

    def verify(self, tokens: list[int]) -> list[int]:
        if len(tokens) == 1:  # nothing drafted: a plain decode step (the decode graph)
            from memra.gpu.runner import Row

            return [self.runner.step([Row(self.seq, tokens, sample=self.sampling)])[0].token]
        return self.runner.verify(self.seq, tokens, self.sampling)

    def rewind(self, n: int) -> None:
        if n < self.seq.n:
            self.runner.rewind(self.seq, n)

    def close(self) -> None:
        if self.own:
            self.runner.close(self.seq)


class HostTarget:
    """A model with the reference protocol and a host Sampler, one position at a time."""

    def __init__(self, model, sampler, n_ctx: int):
        self.model, self.sampler = model, sampler
        self.cache = model.new_cache(n_ctx)
        self.max_len = int(n_ctx)
        self.hist: list[int] = []  # the tokens the cache holds (the sampler's history)

    @property
    def n(self) -> int:
        return self.cache.pos

    def prefill(self, prompt) -> int:
        self.hist = list(prompt)
        return self.sampler.sample(self.model.forward(self.hist, self.cache), self.hist)

    def verify(self, tokens: list[int]) -> list[int]:
        out: list[int] = []
        for i, t in enumerate(tokens):
            self.hist.append(int(t))
            out.append(self.sampler.sample(self.model.forward([int(t)], self.cache), self.hist))
            if i + 1 < len(tokens) and out[-1] != tokens[i + 1]:
                break  # every later draft token is rejected: sample no further
        return out

    def rewind(self, n: int) -> None:
        if n < self.cache.pos:
            self.cache.pos = n
        del self.hist[n:]

    def close(self) -> None:
        pass


# -- the loop --------------------------------------------------------------------------------

def accepted(draft: list[int], out: list[int]) -> int:
    """How many draft tokens verification accepts: the longest prefix where each equals the
    token chosen after the one before it (out[i] follows [last token] + draft[:i])."""
    j = 0
    while j < len(draft) and j < len(out) and out[j] == draft[j]:
        j += 1
    if j >= len(out):
        raise MemraError(f"verification returned {len(out)} tokens for {j} accepted draft tokens")
    return j


def spec_stream(target, prompt, n_max: int, drafter, policy: KPolicy, stats: SpecStats | None = None,
                canary: bool = False):
    """Yield up to n_max tokens after `prompt`, plain decode's tokens, drafting and verifying.
    The consumer may stop early (end of generation, a stop string). canary: a deliberately
    broken verifier that accepts one rejected draft token (the first), so a gate comparing
    with plain decode must turn red."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise MemraError("the prompt is empty: nothing to continue from")
    if n_max <= 0:
        return
    tok = target.prefill(prompt)
    yield tok
    produced = 1
    history = prompt + [tok]
    fired = False
    while produced < n_max:
        # verification feeds 1 + len(draft) positions and emits up to len(draft) + 1 tokens
        room = min(n_max - produced - 1, target.max_len - target.n - 1)
        if room < 0:
            return
        k = min(policy.k, room)
        draft = [int(t) for t in drafter.draft(history, k)][:k] if k > 0 else []
        n0 = target.n
        out = target.verify([tok] + draft)
        j = accepted(draft, out)
        nxt = out[j]
        if canary and not fired and j < len(draft):
            nxt, fired = draft[j], True  # the canary: a rejected draft token passes
        target.rewind(n0 + 1 + j)
        if stats is not None:
            stats.steps += 1
            stats.drafted += len(draft)
            stats.accepted += j
            stats.k_hist[k] = stats.k_hist.get(k, 0) + 1
        policy.update(len(draft), j)
        for t in draft[:j] + [nxt]:
            history.append(t)
            produced += 1
            yield t
        tok = nxt


def plain_stream(target, prompt, n_max: int):
    """Plain decode over the same target: one token fed, one chosen, per step."""
    if n_max <= 0:
        return
    tok = target.prefill([int(t) for t in prompt])
    yield tok
    for _ in range(n_max - 1):
        if target.n + 1 > target.max_len:
            return
        tok = target.verify([tok])[0]
        yield tok


class SpecDecoder:
    """What `memra run --spec` hands memra.session.generate: a drafter, a K policy and the
    running counts. On an engine with `verify` (the GPU engine) the device sampler chooses
    (as `memra run`'s plain GPU path does); with penalties, or on the CPU reference, the
    host Sampler does, one position at a time (HostTarget), as plain decode calls it."""

    def __init__(self, drafter, k="auto"):
        self.drafter = drafter
        self.policy = KPolicy(k)
        self.stats = SpecStats(getattr(drafter, "label", drafter.name), self.policy.setting)

    def tokens(self, model, prompt, n_max: int, sampler, n_ctx: int):
        from memra.gpu.runner import Sampling

        p = sampler.params
        penalties = p.repeat_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)
        if hasattr(model, "verify") and hasattr(model, "seqs") and not penalties:
            model.reset()
            sm = Sampling(p.temperature, p.top_k, p.top_p, p.min_p, sampler.seed)
            target = DeviceTarget(model, sm, seq=model.seqs[0])
        else:
            target = HostTarget(model, sampler, n_ctx)
        return spec_stream(target, prompt, n_max, self.drafter, self.policy, self.stats)

    def close(self) -> None:
        self.drafter.close()


# -- the server --------------------------------------------------------------------------------

@dataclass
class SpecServing:
    """`memra serve --spec`: which drafter, K, and up to how many decoding requests a step
    speculates (above that, plain batched decode rows serve the batch better)."""
    spec: str
    k: object = "auto"
    max_batch: int = 1
    new_drafter: object = None  # () -> a drafter for one request (lookup: its own; model drafters: shared)

    @classmethod
    def open(cls, spec: str, k, max_batch: int, *, gguf, cfg, device: str, n_ctx: int) -> "SpecServing":
        from memra.spec.drafters import LookupDrafter, make_drafter, parse_spec

        kind, arg = parse_spec(spec)
        k = parse_k(k)
        if int(max_batch) < 1:
            raise MemraError(f"--spec-max-batch must be at least 1, got {max_batch}")
        if kind == "lookup":
            new = lambda: LookupDrafter(*arg)  # noqa: E731
        else:
            shared = make_drafter(spec, gguf=gguf, cfg=cfg, device=device, n_ctx=n_ctx,
                                  min_conf=AUTO_MIN_CONF if k == "auto" else 0.0)
            new = lambda: shared  # noqa: E731  (one drafter cache; it rewinds to each request's history)
        return cls(spec, k, int(max_batch), new)


class SpecRow:
    """One request's speculation state in the server: its drafter, K policy and history."""

    def __init__(self, drafter, k, prompt):
        self.drafter, self.policy = drafter, KPolicy(k)
        self.n_prompt, self.hist = len(prompt), list(prompt)

    def draft(self, generated: list[int], room: int) -> list[int]:
        """Up to min(K, room) draft tokens after prompt + generated."""
        self.hist.extend(generated[len(self.hist) - self.n_prompt:])
        k = min(self.policy.k, room)
        return [int(t) for t in self.drafter.draft(self.hist, k)][:k] if k > 0 else []
