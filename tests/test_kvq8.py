"""The q8_0 KV cache (--cache-type-k / --cache-type-v q8_0) on the CPU engine.

* The quantizer (memra.cpu.llamacpp.q8_0_quantize) on rows worked out by hand (ties, zeros,
  negative values, the largest value, a scale whose f16 rounding matters) and against a
  scalar transcription of llama.cpp's AVX2 quantize_row_q8_0, the function its KV-cache
  write runs.
* The CPU reference with a q8_0 K and/or V against xllamacpp (the CPU peer) configured the
  same way (slow, parity): greedy continuations and log-probs at the f16 parity tests' bounds.
  llama.cpp rotates Q/K/V by a Hadamard matrix when a cache type is quantized (its PR 21038);
  memra's q8_0 cache does not (experiments/kvq8/README.md), so the peer runs with
  LLAMA_ATTN_ROT_DISABLE=1. Measured 2026-12-02 on SmolLM2 (3 prompts x 16 tokens): every
  greedy token equal, |delta log-prob| max 2.2e-4, median 1.1e-4 (the f16 cache's own
  figures: the server's float32 log-softmax). With ggml's portable rule instead (id = 1/d,
  roundf) two of the three prompts drift to a median of 0.007 / 0.020 and a max of 0.18, so
  the bounds tell the rules apart.
* CpuRunner with q8_0: a row's logits a function of its own tokens (alone, in chunks beside
  another sequence, behind an adopted prefix), greedy tokens alone = together, the pools'
  real bytes (int8 codes + f16 scales), and --kv-memory holding 64/34 x the positions; the
  server's ServeConfig cache types reaching that engine.
* The flags: unknown types refused, naming the flag (q8_0 runs on the GPU too since the kernels'
  q8_0 planes: tests/test_kvq8_gpu.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memra.cpu.llamacpp import _q8_0_row, q8_0_dequantize, q8_0_quantize, q8_0_round_trip
from memra.cpu.reference import ReferenceModel, log_softmax
from memra.errors import MemraError
from memra.gpu.kv import bytes_per_block, check_cache_device, check_cache_type
from memra.gpu.runner import Row, Sampling
from memra.model.config import read_config
from memra.model.gguf import open_gguf
from memra.serve.cpu_engine import CpuRunner

ROOT = Path(__file__).resolve().parent.parent
Q8 = {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}


# -- the quantizer ----------------------------------------------------------------------------------

def _row(values) -> np.ndarray:
    x = np.zeros(32, np.float32)
    x[:len(values)] = values
    return x


def test_ties_round_half_to_even_with_a_unit_scale():
    """amax = 127: d = 1 (exact in f16) and id = 127/127 = 1, so q = round(x) with ties to
    even (ggml's portable _ref rule, roundf, would give 3, 4, -3, 1, -1 for the ties)."""
    x = _row([127, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5, -127, 100, -7.25])
    q, d = q8_0_quantize(x)
    assert d.tolist() == [1.0]
    assert q[:10].tolist() == [127, 2, 4, -2, 0, 0, 2, -127, 100, -7]
    assert (q[10:] == 0).all()
    np.testing.assert_array_equal(q8_0_round_trip(x)[:10], [127, 2, 4, -2, 0, 0, 2, -127, 100, -7])


def test_the_multiplier_comes_from_amax_not_from_the_f16_scale():
    """amax = 100: d = f16(100/127 = 0.7874016) = 1613 * 2^-11 = 0.78759765625, id = 1.27.
    x = 79.14173: x * id = 100.51 -> q = 101 (x / f16 d = 100.486 would give 100); the
    stored value is 101 * 0.78759765625."""
    x = _row([100, 79.14173, -100])
    q, d = q8_0_quantize(x)
    assert d.tolist() == [0.78759765625]
    assert q[:3].tolist() == [127, 101, -127]
    assert q8_0_round_trip(x)[1] == np.float32(101 * 0.78759765625)


def test_zeros_negatives_and_the_largest_value():
    rng = np.random.default_rng(7)
    assert [a.tolist() for a in q8_0_quantize(np.zeros(64, np.float32))] == [[0] * 64, [0.0, 0.0]]
    # rows of 32 at scales from 1e-2 to 1e5 (scales in f16's range): the largest |x| of a
    # block is +-127, no code exceeds 127, the scale is f16(amax / 127), and -x gives -q
    scales = np.float32(10.0) ** rng.integers(-2, 6, size=(50, 1)).astype(np.float32)
    x = (rng.standard_normal((50, 32)) * scales).astype(np.float32)
    q, d = q8_0_quantize(x)
    i = np.abs(x).argmax(axis=1)
    assert (q[np.arange(50), i] == np.sign(x[np.arange(50), i]) * 127).all()
    assert np.abs(q.astype(int)).max() == 127
    np.testing.assert_array_equal(d[:, 0], (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float16))
    np.testing.assert_array_equal(q8_0_quantize(-x)[0], -q)
    np.testing.assert_array_equal(q8_0_dequantize(q, d), q.astype(np.float32) * d)


def _ggml_avx2_q8_0(x: np.ndarray):
    """llama.cpp's quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c, AVX2 branch) one block at a
    time in float32 scalars: maxScalar = max |x|; y.d = FP32_TO_FP16(maxScalar / 127.f);
    id = maxScalar != 0 ? 127.f / maxScalar : 0; q = _mm256_round_ps(x * id, NEAREST)."""
    q, d = [], []
    for b in range(0, x.size, 32):
        m = np.float32(0)
        for v in x[b:b + 32]:
            m = max(m, np.float32(abs(v)))
        d.append(float(np.float16(np.float32(m / np.float32(127)))))
        i = np.float32(127) / m if m != 0 else np.float32(0)
        q += [round(float(np.float32(v * i))) for v in x[b:b + 32]]  # Python's round: ties to even
    return np.array(q, np.int8), np.array(d, np.float32)


def test_quantizer_is_ggml_avx2_kernel():
    """The vectorized quantizer (the cache write) and the numba one (Q of a q8_0-K attention)
    against the scalar transcription, on random rows and on rows full of exact ties."""
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(96).astype(np.float32) * s for s in (1e-3, 1.0, 37.0)]
    ties = np.concatenate([[127.0], rng.integers(-126, 126, 31) + 0.5]).astype(np.float32)  # amax 127: id = 1
    for x in [*rows, ties, np.float32(0.75) * ties]:
        want_q, want_d = _ggml_avx2_q8_0(x)
        q, d = q8_0_quantize(x)
        np.testing.assert_array_equal(q, want_q)
        np.testing.assert_array_equal(d, want_d)
        qn, dn = np.empty(x.size, np.int8), np.empty(x.size // 32, np.float32)
        _q8_0_row(x, qn, dn)
        np.testing.assert_array_equal(qn, want_q)
        np.testing.assert_array_equal(dn, want_d)


# -- bytes and flags --------------------------------------------------------------------------------

def test_bytes_per_block_by_cache_type(tiny_models):
    cfg = read_config(open_gguf(tiny_models("llama", "Q8_0")))
    f16 = bytes_per_block(cfg, 16)
    assert f16 == 2 * cfg.n_layer * 16 * cfg.kv_dim * 2  # the callers that pass no type: unchanged
    assert bytes_per_block(cfg, 16, "f16", "f16") == f16
    assert bytes_per_block(cfg, 16, "q8_0", "q8_0") * 64 == f16 * 34  # 34 bytes per 32 values, not 64
    assert bytes_per_block(cfg, 16, "q8_0", "f16") == bytes_per_block(cfg, 16, "f16", "q8_0") == f16 * (34 + 64) // 128


def test_cache_type_validation_names_the_flag():
    assert check_cache_type("q8_0") == "q8_0"
    for bad in ("q4_0", "F16", "", None):
        with pytest.raises(MemraError, match="--cache-type-v must be one of f16, q8_0"):
            check_cache_type(bad, "--cache-type-v")
    check_cache_device("cpu", "q8_0", "q8_0")
    check_cache_device("gpu", "f16", "f16")
    check_cache_device("gpu", "f16", "q8_0")  # the GPU kernels' q8_0 planes (tests/test_kvq8_gpu.py)
    with pytest.raises(MemraError, match="--cache-type-k must be one of"):
        check_cache_device("cpu", "q5_1", "f16")


def test_gpu_open_engine_refuses_an_unknown_type_before_any_work():
    from memra.serve.scheduler import open_engine

    # no model, no device touched: the refusal comes first
    with pytest.raises(MemraError, match="--cache-type-k must be one of f16, q8_0"):
        open_engine(None, None, "gpu", ctx=64, parallel=1, cache_type_k="q4_0")


def _memra(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("MEMRA_LOG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True, cwd=ROOT,
                          env=e, timeout=300)


@pytest.mark.parametrize("args, env, needle", [
    (["serve", "--device", "cpu", "-ctk", "q4_0"], None, "--cache-type-k must be one of f16, q8_0, got 'q4_0'"),
    (["serve", "--device", "cpu"], {"MEMRA_CACHE_TYPE_V": "bf16"}, "--cache-type-v must be one of f16, q8_0"),
    (["run", "--device", "gpu", "-ctk", "q5_0", "-p", "hi"], None, "--cache-type-k must be one of f16, q8_0"),
    (["bench", "smollm2-135m", "--cache-type-v", "q4_0"], None, "--cache-type-v must be one of f16, q8_0"),
])
def test_cli_refuses_in_one_line(args, env, needle):
    r = _memra(*args, env=env)
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("memra: error: ") and needle in lines[0], r.stderr


def test_head_size_not_a_multiple_of_32_is_refused(tiny_models):
    g = open_gguf(tiny_models("llama", "Q8_0"))
    cfg = replace(read_config(g), head_dim=48)
    with pytest.raises(MemraError, match="q8_0 K cache needs a head size that is a multiple of 32"):
        ReferenceModel(g, cfg, cache_type_k="q8_0")


# -- the CPU engine ---------------------------------------------------------------------------------

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200, 7, 300, 301, 302, 303, 304, 305, 306, 307]


def test_cpu_engine_q8_0_rows_are_functions_of_their_tokens(tiny_models):
    """With q8_0 K and V: a prompt whole, in chunks beside another sequence, or behind an
    adopted prefix (its codes and scales read back from the pool) gives the same bits, the
    reference's own one-position-at-a-time logits with a q8_0 cache, which differ from f16's."""
    g = open_gguf(tiny_models("llama", "Q4_K_M"))
    eng = CpuRunner(g, max_len=64, max_seqs=4, kv_block=8, **Q8)
    m = ReferenceModel(g, numerics="llamacpp", **Q8)
    cache = m.new_cache(64)
    want = np.stack([m.forward([t], cache) for t in PROMPT])
    m16 = ReferenceModel(g, numerics="llamacpp")
    c16 = m16.new_cache(64)
    assert not np.array_equal(want, np.stack([m16.forward([t], c16) for t in PROMPT]))

    a = eng.open()
    whole = eng.step([Row(a, PROMPT, logits="all")])[0].logits
    np.testing.assert_array_equal(whole, want)
    b, c = eng.open(), eng.open()
    parts = []
    for s0, s1 in ((0, 5), (5, 6), (6, 19)):
        outs = eng.step([Row(c, [5, 6, 7][: 1 + s0 % 3]), Row(b, PROMPT[s0:s1], logits="all")])
        parts.append(outs[1].logits)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    d = eng.open()  # adopts a's first two blocks (16 positions) from the pool
    eng.kv.adopt(d.slot, [int(x) for x in eng.kv.table[a.slot, :2]])
    d.n = 16
    np.testing.assert_array_equal(eng.step([Row(d, PROMPT[16:], logits="all")])[0].logits, whole[16:])
    for s in (a, b, c, d):
        eng.close(s)
    assert (eng.kv.alloc.ref == 0).all()


def test_cpu_engine_q8_0_pools_hold_codes_and_scales(tiny_models):
    g = open_gguf(tiny_models("llama", "Q8_0"))
    cfg = read_config(g)
    eng = CpuRunner(g, max_len=32, max_seqs=2, kv_tokens=64, kv_block=16, cache_type_k="q8_0")
    kv = eng.kv
    assert kv.k[0].dtype == np.int8 and kv.k_scale[0].dtype == np.float16 and kv.k_scale[0].shape[-1] == cfg.kv_dim // 32
    assert kv.v[0].dtype == np.float16 and kv.v_scale is None
    held = sum(a.nbytes for a in (*kv.k, *kv.k_scale, *kv.v))
    assert held == kv.nbytes == kv.alloc.n_blocks * bytes_per_block(cfg, 16, "q8_0", "f16")
    # the pool's rows are the working cache's blocks: codes and scales dequantize to its values
    s = eng.open()
    eng.step([Row(s, PROMPT[:10])])
    cache, b = eng.caches[s.slot], int(kv.table[s.slot, 0])
    vals = q8_0_dequantize(kv.k[1][b, :10], kv.k_scale[1][b, :10].astype(np.float32))
    np.testing.assert_array_equal(vals, cache.k[1][:, :10].transpose(1, 0, 2).reshape(10, -1))


def test_cpu_engine_q8_0_greedy_alone_equals_together(tiny_models):
    g = open_gguf(tiny_models("qwen2", "Q4_K_M"))
    eng = CpuRunner(g, max_len=48, max_seqs=3, kv_block=8, **Q8)
    prompts = [PROMPT[:7], PROMPT[3:15], [9, 8, 7, 6, 5]]
    n_gen = 6

    def alone(p):
        s = eng.open()
        out = [eng.step([Row(s, p, sample=Sampling(0.0))])[0].token]
        for _ in range(n_gen - 1):
            out.append(eng.step([Row(s, [out[-1]], sample=Sampling(0.0))])[0].token)
        eng.close(s)
        return out

    want = [alone(p) for p in prompts]
    seqs = [eng.open() for _ in prompts]
    got = [[o.token] for o in eng.step([Row(s, p, sample=Sampling(0.0)) for s, p in zip(seqs, prompts)])]
    for _ in range(n_gen - 1):
        outs = eng.step([Row(s, [t[-1]], sample=Sampling(0.0)) for s, t in zip(seqs, got)])
        for t, o in zip(got, outs):
            t.append(o.token)
    assert got == want


def test_kv_memory_holds_more_positions_with_q8_0(tiny_models):
    """--kv-memory of 3 f16 blocks of 16 holds 5 q8_0 blocks (3 * 64 // 34): a request of 70
    positions can never run on the f16 pool (400) and runs on the q8_0 one."""
    from memra.sampling import SamplingParams
    from memra.serve.scheduler import GenRequest, NeverFits, Scheduler
    from memra.text.tokenizer import Tokenizer

    g = open_gguf(tiny_models("llama", "Q8_0"))
    cfg = read_config(g)
    mem = 3 * bytes_per_block(cfg, 16)
    f16 = CpuRunner(g, max_len=96, max_seqs=2, kv_memory=mem, kv_block=16)
    q8 = CpuRunner(g, max_len=96, max_seqs=2, kv_memory=mem, kv_block=16, **Q8)
    assert f16.kv.alloc.n_blocks == 3
    assert q8.kv.alloc.n_blocks == mem // bytes_per_block(cfg, 16, "q8_0", "q8_0") == 5
    tok = Tokenizer.from_gguf(g)
    p = SamplingParams(temperature=0, max_tokens=6)
    with pytest.raises(NeverFits):
        Scheduler(f16, tok, max_queue=2, max_batched_tokens=64).submit(GenRequest(list(range(5, 69)), p))
    sched = Scheduler(q8, tok, max_queue=2, max_batched_tokens=64)

    async def go():
        r = GenRequest(list(range(5, 69)), p, ignore_eos=True)  # 64 + 6 positions: 5 blocks
        sched.submit(r)
        async for ev in r.events():
            pass
        return ev

    sched.start()
    try:
        ev = asyncio.run(go())
    finally:
        sched.stop()
    assert ev[0] == "done" and ev[2]["completion_tokens"] == 6
    assert (q8.kv.alloc.ref == 0).all()


# -- the reference against llama.cpp with the same cache types (slow) ------------------------------

PEER_PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
                'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n']
