"""The q8_0 KV cache on the GPU runner, emulated (tests/gpu_emulator.py: its rope and attention
contracts read and write kernels/kv.cuh's q8_0 planes by llama.cpp's rule): the pools hold
int8 codes and f16 scales, a sequence's greedy tokens are the CPU reference's with the same
cache types (the engine's q8 numerics: every K/V value replaced by its q8_0 round trip, which
is the kernels' rule too), a row's logits do not depend on its batch, a shared block is copied
with its scales, attn_fa is turned off, and the launch set holds the q8_0 modules. The kernels
themselves are checked on the device (memra kernel-check: the rope / attention families' q8_0
checks and the scale-plane canary)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpu_emulator import ModuleLog
from memra.errors import MemraError
from memra.gpu.kv import bytes_per_block, check_cache_device
from memra.gpu.runner import Row, Runner
from memra.model.gguf import open_gguf
from memra.tune.invariance import batch_invariance
from test_runner_emulated import PROMPT, _reference_greedy, _runner  # the emulated runner, PROMPT and its reference continuation

def test_gpu_accepts_q8_0():
    check_cache_device("gpu", "q8_0", "q8_0")
    check_cache_device("gpu", "f16", "q8_0")


def test_pools_hold_codes_and_scales(tiny_models):
    r = Runner(tiny_models("llama", "Q4_K_M"), gpu=ModuleLog(1 << 28), max_len=96, max_seqs=4, cache_type_k="q8_0",
               cache_type_v="f16", kv_tokens=64)
    c, kv = r.cfg, r.kv
    assert kv.k[0].dtype == np.int8 and kv.k[0].shape == (4, 16, c.kv_dim)
    assert kv.k_scale[0].dtype == np.uint16 and kv.k_scale[0].shape == (4, 16, c.kv_dim // 32)
    assert kv.v[0].dtype == np.uint16 and kv.v_scale is None
    real = sum(a.nbytes for a in (*kv.k, *kv.v, *kv.k_scale))
    assert real == kv.nbytes == 4 * bytes_per_block(c, 16, "q8_0", "f16")
    # the modules are built for the cache: KV_K_Q8 only
    s = r.open()
    r.step([Row(s, PROMPT, logits="last")])
    mods = [dict(d) for (f, d) in r.g.loaded if f in ("rope.cu", "attention.cu")]
    assert mods and all(d.get("KV_K_Q8") == "1" and "KV_V_Q8" not in d for d in mods)


@pytest.mark.parametrize("arch, ctk, ctv", [("llama", "q8_0", "q8_0"), ("gemma3", "q8_0", "q8_0"),
                                            ("qwen3", "q8_0", "f16"), ("llama", "f16", "q8_0")])
def test_q8_0_batch_invariance_and_reference_tokens(tiny_models, arch, ctk, ctv):
    """A sequence's logits alone = among 9 co-runners (other positions, samplers, rows), and
    its greedy tokens are the CPU reference's with the same cache types."""
    path = tiny_models(arch, "Q4_K_M" if arch != "qwen3" else "Q4_0")
    r = _runner(path, cache_type_k=ctk, cache_type_v=ctv)
    res = batch_invariance(r, PROMPT, n_steps=6, co=9)
    assert res["identical"], res
    assert res["tokens_alone"] == _reference_greedy(path, 6, ctk, ctv)


def test_q8_0_changes_the_logits(tiny_models):
    """The cache type reaches the kernels: the q8_0 engine's logits are not the f16 one's."""
    path = tiny_models("llama", "Q4_K_M")
    out = []
    for t in ("f16", "q8_0"):
        r = _runner(path, cache_type_k=t, cache_type_v=t)
        out.append(r.step([Row(r.open(), PROMPT, logits="last")])[0].logits)
    assert not np.array_equal(out[0], out[1])
    assert np.max(np.abs(out[0] - out[1])) < 0.1 * np.max(np.abs(out[0]))


def test_shared_block_is_copied_with_its_scales(tiny_models):
    """Copy-on-write of a shared q8_0 block carries codes and scales: a sequence continuing
    from a forked prefix gets the logits of one that computed it."""
    r = _runner(tiny_models("llama", "Q4_K_M"), max_seqs=4, kv_tokens=6 * 16, cache_type_k="q8_0",
                cache_type_v="q8_0")
    kv = r.kv
    toks = PROMPT + PROMPT + PROMPT[:4]
    a = r.open()
    r.step([Row(a, toks)])
    b = r.open()
    kv.fork(a.slot, b.slot, 24)
    b.n = 16
    la = r.step([Row(a, [7], logits="last")])[0].logits
    r.rewind(a, 24)
    r.step([Row(b, toks[16:])])
    lb = r.step([Row(b, [7], logits="last")])[0].logits
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    shared = int(kv.table[a.slot, 0])
    r.rewind(b, 8)
    r.step([Row(b, [9, 9, 9])])  # writes inside the shared block: copied first
    assert int(kv.table[b.slot, 0]) != shared
    nb = int(kv.table[b.slot, 0])
    for pools in (kv.k, kv.k_scale, kv.v_scale):
        h = pools[0].numpy()
        assert np.array_equal(h[nb, :8], h[shared, :8])  # the copied rows before b's writes
    la2 = r.step([Row(a, [7], logits="last")])[0].logits
    assert np.array_equal(la.view(np.uint32), la2.view(np.uint32))


def test_attn_fa_is_off_with_q8_0(tiny_models, caplog):
    r = _runner(tiny_models("llama", "Q4_K_M"), attn="fa", cache_type_k="q8_0", cache_type_v="q8_0")
    assert not r.plan.use_fa
    assert "attn_fa reads an f16 KV cache only" in caplog.text


def test_head_size_not_a_multiple_of_32_is_refused_on_the_gpu(tiny_models):
    from memra.gpu.plan import ModelSpec, Planner

    spec = ModelSpec.from_gguf(open_gguf(tiny_models("llama", "Q4_K_M")))
    spec = replace(spec, cfg=replace(spec.cfg, head_dim=40, head_dim_v=40))
    with pytest.raises(MemraError, match="q8_0 KV cache needs a head size that is a multiple of 32"):
        Planner(spec, cache_type_k="q8_0")


def test_launch_set_holds_the_q8_0_modules():
    import memra.tune.launches as LS

    specs, missing = LS.model_specs(("synth:tiny-llama:Q4_K_M", "synth:tiny-qwen2:Q8_0"))
    assert not missing
    cases = LS.launch_set(specs)
    q8 = {(c["entry"], c["defines"].get("KV_K_Q8"), c["defines"].get("KV_V_Q8")) for c in cases.values()
          if "KV_K_Q8" in c["defines"]}
    assert {e for e, _, _ in q8} == {"attn_decode", "attn_decode_rope", "rope_norm_kv"}
    assert all(k == 1 and v == 1 for _, k, v in q8)
    # and the f16 modules keep their defines (no KV_* beyond KV_BLOCK)
    f16 = [c for c in cases.values() if c["family"] in ("rope", "attention") and "KV_K_Q8" not in c["defines"]]
    assert f16 and all(set(c["defines"]) & {"KV_K_Q8", "KV_V_Q8"} == set() for c in f16)
