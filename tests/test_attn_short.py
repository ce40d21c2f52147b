"""kernels/attn_short.cu as the attention switch's short module (a configuration naming ATT_KERNEL 1): the
launcher's module and refusals, kernel-check's case (_check_short) on the emulator and a wrong kernel it catches,
and the engine with the switch naming it (the emulator's attention is float64 whatever the module, so its tokens
and logits must be the unswitched engine's bit for bit: every row computed, roped and appended exactly once)."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu, ModuleLog
from memra.errors import MemraError
from memra.gpu.ops import attention as ATT
from memra.gpu.runner import Runner
from test_runner_emulated import _greedy_steps, _runner, _straddle

SHORT = "129:ATT_KERNEL=1,ATT_WARPS=16,SHORT_KB=8,SHORT_VB=8"


def test_module_defines_keep_attn_short_tunables_only():
    d = ATT.module_defines(256, 1, {"ATT_TILE": 32, "ATT_TC": 1, "ATT_KERNEL": 1, "SHORT_KB": 4})
    assert d == {"HEAD_DIM": 256, "N_GQA": 1, "ATT_KERNEL": 1, "ATT_WARPS": 16, "SHORT_PF": 2, "SHORT_KB": 4,
                 "SHORT_VB": 8, "KV_BLOCK": 16}
    assert ATT.kernel_file({"ATT_KERNEL": 1}) == ATT.SHORT_FILE and ATT.kernel_file(None) == ATT.KERNEL_FILE
    assert ATT.splits_for(100, 64, 256, {"ATT_KERNEL": 1}) == 1
    for bad, what in (({"ATT_KERNEL": 1, "ATT_WARPS": 4}, "ATT_WARPS"), ({"ATT_KERNEL": 2}, "ATT_KERNEL must be"),
                      ({"ATT_KERNEL": 1, "SHORT_PF": 3, "SHORT_KB": 2}, "SHORT_PF")):
        with pytest.raises(MemraError, match=what):
            ATT.module_defines(64, 1, bad)
    with pytest.raises(MemraError, match="head_dim"):
        ATT.module_defines(72, 1, {"ATT_KERNEL": 1})
    with pytest.raises(MemraError, match="f16 KV"):
        ATT.module_defines(64, 1, {"ATT_KERNEL": 1}, kv_q8=(True, False))


def test_the_launcher_needs_the_row_filter_below_its_limit():
    g = FakeGpu(1 << 26)
    for rf in ((0, 0), (2, 129), (1, ATT.SHORT_MAX + 2)):
        with pytest.raises(MemraError, match="row filter"):
            ATT.module(g, 64, 1, config={"ATT_KERNEL": 1}, rows_filter=rf)
    m = ATT.module(g, 64, 1, config={"ATT_KERNEL": 1}, rows_filter=(1, 129))
    assert m.kernel_file == ATT.SHORT_FILE and m.defines["ATT_ROWS"] == 1 and m.defines["ATT_SWITCH"] == 129


@pytest.mark.parametrize("i", range(len(ATT.SHORT_CASES)))
def test_kernel_check_case_passes_on_the_emulator(i):
    case, keys, cfg = ATT.SHORT_CASES[i]
    o = ATT._check_short(FakeGpu(1 << 27), np.random.default_rng(i), case, keys, cfg)
    assert o.ok, o.detail


def test_kernel_check_catches_a_short_module_that_writes_a_long_row(monkeypatch):
    """The emulated attn_short module with its row filter ignored (it appends and computes the long rows too): the
    case fails."""
    real = EMU._att_rows_pos

    def no_filter(g, k, pos, T, window):
        return pos if k.module.kernel_file == ATT.SHORT_FILE else real(g, k, pos, T, window)

    monkeypatch.setattr(EMU, "_att_rows_pos", no_filter)
    case, keys, cfg = ATT.SHORT_CASES[0]
    o = ATT._check_short(FakeGpu(1 << 27), np.random.default_rng(0), case, keys, cfg)
    assert not o.ok and ("long row" in o.detail or "K cache" in o.detail), o.detail


def test_the_switch_runs_attn_short_with_the_unswitched_bits(tiny_models, monkeypatch):
    path = tiny_models("llama", "Q4_K_M")
    rng = np.random.default_rng(7)
    prompt = [int(x) for x in rng.integers(3, 400, 20)]
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    _, want, want_lg = _greedy_steps(_runner(path, max_len=96, max_seqs=4), prompt, 8)
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "26:ATT_KERNEL=1")   # rows of 21..29 keys on both sides
    g = ModuleLog(1 << 28)
    r = Runner(path, gpu=g, max_len=96, max_seqs=4)
    assert ATT.is_short(r.plan.att_switch[1])
    _, got, got_lg = _greedy_steps(r, prompt, 8)
    assert got == want
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got_lg, want_lg))
    assert any(f == ATT.SHORT_FILE for f, _ in g.loaded)
    # the unfused path (rope_norm_kv, then attn_short.cu's attn_decode) too
    monkeypatch.setenv("MEMRA_FUSED_ROPE", "0")
    r = _runner(path, max_len=96, max_seqs=4)
    assert not any(L.op == "attention_rope" for L in r.plan.step(1, decode=True))
    _, got, got_lg = _greedy_steps(r, prompt, 8)
    assert got == want
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got_lg, want_lg))


def test_the_plan_refuses_attn_short_where_it_cannot_run(tiny_models, monkeypatch):
    path = tiny_models("llama", "Q4_K_M")
    monkeypatch.setenv("MEMRA_ATT_SWITCH", f"{ATT.SHORT_MAX + 2}:ATT_KERNEL=1")
    with pytest.raises(MemraError, match="at most 256 keys"):
        _runner(path)
    monkeypatch.setenv("MEMRA_ATT_SWITCH", SHORT)
    r = _runner(path, cache_type_k="q8_0", cache_type_v="q8_0")   # a q8_0 cache: attention.cu's short module
    assert r.plan.att_switch[0] == 129 and not ATT.is_short(r.plan.att_switch[1])


def test_the_first_module_before_the_switch(tiny_models, monkeypatch):
    """MEMRA_ATT_SWITCH0: attn_short.cu for rows below its keys, the switch's two modules above (three tiers):
    the step kinds and their launches, the bits of the engine without it (float64 emulator) across both
    switches, and a bad value refused by name."""
    path = tiny_models("llama", "Q4_K_M")
    rng = np.random.default_rng(9)
    prompt = [int(x) for x in rng.integers(3, 400, 20)]
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    monkeypatch.setenv("MEMRA_ATT_SWITCH0", "0")
    _, want, want_lg = _greedy_steps(_runner(path, max_len=96, max_seqs=4), prompt, 10)
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "28")
    monkeypatch.setenv("MEMRA_ATT_SWITCH0", "24:SHORT_KB=4")   # rows of 21..31 keys: first, short, long
    r = _runner(path, max_len=96, max_seqs=4)
    p = r.plan
    assert p.att_first == (24, {"ATT_KERNEL": 1, "SHORT_KB": 4})
    assert p.att_kinds == ("first", "short", "long", "both", "short+first", "both+first")
    assert [p.att_kind_of(*lh) for lh in ((0, 22), (10, 26), (25, 26), (10, 40), (30, 40))] == \
        ["first", "short+first", "short", "both+first", "long"]

    def att(kind):
        return [L.name.rsplit(".", 1)[-1] for L in p.step(1, decode=True, att_kind=kind)
                if L.kernel == "attn_decode" and L.layer == 0]

    assert att("first") == ["attention_first"] and att("long") == ["attention_long"]
    assert att("both+first") == ["attention", "attention_long", "attention_first"]
    assert att(None) == att("both+first")
    _, got, got_lg = _greedy_steps(r, prompt, 10)
    assert got == want
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got_lg, want_lg))
    assert {k[3] for k in r._graphs if isinstance(k[0], int)} == {"first", "short", "long"}
    # two sequences on either side of both switches in one step: each as alone
    both = _straddle(r, prompt, 10)[0]   # b: 30 tokens cached, a: 8
    assert r.dec_kind == "both+first"
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    monkeypatch.setenv("MEMRA_ATT_SWITCH0", "0")
    alone = _straddle(_runner(path, max_len=96, max_seqs=4), prompt, 10)[0]
    assert all(np.array_equal(x.logits.view(np.uint32), y.logits.view(np.uint32)) for x, y in zip(both, alone))
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "20")
    monkeypatch.setenv("MEMRA_ATT_SWITCH0", "24")
    with pytest.raises(MemraError, match="switch0 must be <= switch"):
        _runner(path)
    monkeypatch.setenv("MEMRA_ATT_SWITCH0", "x")
    with pytest.raises(MemraError, match="MEMRA_ATT_SWITCH0"):
        _runner(path)