N_PREDICT = 16
NEAR_TIE = 0.05


def _peer(path, cache_type_k: str, cache_type_v: str):
    """tests/peer.py's CachedPeer whose live server runs llama.cpp with these cache types and
    its Hadamard rotation of quantized caches off (LLAMA_ATTN_ROT_DISABLE=1)."""
    import httpx
    import xllamacpp as x
    from peer import CachedPeer, LlamaCppPeer, _free_port

    class Peer(LlamaCppPeer):
        def __init__(self, model_path, cache_type_k, cache_type_v, attn_rot):
            p = x.CommonParams()
            p.model.path = str(model_path)
            p.n_ctx, p.n_parallel, p.n_batch = 4096, 1, 512
            p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
            p.port, p.warmup = _free_port(), False
            types = {"f16": x.ggml_type.GGML_TYPE_F16, "q8_0": x.ggml_type.GGML_TYPE_Q8_0}
            p.cache_type_k, p.cache_type_v = types[cache_type_k], types[cache_type_v]
            # read when the server makes its KV cache (the test sets it)
            assert attn_rot == "off" and os.environ.get("LLAMA_ATTN_ROT_DISABLE") == "1"
            self._server = x.Server(p)
            self.url = self._server.listening_address
            self._http = httpx.Client(base_url=self.url, timeout=600)

    class Cached(CachedPeer):
        def _live(self):
            if self._peer is None:
                self._peer = Peer(self._path, **self._kw)
            return self._peer

    return Cached(path, cache_type_k=cache_type_k, cache_type_v=cache_type_v, attn_rot="off")


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q8_0", "f16"), ("f16", "q8_0")])
def test_reference_q8_0_cache_matches_llamacpp(types, monkeypatch):
    pytest.importorskip("xllamacpp")
    from memra.model.aliases import resolve

    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")  # restored after the test
    from memra.text.tokenizer import Tokenizer

    path = resolve("smollm2-135m")
    g = open_gguf(path)
    m = ReferenceModel(g, numerics="llamacpp", cache_type_k=types[0], cache_type_v=types[1])
    eog = sorted(Tokenizer.from_gguf(g).eog_ids)  # llama.cpp runs with ignore_eos: they are banned
    deltas, bad = [], []
    with _peer(path, *types) as peer:
        for text in PEER_PROMPTS:
            prompt = peer.tokenize(text)
            r = peer.complete(prompt, N_PREDICT, n_probs=4)
            cache = m.new_cache(len(prompt) + N_PREDICT)
            logits = [m.forward(prompt, cache)] + [m.forward([t], cache) for t in r["ids"][:-1]]
            lp = log_softmax(np.stack(logits))
            ours = lp.copy()
            ours[:, eog] = -np.inf
            for i, (tok, top) in enumerate(zip(r["ids"], r["top"])):
                if top is None:
                    continue
                deltas.append(abs(lp[i, tok] - dict(top)[tok]))
                margin = [lp_ for t, lp_ in top if t not in eog]
                if int(ours[i].argmax()) != tok and margin[0] - margin[1] >= NEAR_TIE:
                    bad.append((text[:20], i, int(ours[i].argmax()), tok))
    assert len(deltas) >= 0.9 * N_PREDICT * len(PEER_PROMPTS)
    assert not bad, bad
    assert np.median(deltas) <= 1e-3 and max(deltas) <= 5e-3, (np.median(deltas), max(deltas))


