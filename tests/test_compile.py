"""NVRTC compile path and the cubin cache (CPU only: NVRTC needs no GPU), the matvec weight
re-layout and activation quantizer rule, and `kernel-check --compile-only`: every kernel
file and variant of every family compiled for sm_90a, sm_120a and sm_89."""

from __future__ import annotations

import numpy as np
import pytest

import memra.gpu.compile as mc
from memra.errors import CompileError


@pytest.fixture
def kdir(tmp_path, monkeypatch):
    """A private kernel folder and cubin cache."""
    d = tmp_path / "kernels"
    d.mkdir()
    (d / "h.cuh").write_text("#pragma once\n#define SCALE 2.0f\n")
    (d / "k.cu").write_text('#include "h.cuh"\nextern "C" __global__ void k(float* y) '
                            '{ y[threadIdx.x] = SCALE * VALUE; }\n')
    monkeypatch.setattr(mc, "kernel_dir", lambda: d)
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path / "home"))
    return d


def _cached(tmp_path):
    return sorted(p.name for p in (tmp_path / "home" / "cubin").glob("*.cubin"))


@pytest.mark.parametrize("arch", mc.ARCHS)
def test_compiles_to_cubin_for_each_arch(kdir, arch):
    cubin = mc.compile_cubin("k.cu", arch, {"VALUE": 1})
    assert cubin[:4] == b"\x7fELF"


def test_cache_hit_and_key(kdir, tmp_path):
    a = mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 1})
    assert len(_cached(tmp_path)) == 1
    assert mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 1}) == a       # from the cache
    assert len(_cached(tmp_path)) == 1
    mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 2})                   # a define is in the key
    assert len(_cached(tmp_path)) == 2
    (kdir / "h.cuh").write_text("#pragma once\n#define SCALE 3.0f\n")  # so is every header
    mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 1})
    assert len(_cached(tmp_path)) == 3
    mc.compile_cubin("k.cu", "sm_89", {"VALUE": 1})                    # and the arch
    assert len(_cached(tmp_path)) == 4
    assert not list((tmp_path / "home" / "cubin").glob(".tmp-*"))      # no temp files left


def test_cached_entry_is_what_nvrtc_made(kdir, tmp_path):
    a = mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 5})
    b = mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 5}, use_cache=False)
    # NVRTC is deterministic for the same input: a cache entry is the compiler's output
    assert a == b


def test_compile_error_carries_the_log(kdir):
    (kdir / "bad.cu").write_text('extern "C" __global__ void k(float* y) { y[0] = undefined_name; }\n')
    with pytest.raises(CompileError) as e:
        mc.compile_cubin("bad.cu", "sm_90a")
    assert "undefined_name" in e.value.log
    assert "bad.cu" in str(e.value)


def test_compiling_leaves_the_interpreter_intact(kdir):
    # A clean compile has a one-byte log (its NUL). NVRTC once wrote it into CPython's shared
    # one-byte b" " object, after which " ".encode() gave b"\x00" and tokenizers broke.
    mc.compile_cubin("k.cu", "sm_90a", {"VALUE": 7}, use_cache=False)
    assert " ".encode() == bytes([32]) and b" " == bytes([32])


def test_missing_header_is_a_compile_error(kdir):
    (kdir / "inc.cu").write_text('#include "nope.cuh"\n')
    with pytest.raises(CompileError, match="nope.cuh"):
        mc.compile_cubin("inc.cu", "sm_90a")


def test_options_have_no_fast_math():
    opts = mc.options_for("sm_90a", {"A": 1, "B": None})
    assert "--gpu-architecture=sm_90a" in opts and "-std=c++17" in opts
    assert "-DA=1" in opts and "-DB" in opts
    assert not any("fast" in o for o in opts)


def test_kernels_use_no_generic_lambdas():
    """The H200 image's NVRTC (13.0) takes a generic lambda (`[&](auto x)`) in device code for
    a host function and refuses the module, while the NVRTC this CI machine installs (13.5)
    compiles it: a compile-only run here cannot catch it (session 5 lost a device call to
    it). A lambda with typed parameters called with constants inlines the same way."""
    import re

    from memra.paths import kernel_dir

    bad = [f"{p.name}:{n}: {line.strip()}" for p in sorted(kernel_dir().glob("*.cu*"))
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\[[^\]]*\]\s*\(\s*(const\s+)?auto\b", line)]
    assert not bad, "generic lambdas in kernels: " + "; ".join(bad)


def test_has_gpu_is_a_clean_bool():
    from memra.gpu.cuda import has_gpu

    assert has_gpu() in (True, False)


# --- matvec host side --------------------------------------------------------------------

def test_planes_round_trip_every_type():
    from memra.gpu.ops import matvec as M

    rng = np.random.default_rng(0)
    for t in M.TYPES:
        raw = M.random_weight(t, 3, 512, rng)
        bulk, meta = M.pack_planes(raw, t)
        name, blk, bb, bo, bl = M.TYPES[t]
        assert bulk.shape[1] % 16 == 0, name            # 16-byte aligned quant rows
        assert bulk.nbytes + meta.nbytes == raw.nbytes, name
        assert np.array_equal(M.unpack_planes(bulk, meta, t), raw), name


def test_planes_hold_the_quant_bytes():
    # Q4_0 block: d (2 bytes) then 16 bytes of nibbles; the bulk plane is exactly the nibbles
    from memra.gpu.ops import matvec as M

    raw = np.arange(2 * 18, dtype=np.uint8).reshape(1, 36)
    bulk, meta = M.pack_planes(np.concatenate([raw, raw], 1), 2)
    assert list(bulk[0, :16]) == list(range(2, 18)) and list(meta[0, :4]) == [0, 1, 18, 19]


def test_quantize_q8_rule_by_hand():
    from memra.gpu.q8 import quantize_q8_ref

    x = np.zeros(64, np.float32)
    x[:5] = [127.0, -63.5, 0.5, 1.5, -2.5]   # d = 1: halves round to even
    q, s = quantize_q8_ref(x)
    assert list(q[:5]) == [127, -64, 0, 2, -2]
    assert s["d"][0] == 1.0 and s["s"][0] == 127 - 64 + 2 - 2
    assert s["d"][1] == 0.0 and s["s"][1] == 0 and not q[32:].any()   # all-zero block


def test_matvec_reference_agrees_with_gguf_dequant():
    # the check reference (memra.model.quants) against gguf.quants, the independent library
    from gguf.quants import dequantize as gq

    from memra.gpu.ops import matvec as M

    rng = np.random.default_rng(1)
    for t in (2, 12, 14, 23):
        raw = M.random_weight(t, 4, 256, rng)
        assert np.array_equal(M.dequant_rows(raw, t), gq(raw, t).reshape(4, 256))


def test_kernel_check_compile_only_all_green():
    """CI's compile of every kernel and variant (all families) for the three archs."""
    from memra.tune.kernelcheck import all_green, run_kernel_check

    lines = list(run_kernel_check(compile_only=True))
    assert all_green(lines), "\n".join(l for l in lines if not l.startswith("PASS"))
    for arch in mc.ARCHS:
        assert any(f" {arch} " in l for l in lines), arch
