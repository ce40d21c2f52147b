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

A constrained request (memra.text.grammar: a JSON schema, grammar or regex) speculates too
(DraftGrammar): the draft is cut at the first token the grammar rejects (llguidance's
validate_tokens) and after a token that completes it; verification row i gets the mask of
its position, computed by walking the matcher through the kept draft (then rolled back), so
out[i] is what plain constrained decoding chooses there; the emitted tokens are consumed by
the matcher. A complete grammar ends the stream with the end-of-generation token, without a
model step, as plain constrained decoding does.

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
        raise MemraError(f"--spec-k must be auto or a draft length 1..32, got {text!r}") from None
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

    def prefill(self, prompt, mask=None) -> int:
        from memra.gpu.runner import Row

        return self.runner.step([Row(self.seq, list(prompt), sample=self.sampling, mask=mask, gen=False)])[0].token

    def verify(self, tokens: list[int], masks=None) -> list[int]:
        if len(tokens) == 1:  # nothing drafted: a plain decode step (the decode graph)
            from memra.gpu.runner import Row

            m = masks[0] if masks is not None else None
            return [self.runner.step([Row(self.seq, tokens, sample=self.sampling, mask=m)])[0].token]
        return self.runner.verify(self.seq, tokens, self.sampling, masks=masks)

    def rewind(self, n: int) -> None:
        if n < self.seq.n:
            self.runner.rewind(self.seq, n)

    def close(self) -> None:
        if self.own:
            self.runner.close(self.seq)


class HostTarget:
    """A model with the reference protocol and a host Sampler, one position at a time; an
    engine with forward_run (the GPU engine) computes a draft's logits in one verification
    step instead (the same logits: its rows have one-token forwards' bits), and the sampler
    is still called once per position, in order, up to the first rejection."""

    def __init__(self, model, sampler, n_ctx: int):
        self.model, self.sampler = model, sampler
        self.cache = model.new_cache(n_ctx)
        self.max_len = int(n_ctx)
        self.hist: list[int] = []  # the tokens the cache holds (the sampler's history)

    @property
    def n(self) -> int:
        return self.cache.pos

    def prefill(self, prompt, mask=None) -> int:
        self.hist = list(prompt)
        return self.sampler.sample(_masked(self.model.forward(self.hist, self.cache), mask), self.hist)

    def verify(self, tokens: list[int], masks=None) -> list[int]:
        out: list[int] = []
        run = getattr(self.model, "forward_run", None)
        if run is not None and 1 < len(tokens) <= 64:
            n0 = len(self.hist)
            lg = run([int(t) for t in tokens], self.cache, all_logits=True)
            self.hist.extend(int(t) for t in tokens)
            for i in range(len(tokens)):
                m = masks[i] if masks is not None else None
                out.append(self.sampler.sample(_masked(lg[i], m), self.hist[:n0 + i + 1]))
                if i + 1 < len(tokens) and out[-1] != tokens[i + 1]:
                    break  # as below; the caller rewinds the positions fed past it
            return out
        for i, t in enumerate(tokens):
            self.hist.append(int(t))
            m = masks[i] if masks is not None else None
            out.append(self.sampler.sample(_masked(self.model.forward([int(t)], self.cache), m), self.hist))
            if i + 1 < len(tokens) and out[-1] != tokens[i + 1]:
                break  # every later draft token is rejected: sample no further
        return out

    def rewind(self, n: int) -> None:
        if n < self.cache.pos:
            self.cache.pos = n
        del self.hist[n:]

    def close(self) -> None:
        pass


def _masked(logits, mask):
    if mask is None:
        return logits
    from memra.text.grammar import masked

    return masked(logits, mask)


class DraftGrammar:
    """A constrained request's parser state (memra.text.grammar.Matcher) as speculative
    decoding sees it. end: the token a complete grammar ends with (the lowest
    end-of-generation id), None: keep sampling under its mask."""

    def __init__(self, matcher, n_vocab: int, end: int | None = None):
        self.m, self.n_vocab, self.end = matcher, int(n_vocab), end

    @property
    def stopped(self) -> bool:
        return self.m.stopped

    def mask(self):
        from memra.text.grammar import new_masks

        row = new_masks(1, self.n_vocab)[0]
        self.m.fill(row)
        return row

    def take(self, token: int) -> None:
        if not self.m.consume(token):
            raise MemraError(f"the constraint rejected token {token}: {self.m.error}")

    def cut(self, draft: list[int]):
        """(the draft up to the first token the grammar rejects, and after a token that
        completes it; the masks of its verification rows): row i's mask is the next-token
        mask after the row's token, i.e. after the last emitted token and draft[:i]. The
        matcher is walked through the kept draft and rolled back to where it was."""
        return cut_draft(self.m, draft, self.n_vocab)


