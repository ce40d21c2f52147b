"""Shared fixtures.

`tiny_models(arch, quant="Q4_K_M", seed=0)` -> Path of a small synthetic GGUF of that
architecture (`memra synth --shape tiny`), written once per session into a temporary
folder and reused by every test that asks for the same arguments.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    from memra.model.synth import synth

    folder = tmp_path_factory.mktemp("synth")
    made: dict[tuple, object] = {}

    def get(arch: str, quant: str = "Q4_K_M", seed: int = 0, tokenizer_from: str = "smollm2-135m"):
        key = (arch, quant, seed, tokenizer_from)
        if key not in made:
            tok = Path(str(tokenizer_from)).name.removesuffix(".gguf")
            made[key] = synth(folder / f"tiny-{arch}-{quant}-{seed}-{tok}.gguf", arch, "tiny", quant, seed,
                              tokenizer_from)
        return made[key]

    return get


@pytest.fixture(autouse=True)
def _memra_logging_isolated():
    """The CLI gives the "memra" logger its own handler and stops propagation; tests that
    run the CLI in-process must not hide memra's log records from later tests' caplog."""
    import logging

    log = logging.getLogger("memra")
    saved = (list(log.handlers), log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]
