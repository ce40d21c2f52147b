"""The KV cache's types (llama.cpp's --cache-type-k / --cache-type-v spelling), shared by the
CPU reference, the CPU engine and the GPU pools: f16, or q8_0 (per 32 values of a head row one
f16 scale and 32 int8 codes: 34 bytes, ggml's block_q8_0)."""

from __future__ import annotations

from memra.errors import MemraError

CACHE_TYPES = ("f16", "q8_0")
_BYTES_PER_32 = {"f16": 64, "q8_0": 34}


def check_cache_type(value, flag: str = "--cache-type-k") -> str:
    """A KV cache type as given (f16 or q8_0), or a MemraError naming the flag."""
    if value not in CACHE_TYPES:
        raise MemraError(f"{flag} must be one of {', '.join(CACHE_TYPES)}, got {value!r}")
    return value


def row_bytes(n_values: int, cache_type: str = "f16") -> int:
    """Bytes of n_values cached as cache_type (a multiple of 32 for q8_0)."""
    check_cache_type(cache_type)
    return 2 * n_values if cache_type == "f16" else n_values // 32 * _BYTES_PER_32[cache_type]
