"""launch: the launch and host contract of experiments/tile_land/gemm_tile.cu (later kernels/gemm_tile.cu).

    default_config(ggml_type) -> dict of -D tunables (the best timed exact-chain configuration of
                                 research/2026-12-02-session16/ab/, 512 rows, H200)
    defines(ggml_type, config) -> the NVRTC macro dict (MV_TYPE + the config)
    smem_bytes(ggml_type, config) -> the dynamic shared memory a block needs (= the kernel's SMEM_TOTAL)
    check(ggml_type, config, N, K, nb, glu) -> raises ValueError where the host contract is broken
    launch_shape(ggml_type, config, N, nb, glu) -> (grid, block, smem)

N is the number of OUTPUT rows (glu: W holds 2N rows [gate; up]), nb the activation rows (any >= 1).
Entry points (both): (bulk, meta, xq, xs, y, res, N, K, nb, act) — "gemm_tile" and "gemm_tile_glu".
No dependencies beyond the standard library.
"""
from __future__ import annotations

Q4_0, Q8_0, Q4_K, Q6_K = 2, 8, 12, 14
TYPES = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
# per type: raw tile row stride WS, staged meta bytes a row MS, float-area bytes per weight row (RS) and
# per activation column (CS), K multiple
GEOM = {
    Q4_0: dict(WS=144, MS=16, RS=64, CS=32, KMUL=256),
    Q8_0: dict(WS=272, MS=16, RS=64, CS=32, KMUL=256),
    Q4_K: dict(WS=144, MS=16, RS=96, CS=64, KMUL=256),
    Q6_K: dict(WS=208, MS=20, RS=68, CS=32, KMUL=512),
}
SMEM_MAX = 232448   # 227 KiB: the sm_90 opt-in limit a block
# best timed configurations (research/2026-12-02-session16/ab/*.txt, 512 rows, exact chain):
#   Q4_K gate + up 2 x 14336 x 4096: "t2 F1 2,4,2 pf2" 740.7 us (F1 pf1 spilled); 4096 x 14336 350.8
#   Q4_0: "2,4,2 pf2" gate + up 626.1, 4096 x 14336 312.3, 4096 x 4096 95.1 (pf1 94.9)
#   Q8_0: "2,4,2 pf2" gate + up 697.0, 4096 x 14336 333.4 (pf1 330.9), 4096 x 4096 100.1 (pf1 99.9)
#   Q6_K: "q6 F1 2,4,2" (GT_PF 1) 4096 x 14336 465.7, 4096 x 4096 136.4
_DEFAULTS = {
    Q4_K: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q4_0: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q8_0: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q6_K: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=1, GT_MINB=1),
}


def default_config(ggml_type: int) -> dict:
    if ggml_type not in _DEFAULTS:
        raise ValueError(f"gemm_tile: ggml type {ggml_type} not supported (2, 8, 12, 14)")
    return dict(_DEFAULTS[ggml_type])


def _cfg(ggml_type: int, config: dict | None) -> dict:
    c = default_config(ggml_type)
    c.update(config or {})
    return c


def defines(ggml_type: int, config: dict | None = None) -> dict:
    return {"MV_TYPE": ggml_type, **_cfg(ggml_type, config)}


def tile(ggml_type: int, config: dict | None = None) -> tuple[int, int, int]:
    """(BM weight rows, BN activation columns, NT threads) of a block."""
    c = _cfg(ggml_type, config)
    wm, wn = int(c["GT_WM"]), int(c["GT_WN"])
    return 64 * wm, 32 * wn, 32 * wm * wn


def smem_bytes(ggml_type: int, config: dict | None = None) -> int:
    """GT_STAGES (BM WS + BN 272 + BM MS + BN 64) + 2 (RS BM + CS BN)."""
    g = GEOM[ggml_type]
    c = _cfg(ggml_type, config)
    bm, bn, _ = tile(ggml_type, c)
    ns = int(c["GT_STAGES"])
    return ns * (bm * g["WS"] + bn * 272 + bm * g["MS"] + bn * 64) + 2 * (g["RS"] * bm + g["CS"] * bn)


def check_config(ggml_type: int, config: dict | None = None) -> None:
    """The kernel's static_asserts, on the host."""
    c = _cfg(ggml_type, config)
    bm, bn, nt = tile(ggml_type, c)
    wn, ns, pf = int(c["GT_WN"]), int(c["GT_STAGES"]), int(c.get("GT_PF", 1))
    cpr = (GEOM[ggml_type]["WS"] - 16) // 16
    bad = []
    if wn < 2 or ns < 2 or nt < bm or nt < bn:
        bad.append("GT_WN >= 2, GT_STAGES >= 2")
    if (bm * cpr) % nt or cpr % max(1, bm * cpr // nt) or (bn * 16) % nt or 16 % max(1, bn * 16 // nt) \
            or (bn * 4) % nt or bn * 4 // nt < 1 or 8 % (nt // bm) or 8 % (nt // bn):
        bad.append("loader / scalar-pass shares")
    if not (0 <= pf <= (1 if ggml_type == Q6_K else 2)):
        bad.append("GT_PF")
    if smem_bytes(ggml_type, c) > SMEM_MAX:
        bad.append(f"shared memory {smem_bytes(ggml_type, c)} > {SMEM_MAX}")
    if bad:
        raise ValueError(f"gemm_tile {TYPES[ggml_type]} {c}: " + "; ".join(bad))


def check(ggml_type: int, config: dict | None, N: int, K: int, nb: int, glu: bool) -> None:
    """The host contract: N % OBM == 0 (OBM = BM, glu BM / 2), K % 256 (Q6_K 512) == 0, nb >= 1, 32-bit offsets."""
    check_config(ggml_type, config)
    bm, bn, _ = tile(ggml_type, config)
    obm = bm // 2 if glu else bm
    kmul = GEOM[ggml_type]["KMUL"]
    bad = []
    if N <= 0 or N % obm:
        bad.append(f"N = {N} not a positive multiple of {obm}")
    if K <= 0 or K % kmul:
        bad.append(f"K = {K} not a positive multiple of {kmul}")
    if nb < 1:
        bad.append(f"nb = {nb} < 1")
    rows = 2 * N if glu else N
    bulk_row = K // 256 * (GEOM[ggml_type]["WS"] - 16)
    if nb * K >= 2 ** 32 or rows * bulk_row >= 2 ** 32 or nb * (K // 32) * 8 >= 2 ** 32:
        bad.append("32-bit element offsets overflow")
    if bad:
        raise ValueError(f"gemm_tile {TYPES[ggml_type]}{' glu' if glu else ''}: " + "; ".join(bad))


def launch_shape(ggml_type: int, config: dict | None, N: int, nb: int, glu: bool):
    """((N / OBM, ceil(nb / BN), 1), (NT, 1, 1), smem bytes). N = output rows."""
    check_config(ggml_type, config)
    bm, bn, nt = tile(ggml_type, config)
    obm = bm // 2 if glu else bm
    if N % obm or nb < 1:
        raise ValueError(f"gemm_tile: N = {N} must be a multiple of {obm}, nb >= 1")
    return (N // obm, -(-nb // bn), 1), (nt, 1, 1), smem_bytes(ggml_type, config)


if __name__ == "__main__":
    for t in (Q4_0, Q8_0, Q4_K, Q6_K):
        c = default_config(t)
        print(TYPES[t], c, "smem", smem_bytes(t, c), "8B glu:", launch_shape(t, c, 14336, 512, True),
              "4096x14336:", launch_shape(t, c, 4096, 512, False))
