"""The runner on the emulated GPU (tests/gpu_emulator.py): batch invariance (a sequence's
logits alone = among co-runners at other positions and settings), graph replay = eager
launches at every bucket, per-row device sampling, and the paged KV cache's bookkeeping.
The kernels themselves are checked on the GPU (memra kernel-check); here the orchestration
— block tables, slots, positions, padding, buckets, gathers — meets an oracle."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.cpu.reference import ReferenceModel
from memra.errors import ContextOverflowError, MemraError
from memra.gpu.kv import KVFullError
from memra.gpu.runner import Row, Runner, Sampling
from memra.gpu.ops.sample import reference_sample
from memra.model.gguf import open_gguf
from memra.tune.invariance import batch_invariance, graph_vs_eager

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _reference_greedy(path, n: int, ctk: str = "f16", ctv: str = "f16") -> list[int]:
    """The CPU reference's greedy continuation of PROMPT (the engine's q8 numerics; KV cache types)."""
    m = ReferenceModel(open_gguf(path), numerics="q8", cache_type_k=ctk, cache_type_v=ctv)
    cache = m.new_cache(64)
    lg = m.forward(PROMPT, cache)
    ref = []
    for _ in range(n):
        ref.append(int(np.argmax(lg)))
        lg = m.forward([ref[-1]], cache)
    return ref


def _runner(path, **kw):
    kw.setdefault("max_len", 96)
    kw.setdefault("max_seqs", 16)
    return Runner(path, gpu=FakeGpu(1 << 28), **kw)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_batch_invariance_on_the_emulator(tiny_models, arch):
    r = _runner(tiny_models(arch, "Q4_K_M"))
    res = batch_invariance(r, PROMPT, n_steps=6, co=9)
    assert res["identical"], res
    # and the tokens are the CPU reference's greedy continuation (the engine's q8 numerics)
    assert res["tokens_alone"] == _reference_greedy(tiny_models(arch, "Q4_K_M"), 6)


def test_graph_replay_equals_eager_at_every_bucket(tiny_models):
    r = _runner(tiny_models("qwen3", "Q4_0"))
    res = graph_vs_eager(r, PROMPT, buckets=(1, 2, 4, 8, 16))
    assert res["identical"], res


def test_prefill_graph_replay_equals_eager_launches(tiny_models):
    """Prefill chunks replayed as the captured step of their bucket (the rows past the
    chunk padded) give the bits of the same chunks launched eagerly at their own row
    count: a 20-token prompt (bucket 32, captured), a second one (replayed), a 3-token
    continuation with every row's logits (bucket 4) and a 2-sequence mixed step."""
    path = tiny_models("llama", "Q4_K_M")
    runs = []
    for graph in (True, False):
        r = _runner(path, prefill_graph=graph)
        a, b = r.open(), r.open()
        out = [r.step([Row(a, PROMPT * 2, logits="last")])[0].logits,
               r.step([Row(b, (PROMPT * 2)[::-1], logits="last")])[0].logits,
               r.step([Row(a, PROMPT[:3], logits="all")])[0].logits,
               *[o.logits for o in r.step([Row(a, PROMPT[3:5], logits="last"), Row(b, PROMPT[:7], logits="last")])]]
        runs.append(out)
        if graph:
            # keyed by bucket and attn_fa's packing (one sequence's rows, or a mix: the last step)
            assert {k[:2] for k in r._graphs if k[0] == "prefill"} == {("prefill", 32), ("prefill", 4), ("prefill", 16)}
    for x, y in zip(*runs):
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


def test_rows_sample_with_their_own_settings(tiny_models):
    """Three sequences in one decode step, each with its own temperature, top-k and seed:
    each token is the sampling rule applied to that row's own logits and position."""
    r = _runner(tiny_models("llama", "Q4_K_M"))
    seqs = [r.open() for _ in range(3)]
    r.step([Row(s, PROMPT[: 4 + 2 * i]) for i, s in enumerate(seqs)])
    sets = [Sampling(0.0), Sampling(0.9, 40, 0.95, 0.05, 7), Sampling(1.3, 0, 1.0, 0.0, 12345)]
    toks = [5, 6, 7]
    n0 = [s.n for s in seqs]
    out = r.step([Row(s, [t], logits="last", sample=st) for s, t, st in zip(seqs, toks, sets)])
    for o, st, n in zip(out, sets, n0):
        want = reference_sample(o.logits, st.temperature, st.top_k, st.top_p, st.min_p, st.seed, n + 1)
        assert o.token == want
    # a padded bucket: 3 rows ran in the 4-row graph; nothing leaked into a fourth sequence
    assert [s.n for s in seqs] == [n + 1 for n in n0]


def test_kv_blocks_are_freed_shared_and_copied_on_write(tiny_models):
    r = _runner(tiny_models("llama", "Q4_K_M"), max_seqs=4, kv_tokens=6 * 16)
    kv = r.kv
    free0 = kv.alloc.n_free
    a = r.open()
    r.step([Row(a, PROMPT + PROMPT + PROMPT[:4])])  # 24 positions: two blocks of 16
    assert kv.alloc.n_free == free0 - 2
    b = r.open()
    kv.fork(a.slot, b.slot, 24)  # only the full first block is shared
    b.n = 16
    assert kv.alloc.ref[kv.table[a.slot, 0]] == 2 and kv.table[b.slot, 0] == kv.table[a.slot, 0]
    # b continues from position 16 of a's prefix: the same logits as a recomputing it
    la = r.step([Row(a, [7], logits="last")])[0].logits
    r.rewind(a, 24)
    r.step([Row(b, (PROMPT + PROMPT + PROMPT[:4])[16:])])
    lb = r.step([Row(b, [7], logits="last")])[0].logits
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    # writing inside the shared block copies it first: a's rows stay a's
    shared = int(kv.table[a.slot, 0])
    r.rewind(b, 8)
    r.step([Row(b, [9, 9, 9])])
    assert int(kv.table[b.slot, 0]) != shared and kv.alloc.ref[shared] == 1
    la2 = r.step([Row(a, [7], logits="last")])[0].logits
    assert np.array_equal(la.view(np.uint32), la2.view(np.uint32))
    r.close(a)
    r.close(b)
    assert kv.alloc.n_free == free0


def test_the_pool_and_the_context_refuse_what_they_cannot_hold(tiny_models):
    r = _runner(tiny_models("llama", "Q4_K_M"), max_seqs=2, max_len=40, kv_tokens=48)
    a = r.open()
    with pytest.raises(ContextOverflowError):
        r.step([Row(a, list(range(1, 42)))])
    assert a.n == 0 and r.kv.alloc.n_free == 3
    r.step([Row(a, list(range(1, 33)))])
    b = r.open()
    with pytest.raises(KVFullError):
        r.step([Row(b, list(range(1, 20)))])  # needs 2 blocks, 1 is free
    with pytest.raises(MemraError, match="outside the vocabulary"):
        r.step([Row(a, [10 ** 7])])
    r.close(a)
    r.step([Row(b, list(range(1, 20)))])  # a's blocks came back


