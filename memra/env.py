"""Reading memra's MEMRA_* environment settings (docs/FLAGS.md): a value out of range is refused
with the setting's name, never silently replaced."""

from __future__ import annotations

import os

from memra.errors import MemraError


def env_int(name: str, default: int, ok, what: str) -> int:
    """The integer environment variable `name` (unset or empty: `default`), refused unless ok(n)."""
    env = os.environ.get(name, "").strip()
    if not env:
        return default
    try:
        n = int(env)
    except ValueError:
        n = None
    if n is None or not ok(n):
        raise MemraError(f"{name} must be {what}, got {env!r}")
    return n


def env_choice(name: str, default: str, choices) -> str:
    """The environment variable `name` (unset or empty: `default`), refused unless one of `choices`."""
    env = os.environ.get(name, "").strip()
    if not env:
        return default
    if env not in choices:
        raise MemraError(f"{name} must be {' or '.join(choices)}, got {env!r}")
    return env
