"""The server's engine side without HTTP: the prefix cache's bookkeeping over the paged KV
cache, the CPU engine's rows (a row's logits a function of its own tokens), and the
scheduler driving the real GPU runner on the emulated GPU (tests/gpu_emulator.py):
continuous batching with chunked prefill under a small token budget gives every request
the CPU reference's greedy tokens, alone or together, with or without a prefix-cache hit."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from memra.cpu.reference import ReferenceModel
from memra.gpu.kv import KVFullError
from memra.gpu.runner import Row, Sampling
from memra.gpu.ops.sample import reference_sample
from memra.model.config import read_config
from memra.model.gguf import open_gguf
from memra.sampling import SamplingParams
from memra.serve.cpu_engine import CpuRunner, HostKV
from memra.serve.prefix_cache import PrefixCache
from memra.serve.scheduler import GenRequest, Scheduler
from memra.text.tokenizer import Tokenizer


def _kv(tiny_models, n_blocks=8, block=4):
    cfg = read_config(open_gguf(tiny_models("llama", "Q8_0")))
    return HostKV(None, cfg, n_blocks=n_blocks, block=block, max_seqs=4, max_len=64)


# -- the prefix cache ---------------------------------------------------------------------------------


def _alone(runner, prompt, n_gen: int) -> list[int]:
    """The oracle: the runner itself on one sequence, the prompt in one row, then one decode
    row a token (its agreement with the CPU reference: tests/test_runner_emulated.py)."""
    s = runner.open()
    out = [runner.step([Row(s, prompt, sample=Sampling(0.0))])[0].token]
    for _ in range(n_gen - 1):
        out.append(runner.step([Row(s, [out[-1]], sample=Sampling(0.0))])[0].token)
    runner.close(s)
    return out

def test_prefix_cache_chains_namespaces_and_lru(tiny_models):
    kv = _kv(tiny_models)
    pc = PrefixCache(kv)
    toks = list(range(100, 111))  # 11 tokens: 2 full blocks of 4
    s = kv.open()
    kv.reserve(s, 11)
    assert pc.register("ns", toks, s, 11) == 2 and len(pc) == 2
    b0, b1 = int(kv.table[s, 0]), int(kv.table[s, 1])
    assert pc.lookup("ns", toks) == [b0, b1]
    assert pc.lookup("ns", toks, limit=7) == [b0]          # whole blocks within the limit
    assert pc.lookup("other", toks) == []                   # the namespace is in the first hash
    assert pc.lookup("ns", [100, 101, 102, 999] + toks[4:]) == []  # a chain breaks at the first change
    assert pc.lookup("ns", toks[:4] + [0, 0, 0, 0]) == [b0]
    kv.close(s)  # three blocks back to the free queue: the cached two keep their contents
    assert kv.alloc.n_free == 8 and len(pc) == 2
    t = kv.open()
    kv.adopt(t, pc.lookup("ns", toks))                      # a hit takes them back out
    assert list(kv.table[t, :2]) == [b0, b1] and kv.alloc.n_free == 6 and kv.alloc.ref[b0] == 1
    u = kv.open()
    kv.adopt(u, [b0])                                       # in use: shared
    assert kv.alloc.ref[b0] == 2
    kv.close(u)
    kv.close(t)
    # least recently freed first: the six blocks freed before b0 and b1 go out first; a
    # cached block handed out is forgotten
    v = kv.open()
    kv.reserve(v, 4 * 6)
    assert len(pc) == 2                                     # six uncached blocks were free first
    kv.reserve(v, 4 * 7)
    assert len(pc) == 1 and pc.lookup("ns", toks) == []     # b0 went first (freed before b1)
    kv.reserve(v, 4 * 8)
    assert len(pc) == 0
    with pytest.raises(KVFullError):
        kv.reserve(v, 4 * 9)


def test_prefix_cache_compares_tokens_not_only_hashes(tiny_models):
    kv = _kv(tiny_models)
    pc = PrefixCache(kv)
    s = kv.open()
    kv.reserve(s, 8)
    toks = list(range(8))
    pc.register("", toks, s, 8)
    h0 = pc.chain("", toks, 1)[0]
    pc.by_hash[h0].tokens = (9, 9, 9, 9)  # a collision, simulated
    assert pc.lookup("", toks) == []


# -- the CPU engine -----------------------------------------------------------------------------------

def test_cpu_engine_rows_are_functions_of_their_tokens(tiny_models):
    """Q4_K weights: the reference's batched matmul orders a row's sums by the batch, so the
    engine computes one position at a time; a prompt whole, in chunks, beside another
    sequence or behind a prefix-cache hit gives the same bits, which are the reference's
    own one-position-at-a-time logits."""
    g = open_gguf(tiny_models("llama", "Q4_K_M"))
    eng = CpuRunner(g, max_len=64, max_seqs=5, kv_block=8)
    prompt = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200, 7, 300, 301, 302, 303, 304, 305, 306, 307]
    m = ReferenceModel(g, numerics="llamacpp")
    cache = m.new_cache(64)
    want = [m.forward([t], cache) for t in prompt]

    a = eng.open()
    whole = eng.step([Row(a, prompt, logits="all")])[0].logits
    assert np.array_equal(whole, np.stack(want))
    b, c = eng.open(), eng.open()
    parts = []
    for s0, s1 in ((0, 5), (5, 6), (6, 19)):
        outs = eng.step([Row(c, [5, 6, 7][: 1 + s0 % 3]), Row(b, prompt[s0:s1], logits="all")])
        parts.append(outs[1].logits)
    assert np.array_equal(np.concatenate(parts), whole)
    # a sequence that adopts a's first two blocks (16 positions) from the pool
    d = eng.open()
    eng.kv.adopt(d.slot, [int(x) for x in eng.kv.table[a.slot, :2]])
    d.n = 16
    tail = eng.step([Row(d, prompt[16:], logits="all")])[0].logits
    assert np.array_equal(tail, whole[16:])
    # sampling: the device sampler's rule at the chosen token's position
    s = Sampling(0.9, 20, 0.9, 0.02, 1234)
    e = eng.open()
    tok = eng.step([Row(e, prompt, sample=s)])[0].token
    assert tok == reference_sample(want[-1], 0.9, 20, 0.9, 0.02, 1234, len(prompt))
    for q in (a, b, c, d, e):
        eng.close(q)
    assert (eng.kv.alloc.ref == 0).all()


# -- the scheduler over the emulated GPU runner --------------------------------------------------------

async def _run(sched, reqs):
    for r in reqs:
        sched.submit(r)

    async def one(r):
        toks, done = [], None
        async for ev in r.events():
            if ev[0] == "token":
                toks.append(ev[1])
            elif ev[0] == "done":
                done = ev[2]
            else:
                raise AssertionError(ev)
        return toks, done

    return await asyncio.gather(*(one(r) for r in reqs))


def test_scheduler_batches_the_emulated_runner(tiny_models):
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner

    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    tok = Tokenizer.from_gguf(g)
    runner = Runner(path, max_len=96, max_seqs=4, gpu=FakeGpu(1 << 28))
    sched = Scheduler(runner, tok, max_queue=8, max_batched_tokens=12)
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(3, 40000, n)] for n in (9, 21, 37)]
    n_gen = 5

    def reqs(ps, salt=""):
        return [GenRequest(p, SamplingParams(temperature=0, max_tokens=n_gen), namespace=salt, ignore_eos=True)
                for p in ps]

    try:
        want = [_alone(runner, p, n_gen) for p in prompts]
        sched.start()  # the engine thread owns the runner from here on
        alone = [asyncio.run(_run(sched, reqs([p], salt=f"alone{i}")))[0] for i, p in enumerate(prompts)]
        steps0 = sched.steps
        together = asyncio.run(_run(sched, reqs(prompts, salt="together")))
        assert sched.steps - steps0 < sum(len(p) for p in prompts)  # chunks and decode rows shared steps
        assert [t for t, _ in alone] == want
        assert [t for t, _ in together] == want
        assert all(u["cached_tokens"] == 0 and u["completion_tokens"] == n_gen for _, u in alone + together)
        # the same prompts again in the "together" namespace: whole blocks of 16 come from the cache
        again = asyncio.run(_run(sched, reqs(prompts, salt="together")))
        assert [t for t, _ in again] == want
        assert [u["cached_tokens"] for _, u in again] == [(len(p) - 1) // 16 * 16 for p in prompts]
        _all_freed(sched, runner)
    finally:
        sched.stop()


def test_prompt_logprobs_on_the_emulated_runner(tiny_models):
    """A request for its prompt's log-probs (completions' echo with logprobs) on the GPU runner, its prompt in
    chunks under a small token budget beside another request: the ("prompt", entries) event comes first, each
    entry exactly the log-softmax of the runner's own logits for the prompt in one row (logits "all") at the position
    before it; max_tokens 0 then ends it with no token; with max_tokens 2 the tokens are the runner's greedy ones.
    A prefix-cache hit is not taken (its positions would have no logits)."""
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner
    from memra.sampling import logprob_entry

    path = tiny_models("llama", "Q4_K_M")
    tok = Tokenizer.from_gguf(open_gguf(path))
    runner = Runner(path, max_len=96, max_seqs=4, gpu=FakeGpu(1 << 28))
    sched = Scheduler(runner, tok, max_queue=8, max_batched_tokens=12)
    rng = np.random.default_rng(11)
    prompt = [int(x) for x in rng.integers(3, 40000, 37)]
    other = [int(x) for x in rng.integers(3, 40000, 20)]

    async def events(reqs):
        for r in reqs:
            sched.submit(r)

        async def one(r):
            return [ev async for ev in r.events()]

        return await asyncio.gather(*(one(r) for r in reqs))

    try:
        s = runner.open()
        lgs = runner.step([Row(s, prompt, logits="all")])[0].logits
        runner.close(s)
        want = [(prompt[0], None)] + [(prompt[i], logprob_entry(lgs[i - 1], prompt[i], 2)) for i in range(1, 37)]
        greedy = _alone(runner, prompt, 2)
        sched.start()
        asyncio.run(events([GenRequest(prompt, SamplingParams(temperature=0, max_tokens=1), namespace="p")]))
        a, b, c = asyncio.run(events([
            GenRequest(prompt, SamplingParams(temperature=0, max_tokens=0), namespace="p", prompt_logprobs=2),
            GenRequest(prompt, SamplingParams(temperature=0, max_tokens=2), namespace="p", prompt_logprobs=2,
                       ignore_eos=True),
            GenRequest(other, SamplingParams(temperature=0, max_tokens=3), namespace="p", ignore_eos=True)]))
        for evs in (a, b):
            assert evs[0][0] == "prompt" and [t for t, _ in evs[0][1]] == prompt
            assert evs[0][1] == want  # the same bits: a row's logits do not depend on its chunks or neighbours
            assert evs[-1][0] == "done" and evs[-1][2]["cached_tokens"] == 0
        assert [ev[0] for ev in a] == ["prompt", "done"] and a[-1][1] == "length"
        assert a[-1][2]["completion_tokens"] == 0
        assert [ev[1] for ev in b if ev[0] == "token"] == greedy
        assert c[0][0] == "token" and not any(ev[0] == "prompt" for ev in c)
        _all_freed(sched, runner)
    finally:
        sched.stop()


def test_hybrid_attention_shares_only_prompt_blocks(tiny_models):
    """With MEMRA_ATTN=hybrid a prompt row and a decode row at one position differ in bits, so
    the prefix cache shares only blocks of prompt rows: a second turn (the first prompt, its
    decoded reply, a new message) hits the first prompt's full blocks, not the reply's, and
    its greedy tokens equal an uncached run's."""
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner

    path = tiny_models("llama", "Q4_K_M")
    tok = Tokenizer.from_gguf(open_gguf(path))
    runner = Runner(path, max_len=128, max_seqs=4, gpu=FakeGpu(1 << 28), attn="hybrid")
    assert not runner.prefill_exact
    sched = Scheduler(runner, tok, max_queue=8, max_batched_tokens=12)
    rng = np.random.default_rng(11)
    seen = []  # (tokens, gen) of every row the scheduler hands the runner
    real_step = runner.step

    def step(rows, *a, **kw):
        seen.extend((len(r.tokens), r.gen) for r in rows)
        return real_step(rows, *a, **kw)

    runner.step = step
    p1 = [int(x) for x in rng.integers(3, 40000, 33)]  # a hit leaves one prompt token to compute

    def req(p, ns, n):
        return GenRequest(p, SamplingParams(temperature=0, max_tokens=n), namespace=ns, ignore_eos=True)

    try:
        sched.start()
        (reply, u1), = asyncio.run(_run(sched, [req(p1, "a", 20)]))
        (again, u0), = asyncio.run(_run(sched, [req(p1, "a", 20)]))
        assert u0["cached_tokens"] == 32 and again == reply
        assert (1, False) in seen  # the hit's one-token remainder went as a prompt row, not a decode step
        p2 = p1 + reply + [7, 8, 9]
        assert len(p1 + reply) // 16 == 3 and len(p1) // 16 == 2  # the reply completes a third block
        (cached, u2), = asyncio.run(_run(sched, [req(p2, "a", 6)]))
        (fresh, u3), = asyncio.run(_run(sched, [req(p2, "b", 6)]))
        assert u1["cached_tokens"] == 0 and u3["cached_tokens"] == 0
        assert u2["cached_tokens"] == 32  # the first prompt's two blocks; not the reply's
        assert cached == fresh
        _all_freed(sched, runner)
    finally:
        sched.stop()