class _SmallGpu(FakeGpu):
    """The emulator with a free-memory figure (the runner sizes its KV pool from it)."""

    def __init__(self, free):
        super().__init__(1 << 28)
        self._free = free

    def free_memory(self):
        return self._free


def test_a_context_that_cannot_fit_is_refused_before_any_work(tiny_models):
    """A context whose KV cache for one sequence exceeds what the device memory left after
    the weights holds is refused when the runner is built, naming the sizes; one that fits is
    planned and runs. A pool given in tokens or bytes may be smaller than one context (the
    server's admission refuses the requests that can never fit)."""
    from memra.gpu.kv import bytes_per_block
    from memra.model.config import read_config

    path = tiny_models("llama", "Q4_K_M")
    per_block = bytes_per_block(read_config(open_gguf(path)), 16)
    with pytest.raises(ContextOverflowError, match=r"a context of 96 tokens needs .* holds 48 positions"):
        Runner(path, gpu=_SmallGpu(int(3 * per_block / 0.9) + 1), max_len=96, max_seqs=1)  # 3 blocks, 6 needed

    class NoUpload(_SmallGpu):  # the refusal comes before any weight reaches the device
        def to_device(self, *a, **k):
            raise AssertionError("a weight was uploaded before the context was refused")

        def empty(self, *a, **k):
            raise AssertionError("device memory was allocated before the context was refused")

    with pytest.raises(ContextOverflowError, match="before any weight is loaded"):
        Runner(path, gpu=NoUpload(int(3 * per_block / 0.9) + 1), max_len=96, max_seqs=1)
    r = Runner(path, gpu=_SmallGpu(int(6 * per_block / 0.9) + per_block), max_len=96, max_seqs=1)
    s = r.open()
    r.step([Row(s, list(range(1, 90)))])
    assert s.n == 89
    assert Runner(path, gpu=FakeGpu(1 << 28), max_len=96, max_seqs=1, kv_tokens=64).kv.alloc.n_blocks == 4


def test_the_servers_warm_up_captures_every_prefill_bucket(tiny_models):
    """memra serve's warm-up (memra.serve.scheduler.warm_up_gpu) leaves a captured graph for
    every prefill bucket the context allows and every decode bucket its sequences reach, so
    no request pays a capture; the sequences it opened are closed again."""
    from memra.gpu.plan import PREFILL_BUCKETS
    from memra.serve.scheduler import warm_up_gpu

    r = _runner(tiny_models("llama", "Q4_K_M"), max_len=160, max_seqs=4, attn="decode")
    free0 = r.kv.alloc.n_free
    warm_up_gpu(r)
    pre = {k[1] for k in r._graphs if k[0] == "prefill"}
    assert pre == set(PREFILL_BUCKETS)
    # each bucket at every split count a deeper chunk's attention launches (the context's 160
    # positions reach two)
    counts = r.prefill_split_counts()
    assert len(counts) == 2
    assert {k for k in r._graphs if k[0] == "prefill"} == {("prefill", b, c, "p", 1, 1) for b in PREFILL_BUCKETS
                                                           for c in counts}
    assert {k[0] for k in r._graphs if isinstance(k[0], int)} == {1, 2, 4}
    assert r.kv.alloc.n_free == free0
    # a chunk deep in the context replays a captured graph, and gives the bits of its eager run
    n_graphs = len(r._graphs)
    a = r.open()
    r.step([Row(a, PROMPT * 13)])
    deep = r.step([Row(a, PROMPT[:20], logits="all")])[0].logits
    assert r.pre_splits == counts[-1] and len(r._graphs) == n_graphs
    e = _runner(tiny_models("llama", "Q4_K_M"), max_len=160, max_seqs=4, prefill_graph=False, attn="decode")
    b = e.open()
    e.step([Row(b, PROMPT * 13)])
    assert np.array_equal(e.step([Row(b, PROMPT[:20], logits="all")])[0].logits.view(np.uint32), deep.view(np.uint32))


def test_fa_warps_knob_groups_more_tokens_a_block(tiny_models, monkeypatch):
    """MEMRA_FA_WARPS=8: attn_fa's prefill packing built with 8 warps, token groups of 8 * 16 / qpk
    (the emulator checks each group's size against the module's FA_WARPS and its shared memory);
    the rows' bits are the 4-warp packing's (on the device: kernel-check's prefill8 packing), and
    a value outside 1, 2, 4, 8 is refused."""
    path = tiny_models("llama", "Q4_K_M")
    r4 = _runner(path, attn="hybrid")
    assert r4.plan.fa_warps == 4
    monkeypatch.setenv("MEMRA_FA_WARPS", "8")
    r8 = _runner(path, attn="hybrid")
    assert r8.plan.fa_warps == 8
    assert {L.args["warps"] for L in r8.plan.step(16, decode=False) if L.op == "attention_fa"} == {8}
    long = PROMPT * 5
    want = r4.step([Row(r4.open(), long, logits="all")])[0].logits
    got = r8.step([Row(r8.open(), long, logits="all")])[0].logits
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    monkeypatch.setenv("MEMRA_FA_WARPS", "3")
    with pytest.raises(MemraError, match="MEMRA_FA_WARPS must be 1 or 2 or 4 or 8"):
        _runner(path, attn="hybrid")


