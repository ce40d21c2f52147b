"""Token sampling on the CPU, in llama.cpp's default order.

The chain is llama.cpp's `common_sampler` default: logit bias → penalties → top-k → top-p →
min-p → temperature → a seeded draw. Note the consequence of that order: top-p and min-p
judge the *untempered* distribution; temperature only reshapes what survives them. A
temperature of 0 (or below) is greedy: the argmax after the bias and penalties. Draws come
from numpy's PCG64 seeded once per `Sampler`, so the same seed, logits and history give the
same tokens.
The parameters' defaults are llama.cpp's. `check_request` is the one validation of a
request's parameters (ranges, context size, warnings): `memra run` calls it, and so will the
server.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from memra.errors import ContextOverflowError, MemraError

# OpenAI's bound on a logit_bias value (the server's and `memra run --logit-bias`'s)
MAX_LOGIT_BIAS = 100


@dataclass
class SamplingParams:
    temperature: float = 0.8  # 0 (or less): greedy
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off; keep tokens with p >= min_p * p_max
    seed: int | None = None  # None: a fresh random seed
    repeat_penalty: float = 1.0  # 1: off; divides positive logits, multiplies negative ones
    presence_penalty: float = 0.0  # subtracted once from every token seen in the window
    frequency_penalty: float = 0.0  # subtracted per occurrence in the window
    repeat_last_n: int = 64  # penalty window over the history; 0: off, -1: the whole history
    max_tokens: int = -1  # -1: until end of generation or the context is full
    stop: list[str] = field(default_factory=list)  # stop strings (not part of the output)
    stop_ids: list[int] = field(default_factory=list)  # extra end-of-generation token ids
    # token id -> added to its raw logit before anything else (OpenAI's logit_bias), each
    # finite and in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]: -100 all but bans a token, +100 all
    # but forces it
    logit_bias: dict[int, float] = field(default_factory=dict)
    # the server's min_tokens (vLLM's): end-of-generation and stop_ids tokens are not chosen, and
    # stop strings not matched, before this many tokens (the host sampler chooses: host_only)
    min_tokens: int = 0

    def validate(self, names: Mapping[str, str] | None = None, n_vocab: int | None = None) -> None:
        """Raise MemraError for the first parameter out of its range. `names` maps a field to
        what the caller's user typed (the CLI passes its flags, e.g. top_p -> --top-p); the
        server passes nothing and its messages name the request's fields. With `n_vocab`
        (the vocabulary's size, where it is known) a logit_bias id must be below it."""
        n = _namer(names)
        if not _real(self.temperature) or self.temperature < 0:
            raise MemraError(f"{n('temperature')} must be a finite number >= 0 (0 is greedy), "
                             f"got {self.temperature}")
        if not _integer(self.top_k) or self.top_k < 0:
            raise MemraError(f"{n('top_k')} must be an integer >= 0 (0 turns it off), got {self.top_k}")
        if not _real(self.top_p) or not 0.0 <= self.top_p <= 1.0:
            raise MemraError(f"{n('top_p')} must be in [0, 1] (1 turns it off), got {self.top_p}")
        if not _real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise MemraError(f"{n('min_p')} must be in [0, 1] (0 turns it off), got {self.min_p}")
        if not _real(self.repeat_penalty) or self.repeat_penalty <= 0:
            raise MemraError(f"{n('repeat_penalty')} must be a positive number (1 turns it off), "
                             f"got {self.repeat_penalty}")
        for f in ("presence_penalty", "frequency_penalty"):
            if not _real(getattr(self, f)):
                raise MemraError(f"{n(f)} must be a finite number, got {getattr(self, f)}")
        if not _integer(self.repeat_last_n) or self.repeat_last_n < -1:
            raise MemraError(f"{n('repeat_last_n')} must be an integer >= -1 (0 off, -1 the whole "
                             f"history), got {self.repeat_last_n}")
        if not _integer(self.max_tokens) or self.max_tokens < -1:
            raise MemraError(f"{n('max_tokens')} must be -1 (until the end) or a token count >= 0, "
                             f"got {self.max_tokens}")
        if self.seed is not None and (not _integer(self.seed) or not 0 <= self.seed < 2 ** 64):
            raise MemraError(f"{n('seed')} must be an integer in [0, 2^64), got {self.seed}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise MemraError(f"{n('stop')} strings must not be empty")
        if not _integer(self.min_tokens) or self.min_tokens < 0:
            raise MemraError(f"{n('min_tokens')} must be an integer >= 0, got {self.min_tokens}")
        if self.max_tokens >= 0 and self.min_tokens > self.max_tokens:
            raise MemraError(f"{n('min_tokens')} {self.min_tokens} is more than {n('max_tokens')} {self.max_tokens}")
        if any(not _integer(t) or t < 0 for t in self.stop_ids):
            raise MemraError(f"{n('stop_ids')} must be token ids >= 0")
        if n_vocab is not None and any(t >= n_vocab for t in self.stop_ids):
            raise MemraError(f"{n('stop_ids')}: token id {max(self.stop_ids)} is outside the vocabulary [0, {n_vocab})")
        if not isinstance(self.logit_bias, Mapping):
            raise MemraError(f"{n('logit_bias')} must map token ids to biases")
        for t, b in self.logit_bias.items():
            if not _integer(t) or t < 0:
                raise MemraError(f"{n('logit_bias')}: {t!r} is not a token id (an integer >= 0)")
            if n_vocab is not None and t >= n_vocab:
                raise MemraError(f"{n('logit_bias')}: token id {t} is outside the vocabulary [0, {n_vocab})")
            if not _real(b) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
                raise MemraError(f"{n('logit_bias')}: the bias of token {t} must be a finite number in "
                                 f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}] (-{MAX_LOGIT_BIAS} all but bans "
                                 f"it), got {b}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def host_only(self) -> bool:
        """Whether only the host's Sampler can choose these tokens: the device samplers (the
        GPU's kernels/sample.cu, the server's CPU engine) have no penalties, no logit bias and
        no min_tokens, so a request with any takes its logits back and samples here."""
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 \
            or bool(self.logit_bias) or self.min_tokens > 0


def _real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and bool(np.isfinite(v))


def _integer(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _namer(names: Mapping[str, str] | None):
    return lambda field: (names or {}).get(field, field)


def check_request(params: SamplingParams, *, n_prompt: int | None = None, n_ctx: int | None = None,
                  n_ctx_train: int | None = None, n_vocab: int | None = None,
                  names: Mapping[str, str] | None = None) -> list[str]:
    """The one validation of a generation request, shared by `memra run` and the server.

    Raises MemraError for a parameter out of range (SamplingParams.validate; with `n_vocab`,
    a logit_bias id outside the vocabulary), a context size that is not positive, or a
    prompt that leaves no room in the context for one token (ContextOverflowError). Returns
    warnings for what runs but may go wrong: a context larger than the model was trained on
    (llama.cpp warns the same way: positions beyond the trained context are extrapolated and
    quality degrades). `names` as in SamplingParams.validate;
    the context's field is `n_ctx`."""
    n = _namer(names)
    params.validate(names, n_vocab)
    warnings = []
    if n_ctx is not None:
        if not _integer(n_ctx) or n_ctx <= 0:
            raise MemraError(f"{n('n_ctx')} must be a positive token count, got {n_ctx}")
        if n_ctx_train and n_ctx > n_ctx_train:
            warnings.append(f"{n('n_ctx')} {n_ctx} is beyond the {n_ctx_train} tokens this model was "
                            f"trained on: positions past {n_ctx_train} are extrapolated and the "
                            f"output may degrade")
        if n_prompt is not None and n_prompt >= n_ctx and params.max_tokens != 0:
            raise ContextOverflowError(f"the prompt has {n_prompt} tokens; the context holds {n_ctx} "
                                       f"and needs room for at least one more (raise {n('n_ctx')})")
    return warnings


# top alternatives a token's log-prob entry may list (OpenAI's top_logprobs bound)
MAX_TOP_LOGPROBS = 20


def logprob_entry(logits: np.ndarray, token: int, k: int):
    """(log p(token), [(id, log p)] of the k most likely, best first, ties by id) under the
    raw logits: before penalties, temperature, filters and any constraint mask, in float64.
    The one definition of a token's log-probability: the server's `logprobs`/`top_logprobs`
    (memra.serve.scheduler) and `memra run --logprobs` (memra.session) both call it."""
    x = np.asarray(logits, np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top = []
    if k > 0:
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return float(x[token] - lse), top


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class Sampler:
    """Picks the next token from one position's logits. Stateful only in its random stream."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        params.validate(n_vocab=n_vocab)
        self.params = params
        self.n_vocab = n_vocab
        # the logit bias as index and value arrays (read once: the params' map as it is now)
        self.bias_ids = np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias))
        self.bias = np.fromiter(params.logit_bias.values(), np.float64, len(params.logit_bias))
        self.seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(32)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))

    def apply_bias(self, logits: np.ndarray) -> np.ndarray:
        """Logits (float64 copy) with the logit bias added: the chain's first step."""
        x = np.array(logits, dtype=np.float64, copy=True).reshape(-1)
        x[self.bias_ids] += self.bias
        return x

    def apply_penalties(self, logits: np.ndarray, history) -> np.ndarray:
        """Logits (float64 copy) after repetition/presence/frequency penalties over the window."""
        p = self.params
        x = np.array(logits, dtype=np.float64, copy=True).reshape(-1)
        neutral = p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
        if neutral or p.repeat_last_n == 0 or not len(history):
            return x
        window = history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < x.size)
        ids, counts = ids[keep], counts[keep]
        v = x[ids]
        v = np.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
        v -= counts * p.frequency_penalty + (counts > 0) * p.presence_penalty
        x[ids] = v
        return x

    def candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, their logits) that survive top-k, top-p and min-p, best first."""
        p = self.params
        if 0 < p.top_k < x.size:
            idx = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        else:
            idx = np.arange(x.size)
        # best first; ties broken by token id so the order never depends on the partition
        idx = idx[np.lexsort((idx, -x[idx]))]
        v = x[idx]
        if p.top_p < 1.0:
            cum = np.cumsum(_softmax(v))
            # keep the smallest prefix whose probability mass reaches top_p
            n = int(np.searchsorted(cum, p.top_p, side="left")) + 1
            idx, v = idx[:n], v[:n]
        if p.min_p > 0.0:
            n = int(np.count_nonzero(v >= v[0] + np.log(p.min_p)))
            idx, v = idx[:max(n, 1)], v[:max(n, 1)]
        return idx, v

    def skip(self, n: int) -> None:
        """Advance the random stream as n calls of sample() would (a token chosen without
        calling it: a forced token of a constraint, memra.text.grammar.fast_forward). With
        a single allowed token sample() returns it and makes one draw (none when greedy),
        so the tokens after it are the same either way."""
        if n > 0 and not self.params.greedy:
            self.rng.random(int(n))

    def sample(self, logits: np.ndarray, history=()) -> int:
        """The next token id; `history` is every token so far (prompt and generated)."""
        if np.asarray(logits).size != self.n_vocab:
            raise MemraError(f"logits have {np.asarray(logits).size} entries, the vocabulary {self.n_vocab}")
        x = self.apply_penalties(self.apply_bias(logits) if self.bias.size else logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        idx, v = self.candidates(x)
        probs = _softmax(v / self.params.temperature)
        r = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), r * probs.sum(), side="right"))
        return int(idx[min(i, idx.size - 1)])