def _all_freed(sched, runner) -> None:
    """Once the scheduler has nothing running, every KV block is back in the pool."""
    t_end = time.time() + 10
    while sched.n_running and time.time() < t_end:
        time.sleep(0.01)
    assert (runner.kv.alloc.ref == 0).all()


def test_chained_decode_steps_give_the_step_by_step_tokens(tiny_models, monkeypatch):
    """MEMRA_SERVE_CHAIN: while only decode rows run and nobody waits, the scheduler replays
    up to 8 decode steps on the device between read-backs. The streams are the ones of one
    runner call a step (greedy and seeded sampling; a stop token inside a chain ends its
    request there, with no token after it), the chain is used, and every block is freed."""
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner

    path = tiny_models("llama", "Q4_K_M")
    g = open_gguf(path)
    tok = Tokenizer.from_gguf(g)
    rng = np.random.default_rng(7)
    prompts = [[int(x) for x in rng.integers(3, 40000, n)] for n in (7, 12, 19)]

    def reqs(stop_ids=()):
        ps = [SamplingParams(temperature=0, max_tokens=13, stop_ids=list(stop_ids)),
              SamplingParams(temperature=0.9, top_k=20, seed=77, max_tokens=11),
              SamplingParams(temperature=0, max_tokens=9)]
        return [GenRequest(p, q, ignore_eos=True) for p, q in zip(prompts, ps)]

    def serve(chain: str, stop_ids=()):
        monkeypatch.setenv("MEMRA_SERVE_CHAIN", chain)
        runner = Runner(path, max_len=96, max_seqs=4, gpu=FakeGpu(1 << 28))
        sched = Scheduler(runner, tok, max_queue=8, max_batched_tokens=64)
        chained = []
        real = sched._chain
        sched._chain = lambda dec, n: (chained.append(n), real(dec, n))
        sched.start()
        try:
            res = asyncio.run(_run(sched, reqs(stop_ids)))
            _all_freed(sched, runner)
        finally:
            sched.stop()
        return [t for t, _ in res], chained

    plain, none = serve("0")
    assert none == [] and [len(t) for t in plain] == [13, 11, 9]
    chained, used = serve("8")
    assert used and all(n >= 2 for n in used)
    assert chained == plain
    # a stop token in the middle of a chain: the first request ends at it (stop ids are
    # left out of the text but reported as the last token), the others are unchanged
    stop = plain[0][5]
    cut = plain[0][:plain[0].index(stop) + 1]
    stopped, used = serve("8", stop_ids=[stop])
    assert used
    assert stopped[0] == cut and stopped[1:] == plain[1:]