def test_the_warm_up_captures_the_group_grids_of_many_short_prompts(tiny_models):
    """attn_fa's prefill grid x is the chunk's token-group count rounded up to a power of two: the warm-up's one
    long prompt makes the fewest groups a bucket can, a chunk of many prompts (or of short remainders after a
    prefix-cache hit) more. memra serve's warm-up captures every count a bucket's chunks can make (at most
    B / tpb whole groups and a part of each of max_seqs sequences), so no request pays a capture: before, a
    512-row chunk of 20 prompts of 100 tokens at this context captured ("prefill", 512, .., 32) at first use."""
    from memra.gpu.ops import attn_fa as FA
    from memra.serve.scheduler import warm_up_gpu

    r = _runner(tiny_models("llama", "Q4_K_M"), max_len=640, max_seqs=64, attn="hybrid")
    warm_up_gpu(r)
    keys = set(r._graphs)
    tpb = FA.prefill_tpb(r.cfg.n_gqa, r.plan.fa_warps)
    # bucket 512 holds 449..512 rows: 512 / tpb groups at fewest (one prompt), 512 / tpb + 64 at most, by doubling
    fewest, most = 1 << (-(-449 // tpb) - 1).bit_length(), min(1 << (512 // tpb + 64 - 1).bit_length(), 512)
    want = [fewest]
    while want[-1] < most:
        want.append(min(2 * want[-1], 512))
    assert r.fa_group_counts(512) == want and len(want) >= 2
    assert {k[5] for k in keys if k[0] == "prefill" and k[1] == 512} == set(want)
    rng = np.random.default_rng(1)
    for lens in ([5] * 64, [100] * 20, [3, 200, 9, 60, 1, 1, 17] * 3):
        seqs = [r.open() for _ in lens]
        r.step([Row(s, rng.integers(1, 1000, n).tolist(), sample=Sampling(0.0)) for s, n in zip(seqs, lens)])
        for s in seqs:
            r.close(s)
    assert set(r._graphs) == keys


def test_attn_fa_grid_reaches_the_deepest_rows_split_only(tiny_models, monkeypatch):
    """attn_fa's prefill packing runs a grid z of the splits its deepest row reaches (a power of
    two, at most the context's), not the whole context's: the serve warm-up captures each
    prompt bucket at every such count, a chunk at depth replays one, and its bits are those of
    a runner whose grid is always the context's (the emulator refuses a grid short of a row's
    split). MEMRA_FA_SPLIT 64 makes the 600-position context 10 splits."""
    from memra.gpu.plan import PREFILL_BUCKETS
    from memra.serve.scheduler import warm_up_gpu

    monkeypatch.setenv("MEMRA_FA_SPLIT", "64")
    path = tiny_models("llama", "Q4_K_M")
    r = _runner(path, max_len=600, max_seqs=4, attn="hybrid")
    assert r.fa_n_split == 10 and r.fa_split_counts() == [1, 2, 4, 8, 10]
    warm_up_gpu(r)
    keys = {k for k in r._graphs if k[0] == "prefill" and k[3] == "p"}
    assert {(k[1], k[4]) for k in keys} == {(b, z) for b in PREFILL_BUCKETS for z in (1, 2, 4, 8, 10)}
    n_graphs = len(r._graphs)
    a = r.open()
    r.step([Row(a, PROMPT * 30)])          # 300 positions: splits 0..4, grid 8
    deep = r.step([Row(a, PROMPT[:20], logits="all")])[0].logits
    assert r.fa_splits == 8 and len(r._graphs) == n_graphs
    monkeypatch.setenv("MEMRA_FA_GRID", "full")   # the rollback seam: the whole context's grid, as before
    full = _runner(path, max_len=600, max_seqs=4, attn="hybrid", prefill_graph=False)
    monkeypatch.delenv("MEMRA_FA_GRID")
    assert full.fa_split_counts() == [10]
    b = full.open()
    full.step([Row(b, PROMPT * 30)])
    assert np.array_equal(full.step([Row(b, PROMPT[:20], logits="all")])[0].logits.view(np.uint32),
                          deep.view(np.uint32))
    assert (full.fa_splits, full.fa_groups) == (10, 10)   # the last chunk: 10 rows, one block each
    # a grid short of the deepest row's split is refused by the emulated kernel
    short = _runner(path, max_len=600, max_seqs=4, attn="hybrid", prefill_graph=False)
    short._fa_splits = lambda pos: 1
    c = short.open()
    with pytest.raises(Exception, match="reach split"):
        short.step([Row(c, PROMPT * 30)])
    # grid x: the chunk's token groups (32 tokens each here), a power of two; one group short of
    # them leaves rows uncovered, which the emulated kernel refuses
    tpb = 32
    assert r.p_grp.numpy()[r.fa_groups, 1] == -31249 and r.fa_groups == 1   # the last chunk (10 rows): one group
    x = _runner(path, max_len=600, max_seqs=4, attn="hybrid", prefill_graph=False)
    real = x._upload_groups

    def fewer(seq, pos, size):
        real(seq, pos, size)
        x.fa_groups = max(1, x.fa_groups // 2)

    x._upload_groups = fewer
    d = x.open()
    with pytest.raises(Exception, match="attn_fa: (token group|the token groups do not cover)"):
        x.step([Row(d, PROMPT * 30)])       # 300 rows: 10 groups of up to tpb, grid 16 -> 8
    assert -(-300 // tpb) == 10


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("gemma3", "Q4_K_M"), ("qwen2", "Q8_0")])
def test_attn_fa_runner_is_batch_invariant_and_matches_the_reference(tiny_models, arch, quant):
    """MEMRA_ATTN=fa (kernels/attn_fa.cu for prefill and decode): a sequence alone = among
    co-runners, graph = eager, and the greedy tokens are the CPU reference's. qwen2's 32-wide
    heads decode on the prefill packing, one row a group (its decode groups are not the last
    prefill's)."""
    path = tiny_models(arch, quant)
    r = _runner(path, attn="fa")
    assert r.plan.use_fa and any(L.op == "attention_fa" for L in r.plan.step(1, decode=True))
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    assert graph_vs_eager(_runner(path, attn="fa"), PROMPT, buckets=(1, 2, 4))["identical"]


def test_attn_fa_groups_a_mixed_steps_rows_by_sequence(tiny_models):
    """A step mixing two sequences' prompt chunks runs attn_fa over token groups that never
    straddle the two (the emulator checks every group: one sequence, at most FA_WARPS * 16 /
    qpk rows, each row once), and gives each sequence the logits it gets alone."""
    from memra.gpu.ops.attn_fa import group_table, prefill_tpb

    path = tiny_models("llama", "Q4_K_M")
    r = _runner(path, attn="fa")
    tpb = prefill_tpb(r.cfg.n_gqa)
    seqs = np.array([0] * (tpb + 3) + [1] * 10)
    pos = np.arange(seqs.size)
    pos[2] = -1  # a padded row is in no group
    tab = group_table(seqs, pos, tpb, size=seqs.size)
    assert [tuple(x) for x in tab[:5]] == [(0, 2), (3, tpb), (tpb + 3, 10), (0, 0), (0, 0)]
    a, b = r.open(), r.open()
    mixed = r.step([Row(a, PROMPT * 2, logits="last"), Row(b, PROMPT[::-1], logits="last")])
    r2 = _runner(path, attn="fa")
    a2, b2 = r2.open(), r2.open()
    alone_a = r2.step([Row(a2, PROMPT * 2, logits="last")])[0].logits
    alone_b = r2.step([Row(b2, PROMPT[::-1], logits="last")])[0].logits
    assert np.array_equal(mixed[0].logits.view(np.uint32), alone_a.view(np.uint32))
    assert np.array_equal(mixed[1].logits.view(np.uint32), alone_b.view(np.uint32))
    with pytest.raises(MemraError, match="MEMRA_ATTN"):
        _runner(path, attn="flash")


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("gemma3", "Q4_K_M")])
def test_hybrid_runs_prompt_rows_on_attn_fa_and_generated_rows_on_attn_decode(tiny_models, arch, quant, monkeypatch):
    """MEMRA_ATTN=hybrid: a prompt's rows give attn_fa's bits (MEMRA_ATTN=fa's prefill), every
    generated row decode's (MEMRA_ATTN=decode's, whether a decode step, a verification step or
    a generated run fed beside a prompt chunk); alone = among co-runners, graph = eager, and
    the greedy tokens are the CPU reference's. The attention split alone: the prompt rows' matmuls
    in mv_q8's order as fa's (MEMRA_PROMPT_GEMM=tile, whose tile takes none of the tiny weights;
    the f16 default: tests/test_gemm_f16.py)."""
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
    path = tiny_models(arch, quant)
    r = _runner(path, attn="hybrid")
    assert r.plan.hybrid and not r.prefill_exact and _runner(path, attn="decode").prefill_exact
    assert not any(L.op == "attention_fa" for L in r.plan.step(1, decode=True))
    ops = [L.op for L in r.plan.step(4, decode=False, kinds="pg") if L.layer == 0]
    assert ops.count("attention_fa") == 1 and ops.count("attention") == 1
    assert "attention" not in [L.op for L in r.plan.step(4, decode=False) if L.layer == 0]
    # attn_fa's prefill packing leaves the q8 twin to a quantize launch; generated rows alone get
    # it from attn_decode, as a decode step does
    twin_launch = lambda kinds: any(L.name.endswith("attn_q8") for L in r.plan.step(4, False, kinds=kinds))  # noqa: E731
    assert twin_launch("pg") and twin_launch("p") and not twin_launch("g")
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    assert graph_vs_eager(_runner(path, attn="hybrid"), PROMPT, buckets=(1, 2, 4))["identical"]

    def logits(attn, rows_of):
        e = _runner(path, attn=attn)
        s = e.open()
        return rows_of(e, s)

    # the prompt's logits: attn_fa's
    pre = lambda e, s: e.step([Row(s, PROMPT, logits="all")])[0].logits  # noqa: E731
    assert np.array_equal(logits("hybrid", pre).view(np.uint32), logits("fa", pre).view(np.uint32))
    # generated rows after a prompt: decode's, in a decode step, in a verification step and as a
    # generated run in an eager step beside another sequence's prompt chunk (the prompt itself
    # computed with attn_fa in both runners, so the cache the generated rows read is the same)
    nxt = [5, 9, 300]

    def gen_rows(e, s, how):
        e.step([Row(s, PROMPT)])
        if how == "decode":
            return np.stack([e.step([Row(s, [t], logits="last")])[0].logits for t in nxt])
        if how == "verify":
            return e.verify(s, nxt, logits="all")[1]
        other = e.open()
        outs = e.step([Row(s, nxt, logits="all", gen=True), Row(other, PROMPT[::-1], logits="last")])
        return outs[0].logits

    ref = logits("hybrid", lambda e, s: gen_rows(e, s, "decode"))
    for how in ("verify", "eager"):
        got = logits("hybrid", lambda e, s: gen_rows(e, s, how))
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), how
    # and they are not attn_fa's (the two arithmetics differ somewhere in these rows)
    fa = logits("fa", lambda e, s: gen_rows(e, s, "decode"))
    assert not np.array_equal(fa.view(np.uint32), ref.view(np.uint32))

    # a prompt's last token alone in a step (a prefix-cache hit's remainder) stays a prompt row
    # when the caller says so (gen=False); a one-token row by default is a decode step
    def last_alone(gen):
        def run(e, s):
            e.step([Row(s, PROMPT[:-1])])
            return e.step([Row(s, PROMPT[-1:], logits="last", gen=gen)])[0].logits
        return run
    whole = logits("hybrid", lambda e, s: e.step([Row(s, PROMPT, logits="last")])[0].logits)
    assert np.array_equal(logits("hybrid", last_alone(False)).view(np.uint32), whole.view(np.uint32))
    assert not np.array_equal(logits("hybrid", last_alone(None)).view(np.uint32), whole.view(np.uint32))


