"""Continuous batching: one engine thread owns the runner; requests come and go between steps.

    sched = Scheduler(engine, tokenizer, max_queue=64, max_batched_tokens=2048, metrics=m)
    sched.run()                           # on the engine thread (the one that opened the runner)
    req = GenRequest(prompt_ids, params, namespace=tenant)    # on the event loop
    sched.submit(req)                     # QueueFull (429), ContextOverflowError / NeverFits (400)
    async for ev in req.events(): ...     # ("token", id, text, logprobs) ... ("done", finish, usage)
    sched.cancel(req)                     # a client that went away: its blocks are freed

`engine` is memra.gpu.runner.Runner (the GPU) or memra.serve.cpu_engine.CpuRunner: `open`,
`close`, `step(rows)` and a paged KV cache (`kv`: blocks, block tables, the free queue).

Each iteration of the engine thread:
  1. takes new requests and cancellations from the inbox;
  2. admits waiting requests in arrival order while a sequence slot is free and the KV
     pool can hold each one's worst case (prompt + its token limit) next to what the
     running requests may still claim: a running request never runs out of blocks, so
     nothing is ever preempted. The longest cached prefix (memra.serve.prefix_cache) is
     adopted first and only the rest of the prompt is computed;
  3. steps: every running request that has a token to feed gets a decode row (one token;
     up to 64 a step, the runner's CUDA-graph buckets), and requests still in their prompt
     get prefill chunks under what is left of the token budget (`max_batched_tokens`), in
     admission order, at least one chunk a step. Decode rows and prefill rows go to the
     runner as two calls of one iteration (the decode rows stay on the graph path), so
     running streams keep flowing while a long prompt arrives in chunks. A constrained
     request with forced tokens (below) feeds its last sampled token and them: as one row
     of several tokens in the prefill call when a prompt is in progress; else as the cost
     policy (memra.text.grammar.FeedCosts, from the measured times of this engine's calls)
     says is cheaper per token fed — one request's run alone as a verification step
     (engine.verify with masks: on the GPU a graph per row count), several as one eager
     call, or a token a step as unsampled decode rows beside the others. When every
     running request only decodes on the device sampler and nobody waits, the steps run as
     one chain on the device (the runner's decode_run: a read-back every MEMRA_SERVE_CHAIN
     (8) steps, the next chunk queued before a chunk's tokens are handed out; the same
     tokens as step by step) until a request arrives or one of them ends;
  4. hands each row's token to its request: the text stream (memra.text.stream.TextStream:
     detokenization, stop strings, end of generation, length), log-probs when asked, an
     event to the request's asyncio queue; finished requests register their full blocks
     in the prefix cache and close their sequences.

Tokens are chosen on the device (greedy, or seeded temperature/top-k/top-p/min-p: a function
of the logits, the seed and the position) unless the request asks for penalties, a logit
bias or min_tokens, which the device sampler does not have (SamplingParams.host_only): the
host's memra.sampling.Sampler then samples from the row's logits. A constrained request (a JSON
schema, grammar or regex: memra.text.grammar) has its next-token mask filled for each step,
with every other constrained row's in one llguidance batch: a decode row's mask is LATER and
the batch fill is the step's fill callback, which the GPU runner calls while the device runs
the step's body (the mask is needed only by the sampler at its end); prefill rows and
host-sampled rows get theirs before the step. The engine sets the disallowed logits to -inf
before its sampler (on the GPU inside the decode graph's tail, kernels/mask.cu); the chosen
token advances the request's matcher, and a complete grammar ends the request. The tokens
the grammar then forces (each the only one its position's mask allows: memra.text.grammar.
fast_forward) are emitted at once and fed after the sampled token (step 3), which is
sampled after the last of them (MEMRA_FORCED=0: one step per token; the same tokens). A row's logits never depend on the rows beside it or on how its prompt was
chunked (the runner's exactness contract; the CPU engine computes one position at a time),
so a request's greedy tokens are the same alone or among 64, and with or without a
prefix-cache hit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from memra.errors import ContextOverflowError, MemraError
from memra.gpu.runner import LATER, MAX_ROWS, Row, RowOut, Sampling
from memra.sampling import Sampler, SamplingParams, logprob_entry
from memra.serve.prefix_cache import PrefixCache
from memra.text.stream import TextStream

log = logging.getLogger("memra.serve")


class QueueFull(MemraError):
    """More requests wait for admission than --max-queue allows (HTTP 429)."""


class NeverFits(MemraError):
    """A request whose worst case is larger than the whole KV pool (HTTP 400)."""


@dataclass
class GenRequest:
    """One generation: prompt token ids, validated sampling parameters (max_tokens -1: up
    to the context), the prefix-cache namespace, top log-probs per token (None: none)."""
    prompt: list[int]
    params: SamplingParams
    namespace: str = ""
    logprobs: int | None = None
    ignore_eos: bool = False
    constraint: object = None  # memra.text.grammar.Constraint: a JSON schema, grammar or regex
    # the prompt's own log-probs (completions' echo with logprobs): top alternatives per position (None: none);
    # the prompt is then computed whole (no prefix-cache hit) with every position's logits read back
    prompt_logprobs: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    # set by submit()
    loop: asyncio.AbstractEventLoop | None = None
    queue: asyncio.Queue | None = None
    t_arrival: float = 0.0
    max_new: int = 0
    seed: int = 0
    cancelled: bool = False
    t_client: float = 0.0   # the HTTP side: when the client's connection was last checked
    # engine-thread state
    seq: object = None
    pos: int = 0            # prompt tokens in the KV cache
    n_cached: int = 0       # of them from the prefix cache
    generated: list[int] = field(default_factory=list)
    held: list = field(default_factory=list)  # (id, logprob, start) of tokens whose text the stream holds
    next_tok: int | None = None
    registered: int = 0     # full blocks handed to the prefix cache
    ts: TextStream | None = None
    sampler: Sampler | None = None
    device: Sampling | None = None
    matcher: object = None  # the constraint's parser state (memra.text.grammar.Matcher)
    forced: list[int] = field(default_factory=list)  # forced tokens emitted after next_tok, not yet fed
    ff_mask: object = None  # int32 [words]: the mask after the forced tokens, when fast_forward computed it
    ff_buf: object = None   # the request's own mask row that fast_forward writes
    n_forced: int = 0
    spec: object = None     # speculative decoding state (memra.spec.decode.SpecRow), made on first use
    t_admit: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    finish: str | None = None
    prompt_lps: list = field(default_factory=list)  # (token, (logprob, top) or None) per prompt position so far

    @property
    def wants_logits(self) -> bool:
        """Its logits come back: the host's Sampler chooses (SamplingParams.host_only), or log-probs are asked."""
        return self.params.host_only or self.logprobs is not None

    def send(self, ev) -> None:
        """Deliver one event now (the scheduler batches a step's events with deliver())."""
        deliver(self.loop, [(self, ev)])

    async def events(self):
        """The request's events until its end: ("prompt", entries) first when it asked for the
        prompt's log-probs (prompt_logprobs: (id, (logprob, top) or None for the first) per prompt
        token), ("token", id, text, logprobs), then ("done",
        finish_reason, usage) or ("error", message). text: what the token releases (held text
        may come out with a later token); logprobs: (id, logprob, start) of the tokens whose
        text this event releases (start: where the token's own text begins in the reply), as
        Scheduler._push decides — a stop string's tokens never come out."""
        while True:
            ev = await self.queue.get()
            yield ev
            if ev[0] in ("done", "error"):
                return


