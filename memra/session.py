"""One request: prompt -> sampler -> a stream of text events. The one generation path of
`memra run` (CPU reference or GPU runner alike); the server feeds the same text stream
(memra.text.stream) from its scheduler's steps.

Works with any engine that speaks the prefill/decode protocol of `memra.cpu.reference`:
`model.new_cache(n_ctx)` and `model.forward(tokens, cache) -> last-position logits`.
An engine with `stream(prompt, n, temperature=..., top_k=..., top_p=..., min_p=..., seed=...)`
(the GPU engine) chooses the tokens itself when neither a penalty nor a logit bias is asked
for (SamplingParams.host_only: the device sampler has neither): the ids come back
from the device a few at a time instead of the logits every token; greedy gives the same
tokens either way, draws come from the device sampler's own seeded stream.
Text is released by memra.text.stream.TextStream as it becomes final (no stop string or
half of one, no split UTF-8 character).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from memra.errors import ContextOverflowError, MemraError
from memra.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams, logprob_entry
from memra.text.stream import TextStream


def prompt_ids(gguf, tokenizer, *, prompt: str | None = None, messages: Sequence[dict] | None = None,
               tools: Sequence[dict] | None = None) -> tuple[list[int], str | None]:
    """A request's prompt as token ids, the one way `memra run` and `memra serve` make them:
    `messages` rendered through the model's chat template (or its architecture's turn
    format) with the assistant's turn opened, else `prompt` tokenized as llama.cpp's
    completion endpoint does (BOS per the model's metadata, special-token text parsed).
    `tools` reach a template that reads them (memra.text.tools.tool_messages decides).
    Returns (ids, the rendered chat text or None)."""
    if messages is not None:
        from memra.text.chat import chat_tokens, render_chat

        rendered = render_chat(gguf, list(messages), add_generation_prompt=True, tools=tools)
        return chat_tokens(tokenizer, rendered), rendered
    if prompt is None:
        raise MemraError("give a prompt or messages")
    return tokenizer.encode(prompt, add_special=True, parse_special=True), None


def context_size(n_prompt: int, max_tokens: int, n_ctx_train: int, ctx: int | None = None) -> int:
    """The KV cache one request needs: `ctx` when given, else prompt + max_tokens (at least
    4096 for an open-ended one, max_tokens -1), at most the model's training context."""
    if ctx:
        return int(ctx)
    return min(n_ctx_train, n_prompt + max_tokens if max_tokens >= 0 else max(4096, n_prompt + 1))


@dataclass
class Timings:
    n_prompt: int = 0
    n_gen: int = 0
    prefill_s: float = 0.0  # the prompt's forward pass and the first sample
    decode_s: float = 0.0  # every later token: forward pass and sample
    n_forced: int = 0  # of the n_gen, tokens a constraint forced (emitted without sampling)

    @property
    def prefill_tok_s(self) -> float | None:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else None

    @property
    def decode_tok_s(self) -> float | None:
        # the first token comes out of the prefill; decode speed counts the tokens after it
        n = self.n_gen - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else None


@dataclass
class GenEvent:
    """One generated token (`token`, and `text` newly released, possibly "") or, last of all,
    the end: token None, any remaining text, `finish_reason` and `timings`. With logprobs
    asked for, `logprob` is memra.sampling.logprob_entry's (log p(token), [(id, log p)] of
    the top alternatives) under the logits the token was chosen from, or None for a token
    chosen without a model step (the end token after a complete constraint)."""

    token: int | None
    text: str
    finish_reason: str | None = None  # "eos" | "stop" | "length"
    timings: Timings | None = None
    logprob: tuple | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def generate(model, tokenizer, prompt_ids: Sequence[int], params: SamplingParams, *,
             n_ctx: int | None = None, ignore_eos: bool = False,
             sampler: Sampler | None = None, constraint=None, spec=None,
             logprobs: int | None = None) -> Iterator[GenEvent]:
    """Yield a GenEvent per generated token, then a final event (finish_reason, timings).

    Stops at an end-of-generation token (unless ignore_eos; the token is still reported),
    at a stop string (text up to it, not beyond), after params.max_tokens tokens, or when
    the context of n_ctx positions (default: prompt + max_tokens) is full.

    constraint (memra.text.grammar.Constraint): every token is sampled from the logits with
    the grammar's disallowed tokens at -inf; the generation ends when the grammar is
    complete (its end-of-generation token is reported without another model step). Tokens
    the grammar forces after a sampled one (memra.text.grammar.fast_forward; MEMRA_FORCED=0
    turns it off) are emitted without sampling and fed with it: on the GPU engine in one
    verification step (forward_run: Runner.verify, a graph per row count; the same logits
    as one-token forwards) or one token a forward, whichever its measured times say costs
    less per token (memra.text.grammar.FeedCosts; MEMRA_FORCED=always: the joint call), one
    position at a time on the CPU reference: the same tokens (the host sampler's stream
    skips one draw per forced token), counted in timings.n_forced.

    spec (memra.spec.decode.SpecDecoder): speculative decoding — drafted tokens verified in
    one step each, plain decode's tokens (the same sampler, seed and penalties) out; with a
    constraint, plain constrained decoding's (drafts cut at the first token the grammar
    rejects, each verified position sampled under its mask; no fast-forward: a forced token
    is what the draft must hold or what its position's one-token mask chooses).

    logprobs (0..MAX_TOP_LOGPROBS): every event carries its token's log-prob and the top
    `logprobs` alternatives (memra.sampling.logprob_entry, the server's definition: the raw
    logits of the token's position, before penalties, temperature and the constraint's
    mask). The tokens do not change: the GPU engine's device sampler still draws them
    (GPUEngine.stream_logits, a step per token with its logits read back, as the server's
    rows for such requests), and, as the server does, a constraint's forced tokens are not
    fast-forwarded (each forced token's log-prob needs its own position's logits; forced or
    sampled, the mask chooses the same token). Not with spec (the server does not
    speculate such requests either).
    """
    prompt = [int(t) for t in prompt_ids]
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise MemraError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {logprobs!r}")
        if spec is not None:
            raise MemraError("log-probs with speculative decoding are not supported (a verification step "
                             "does not bring each position's logits back); drop one of them")
    if not prompt:
        raise MemraError("the prompt is empty: nothing to continue from")
    n_vocab = tokenizer.n_vocab
    bad = [t for t in prompt if not 0 <= t < n_vocab]
    if bad:
        raise MemraError(f"prompt token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    max_tokens = params.max_tokens
    if n_ctx is None:
        if max_tokens < 0:
            raise MemraError("give n_ctx or max_tokens: an unbounded generation needs a context size")
        n_ctx = len(prompt) + max_tokens
    if len(prompt) >= n_ctx and not (len(prompt) == n_ctx and max_tokens == 0):
        raise ContextOverflowError(f"the prompt has {len(prompt)} tokens; the context holds {n_ctx} "
                                   f"and needs room for at least one more")
    sampler = sampler or Sampler(params, n_vocab)
    stop_ids = frozenset(params.stop_ids) | (frozenset() if ignore_eos else frozenset(tokenizer.eog_ids))
    timings = Timings(n_prompt=len(prompt))
    if max_tokens == 0:
        yield GenEvent(None, "", "length", timings)
        return

    history = list(prompt)
    ts = TextStream(tokenizer, params.stop, stop_ids, max_tokens, n_ctx - len(prompt))
    cache = model.new_cache(n_ctx)
    p = sampler.params
    # the logits the latest token was chosen from (None: chosen without a model step); read
    # only when logprobs are asked for
    last_logits = None
    matcher = constraint.matcher() if constraint is not None else None
    if matcher is not None:
        from memra.text.grammar import FeedCosts, fast_forward, forced_enabled, masked, new_masks

        mask = new_masks(1, n_vocab)[0]
        ff = forced_enabled() and logprobs is None
        # an engine whose forward over several tokens leaves each position as one-token
        # forwards would (the GPU runner: memra.gpu.gate checks prefill = decode) takes a
        # forced run in one step; the CPU reference's batched kernels sum in another order,
        # so there the run is fed one position at a time (the same forwards as without it)
        joint = bool(getattr(model, "prefill_is_decode", False))
        # the GPU engine feeds a run as a verification step (a graph per row count) or one
        # token a forward, whichever its measured times say is cheaper per token fed
        run_fwd = getattr(model, "forward_run", None)
        costs = FeedCosts()
        n_room = n_ctx - len(prompt) if max_tokens < 0 else min(max_tokens, n_ctx - len(prompt))
        feed: list[int] = []      # emitted tokens the model has not seen yet
        queue: deque[int] = deque()  # forced tokens still to emit (consumed by the matcher)
        mask_ready = False        # fast_forward left the next position's mask in `mask`

        def next_token(last):
            nonlocal mask_ready, last_logits
            if last is not None:
                feed.append(last)
            last_logits = None
            if queue:
                return queue.popleft()  # forced: emitted without a model step
            if matcher.stopped and stop_ids:
                return min(stop_ids)  # the grammar allows only the end now: no model step
            if last is None:
                logits = model.forward(prompt, cache)
            elif len(feed) == 1:
                t0 = time.perf_counter()
                logits = model.forward(list(feed), cache)
                costs.observe("graph", 1, time.perf_counter() - t0)
            elif run_fwd is not None and len(feed) <= 64 and costs.choose([len(feed)], 0, "verify") == "verify":
                t0 = time.perf_counter()
                logits = run_fwd(list(feed), cache)
                costs.observe("verify", len(feed), time.perf_counter() - t0)
            elif joint and (run_fwd is None or len(feed) > 64):
                logits = model.forward(list(feed), cache)
            else:
                for t in feed:
                    t0 = time.perf_counter()
                    logits = model.forward([t], cache)
                    costs.observe("graph", 1, time.perf_counter() - t0)
            feed.clear()
            last_logits = logits
            if not mask_ready:
                matcher.fill(mask)
            token = sampler.sample(masked(logits, mask), history)
            if not matcher.consume(token):
                raise MemraError(f"the constraint rejected token {token}: {matcher.error}")
            mask_ready = False
            if ff:
                # tokens emitted so far: timings.n_gen, then this one; ts ends the request at
                # the same token whether or not more were forced, this only saves mask work
                forced, mask_ready = fast_forward(matcher, n_room - timings.n_gen - 1, mask)
                sampler.skip(len(forced))
                timings.n_forced += len(forced)
                queue.extend(forced)
            return token
    elif getattr(model, "stream", None) is not None and not p.host_only:
        n_max = n_ctx - len(prompt) if max_tokens < 0 else min(max_tokens, n_ctx - len(prompt))
        kw = dict(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, seed=sampler.seed)
        if logprobs is None:
            ids = model.stream(prompt, n_max, **kw)

            def next_token(last):
                return next(ids)
        else:
            ids = model.stream_logits(prompt, n_max, **kw)

            def next_token(last):
                nonlocal last_logits
                token, last_logits = next(ids)
                return token
    else:
        def next_token(last):
            nonlocal last_logits
            last_logits = model.forward(prompt if last is None else [last], cache)
            return sampler.sample(last_logits, history)

    if spec is not None:
        n_max = n_ctx - len(prompt) if max_tokens < 0 else min(max_tokens, n_ctx - len(prompt))
        if constraint is not None:  # drafts cut where the grammar rejects them, rows masked
            spec_ids = spec.tokens(model, prompt, n_max, sampler, n_ctx, constraint=constraint,
                                   end=min(stop_ids) if stop_ids else None)
        else:
            spec_ids = spec.tokens(model, prompt, n_max, sampler, n_ctx)

        def next_token(last):
            return next(spec_ids)

    # time only the engine and the sampler, not the consumer of the events
    t0 = time.perf_counter()
    token = next_token(None)
    timings.prefill_s = time.perf_counter() - t0
    while True:
        timings.n_gen += 1
        history.append(token)
        text, finish = ts.push(token)
        lp = None
        if logprobs is not None and last_logits is not None:
            lp = logprob_entry(last_logits, token, logprobs)
        yield GenEvent(token, text, logprob=lp)
        if finish is not None:
            yield GenEvent(None, "", finish, timings)
            return
        t0 = time.perf_counter()
        token = next_token(token)
        timings.decode_s += time.perf_counter() - t0
