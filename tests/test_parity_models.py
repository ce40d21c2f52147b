"""The CPU reference against llama.cpp (xllamacpp, CPU) on the two real models.

Token ids come from llama.cpp's own /tokenize, so these tests do not depend on memra's
tokenizer. For every prompt llama.cpp generates 32 greedy tokens with its top log-probs;
memra then runs teacher-forced on that continuation (prompt, then the continuation, through
its KV cache) and the two are compared:

  (a) greedy: memra's greedy continuation equals llama.cpp's, or the first divergence falls
      where llama.cpp's own top-2 log-prob margin is below 0.05. Teacher forcing gives this
      exactly: both continuations agree up to the first position where memra's argmax (given
      llama.cpp's prefix, which is also memra's own prefix up to there) differs from
      llama.cpp's token. (Prefill = decode to 1e-4 is checked in test_reference.py.)
  (b) memra's top-1 equals llama.cpp's at >= 99 % of positions, and |delta log-prob| of
      llama.cpp's token is bounded at what is measured (below, per encoding).

Two encodings of each model's weights:

* F32: the real model with every tensor decoded by gguf.quants (the library, not memra) and
  stored as float32. These are exactly the weights memra computes with, and llama.cpp then
  computes in float32 too (apart from its f16 KV cache), so (a) and (b) must hold with a large
  margin; on top, llama.cpp's log-probs must agree to a median of 1e-3 and at most 0.025
  (measured 2026-12-01: median 4.2e-4 / 2.8e-4, max 5.8e-3 / 1.1e-2 on SmolLM2 / Gemma-3; the
  rest is llama.cpp's f16 KV cache and its own float order).
  This is the check that memra's arithmetic is llama.cpp's. The Gemma-3 set adds a prompt
  longer than its 512-token sliding window.
* The real quantized files (Q4_1, Q4_K_M), with ReferenceModel(numerics="llamacpp"): llama.cpp
  CPU's float operations in its own order (the wheel is a fixed AVX2 build; see memra/cpu/reference.py),
  fed llama.cpp's own batches: the prompt split as the server splits it (a sliding-window model
  ends a batch 4 tokens before the prompt's end, for its context checkpoints), then one token per
  decode step, since its kernels depend on the batch size. memra's logits are then bit-identical
  to llama.cpp's at all 8 x 32 positions of both models (experiments/llamacpp_dump drives the
  wheel's own llama.cpp with a tensor dumper). Measured on the 8 prompts here (top-1 / median
  |delta log-prob| / greedy divergences at a margin >= 0.05):
      SmolLM2  100 % / 0.0001 / 0     (before: 96.9 % / 0.017 / 2, float sums in numpy's order)
      Gemma-3  100 % / 0.0001 / 0     (before: 96.9 % / 0.020 / 5)
  and the largest |delta log-prob| 2.7e-4 / 8.5e-4: the bounds are a median of 1e-3 and a max
  of 5e-3.
  The remaining |delta| is the server's own log-softmax (float32 sum of expf over the vocabulary)
  against memra's float64 one. Bit-exactness matters here: these small models are chaotic under
  llama.cpp's 8-bit activations (one different float rounding upstream re-draws which activations
  round which way, ~0.02 in log-prob), and llama.cpp disagrees with itself at 2.2 % of top-1
  choices when only its KV cache changes from f16 to f32 (experiments/llamacpp_q8_noise.py).

llama.cpp runs with ignore_eos: it bans end-of-generation tokens (logit -inf) but reports
log-probs from before the ban, so memra's argmax skips the same tokens.

Cost: the F32 copies take 1.6 GB in $MEMRA_HOME/parity (written once), and llama.cpp needs
minutes to generate on them with 2 cores. Its answers (tokens, top log-probs, token ids of
the prompts) are kept in $MEMRA_HOME/parity/peer/ keyed by the file's sha256, the pinned
xllamacpp version and the request (tests/peer.py: CachedPeer), so later runs compare memra
against the same llama.cpp output without starting it; MEMRA_PEER_CACHE=0 asks it afresh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from memra.model.aliases import resolve
from memra.model.gguf import open_gguf
from memra.cpu.reference import ReferenceModel, log_softmax

pytestmark = [pytest.mark.parity, pytest.mark.slow]

N_PREDICT = 32
NEAR_TIE = 0.05
UBATCH = 512  # tests/peer.py's n_batch (= llama.cpp's default n_ubatch)
PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 5, 8, 13,",
    "La tour Eiffel est située à",
    "Here is a list of healthy breakfast ideas:\n1.",
    "SELECT name, age FROM users WHERE",
]
# > 512 tokens for Gemma-3's sliding window (its local layers then drop the oldest tokens)
LONG_PROMPT = " ".join(
    f"Fact {i}: the {w} of item {i * 7 % 13} is {i * 37 % 101} units, measured on day {i % 31 + 1}."
    for i, w in zip(range(40), ["weight", "length", "price", "age", "height"] * 8)
) + " To summarize the facts above,"


# --- the F32 encoding, decoded by gguf.quants ---------------------------------------------------

def f32_copy(src: Path) -> Path:
    """src with every tensor dequantized by gguf.quants to float32; cached across runs."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    st = src.stat()
    folder = Path(os.environ.get("MEMRA_HOME", Path.home() / ".cache" / "memra")) / "parity"
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / f"{src.stem}.{st.st_size}.f32.gguf"
    if dst.exists():
        return dst
    r = GGUFReader(src)
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    w = GGUFWriter(tmp, str(r.fields["general.architecture"].contents()))
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    w.add_file_type(0)  # ALL_F32
    for t in r.tensors:
        w.add_tensor(t.name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    return dst


# --- one model, compared on every prompt -------------------------------------------------------

@dataclass
class Compared:
    """Per prompt: llama.cpp's tokens, its top log-probs, and memra's log-probs there."""
    texts: list = field(default_factory=list)
    ids: list = field(default_factory=list)  # llama.cpp's continuation
    top: list = field(default_factory=list)  # llama.cpp's [(id, logprob)] per position
    logp: list = field(default_factory=list)  # memra's log-softmax [N_PREDICT, n_vocab]
    eog: list = field(default_factory=list)

    def margin(self, top) -> float:
        """llama.cpp's top-2 margin among the tokens it may pick (not end-of-generation)."""
        lp = [l for t, l in top if t not in self.eog]
        return lp[0] - lp[1]

    def ours(self, p: int) -> np.ndarray:
        """memra's choices under ignore_eos."""
        lp = self.logp[p].copy()
        lp[:, self.eog] = -np.inf
        return lp.argmax(axis=-1)

    def deltas(self) -> np.ndarray:
        return np.concatenate([
            np.abs([lp[i, b] - dict(top[i])[b] for i, b in enumerate(ids)])
            for lp, ids, top in zip(self.logp, self.ids, self.top)])

    def top1_rate(self) -> float:
        same = [self.ours(p) == np.array(self.ids[p]) for p in range(len(self.ids))]
        return float(np.mean(np.concatenate(same)))

    def greedy_failures(self) -> list[str]:
        bad = []
        for p, text in enumerate(self.texts):
            diff = np.nonzero(self.ours(p) != np.array(self.ids[p]))[0]
            if diff.size:
                i = int(diff[0])
                m = self.margin(self.top[p][i])
                if m >= NEAR_TIE:
                    bad.append(f"{text[:30]!r}: diverged at {i} (ours {int(self.ours(p)[i])}, llama.cpp "
                               f"{self.ids[p][i]}) where llama.cpp's margin is {m:.3f}")
        return bad


def server_prompt_batches(n: int, swa: bool) -> list[int]:
    """The batches llama.cpp's server decodes a prompt of n tokens in: at most n_batch each;
    for a sliding-window model (context checkpoints, tools/server/server-context.cpp) a batch
    also ends where min(n_batch, 4 + n_ubatch) or min(n_batch, 4) prompt tokens remain. Each
    batch fits one ubatch here (n_batch = n_ubatch)."""
    stops = {min(UBATCH, 4 + UBATCH), min(UBATCH, 4)} if swa else set()
    out, done = [], 0
    while done < n:
        b = 0
        while done < n and b < UBATCH:
            done, b = done + 1, b + 1
            if n - done in stops:
                break
        out.append(b)
    return out


def compare(path: Path, texts: list[str], numerics: str = "llamacpp") -> Compared:
    from memra.text.tokenizer import Tokenizer
    from peer import CachedPeer

    g = open_gguf(path)
    model = ReferenceModel(g, numerics=numerics)
    c = Compared(eog=sorted(Tokenizer.from_gguf(g).eog_ids))
    with CachedPeer(path) as peer:  # llama.cpp's answers for this very file, kept between runs
        for text in texts:
            prompt = peer.tokenize(text)
            r = peer.complete(prompt, N_PREDICT, n_probs=8)
            assert len(r["ids"]) == N_PREDICT
            for i, (b, top) in enumerate(zip(r["ids"], r["top"])):
                # llama.cpp's token is its best non-EOG one: guards the EOG set used above
                assert b == next(t for t, _ in top if t not in c.eog), (text, i, b, top)
            cache = model.new_cache(len(prompt) + N_PREDICT)
            if numerics == "llamacpp":
                # llama.cpp's own batches, since its kernels depend on the batch size: the prompt as
                # its server splits it (logits of the last token), then one token per decode step
                s = 0
                for n in server_prompt_batches(len(prompt), swa=model.cfg.swa_window > 0):
                    last = model.forward(prompt[s:s + n], cache)
                    s += n
                logits = np.stack([last] + [model.forward([t], cache) for t in r["ids"][:-1]])
            else:
                if len(prompt) > 1:
                    model.forward(prompt[:-1], cache)
                logits = model.forward(prompt[-1:] + r["ids"][:-1], cache, all_logits=True)
            c.texts.append(text)
            c.ids.append(r["ids"])
            c.top.append(r["top"])
            c.logp.append(log_softmax(logits))
    g.close()
    return c


MODELS = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}


