#!/usr/bin/env python3
"""gemm_check: kernels/gemm.cu (gemm_q8, gemm_q8_glu) must give mv_q8's bits, and how fast.

Standalone on purpose: imports no memra module (numpy and cuda.core / cuda.bindings only);
the planes layout, random weights and the matvec launch rule are replicated here from
memra's matvec launcher (pack_planes, random_weight, default_config, the chunks of <= 8 rows).

    python3 experiments/gemm_check.py                 # device: compile, checks, timing
    python3 experiments/gemm_check.py --compile-only  # CPU: every module through NVRTC
    python3 experiments/gemm_check.py --selftest      # CPU: numpy model of gemm.cu's index maps
    options: --types Q4_K,Q6_K  --no-timing  --no-checks  --no-legacy  --reps 25  --jobs N
             --configs 'WM,WN,TM,TN,WK,STAGES[,LREG[,MINB]];...'  --shapes Q4_K,Q6_K  --nbs 16,64
             --decode (nb = 1: today's mv_q8 against the pre-split one, time and bits)

Device run (H200, cuda.core 1.2): compiles every module first (in parallel; a compile error
prints the NVRTC log and exits 2), then for every type and nb in NBS: random valid weights in
planes, activations quantized on the device by q8.cu's quantize_q8, y poisoned with 0xFF
bytes, mv_q8 launched in chunks of <= 8 rows exactly as the engine's launcher does (bucket
MV_B, default config per chunk) and gemm_q8 once; the uint32 views of y must be equal. Also
_glu (act 1 and 2), the residual aliased to y, a second tile configuration, the pre-split
matvec.cu (embedded below) against today's (decode bits unchanged), and the gemm canary
(MEMRA_CANARY=1 must be caught). One line per case, then "N passed, M failed"; exit 1 on a
failure. Then timing on the llama3-8b shapes (CUDA graphs, events, median of --reps): us,
int8 TOPS (2 N K nb / t) and weight GB/s for gemm_q8 and the chunked mv_q8, each with its
own bit check, for each of TIME_CFGS (large / mid / small batch tiles), then the best one per
shape and nb. With $OUT set, JSON lines go to $OUT/gemm-check.jsonl. About 1 minute on an H200
(81 modules compile in ~13 s on its 16 cores); --compile-only takes ~2 minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels"
ARCH = "sm_90a"

# ggml type id -> (name, elements per block, bytes per block, bulk offset, bulk bytes)
TYPES = {
    2: ("Q4_0", 32, 18, 2, 16),
    3: ("Q4_1", 32, 20, 4, 16),
    6: ("Q5_0", 32, 22, 6, 16),
    7: ("Q5_1", 32, 24, 8, 16),
    8: ("Q8_0", 32, 34, 2, 32),
    12: ("Q4_K", 256, 144, 16, 128),
    13: ("Q5_K", 256, 176, 16, 160),
    14: ("Q6_K", 256, 210, 0, 192),
    23: ("IQ4_XS", 256, 136, 8, 128),
}
NAME2T = {v[0]: k for k, v in TYPES.items()}
F16_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2),
              14: (208,), 23: (0,)}
BUCKETS = (1, 4, 8)
Q8_WARPS = 8
Q8_SCALE = np.dtype([("d", "<f4"), ("s", "<i4")])
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)

NBS = (1, 5, 8, 9, 16, 33, 64, 128, 512)
CHECK_SHAPES = ((200, 2560), (72, 768))    # nu = 40 (uneven slots), nu = 12 (empty slots)
SHAPE_B_NBS = (1, 9, 64)
LEGACY_NBS = (1, 9)     # the pre-split matvec.cu is compared at these nb (B = 1 and B = 8 chunks)
GEMM_DEFAULT = {"GM_WM": 2, "GM_WN": 4, "GM_TM": 2, "GM_TN": 2, "GM_WK": 1, "GM_STAGES": 3, "GM_LREG": 1,
                "GM_MINB": 2}   # gemm.cu's built-in values, spelled out
GEMM_ALT = {"GM_WM": 1, "GM_WN": 2, "GM_TM": 4, "GM_TN": 1, "GM_WK": 4, "GM_STAGES": 3, "GM_LREG": 5,
            "GM_MINB": 1}
# GEMM_DEFS="K=V,K=V" (environment): extra gemm.cu defines for the checks' two configurations and the
# canary (e.g. GEMM_DEFS=GM_STATIC=1, experiments/gemm_v9); timing configurations take theirs after
# a colon: --configs "2,2,2,4,1,3,1,1;2,2,2,4,1,3,1,1:GM_STATIC=1"
GEMM_EXTRA = dict(kv.split("=", 1) for kv in os.environ.get("GEMM_DEFS", "").replace(" ", "").split(",") if kv)
GEMM_DEFAULT = {**GEMM_DEFAULT, **GEMM_EXTRA}
GEMM_ALT = {**GEMM_ALT, **GEMM_EXTRA}
# timed by default: the built-in one (large batches), and the mid / small batch shapes
TIME_CFGS = ("2,4,2,2,1,3,1,2", "2,2,2,2,2,3,1,2", "1,1,2,2,8,3,1,2")
ALT_TYPES = tuple(TYPES)
TIME_SHAPES = (   # name, type, rows of y (N), K, glu
    ("Q4_K qkv 6144x4096", 12, 6144, 4096, False),
    ("Q4_K 4096x4096", 12, 4096, 4096, False),
    ("Q4_K glu 2x14336x4096", 12, 14336, 4096, True),
    ("Q6_K 4096x14336", 14, 4096, 14336, False),
    ("Q6_K head 128256x4096", 14, 128256, 4096, False),
    ("Q4_0 4096x4096", 2, 4096, 4096, False),
    ("Q8_0 4096x4096", 8, 4096, 4096, False),
)
TIME_NBS = (8, 16, 32, 64, 128, 512)
# GEMM_TIME_SHAPES="NAME:TYPE:N:K:GLU;..." (environment) replaces the timing shapes (session 27: the glu
# at 64 rows over output-row counts that fill 0.5 / 1 / 1.7 / 2 waves of the table's tile)
if os.environ.get("GEMM_TIME_SHAPES"):
    TIME_SHAPES = tuple((f[0], int(f[1]), int(f[2]), int(f[3]), f[4] == "1")
                        for f in (x.split(":") for x in os.environ["GEMM_TIME_SHAPES"].split(";") if x))

# per type: (WBS, SSB, MWS), as gemm.cu's header states (stage bytes)
GEMM_SMEM = {2: (48, 16, 4), 3: (48, 16, 8), 6: (48, 16, 12), 7: (48, 16, 16), 8: (80, 16, 4),
             12: (48, 16, 16), 13: (80, 16, 16), 14: (48, 32, 20), 23: (48, 16, 8)}


# ---------------------------------------------------------------------------------------
# layout, weights, launch rules (replicated from memra's matvec launcher)

def pack_planes(data: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, row_bytes) GGUF rows -> (bulk (rows, nblk*BULK), meta (rows, nblk*META))."""
    name, blk, bb, bo, bl = TYPES[t]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    rows, nblk = data.shape[0], data.shape[1] // bb
    blocks = data.reshape(rows, nblk, bb)
    bulk = np.ascontiguousarray(blocks[:, :, bo:bo + bl]).reshape(rows, nblk * bl)
    meta = np.concatenate([blocks[:, :, :bo], blocks[:, :, bo + bl:]], axis=2)
    return bulk, np.ascontiguousarray(meta).reshape(rows, -1)


