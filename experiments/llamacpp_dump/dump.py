"""ctypes driver for libdump.so (see dump.c): llama.cpp's own intermediate tensors.

    d = Dumper(path)                      # the wheel's llama.cpp, the test peer's settings
    logits = d.eval(ids, want="*", dir=D) # every graph node of this batch written under D
    t = read_dump(D)                      # {name: ndarray (numpy order, ggml's ne reversed)}
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_GGML_NP = {0: np.float32, 1: np.float16, 26: np.int32, 24: np.int8}  # F32, F16, I32, I8


class Dumper:
    def __init__(self, model_path, n_ctx: int = 4096, threads: int = 2, flash: int = -1, swa_full: bool = False):
        lib = ctypes.CDLL(str(HERE / "libdump.so"))
        lib.dump_open.restype = ctypes.c_void_p
        lib.dump_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.dump_n_vocab.argtypes = [ctypes.c_void_p]
        lib.dump_reset.argtypes = [ctypes.c_void_p]
        lib.dump_eval.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int,
                                  ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float)]
        self.lib = lib
        self.h = lib.dump_open(str(model_path).encode(), n_ctx, threads, flash, int(swa_full))
        if not self.h:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.n_vocab = lib.dump_n_vocab(self.h)

    def reset(self) -> None:
        self.lib.dump_reset(self.h)

    def eval(self, ids, all_logits: bool = False, want: str = "", dir=None) -> np.ndarray:
        n = len(ids)
        arr = (ctypes.c_int * n)(*ids)
        out = np.zeros((n if all_logits else 1, self.n_vocab), np.float32)
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        rc = self.lib.dump_eval(self.h, arr, n, int(all_logits), want.encode(), str(dir or ".").encode(),
                                out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return out if all_logits else out[0]


def read_tensor(path) -> np.ndarray:
    raw = Path(path).read_bytes()
    h = np.frombuffer(raw[:80], np.int64)
    typ, ne, nb = int(h[0]), [int(v) for v in h[2:6]], [int(v) for v in h[6:10]]
    dt = np.dtype(_GGML_NP[typ])
    buf = np.frombuffer(raw[80:], np.uint8)
    a = np.lib.stride_tricks.as_strided(buf.view(dt) if buf.size % dt.itemsize == 0 else buf[: buf.size - buf.size % dt.itemsize].view(dt),
                                        shape=ne[::-1], strides=nb[::-1])
    return np.array(a)


def read_dump(dir) -> dict:
    """{name: array} in graph order (a name seen twice keeps its first; '#k' suffix for later)."""
    out = {}
    for p in sorted(Path(dir).glob("*.bin")):
        name = p.stem.split("_", 1)[1]
        key = name
        k = 1
        while key in out:
            key = f"{name}#{k}"
            k += 1
        try:
            out[key] = read_tensor(p)
        except KeyError:
            pass  # a type this reader does not decode
    return out
