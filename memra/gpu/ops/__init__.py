"""The kernel families: one module per kernels/*.cu file (launcher, references, kernel-check hooks)."""

from memra.errors import MemraError


def launch_bucket(rows: int) -> int:
    """The kernel-check bucket of a launch of `rows` token rows (the launch set checks one case
    per bucket): 1, 2, 4, or 8 for 5 rows and more."""
    for b in (1, 2, 4):
        if rows <= b:
            return b
    return 8


def pdl_trigger_define(config: dict | None, key: str, who: str) -> dict:
    """{key: 0 | 1 | 2} where a table entry's configuration names the kernel's PDL trigger (0: the dependant launches
    when the grid completes, 1: after the kernel's own PDL wait, 2: before it), else {} (the module it always was);
    anything else a MemraError naming `who`."""
    if not config or key not in config:
        return {}
    v = config[key]
    if v not in (0, 1, 2) or isinstance(v, bool):
        raise MemraError(f"{who}: {key} must be 0, 1 or 2, got {v!r}")
    return {key: int(v)}


def tile_shape_problems(N: int, obm: int, K: int, kmul: int, nb: int) -> list[str]:
    """What a tile GEMM's host contract refuses in its shape (gemm_tile, gemm_f16): N a positive
    multiple of the output tile obm (no partial row tile), K of kmul, at least one row."""
    bad = []
    if N <= 0 or N % obm:
        bad.append(f"N = {N} not a positive multiple of {obm}")
    if K <= 0 or K % kmul:
        bad.append(f"K = {K} not a positive multiple of {kmul}")
    if nb < 1:
        bad.append(f"nb = {nb} < 1")
    return bad
