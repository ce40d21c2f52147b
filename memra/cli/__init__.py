"""The `memra` command line (`memra = "memra.cli:app"`, `python -m memra`).

memra/cli/common.py holds the typer app and what every command shares; each command group
is one module that registers its commands on that app: run.py (run, tokenize, info, pull,
synth), tune.py (tune …, research …), bench.py (bench, kernel-check), serve.py (serve, and
bench serve beside bench's cells), spec.py (spec-check). Importing them here,
in this order, registers them in the order `memra --help` lists them.
"""

from memra.cli.common import app
from memra.cli import run, tune, bench, serve, spec  # noqa: E402,F401  (registers the commands; serve after bench)

__all__ = ["app"]