def test_server_serves_from_a_q8_0_pool(tiny_models):
    """ServeConfig's cache types reach the CPU engine: its pool holds q8_0 blocks, and a greedy
    completion over HTTP is the q8_0 reference's greedy continuation."""
    import httpx

    from memra.serve.api import ServeConfig, Server

    path = tiny_models("llama", "Q8_0")
    s = Server(ServeConfig(model=str(path), device="cpu", port=0, ctx_size=64, parallel=2, **Q8))
    s.start_in_thread()
    try:
        kv = s.state.engine.kv
        assert (kv.cache_type_k, kv.cache_type_v) == ("q8_0", "q8_0") and kv.k[0].dtype == np.int8
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT[:9], "max_tokens": 5, "temperature": 0,
                                                        "ignore_eos": True}, trust_env=False)
        assert r.status_code == 200, r.text
        got = r.json()
        metrics = httpx.get(s.url + "/metrics", trust_env=False).text
    finally:
        s.stop()
    m = ReferenceModel(open_gguf(path), numerics="llamacpp", **Q8)
    cache = m.new_cache(64)
    for t in PROMPT[:8]:
        m.forward([t], cache)
    want = []
    lg = m.forward([PROMPT[8]], cache)
    for _ in range(5):
        want.append(int(np.argmax(lg)))
        lg = m.forward([want[-1]], cache)
    from memra.text.tokenizer import Tokenizer

    assert got["choices"][0]["text"] == Tokenizer.from_gguf(open_gguf(path)).decode(want)
    assert "memra:kv_cache_usage_perc" in metrics
