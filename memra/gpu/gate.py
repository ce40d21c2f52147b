"""The exactness gates a GPU run passes before it prints any figure (`memra run --device
gpu`, `memra bench`; DESIGN.md "The exactness contract"), and the GPU tests' comparison.

    x, t = run_gates(engine, prompt_ids)        # both gates; the reference built when affordable
    x, dec = cross_check(engine, prompt_ids)    # prefill vs token-by-token decode, every position
    t = teacher_forced(dec, x.tokens, reference, path=engine.path)   # vs the CPU reference

1. The cross-check (prefill = decode). The engine promises the same bits from a batched
   prefill and from token-by-token decode: one reduction order per row, whatever the batch.
   The gate's sequence is the prompt (its first MAX_POSITIONS tokens) extended with the
   engine's own greedy continuation to TF_POSITIONS tokens. It runs once as graph-replayed
   decode steps and once as a prefill returning the logits of every position, with the KV
   cache poisoned (NaN) before each pass, so a row read before it is written shows. MATCH
   only when every position's logits are finite and the same bits in both passes; else
   MISMATCH, naming the first position that differs. There is no near-tie verdict: within one
   arithmetic no difference is allowed (a bound on log-probs belongs to comparisons across
   engines: the teacher-forced gate).
   An engine whose prompt rows and decode rows run two arithmetics
   (MEMRA_ATTN=hybrid: attn_fa's tensor cores and f16 probabilities for prompt rows,
   attention.cu for generated ones; with the prompt tile also kernels/gemm_tile.cu's chain order
   for the prompt rows' matmuls, mv_q8's for generated ones) says `prefill_exact = False`; each path stays batch and
   chunk invariant, but a prompt row and the decode row of its position no longer give the
   same bits, and cannot be asked to: measured on the H200 (SmolLM2, Gemma-3, 76-77
   positions) the two differ by up to 0.70 and 1.02 in log-prob, on the q8 path a 1e-7
   difference flipping one activation's 8-bit rounding and moving every later log-prob
   (below), so no bound measured for summation-order noise separates them from a bug. What
   can be asked in bits is each arithmetic's own invariance, so such an engine runs two more
   passes: the sequence fed one token at a time as one-token prompt rows (`engine.prefill([tok])`,
   the prompt arithmetic), and the sequence batched as generated rows (`engine.prefill(...,
   all_logits=True, gen=True)`, decode's attention over a chunk: the prefill's matvec / GEMM
   paths). MATCH asks every position's batched prefill logits to be finite and the same bits
   as the one-token prompt rows, and every decode step's the same bits as its row batched as a
   generated row; else MISMATCH, naming the first position that differs and which pair. So a
   bug of decode steps alone (their plan, their graphs) still turns it red. The decode pass
   against the prefill is reported as information only: max |Δ log-prob| over the decode's
   top-TOP_K token ids and the positions whose top-1s differ.
   A bug both paths share (a weight, a dequantization, a norm weight, a rope table used by
   both) passes this gate, as does, with two arithmetics, a bug of one attention arithmetic
   in every packing; hence the second one.

2. The teacher-forced gate. The decode pass's logits at the first TF_POSITIONS positions
   against the CPU reference (memra.cpu.reference.ReferenceModel) fed the same tokens, in
   the numerics of the engine's matvec path ("q8": the same roundings; "f32"). At every
   position, |Δ log-prob| of the next token, of the reference's top-1 and of the engine's
   top-1 must stay within TF_BOUND[path], so the two top-1s can differ only where the
   reference's own top-2 margin is below twice the bound. MATCH when every position holds,
   else MISMATCH with the first position over the bound; SKIPPED when no reference is
   given (run_gates skips models above REF_MAX_PARAMS: the CPU forward would take minutes).

TF_BOUND / TF_MEDIAN_BOUND are set from measurement (experiments/gate_noise.py; receipts in
research/2026-12-01-gates/): the engine and the reference round activations the same way but
sum in different orders, and on the q8 path a 1e-7 difference can flip one activation's
8-bit rounding, which moves every later log-prob (these models are chaotic under 8-bit
activations). Measured between the emulated engine (tests/gpu_emulator.py: float64 sums,
another order again) and the reference over 9 models (tiny llama Q4_K_M / Q4_0, qwen2
Q8_0, qwen3 Q4_0 / Q5_K_M, gemma3 Q4_K_M / Q6_K, smollm2-135m, gemma3-270m), 3 prompts x
32 positions each:
    q8 path:  max |Δ| 0.245 (gemma3-270m), p99 0.135, largest median of a run 0.059
              (the real models over 80 positions: max 0.258, largest median 0.040)
    f32 path: max |Δ| 0.0070, p99 0.0045, largest median of a run 0.0014 (the engine's
              f16 K/V cache against the reference's f32 one)
The bounds are 2x (q8: 0.5, median 0.15) and 4x (f32: 0.03, median 0.01) of those. An
engine bug moves log-probs by far more on the f32 path (a wrong rope table 0.6, a position
off by one 0.33, a norm weight 3, a K/V row 6.6, a dropped residual 36: tests/test_gates.py);
on the q8 path the smaller of those sit inside the noise and are the cross-check's to catch.
The lead's H200 run prints the GPU's own figures against these bounds
(experiments/h200_gates.sh).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

MAX_POSITIONS = 256   # prompt positions the cross-check runs (memory: one digest a position)
TF_POSITIONS = 32     # positions of the teacher-forced gate (and the sequence's minimum length)
TOP_K = 8             # two arithmetics: decode top-K a position, for the log-prob report
# |Δ log-prob| bounds (module doc): every position's, and the median over the positions
TF_BOUND = {"q8": 0.5, "f32": 0.03}
TF_MEDIAN_BOUND = {"q8": 0.15, "f32": 0.01}
REF_MAX_PARAMS = 600_000_000  # run_gates builds the CPU reference up to this many weights


def _digest(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, np.float32).tobytes(), digest_size=16).digest()


def _poison_kv(engine) -> None:
    """NaN into every K/V row of the pool: a row read before this pass wrote it shows."""
    for a in (*engine.kv.k, *engine.kv.v):
        a.poison()


@dataclass
class CrossCheck:
    verdict: str                 # MATCH | MISMATCH (failed() passes any other verdict)
    positions: int               # positions compared
    first_diff: int | None = None  # the first differing position
    n_diff: int = 0              # positions whose logits differ (or are not finite)
    max_abs_diff: float = 0.0    # max |Δlogit| at first_diff (inf when a side is not finite)
    prefill_argmax: int = -1     # at first_diff (MATCH: at the last position)
    decode_argmax: int = -1      # the same of the pass prefill is held to: decode steps, or with
    #                              two arithmetics the one-token prompt rows
    detail: str = ""
    tokens: list = field(default_factory=list, repr=False)  # the gate's sequence
    exact: bool = True           # prefill = decode asked (True), or two arithmetics (module doc)
    max_delta: float = 0.0       # two arithmetics: decode rows vs prefill, max |Δ log-prob| over
    #                              the decode's top-TOP_K ids (inf: not finite); information only
    n_top1_diff: int = 0         # two arithmetics: positions whose decode and prefill top-1s differ

    def line(self) -> str:
        if not self.exact:
            head = ("gate prefill=decode (two arithmetics: prompt rows batched = one at a time, decode "
                    "steps = generated rows batched, bit for bit)")
            return (f"{head}: {self._verdict_line()}; decode rows vs prompt rows: max |Δ log-prob| "
                    f"{self.max_delta:.3g}, top-1 differs at {self.n_top1_diff} positions")
        if self.verdict == "MATCH":
            return (f"gate prefill=decode: MATCH ({self.positions} positions, logits bit-identical and "
                    f"finite)")
        return f"gate prefill=decode: {self._verdict_line()}"

    def _verdict_line(self) -> str:
        if self.verdict == "MATCH":
            return f"MATCH ({self.positions} positions)"
        one = "decode" if self.exact or self.detail.startswith("decode steps") else "one at a time"
        return (f"{self.verdict} at position {self.first_diff} of {self.positions} ({self.n_diff} positions differ; "
                f"there max |Δlogit| {self.max_abs_diff:.3g}, argmax prefill {self.prefill_argmax} vs {one} "
                f"{self.decode_argmax}{'; ' + self.detail if self.detail else ''})")


@dataclass
class TeacherForced:
    verdict: str                 # MATCH | MISMATCH | SKIPPED
    positions: int = 0
    bound: float = 0.0
    max_delta: float = 0.0       # max over positions of the per-position |Δ log-prob|
    median_delta: float = 0.0
    worst: int | None = None     # the position of max_delta
    first_over: int | None = None
    n_over: int = 0
    numerics: str = ""
    detail: str = ""
    deltas: list = field(default_factory=list, repr=False)
    median_bound: float = 0.0

    def line(self) -> str:
        if self.verdict == "SKIPPED":
            return f"gate teacher-forced: SKIPPED ({self.detail})"
        head = (f"gate teacher-forced: {self.verdict} ({self.positions} positions vs the CPU reference "
                f"({self.numerics}): max |Δ log-prob| {self.max_delta:.2e} at position {self.worst} (bound "
                f"{self.bound:g}), median {self.median_delta:.1e} (bound {self.median_bound:g})")
        if self.n_over:
            head += f"; {self.n_over} positions over it, the first {self.first_over}"
        return head + (f"; {self.detail}" if self.detail else "") + ")"


def _logits_rows(engine, seq, p: int, path: str) -> np.ndarray:
    """The logits of position p by one pass only (used to report a mismatch): "decode"
    steps, or one-token "prompt" rows."""
    engine.reset()
    _poison_kv(engine)
    for t in seq[:p + 1]:
        out = engine.decode(t) if path == "decode" else engine.prefill([t])
    engine.reset()
    return out


def _top_k(row: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """The row's k most likely token ids and their log-probs (float64), best first (a tie:
    the lower id first, as np.argmax)."""
    lp = log_softmax(row)
    k = min(k, lp.size)
    ids = np.argpartition(-lp, k - 1)[:k]
    ids = ids[np.lexsort((ids, -lp[ids]))]
    return ids, lp[ids]


def _logprob_delta(row: np.ndarray, top) -> tuple[float, bool]:
    """A prefill row against its decode row's top-K (None: not finite): max |Δ log-prob|
    over those ids (inf: not finite), and whether the two top-1s differ."""
    if top is None or not np.all(np.isfinite(row)):
        return math.inf, True
    ids, dec_lp = top
    lp = log_softmax(row)
    return float(np.max(np.abs(lp[ids] - dec_lp))), int(np.argmax(lp)) != int(ids[0])


def cross_check(engine, prompt_ids: Sequence[int], min_positions: int = TF_POSITIONS,
                keep: int = TF_POSITIONS) -> tuple[CrossCheck, np.ndarray]:
    """Prefill vs token-by-token decode at every position of the gate's sequence (module
    doc): the same bits; when the engine says `prefill_exact = False`, batched prefill vs
    one-token prompt rows, the same bits, decode vs prefill reported by log-prob.
    Returns the verdict and the decode pass's logits of the first `keep` positions
    ([n, n_vocab], the teacher-forced gate's input). Leaves the engine's cache reset."""
    from memra.gpu.runner import PREFILL_CHUNK

    exact = bool(getattr(engine, "prefill_exact", True))
    seq = [int(t) for t in prompt_ids][:min(MAX_POSITIONS, engine.max_len)]
    if not seq:
        from memra.errors import MemraError

        raise MemraError("the gates need at least one prompt token")
    target = max(len(seq), min(min_positions, engine.max_len))
    # decode pass: graph replays, extended greedily (host argmax of the decode logits)
    engine.reset()
    _poison_kv(engine)
    dec_digest, kept, dec_top = [], [], []
    bad_dec = set()
    i = 0
    while i < target:
        lg = engine.decode(seq[i])
        dec_digest.append(_digest(lg))
        if not np.all(np.isfinite(lg)):
            bad_dec.add(i)
        if not exact:  # enough of every row to compare by log-prob
            dec_top.append(None if i in bad_dec else _top_k(lg))
        if i < keep:
            kept.append(np.array(lg, np.float32))
        if i + 1 == len(seq) and len(seq) < target:
            seq.append(int(np.argmax(lg)))
        i += 1
    # two arithmetics: prompt-row pass, one token at a time, the digests prefill is held to
    ref_digest, bad_ref = dec_digest, bad_dec
    if not exact:
        engine.reset()
        _poison_kv(engine)
        ref_digest = []
        for p, t in enumerate(seq):
            lg = engine.prefill([t])
            ref_digest.append(_digest(lg))
            if not np.all(np.isfinite(lg)):
                bad_ref = bad_ref | {p}
    # prefill pass: every position's logits (in chunks of the runner's prefill size)
    engine.reset()
    _poison_kv(engine)
    diff, first, pre_first, last = [], None, None, None
    max_delta, n_top1_diff = 0.0, 0
    for s in range(0, len(seq), PREFILL_CHUNK):
        rows = engine.prefill(seq[s:s + PREFILL_CHUNK], all_logits=True)
        last = rows[-1]
        for j, row in enumerate(rows):
            p = s + j
            if not exact:  # information only
                d, flip = _logprob_delta(row, dec_top[p])
                max_delta, n_top1_diff = max(max_delta, d), n_top1_diff + flip
            if p in bad_ref or not np.all(np.isfinite(row)) or _digest(row) != ref_digest[p]:
                diff.append(p)
                if first is None:
                    first, pre_first = p, np.array(row, np.float32)
    # two arithmetics: the decode rows' own invariance, decode steps = the same rows batched as
    # generated rows (decode's attention over a chunk: the other passes' matvec / GEMM paths)
    gen_first = None
    if not exact:
        engine.reset()
        _poison_kv(engine)
        for s in range(0, len(seq), PREFILL_CHUNK):
            rows = engine.prefill(seq[s:s + PREFILL_CHUNK], all_logits=True, gen=True)
            for j, row in enumerate(rows):
                p = s + j
                if p in bad_dec or not np.all(np.isfinite(row)) or _digest(row) != dec_digest[p]:
                    diff.append(p)
                    if gen_first is None:
                        gen_first, gen_row = p, np.array(row, np.float32)
    engine.reset()
    dec = np.stack(kept) if kept else np.zeros((0, engine.cfg.n_vocab), np.float32)
    info = {} if exact else {"exact": False, "max_delta": max_delta, "n_top1_diff": n_top1_diff}
    def mismatch(p: int, row: np.ndarray, ref: np.ndarray, detail: str, nan_detail: str) -> CrossCheck:
        """Position p's MISMATCH: `row` (the batched pass) against `ref` (the pass it is held to);
        `detail` when both are finite, else `nan_detail`."""
        finite = bool(np.all(np.isfinite(ref)) and np.all(np.isfinite(row)))
        with np.errstate(invalid="ignore"):
            d = float(np.max(np.abs(ref.astype(np.float64) - row))) if finite else math.inf
        detail = detail if finite else nan_detail
        argmax = lambda x: int(np.nanargmax(x)) if np.any(np.isfinite(x)) else -1  # noqa: E731
        return CrossCheck("MISMATCH", len(seq), p, len(set(diff)), d, argmax(row), argmax(ref), detail, seq, **info)

    if gen_first is not None and (first is None or gen_first < first):
        ref = dec[gen_first] if gen_first < len(kept) else _logits_rows(engine, seq, gen_first, "decode")
        what = "decode steps against the same rows batched as generated rows"
        return mismatch(gen_first, gen_row, ref, what, what + "; logits not finite"), dec
    if first is None:
        a = int(np.argmax(last))
        return CrossCheck("MATCH", len(seq), prefill_argmax=a, decode_argmax=a, tokens=seq, **info), dec
    if exact:
        ref = dec[first] if first < len(kept) else _logits_rows(engine, seq, first, "decode")
    else:
        ref = _logits_rows(engine, seq, first, "prompt")
    # two arithmetics: prefill = prompt rows, but the decode row not finite
    detail = "the decode row's logits not finite" if first in bad_dec else ""
    return mismatch(first, pre_first, ref, detail,
                    "logits not finite (a NaN from a K/V row read before it was written?)"), dec


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def position_deltas(got_logits: np.ndarray, ref_logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """Per position i: max |Δ log-prob| over the next token tokens[i + 1] (when there is
    one), the reference's top-1 and the engine's top-1. inf where the engine's logits are
    not finite."""
    n = len(ref_logits)
    out = np.empty(n)
    for i in range(n):
        g, r = got_logits[i], ref_logits[i]
        if not np.all(np.isfinite(g)):
            out[i] = math.inf
            continue
        lg, lr = log_softmax(g), log_softmax(r)
        toks = {int(np.argmax(lr)), int(np.argmax(lg))}
        if i + 1 < len(tokens):
            toks.add(int(tokens[i + 1]))
        out[i] = max(abs(lg[t] - lr[t]) for t in toks)
    return out


def reference_logits(reference, tokens: Sequence[int]) -> np.ndarray:
    """The reference's logits of every position of `tokens`, one token a forward: the CPU
    reference's decode path (one row: memra.cpu.reference's quantized-weight matvec, whose
    float32 row sums come closest to the kernels' order) rather than its prefill (BLAS)."""
    cache = reference.new_cache(len(tokens))
    return np.stack([np.asarray(reference.forward([int(t)], cache), np.float32) for t in tokens])


def teacher_forced(got_logits: np.ndarray, tokens: Sequence[int], reference, path: str = "q8",
                   n: int = TF_POSITIONS, bound: float | None = None,
                   median_bound: float | None = None) -> TeacherForced:
    """The engine's logits of the first n positions of `tokens` (got_logits[i]: after
    tokens[:i + 1]) against the reference's on the same tokens (module doc): MATCH when
    every position's |Δ log-prob| is within `bound` and their median within
    `median_bound` (defaults: TF_BOUND / TF_MEDIAN_BOUND of the path)."""
    bound = TF_BOUND[path] if bound is None else float(bound)
    median_bound = TF_MEDIAN_BOUND[path] if median_bound is None else float(median_bound)
    n = min(n, len(got_logits), len(tokens))
    if n == 0:
        return TeacherForced("SKIPPED", detail="no positions")
    ref = reference_logits(reference, list(tokens[:n]))
    d = position_deltas(got_logits[:n], ref, list(tokens[:n]))
    over = np.flatnonzero(~(d <= bound))
    worst = int(np.argmax(d))
    med = float(np.median(d))
    ok = over.size == 0 and med <= median_bound
    detail = "" if med <= median_bound else f"the median is over its bound {median_bound:g}"
    return TeacherForced("MATCH" if ok else "MISMATCH", n, bound, float(d[worst]), med, worst,
                         int(over[0]) if over.size else None, int(over.size),
                         getattr(reference, "numerics", path), detail, [float(x) for x in d], median_bound)


def model_params(gguf) -> int:
    return int(sum(t.n_elements for t in gguf.tensors.values()))


def run_gates(engine, prompt_ids: Sequence[int], reference="auto",
              n: int = TF_POSITIONS) -> tuple[CrossCheck, TeacherForced]:
    """Both gates on `engine` (a memra.gpu.engine.GPUEngine). reference: "auto" (the CPU
    reference in the engine path's numerics when the model has at most REF_MAX_PARAMS
    weights, else the teacher-forced gate is SKIPPED), None (SKIPPED), or a reference
    model with the new_cache/forward protocol. Leaves the engine's cache reset."""
    x, dec = cross_check(engine, prompt_ids, min_positions=n, keep=n)
    path = getattr(engine, "path", "q8")
    if reference is None:
        return x, TeacherForced("SKIPPED", detail="no reference given")
    if isinstance(reference, str):
        if reference != "auto":
            raise ValueError(f"reference must be 'auto', None or a model, got {reference!r}")
        params = model_params(engine.gguf)
        if params > REF_MAX_PARAMS:
            return x, TeacherForced("SKIPPED", detail=f"{params / 1e9:.1f}B weights: the CPU reference would "
                                                      f"take minutes (it runs up to {REF_MAX_PARAMS / 1e6:.0f}M)")
        from memra.cpu.reference import ReferenceModel

        reference = ReferenceModel(engine.gguf, engine.cfg, numerics=path)
    return x, teacher_forced(dec, x.tokens, reference, path=path, n=n)


def failed(*results) -> bool:
    """Whether any gate said MISMATCH (its figures are then void; any other verdict, MATCH,
    SKIPPED or a NEAR-TIE of another comparison, passes)."""
    return any(r.verdict == "MISMATCH" for r in results)