@pytest.fixture(scope="module", params=list(MODELS))
def f32_run(request):
    texts = PROMPTS[:4] + ([LONG_PROMPT] if request.param == "gemma3" else [])
    return compare(f32_copy(resolve(MODELS[request.param])), texts, numerics="f32")


@pytest.fixture(scope="module", params=list(MODELS))
def quant_run(request):
    return compare(resolve(MODELS[request.param]), PROMPTS, numerics="llamacpp")


@pytest.mark.parametrize("name", list(MODELS))
def test_quantized_file_equals_f32_copy(name):
    """Links the two encodings: memra computes bit-identical logits from the quantized file and
    from its F32 copy (gguf.quants' decoding), so the F32 parity below is memra's on the real file."""
    src = resolve(MODELS[name])
    ids = [2, 651, 6037, 576, 6081, 603, 35248, 108, 1841, 36764, 40, 1000, 31, 7]
    out = []
    for path in (src, f32_copy(src)):
        m = ReferenceModel(open_gguf(path))
        out.append(m.forward(ids, m.new_cache(len(ids)), all_logits=True))
    np.testing.assert_array_equal(out[0], out[1])


def test_long_prompt_crosses_gemma_window():
    from peer import CachedPeer

    with CachedPeer(resolve("gemma3-270m")) as peer:
        assert len(peer.tokenize(LONG_PROMPT)) > 512 + 16


def test_f32_greedy(f32_run):
    assert not f32_run.greedy_failures(), f32_run.greedy_failures()


def test_f32_teacher_forced(f32_run):
    d = f32_run.deltas()
    assert f32_run.top1_rate() >= 0.99, f32_run.top1_rate()
    assert np.median(d) <= 1e-3 and d.max() <= 0.025, (np.median(d), d.max())


def test_quantized_logprobs(quant_run):
    d = quant_run.deltas()
    assert len(quant_run.texts) >= 8
    assert np.median(d) <= 1e-3 and d.max() <= 5e-3, (np.median(d), d.max())


def test_quantized_greedy_and_top1(quant_run):
    failures = quant_run.greedy_failures()
    rate = quant_run.top1_rate()
    assert not failures and rate >= 0.99, (rate, failures)
