"""Where memra keeps things: the one module that computes paths.

    $MEMRA_HOME (default ~/.cache/memra)
        models/        aliased models fetched by `memra pull` (memra.model.aliases)
        cubin/         NVRTC's compiled kernels, keyed by source, options, arch, NVRTC version
        synth/         synthetic GGUFs made for `memra bench` (memra.tune.bench)
        device.json    measured copy bandwidth per device and driver (memra.gpu.cuda)
        receipts/      what this machine measured: `memra bench` (bench-*.jsonl) and
                       `memra tune` (tune/*.jsonl) write here unless given --out
        tables/        tables `memra tune freeze` makes unless given --out-dir; the engine
                       looks here before the shipped tune/defaults/
        plots/         `memra research plot`'s PNGs unless given --out

    the checkout memra runs from (else the current folder): read, never written by default
        kernels/            *.cu / *.cuh (memra/kernels/ inside an installed wheel)
        tune/defaults/      frozen per-device tables (memra.defaults inside a wheel)
        tune/campaigns/     campaign specs
        research/           the committed receipts (research/README.md is their index)

A command writes into the source tree only where it is given a path there (--out,
--out-dir): a fresh clone stays clean whatever is run in it. Every function reads the
environment when called (tests point MEMRA_HOME elsewhere).
Lowest floor: imports nothing from memra but memra.errors.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from memra.errors import MemraError

PACKAGE = Path(__file__).resolve().parent  # memra/
CHECKOUT = PACKAGE.parent                  # the repository (site-packages in a wheel)


# -- $MEMRA_HOME --------------------------------------------------------------------------------

def memra_home() -> Path:
    """$MEMRA_HOME, else ~/.cache/memra; a MemraError where it (or the nearest part of it that
    exists) is a file, not a folder: every folder memra keeps things in is made inside it."""
    base = os.environ.get("MEMRA_HOME")
    home = Path(base) if base else Path.home() / ".cache" / "memra"
    p = home
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        where = f"MEMRA_HOME={base}" if base else str(home)
        raise MemraError(f"{where}: {p} is not a folder" if p != home else f"{where} is not a folder")
    return home


def models_dir() -> Path:
    return memra_home() / "models"


def cubin_dir() -> Path:
    return memra_home() / "cubin"


def synth_dir() -> Path:
    return memra_home() / "synth"


def device_json() -> Path:
    return memra_home() / "device.json"


def receipts_dir() -> Path:
    """Default folder of the receipts this machine writes (`memra bench`: bench-*.jsonl)."""
    return memra_home() / "receipts"


def tune_out_dir() -> Path:
    """Default folder of `memra tune run`'s receipts."""
    return receipts_dir() / "tune"


def home_tables_dir() -> Path:
    """Default folder of the tables `memra tune freeze` makes (searched before tables_dir())."""
    return memra_home() / "tables"


def plots_dir() -> Path:
    return memra_home() / "plots"


# -- the checkout -------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def kernel_dir() -> Path:
    """The folder holding *.cu / *.cuh, found next to this very package: memra/kernels in an
    installed wheel (package data memra.kernels), else the checkout's top-level kernels/.
    (Resolving `memra.kernels` through the import system could pick another checkout's
    editable install and compile its sources.)"""
    for d in (PACKAGE / "kernels", CHECKOUT / "kernels"):
        if d.is_dir() and any(d.glob("*.cu")):
            return d
    raise MemraError(f"kernel sources not found (looked in {PACKAGE / 'kernels'} and {CHECKOUT / 'kernels'})")


def tables_dir() -> Path:
    """tune/defaults of the checkout memra runs from, else the copy shipped in the wheel."""
    d = CHECKOUT / "tune" / "defaults"
    if d.is_dir():
        return d
    try:
        from importlib.resources import files

        return Path(str(files("memra.defaults")))
    except (ModuleNotFoundError, TypeError):
        return d


def project_root() -> Path:
    """The checkout memra runs from (where research/ and tune/ live), else the current folder."""
    return CHECKOUT if (CHECKOUT / "tune").is_dir() and (CHECKOUT / "research").is_dir() else Path.cwd()


def campaigns_dir() -> Path:
    return project_root() / "tune" / "campaigns"


def tune_receipts_dir() -> Path:
    """research/tune of the checkout: the committed tuning receipts."""
    return project_root() / "research" / "tune"


def freeze_inputs() -> list[Path]:
    """What `memra tune freeze` reads without arguments: the committed tuning receipts and
    this machine's own (tune_out_dir()), those that exist."""
    return [d for d in (tune_receipts_dir(), tune_out_dir()) if d.is_dir()]


def research_dir() -> Path:
    """research/ of the checkout memra runs from (else ./research): the committed receipts
    that `memra research board` builds docs/PERFORMANCE.md from."""
    root = CHECKOUT if (CHECKOUT / "research").is_dir() else Path.cwd()
    return root / "research"


def read_text(path, label: str | None = None, error: type = MemraError) -> str:
    """A text file's contents (UTF-8), or `error` naming it (`label`, else the path): a file that
    cannot be read (missing, a folder, no permission) or is not UTF-8 text is one line saying so."""
    label = str(path) if label is None else label
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise error(f"{label}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise error(f"{label}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
