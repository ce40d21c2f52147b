"""Registers per kernel of a cubin, from its ELF (.nv.info EIATTR_REGCOUNT records, names from .symtab): what
ptxas allocated, without a GPU. kernel_regs(cubin_bytes) -> {kernel name: registers}."""
from __future__ import annotations

import struct

EIATTR_REGCOUNT = 0x2F
# .nv.info record: u8 format, u8 attribute, then by format: 0x01 nothing, 0x02 / 0x03 a 2-byte value,
# 0x04 a u16 size and that many bytes
_FIXED = {0x01: 2, 0x02: 4, 0x03: 4}


def _sections(elf: bytes) -> dict[str, tuple[int, int]]:
    """name -> (offset, size) of each ELF64 section."""
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    return {_cstr(elf, names_at + h[0]): (h[4], h[5]) for h in heads}


def _cstr(buf: bytes, at: int) -> str:
    return buf[at:buf.index(b"\0", at)].decode()


def kernel_regs(elf: bytes) -> dict[str, int]:
    secs = _sections(elf)
    symtab, _ = secs[".symtab"]
    strtab, _ = secs[".strtab"]
    out = {}
    for name, (off, size) in secs.items():
        if not name.startswith(".nv.info"):
            continue
        p = off
        while p < off + size:
            fmt, attr, n = struct.unpack_from("<BBH", elf, p)
            if fmt == 0x04 and attr == EIATTR_REGCOUNT:
                sym, regs = struct.unpack_from("<II", elf, p + 4)
                st_name = struct.unpack_from("<I", elf, symtab + 24 * sym)[0]
                out[_cstr(elf, strtab + st_name)] = regs
            p += _FIXED.get(fmt, 4 + n)
    return out