def test_hybrid_prompt_rows_take_the_tile_gemm(tiny_models, monkeypatch):
    """MEMRA_ATTN=hybrid with the prompt tile (kernels/gemm_tile.cu, emulated by memra.gpu.chain;
    MIN_ROW_TILES lowered so the tiny model's weights qualify): prompt steps launch it for every
    layer weight, decode steps, generated rows and the head do not, a step holds one row kind;
    prompt rows are chunk- and batch-invariant, a generated run fed beside another sequence's
    prompt keeps decode's bits, the tokens stay the CPU reference's, and MEMRA_TILE=0 turns it off."""
    from memra.gpu.ops import gemm_tile as GT

    monkeypatch.setattr(GT, "MIN_ROW_TILES", 1)
    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")   # the tile's rollback seam (the f16 default takes these weights)
    path = tiny_models("llama", "Q4_K_M")
    r = _runner(path, attn="hybrid")
    assert r.plan.use_tile
    n_weights = len(r.plan.layer_weights(0))
    ops = lambda **kw: [L.op for L in r.plan.step(4, **kw)]  # noqa: E731
    assert ops(decode=False, kinds="p").count("gemm_tile") == n_weights * r.cfg.n_layer
    assert "gemm_tile" not in ops(decode=False, kinds="g") + ops(decode=True) + [L.op for L in r.plan.head(4)]
    with pytest.raises(MemraError, match="one row kind"):
        r.plan.step(4, decode=False, kinds="pg")
    res = batch_invariance(r, PROMPT, n_steps=5, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 5)
    assert graph_vs_eager(_runner(path, attn="hybrid"), PROMPT, buckets=(1, 2, 4))["identical"]

    def prompt_logits(e, chunks):
        s = e.open()
        out = []
        for i in range(0, len(PROMPT), chunks):
            out.append(e.step([Row(s, PROMPT[i:i + chunks], logits="all", gen=False)])[0].logits)
        return np.concatenate(out).view(np.uint32)

    whole = prompt_logits(r, len(PROMPT))
    for chunks in (1, 3):
        assert np.array_equal(prompt_logits(_runner(path, attn="hybrid"), chunks), whole), chunks
    # a generated run beside another sequence's prompt (one step call, two kinds): the runner
    # splits it by kind; the generated rows keep decode's bits, the prompt its own
    nxt = [5, 9, 300]

    def after_prompt(e, mixed):
        s = e.open()
        e.step([Row(s, PROMPT)])
        if not mixed:
            return np.stack([e.step([Row(s, [t], logits="last")])[0].logits for t in nxt]), None
        o = e.open()
        outs = e.step([Row(s, nxt, logits="all", gen=True), Row(o, PROMPT[::-1], logits="last")])
        return outs[0].logits, outs[1].logits

    dec, _ = after_prompt(_runner(path, attn="hybrid"), False)
    gen, other = after_prompt(_runner(path, attn="hybrid"), True)
    assert np.array_equal(gen.view(np.uint32), dec.view(np.uint32))
    alone = _runner(path, attn="hybrid")
    want = alone.step([Row(alone.open(), PROMPT[::-1], logits="last")])[0].logits
    assert np.array_equal(other.view(np.uint32), want.view(np.uint32))
    # the eager path's steps: at most PREFILL_CHUNK rows, cut where the row kind changes
    gen = np.array([False, False, True, True] + [False] * 601)
    assert r._chunks(gen) == [(0, 2), (2, 2), (4, 512), (516, 89)]
    # MEMRA_TILE=0: no tile launch, and the prompt rows' bits change with it
    monkeypatch.setenv("MEMRA_TILE", "0")
    off = _runner(path, attn="hybrid")
    assert not off.plan.use_tile and "gemm_tile" not in [L.op for L in off.plan.step(4, decode=False)]
    assert off._chunks(gen) == [(0, 512), (512, 93)]   # one step may hold both kinds without the tile
    assert not np.array_equal(prompt_logits(off, len(PROMPT)), whole)
    # MEMRA_TILE_MIN (a measurement knob): more output tiles than any weight has turns it off
    monkeypatch.setenv("MEMRA_TILE", "1")
    monkeypatch.setenv("MEMRA_TILE_MIN", "1000")
    assert not _runner(path, attn="hybrid").plan.use_tile
    monkeypatch.setenv("MEMRA_TILE_MIN", "0")
    with pytest.raises(MemraError, match="MEMRA_TILE_MIN must be a positive integer"):
        _runner(path, attn="hybrid")


