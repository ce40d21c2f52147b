"""What every `memra` command shares: the typer `app`, the consoles (`out`, `err`), logging
setup, the `command` decorator (a MemraError becomes one line `memra: error: ...` on stderr
and exit code 1; MEMRA_LOG=debug also shows the traceback), `_fail`, and model opening.

The command modules (memra/cli/run.py, bench.py, tune.py) import from here, never from the
package memra.cli, whose __init__ imports them to register their commands. The CLI is the
only layer that prints: data (generated text, JSON, tables) to stdout; logs, progress and
timings to stderr.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.logging import RichHandler

from memra import __version__
from memra.errors import MemraError

# Off a terminal (a pipe, a file, a device run's log) rich would lay tables out in 80
# columns and fold every cell into slivers: there tables keep their natural width instead
# (COLUMNS, when set, still wins).
WIDE = 1000


def _console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Console(stderr=stderr, highlight=False, soft_wrap=True, width=WIDE)
    return c


err = _console(stderr=True)
out = _console()
log = logging.getLogger("memra")

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="memra: kernel-first LLM inference for NVIDIA GPUs (GGUF models).")


# -- logging and errors -----------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a record is written."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


def _log_level() -> int:
    name = os.environ.get("MEMRA_LOG", "warning").strip().lower() or "warning"
    return getattr(logging, name.upper()) if name in LOG_LEVELS else logging.WARNING


def _setup_logging() -> None:
    root = logging.getLogger("memra")
    if not any(getattr(h, "_memra", False) for h in root.handlers):
        if err.is_terminal:
            handler = RichHandler(console=err, show_path=False, show_time=False, markup=False)
        else:  # a log file or a pipe: one plain line per record, never padded or wrapped
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
        handler._memra = True
        root.addHandler(handler)
    root.setLevel(_log_level())
    root.propagate = False
    # a first use of a model alias downloads it: say so even at the default level
    logging.getLogger("memra.models").setLevel(min(_log_level(), logging.INFO))
    name = os.environ.get("MEMRA_LOG", "").strip()
    if name and name.lower() not in LOG_LEVELS:
        log.warning("MEMRA_LOG=%s is not a level (%s): logging at warning", name, ", ".join(LOG_LEVELS))


def _fail(message: str) -> None:
    # one plain line, never wrapped or marked up by rich
    sys.stdout.flush()
    print(f"memra: error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(1)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) if str(e).strip() else type(e).__name__


def command(fn):
    """A CLI command: MemraErrors (and unexpected exceptions) become one line on stderr."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _setup_logging()
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            raise typer.Exit(130) from None
        except MemraError as e:
            if log.isEnabledFor(logging.DEBUG):
                err.print_exception()
            _fail(_one_line(e))
        except BrokenPipeError:  # `memra run ... | head`
            raise typer.Exit(0) from None
        except Exception as e:  # a bug: still one line, the traceback under MEMRA_LOG=debug
            if log.isEnabledFor(logging.DEBUG):
                err.print_exception()
            _fail(f"internal error: {type(e).__name__}: {_one_line(e)} (MEMRA_LOG=debug shows the traceback)")

    return wrapper


def _version(value: bool) -> None:
    if value:
        print(f"memra {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """memra: kernel-first LLM inference for NVIDIA GPUs (GGUF models)."""


# -- model loading ----------------------------------------------------------------------------

ModelArg = Annotated[Optional[str], typer.Argument(
    help="GGUF path or alias (smollm2-135m, gemma3-270m). Default: smollm2-135m.", show_default=False)]


def _open(model: str | None):
    from memra.model.aliases import DEFAULT_MODEL, resolve
    from memra.model.gguf import open_gguf

    name = DEFAULT_MODEL if model is None else model  # '' is refused by resolve, not the default
    # a first use of an alias downloads it: pip's byte-progress bar on a terminal only
    path = resolve(name, progress=err.is_terminal)
    return name, path, open_gguf(path)


# -- the KV cache's types (--cache-type-k / --cache-type-v, llama.cpp's spelling) ---------------

CacheTypeK = Annotated[str, typer.Option("--cache-type-k", "-ctk", envvar="MEMRA_CACHE_TYPE_K", metavar="TYPE",
                                         help="KV cache type of K: f16 or q8_0 (34 bytes per 32 values "
                                              "instead of 64). [env MEMRA_CACHE_TYPE_K]")]
CacheTypeV = Annotated[str, typer.Option("--cache-type-v", "-ctv", envvar="MEMRA_CACHE_TYPE_V", metavar="TYPE",
                                         help="KV cache type of V: f16 or q8_0 (as --cache-type-k). "
                                              "[env MEMRA_CACHE_TYPE_V]")]


def check_cache_types(device: str, cache_type_k: str, cache_type_v: str) -> None:
    """Refuse an unknown cache type (naming its flag) or one the device cannot run, before
    any model is read (memra.gpu.kv.check_cache_device)."""
    from memra.gpu.kv import check_cache_device

    check_cache_device(device, cache_type_k, cache_type_v)


def _gpu_engine_available() -> bool:
    if importlib.util.find_spec("memra.gpu.engine") is None:
        return False
    from memra.gpu import cuda

    return cuda.has_gpu()


def _default_device() -> str:
    return "gpu" if _gpu_engine_available() else "cpu"


def csv_option(values: list[str] | None, flag: str, what: str) -> list[str] | None:
    """A comma list option (comma-separated or repeated): None when not given; given but empty
    ('' — say an unset shell variable) is a MemraError, not the default."""
    if values is None:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    if not out:
        raise MemraError(f"{flag}: no {what} given (got {', '.join(map(repr, values))})")
    return out


def pick_device(device: str | None) -> str:
    """--device as given (cpu or gpu), else the default; '' (say an unset shell variable) is
    refused like any other unknown device, not taken as the default."""
    if device is None:
        return _default_device()
    if device not in ("cpu", "gpu"):
        raise MemraError(f"--device must be cpu or gpu, got {device!r}")
    return device