def _put(items) -> None:
    for r, ev in items:
        r.queue.put_nowait(ev)


def deliver(loop, items) -> None:
    """Hand (request, event) pairs to their event loop in one wake-up."""
    try:
        loop.call_soon_threadsafe(_put, items)
    except RuntimeError:  # the event loop is gone (shutdown)
        pass


class Scheduler:
    def __init__(self, engine, tokenizer, *, max_queue: int = 256, max_batched_tokens: int = 2048,
                 metrics=None, prefix_cache: bool = True, spec=None):
        if max_batched_tokens < 1:
            raise MemraError(f"--max-num-batched-tokens must be at least 1, got {max_batched_tokens}")
        if max_queue < 0:
            raise MemraError(f"--max-queue must be >= 0, got {max_queue}")
        self.engine, self.tok, self.kv = engine, tokenizer, engine.kv
        self.max_queue, self.budget = int(max_queue), int(max_batched_tokens)
        self.metrics = metrics
        self.pc = PrefixCache(self.kv) if prefix_cache else None
        self.prefill_exact = bool(getattr(engine, "prefill_exact", True))
        self.max_len, self.max_seqs = int(engine.max_len), int(engine.max_seqs)
        self.n_vocab = int(engine.cfg.n_vocab)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox: deque[GenRequest] = deque()
        self._n_waiting = 0   # inbox + waiting (what --max-queue bounds)
        self._n_running = 0
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self._admitting: GenRequest | None = None  # the request _admit is taking in
        self._stop = False
        self.steps = 0
        self._outbox: dict[object, list] = {}  # event loop -> (request, event) pairs of this iteration
        self._masks = None  # int32 [MAX_ROWS, words]: constrained rows' vocabulary masks of a step
        self.spec = spec  # memra.spec.decode.SpecServing: speculate while few requests decode
        # decode rows' masks filled while the engine runs the step (MEMRA_MASK_OVERLAP=0: before it)
        self.overlap_masks = os.environ.get("MEMRA_MASK_OVERLAP", "1") != "0"
        from memra.text.grammar import FeedCosts, forced_enabled

        # a constraint's forced tokens fed with the sampled one in one row (MEMRA_FORCED=0: off)
        self.fast_forward = forced_enabled()
        # how forced runs are fed, from measured step times (memra.text.grammar.FeedCosts)
        self.costs = FeedCosts()
        # decode steps chained on the device while nothing else is to be done (_chain)
        self.chain = chain_steps()
        self.forced_tokens = 0
        self.thread = threading.Thread(target=self._loop, name="memra-engine", daemon=True)

    # -- the event loop's side --------------------------------------------------------------------
    def start(self) -> None:
        """Run the engine loop on a new thread (an engine that any thread may drive)."""
        self.thread.start()

    def run(self) -> None:
        """Run the engine loop on this thread until stop(): the GPU server calls it on the
        thread that opened the runner, whose CUDA context is current there."""
        self.thread = threading.current_thread()
        self._loop()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    @property
    def n_waiting(self) -> int:
        return self._n_waiting

    @property
    def n_running(self) -> int:
        return self._n_running

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._n_waiting == 0 and self._n_running == 0

    def limit_for(self, n_prompt: int, max_tokens: int) -> int:
        """The request's token limit: max_tokens, or up to the context when -1. Raises
        ContextOverflowError / NeverFits for what can never run."""
        if n_prompt < 1:
            raise MemraError("the prompt is empty after tokenization: give some text")
        if n_prompt >= self.max_len:
            raise ContextOverflowError(f"the prompt has {n_prompt} tokens; this server's context holds "
                                       f"{self.max_len} and needs room for at least one more "
                                       f"(--ctx-size)")
        n_new = self.max_len - n_prompt if max_tokens < 0 else int(max_tokens)
        if n_prompt + n_new > self.max_len:
            raise ContextOverflowError(f"the prompt's {n_prompt} tokens and max_tokens {n_new} exceed this "
                                       f"server's context of {self.max_len} tokens")
        need = self.kv.blocks_for(n_prompt + n_new)
        if need > self.kv.alloc.n_blocks:
            raise NeverFits(f"the request needs {need} KV blocks of {self.kv.block} tokens at most and the "
                            f"whole cache has {self.kv.alloc.n_blocks} (ask for fewer tokens, or start the "
                            f"server with more --kv-memory)")
        return n_new

    def submit(self, req: GenRequest) -> None:
        """Queue a request (called on the event loop that will read its events)."""
        req.max_new = self.limit_for(len(req.prompt), req.params.max_tokens)
        req.loop = asyncio.get_running_loop()
        req.queue = asyncio.Queue()
        req.t_arrival = time.perf_counter()
        req.seed = req.params.seed if req.params.seed is not None else random.SystemRandom().getrandbits(63)
        with self._lock:
            if self._stop:
                raise MemraError("the server is shutting down")
            # those beyond the free sequences wait: they are what --max-queue bounds
            if self._n_waiting - max(0, self.max_seqs - self._n_running) >= self.max_queue:
                raise QueueFull(f"{self._n_waiting} requests are waiting (--max-queue {self.max_queue}); "
                                f"retry later")
            self._n_waiting += 1
            self._inbox.append(req)
        self._wake.set()

    def cancel(self, req: GenRequest) -> None:
        """Stop a request (its client went away): freed at the next iteration."""
        if req.finish is None:
            req.cancelled = True
            self._wake.set()

    # -- the engine thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        current = getattr(getattr(self.engine, "g", None), "make_current", None)
        if current is not None:  # the GPU's context on this thread
            current()
        while not self._stop:
            with self._lock:
                while self._inbox:
                    self.waiting.append(self._inbox.popleft())
            try:  # all of an iteration's engine work: a failure must not end this thread
                self._drop_cancelled()
                self._admit()
                if self.running:
                    self._step()
            except Exception as e:  # a bug or a device error: fail what runs, keep serving
                log.exception("engine step failed")
                err = f"the engine failed: {type(e).__name__}: {e}"
                r, self._admitting = self._admitting, None
                if r is not None:  # taking it in failed: that request alone, not the queue behind it
                    if r in self.waiting:
                        self.waiting.remove(r)
                        with self._lock:
                            self._n_waiting -= 1
                    self._end(r, None, error=err)
                else:
                    for r in list(self.running):
                        self._end(r, None, error=err)
            self._flush()
            self._gauges()
            if not self.running:
                self._wake.wait(0.05 if self.waiting else 0.5)
                self._wake.clear()
        for r in list(self.running):
            self._end(r, None, error="the server stopped")
        for r in list(self.waiting):
            self._send(r, ("error", "the server stopped"))
        self._flush()

    def _send(self, r: GenRequest, ev) -> None:
        self._outbox.setdefault(r.loop, []).append((r, ev))

    def _flush(self) -> None:
        """Every event of this iteration to its request's loop: one wake-up a loop, not one
        a token."""
        box, self._outbox = self._outbox, {}
        for loop, items in box.items():
            deliver(loop, items)

    def _gauges(self) -> None:
        m = self.metrics
        with self._lock:
            self._n_running = len(self.running)
        if m is not None:
            m.running.set(len(self.running))
            m.waiting.set(self._n_waiting)
            m.kv_usage.set(self.kv.usage)

    def _drop_cancelled(self) -> None:
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            with self._lock:
                self._n_waiting -= 1
            r.finish = "abort"
            if self.metrics is not None:
                self.metrics.success.labels(finished_reason="abort").inc()
        for r in [r for r in self.running if r.cancelled]:
            self._end(r, "abort")

    def _outstanding(self) -> int:
        """Blocks the running requests may still claim (worst case minus what they map)."""
        kv = self.kv
        return sum(max(0, kv.blocks_for(len(r.prompt) + r.max_new) - int(kv.n_mapped[r.seq.slot]))
                   for r in self.running)

    def _admit(self) -> None:
        kv, B = self.kv, self.kv.block
        outstanding = None
        while self.waiting and len(self.running) < self.max_seqs:
            r = self._admitting = self.waiting[0]
            hit = self.pc.lookup(r.namespace, r.prompt, limit=len(r.prompt) - 1, count=False) \
                if self.pc and r.prompt_logprobs is None else []
            worst = kv.blocks_for(len(r.prompt) + r.max_new)
            cost = worst - len(hit) + (self.pc.free_among(hit) if self.pc else 0)
            if outstanding is None:
                outstanding = self._outstanding()
            if cost > kv.alloc.n_free - outstanding:
                break  # in arrival order: the head waits for blocks, nobody overtakes it
            self.waiting.popleft()
            with self._lock:  # both at once: submit's queue bound reads them together
                self._n_waiting -= 1
                self._n_running += 1
            seq = r.seq = self.engine.open()
            if hit:
                kv.adopt(seq.slot, hit)
                seq.n = len(hit) * B
            r.seq, r.pos, r.n_cached, r.registered = seq, seq.n, seq.n, len(hit)
            outstanding += worst - len(hit)
            stop_ids = frozenset(r.params.stop_ids) | (frozenset() if r.ignore_eos else frozenset(self.tok.eog_ids))
            r.ts = TextStream(self.tok, r.params.stop, stop_ids, r.max_new, self.max_len - len(r.prompt),
                              min_tokens=r.params.min_tokens)
            p = r.params
            if p.host_only:
                r.sampler = Sampler(SamplingParams(**{**p.__dict__, "seed": r.seed}), self.n_vocab)
            else:
                r.device = Sampling(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                                    seed=r.seed)
            if r.constraint is not None:
                r.matcher = r.constraint.matcher()
            r.t_admit = time.perf_counter()
            self.running.append(r)
            m = self.metrics
            if m is not None:
                m.queue.observe(r.t_admit - r.t_arrival)
                m.prompt_tokens.inc(len(r.prompt))
                if self.pc is not None:
                    m.prefix_queries.inc(len(r.prompt))
                    m.prefix_hits.inc(r.n_cached)
            if self.pc is not None:
                self.pc.queries += len(r.prompt)
                self.pc.hits += r.n_cached
            with self._lock:
                self._n_running = len(self.running)
        self._admitting = None

    def _row(self, r: GenRequest, tokens, last: bool, mask=None, gen: bool | None = None) -> Row:
        """A row of r; last: it ends at the position whose next token r takes now; mask:
        its vocabulary mask (a constrained request); gen: runner.Row.gen (True: a forced run
        and the sampled token before it; False: a prompt chunk; None: a decode row)."""
        if not last:
            return Row(r.seq, tokens, gen=gen)
        return Row(r.seq, tokens, logits="last" if r.wants_logits else "none", sample=r.device, mask=mask, gen=gen)

    def _fill_masks(self, reqs, host_only: bool = False) -> list:
        """Each request's mask row for this step (None for unconstrained ones): the
        constrained ones' next-token masks, filled in one batch by llguidance. host_only:
        only the requests sampled on the host (penalties, logit bias), whose masks the
        scheduler reads."""
        from memra.text.grammar import fill_masks, new_masks

        idx = [i for i, r in enumerate(reqs) if r.matcher is not None and (r.sampler is not None or not host_only)]
        if not idx:
            return [None] * len(reqs)
        if self._masks is None:
            self._masks = new_masks(MAX_ROWS, self.n_vocab)
        fill_masks([(reqs[i].matcher, k) for k, i in enumerate(idx)], self._masks)
        out = [None] * len(reqs)
        for k, i in enumerate(idx):
            out[i] = self._masks[k]
        return out

    def _chain_len(self, dec, ffw, pre) -> int:
        """How many decode steps to chain on the device now (0: one ordinary step). Only when
        every running request decodes a token a step on the device sampler (no prompt, forced
        run, constraint, host sampler, logits or speculation) and has sent text already,
        nobody waits, and each has at least two tokens left to make."""
        if self.chain < 2 or pre or ffw or not dec or len(dec) > MAX_ROWS or self.waiting or self._inbox \
                or not hasattr(self.engine, "decode_run") \
                or (self.spec is not None and len(dec) <= self.spec.max_batch):
            return 0
        # no chain before a request's first text reaches its client: a token's text may wait
        # for the next ones (part of a character, a possible stop string), and the first
        # chunk (its client's time to first token) should not wait for a whole chain
        if any(r.device is None or r.sampler is not None or r.matcher is not None or r.logprobs is not None
               or r.wants_logits or r.cancelled or not r.ts.sent for r in dec):
            return 0
        n = min(r.max_new - len(r.generated) for r in dec)
        return n if n >= 2 else 0

    def _chain(self, dec, n: int) -> None:
        """Up to n decode steps of `dec` replayed on the device, `self.chain` a read-back (the
        runner's decode_run: the sampler writes each row's next token and position back, and
        the next chunk is queued before a chunk's tokens are handed out, so the device computes
        it while they are detokenized and sent), their tokens handed out in step order as
        ordinary steps would, sent (and the gauges refreshed) after each chunk. The chain ends
        early, after the chunks already computed, once a request arrives, one of these
        finishes or is cancelled, or the server stops. The same graph on the same inputs and the sampler's
        draw a function of (logits, seed, position): each row's tokens are the ordinary
        steps'. A row that finishes inside the chain (a stop, an end of generation) drops the
        rest of its tokens; its sequence is closed, and the prefix cache registers only blocks
        whose tokens it knows (memra.serve.prefix_cache.register)."""
        def more() -> bool:
            return not (self._stop or self.waiting or self._inbox) and \
                all(r.finish is None and not r.cancelled for r in dec)

        t0 = time.perf_counter()
        done = 0
        for toks in self.engine.decode_run([r.seq for r in dec], [r.next_tok for r in dec], n,
                                           [r.device for r in dec], chunk=self.chain, more=more):
            for r, t in zip(dec, toks):
                if r.finish is None:
                    self._token(r, RowOut(token=t))
            done += 1
            if done % self.chain == 0:
                self._flush()
                self._gauges()
        self.costs.observe("graph", len(dec), (time.perf_counter() - t0) / max(done, 1))
        self.steps += done - 1

    def _step(self) -> None:
        dec = [r for r in self.running if r.next_tok is not None and not r.forced]
        ffw = [r for r in self.running if r.next_tok is not None and r.forced]
        pre = [r for r in self.running if r.next_tok is None]
        n = self._chain_len(dec, ffw, pre)
        if n:
            self._chain(dec, n)
            self.steps += 1
            return
        if self.spec is not None and 0 < len(dec) <= self.spec.max_batch:
            dec = [r for r in dec if not self._spec_step(r)]
        # forced runs: with a prompt in progress they ride the step's eager call (its host
        # launches are paid anyway); else self.costs picks from measured times between one
        # joint call (one request alone and device-sampled: a verification step, a captured
        # graph; else one eager call) and feeding them a token a step on the decode graph
        drip, ffv = [], None
        if ffw and not pre:
            one = ffw[0]
            joint = "verify" if len(ffw) == 1 and one.device is not None and hasattr(self.engine, "verify") \
                and 1 + len(one.forced) <= MAX_ROWS else "eager"
            pick = self.costs.choose([1 + len(r.forced) for r in ffw], len(dec), joint)
            if pick == "drip":
                drip, ffw = ffw, []
            elif pick == "verify":
                ffv, ffw = one, []
        budget = self.budget - len(dec) - len(drip) - sum(1 + len(r.forced) for r in ffw)
        chunks = []
        for r in pre:
            left = len(r.prompt) - r.pos
            n = min(left, budget)
            if n <= 0:
                if chunks or dec or ffw:
                    break
                n = min(left, self.budget)  # an idle step always moves the first prompt
            chunks.append((r, n))
            budget -= n
        dripping = {id(r) for r in drip}
        plain = dec + drip
        for i in range(0, len(plain), MAX_ROWS):
            group = plain[i:i + MAX_ROWS]
            # constrained rows sampled on the device: their masks are filled (LATER) while
            # the engine computes the step's logits; host-sampled ones (penalties, bias) now; a
            # dripping run's token is fed unsampled (its run's last token samples next step)
            samp = [r for r in group if id(r) not in dripping]
            late = {id(r) for r in samp if r.matcher is not None and r.sampler is None} \
                if self.overlap_masks else set()
            mask_of = dict(zip((id(r) for r in samp), self._fill_masks(samp, host_only=bool(late))))
            rows = [Row(r.seq, [r.next_tok]) if id(r) in dripping else
                    self._row(r, [r.next_tok], True, LATER if id(r) in late else mask_of[id(r)]) for r in group]
            t0 = time.perf_counter()
            if late:
                from memra.text.grammar import fill_masks

                pairs = [(r.matcher, k) for k, r in enumerate(group) if id(r) in late]
                outs = self.engine.step(rows, fill=lambda buf: fill_masks(pairs, buf))
            else:
                outs = self.engine.step(rows)
            self.costs.observe("graph", len(group), time.perf_counter() - t0)
            for r, o in zip(group, outs):
                if id(r) in dripping:
                    self._drip(r)
                else:
                    self._token(r, o, mask_of[id(r)])
        if ffv is not None:
            self._ff_verify(ffv)
        if chunks or ffw:
            # forced runs go with the prompt chunks: rows of several tokens (the runner's eager
            # path), the last sampled token then the forced ones, sampled after the last under
            # the mask fast_forward left (or one filled now)
            for r in ffw:
                self._ff_ready(r)
            ending = [r for r, n in chunks if r.pos + n == len(r.prompt)]
            masks = dict(zip((id(r) for r in ending), self._fill_masks(ending)[:len(ending)]))
            masks.update((id(r), r.ff_mask) for r in ffw)
            rows = [self._row(r, [r.next_tok] + r.forced, True, r.ff_mask, gen=True) for r in ffw]
            rows += [self._prompt_row(r, n, masks.get(id(r))) for r, n in chunks]
            t0 = time.perf_counter()
            outs = self.engine.step(rows)
            self.costs.observe("eager", sum(len(x.tokens) for x in rows), time.perf_counter() - t0)
            for r, o in zip(ffw, outs):
                self._token(r, o, masks[id(r)])
            for (r, n), o in zip(chunks, outs[len(ffw):]):
                if r.prompt_logprobs is not None:
                    o = self._prompt_lps(r, n, o)
                r.pos += n
                if r.pos < len(r.prompt):
                    self._register(r)
                elif r.max_new == 0:  # echo with max_tokens 0: the prompt's log-probs were the reply
                    self._end(r, "length")
                else:
                    self._token(r, o, masks.get(id(r)))
        self.steps += 1

    def _prompt_row(self, r: GenRequest, n: int, mask) -> Row:
        """The row of r's next n prompt tokens (every position's logits when r asked for the prompt's log-probs)."""
        row = self._row(r, r.prompt[r.pos:r.pos + n], r.pos + n == len(r.prompt), mask, gen=False)
        if r.prompt_logprobs is not None:
            row.logits = "all"
        return row

    def _prompt_lps(self, r: GenRequest, n: int, o: RowOut) -> RowOut:
        """Log-probs of the prompt tokens that positions r.pos .. r.pos + n - 1 predict (the first prompt token has
        none); at the prompt's end the ("prompt", entries) event, and the last position's logits as a row's "last"."""
        if r.pos == 0:
            r.prompt_lps.append((r.prompt[0], None))
        for i in range(n):
            a = r.pos + i + 1
            if a < len(r.prompt):
                r.prompt_lps.append((r.prompt[a], logprob_entry(o.logits[i], r.prompt[a], r.prompt_logprobs)))
        if r.pos + n < len(r.prompt):
            return o
        self._send(r, ("prompt", r.prompt_lps))
        return RowOut(token=o.token, logits=o.logits[n - 1])

    def _drip(self, r: GenRequest) -> None:
        """r's run advanced by the one token a decode step fed: the next one is fed next
        (the last is sampled after, under the mask its position gets then)."""
        r.next_tok = r.forced.pop(0)
        r.ff_mask = None
        if self.pc is not None and r.seq.n // self.kv.block > r.registered:
            self._register(r)

    def _ff_verify(self, r: GenRequest) -> None:
        """r's forced run fed alone as a verification step (the engine's verify: on the GPU a
        graph captured per row count) over [sampled, f1..fk]. Exact: every row has decode's
        bits (the runner's contract), rows 0..k-1 are masked to their forced token alone
        (fast_forward took each only where its position's mask allows nothing else), so they
        must choose f1..fk (checked), and row k, under the mask fast_forward left, is drawn
        from the same logits, seed and position as the eager row's head or a decode step
        would draw it: out[-1] is the token those paths give."""
        from memra.text.grammar import one_hot

        self._ff_ready(r)
        toks = [r.next_tok] + r.forced
        masks = np.concatenate([one_hot(r.forced, self.n_vocab), r.ff_mask[None, :]])
        t0 = time.perf_counter()
        out = self.engine.verify(r.seq, toks, r.device, masks=masks)
        self.costs.observe("verify", len(toks), time.perf_counter() - t0)
        if len(out) != len(toks) or out[:-1] != r.forced:
            raise MemraError(f"a forced run's verification chose {out[:-1]}, not the forced {r.forced}")
        self._token(r, RowOut(token=out[-1]), r.ff_mask)

    def _spec_step(self, r: GenRequest) -> bool:
        """Speculative decoding of r (memra.spec): its draft verified in one step of K+1 token
        rows, the accepted tokens and the first choice after them emitted (plain decode's
        tokens: the device sampler's draw at each position), the rest rewound. A constrained
        request's draft is cut at the first token its grammar rejects (and after one that
        completes it) and each row is masked as its position would be in plain constrained
        decoding (memra.spec.decode.cut_draft); the emitted tokens advance its matcher, the
        last one's forced tokens are fast-forwarded as after a decode step. False (r takes a
        plain decode row): nothing drafted (or nothing the grammar allows), or r needs host
        sampling or logprobs."""
        if r.device is None or r.logprobs is not None:
            return False
        from memra.spec.decode import SpecRow, accepted, cut_draft

        if r.spec is None:
            r.spec = SpecRow(self.spec.new_drafter(), self.spec.k, r.prompt)
        draft = r.spec.draft(r.generated, r.max_new - len(r.generated) - 1)
        masks = None
        if draft and r.matcher is not None:
            draft, masks = cut_draft(r.matcher, draft, self.n_vocab)
        if not draft:
            return False
        n0 = r.seq.n
        out = self.engine.verify(r.seq, [r.next_tok] + draft, r.device, masks=masks)
        j = accepted(draft, out)
        if r.seq.n > n0 + 1 + j:
            self.engine.rewind(r.seq, n0 + 1 + j)
        r.spec.policy.update(len(draft), j)
        if self.metrics is not None:
            self.metrics.spec_draft_tokens.inc(len(draft))
            self.metrics.spec_accepted_tokens.inc(j)
        emit = draft[:j] + [out[j]]
        for k, t in enumerate(emit):
            # forced tokens after an accepted draft token are the next draft tokens (the
            # only ones their masks allow) or its first rejection: fast-forward after the last
            self._token(r, RowOut(token=t), ff=k == len(emit) - 1)
            if r.finish is not None:
                break
        return True

    def _register(self, r: GenRequest) -> None:
        if self.pc is not None and r.seq is not None:
            toks = r.prompt + r.generated
            # an engine whose prompt rows and decode rows differ in bits (MEMRA_ATTN=hybrid)
            # shares only blocks of prompt rows: a later request recomputes a reply's blocks as
            # prompt rows, so a hit gives the tokens a recomputation gives
            n = r.seq.n if self.prefill_exact else min(r.seq.n, len(r.prompt))
            r.registered = self.pc.register(r.namespace, toks, r.seq.slot, n, r.registered)

    def _ff_row(self, r: GenRequest) -> np.ndarray:
        """r's own mask row for fast_forward (kept for its next step's sampler)."""
        if r.ff_buf is None:
            from memra.text.grammar import new_masks

            r.ff_buf = new_masks(1, self.n_vocab)[0]
        return r.ff_buf

    def _ff_ready(self, r: GenRequest) -> None:
        """r.ff_mask: the mask of the position after r's forced run (fast_forward's, or filled now)."""
        if r.ff_mask is None:
            r.matcher.fill(self._ff_row(r))
            r.ff_mask = r.ff_buf

    def _emit(self, r: GenRequest, token: int, lp=None):
        """One generated token of r to its text stream and its client; the finish, if it ends r."""
        now = time.perf_counter()
        m = self.metrics
        if m is not None:
            if r.t_first is None:
                m.ttft.observe(now - r.t_arrival)
            else:
                m.itl.observe(now - r.t_last)
            m.generation_tokens.inc()
        if r.t_first is None:
            r.t_first = now
        r.t_last = now
        return self._push(r, token, lp)

    def _push(self, r: GenRequest, token: int, lp=None):
        """token through r's text stream to its client; the finish, if it ends r. A token's log-prob goes out
        with the text that releases the token's own (a possible stop string or part of a character is held);
        at the end every held one goes out, except after a stop string: its tokens are not in the reply."""
        r.generated.append(token)
        if lp is not None:
            r.held.append((token, lp, len(r.ts.out)))
        text, finish = r.ts.push(token)
        k = len(r.held) if finish not in (None, "stop") else \
            next((i for i, h in enumerate(r.held) if h[2] >= r.ts.sent), len(r.held))
        out, r.held = r.held[:k], r.held[k:]
        self._send(r, ("token", token, text, out))
        return finish

    def _token(self, r: GenRequest, out, mask=None, ff: bool = True) -> None:
        if r.sampler is not None:
            logits = out.logits
            if mask is not None:
                from memra.text.grammar import masked

                logits = masked(logits, mask)
            if len(r.generated) < r.params.min_tokens:  # no end before min_tokens: its tokens cannot be chosen
                logits = np.array(logits, np.float32)
                logits[list(r.ts.stop_ids)] = -np.inf
            token = r.sampler.sample(logits, r.prompt + r.generated)
        else:
            token = int(out.token)
        if r.matcher is not None and not r.matcher.consume(token):
            self._end(r, None, error=f"the constraint rejected token {token}: "
                                     f"{r.matcher.error or 'no token was allowed'}")
            return
        lp = logprob_entry(out.logits, token, r.logprobs) if r.logprobs is not None else None
        finish = self._emit(r, token, lp)
        r.next_tok = token
        r.forced, r.ff_mask = [], None
        if finish is None and r.matcher is not None and self.fast_forward and ff and r.logprobs is None:
            # the tokens the grammar forces next (each the only one its position's mask
            # allows: what the sampler would choose there), emitted now and fed with `token`
            # in the next step's row; at most what the token limit and one step's budget
            # leave (per-token log-probs would need each position's logits: not forwarded)
            from memra.text.grammar import fast_forward

            left = min(r.max_new - len(r.generated), self.budget - 1)
            forced, ready = fast_forward(r.matcher, left, self._ff_row(r))
            if r.sampler is not None:
                r.sampler.skip(len(forced))  # the draws sample() would have made there
            for t in forced:
                r.forced.append(t)
                r.n_forced += 1
                self.forced_tokens += 1
                if self.metrics is not None:
                    self.metrics.forced_tokens.inc()
                finish = self._emit(r, t)
                if finish is not None:
                    break
            if ready and finish is None:
                r.ff_mask = r.ff_buf
        if finish is None and r.matcher is not None and r.matcher.stopped and not r.ignore_eos \
                and self.tok.eog_ids:
            # the grammar is complete: its mask would allow the end-of-generation ids alone,
            # so the request ends here without another model step (the text is the same)
            finish = self._push(r, min(self.tok.eog_ids))
        if self.pc is not None and r.seq.n // self.kv.block > r.registered:
            self._register(r)
        if finish is not None:
            self._end(r, "stop" if finish in ("eos", "stop") else finish)

    def _end(self, r: GenRequest, finish: str | None, error: str | None = None) -> None:
        """Finish (or fail) a running request: its blocks to the prefix cache, its sequence closed."""
        try:
            if error is None:
                self._register(r)
        finally:
            if r.seq is not None:
                self.engine.close(r.seq)
            if r in self.running:
                self.running.remove(r)
            with self._lock:
                self._n_running = len(self.running)
        r.finish = finish or "error"
        m = self.metrics
        if m is not None:
            m.success.labels(finished_reason=r.finish).inc()
            if r.t_last is not None and error is None:
                m.e2e.observe(r.t_last - r.t_arrival)
        if error is not None:
            self._send(r, ("error", error))
        elif finish != "abort":
            self._send(r, ("done", finish, {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.generated),
                                     "cached_tokens": r.n_cached}))


