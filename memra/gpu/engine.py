"""GPUEngine: the runner (memra.gpu.runner) seen as `batch` sequences with one shared
context size — the single-stream API that `memra bench`, the argmax gate, the CPU
reference's protocol and the tests drive.

    e = GPUEngine("model.gguf", n_ctx=4096)
    logits = e.prefill(ids)                 # appends ids, float32 [n_vocab] of the last one
    logits = e.decode(token)                # appends one token
    ids = e.generate_greedy(prompt_ids, n)  # graph replays; 4 bytes a token come back
    ids = e.generate(prompt_ids, n, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)

The exactness gates that drive it (prefill vs decode, and against the CPU reference) are in
memra.gpu.gate.

It also speaks the CPU reference's protocol (`new_cache(n_ctx)`, `forward(tokens, cache)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from memra.errors import ContextOverflowError, MemraError
from memra.gpu.runner import DECODE_CHUNK, MAX_ROWS, PREFILL_CHUNK, Row, Runner, Sampling

__all__ = ["GPUEngine", "Engine", "PREFILL_CHUNK"]


@dataclass
class GPUCache:
    """A handle on one sequence of the engine (the reference protocol's cache object).
    `pos` tokens are stored; setting it lower rewinds."""
    engine: "GPUEngine"
    n_ctx: int
    seq: int = 0
    pos: int = 0


class GPUEngine(Runner):
    # forward(tokens) leaves every position's logits and KV rows as one-token forwards would
    # (the runner's contract; memra.gpu.gate checks prefill = decode): memra.session feeds a
    # constraint's forced tokens with the sampled one in one step
    prefill_is_decode = True

    def __init__(self, model, cfg=None, n_ctx: int | None = None, batch: int = 1, gpu=None,
                 matvec_path: str | None = None, pdl: bool | None = None, tune_table=None, **kw):
        if not 1 <= int(batch) <= MAX_ROWS:
            raise MemraError(f"batch must be in 1..{MAX_ROWS}, got {batch}")
        self.batch = int(batch)
        super().__init__(model, cfg, max_len=n_ctx, max_seqs=max(self.batch, kw.pop("max_seqs", self.batch)),
                         gpu=gpu, matvec_path=matvec_path, pdl=pdl, tune_table=tune_table, **kw)
        self.seqs = [self.open() for _ in range(self.batch)]

    @property
    def n_ctx(self) -> int:
        return self.max_len

    @property
    def pos(self) -> list[int]:
        return [s.n for s in self.seqs]

    def reset(self, n_ctx: int | None = None) -> None:
        """Forget every sequence's tokens."""
        if n_ctx is not None and n_ctx != self.max_len:
            raise MemraError(f"this engine holds {self.max_len} positions per sequence; build another "
                             f"for {n_ctx}")
        for s in self.seqs:
            self.rewind(s, 0)

    def prefill(self, ids: Sequence[int], seq: int = 0, all_logits: bool = False, gen: bool = False) -> np.ndarray:
        """Append `ids` to sequence `seq`; returns the float32 logits of the last token
        ([n_vocab]) or of every token ([len(ids), n_vocab]) with all_logits. gen: feed them as
        generated rows (runner.Row.gen; with MEMRA_ATTN=hybrid decode's attention), not prompt."""
        toks = self._check_tokens(ids)
        s = self.seqs[seq]
        if s.n + toks.size > self.max_len:
            raise ContextOverflowError(f"{s.n} cached + {toks.size} new tokens exceed the context of "
                                       f"{self.max_len} tokens")
        return self.step([Row(s, toks, logits="all" if all_logits else "last", gen=gen)])[0].logits

    def decode(self, token: int, graph: bool = True, seq: int = 0) -> np.ndarray:
        """Append one token to sequence `seq` and return its float32 logits [n_vocab].
        graph=False runs the decode step's launches eagerly (the replay-vs-eager check)."""
        toks = self._check_tokens([token])
        return self.step([Row(self.seqs[seq], toks, logits="last")], graph=graph)[0].logits

    def decode_batch(self, tokens: Sequence[int], graph: bool = True) -> np.ndarray:
        """One token for each of the `batch` sequences; logits [batch, n_vocab]."""
        toks = self._check_tokens(tokens)
        if toks.size != self.batch:
            raise MemraError(f"decode_batch needs {self.batch} tokens, got {toks.size}")
        out = self.step([Row(s, [int(t)], logits="last") for s, t in zip(self.seqs, toks)], graph=graph)
        return np.stack([o.logits for o in out])

    def _generate(self, prompts, n: int, sampling: Sampling) -> list[list[int]]:
        if len(prompts) != self.batch:
            raise MemraError(f"this engine decodes {self.batch} sequences at a time, got {len(prompts)} prompts")
        if n <= 0:
            return [[] for _ in prompts]
        self.reset()
        longest = max(len(p) for p in prompts) + n - 1
        if longest > self.max_len:
            raise ContextOverflowError(f"prompt + {n} tokens need {longest} positions, the context holds "
                                       f"{self.max_len}")
        first = self.step([Row(s, p, sample=sampling, gen=False) for s, p in zip(self.seqs, prompts)])
        toks = [[o.token] for o in first]
        for step in self.decode_run(self.seqs, [t[0] for t in toks], n - 1, [sampling] * self.batch):
            for b, t in enumerate(step):
                toks[b].append(t)
        return toks

    def stream(self, prompt_ids: Sequence[int], n: int, *, temperature: float = 0.0, top_k: int = 40,
               top_p: float = 0.95, min_p: float = 0.05, seed: int = 0, chunk: int = DECODE_CHUNK):
        """Yield up to n tokens after the prompt (sequence 0, batch 1; the cache is reset
        first), chosen on the device; read back every `chunk` steps."""
        if self.batch != 1:
            raise MemraError("stream drives batch 1")
        if n <= 0:
            return
        sm = Sampling(temperature, top_k, top_p, min_p, seed)
        self.reset()
        s = self.seqs[0]
        first = self.step([Row(s, prompt_ids, sample=sm, gen=False)])[0].token
        yield first
        for step in self.decode_run([s], [first], n - 1, [sm], chunk=chunk):
            yield step[0]

    def stream_logits(self, prompt_ids: Sequence[int], n: int, *, temperature: float = 0.0, top_k: int = 40,
                      top_p: float = 0.95, min_p: float = 0.05, seed: int = 0):
        """stream() with each token's logits: yield up to n (token, float32 [n_vocab] logits
        it was drawn from) after the prompt (sequence 0, batch 1; the cache is reset first).
        Every step is the server's decode row for a request with logprobs (the device
        sampler's draw and the row's logits read back): the tokens are stream()'s."""
        if self.batch != 1:
            raise MemraError("stream_logits drives batch 1")
        if n <= 0:
            return
        sm = Sampling(temperature, top_k, top_p, min_p, seed)
        self.reset()
        s = self.seqs[0]
        o = self.step([Row(s, prompt_ids, logits="last", sample=sm, gen=False)])[0]
        for i in range(n):
            yield o.token, np.array(o.logits, np.float32)
            if i + 1 < n:
                o = self.step([Row(s, [o.token], logits="last", sample=sm)])[0]

    def generate_greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        """n greedy tokens after the prompt (sequence 0; the cache is reset first)."""
        return self._generate([prompt_ids] * self.batch, n, Sampling(0.0))[0]

    def generate_greedy_batch(self, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        return self._generate(prompts, n, Sampling(0.0))

    def generate(self, prompt_ids: Sequence[int], n: int, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, seed: int = 0) -> list[int]:
        """n tokens drawn on the device (llama.cpp's order: top-k, top-p, min-p, temperature);
        the same seed gives the same tokens."""
        return self._generate([prompt_ids] * self.batch, n, Sampling(temperature, top_k, top_p, min_p, seed))[0]

    # -- the CPU reference's protocol (memra.session, the CLI) -----------------------------
    def new_cache(self, n_ctx: int) -> GPUCache:
        if n_ctx > self.max_len:
            raise ContextOverflowError(f"a context of {n_ctx} exceeds this engine's {self.max_len}")
        self.reset()
        return GPUCache(self, n_ctx)

    def forward(self, tokens: Sequence[int], cache: GPUCache, all_logits: bool = False) -> np.ndarray:
        if cache.engine is not self:
            raise MemraError("this cache belongs to another engine")
        s = self.seqs[cache.seq]
        if cache.pos < s.n:
            self.rewind(s, cache.pos)  # the caller rewound it
        toks = self._check_tokens(tokens)
        if toks.size == 1 and not all_logits:
            logits = self.decode(int(toks[0]), seq=cache.seq)
        else:
            logits = self.prefill(toks, seq=cache.seq, all_logits=all_logits)
        cache.pos = s.n
        return logits

    def forward_run(self, tokens: Sequence[int], cache: GPUCache, all_logits: bool = False) -> np.ndarray:
        """forward() for a short run (at most 64 tokens: a sampled token and the ones a
        constraint forced after it, or a draft to verify on the host) as a verification
        step, Runner.verify: its graph is captured per row count, so the run costs about a
        decode step instead of an eager step's host launches. The same logits as forward
        (the verify rows have decode's bits): the last token's, or every token's."""
        if cache.engine is not self:
            raise MemraError("this cache belongs to another engine")
        s = self.seqs[cache.seq]
        if cache.pos < s.n:
            self.rewind(s, cache.pos)
        _, lg = self.verify(s, tokens, Sampling(0.0), logits="all" if all_logits else "last")
        cache.pos = s.n
        return lg


Engine = GPUEngine  # the name memra.cli loads