@pytest.mark.slow
def test_64_concurrent_requests_on_the_emulated_runner(tiny_models):
    """The issue's isolation claim at its size: 64 requests at once (decode rows in the
    64-row graph bucket, prefill chunks beside them under the token budget), each one's
    greedy tokens those of the runner alone on that request."""
    from gpu_emulator import FakeGpu
    from memra.gpu.runner import Runner

    path = tiny_models("qwen3", "Q4_0")
    g = open_gguf(path)
    runner = Runner(path, max_len=64, max_seqs=64, gpu=FakeGpu(1 << 28))
    rng = np.random.default_rng(11)
    prompts = [[int(x) for x in rng.integers(3, 40000, int(n))] for n in rng.integers(3, 24, 64)]
    n_gen = 4
    want = [_alone(runner, p, n_gen) for p in prompts]
    sched = Scheduler(runner, Tokenizer.from_gguf(g), max_queue=64, max_batched_tokens=256)
    sched.start()
    try:
        res = asyncio.run(_run(sched, [GenRequest(p, SamplingParams(temperature=0, max_tokens=n_gen),
                                                  ignore_eos=True) for p in prompts]))
        assert [t for t, _ in res] == want
        assert sched.steps < 2 * n_gen + 4  # all 64 ran in the same steps
    finally:
        sched.stop()