def chain_steps() -> int:
    """Decode steps the scheduler chains on the device when only plain decode rows run
    (MEMRA_SERVE_CHAIN, default 8; 0 or 1: every step its own runner call)."""
    v = os.environ.get("MEMRA_SERVE_CHAIN", "").strip()
    if not v:
        return 8
    if not v.isdigit() or not 0 <= int(v) <= 64:
        raise MemraError(f"MEMRA_SERVE_CHAIN must be an integer 0..64, got {v!r}")
    return int(v)


# -- opening an engine ---------------------------------------------------------------------------

def open_engine(gguf, cfg, device: str, *, ctx: int, parallel: int, kv_memory: int | None = None,
                cache_type_k: str = "f16", cache_type_v: str = "f16"):
    """The runner for `device` ("gpu": memra.gpu.runner.Runner, weights on the device;
    "cpu": memra.serve.cpu_engine.CpuRunner), ready to step: kernels compiled and every
    decode graph bucket captured (GPU), the reference's kernels compiled (CPU). A KV cache
    type the device cannot run is refused first."""
    from memra.gpu.kv import check_cache_device

    check_cache_device(device, cache_type_k, cache_type_v)
    if device == "cpu":
        from memra.serve.cpu_engine import CpuRunner

        eng = CpuRunner(gguf, cfg, max_len=ctx, max_seqs=parallel, kv_memory=kv_memory,
                        cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        eng.warm_up()
        return eng
    from memra.gpu.runner import Runner

    eng = Runner(gguf, cfg, max_len=ctx, max_seqs=parallel, kv_memory=kv_memory, cache_type_k=cache_type_k,
                 cache_type_v=cache_type_v)
    if eng.kv.alloc.n_blocks < eng.kv.max_blocks:
        log.warning("the KV pool (%d blocks) cannot hold one full context (%d blocks): long requests get 400",
                    eng.kv.alloc.n_blocks, eng.kv.max_blocks)
    warm_up_gpu(eng)
    return eng


def warm_up_gpu(eng) -> None:
    """Compile and capture before serving: a prefill of a chunk and a half (its head and the
    sampler), a step of every other prefill bucket's row count (each bucket's graph: a
    request's first chunk of that size does not pay the capture), then a decode step at every
    graph bucket for each sampler kind (greedy, seeded sampling, logits only, and the first two
    with a constrained row's vocabulary mask), through the runner's public step()."""
    from memra.gpu.plan import PREFILL_BUCKETS, PREFILL_CHUNK, graph_bucket, prefill_bucket

    t0 = time.perf_counter()
    tok = 1 if eng.cfg.n_vocab > 1 else 0
    n = min(eng.max_seqs, MAX_ROWS)
    seqs = [eng.open() for _ in range(n)]
    cap = eng.max_len - 1  # a prompt's tokens (one position left to generate)

    def prompt_rows(m: int):
        """m prompt tokens over the open sequences, at most `cap` each, or None when they do
        not fit or would all be one token (a decode step, not a prefill chunk)."""
        rows, i = [], 0
        while m > 0 and i < n:
            k = min(m, cap)
            rows.append(Row(seqs[i], [tok] * k))
            m, i = m - k, i + 1
        return rows if m == 0 and any(len(r.tokens) > 1 for r in rows) else None

    try:
        first = min(cap, PREFILL_CHUNK + PREFILL_CHUNK // 2)
        eng.step([Row(seqs[0], [tok] * first, sample=Sampling(0.0))])
        eng.rewind(seqs[0], 0)
        done = {prefill_bucket(min(PREFILL_CHUNK, first - s)) for s in range(0, first, PREFILL_CHUNK)}
        for b in PREFILL_BUCKETS:
            if b in done:
                continue
            # a step's rows are cut into chunks of PREFILL_CHUNK: a one-row chunk is the last
            # of PREFILL_CHUNK + 1 rows (several sequences' prompts when one context is shorter)
            rows = prompt_rows(b if b > 1 else PREFILL_CHUNK + 1)
            if rows is not None:
                eng.step(rows)
                for r in rows:
                    eng.rewind(r.seq, 0)
        eng.capture_prefill_splits()  # those buckets at every split count a deeper chunk launches
        buckets = sorted({graph_bucket(k) for k in range(1, n + 1)})
        every = np.full((eng.cfg.n_vocab + 31) // 32, -1, np.int32)  # a constrained row's graph (kernels/mask.cu)
        kinds = [(Sampling(0.0), None), (Sampling(0.8, 40, 0.95, 0.05, 1), None), (None, None),
                 (Sampling(0.0), every), (Sampling(0.8, 40, 0.95, 0.05, 1), every)]
        for b in buckets:
            for s, m in kinds:
                if any(q.n + 1 >= eng.max_len for q in seqs[:b]):
                    for q in seqs[:b]:
                        eng.rewind(q, 0)
                eng.step([Row(q, [tok], logits="none" if s is not None else "last", sample=s, mask=m)
                          for q in seqs[:b]])
        eng.capture_decode_splits()  # MEMRA_ATT_DEPTH: those graphs at every split count a deeper step launches
    finally:
        for q in seqs:
            eng.close(q)
    log.info("engine warm: prefill graphs and decode graphs for %d buckets captured in %.1f s", len(buckets),
             time.perf_counter() - t0)