def test_att_splits_override_keeps_prefill_equal_to_decode(tiny_models, monkeypatch):
    """MEMRA_ATT_SPLITS sets the decode attention's split count (the plan's and the launch's);
    a row's bits stay independent of the batch it runs in, and a bad value is refused."""
    from memra.tune.bench import seams

    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.delenv("MEMRA_ATTN", raising=False)
    monkeypatch.setenv("MEMRA_ATT_SPLITS", "3")
    r = _runner(path, attn="decode")
    assert r.plan.n_splits == 3 and seams() == {"MEMRA_ATT_SPLITS": "3"}
    res = batch_invariance(r, PROMPT, n_steps=4, co=5)
    assert res["identical"], res
    monkeypatch.setenv("MEMRA_ATT_SPLITS", "0")
    with pytest.raises(MemraError, match="MEMRA_ATT_SPLITS must be an integer in 1..256"):
        _runner(path)


def test_fa_split_override_keeps_prompt_rows_chunk_invariant(tiny_models, monkeypatch):
    """MEMRA_FA_SPLIT sets attn_fa's split size (the plan's and its launches'): with
    MEMRA_ATTN=hybrid a prompt of more keys than one split gives the same bits in one chunk as
    token by token (the rows merge their splits), and a bad value is refused."""
    from memra.tune.bench import seams

    path = tiny_models("llama", "Q4_K_M")
    prompt = PROMPT * 8  # 80 keys: two splits of 64

    def run(one_at_a_time):
        e = _runner(path, attn="hybrid")
        s = e.open()
        if not one_at_a_time:
            return e.step([Row(s, prompt, logits="all")])[0].logits
        return np.stack([e.step([Row(s, [t], logits="last", gen=False)])[0].logits for t in prompt])

    monkeypatch.delenv("MEMRA_ATTN", raising=False)
    monkeypatch.setenv("MEMRA_FA_SPLIT", "64")
    plan = _runner(path, attn="hybrid").plan
    assert seams() == {"MEMRA_FA_SPLIT": "64"}
    assert {L.args["split"] for L in plan.step(4, decode=False) if L.op == "attention_fa"} == {64}
    whole, single = run(False), run(True)
    assert np.array_equal(whole.view(np.uint32), single.view(np.uint32))
    monkeypatch.setenv("MEMRA_FA_SPLIT", "100")
    with pytest.raises(MemraError, match="MEMRA_FA_SPLIT must be a multiple of 64"):
        _runner(path, attn="hybrid")


