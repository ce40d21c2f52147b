"""GGUF reading: header, metadata, tensor table, memory-mapped tensor bytes.

memra parses the container itself (rather than through `gguf.GGUFReader`) so that every
defect of a file is reported as one `GGUFError` naming the file, the offset and what was
expected versus found, and so that nothing is allocated from an untrusted length before it
has been checked against the file's size. Type sizes come from `gguf.constants`.
Hyper-parameters per architecture live in `memra.model.config`.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from memra.errors import GGUFError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 16  # nested metadata arrays (llama.cpp reads none)

# metadata value types (GGUF spec)
_SCALARS = {
    0: ("<B", 1, np.uint8), 1: ("<b", 1, np.int8), 2: ("<H", 2, np.uint16), 3: ("<h", 2, np.int16),
    4: ("<I", 4, np.uint32), 5: ("<i", 4, np.int32), 6: ("<f", 4, np.float32), 7: ("<?", 1, np.bool_),
    10: ("<Q", 8, np.uint64), 11: ("<q", 8, np.int64), 12: ("<d", 8, np.float64),
}
_STRING, _ARRAY = 8, 9


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type#{ggml_type}"


def block_info(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # row-major numpy order: (..., rows, cols); cols = GGUF ne[0]
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int
    data: np.ndarray  # uint8 view of the tensor's bytes (memory-mapped, read-only)

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rows(self) -> int:
        return self.n_elements // self.shape[-1]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def row_bytes(self) -> int:
        bs, ts = block_info(self.ggml_type)
        return self.cols // bs * ts


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(self.path, f"truncated: {what} at offset {self.pos} needs {n} bytes, "
                                       f"file has {self.size - self.pos} left")

    def scalar(self, vtype: int, what: str):
        fmt, n, _ = _SCALARS[vtype]
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # token texts may hold arbitrary bytes; keep them losslessly
            return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, key: str, depth: int = 0):
        if vtype in _SCALARS:
            v = self.scalar(vtype, f"value of {key}")
            return bool(v) if vtype == 7 else v
        if vtype == _STRING:
            return self.string(f"value of {key}")
        if vtype == _ARRAY:
            etype = self.u32(f"array type of {key}")
            count = self.u64(f"array length of {key}")
            if etype in _SCALARS:
                _, n, dt = _SCALARS[etype]
                self.need(count * n, f"array {key} ({count} x {np.dtype(dt).name})")
                arr = np.frombuffer(self.buf, dtype=np.dtype(dt).newbyteorder("<"), count=count,
                                    offset=self.pos).copy()
                self.pos += count * n
                return arr
            if etype == _STRING:
                # each string takes at least 8 bytes: reject absurd counts before looping
                self.need(count * 8, f"array {key} ({count} strings)")
                return [self.string(f"{key}[{i}]") for i in range(count)]
            if etype == _ARRAY:
                # bounded nesting: a corrupt file must not exhaust Python's recursion limit
                if depth >= MAX_ARRAY_DEPTH:
                    raise GGUFError(self.path, f"metadata {key!r}: arrays nested deeper than "
                                               f"{MAX_ARRAY_DEPTH} at offset {self.pos - 12}")
                self.need(count * 12, f"array {key} ({count} arrays)")
                return [self.value(_ARRAY, f"{key}[{i}]", depth + 1) for i in range(count)]
            raise GGUFError(self.path, f"metadata {key!r}: unknown array element type {etype} "
                                       f"at offset {self.pos - 12}")
        raise GGUFError(self.path, f"metadata {key!r}: unknown value type {vtype} at offset {self.pos - 4}")


class GGUFFile:
    """An opened GGUF file: `metadata` (key → value), `tensors` (name → TensorInfo)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            # a FIFO would block open() until a writer comes; a device has no size to check
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
                raise GGUFError(self.path, f"cannot open: not a regular file ({_file_kind(st.st_mode)})")
            self._fd = open(self.path, "rb")
        except OSError as e:
            raise GGUFError(self.path, f"cannot open: {e.strerror}") from None
        size = os.fstat(self._fd.fileno()).st_size
        if size < 24:
            self._fd.close()
            raise GGUFError(self.path, f"truncated: {size} bytes is shorter than a GGUF header (24)")
        self._mm = mmap.mmap(self._fd.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = size
        try:
            self._parse()
        except GGUFError:
            self.close()
            raise

    def _parse(self) -> None:
        cur = _Cursor(self.path, self._mm, self.size)
        cur.need(4, "magic")
        magic = bytes(self._mm[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(self.path, f"not a GGUF file: magic {magic!r} (expected b'GGUF')")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            raise GGUFError(self.path, f"unsupported GGUF version {self.version} (memra reads 2 and 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        if n_tensors > self.size // 24 or n_kv > self.size // 12:
            raise GGUFError(self.path, f"corrupt header: {n_tensors} tensors / {n_kv} metadata entries "
                                       f"cannot fit in {self.size} bytes")
        self.metadata: dict[str, object] = {}
        for i in range(n_kv):
            start = cur.pos
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:  # llama.cpp refuses these too: which value would be meant?
                raise GGUFError(self.path, f"metadata key {key!r} appears twice (again at offset {start})")
            vtype = cur.u32(f"value type of {key}")
            self.metadata[key] = cur.value(vtype, key)

        infos = []
        for i in range(n_tensors):
            start = cur.pos
            name = cur.string(f"name of tensor #{i}")
            n_dims = cur.u32(f"dimension count of {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(self.path, f"tensor {name!r} at offset {start}: {n_dims} dimensions "
                                           f"(expected 1..{MAX_DIMS})")
            ne = [cur.u64(f"dimension {d} of {name}") for d in range(n_dims)]
            gtype = cur.u32(f"type of {name}")
            rel = cur.u64(f"data offset of {name}")
            infos.append((name, ne, gtype, rel, start))

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(self.path, f"general.alignment = {align!r} is not a power of two")
        self.alignment = align
        self.data_offset = (cur.pos + align - 1) // align * align

        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, gtype, rel, start in infos:
            try:
                bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
            except (ValueError, KeyError):
                raise GGUFError(self.path, f"tensor {name!r}: unknown tensor type {gtype}") from None
            if any(d <= 0 for d in ne):
                raise GGUFError(self.path, f"tensor {name!r}: bad shape {ne}")
            if ne[0] % bs:
                raise GGUFError(self.path, f"tensor {name!r} ({type_name(gtype)}): row length {ne[0]} "
                                           f"is not a multiple of the block size {bs}")
            n_el = math.prod(ne)  # Python ints: corrupt dimensions must not wrap around
            n_bytes = n_el // bs * ts
            if rel % align:
                raise GGUFError(self.path, f"tensor {name!r}: data offset {rel} is not aligned to {align}")
            off = self.data_offset + rel
            if off + n_bytes > self.size:
                raise GGUFError(self.path, f"truncated: tensor {name!r} ({type_name(gtype)} {ne}) needs bytes "
                                           f"{off}..{off + n_bytes}, file ends at {self.size} "
                                           f"(expected size >= {off + n_bytes}, found {self.size})")
            if name in self.tensors:
                raise GGUFError(self.path, f"tensor {name!r} appears twice")
            data = np.frombuffer(self._mm, dtype=np.uint8, count=n_bytes, offset=off)
            self.tensors[name] = TensorInfo(name, gtype, tuple(int(d) for d in reversed(ne)), off, n_bytes, data)
        # each tensor owns its bytes: data shared by two tensors is a corrupt offset
        spans = sorted(self.tensors.values(), key=lambda t: (t.offset, t.n_bytes))
        for a, b in zip(spans, spans[1:]):
            if b.offset < a.offset + a.n_bytes:
                raise GGUFError(self.path, f"tensor {b.name!r} (bytes {b.offset}..{b.offset + b.n_bytes}) overlaps "
                                           f"tensor {a.name!r} (bytes {a.offset}..{a.offset + a.n_bytes})")

    # -- metadata helpers -------------------------------------------------------------
    @property
    def arch(self) -> str:
        a = self.metadata.get("general.architecture")
        if a is None:
            raise GGUFError(self.path, "metadata general.architecture is missing")
        if not isinstance(a, str):
            raise GGUFError(self.path, f"metadata general.architecture is {type(a).__name__} "
                                       f"{str(a)[:40]!r}, not a string")
        return a

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise GGUFError(self.path, f"metadata {key} is missing")
        return self.metadata[key]

    def tensor(self, name: str) -> TensorInfo:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError(self.path, f"tensor {name!r} is missing")
        return t

    def close(self) -> None:
        # numpy views into the map keep it alive; closing is best-effort
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        self._fd.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    return GGUFFile(path)
