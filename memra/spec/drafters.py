"""Drafters: cheap guesses of the next K tokens that the target model then verifies in one
step (memra.spec.decode). A drafter never changes what is generated, only how many tokens
one verification step can accept.

    lookup[:N1-N2]   n-gram prompt lookup: the longest suffix of prompt + generated text
                     (N2 tokens down to N1, default 2-4) that occurred before; the tokens
                     that followed its most recent earlier occurrence are the draft
    trim[:L]         the target's own first L layers, then its final norm and output head
                     (greedy); its own KV cache for those L layers
    draft:PATH       a separate, smaller GGUF with the same vocabulary (greedy)

Every drafter is `draft(history, k) -> list[int]` (at most k tokens), where `history` is
the whole sequence so far (prompt + accepted tokens). Model drafters keep their own KV
cache and roll it back to the longest common prefix with `history` on the next call, so
rejected guesses cost nothing beyond their compute. `min_conf` (model drafters): stop the
draft early when the drafter's top-1 probability falls below it (the confidence cut of
adaptive K).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from memra.errors import MemraError

LOOKUP_N = (2, 4)  # n-gram sizes tried, longest first


class LookupDrafter:
    """N-gram prompt lookup over the history. Keeps an index {n-gram: where its most recent
    earlier occurrence ends} per n, updated incrementally as the history grows."""

    name = "lookup"

    def __init__(self, n_min: int = LOOKUP_N[0], n_max: int = LOOKUP_N[1]):
        if not 1 <= n_min <= n_max:
            raise MemraError(f"lookup: the n-gram range must be 1 <= N1 <= N2, got {n_min}-{n_max}")
        self.n_min, self.n_max = int(n_min), int(n_max)
        self.label = f"lookup:{self.n_min}-{self.n_max}"
        self._hist: list[int] | None = None
        self._done = 0  # history positions indexed
        self._index: dict[int, dict[tuple, int]] = {}

    def _reset(self, history: list[int]) -> None:
        self._hist, self._done = history, 0
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}

    def _update(self, history: list[int]) -> None:
        # an n-gram ending at e - 1 is indexed (-> e, where its continuation starts) once the
        # history holds position e, so the current suffix never finds itself
        if history is not self._hist or len(history) < self._done or \
                (self._done and history[self._done - 1] != self._last):
            self._reset(history)
        L = len(history)
        for e in range(max(self._done, 1), L):
            for n, idx in self._index.items():
                if e >= n:
                    idx[tuple(history[e - n:e])] = e
        self._done = L
        self._last = history[L - 1] if L else None

    def draft(self, history: list[int], k: int) -> list[int]:
        if k <= 0 or not history:
            return []
        self._update(history)
        L = len(history)
        for n in range(self.n_max, self.n_min - 1, -1):
            if L < n:
                continue
            e = self._index[n].get(tuple(history[L - n:]))
            if e is not None:
                # the continuation may run into the suffix itself (a repeating pattern):
                # follow the history cyclically, as the pattern would continue
                out = []
                p = e
                while len(out) < k:
                    out.append(history[p] if p < L else out[p - L])
                    p += 1
                return out
        return []

    def close(self) -> None:
        pass


# -- model drafters ------------------------------------------------------------------------

class _RefLM:
    """A CPU reference model and one KV cache: feed tokens, rewind."""

    def __init__(self, model, n_ctx: int):
        self.model, self.cache, self.max_len = model, model.new_cache(n_ctx), int(n_ctx)

    @property
    def n(self) -> int:
        return self.cache.pos

    def rewind(self, n: int) -> None:
        self.cache.pos = min(self.cache.pos, n)

    def feed(self, tokens, want_prob: bool):
        lg = self.model.forward(list(tokens), self.cache)
        return _top1(lg, want_prob)

    def close(self) -> None:
        pass


class _RunnerLM:
    """One sequence of a runner (memra.gpu.runner.Runner): feed tokens, rewind. Without the
    confidence cut only the device's argmax comes back (4 bytes), else the logits."""

    def __init__(self, runner):
        self.runner, self.seq, self.max_len = runner, runner.open(), runner.max_len

    @property
    def n(self) -> int:
        return self.seq.n

    def rewind(self, n: int) -> None:
        if n < self.seq.n:
            self.runner.rewind(self.seq, n)

    def feed(self, tokens, want_prob: bool):
        from memra.gpu.runner import Row, Sampling

        if want_prob:
            o = self.runner.step([Row(self.seq, list(tokens), logits="last")])[0]
            return _top1(o.logits, True)
        o = self.runner.step([Row(self.seq, list(tokens), sample=Sampling(0.0))])[0]
        return o.token, None

    def close(self) -> None:
        self.runner.close(self.seq)


def _top1(logits, want_prob: bool):
    lg = np.asarray(logits, np.float64)
    t = int(np.argmax(lg))
    if not want_prob:
        return t, None
    return t, float(1.0 / np.exp(lg - lg[t]).sum())