def test_bad_integer_settings_are_refused_by_name(tiny_models, monkeypatch):
    """MEMRA_KV_BLOCK, MEMRA_ATT_GROUP_ROWS and MEMRA_MASK_THREADS (docs/FLAGS.md) go through
    memra.env.env_int: a value that is not one of theirs is refused naming the setting (before,
    a non-integer raised a bare ValueError, and a bad mask thread count was silently taken as 1)."""
    from memra.text.grammar import mask_threads

    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.setenv("MEMRA_KV_BLOCK", "32")
    assert _runner(path).kv_block == 32
    for name, bad, what in (("MEMRA_KV_BLOCK", "12", "a power of two"), ("MEMRA_KV_BLOCK", "x", "a power of two"),
                            ("MEMRA_ATT_GROUP_ROWS", "-1", "a non-negative integer")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(MemraError, match=f"{name} must be {what}, got '{bad}'"):
            _runner(path)
        monkeypatch.delenv(name)
    monkeypatch.setenv("MEMRA_MASK_THREADS", "0")
    with pytest.raises(MemraError, match="MEMRA_MASK_THREADS must be a positive integer"):
        mask_threads()


def test_decode_run_queues_ahead_with_the_step_by_step_tokens(tiny_models, monkeypatch):
    """decode_run queues a chunk before handing out the previous one's tokens: the tokens are
    those of one step() a token (greedy and seeded sampling, two sequences), with the rollback
    (MEMRA_DECODE_AHEAD=0) too; more() returning False ends the run after the chunks already
    computed, and a sequence's length counts only the steps handed out."""
    path = tiny_models("llama", "Q4_K_M")
    sets = [Sampling(0.0), Sampling(0.9, 40, 0.95, 0.05, 7)]

    def start(r):
        seqs = [r.open() for _ in range(2)]
        out = r.step([Row(s, PROMPT[: 5 + 3 * i], sample=st) for i, (s, st) in enumerate(zip(seqs, sets))])
        return seqs, [o.token for o in out]

    r = _runner(path)
    seqs, first = start(r)
    want = [[t] for t in first]
    for _ in range(11):
        out = r.step([Row(s, [w[-1]], sample=st) for s, w, st in zip(seqs, want, sets)])
        for w, o in zip(want, out):
            w.append(o.token)
    for ahead in ("1", "0"):
        monkeypatch.setenv("MEMRA_DECODE_AHEAD", ahead)
        r = _runner(path)
        seqs, first = start(r)
        assert first == [w[0] for w in want]
        n0 = [s.n for s in seqs]
        got = list(r.decode_run(seqs, first, 11, sets, chunk=4))
        assert [[first[b]] + [st[b] for st in got] for b in range(2)] == want
        assert [s.n for s in seqs] == [n + 11 for n in n0]
        # more() allows one more chunk, then says stop: the run ends after that chunk
        r = _runner(path)
        seqs, first = start(r)
        calls = []
        got = list(r.decode_run(seqs, first, 11, sets, chunk=4, more=lambda: (calls.append(1), len(calls) < 2)[1]))
        assert len(calls) == 2 and len(got) == 8
        assert [[first[b]] + [st[b] for st in got] for b in range(2)] == [w[:9] for w in want]
        assert [s.n for s in seqs] == [n + 8 for n in n0]


def test_decode_run_replays_several_steps_a_graph(tiny_models, monkeypatch):
    """MEMRA_GRAPH_STEPS=G: decode_run replays G steps a graph launch (the step's launches captured G times; a
    chunk's remainder one step a launch) and hands out the tokens of one step a launch — greedy and seeded
    sampling, two sequences, chunks of 4 with a remainder of 3."""
    path = tiny_models("llama", "Q4_K_M")
    sets = [Sampling(0.0), Sampling(0.9, 40, 0.95, 0.05, 7)]

    def run(steps):
        monkeypatch.setenv("MEMRA_GRAPH_STEPS", steps)
        r = _runner(path)
        seqs = [r.open() for _ in range(2)]
        out = r.step([Row(s, PROMPT[: 5 + 3 * i], sample=st) for i, (s, st) in enumerate(zip(seqs, sets))])
        got = list(r.decode_run(seqs, [o.token for o in out], 11, sets, chunk=4))
        return got, {k[-1] for k in r._graphs if k[0] == "steps"}

    want, none = run("1")
    assert none == set()
    for g in ("2", "4"):
        got, made = run(g)
        assert got == want and made == {int(g)}


def _greedy_steps(r, prompt, n):
    """A new sequence's prompt, then n greedy decode steps one step() each: (sequence, tokens, logits)."""
    s = r.open()
    out = r.step([Row(s, prompt, logits="last", sample=Sampling(0.0))])[0]
    toks, logits = [out.token], [out.logits]
    for _ in range(n):
        o = r.step([Row(s, [toks[-1]], logits="last", sample=Sampling(0.0))])[0]
        toks.append(o.token)
        logits.append(o.logits)
    return s, toks, logits


def _straddle(r, prompt, more):
    """Two new sequences, a with prompt[:8], b with the prompt and `more` greedy copies of its next token, then one
    step of a row each: (that step's outputs, a's token fed, b's token repeated)."""
    a, b = r.open(), r.open()
    la = r.step([Row(a, prompt[:8], logits="last", sample=Sampling(0.0))])[0].token
    lb = r.step([Row(b, prompt, logits="last", sample=Sampling(0.0))])[0].token
    r.step([Row(b, [lb] * more, sample=Sampling(0.0))])
    return r.step([Row(a, [la], logits="last"), Row(b, [3], logits="last")]), la, lb


def test_att_depth_path_keeps_the_bits_across_split_counts(tiny_models, monkeypatch):
    """MEMRA_ATT_DEPTH=1: a decode step launches its deepest row's split count (graphs keyed by
    it) and, once KV heads x splits fill the SMs (here 4, so from 2 splits), blocks of the whole
    GQA group. Below 128 x the default split count every row is cut into the same 128-key splits
    either way, so the logits are the default path's bit for bit: step by step across 128 keys
    (one split, then two), and decode_run's chunks switching graphs mid-run give the same tokens;
    capture_decode_splits leaves every later depth a captured graph."""
    path = tiny_models("llama", "Q4_K_M")
    rng = np.random.default_rng(3)
    prompt = [int(x) for x in rng.integers(3, 400, 122)]

    def runner(depth: str):
        monkeypatch.setenv("MEMRA_ATT_DEPTH", depth)
        r = _runner(path, max_len=400, max_seqs=4)
        r.plan.sms = 4   # the whole group from 2 splits (2 KV heads x 2)
        return r

    _, want, want_lg = _greedy_steps(runner("0"), prompt, 12)
    r = runner("1")
    assert r.plan.att_depth and r.plan.n_splits >= 2
    _, got, got_lg = _greedy_steps(r, prompt, 12)
    assert got == want
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got_lg, want_lg))
    counts = {k[2] for k in r._graphs if isinstance(k[0], int) and len(k) == 4}
    assert {1, 2} <= counts   # prompt + 12 tokens: 123 .. 134 keys
    assert r.plan.att_hpb_at(1, 2) == r.cfg.n_gqa and r.plan.att_hpb_at(1, 1) == r.plan.att_hpb_rows(1)
    # decode_run in chunks of 4 from the prompt: its graphs switch at the 128-key boundary
    r = runner("1")
    s = r.open()
    first = r.step([Row(s, prompt, sample=Sampling(0.0))])[0].token
    run = [t[0] for t in r.decode_run([s], [first], 12, [Sampling(0.0)], chunk=4)]
    assert [first] + run == want
    # the server's warm-up: the captured decode graphs at every split count up to the context
    def decode_keys():
        return {k for k in r._graphs if isinstance(k[0], int)}

    assert r.capture_decode_splits() > 0
    before = decode_keys()
    assert {k[2] for k in before} >= {1, 2, 4}
    s2 = r.open()
    r.step([Row(s2, prompt + [5] * 150, sample=Sampling(0.0))])
    r.step([Row(s2, [7], sample=Sampling(0.0))])   # 274 keys: 4 splits (3 needed), replayed
    assert r.dec_splits == 4 and decode_keys() == before