def random_weight(t: int, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid GGUF rows (rows, row_bytes): random quant bytes, finite f16 scales."""
    name, blk, bb, _, _ = TYPES[t]
    nblk = K // blk
    raw = rng.integers(0, 256, (rows, nblk, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        v = rng.uniform(0.5, 1.5, (rows, nblk)).astype(np.float32)
        v *= rng.choice(np.array([-1, 1], np.float32), (rows, nblk))
        raw[:, :, off:off + 2] = (v * np.float32(2.0 ** -6)).astype(np.float16).view(np.uint8).reshape(rows, nblk, 2)
    return raw.reshape(rows, nblk * bb)


def bucket(nb: int) -> int:
    for b in BUCKETS:
        if nb <= b:
            return b
    return BUCKETS[-1]


def default_config(t: int, K: int, nb: int, glu: bool) -> dict:
    """memra's built-in matvec config for the q8 path (MV_KSPLIT stays 1)."""
    if bucket(nb) > 1:
        return {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 1}
    if K > 1024 and (glu or t == 8):
        return {"MV_NWARPS": 4, "MV_ROWS": 1, "MV_KSPLIT": 1, "MV_UNROLL": 1}
    return {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 2}


def mv_chunks(t: int, K: int, nb: int, glu: bool):
    """(b0, n, defines) of every launch memra's matvec makes for nb rows on the q8 path."""
    out = []
    for b0 in range(0, nb, BUCKETS[-1]):
        n = min(BUCKETS[-1], nb - b0)
        out.append((b0, n, {"MV_TYPE": t, "MV_B": bucket(n), **default_config(t, K, n, glu)}))
    return out


def gemm_tiles(cfg: dict) -> tuple[int, int]:
    return cfg["GM_WM"] * cfg["GM_TM"] * 16, cfg["GM_WN"] * cfg["GM_TN"] * 8


def gemm_launch(t: int, cfg: dict, N: int, nb: int, glu: bool):
    """(grid, block, dynamic shared bytes) of a gemm_q8[_glu] launch (gemm.cu's contract)."""
    BM, BN = gemm_tiles(cfg)
    wk = cfg.get("GM_WK", 1)
    obm = BM // 2 if glu else BM
    wbs, ssb, mws = GEMM_SMEM[t]
    stage = (BM * wbs + BN * 80 + BN * ssb + BM * mws + 15) // 16 * 16
    nthr = 32 * cfg["GM_WM"] * cfg["GM_WN"] * wk
    lv = 5 - (wk.bit_length() - 1)
    lsm = max(0, lv - cfg.get("GM_LREG", 5)) * (cfg["GM_TM"] * cfg["GM_TN"] * 4) * nthr * 4
    smem = max(cfg["GM_STAGES"] * wk * stage + lsm, (wk * BM * BN * 4) if wk > 1 else 0)
    return ((N + obm - 1) // obm, (nb + BN - 1) // BN, 1), (nthr, 1, 1), smem


def quantize_q8_ref(x: np.ndarray):
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, np.float32(0), np.rint(blocks / d))
    q = q.astype(np.int8)
    s = np.empty(d.shape[:-1], Q8_SCALE)
    s["d"] = d[..., 0]
    s["s"] = q.astype(np.int32).sum(-1)
    return q.reshape(x.shape), s


# ---------------------------------------------------------------------------------------
# modules

# kernels/matvec.cu before the qtypes.cuh split (commit 99d41a2, sha256 4d566632d3a225cb...):
# the check compares its bits with today's mv_q8 (the split's roundings are pinned to it).
LEGACY_MATVEC = """
eNrtPWtz20aS3/UrZpWyD5AgiiApmiYt70mxlU1ZcRI/1rul0rFAEiRhgSCFB0k58dX9iPuF90uuHzPAAAQpSrazSdayS8Jj
pqenp6df05g5PBQTJ567/Uo/Ef/3P/8rBm5/OnDxYegtD+BFPA3FLJwOkn4ciWkgrhMniL0P7kB8993bM7FwvdE4jio7h4fw
X3w7ncyS2I3EzUXPEsGlOBZRMuleiXcXgSWuLsWeWOIbuBoCYEdEE8f3Rc+J+2PRE09EAL+OxQ9/754Kg3ExLfFOeAFCnwYu
txrfzFxhQKk3//zpuUXPJ4Ci74qZG9JbqOU6AJPxE72b2BWh6wygbJ9L+U4S9McK8XdczndupkksjN2Z7wRutGsBilj3wF06
/RggHMgSEweo5ECFKcDs3YiJOwmdw+ksOpT0nN2YbQTszt3whrHu+dP+lfAiEc18L4Y+xVPhAVV7iX9FrUTCIPJGbXEdHV6P
D699RGCS+LE3g85Nh8JuckkTYTvBgABM3NhRAAaWmFgi6ju+C2DiMXY7ii1oTbY/DQduaFbEG3hFLVNXxXjqDyIEGk4XkVhy
Ybw4fXv+goFbBI4a4zrFoj88f3PCRSviFEFTASd0Ea7dPKBRcHxvFLiAZjQleNxjEcUwPBNEc+HF47Q00jflrhOBzf5HJJIA
6AfUWExDImizIfrTIHL7SezN3QMvOIiAb52Rq/gTC08ZY2jYdQPhRKIhRuE0mVGvmbSu705cxMagN2IEaDkh3MNIy3fiTbs9
mg6HRmKJEbB4YmJdovN0AWQ9R77BR45YOOFMxM4VdR9Rjgh/i37v12uWqFQqWm0jMumS6k0XQdTJbmEWiRH0LVKFFU3eLKZi
6Ew838MBipxJ2mdiPzGZd69be0II4F9v7sQe0EmbxMiCQdyiGVGvAf+1QBIc0u9xWwxg/joTZ3lo1x5ZBC79uYZXIVQ1locD
mGwRz3RxbTJXBrE7ApCDaZxJD2MwazhAolfu0A1dmIdtMYTxjZuNPOiBS/gZ70zxn1Bp7xrgT1BCeMEIEaZKQIMkGMCTiurm
sF7by3cTmGmIZFZMIAFTx+Fd6I68KHZDoBsUE2c/nEQ6cnmkJKZ55JYVcUbIqBaMM7t5eIq/zuo1UyQRTNrAv4FBAy6lYboh
fJ8HMUiF2dRDZkPas/hq83BZ/Kc78hNL9kz9xWcdSQGUc5EYO3NXBFM50DRK2vBmRRSFCB+oTTL2WNjCgBsWwMhaSAlGFCfW
yfnbgx4SWpNlOhWleB267iASp0RCZtrrlgYFH3ALMycem0SBvzuhx6KOhb1UAUn/ygVpZR82DlsmiwJHhElwEHvA2Zl26Aik
RBtUAwkuUXtJwgYhX4yc2O2IZHZJrJhpImANA991A1ERSxN0kZHM5I2Fb4EYx+K1d/7WEjW4+u459D52AlISKEaFESS+7/R8
12yLG5wA8GwfcFgKAy69QeL4whkMOvRi4tygsANBc8NdPqUuesGcuo7s7yDSIM9CF2cI8CxLZyDxzA0GEY8VPH1BPYF+v3j9
0/n3b4RB4pdECg340FvCYPSSGLh56N9YQpabgfDyHD/CqTlhpmfxDxTBwUTYAZCHhgD0Mfx99eO716lsSQLsLPT74JlJA4X6
FoTjaOKzDvZAjofADx70wJRwDJuvXr47efXTaxJfzOOsf4yGSTjLtlhH4GuSc6qy7ABXjsZAMZj7UoJDoY4YeHNvAKilDaVQ
37589eP5OVAnnIJpIcUraQx/Os1aeHf+48kzxcCkxoe+M58moTCqHdQRwh/YzRTqT6+enz1/8+3f4K3JWongBu4yJuAwikoI
9FywbaDJiOQVFOonYYiqY4qqwZhMWSGm4qejYV0Tvhsz6D7YUp4PhBlPoRw9IvFOjWd4PTvvvnn1/XffPX+FXcuqE2bw9oAN
HRj9KzcMXJ9VGttBPKFTuwTmWQA4I2RDduKH5z+8OqFG3p3AeJCE8MJopc+g5AkxVOzASDRxdapVEegsBOEaEy5k/JzX2jkA
zJOL0AM+DtCqYoxVZwmVb09enrz657EtBiFYWzyuNo4y94XYw4EJ5Hs9N4TJDhNoEU5hIHjWIR1B3jHgA0Clf4WwJwl0qY/z
k6cqoP6P19Ag8UIqy0yk3UjqYKIaUKCgcJBXoX9gD05DmIgxjOABasPQd0EKD4i2NJRgYAO1tOo8sDAzQWc+e3XygyVI8lJj
YG8BbECEEW8Tf4KQcZ2wP1Ym52TAyJ/TgLfBuvFQgfddzzdeikMymGnK7WnT8zCbbSZMDOaFY7QFtFJE/8FNAFTo53soqrnx
ZqKBmN7jZl8A/Fq10UJhW68+qknrEMG9YKL33IKFCzrWQGknJy6KGaAy4xWB0oE+fuMFfT8BA3wX5shkGqCxsqs9ZfNldwce
DYOBO1SSa+cbNwwB291SSWamCEEVD0xUAAlS2BvqYJgeO99wEY2OjZLCSGy9KBHfLinI9NeLSvlXVpglhV5Yyo6ywmoC6sW1
SblagUZQL81DWlZUEz058JpEWkVJm8RZJe1h1hLW0Qj8QCPLX46pWDqY8jGNHyuGrGI6ijl2IOmvY83qIG1cc1g0FQH2YVa0
DQqiMvKnPcevBP2OsNtoz5/b7XYw7YJXOwV5Al6qEnDs4JAYdADNcxv8ABAJqCNAhMXsDGnCxOyImt5EH1SHO/f68QEJYJgG
TLZnz//+/bfPRQJCpkEqy0BXKKYHrW68J2am+EXRklE/BrNvB41arjTv0I0TTYxdvUvFvlTmjUoCguGXBzDpHwD+D8AsfVD/
aImLB43Lzu6OKP60xe5xuGvMK2hgycub7PJDdrkwsbC/a8xMk9EJ3TgJA0TuGxDmeexreolu1x/0IzDASMyCjom7faDwk4wM
jb2nDBcgRW6x7mjLqsQXH/NUn09BxCq11vVrkvb4mAmPVIVb30FFYOyqoorI5zWgXRVoJ9pZ98XH1aEFyx9YcNAoG9ytO4NA
ZH/K2rCb1Ebtk9pAIBvaUP1IyvkURgYmSEMGM0BRO6KWCxugeQ16L9IH0VCATUQewPwqjMIzsNLBHXvyBCY1jOU6vBZgHGtY
NR6KOQZOYuHhFNJa9JAJq+KvAjgb+JZubbq9Ubc1uv0At8DcK00iUH/aSLEUc43GBjw0jbl4KKrL6hn/S1bJiTDG3kYYAOTp
U9EwS0Ch14DGbg/DEgdP8S/QHe0oDJsRyclOOQLF3uNoy89HMlhjrqFfNMMQm4bRuEA3wzDGgIudmDxIeFNLaGAeZU8a/MRu
ZI9a/Khmm/S3gQRFSeqGzB1zcSDAtWC2AVTnoMZ9MAXtGjjTV9kNeDHgKvemIdqJ/XAaRVCeaq3SNkp6PY24VtbPq1VCA6V/
BRq3qvwP0D3AYv+VeybpjsAxMMIxpzR00CD+i0wVANOVwSp2AACmEF45VWZSx5Z/a/Jv3RLMzMzLS/m431ejApdg6mFUxkAg
y8rSotedlbc2vr1Z97aGbz/obyVx+HUdXy/U64+sW8GWo/lM0SewbR2pjIAVKboRlQhar7VMxQYU3hPXFhfeEwt5xZFPdTMJ
SPfNQmc0caRHSPhh8JmIB3NVgInvCWQqsb/vramQq/SeK71Xld7DmF00wMT1QM68p6A3YoEBBsLDNFjGmcb1hXeJU9Jowcv3
wMz7gCOT7CNQBklz8Ll/EOjPjW5VGDVgfzak6xjfGBhDEIfAt9fRhd287IgFPDSugXPBXh9UxFv0rVCScYC3sgMmTNKPxRuC
xiwEDlEMPgGNibuchcRip+cvyIWwOHgMsrFpcXAYoHVkPQL1FiYSj/v1RQ0wSKfYAOZKR29hZQJQEBYvEubrEf3RZmYTRyQB
CgOz7YkRTr518Ii70MAz3j5EVipoJgyTrzzEODi3nKiWU05ZVK4vqsgHZI9RlH2fXSoUAvjWLn9L2Mo5xIAGVK5hUNh9XzQY
huSYdf1h7gcR0b1uyfmid4zsGpQHfPtz6zWy656I9D7IKCuyemXYuXVOXPGcuII5UcM5caXDwp+8XoXSSIary06ukBRQyJwk
31BHsvXIVzfp1Yf0agFXywsk39WlJapmHqIODbUlQ+Orm/TqQ3qlQcPBuNSlmg7z4FjgHI5kw5UoXyQU+8diiMbQFMOubI/g
rWngmKIIILa8Mk1TBzPIhAa0ksH8mF5J7g5v4wHi6YF7nRt/OVGk0JzqY1Q6PiPE1NYGiUtJ/hJbddFgINBR83Y2KpXHOmFT
CdFDYTVCa8IEUwsHj8w3tNhMdCaQObQna5u+TbJP85JdGyBD6v5eTqKjqXV2ZpIULY4fyPjOjpTHtjDqII9xvU6UCeJraAq0
Q07q2veVuo1bpW5DDCYoc9kCH0wAs6qYVMXAFhMbV8vixZQNlK9SGdh7AoZ/TjC3UjDw7qbkHQrvr4L7Xyu4864wcDm0cAXS
Qw5aW45siSgvCOgyqTeYmDnhvRoOyf/srxGegBXKy6apgcvUjPl71Ql5qiqhv4m4W+kSoCpKyONbifVn0y3lWgU0wnqlcoRG
fhOVCuqS8UXjUtMpuGAfeL0e+CW/kkePfjS4zHBFcffrMaGq0hxcU/MHUDsNeGEEJRommVyDb4+ZF+w9t4thGpm3kequo/t7
DM3tPIbxVweiRFUV24RKUinZVL7oauTjZpOSWNoE6jazWFpWfawwpuDehEJuHXpuF563btWDSJXro/Loy1jG5CwZAdPppoIy
Y0/O27marnMOOSGdVZhqnNmoY0/6Vp7559XRBTk9pmLjW1U5jMMcI0NA9yqqaUvQkxt6YmtPPtCTmvZkQU/q/GQ7VZ9vzV5p
zV5pzV5pzd7eh6PR/7M5cYplWAd/kvN29SW8tlSewLCRGmVuRV1qSZa0cH6zBv4XeG45ybaqZcF1e6Rct1VFqztvrC9batlb
U4f3duVaW7hyk7HmylUnVVTX8GtgT2y8tL/qxUVlMlYFlUJs/rljayXin32fybiyIPMcLm62dZig7AdVablZgZD1126v6hH9
RU6d6C90rbLRpdIr3UPxlGJpr8PSXoelvQHLUgy3UVb/9i7oZo22PU/fmZ9/5z5qqkkz1lpRqOMvrUvv4am20FNtKU81uqjX
LmklMNWemq5s3dF1xMtbF5saf3xf8R6shGzhFRVkHnXv32D1yZEakgVaZ33Bnl6QpPNmTUdmpYPqQ17dpFcf0qvFthqJyvdS
aL0UWi+F1tOgbdYef0A35v6rTJvjl9ogUpwBzfdj8QsRdJ6Se56Se56SG9T2R60ypSNcW2JqoS8AjJpODSnnKCR2xV8DqXRC
lfYt5o6fuMJIP264wqxz3+3HlAMsMOfOl1m26xJuEGB3OizNWcolqahg5RUSqWamAtu4AnldN1OxnaDgouzcA0r1EYC0J5Mq
DideIGaOF4JioB793Oi+OAS980Jl9vNXZxc2CHNHfnPXUHm8KEHMkpwOqtMF0N2rRr4fmcx7T38eQll5wXkdNAZDYZCe0tkn
wjmkaMNgGqi5sJfNejaAk2ClXKtY7qPAnMHSmDgNgbMGBC5yrLx6T6sVa5Dr5PE3HB4TDsEBMBgzjrs1zEIXoCineVG6lLda
UuWW4IjBfMnyQGpHTRQ3wL84uGoZUhtHdmtrrcuKeJ30DuSnAsLAr5vGTgTdJw5B4JzzArhj9jaCm7RJm+MYC4wiUxvgE5O+
f1+pwK/9un2J8bmFDE3zZ2Sqndp7SjwfeyM07KC0LZNSEiQhFUkOGxbZK8mDRht9vTQF7BqmEX8XGHujZJpE6dd9uSXVF7fb
FkCkzBHHhDJpXdjNbVzxDrPw13C0dLvLvG4jYbmUK0mjiuLpt7A3Su2D6uUaVaLsArugSkBNnuSWQJ10CdRJl0CddAnUkYuW
1YIhsAKml4LppWB6KZieBCO1/4m5gtRpbiXVSVdSnXQl1UlXUhVStVWk8mB6KZheCqaXglFI1Rmp0wJSUR+8awxMRX3wpie2
Lvw0hQD8gt/i7SE7WKqSuUVh5KwUuHlHfw4AUd9IYK23PjAHIHXsCiZRBIPKBpTuKkEH4I7GSMnD7OWkSsZXFT1sc6fgp4NR
VgrPZninZfBsNuYI3ue20HgMrTR78bbBUOaZJWvdb0i0aES/HMBku/HKAOkdWLPc/ZDs/s++uqzWx39Py8sHm5eX0XiQSUvE
bEVTYUyOfGozdHiDgWNcW96Hh2iqV80KlvMvaQ269l7Ql6ao29WXwlrGuVqMps84dbtAHEpzoMzA0MPsd1Xvzerd1Pv4z6bq
i/Vp/KROB+poynqDri6xGZRRIC0DqLJqOVCZRitXpmyBmcvmF5fT+vewN25dhy4KRX3tmVdZcLqiXVytVB6Z+kfH6/wGEi8q
VEcmOypcj9wxi9dm+e24+LZzt9Vu+uYC53omjMeenPJVm/8lBW/hS1paK3YSxiz1peWFvqq80BeUF1pIf6PNxGUbesUj/aap
3zxSILexn1JkbR1ZW0fW1pG1b7elUmRtHVlbR9bWkbW/2lVf7ao/hF31JdMGLApGqyS9fV7iIFL8XsylJplLDTCXrn0yh9hC
alKygLKbmpeETgvF9SCzl3y0l8ZQ/XENl5ZQdcmPiiKxTx/jw7uW2pYpn3sHBtZzaTdBqwFp0xH89oURiLHjD5FS14kTxm4I
DiQQoF7jvaowDtPgLwKH4XSCeDcbAVVFIMbooW0Cvlm4hsg5wqC7xVEavn8KRhWgHU9n+PEQgKOvDQkiWogE8ZLbqY0qldpo
3+6klhzRhdD2D0FZ70ORS85CBDQpB5FDQO2SCBB+PYaS5f1hDXsG0xYobLx/gNjIC7YQ2mhmZPtuUZiJN4MC9I95mwv8OlKS
CT+9VltD5WlahV8XqA6A+TXDs3lnw/Nxtmplr0vxAKOtB4TuSCmh9gH6hOWrkmXWElNOyl4MFma2E6UQUgz5vXRlpNk2Sq2s
93LNcQsR+dkt2FxXLOYKwtPCQTsuwfBW6/dxbY316+QtULLeiYGruWK9NcXIKi6UHReM2lpqFa8AVqFXOWuM9w9pLGDaWMTM
YJLW22p7OHopzVPicCk76MsOnqM9R34jX0YQeKelkLby/IC3K+408Sp2p1VG8EWFg93SUsUEU2yDViiicboswaHt9DV/zl0s
AiYsytHypId87UZpbY5+50s2S0vWGubKOqmmHilPtpxGmVVzi9fRLDMZch+jl3gV/rVyHLL0dWQ8TGzACWNuTJ1QHsfGgrSs
oYUvgFrXpV+ZQ6P4qvDp+dr2ScVrrspI+Sh1/peoL7+LFiF+pg1I/QogwMpe1qr873e5Tj1iq2OkrI5R+Tr1SgpuEw2ekfRa
1I2t39T0mzq5CKOS9WWZSTTKre7KdEj1kTLNSWXujMioyy8qrywALwha+CWMYbU6e3cSrFmpXeR6vq7Ppcu53//c6P7jNbBn
XWausNztgqGW6CtnXT/LCKUwWBa68nq0dtbWF1bJ9IpSA6/rK+sKCv+qVlW7Y2kweT2wmLzevs3zAbwpnywnA0CQjdRBeGRN
+eKKFpmjCwYI/EBJqggCf+/bR5eFxbfUzAGtYR9Zau3NboISsTMDR1Li3ktntyex1r6unJVEsm7dfqW291T/6jANdN2+sqY2
BFG8YOBue7RtH9gHluYbmLRHAxaNcXdAzmOA8nJDB96elneBpAIK+i8HuIvogV1tWAetunXQPLIOGo+tgzr8rdXwhWVbdt2q
HVn1lnVUt5qPrdZjy7brH0WErA/mfAxsGddxaziZUb2JL/wkzm+Osk73xGgQVpenZyfPHrdaNoxibNOTs+bzk2fPvj3DJzV6
Umvaj6vPqlSmTk8e2UePG0f1o2StasMvReVuLo/43/qyuOHCEmf9knXq2oKRi9PeiPMWUoy1WspWqVaTW/R4t0uZCDDMEyOu
Yr9xe1xfpSnkXtewy/x6LVD69E9tXSM3PknIgqqjGuEUk5X4JRt/Ywxv8hdHgNtD8d+Trb/F8VcjtL0N4x0R6TBwcUMyn9z+
nvLrk46uMFPrGsQyWcpeD53LVEI/qK1tZUzE0OMjqXEjW6urtrJWxkXqbBW2kRocOoYKY8zRXFPpg3+Xb45hvstvjunqJr36
kF5t/82xhMbTMAWZv/2Qv12o260y8oBrF3oo7+oPuBFE6txpwbjy7DqNnOBM5eip3X8o3C/k/bqsuwIJ0yTAUvPtDDe4RvPx
DOwA2gb2lK7qVbDHeIfNcLo4mDjvgU9xW1oVYJE7GeNuvJyAlG5qru3sCcOM+0llW3aDkpIhJdrp3KH9X3Mbm0N1toBo599h
WhUh96dzjDs5egJTNHOCNm0pSnoiEYdoLPAGyHDBW4wb72QO9NBduCFvreTjjoNyM2AEjiBMudmmsvgsxpa73xZqA3QolHDK
1cpW6LRwW220ABki/Tv4k4gHKHPQYNwpNdS62PZg1VyjndSZCTPW4l7CkB51Cm+wkxMvMLCjQUKCDrggzm8/RcjtKfT2CEGD
DB+bvBpc4f24kxq1yB+3WrR2as82Umu2utaapQ/C7mW+Mj1UTzTKpfvOf2YzVrdg5WDc3ZvdKvS+JjG9IWOHKwnq9CK/5X4h
Wf3Thd8nL1WUSs2sS3n5L1caLsnEwjpdJ+oSOqTAOtpShF1e6MYshYiBsfIKH3JQ6+WFFms+e4zdCchHkFpPetOpD2LzaTpp
/ub4w7vMmtoWs6b17zVpCpykPjgYFedBbWUeFJggran4ZnPtoov5cStDsT+P8xs8KnKfnom/il6puTrGYOCaN53fdva2bpm9
q8kZiqIG52GYJYkYPANrak4jiebSBzvLBT21gmqMuDD7B+WzT+7dSztW476jO7hhNe5jTBrrTUffxvjs/MeTN90fX57/k/Ze
9vNV7awqztsnQ8eP3Kd3AlGvFmDA9L0jiFoGgXYSfNMpaSZXxi4t09TKHK2B8yhXphxOSyvTWgPHziP9orxQPdfamkINrVBz
TaGaBknG2t6o7YvVvtdJECWz2TSM3YGquqvvna22us4GY80QZTtuf6ntJ/GsIblt/CD0wLBt00b9E2c28wKYy+npDFZ2FAYY
pO7M86ejxK1oCoh0Cm6ND3rou/O3qSJ6hcdIbNBDL1/hiR7nb0FGya3taTf2trqSX8vLzb7pUAo+zyA9m6KgCVcQWZVcQGsv
GrMXJ4yH6AdeIJ5PoB5Wabdfvrq8OL1MhdmNpSdd7OEO/xu+eUYMAFG5/etLqYR6apvXOGdP5wlRxKJoXtP5IrgOjjulfD9Y
guOGVrPFnk3+BZvnmzZZDVn8hiB+oSmQv6F5q8jucR08E+wUq/RM9KMvwsuLHkpNxKMbJRMjfYh5H562m754Kjc573aZ9bpd
qcHQEbpI94e/vOBB6KTfE3HnofltVMsd+nZb/wgv7Nhl2s20d7qdCx26Cfo8BJFhZojT4BT3yTelfv5NhiivVZncqEyLXeuU
EwXjQjbHhdJOyPjQHEMmKRgMl5SC0nlkrqtTKeJyY3wv8qTyAmlUmnaAou2YZiagGWqRC2gX3z09Fi9N0YPhu+p8OpERag9h
Br0UaPkgFJhJBwByoAi3mAE2il0dBgjtmbxXshQ6uwodf+b0jRoIabkv+sj1ky4erETGIABG8zDy4KG6R+88meUhfSyx2PBA
ELDXaEmar008e+Ql4jJdrPYTBKpkJbi6mBZwvYEnRb5JP59bcUFYVXTx4DYadasokBVF1aF6mCckaWXq4R46+2aaxLMklmEn
RVKMbaU1oLgXkgrbTWa7fNyVBG+8FMMkhAJ44toiwDPW6FQlDPu8JPB935mAPdFWSg2/0evzYY0DdRgUnpnnDioFVSBTPjTW
hxFUzC3a2eVBOjUKEEKcPQQGhAv6CHjZhssDtZWDCmXm2yDoIcB+SWEalO5/ydszd9LGfKZabzq4KZ480O3iGYmh149BR5Qu
8eVK0HrfWrWc9nu14vJ6JYqef79B22+wEHT1/+JfawWsCEJcWTNo6ZuL7dEpRCVnD8EwE9Tcs711LBVwZhYeL/Sm3T49f6EX
kEKhF0aaWKAae1T67TlQabLmLQYndGApCyx6aCiUv5rwqzsq2A3KQ5MtIFdYprzU13B7IIWz1DSstIcd1kpMuIRcDOYSE1WC
5RoLdhThygT6ja04WiwqjGwix7XZABUDHDvTTqOSFsGOsn4TWscrWD101hSl1AH7dpSIfLfFOWPqTNIbOruv54p4mtBpZfIw
NBTYPz07B0b14rYCnD8SDT9ikiLW0I5aMvGQLDoA1MMz4FYPQqso4zU9sAnBow8Y4JlvwJhvxSJjQNRlCR6Xm9zTRkWIFOpa
wGBYzE8WM42F8awgS5/KDs359FbzJoZ+cA5z9H46IxMYRcrbkDM2nenmqlaX09bMA5ysB0gRyBKAH3dWjMX8AXhG5mXop1/l
C56fvH357d+M7NAgWYOP1pJs8xpPkhPLLY6M41N87aZKtEhXZKx0kSaCWydWoPvjJLjCkTqkpZg9mT06UvOC12iI2fmQWjqB
0hmoQ3IZKjDykV1LYWarUDKTFM9RcaAdeDP0Pdq1ogHQ5u4wnOIZMbS4JaHicR/yvDuaAGxjuEvoY6D7Z90u5bB3uwYulkv5
ioo7AuJcXK7ICloKO8ZjOTGmbZuaFlKyOVrSSbXFjBn5+qkhgZudcrULXQ96MEzc1JKXlE5VCzWEH62BX8uga2xIZ+MxtD0+
Gq+z0giO11KodnJRTE3lcjyT4SFzN/DBvtwY4ZlHCQJlGgZlsofHAXItE+b7iB4diAwWPEThmtCCao0TiZNRPi08A4mDkJ6L
nMXaS0pSsm/Ca3olrImvaHlOTxJZJS2eygUDa17oRr8iKoPsg37JCYqNqVMSJvDKfs6ReAH3rh5mh+G+pdFbG0K+WEaFhuik
xDplCLt8ZW50+ZVkyclg7XTAlHE6giU2/gXmII2qHQiXUzclKifIdE6mAfalYr5FE2yvg4IyJaSaKfCSrpDW6sgvpRE1xaDI
8Rcjd3whnQT28CGaJseYibCFotzSxX9CHv6qk06LZss5bmm28k76GSLi1xsG6vY1qhUtVu75SOu7X3DJ8xPF2CABigJA/4Fu
0rLY5mlMoqF/2dnZ6J/VKL0AJzQWzTNVeUp2TsytSrkyRD+P1NmA/+eTNgXe1n+iOWeMY3O5JeOYVqv5NerBuLiBqJyxW/Jd
2bTM/IV9or5MVONZupyDGTM31wWK9KuiwLuPiFiwT0XyKkcw6U9RvF951BiattBhJx9d+nAWuebolmNMQ6273DWOgQfBf/FA
Rj7QkA9UfMKKxddAxddAxddAxddAxddAxe8wUPHVnfjjuxN3+MZwjUF73wFY9U1YcC+GlAi78hatOfdaUggaXwzN7X2UW72m
7bynEmMHP3eYrXcyZBkwq0vN9s7mJRzaXFBbib2lu3dPRN3UMbCXU5dhiYvo3gZ0aTkdv2ueOEMDhpBTVtHmpnOC71pTfgyx
pH1171O7xrU/3K92nWsvNtf+uPaNbg045QA+7mx+8sfxS/T0sVM9a+yU8vnSFLNCItmvv3IZyjSU0d3db3eB4fi4e/AcyIMB
BnSSALRfb5oEg6jbNZTdxPa2ucM+jrH915c5J2Q792QrZ0Rztp5g3wAy5UwajAs3vszICQBf5Gn5GegA1ZIvS4tPoAflf25P
Dm1JpLCY/6mESr9e255G6lnJwvwy0gi3U+IQb7/yniUebGAhwACb/HJ8BCjch43uSKLPSaYSzrqVSpK9/h9bS/rV
"""
LEGACY_SHA = "4d566632d3a225cb"


def legacy_source() -> str:
    s = zlib.decompress(base64.b64decode("".join(LEGACY_MATVEC.split()))).decode()
    if hashlib.sha256(s.encode()).hexdigest()[:16] != LEGACY_SHA:
        raise SystemExit("embedded legacy matvec.cu is corrupt")
    return s


def jsonl_writer(name: str):
    """A function appending one JSON line per record to $OUT/name, or doing nothing without OUT."""
    out_dir = os.environ.get("OUT")
    if not out_dir:
        return lambda rec: None
    path = Path(out_dir) / name

    def write(rec):
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return write


def module_key(src: str, defines: dict) -> tuple:
    return (src, tuple(sorted((k, str(v)) for k, v in defines.items())))


def _compile_job(job):
    """(key, cubin bytes | None, error text | None); runs in a worker process."""
    src, defines = job
    from cuda.core import Program, ProgramOptions

    code = legacy_source() if src == "legacy-matvec.cu" else (KDIR / src).read_text()
    opts = ProgramOptions(name=src, arch=ARCH, std="c++17", lineinfo=True, include_path=[str(KDIR)],
                          define_macro=[(k, str(v)) for k, v in sorted(defines.items())])
    t0 = time.perf_counter()
    try:
        obj = Program(code, "c++", opts).compile("cubin")
    except Exception as e:   # NVRTCError carries the compilation log
        return module_key(src, defines), None, f"{type(e).__name__}: {e}", 0.0
    return module_key(src, defines), bytes(obj.code), None, time.perf_counter() - t0


def compile_all(jobs: list, workers: int) -> dict:
    """Compile every (src, defines) job, in parallel processes; at the first error print the
    NVRTC log and exit 2 (the rest cancelled)."""
    uniq = list({module_key(s, d): (s, d) for s, d in jobs}.values())
    # gemm modules take longest: start them first
    uniq.sort(key=lambda j: j[0] != "gemm.cu")
    t0 = time.perf_counter()
    out = {}

    def take(res):
        key, cubin, err, _ = res
        if err is not None:
            src, defs = key
            print(f"COMPILE ERROR {src} {' '.join(f'-D{k}={v}' for k, v in defs)}\n{err}", flush=True)
            return False
        out[key] = cubin
        return True

    if workers <= 1:
        for j in uniq:
            if not take(_compile_job(j)):
                sys.exit(2)
    else:
        import multiprocessing as mp
        from concurrent.futures import as_completed

        # fork before any CUDA context exists in this process; the pool is gone before one does
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as ex:
            futs = [ex.submit(_compile_job, j) for j in uniq]
            for f in as_completed(futs):
                if not take(f.result()):
                    ex.shutdown(wait=False, cancel_futures=True)
                    sys.exit(2)
    print(f"compiled {len(uniq)} modules in {time.perf_counter() - t0:.1f} s ({workers} workers)", flush=True)
    return out


def plan_modules(types, timing: bool, cfgs=(GEMM_DEFAULT,), checks: bool = True) -> list:
    jobs = [("q8.cu", {"Q8_WARPS": Q8_WARPS})]
    for t in (types if checks else ()):
        for (N, K) in CHECK_SHAPES:
            for nb in NBS:
                for glu in (False, True):
                    for _, _, d in mv_chunks(t, K, nb, glu):
                        jobs.append(("matvec.cu", d))
                        if (N, K) == CHECK_SHAPES[0] and nb in LEGACY_NBS:
                            jobs.append(("legacy-matvec.cu", d))
        jobs.append(("gemm.cu", {"MV_TYPE": t, **GEMM_DEFAULT}))
        if t in ALT_TYPES:
            jobs.append(("gemm.cu", {"MV_TYPE": t, **GEMM_ALT}))
    if 12 in types and checks:
        jobs.append(("gemm.cu", {"MV_TYPE": 12, **GEMM_DEFAULT, "MEMRA_CANARY": 1}))
    if timing:
        for _, t, N, K, glu in TIME_SHAPES:
            if t in types:
                for nb in TIME_NBS + (1,):
                    for _, _, d in mv_chunks(t, K, nb, glu):
                        jobs.append(("matvec.cu", d))
                        if nb == 1:
                            jobs.append(("legacy-matvec.cu", d))
                for cfg in cfgs:
                    jobs.append(("gemm.cu", {"MV_TYPE": t, **cfg}))
    return jobs


# ---------------------------------------------------------------------------------------
# device

class Dev:
    """One GPU through cuda.core (stream, memory, modules, launches) plus a few driver calls."""

    def __init__(self, cubins: dict):
        from cuda.bindings import driver
        from cuda.core import Device

        self.drv = driver
        self.dev = Device(0)
        self.dev.set_current()
        self.stream = self.dev.create_stream()
        self.mr = self.dev.memory_resource
        self.cubins = cubins
        self.mods = {}
        self.kerns = {}
        self.bufs = []
        self.smem_set = {}

    def _ck(self, r, what):
        err = r[0] if isinstance(r, tuple) else r
        if int(err) != 0:
            raise RuntimeError(f"{what} failed: {err}")
        return r[1] if isinstance(r, tuple) and len(r) > 1 else None

    def kernel(self, src: str, defines: dict, name: str):
        from cuda.core import ObjectCode

        key = module_key(src, defines)
        k = self.kerns.get((key, name))
        if k is None:
            m = self.mods.get(key)
            if m is None:
                m = self.mods[key] = ObjectCode.from_cubin(self.cubins[key], name=src)
            k = self.kerns[(key, name)] = m.get_kernel(name)   # one object per kernel: its smem limit sticks
        return k

    def alloc(self, nbytes: int) -> int:
        buf = self.mr.allocate(max(int(nbytes), 16), stream=self.stream)
        self.bufs.append(buf)
        return int(buf.handle)

    def free_all(self):
        self.stream.sync()
        for b in self.bufs:
            b.close()
        self.bufs = []

    def upload(self, ptr: int, host: np.ndarray):
        host = np.ascontiguousarray(host)
        self._ck(self.drv.cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream.handle), "HtoD")
        self.stream.sync()

    def download(self, ptr: int, nbytes: int, dtype) -> np.ndarray:
        out = np.empty(nbytes // np.dtype(dtype).itemsize, dtype)
        self._ck(self.drv.cuMemcpyDtoHAsync(out.ctypes.data, ptr, out.nbytes, self.stream.handle), "DtoH")
        self.stream.sync()
        return out

    def memset(self, ptr: int, byte: int, nbytes: int):
        self._ck(self.drv.cuMemsetD8Async(ptr, byte, nbytes, self.stream.handle), "memset")

    def copy(self, dst: int, src: int, nbytes: int):
        self._ck(self.drv.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream.handle), "DtoD")

    def allow_smem(self, k, nbytes: int):
        if nbytes <= 48 * 1024 or self.smem_set.get(id(k), 0) >= nbytes:
            return
        drv = self.drv
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        h = k.handle
        if not isinstance(h, drv.CUkernel):
            h = drv.CUkernel(int(h))
        self._ck(drv.cuKernelSetAttribute(attr, int(nbytes), h, drv.CUdevice(0)), "cuKernelSetAttribute")
        self.smem_set[id(k)] = nbytes

    def launch(self, k, grid, block, args, shmem=0, target=None):
        from cuda.core import LaunchConfig, launch

        self.allow_smem(k, shmem)
        cargs = [np.uint64(a) if isinstance(a, int) else a for a in args]
        launch(target if target is not None else self.stream,
               LaunchConfig(grid=grid, block=block, shmem_size=int(shmem)), k, *cargs)

    def sync(self):
        self.stream.sync()