class ModelDrafter:
    """Greedy drafts from a model (trim:L or draft:PATH) over its own KV cache."""

    def __init__(self, lm, label: str, min_conf: float = 0.0):
        self.lm, self.label, self.min_conf = lm, label, float(min_conf)
        self.name = label.split(":")[0]
        self.fed: list[int] = []  # the tokens the drafter's cache holds

    def draft(self, history: list[int], k: int) -> list[int]:
        L = len(history)
        room = self.lm.max_len - L
        k = min(k, room)
        if k <= 0 or not L:
            return []
        # the longest common prefix of what the cache holds and the history, leaving at
        # least the last history token to feed (its logits start the draft)
        m = min(len(self.fed), L - 1)
        if m:
            a = np.asarray(self.fed[:m])
            b = np.asarray(history[:m])
            diff = np.flatnonzero(a != b)
            m = int(diff[0]) if diff.size else m
        self.lm.rewind(m)
        del self.fed[m:]
        want = self.min_conf > 0
        t, p = self.lm.feed(history[m:], want)
        self.fed.extend(history[m:])
        out: list[int] = []
        while True:
            if want and p < self.min_conf:
                break
            out.append(t)
            if len(out) >= k:
                break
            t, p = self.lm.feed([t], want)
            self.fed.append(out[-1])
        return out

    def close(self) -> None:
        self.lm.close()


def same_vocab(g_target, g_draft, draft_name: str) -> None:
    """Raise MemraError unless the two GGUFs' vocabularies are the same token for token."""
    a = g_target.metadata.get("tokenizer.ggml.tokens")
    b = g_draft.metadata.get("tokenizer.ggml.tokens")
    if a is None or b is None:
        raise MemraError(f"draft model {draft_name}: a vocabulary is missing from the GGUF metadata")
    a, b = list(a), list(b)
    if a == b:
        return
    if len(a) != len(b):
        raise MemraError(f"draft model {draft_name} has a different vocabulary: {len(b)} tokens, the "
                         f"target {len(a)}; a draft must share the target's tokenizer")
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    raise MemraError(f"draft model {draft_name} has a different vocabulary: token {i} is {b[i]!r} there, "
                     f"{a[i]!r} in the target; a draft must share the target's tokenizer")


def default_trim_layers(n_layer: int) -> int:
    """trim's L when none is given: a quarter of the layers (not yet measured per model)."""
    return max(1, n_layer // 4)


def parse_spec(spec: str) -> tuple[str, object]:
    """'lookup' | 'lookup:N1-N2' | 'trim' | 'trim:L' | 'draft:PATH' -> (kind, argument)."""
    s = (spec or "").strip()
    kind, _, arg = s.partition(":")
    if kind == "lookup":
        if not arg:
            return "lookup", LOOKUP_N
        try:
            lo, _, hi = arg.partition("-")
            rng = (int(lo), int(hi or lo))
        except ValueError:
            raise MemraError(f"--spec lookup:N1-N2 takes two n-gram sizes, got {spec!r}") from None
        if not 1 <= rng[0] <= rng[1]:
            raise MemraError(f"--spec lookup:N1-N2 needs 1 <= N1 <= N2, got {spec!r}")
        return "lookup", rng
    if kind == "trim":
        if not arg:
            return "trim", None
        try:
            L = int(arg)
        except ValueError:
            raise MemraError(f"--spec trim:L takes a layer count, got {spec!r}") from None
        if L < 1:
            raise MemraError(f"--spec trim:L needs L >= 1, got {spec!r}")
        return "trim", L
    if kind == "draft" and arg:
        return "draft", arg
    raise MemraError(f"--spec must be lookup[:N1-N2], trim[:L] or draft:PATH, got {spec!r}")


def trimmed_config(cfg, L: int):
    if not 1 <= L < cfg.n_layer:
        raise MemraError(f"trim:{L}: the model has {cfg.n_layer} layers; L must be in 1..{cfg.n_layer - 1}")
    return replace(cfg, n_layer=L, swa_layers=tuple(cfg.swa_layers[:L]) if cfg.swa_layers else cfg.swa_layers)


def make_drafter(spec: str, *, gguf, cfg, device: str, n_ctx: int, min_conf: float = 0.0, target=None):
    """The drafter `spec` names for a target model (its GGUF and config), on `device`
    ("cpu": the reference model in llama.cpp's numerics; "gpu": a runner). `target`: the
    target's ReferenceModel on the CPU, whose dequantized weights trim shares."""
    kind, arg = parse_spec(spec)
    if kind == "lookup":
        return LookupDrafter(*arg)
    if kind == "trim":
        L = arg if arg is not None else default_trim_layers(cfg.n_layer)
        tcfg = trimmed_config(cfg, L)
        g, label = gguf, f"trim:{L}"
    else:
        from memra.model.aliases import resolve
        from memra.model.gguf import open_gguf

        g = open_gguf(resolve(arg))
        same_vocab(gguf, g, arg)
        tcfg, label = None, f"draft:{arg}"
    if device == "cpu":
        from memra.cpu.reference import ReferenceModel

        m = ReferenceModel(g, tcfg, numerics="llamacpp")
        if kind == "trim" and target is not None and getattr(target, "g", None) is gguf:
            # the same file: share the target's dequantized weights instead of a second copy
            m._w, m._codes, m._kparts = target._w, target._codes, target._kparts
        return ModelDrafter(_RefLM(m, n_ctx), label, min_conf)
    from memra.gpu.runner import Runner

    return ModelDrafter(_RunnerLM(Runner(g, tcfg, max_len=n_ctx, max_seqs=1)), label, min_conf)