def test_att_switch_computes_every_row_once_and_keys_its_graphs(tiny_models, monkeypatch):
    """The attention switch (MEMRA_ATT_SWITCH here): a decode step's attention is the short module's launch (rows of
    fewer than the switch's keys), the long one's, or both, each module filtering its rows (ATT_ROWS). The emulator's
    attention is float64 whatever the configuration, so the logits must equal the unswitched engine's bit for bit:
    every row computed, roped and appended exactly once, step by step across the switch, in decode_run's chunks whose
    graphs change kind mid-run, and for two sequences on either side of it in one step."""
    path = tiny_models("llama", "Q4_K_M")
    rng = np.random.default_rng(5)
    prompt = [int(x) for x in rng.integers(3, 400, 20)]

    def runner(switch: str):
        monkeypatch.setenv("MEMRA_ATT_SWITCH", switch)
        return _runner(path, max_len=96, max_seqs=4)

    _, want, want_lg = _greedy_steps(runner("0"), prompt, 10)
    r = runner("26")                    # rows of 21..31 keys: short up to 25, long from 26
    assert r.plan.att_switch == (26, {**(r.plan.att_cfg or {}), "ATT_TC": 0, "ATT_TILE": 32})
    _, got, got_lg = _greedy_steps(r, prompt, 10)
    assert got == want
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got_lg, want_lg))
    assert {k[3] for k in r._graphs if isinstance(k[0], int)} == {"short", "long"}
    # decode_run in chunks of 4 from the prompt: short, then both (25 -> 28 keys), then long
    r = runner("26")
    s = r.open()
    first = r.step([Row(s, prompt, sample=Sampling(0.0))])[0].token
    assert [first] + [t[0] for t in r.decode_run([s], [first], 10, [Sampling(0.0)], chunk=4)] == want
    assert {k[3] for k in r._graphs if isinstance(k[0], int)} == {"short", "both", "long"}
    # two sequences in one step, one on each side of the switch: each as it is alone
    r = runner("26")
    both, la, lb = _straddle(r, prompt, 6)   # b: 26 tokens cached, a: 8
    assert r.dec_kind == "both"
    ra = runner("0")
    a1, b1 = ra.open(), ra.open()
    ra.step([Row(a1, prompt[:8])])
    ra.step([Row(b1, prompt + [lb] * 6)])
    alone = [ra.step([Row(a1, [la], logits="last")])[0], ra.step([Row(b1, [3], logits="last")])[0]]
    for x, y in zip(both, alone):
        assert np.array_equal(x.logits.view(np.uint32), y.logits.view(np.uint32))


def test_att_switch_plan(tiny_models, monkeypatch):
    """The plan's side of MEMRA_ATT_SWITCH: the step kinds and their launches, sliding-window layers (a row past the
    switch still has at most the window's keys there), and bad values refused by name."""
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "64:ATT_TC=0,ATT_TILE=32")
    p = _runner(tiny_models("llama", "Q4_K_M")).plan
    assert p.att_kind_of(0, 62) == "short" and p.att_kind_of(63, 90) == "long" and p.att_kind_of(10, 70) == "both"

    def att(kind):
        return [(L.name.rsplit(".", 1)[-1], L.args["att_rows"], (L.config or {}).get("ATT_TILE"))
                for L in p.step(1, decode=True, att_kind=kind) if L.kernel == "attn_decode" and L.layer == 0]

    tile = (p.att_cfg or {}).get("ATT_TILE")
    assert att("short") == [("attention", 1, 32)]
    assert att("long") == [("attention_long", 2, tile)]
    assert att("both") == [("attention", 1, 32), ("attention_long", 2, tile)]
    # prefill-path steps (verification, forced runs) hold both modules whatever their depth
    assert all(sum(L.kernel == "attn_decode" and L.layer == il for L in p.step(4, decode=False, kinds="g")) == 2
               for il in range(p.cfg.n_layer)) or not p.hybrid
    g = _runner(tiny_models("gemma3", "Q4_K_M")).plan
    w = g.cfg.swa_window
    assert any(g.cfg.is_swa(il) for il in range(g.cfg.n_layer))
    if w < 64:
        assert g.att_kind_of(100, 120) == "both"
    for bad in ("x", "64:ATT_BAD=1", "0:ATT_TC=0x"):
        monkeypatch.setenv("MEMRA_ATT_SWITCH", bad)
        with pytest.raises(MemraError, match="MEMRA_ATT_SWITCH"):
            _runner(tiny_models("llama", "Q4_K_M"))


@pytest.mark.parametrize("switch,max_len", [("40:ATT_TC=0,ATT_TILE=16,ATT_MIN_CHUNK=16", 96),
                                            ("57:ATT_TC=0,ATT_TILE=8,ATT_MIN_CHUNK=56", 300)])