def cut_draft(matcher, draft: list[int], n_vocab: int):
    """DraftGrammar.cut for a memra.text.grammar.Matcher: (kept draft, int32 masks
    [len(kept) + 1, words])."""
    from memra.text.grammar import allowed, new_masks

    draft = [int(t) for t in draft]
    kept = draft[:int(matcher.m.validate_tokens(draft))] if draft and not matcher.stopped else []
    masks = new_masks(len(kept) + 1, n_vocab)
    done = 0
    try:
        for i in range(len(kept) + 1):
            matcher.fill(masks[i])
            if i == len(kept):
                break
            if not allowed(masks[i], n_vocab)[kept[i]] or not matcher.consume(kept[i]):
                kept = kept[:i]  # validate_tokens said yes, the mask no: trust the mask
                break
            done += 1
            if matcher.stopped:  # complete: nothing can follow but the end
                kept = kept[:i + 1]
                matcher.fill(masks[i + 1])
                break
    finally:
        if done:
            matcher.m.rollback(done)
    return kept, masks[:len(kept) + 1]


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
                canary: bool = False, grammar: DraftGrammar | None = None):
    """Yield up to n_max tokens after `prompt`, plain decode's tokens, drafting and verifying.
    The consumer may stop early (end of generation, a stop string). canary: a deliberately
    broken verifier that accepts one rejected draft token (the first), so a gate comparing
    with plain decode must turn red. grammar: plain constrained decoding's tokens (drafts cut
    where the grammar rejects them, every verification row under its position's mask)."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise MemraError("the prompt is empty: nothing to continue from")
    if n_max <= 0:
        return
    if grammar is None:
        tok = target.prefill(prompt)
    else:
        tok = target.prefill(prompt, mask=grammar.mask())
        grammar.take(tok)
    yield tok
    produced = 1
    history = prompt + [tok]
    fired = False
    while produced < n_max:
        if grammar is not None and grammar.stopped and grammar.end is not None:
            yield grammar.end  # complete: its mask allows only the end, no model step
            return
        # verification feeds 1 + len(draft) positions and emits up to len(draft) + 1 tokens
        room = min(n_max - produced - 1, target.max_len - target.n - 1)
        if room < 0:
            return
        k = min(policy.k, room)
        draft = [int(t) for t in drafter.draft(history, k)][:k] if k > 0 else []
        masks = None
        if grammar is not None:
            draft, masks = grammar.cut(draft)
        n0 = target.n
        out = target.verify([tok] + draft) if masks is None else target.verify([tok] + draft, masks)
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
            if grammar is not None:
                grammar.take(t)
            history.append(t)
            produced += 1
            yield t
            if grammar is not None and grammar.stopped and grammar.end is not None:
                break  # the end comes next, without a model step (the loop's top)
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
    (as `memra run`'s plain GPU path does); with penalties or a logit bias, or on the CPU
    reference, the host Sampler does, one position at a time (HostTarget), as plain decode
    calls it."""

    def __init__(self, drafter, k="auto"):
        self.drafter = drafter
        self.policy = KPolicy(k)
        self.stats = SpecStats(getattr(drafter, "label", drafter.name), self.policy.setting)

    def tokens(self, model, prompt, n_max: int, sampler, n_ctx: int, constraint=None, end: int | None = None):
        """The token stream; constraint (memra.text.grammar.Constraint): plain constrained
        decoding's tokens as memra.session gives them — the host Sampler over masked logits
        (HostTarget; on the GPU engine a draft's logits come from one verification step),
        `end` emitted when the grammar is complete."""
        from memra.gpu.runner import Sampling

        p = sampler.params
        if constraint is not None:
            grammar = DraftGrammar(constraint.matcher(), sampler.n_vocab, end)
            return spec_stream(HostTarget(model, sampler, n_ctx), prompt, n_max, self.drafter, self.policy,
                               self.stats, grammar=grammar)
        if hasattr(model, "verify") and hasattr(model, "seqs") and not p.host_only:
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
