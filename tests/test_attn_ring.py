"""ATT_RING's host rule (memra.gpu.ops.attention.module_defines): the ring by default on f16 caches up
to head 128, registers for q8_0 caches, larger heads, MEMRA_ATT_RING=0 and rings too small for the
key-group sums they host; the host's size of those sums against the kernel's own static_assert."""

from __future__ import annotations

import pytest

from memra.errors import MemraError
from memra.gpu.ops import attention as A


def _ring(*a, **k) -> int:
    return A.module_defines(*a, **k)["ATT_RING"]


def test_ring_by_default_on_f16_up_to_head_128(monkeypatch):
    monkeypatch.delenv("MEMRA_ATT_RING", raising=False)
    assert _ring(128, 1) == A.RING and _ring(64, 3) == A.RING and _ring(128, 4) == A.RING
    assert _ring(256, 1) == 0                                  # a 64-key stage would be 64 KiB
    assert _ring(128, 1, kv_q8=(True, False)) == 0 and _ring(64, 1, kv_q8=(False, True)) == 0
    assert _ring(64, 4, {"ATT_WARPS": 8, "ATT_TILE": 32}) == 0  # 16 KiB ring, 32 KiB of key-group sums
    assert _ring(64, 4, {"ATT_WARPS": 4, "ATT_TILE": 32}) == A.RING
    assert _ring(128, 1, {"ATT_RING": 3}) == 3 and _ring(128, 1, {"ATT_RING": 0}) == 0
    d = A.module_defines(128, 1)
    assert A.ring_bytes(d) == 2 * 2 * 64 * 128 * 2


def test_the_rollback_seam(monkeypatch):
    monkeypatch.setenv("MEMRA_ATT_RING", "0")
    assert _ring(128, 1) == 0
    monkeypatch.setenv("MEMRA_ATT_RING", "3")
    assert _ring(64, 1) == 3
    monkeypatch.setenv("MEMRA_ATT_RING", "1")
    with pytest.raises(MemraError, match="MEMRA_ATT_RING"):
        _ring(64, 1)
    with pytest.raises(MemraError, match="ATT_RING must be"):
        A.defines(64, {"ATT_RING": 5})


@pytest.mark.slow
@pytest.mark.parametrize("D,G,W,T", [(64, 4, 8, 32), (64, 4, 4, 32), (32, 8, 8, 32), (128, 8, 8, 32)])
def test_red_bytes_agrees_with_the_kernels_static_assert(D, G, W, T):
    """NVRTC compiles a ring build exactly when red_bytes says the key-group sums fit in it."""
    from memra.gpu.compile import compile_cubin

    d = {"HEAD_DIM": D, "N_GQA": G, "ATT_WARPS": W, "ATT_TILE": T, "KV_BLOCK": 16, "ATT_RING": 2}
    fits = A.ring_bytes(d) >= A.red_bytes(d)
    try:
        compile_cubin("attention.cu", "sm_90a", d)
        compiled = True
    except MemraError as e:
        assert "red must fit in the ring" in str(e), e
        compiled = False
    assert compiled == fits


def test_att_early_default_and_its_seam(monkeypatch):
    """ATT_EARLY (attention.cu v8) is on by default, MEMRA_ATT_EARLY=0 builds v7, a config's own value wins."""
    monkeypatch.delenv("MEMRA_ATT_EARLY", raising=False)
    assert A.module_defines(128, 1)["ATT_EARLY"] == 1
    assert A.module_defines(128, 1, {"ATT_EARLY": 0})["ATT_EARLY"] == 0
    monkeypatch.setenv("MEMRA_ATT_EARLY", "0")
    assert A.module_defines(64, 3)["ATT_EARLY"] == 0
    assert A.module_defines(64, 3, {"ATT_EARLY": 1})["ATT_EARLY"] == 1
    monkeypatch.setenv("MEMRA_ATT_EARLY", "2")
    with pytest.raises(MemraError, match="MEMRA_ATT_EARLY"):
        A.module_defines(64, 1)