def quantize_dev(d: Dev, x: np.ndarray):
    """x [nb, K] f32 -> device xq, xs through q8.cu (one warp per block of 32)."""
    nb, K = x.shape
    xp, xq, xs = d.alloc(x.nbytes), d.alloc(nb * K), d.alloc(nb * K // 32 * 8)
    d.upload(xp, x)
    nblocks = nb * K // 32
    k = d.kernel("q8.cu", {"Q8_WARPS": Q8_WARPS}, "quantize_q8")
    d.launch(k, ((nblocks + Q8_WARPS - 1) // Q8_WARPS, 1, 1), (32 * Q8_WARPS, 1, 1),
             (xp, xq, xs, np.int32(nblocks)))
    return xq, xs


class W:
    """A weight in planes on the device (bulk at offset 0, meta 256-aligned after it)."""

    def __init__(self, d: Dev, t: int, raw: np.ndarray):
        bulk, meta = pack_planes(raw, t)
        self.t, self.rows = t, raw.shape[0]
        self.K = raw.shape[1] // TYPES[t][2] * TYPES[t][1]
        self.nbytes = raw.nbytes
        boff = (bulk.nbytes + 255) // 256 * 256
        host = np.zeros(boff + max(meta.nbytes, 16), np.uint8)
        host[:bulk.nbytes] = bulk.ravel()
        host[boff:boff + meta.nbytes] = meta.ravel()
        self.base = d.alloc(host.nbytes)
        d.upload(self.base, host)
        self.bulk, self.meta = self.base, self.base + boff


def run_mv(d: Dev, w: W, xq, xs, y, N, nb, glu, act, res, src="matvec.cu", target=None):
    """memra's matvec q8 launches: chunks of <= 8 rows, bucket MV_B, default config each."""
    K = w.K
    for b0, n, defs in mv_chunks(w.t, K, nb, glu):
        k = d.kernel(src, defs, "mv_q8_glu" if glu else "mv_q8")
        rpb = defs["MV_ROWS"] * defs["MV_NWARPS"] // defs["MV_KSPLIT"]
        d.launch(k, ((N + rpb - 1) // rpb, 1, 1), (32 * defs["MV_NWARPS"], 1, 1),
                 (w.bulk, w.meta, xq + b0 * K, xs + 8 * (b0 * K // 32), y + 4 * b0 * N,
                  (res + 4 * b0 * N) if res else 0, np.int32(N), np.int32(K), np.int32(n), np.int32(act)),
                 target=target)


def run_gemm(d: Dev, w: W, xq, xs, y, N, nb, glu, act, res, cfg, extra=None, target=None):
    defs = {"MV_TYPE": w.t, **cfg, **(extra or {})}
    k = d.kernel("gemm.cu", defs, "gemm_q8_glu" if glu else "gemm_q8")
    grid, block, smem = gemm_launch(w.t, cfg, N, nb, glu)
    d.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, res or 0, np.int32(N), np.int32(w.K),
                              np.int32(nb), np.int32(act)), shmem=smem, target=target)


# ---------------------------------------------------------------------------------------
# device checks

class Tally:
    def __init__(self, jsonl):
        self.ok = self.bad = 0
        self.jsonl = jsonl

    def add(self, name: str, ok: bool, detail: str = "", **rec):
        if ok:
            self.ok += 1
        else:
            self.bad += 1
        print(f"{'PASS' if ok else 'FAIL'}  {name}{'  ' + detail if detail else ''}", flush=True)
        self.jsonl({"kind": "check", "name": name, "ok": bool(ok), "detail": detail, **rec})


def prep_out(d: Dev, y, res, ny: int, alias: bool) -> None:
    """An output buffer before a launch: the residual copied in when y aliases it, else 0xFF
    bytes (NaNs), so an output the kernel never writes shows."""
    if alias:
        d.copy(y, res, ny)
    else:
        d.memset(y, 0xFF, ny)


def diff_detail(a: np.ndarray, b: np.ndarray) -> str:
    au, bu = a.view(np.uint32), b.view(np.uint32)
    bad = np.flatnonzero(au != bu)
    if bad.size == 0:
        return "bit-identical"
    i = bad[0]
    return (f"{bad.size}/{au.size} words differ, first at {i}: {a.ravel()[i]!r} vs {b.ravel()[i]!r} "
            f"(max |diff| {np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))):.3g})")


def check_case(d: Dev, tally: Tally, t: int, N: int, K: int, nb: int, rng, cfgs, legacy: bool):
    name = TYPES[t][0]
    for glu, act in ((False, 0), (True, 1), (True, 2)):
        raw = random_weight(t, 2 * N if glu else N, K, rng)
        w = W(d, t, raw)
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xq, xs = quantize_dev(d, x)
        res = rng.standard_normal((nb, N)).astype(np.float32)
        resd = d.alloc(res.nbytes)
        d.upload(resd, res)
        ny = nb * N * 4
        ym, yg = d.alloc(ny), d.alloc(ny)
        variants = [("", False)] + ([("+res(alias y)", True)] if act != 2 else [])
        for vname, alias in variants:
            def prep(y):
                prep_out(d, y, resd, ny, alias)
            prep(ym)
            run_mv(d, w, xq, xs, ym, N, nb, glu, act, ym if alias else 0)
            a = d.download(ym, ny, np.float32)
            tag = f"{name} {'glu act=' + str(act) if glu else 'plain'}{vname} {N}x{K} nb={nb}"
            for ci, cfg in enumerate(cfgs):
                prep(yg)
                run_gemm(d, w, xq, xs, yg, N, nb, glu, act, yg if alias else 0, cfg)
                b = d.download(yg, ny, np.float32)
                ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                cname = "" if ci == 0 else " (alt tiles)"
                tally.add(f"gemm == mv_q8  {tag}{cname}", ok, diff_detail(a, b),
                          type=name, N=N, K=K, nb=nb, glu=glu, act=act, alias_res=alias, cfg=cfg)
            # decode bits unchanged: the pre-split matvec.cu (glu+res excluded: the old B>1 glu
            # kernels contracted act*up + res into one FFMA, B = 1 did not)
            if legacy and nb in LEGACY_NBS and (N, K) == CHECK_SHAPES[0] and not (glu and alias):
                prep(yg)
                run_mv(d, w, xq, xs, yg, N, nb, glu, act, yg if alias else 0, src="legacy-matvec.cu")
                b = d.download(yg, ny, np.float32)
                tally.add(f"mv_q8 == pre-split mv_q8  {tag}", np.array_equal(a.view(np.uint32), b.view(np.uint32)),
                          diff_detail(a, b), type=name, N=N, K=K, nb=nb, glu=glu, act=act, legacy=True)
        d.free_all()


def canary_case(d: Dev, tally: Tally, rng):
    t, N, K, nb = 12, CHECK_SHAPES[0][0], CHECK_SHAPES[0][1], 16
    w = W(d, t, random_weight(t, N, K, rng))
    x = rng.standard_normal((nb, K)).astype(np.float32)
    xq, xs = quantize_dev(d, x)
    ym, yg = d.alloc(nb * N * 4), d.alloc(nb * N * 4)
    d.memset(ym, 0xFF, nb * N * 4)
    d.memset(yg, 0xFF, nb * N * 4)
    run_mv(d, w, xq, xs, ym, N, nb, False, 0, 0)
    run_gemm(d, w, xq, xs, yg, N, nb, False, 0, 0, GEMM_DEFAULT, extra={"MEMRA_CANARY": 1})
    a, b = d.download(ym, nb * N * 4, np.float32), d.download(yg, nb * N * 4, np.float32)
    caught = not np.array_equal(a.view(np.uint32), b.view(np.uint32))
    tally.add(f"canary: gemm MEMRA_CANARY=1 (drops unit 1) differs from mv_q8  Q4_K {N}x{K} nb={nb}",
              caught, diff_detail(a, b), canary=True)
    d.free_all()


# ---------------------------------------------------------------------------------------
# timing

def graph_of(d: Dev, fn):
    """A CUDA graph holding fn(target)'s launches (None if graphs are unavailable)."""
    try:
        gb = d.stream.create_graph_builder()
        gb.begin_building()
        fn(gb)
        g = gb.end_building().complete()
        g.upload(d.stream)
        return g
    except Exception as e:  # noqa: BLE001 - fall back to eager launches
        print(f"  (graph capture unavailable: {e}; timing eager launches)", flush=True)
        return None


def time_fn(d: Dev, fns, reps: int) -> float:
    """Median us of fns[i % len(fns)]() between two events, after 3 warm-ups each."""
    drv = d.drv
    for f in fns:
        for _ in range(3):
            f()
    d.sync()
    evs = [d._ck(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
           for _ in range(2 * reps)]
    for r in range(reps):
        d._ck(drv.cuEventRecord(evs[2 * r], d.stream.handle), "cuEventRecord")
        fns[r % len(fns)]()
        d._ck(drv.cuEventRecord(evs[2 * r + 1], d.stream.handle), "cuEventRecord")
    d.sync()
    ts = [d._ck(drv.cuEventElapsedTime(evs[2 * r], evs[2 * r + 1]), "cuEventElapsedTime") for r in range(reps)]
    for e in evs:
        drv.cuEventDestroy(e)
    return float(np.median(ts)) * 1e3


CFG_KEYS = ("GM_WM", "GM_WN", "GM_TM", "GM_TN", "GM_WK", "GM_STAGES", "GM_LREG", "GM_MINB")
CFG_DEFAULTS = {"GM_WK": 1, "GM_LREG": 5, "GM_MINB": 1}


def parse_cfg(text: str) -> dict:
    """"WM,WN,TM,TN,WK,STAGES[,LREG[,MINB]][:K=V[,K=V...]]" -> gemm.cu defines."""
    text, _, extra = text.partition(":")
    v = [int(x) for x in text.split(",")]
    if not 6 <= len(v) <= 8:
        raise SystemExit(f"--configs: need WM,WN,TM,TN,WK,STAGES[,LREG[,MINB]], got {text!r}")
    return {**dict(zip(CFG_KEYS, v)), **dict(kv.split("=", 1) for kv in extra.split(",") if kv)}


def cfg_name(cfg: dict) -> str:
    extra = ",".join(f"{k}={v}" for k, v in cfg.items() if k not in CFG_KEYS)
    return ",".join(str(cfg.get(k, CFG_DEFAULTS.get(k, 1))) for k in CFG_KEYS) + (":" + extra if extra else "")


def timing(d: Dev, tally: Tally, types, reps: int, rng, jsonl, cfgs):
    summary = []
    print("\ntiming (CUDA graph per launch set, median of %d; weights rotated over copies >= 2x L2)" % reps,
          flush=True)
    print(f"{'shape':26s} {'nb':>4s} {'gemm us':>9s} {'TOPS':>7s} {'GB/s':>7s} {'mv_q8 us':>9s} {'TOPS':>7s} "
          f"{'GB/s':>7s} {'speedup':>7s}  WM,WN,TM,TN,WK,STAGES,LREG,MINB", flush=True)
    for sname, t, N, K, glu in TIME_SHAPES:
        if t not in types:
            continue
        t0 = time.perf_counter()
        rows = 2 * N if glu else N
        raw = random_weight(t, rows, K, rng)
        ws = [W(d, t, raw)]
        copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
        ws += [W(d, t, raw) for _ in range(copies - 1)]
        del raw
        gen_s = time.perf_counter() - t0
        for nb in TIME_NBS:
            x = rng.standard_normal((nb, K)).astype(np.float32)
            xq, xs = quantize_dev(d, x)
            ny = nb * N * 4
            ym, yg = d.alloc(ny), d.alloc(ny)
            act = 1 if glu else 0
            gm = [graph_of(d, lambda tg, w=w: run_mv(d, w, xq, xs, ym, N, nb, glu, act, 0, target=tg))
                  for w in ws]
            fm = ([lambda w=w: run_mv(d, w, xq, xs, ym, N, nb, glu, act, 0) for w in ws]
                  if any(g is None for g in gm) else [lambda g=g: g.launch(d.stream) for g in gm])
            d.memset(ym, 0xFF, ny)
            tm_us = time_fn(d, fm, reps)
            a = d.download(ym, ny, np.float32)
            for g in gm:
                if g is not None:
                    g.close()
            ops = 2.0 * rows * K * nb
            wb = ws[0].nbytes
            best = None
            for cfg in cfgs:
                gg = [graph_of(d, lambda tg, w=w: run_gemm(d, w, xq, xs, yg, N, nb, glu, act, 0, cfg, target=tg))
                      for w in ws]
                fg = ([lambda w=w: run_gemm(d, w, xq, xs, yg, N, nb, glu, act, 0, cfg) for w in ws]
                      if any(g is None for g in gg) else [lambda g=g: g.launch(d.stream) for g in gg])
                d.memset(yg, 0xFF, ny)
                tg_us = time_fn(d, fg, reps)
                b = d.download(yg, ny, np.float32)
                for g in gg:
                    if g is not None:
                        g.close()
                ok = np.array_equal(a.view(np.uint32), b.view(np.uint32))
                tally.add(f"gemm == mv_q8  timing shape {sname} nb={nb} cfg {cfg_name(cfg)}", ok, diff_detail(a, b),
                          type=TYPES[t][0], N=N, K=K, nb=nb, glu=glu, act=act, cfg=cfg)
                rec = {"kind": "time", "shape": sname, "type": TYPES[t][0], "rows": rows, "K": K, "nb": nb,
                       "gemm_us": tg_us, "mv_us": tm_us, "gemm_tops": ops / tg_us * 1e-6,
                       "mv_tops": ops / tm_us * 1e-6, "gemm_weight_gbs": wb / tg_us * 1e-3,
                       "mv_weight_gbs": wb / tm_us * 1e-3, "speedup": tm_us / tg_us, "weight_bytes": wb,
                       "copies": copies, "gemm_cfg": cfg, "exact": bool(ok)}
                jsonl(rec)
                if best is None or tg_us < best["gemm_us"]:
                    best = rec
                print(f"{sname:26s} {nb:4d} {tg_us:9.1f} {rec['gemm_tops']:7.1f} {rec['gemm_weight_gbs']:7.0f} "
                      f"{tm_us:9.1f} {rec['mv_tops']:7.1f} {rec['mv_weight_gbs']:7.0f} {rec['speedup']:6.2f}x"
                      f"  {cfg_name(cfg)}", flush=True)
            summary.append(best)
        d.free_all()
        print(f"  ({sname}: weights generated in {gen_s:.1f} s, {copies} copies)", flush=True)
    if len(cfgs) > 1 and summary:
        print(f"\nbest config per shape and nb\n{'shape':26s} {'nb':>4s} {'gemm us':>9s} {'TOPS':>7s} "
              f"{'mv_q8 us':>9s} {'speedup':>7s}  config", flush=True)
        for r in summary:
            print(f"{r['shape']:26s} {r['nb']:4d} {r['gemm_us']:9.1f} {r['gemm_tops']:7.1f} {r['mv_us']:9.1f} "
                  f"{r['speedup']:6.2f}x  {cfg_name(r['gemm_cfg'])}", flush=True)
            jsonl({**r, "kind": "best"})


def decode_timing(d: Dev, tally: Tally, types, reps: int, rng, jsonl):
    """Batch 1 (decode): today's mv_q8 against the pre-split matvec.cu on the timing shapes,
    default configs, same weights and activations: times and bits (the split's register
    deltas must not cost decode speed)."""
    print("\ndecode (nb = 1): mv_q8 now vs pre-split, CUDA graphs of 16 launches over rotated weights", flush=True)
    print(f"{'shape':26s} {'now us':>8s} {'pre us':>8s} {'now/pre':>8s}", flush=True)
    for sname, t, N, K, glu in TIME_SHAPES:
        if t not in types:
            continue
        rows = 2 * N if glu else N
        raw = random_weight(t, rows, K, rng)
        ws = [W(d, t, raw)]
        copies = max(1, min(8, -(-(150 << 20) // ws[0].nbytes)))
        ws += [W(d, t, raw) for _ in range(copies - 1)]
        x = rng.standard_normal((1, K)).astype(np.float32)
        xq, xs = quantize_dev(d, x)
        act = 1 if glu else 0
        out = {}
        for src in ("matvec.cu", "legacy-matvec.cu"):
            y = d.alloc(N * 4)
            seq = [ws[i % len(ws)] for i in range(16)]
            g = graph_of(d, lambda tg: [run_mv(d, w, xq, xs, y, N, 1, glu, act, 0, src=src, target=tg) for w in seq])
            f = [(lambda: g.launch(d.stream))] if g is not None else \
                [lambda: [run_mv(d, w, xq, xs, y, N, 1, glu, act, 0, src=src) for w in seq]]
            d.memset(y, 0xFF, N * 4)
            out[src] = (time_fn(d, f, reps) / 16, d.download(y, N * 4, np.float32))
            if g is not None:
                g.close()
        (tn, a), (tp, b) = out["matvec.cu"], out["legacy-matvec.cu"]
        tally.add(f"decode nb=1 mv_q8 == pre-split  {sname}", np.array_equal(a.view(np.uint32), b.view(np.uint32)),
                  diff_detail(a, b), type=TYPES[t][0])
        jsonl({"kind": "decode", "shape": sname, "type": TYPES[t][0], "rows": rows, "K": K, "now_us": tn,
               "pre_us": tp, "weight_bytes": ws[0].nbytes})
        print(f"{sname:26s} {tn:8.2f} {tp:8.2f} {tn / tp:8.3f}", flush=True)
        d.free_all()


# ---------------------------------------------------------------------------------------
# CPU selftest: a numpy model of gemm.cu's index mappings (staging, ldmatrix, unpack, mma
# fragments, C layout, slot order and merge, GLU row pairing, producer walk)

def brev5(i: int) -> int:
    return int(f"{i:05b}"[::-1], 2)


def goff(t: int, u: int, g: int) -> int:
    if t == 14:
        j = u & 3
        return 256 * (u >> 2) + 128 * (j >> 1) + 32 * g + 16 * (j & 1)
    return 64 * u + 16 * g


def moff(t: int, u: int) -> int:
    return {2: 4 * u, 3: 8 * u, 6: 12 * u, 7: 16 * u, 8: 4 * u, 12: 16 * (u >> 2), 13: 16 * (u >> 2),
            14: 18 * (u >> 2), 23: 8 * (u >> 2)}[t]


# per type: NCH, WBS, MW, MCP, MWS, SB, NK (gemm.cu's G<T>)
GT = {2: (2, 48, 4, 4, 4, 2, 2), 3: (2, 48, 8, 8, 8, 2, 2), 6: (2, 48, 12, 4, 12, 2, 2),
      7: (2, 48, 16, 16, 16, 2, 2), 8: (4, 80, 4, 4, 4, 2, 2), 12: (2, 48, 16, 16, 16, 2, 2),
      13: (4, 80, 16, 16, 16, 2, 2), 14: (3, 48, 20, 4, 20, 4, 4), 23: (2, 48, 8, 8, 8, 2, 2)}
META_NEED = {2: 4, 3: 8, 6: 12, 7: 16, 8: 4, 12: 16, 13: 16, 14: 18, 23: 8}


def chunk(t: int, u: int, c: int) -> int:
    if t == 8:
        return 64 * u + 16 * c
    if t == 13:
        return 160 * (u >> 2) + (32 + 32 * (u & 3) + 16 * c if c < 2 else 16 * (c - 2))
    if t == 14:
        j = u & 3
        n, l0 = j >> 1, 16 * (j & 1)
        return 192 * (u >> 2) + (64 * n + l0 if c == 0 else 64 * n + 32 + l0 if c == 1 else 128 + 32 * n + l0)
    return 32 * u + 16 * c


def model_inputs(t: int, rows: int, K: int, nb: int, rng):
    """The CPU models' inputs: random valid weights of type t in planes (bulk, meta), the integer
    each weight contributes (quant_values), nb rows of q8 activations xq and their blocks xs."""
    raw = random_weight(t, rows, K, rng)
    bulk, meta = pack_planes(raw, t)
    qv = quant_values(t, raw)
    xq = rng.integers(-127, 128, (nb, K), dtype=np.int64).astype(np.int8)
    xs = np.zeros((nb, K // 32), Q8_SCALE)
    xs["d"] = rng.uniform(0.01, 1, (nb, K // 32)).astype(np.float32)
    xs["s"] = xq.reshape(nb, -1, 32).astype(np.int32).sum(-1)
    return bulk, meta, qv, xq, xs


def quant_values(t: int, raw: np.ndarray) -> np.ndarray:
    """The integer each weight contributes to the kernel's dot products, from GGUF blocks
    as ggml defines them (independent of the planes and of the kernels): nibbles 0..15
    (Q4_0, Q4_1, Q4_K), 5-bit 0..31 (Q5_0, Q5_1, Q5_K), int8 (Q8_0), q - 32 (Q6_K),
    kvalues (IQ4_XS)."""
    name, blk, bb, _, _ = TYPES[t]
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, bb).astype(np.int32)
    nblk = b.shape[1]
    q = np.zeros((rows, nblk, blk), np.int32)
    if t in (2, 3):
        qs = b[:, :, 2 if t == 2 else 4:][:, :, :16]
        q[:, :, :16], q[:, :, 16:] = qs & 15, qs >> 4
    elif t in (6, 7):
        o = 2 if t == 6 else 4
        qh = b[:, :, o] | (b[:, :, o + 1] << 8) | (b[:, :, o + 2] << 16) | (b[:, :, o + 3] << 24)
        qs = b[:, :, o + 4:o + 20]
        bits = (qh[:, :, None] >> np.arange(32)[None, None, :]) & 1
        q[:, :, :16] = (qs & 15) | (bits[:, :, :16] << 4)
        q[:, :, 16:] = (qs >> 4) | (bits[:, :, 16:] << 4)
    elif t == 8:
        q[:] = raw.reshape(rows, -1, bb)[:, :, 2:].view(np.int8)
    elif t == 12:
        qs = b[:, :, 16:]
        for j in range(4):
            q[:, :, 64 * j:64 * j + 32] = qs[:, :, 32 * j:32 * j + 32] & 15
            q[:, :, 64 * j + 32:64 * j + 64] = qs[:, :, 32 * j:32 * j + 32] >> 4
    elif t == 13:
        qh, qs = b[:, :, 16:48], b[:, :, 48:]
        for j in range(4):
            q[:, :, 64 * j:64 * j + 32] = (qs[:, :, 32 * j:32 * j + 32] & 15) | (((qh >> (2 * j)) & 1) << 4)
            q[:, :, 64 * j + 32:64 * j + 64] = (qs[:, :, 32 * j:32 * j + 32] >> 4) | (((qh >> (2 * j + 1)) & 1) << 4)
    elif t == 14:
        ql, qh = b[:, :, :128], b[:, :, 128:192]
        for n in range(2):
            L, H = ql[:, :, 64 * n:64 * n + 64], qh[:, :, 32 * n:32 * n + 32]
            base = 128 * n
            q[:, :, base:base + 32] = ((L[:, :, :32] & 15) | (((H >> 0) & 3) << 4)) - 32
            q[:, :, base + 32:base + 64] = ((L[:, :, 32:] & 15) | (((H >> 2) & 3) << 4)) - 32
            q[:, :, base + 64:base + 96] = ((L[:, :, :32] >> 4) | (((H >> 4) & 3) << 4)) - 32
            q[:, :, base + 96:base + 128] = ((L[:, :, 32:] >> 4) | (((H >> 6) & 3) << 4)) - 32
    elif t == 23:
        qs = b[:, :, 8:]
        for ib in range(8):
            s = qs[:, :, 16 * ib:16 * ib + 16]
            q[:, :, 32 * ib:32 * ib + 16] = KVALUES[s & 15]
            q[:, :, 32 * ib + 16:32 * ib + 32] = KVALUES[s >> 4]
    return q.reshape(rows, nblk * blk)


def _bytes_i8(w: np.ndarray) -> np.ndarray:
    """uint32 words (any shape) -> their 4 bytes as signed int8 values, shape (..., 4)."""
    return np.ascontiguousarray(w.astype(np.uint32)).view(np.uint8).reshape(*w.shape, 4).view(np.int8).astype(np.int32)


def _pack(b: np.ndarray) -> np.ndarray:
    """(..., 4) byte values -> uint32 words."""
    b = (b.astype(np.int64) & 0xFF).astype(np.uint32)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _bmap(w, f):
    """apply f to each byte (0..255) of uint32 words, repack."""
    b = np.ascontiguousarray(w.astype(np.uint32)).view(np.uint8).reshape(*w.shape, 4).astype(np.int32)
    return _pack(f(b))


def model_afrag(t, q, meta_win, u, tig):
    """gemm.cu's G<T>::afrag for 32 lanes: q[c][rh] (32,) uint32 words, meta_win[rh] (32, MWS)
    bytes of each lane's rows' meta windows (at the unit's offset). Returns a[k][reg] (32,)."""
    lo = lambda v: v & np.uint32(0x0F0F0F0F)
    hi = lambda v: (v >> np.uint32(4)) & np.uint32(0x0F0F0F0F)
    NK = GT[t][6]

    def u32(mw, off):
        return (mw[:, off].astype(np.uint32) | (mw[:, off + 1].astype(np.uint32) << 8) |
                (mw[:, off + 2].astype(np.uint32) << 16) | (mw[:, off + 3].astype(np.uint32) << 24))

    def q5(v, h, i, hsel):   # TQ5_0::q5: bits 16 hsel + 4 i .. +3 of h onto bit 4 of each byte
        bits = (h[:, None] >> (16 * hsel + 4 * i[:, None] + np.arange(4)[None, :]).astype(np.uint32)) & 1
        add = _pack(bits.astype(np.int64) << 4)
        return (hi(v) if hsel else lo(v)) | add
    a = [[None] * 4 for _ in range(NK)]
    if t in (2, 3):
        for k in range(2):
            a[k] = [lo(q[k][0]), lo(q[k][1]), hi(q[k][0]), hi(q[k][1])]
    elif t in (6, 7):
        for k in range(2):
            if t == 6:
                h0, h1 = u32(meta_win[0], 2 + 6 * k), u32(meta_win[1], 2 + 6 * k)
            else:
                h0, h1 = u32(meta_win[0], 4 + 8 * k), u32(meta_win[1], 4 + 8 * k)
            a[k] = [q5(q[k][0], h0, tig, 0), q5(q[k][1], h1, tig, 0), q5(q[k][0], h0, tig, 1), q5(q[k][1], h1, tig, 1)]
    elif t == 8:
        for k in range(2):
            a[k] = [q[2 * k][0], q[2 * k][1], q[2 * k + 1][0], q[2 * k + 1][1]]
    elif t == 12:
        a[0] = [lo(q[0][0]), lo(q[0][1]), lo(q[1][0]), lo(q[1][1])]
        a[1] = [hi(q[0][0]), hi(q[0][1]), hi(q[1][0]), hi(q[1][1])]
    elif t == 13:
        j = u & 3
        for k in range(2):
            sh = np.uint32(2 * j + k)
            bit = lambda h: ((h >> sh) & np.uint32(0x01010101)) << np.uint32(4)
            f = hi if k else lo
            a[k] = [f(q[0][0]) | bit(q[2][0]), f(q[0][1]) | bit(q[2][1]), f(q[1][0]) | bit(q[3][0]), f(q[1][1]) | bit(q[3][1])]
    elif t == 14:
        for g in range(4):
            def q6(lq, h, g=g):
                lq_b = _bytes_i8(lq) & 0xFF
                h_b = _bytes_i8(h) & 0xFF
                return _pack((((lq_b >> (4 * (g >> 1))) & 15) | (((h_b >> (2 * g)) & 3) << 4)) - 32)
            a[g] = [q6(q[g & 1][0], q[2][0]), q6(q[g & 1][1], q[2][1])]
    elif t == 23:
        kv = lambda v: _bmap(v, lambda b: KVALUES[b & 15])
        for k in range(2):
            a[k] = [kv(q[k][0]), kv(q[k][1]), kv(q[k][0] >> np.uint32(4)), kv(q[k][1] >> np.uint32(4))]
    return a


def model_mma(a_regs, b_regs, k16: bool):
    """PTX ISA fragment layouts: A (16 x K), B (K x 8), C (16 x 8), K = 32 (k16: 16);
    each A/B register element is written exactly once. Returns d[e] (32,) per lane."""
    lanes = np.arange(32)
    gid, tig = lanes >> 2, lanes & 3
    KK = 16 if k16 else 32
    A = np.full((16, KK), -999, np.int64)
    B = np.full((KK, 8), -999, np.int64)
    # A: reg 0 row gid k 4tig+i; reg 1 row gid+8; (k32) reg 2 row gid k 16+4tig+i; reg 3 row gid+8
    for r, reg in enumerate(a_regs):
        row = gid + (8 if r & 1 else 0)
        kb = 4 * tig + (16 if r >= 2 else 0)
        vals = _bytes_i8(reg)
        for i in range(4):
            assert np.all(A[row, kb + i] == -999), "A element written twice"
            A[row, kb + i] = vals[:, i]
    for r, reg in enumerate(b_regs):
        kb = 4 * tig + 16 * r
        vals = _bytes_i8(reg)
        for i in range(4):
            assert np.all(B[kb + i, gid] == -999), "B element written twice"
            B[kb + i, gid] = vals[:, i]
    assert (A != -999).all() and (B != -999).all(), "fragment element never written"
    D = A @ B
    return [D[gid + (8 if e >= 2 else 0), 2 * tig + (e & 1)] for e in range(4)]


def model_ldsm(smem: np.ndarray, addr: np.ndarray, n: int):
    """ldmatrix .x{n}: lane L gives row L&7 of matrix L>>3 (16 bytes at addr[L]); lane L gets
    in register j the 4 bytes 4 (L&3).. of row L>>2 of matrix j."""
    lanes = np.arange(32)
    out = []
    for j in range(n):
        src = addr[8 * j + (lanes >> 2)] + 4 * (lanes & 3)
        assert np.all(addr[8 * j:8 * j + 8] % 16 == 0), "ldmatrix row address not 16-byte aligned"
        w = smem[src[:, None] + np.arange(4)[None, :]]
        out.append(_pack(w))
    return out


def model_stage(t, u, bulk, meta, xq, xs, N, K, nb, ob, cb, BM, BN, glu, TM):
    """produce(): the stage's bytes (bulk, activations, scales, meta windows) as numpy."""
    NCH, WBS, MW, MCP, MWS, SB, NK = GT[t]
    nblk = K // TYPES[t][1]
    bl, ml = bulk.ravel(), meta.ravel()
    mrs = nblk * (TYPES[t][2] - TYPES[t][4])
    sw = np.zeros(BM * WBS, np.uint8)
    sx = np.zeros(BN * 80, np.uint8)
    ss = np.zeros(BN * 8 * SB, np.uint8)
    sm = np.zeros(BM * MWS, np.uint8)
    brs = nblk * TYPES[t][4]
    rows = []
    for r in range(BM):
        wr = weight_row_of(r, ob, N, glu, TM)
        rows.append(wr)
        for c in range(NCH):
            src = wr * brs + chunk(t, u, c)
            assert src % 16 == 0 and src + 16 <= bl.size
            sw[r * WBS + 16 * c:r * WBS + 16 * c + 16] = bl[src:src + 16]
        ab = wr * mrs + moff(t, u)
        start = ab & ~(MCP - 1)
        for c in range(MW // MCP):
            n = MCP
            if t == 14 and c == MW // MCP - 1:
                n = 4 if ab & 3 else 2
            assert (start + MCP * c) % MCP == 0 and start + MCP * c + n <= ml.size, "meta read out of bounds"
            sm[r * MWS + MCP * c:r * MWS + MCP * c + n] = ml[start + MCP * c:start + MCP * c + n]
        off = ab & 3 if t == 14 else 0
        assert off + META_NEED[t] <= MWS
        assert np.array_equal(sm[r * MWS + off:r * MWS + off + META_NEED[t]], ml[ab:ab + META_NEED[t]]), \
            "meta window does not hold the unit's meta bytes"
    xsb = xs.view(np.uint8).ravel()
    for col in range(BN):
        b = min(cb + col, nb - 1)
        for g in range(4):
            src = b * K + goff(t, u, g)
            sx[col * 80 + 16 * g:col * 80 + 16 * g + 16] = xq.ravel().view(np.uint8)[src:src + 16]
        s0 = (b * (K // 32) + goff(t, u, 0) // 32) * 8
        assert s0 % 16 == 0
        ss[col * 8 * SB:(col + 1) * 8 * SB] = xsb[s0:s0 + 8 * SB]
    return sw, sx, ss, sm, rows


def weight_row_of(r, ob, N, glu, TM):
    if not glu:
        return min(ob + r, N - 1)
    wm, mi, i = r // (TM * 16), (r // 16) % TM, r % 16
    o = ob + wm * (TM // 2) * 16 + (mi % (TM // 2)) * 16 + i
    return min(o, N - 1) + (N if mi >= TM // 2 else 0)


def selftest_type(t, rng, cfg, glu=False):
    """Every (row, column, unit, k-chunk) integer sum of one block, as gemm.cu's lanes would
    compute it, against the reference from GGUF semantics. Returns the number of sums checked."""
    WM, WN, TM, TN = cfg["GM_WM"], cfg["GM_WN"], cfg["GM_TM"], cfg["GM_TN"]
    BM, BN = WM * TM * 16, WN * TN * 8
    K = 768
    N = 23 if glu else 40          # partial tiles: rows clamp
    nb = BN - 5                    # columns clamp
    rows_w = 2 * N if glu else N
    bulk, meta, qv, xq, xs = model_inputs(t, rows_w, K, nb, rng)
    NCH, WBS, MW, MCP, MWS, SB, NK = GT[t]
    k16 = NK == 4
    lanes = np.arange(32)
    gid, tig, lr, lm = lanes >> 2, lanes & 3, lanes & 7, lanes >> 3
    nu = K // 64
    checked = 0
    for ob in ((0, BM // 2) if glu else (0, BM)):
        if ob >= N:
            continue
        for u in range(nu):
            sw, sx, ss, sm, rows = model_stage(t, u, bulk, meta, xq, xs, N, K, nb, ob, 0, BM, BN, glu, TM)
            for wm in range(WM):
                for wn in range(WN):
                    for mi in range(TM):
                        r0 = (wm * TM + mi) * 16
                        q = [[None, None] for _ in range(NCH)]
                        for c in range(0, NCH - 1, 2):
                            r4 = model_ldsm(sw, (r0 + 8 * (lm & 1) + lr) * WBS + 16 * (c + (lm >> 1)), 4)
                            q[c][0], q[c][1], q[c + 1][0], q[c + 1][1] = r4
                        if NCH % 2:
                            r2 = model_ldsm(sw, (r0 + 8 * (lm & 1) + lr) * WBS + 16 * (NCH - 1), 2)
                            q[NCH - 1][0], q[NCH - 1][1] = r2
                        mw = []
                        for rh in range(2):
                            rr = r0 + gid + 8 * rh
                            off = np.array([(rows[x] * (K // TYPES[t][1] * (TYPES[t][2] - TYPES[t][4])) + moff(t, u)) & 3
                                            if k16 else 0 for x in rr])
                            mw.append(np.stack([sm[x * MWS + o:x * MWS + o + META_NEED[t]] for x, o in zip(rr, off)]))
                        a = model_afrag(t, q, mw, u, tig)
                        for ni in range(TN):
                            c0 = (wn * TN + ni) * 8
                            xb = model_ldsm(sx, (c0 + lr) * 80 + 16 * lm, 4)
                            for k in range(NK):
                                breg = [xb[k]] if k16 else [xb[2 * k], xb[2 * k + 1]]
                                dvals = model_mma(a[k], breg, k16)
                                for e in range(4):
                                    row_s = r0 + gid + 8 * (e >> 1)
                                    col = c0 + 2 * tig + (e & 1)
                                    for L in range(32):
                                        wr, cc = rows[row_s[L]], col[L]
                                        if cc >= nb:
                                            continue
                                        if k16:
                                            el = goff(t, u, k) + np.arange(16)
                                        else:
                                            el = 64 * u + 32 * k + np.arange(32)
                                        ref = int((qv[wr, el].astype(np.int64) * xq[cc, el]).sum())
                                        if int(dvals[e][L]) != ref:
                                            raise AssertionError(f"{TYPES[t][0]} u={u} row={wr} col={cc} k={k}: "
                                                                 f"model {int(dvals[e][L])} != ref {ref}")
                                        checked += 1
                            # the scales each lane reads for its columns 2tig, 2tig+1
                            for cc in range(2):
                                col = c0 + 2 * tig + cc
                                ent = ss.view(Q8_SCALE).reshape(BN, SB)[col]
                                for g in range(4):
                                    e = g if k16 else g >> 1
                                    b = np.minimum(col, nb - 1)
                                    want = xs[b, goff(t, u, g) // 32]
                                    assert np.array_equal(ent[:, e]["d"], want["d"]) and np.array_equal(ent[:, e]["s"], want["s"])
    return checked


def selftest_order(rng):
    """mv_q8's lane order + butterfly == gemm.cu's bit-reversed slots + stack, bit for bit."""
    n = 0
    for nu in (1, 5, 12, 31, 32, 33, 40, 64, 224, 448):
        for _ in range(20):
            c = (rng.standard_normal(nu) * np.exp2(rng.integers(-20, 20, nu))).astype(np.float32)
            P = np.zeros(32, np.float32)
            for lane in range(32):
                for u in range(lane, nu, 32):
                    P[lane] = np.float32(P[lane] + c[u])
            v = P.copy()
            for o in (16, 8, 4, 2, 1):
                v = (v + v[np.arange(32) ^ o]).astype(np.float32)
            mv = v[0]
            for wk in (1, 2, 4, 8, 16):
                res = gemm_order(c, nu, wk)
                assert np.float32(mv).view(np.uint32) == np.float32(res).view(np.uint32), (nu, wk, mv, res)
                n += 1
    # the producer's walk stages each group's units in its consumer's order, each unit once
    for nu in (1, 3, 7, 12, 32, 40, 224):
        for wk in (1, 2, 4, 8, 16):
            lv = 5 - (wk.bit_length() - 1)
            seen = []
            for k in range(wk):
                want = [u for j in range(1 << lv) for u in range(slot_of(k, j, wk), nu, 32)]
                got, pj, pu = [], 0, k
                while pu >= nu and pj < (1 << lv):
                    pj += 1
                    pu = slot_of(k, pj, wk) if pj < (1 << lv) else 0
                while pj < (1 << lv):
                    got.append(pu)
                    pu += 32
                    while pu >= nu and pj < (1 << lv):
                        pj += 1
                        pu = slot_of(k, pj, wk) if pj < (1 << lv) else 0
                assert got == want, (nu, wk, k)
                assert len(got) <= -(-nu // wk)   # fits in the block's step count
                seen += got
            assert sorted(seen) == list(range(nu)), (nu, wk)
    return n


def slot_of(k: int, j: int, wk: int) -> int:
    """gemm.cu's slot(k, j): leaf j (tree order) of group k."""
    lv = 5 - (wk.bit_length() - 1)
    return k + wk * (int(f"{j:0{lv}b}"[::-1], 2) if lv else 0)


def meet_roots(roots: list, wk: int) -> np.float32:
    """The wk warp groups' roots meeting in the butterfly's last log2(wk) levels (offsets
    wk / 2 .. 1), as gemm.cu / mvt.cu add them through shared memory."""
    off = wk // 2
    while off:
        for k in range(off):
            roots[k] = np.float32(roots[k] + roots[k + off])
        off //= 2
    return roots[0]


def gemm_order(c: np.ndarray, nu: int, wk: int) -> np.float32:
    """gemm.cu's reduction of unit contributions c (float32) with GM_WK = wk groups: each
    group folds its slots in leaf order, merging finished slots as a binary counter; then
    the groups' roots meet pairwise, offsets wk/2 .. 1."""
    lv = 5 - (wk.bit_length() - 1)
    roots = []
    for k in range(wk):
        L = [np.float32(0)] * 5
        root = None
        for j in range(1 << lv):
            p = np.float32(0)
            for u in range(slot_of(k, j, wk), nu, 32):
                p = np.float32(p + c[u])
            tz = (~j & (j + 1)).bit_length() - 1   # trailing ones of j
            v = p
            for lvl in range(min(tz, lv)):
                v = np.float32(L[lvl] + v)
            if tz >= lv:
                root = v
            else:
                L[tz] = v
        roots.append(root)
    return meet_roots(roots, wk)


def selftest_epilogue():
    """Every output (row < N, col < nb) is written by exactly one thread of one block, and for
    _glu that thread's gate and up partials come from weight rows n and N + n."""
    for cfg in (GEMM_DEFAULT, GEMM_ALT):
        WM, WN, TM, TN = cfg["GM_WM"], cfg["GM_WN"], cfg["GM_TM"], cfg["GM_TN"]
        BM, BN = WM * TM * 16, WN * TN * 8
        for glu in (False, True):
            N, nb = 77, 37
            obm = BM // 2 if glu else BM
            hits = np.zeros((N, nb), np.int32)
            TMO = TM // 2 if glu else TM
            for bx in range((N + obm - 1) // obm):
                for by in range((nb + BN - 1) // BN):
                    ob, cb = bx * obm, by * BN
                    for warp in range(WM * WN):
                        wm, wn = warp // WN, warp % WN
                        for lane in range(32):
                            gid, tig = lane >> 2, lane & 3
                            for mi in range(TMO):
                                for ni in range(TN):
                                    for e in range(4):
                                        row = ob + (wm * TMO + mi) * 16 + gid + 8 * (e >> 1)
                                        col = cb + (wn * TN + ni) * 8 + 2 * tig + (e & 1)
                                        if row >= N or col >= nb:
                                            continue
                                        hits[row, col] += 1
                                        # smem row of this thread's gate (and up) partial
                                        r_g = (wm * TM + mi) * 16 + gid + 8 * (e >> 1)
                                        assert weight_row_of(r_g, ob, N, glu, TM) == row
                                        if glu:
                                            r_u = (wm * TM + mi + TMO) * 16 + gid + 8 * (e >> 1)
                                            assert weight_row_of(r_u, ob, N, glu, TM) == N + row
            assert (hits == 1).all(), (cfg, glu)


def selftest(types) -> int:
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    n = selftest_order(rng)
    print(f"PASS  slot order: bit-reversed slots + 5-level stack == lane order + butterfly "
          f"({n} random reductions, bit-exact); producer walk == consumer walk", flush=True)
    selftest_epilogue()
    print("PASS  epilogue: every output written once; _glu gate/up rows pair up", flush=True)
    cfg_small = {"GM_WM": 2, "GM_WN": 1, "GM_TM": 2, "GM_TN": 2}
    for t in types:
        n1 = selftest_type(t, rng, cfg_small)
        n2 = selftest_type(t, rng, {"GM_WM": 1, "GM_WN": 1, "GM_TM": 2, "GM_TN": 1}, glu=True)
        print(f"PASS  {TYPES[t][0]:6s} staging, ldmatrix, unpack, mma fragments, C layout: "
              f"{n1 + n2} integer sums equal GGUF-semantics references", flush=True)
    print(f"selftest done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--types", default=",".join(v[0] for v in TYPES.values()))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-legacy", action="store_true")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--configs", default="",
                    help="gemm configs to time, 'WM,WN,TM,TN,WK,STAGES[,LREG[,MINB]];...' (default: TIME_CFGS; "
                         "LREG and MINB default to gemm.cu's 1 and 2: give MINB 1 for 512-thread blocks)")
    ap.add_argument("--shapes", default="", help="timing shapes whose name contains one of these (comma list)")
    ap.add_argument("--nbs", default="", help="timing nb values (comma list)")
    ap.add_argument("--no-checks", action="store_true", help="timing only")
    ap.add_argument("--decode", action="store_true",
                    help="also time nb = 1 mv_q8 now vs the pre-split matvec.cu on the timing shapes")
    args = ap.parse_args()
    types = [NAME2T[n.strip().upper()] for n in args.types.split(",") if n.strip()]
    if args.selftest:
        return selftest(types)

    cfgs = [parse_cfg(c) for c in (args.configs.split(";") if args.configs else TIME_CFGS) if c.strip()]
    global TIME_SHAPES, TIME_NBS
    if args.shapes:
        keys = [k.strip() for k in args.shapes.split(",")]
        TIME_SHAPES = tuple(sh for sh in TIME_SHAPES if any(k in sh[0] for k in keys))
    if args.nbs:
        TIME_NBS = tuple(int(v) for v in args.nbs.split(","))
    jobs = plan_modules(types, timing=not args.no_timing or args.decode, cfgs=cfgs,
                        checks=not args.no_checks)
    if args.no_legacy:
        jobs = [j for j in jobs if j[0] != "legacy-matvec.cu"]
    cubins = compile_all(jobs, args.jobs)
    if args.compile_only:
        for (src, defs), cub in sorted(cubins.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            print(f"ok  {src:18s} {' '.join(f'{k}={v}' for k, v in defs)}  ({len(cub)} bytes)")
        print(f"{len(cubins)} passed, 0 failed")
        return 0

    jsonl = jsonl_writer("gemm-check.jsonl")

    d = Dev(cubins)
    props = d.dev.properties
    src_hash = hashlib.sha256(b"".join((KDIR / f).read_bytes() for f in
                                       ("gemm.cu", "matvec.cu", "qtypes.cuh", "common.cuh", "q8.cuh"))).hexdigest()[:16]
    jsonl({"kind": "run", "device": d.dev.name, "sms": props.multiprocessor_count, "kernels_sha": src_hash,
           "gemm_default": GEMM_DEFAULT, "gemm_alt": GEMM_ALT, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    print(f"device {d.dev.name}, {props.multiprocessor_count} SMs, kernels {src_hash}", flush=True)
    tally = Tally(jsonl)
    rng = np.random.default_rng(1234)
    t0 = time.perf_counter()
    for t in ([] if args.no_checks else types):
        ccfgs = [GEMM_DEFAULT] + ([GEMM_ALT] if t in ALT_TYPES else [])
        for (N, K) in CHECK_SHAPES:
            for nb in (NBS if (N, K) == CHECK_SHAPES[0] else SHAPE_B_NBS):
                check_case(d, tally, t, N, K, nb, rng, ccfgs, legacy=not args.no_legacy)
    if 12 in types and not args.no_checks:
        canary_case(d, tally, rng)
    print(f"checks done in {time.perf_counter() - t0:.1f} s", flush=True)
    if not args.no_timing:
        timing(d, tally, types, args.reps, rng, jsonl, cfgs)
    if args.decode:
        decode_timing(d, tally, types, args.reps, rng, jsonl)
    print(f"\n{tally.ok} passed, {tally.bad} failed")
    jsonl({"kind": "summary", "passed": tally.ok, "failed": tally.bad})
    return 1 if tally.bad else 0


if __name__ == "__main__":
    sys.exit(main())