def test_admission_by_kv_blocks(tiny_models):
    """A pool of 4 blocks of 16: a request whose worst case (prompt + max_tokens) needs 3
    waits while another holds 2, runs when they are freed; one needing 5 can never run (400)."""
    from memra.serve.scheduler import NeverFits

    g = open_gguf(tiny_models("llama", "Q8_0"))
    eng = CpuRunner(g, max_len=96, max_seqs=4, kv_tokens=64, kv_block=16)
    sched = Scheduler(eng, Tokenizer.from_gguf(g), max_queue=4, max_batched_tokens=64)
    p = SamplingParams(temperature=0, max_tokens=12)

    async def go():
        with pytest.raises(NeverFits):
            sched.submit(GenRequest(list(range(5, 75)), p))          # 70 + 12 positions: 6 blocks
        a = GenRequest(list(range(5, 25)), p, ignore_eos=True)       # 32 positions: 2 blocks
        b = GenRequest(list(range(30, 65)), p, ignore_eos=True)      # 47 positions: 3 blocks
        sched.submit(a)
        await asyncio.sleep(0.3)
        sched.submit(b)
        async def last(r):
            async for ev in r.events():
                pass
            return ev

        ea, eb = await asyncio.gather(last(a), last(b))
        assert ea[0] == eb[0] == "done" and ea[2]["completion_tokens"] == eb[2]["completion_tokens"] == 12
        # b was admitted only after a's last token (the engine thread's clock): it waited
        assert b.t_admit >= a.t_last > a.t_admit

    sched.start()
    try:
        asyncio.run(go())
    finally:
        sched.stop()
    assert (eng.kv.alloc.ref == 0).all()


