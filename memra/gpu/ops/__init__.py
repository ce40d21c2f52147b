"""The kernel families: one module per kernels/*.cu file (launcher, references, kernel-check hooks)."""


def launch_bucket(rows: int) -> int:
    """The kernel-check bucket of a launch of `rows` token rows (the launch set checks one case
    per bucket): 1, 2, 4, or 8 for 5 rows and more."""
    for b in (1, 2, 4):
        if rows <= b:
            return b
    return 8
