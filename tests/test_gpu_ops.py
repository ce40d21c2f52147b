"""kernel-check of the decode kernel families on the GPU: every kernel and variant against
its numpy reference on fresh random inputs, outputs poisoned, and each family's canary (a
deliberately wrong variant) caught."""

from __future__ import annotations

import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("family", ["embed", "norm", "rope", "attention", "act", "sample", "mask"])
def test_kernel_check_family(family):
    from memra.tune.kernelcheck import all_green, run_kernel_check

    lines = list(run_kernel_check(only=family))
    assert all_green(lines), "\n".join(l for l in lines if not l.startswith("PASS"))
    assert any(" canary " in l and "caught" in l for l in lines), "the family's canary did not run"