def test_a_request_that_fails_admission_fails_alone(tiny_models, monkeypatch):
    """A request whose admission raises gets an error event and leaves the queue: the
    requests behind it run (it neither stays at the head nor closes their way)."""
    g = open_gguf(tiny_models("llama", "Q8_0"))
    eng = CpuRunner(g, max_len=96, max_seqs=4, kv_tokens=256, kv_block=16)
    sched = Scheduler(eng, Tokenizer.from_gguf(g), max_queue=4, max_batched_tokens=64)
    lookup = sched.pc.lookup

    def failing(namespace, *a, **kw):
        if namespace == "boom":
            raise RuntimeError("boom")
        return lookup(namespace, *a, **kw)

    monkeypatch.setattr(sched.pc, "lookup", failing)
    p = SamplingParams(temperature=0, max_tokens=3)

    async def last(r):
        async for ev in r.events():
            pass
        return ev

    async def go():
        warm = GenRequest(list(range(60, 80)), p, ignore_eos=True)  # a cached block: lookups run
        sched.submit(warm)
        assert (await last(warm))[0] == "done" and len(sched.pc)
        bad = GenRequest(list(range(5, 25)), p, namespace="boom", ignore_eos=True)
        good = GenRequest(list(range(30, 50)), p, ignore_eos=True)
        sched.submit(bad)
        sched.submit(good)
        eb, eg = await asyncio.wait_for(asyncio.gather(last(bad), last(good)), 30)
        assert eb[0] == "error" and "boom" in eb[1]
        assert eg[0] == "done" and eg[2]["completion_tokens"] == 3

    sched.start()
    try:
        asyncio.run(go())
        assert sched.n_waiting == 0
        _all_freed(sched, eng)
    finally:
        sched.stop()


