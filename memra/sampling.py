"""Token sampling on the CPU, in llama.cpp's default order.

The chain is llama.cpp's `common_sampler` default: penalties → top-k → top-p → min-p →
temperature → a seeded draw. Note the consequence of that order: top-p and min-p judge the
*untempered* distribution; temperature only reshapes what survives them. A temperature of
0 (or below) is greedy: the argmax after penalties. Draws come from numpy's PCG64 seeded
once per `Sampler`, so the same seed, logits and history give the same tokens.
The parameters' defaults are llama.cpp's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from memra.errors import MemraError


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

    def validate(self) -> None:
        if not np.isfinite(self.temperature):
            raise MemraError(f"temperature must be a finite number, got {self.temperature}")
        if not (np.isfinite(self.top_p) and self.top_p >= 0.0):
            raise MemraError(f"top_p must be in [0, 1] (1 turns it off), got {self.top_p}")
        if not (np.isfinite(self.min_p) and self.min_p <= 1.0):
            raise MemraError(f"min_p must be in [0, 1] (0 turns it off), got {self.min_p}")
        if self.repeat_penalty <= 0 or not np.isfinite(self.repeat_penalty):
            raise MemraError(f"repeat_penalty must be positive, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise MemraError(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        if self.max_tokens < -1:
            raise MemraError(f"max_tokens must be >= -1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise MemraError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class Sampler:
    """Picks the next token from one position's logits. Stateful only in its random stream."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        params.validate()
        self.params = params
        self.n_vocab = n_vocab
        self.seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(32)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))

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

    def sample(self, logits: np.ndarray, history=()) -> int:
        """The next token id; `history` is every token so far (prompt and generated)."""
        if np.asarray(logits).size != self.n_vocab:
            raise MemraError(f"logits have {np.asarray(logits).size} entries, the vocabulary {self.n_vocab}")
        x = self.apply_penalties(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        idx, v = self.candidates(x)
        probs = _softmax(v / self.params.temperature)
        r = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), r * probs.sum(), side="right"))
        return int(idx[min(i, idx.size - 1)])