def test_att_switch_grid_lays_out_each_module_as_the_plan_count_does(tiny_models, monkeypatch, switch, max_len):
    """A trimmed attention grid (MEMRA_ATT_DEPTH decode steps, prefill chunks) must cut every row into the splits the
    plan's full count gives under the configuration of the module that computes it: with a short module of its own
    ATT_MIN_CHUNK (smaller than the long one's; or, second case, as long as its rows, each of them one split: the
    form session 39 measured at 129-256 keys) the step's count is the larger of the two modules' needs, and the
    counts the runner captures graphs for are every count a step can take."""
    from memra.gpu.ops import attention as ATT

    monkeypatch.setenv("MEMRA_ATT_SWITCH", switch)
    monkeypatch.setenv("MEMRA_ATT_DEPTH", "1")
    r = _runner(tiny_models("llama", "Q4_K_M"), max_len=max_len, max_seqs=2)
    below, short = r.plan.att_switch
    N, D = r.plan.n_splits, r.cfg.head_dim

    def layout(n, S, cfg):
        d = ATT.defines(D, cfg)
        tile, least = int(d["ATT_TILE"]), int(d.get("ATT_MIN_CHUNK", ATT.MIN_CHUNK))
        chunk = max(least, -(-(-(-n // S)) // tile) * tile)
        return chunk, -(-n // chunk)

    seen = set()
    for deepest in range(1, r.max_len + 1):
        S = r._splits_at(deepest - 1, True)
        seen.add(S)
        for n in range(1, deepest + 1):
            cfg = short if n < below else r.plan.att_cfg
            chunk, active = layout(n, S, cfg)
            assert (chunk, active) == layout(n, N, cfg) and active <= S, (deepest, n, S)
    if switch.startswith("40:"):
        assert max(seen) > 1                  # the short module's 16-key splits need more than one
    else:   # a short row: one split; the long module's rows past 128 keys: several
        assert all(layout(n, N, short) == (56, 1) for n in range(1, below)) and max(seen) > 1
    assert seen <= set(r._split_counts(True))
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    r0 = _runner(tiny_models("llama", "Q4_K_M"), max_len=96, max_seqs=2)
    assert {r0._splits_at(p, True) for p in range(96)} == {1}   # the long module alone: one split up to 128 keys


def test_att_switch_from_the_table(tiny_models, monkeypatch, caplog):
    """The attention switch as the tuning table ships it: the attn_decode entry's `switch` turns it on at that key
    count with the short module's configuration (the plan's configuration keeps the entry's tunables only), exactly
    as MEMRA_ATT_SWITCH would, or with the entry's own `short` values; MEMRA_ATT_SWITCH=0 turns it off (the rollback)
    and a value overrides it; a bad `switch` or `short` is refused with a warning and the built-in default used."""
    from memra.gpu.plan import ATT_SHORT
    from memra.tune.tables import shape_key

    monkeypatch.delenv("MEMRA_ATT_SWITCH", raising=False)
    path = tiny_models("llama", "Q4_K_M")
    heads = _runner(path).plan.heads

    def table(config):
        return {"entries": {"attn_decode": {shape_key({**heads, "ctx": 64}): {
            "1": {"variant": "default", "config": config}}}}}

    cfg = {"ATT_TILE": 64, "ATT_WARPS": 4, "hpb": 1}
    p = _runner(path, tune_table=table({**cfg, "switch": 26})).plan
    assert p.att_cfg == cfg and p.att_switch == (26, {**cfg, **ATT_SHORT})
    assert [L.args["att_rows"] for L in p.step(1, decode=True, att_kind="both")
            if L.kernel == "attn_decode" and L.layer == 0] == [1, 2]
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "26")
    assert _runner(path, tune_table=table(cfg)).plan.att_switch == p.att_switch
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    p0 = _runner(path, tune_table=table({**cfg, "switch": 26})).plan
    assert p0.att_switch is None and p0.att_cfg == cfg
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "40")
    assert _runner(path, tune_table=table({**cfg, "switch": 26})).plan.att_switch[0] == 40
    monkeypatch.delenv("MEMRA_ATT_SWITCH")
    # the entry's own short module (its `short` ATT_* values laid over the entry's)
    p = _runner(path, tune_table=table({**cfg, "switch": 26, "short": {"ATT_TC": 0}})).plan
    assert p.att_cfg == cfg and p.att_switch == (26, {**cfg, "ATT_TC": 0})
    for bad, why in ((0, "switch must be a key count"), ("26", "switch must be a key count"),
                     (2.5, "switch must be a key count"), ((26, {"ATT_BAD": 1}), "short must map tunables"),
                     ((26, [1]), "short must map tunables")):
        extra = {"switch": bad[0], "short": bad[1]} if isinstance(bad, tuple) else {"switch": bad}
        with caplog.at_level("WARNING", logger="memra"):
            pb = _runner(path, tune_table=table({**cfg, **extra})).plan
        assert pb.att_switch is None and pb.att_cfg is None
        assert why in caplog.text
        caplog.clear()


def test_att_splits_from_the_table(tiny_models, monkeypatch, caplog):
    """The attn_decode entry's `splits` is the plan's split count (an engine choice measured at depth), over the
    MEMRA_ATT_DEPTH rule, and kept out of the module configuration; MEMRA_ATT_SPLITS still overrides it; a decode at
    the entry's count gives the tokens MEMRA_ATT_SPLITS gives at that count (the same layout) past the depth where
    the count shapes the splits (ATT_MIN_CHUNK x splits keys); a bad value is refused with a warning and the
    built-in default used."""
    from memra.tune.tables import shape_key

    for k in ("MEMRA_ATT_SPLITS", "MEMRA_ATT_SWITCH", "MEMRA_ATTN"):
        monkeypatch.delenv(k, raising=False)
    path = tiny_models("llama", "Q4_K_M")
    base = _runner(path)
    heads, rule = base.plan.heads, base.plan.n_splits

    def table(config):
        return {"entries": {"attn_decode": {shape_key({**heads, "ctx": 64}): {
            "1": {"variant": "default", "config": config}}}}}

    cfg = {"ATT_TILE": 64, "ATT_WARPS": 4, "hpb": 1}
    r = _runner(path, tune_table=table({**cfg, "splits": 1}), max_len=320)
    assert r.plan.n_splits == 1 != rule and r.plan.att_cfg == cfg
    monkeypatch.setenv("MEMRA_ATT_SPLITS", "3")
    assert _runner(path, tune_table=table({**cfg, "splits": 1})).plan.n_splits == 3
    monkeypatch.setenv("MEMRA_ATT_SPLITS", "1")
    r_env = _runner(path, tune_table=table(cfg), max_len=320)
    monkeypatch.delenv("MEMRA_ATT_SPLITS")
    toks = []
    for rr in (r, r_env):   # 150 prompt rows: the last decode rows hold more than 128 keys in their one split
        s = rr.open()
        out = rr.step([Row(s, (PROMPT * 15)[:150], sample=Sampling(0.0))])
        toks.append([out[0].token] + [t[0] for t in rr.decode_run([s], [out[0].token], 6, [Sampling(0.0)])])
    assert toks[0] == toks[1]
    assert r._dec_splits_for(199) == 1 < base._dec_splits_for(199)   # the decode grid follows the entry's count
    for bad in (0, 300, "16", 2.5):
        with caplog.at_level("WARNING", logger="memra"):
            pb = _runner(path, tune_table=table({**cfg, "splits": bad})).plan
        assert pb.n_splits == rule and pb.att_cfg is None
        assert "splits must be an integer in 1..256" in caplog.text
        caplog.clear()


@pytest.mark.parametrize("fused", [True, False])
def test_att_switch_row_filter_check_catches_a_wrong_filter(fused, monkeypatch):
    """The kernel-check of attention.cu's row filter (memra.gpu.ops.attention._check_rows_filter) on the emulator,
    which models ATT_ROWS: it passes, and fails when the filter lets a row through to both modules or to neither."""
    import gpu_emulator as EMU
    from memra.gpu.ops import attention as ATT

    # D, gqa, n_kv, heads a block, window, rope_dim, neox, qk_norm, bias
    case = (64, 2, 2, 1, 0, 64, True, False, False)
    o = ATT._check_rows_filter(FakeGpu(1 << 27), np.random.default_rng(1), case, 100, fused=fused)
    assert o.ok, o.detail
    real = EMU._att_rows_pos

    class Swapped:   # a kernel whose filter keeps the other module's rows
        def __init__(self, k):
            m = EMU._d(k, "ATT_ROWS", 0)
            self.defines = {**k.defines, "ATT_ROWS": 3 - m} if m else k.defines

    for wrong in (lambda g, k, pos, T, window: pos,                              # every row in both modules
                  lambda g, k, pos, T, window: real(g, Swapped(k), pos, T, window)):
        monkeypatch.setattr(EMU, "_att_rows_pos", wrong)
        o = ATT._check_rows_filter(FakeGpu(1 << 27), np.random.default_rng(1), case, 100, fused=fused)
        assert not o.ok, o.detail


def test_att_switch_row_filter_check_on_a_window_below_the_switch(monkeypatch):
    """A sliding-window layer whose window is below the switch (Gemma-3's 512-key window, its switch at 2049) has
    every row on the short side: the row-filter check runs (the long module must write nothing, the short one every
    row) instead of refusing the case, and still catches a filter that lets the rows through to both modules."""
    import gpu_emulator as EMU
    from memra.gpu.ops import attention as ATT

    case = (64, 2, 2, 1, 32, 64, True, False, False)   # window 32, switch 100
    o = ATT._check_rows_filter(FakeGpu(1 << 27), np.random.default_rng(1), case, 100)
    assert o.ok, o.detail
    monkeypatch.setattr(EMU, "_att_rows_pos", lambda g, k, pos, T, window: pos)
    o = ATT._check_rows_filter(FakeGpu(1 << 27), np.random.default_rng(1), case, 100)
    assert not o.ok and "another module's rows" in o.detail, o.detail
