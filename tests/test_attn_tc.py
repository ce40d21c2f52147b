"""ATT_TC's host rule (memra.gpu.ops.attention.module_defines / tc_supported): the tensor-core split body
(kernels/attn_tc.cuh, attention.cu v11) by default where it can run — the ring with f16 K/V, head 64 or 128,
up to 8 heads a block, a 16-key slice a warp or a warp pair — v10's body elsewhere and with MEMRA_ATT_TC=0;
the host's rule against the kernel's own static_asserts (NVRTC, no GPU)."""

from __future__ import annotations

import pytest

from memra.errors import MemraError
from memra.gpu.ops import attention as A


def _tc(*a, **k) -> int:
    return A.module_defines(*a, **k)["ATT_TC"]


def test_tensor_cores_by_default_where_they_can_run(monkeypatch):
    monkeypatch.delenv("MEMRA_ATT_TC", raising=False)
    monkeypatch.delenv("MEMRA_ATT_RING", raising=False)
    assert _tc(128, 1) == 1 and _tc(128, 4) == 1 and _tc(64, 3) == 1             # 8 / 4 warps, 64-key tiles
    assert _tc(64, 4, {"ATT_WARPS": 8, "ATT_TILE": 128}) == 1                      # a warp a slice at 8 warps
    assert _tc(256, 1) == 0                                                        # no ring above head 128
    assert _tc(128, 1, kv_q8=(True, False)) == 0 and _tc(64, 1, kv_q8=(False, True)) == 0
    assert _tc(128, 1, {"ATT_TILE": 32}) == 0                                      # 8 warps, 32 keys: no slice a warp
    assert _tc(128, 1, {"ATT_RING": 0}) == 0
    with pytest.raises(MemraError, match="ATT_TC 1 needs"):
        A.module_defines(128, 1, {"ATT_TC": 1, "ATT_TILE": 32})
    assert _tc(128, 1, {"ATT_TC": 0}) == 0


def test_the_rollback_seam(monkeypatch):
    monkeypatch.setenv("MEMRA_ATT_TC", "0")
    assert _tc(128, 1) == 0
    monkeypatch.setenv("MEMRA_ATT_TC", "2")
    with pytest.raises(MemraError, match="MEMRA_ATT_TC"):
        _tc(128, 1)


@pytest.mark.parametrize("D, G, cfg, ok", [
    (128, 4, {"ATT_WARPS": 8, "ATT_TILE": 64}, True),     # the 8B's engine: a warp pair a slice
    (64, 3, {"ATT_WARPS": 4, "ATT_TILE": 64}, True),      # a warp a slice
    (128, 1, {"ATT_WARPS": 8, "ATT_TILE": 32}, False),    # four warps a slice: refused
])
def test_host_rule_agrees_with_the_kernel(D, G, cfg, ok):
    from memra.gpu.compile import CompileError, compile_cubin

    d = A.module_defines(D, G, cfg)
    assert A.tc_supported(d) is ok
    d["ATT_TC"] = 1
    if ok:
        assert compile_cubin(A.KERNEL_FILE, "sm_90a", d, use_cache=False)
    else:
        with pytest.raises(CompileError, match="ATT_TC"):
            compile_cubin(A.KERNEL_FILE, "sm_90a", d, use_cache=False)