def test_max_queue_counts_only_requests_that_wait(tiny_models):
    """--max-queue bounds the requests waiting for a sequence: with 0 an idle server still
    takes a request (there is a free sequence for it), and refuses the one that would wait."""
    from memra.serve.scheduler import QueueFull

    g = open_gguf(tiny_models("llama", "Q8_0"))
    eng = CpuRunner(g, max_len=96, max_seqs=1, kv_tokens=256, kv_block=16)
    sched = Scheduler(eng, Tokenizer.from_gguf(g), max_queue=0, max_batched_tokens=64)
    p = SamplingParams(temperature=0, max_tokens=3)

    async def go():
        a = GenRequest(list(range(5, 25)), p, ignore_eos=True)
        sched.submit(a)
        with pytest.raises(QueueFull):  # the only sequence is taken: this one would wait
            sched.submit(GenRequest(list(range(30, 50)), p, ignore_eos=True))
        async for ev in a.events():
            pass
        assert ev[0] == "done" and ev[2]["completion_tokens"] == 3

    sched.start()
    try:
        asyncio.run(go())
    finally:
        sched.stop()


def test_a_failure_while_dropping_a_cancelled_request_keeps_the_engine(tiny_models, monkeypatch):
    """Ending a cancelled request runs on the engine thread like a step: if it raises, the
    engine thread survives and serves the next request (it does not die with /health 200)."""
    g = open_gguf(tiny_models("llama", "Q8_0"))
    eng = CpuRunner(g, max_len=96, max_seqs=4, kv_tokens=256, kv_block=16)
    sched = Scheduler(eng, Tokenizer.from_gguf(g), max_queue=4, max_batched_tokens=64)
    register = sched._register

    def failing(r):
        if r.namespace == "boom" and r.cancelled:
            raise RuntimeError("boom")
        return register(r)

    monkeypatch.setattr(sched, "_register", failing)

    async def last(r):
        async for ev in r.events():
            pass
        return ev

    async def go():
        doomed = GenRequest(list(range(5, 25)), SamplingParams(temperature=0, max_tokens=60), namespace="boom",
                            ignore_eos=True)
        sched.submit(doomed)
        t_end = time.time() + 30
        while len(doomed.generated) < 2 and time.time() < t_end:
            await asyncio.sleep(0.01)
        sched.cancel(doomed)
        good = GenRequest(list(range(30, 50)), SamplingParams(temperature=0, max_tokens=3), ignore_eos=True)
        sched.submit(good)
        eg = await asyncio.wait_for(last(good), 30)
        assert eg[0] == "done" and eg[2]["completion_tokens"] == 3

    sched.start()
    try:
        asyncio.run(go())
        _all_freed(sched, eng)
    finally:
        sched.stop()
