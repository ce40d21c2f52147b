"""Quantized matrix products on the tensor cores for many rows (kernels/gemm.cu), bit-identical
to the matvec (kernels/matvec.cu's mv_q8 / mv_q8_glu) for every row.

    gemm(g, w, y, xq=xq, xs=xs, nb=nb)                 # y[b, :] = W x[b, :], b < nb
        residual=r   y = r + W x (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = act(gate x) * (up x)

`w` is a memra.gpu.ops.matvec.Weight (the planes layout), xq/xs the q8 activations. A row's
float operations are the matvec's, in its order (gemm.cu's header gives the argument), so the
runner may send any batch to either kernel: the plan takes the GEMM from GEMM_MIN_ROWS rows,
where it is faster (research/2026-12-01-runner/gemm-check-*.jsonl). Tunables (-D): GM_WM,
GM_WN, GM_TM, GM_TN, GM_WK, GM_STAGES, GM_LREG, GM_MINB; built-in configurations per batch
size below (the H200 sweep's winners), a tuning table's GM_* laid over them.

The checks compare the GEMM's bits with the matvec's (the oracle of the exactness contract)
and both with the float64 reference (memra.gpu.ops.matvec.matvec_ref) at the matvec's TOL.
"""

from __future__ import annotations

import sys
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

KERNEL_FILE = "gemm.cu"
GEMM_MIN_ROWS = 16  # the plan runs the matvec below this many rows (the GEMM only breaks even at 8)
TYPES = (2, 3, 6, 7, 8, 12, 13, 14, 23)  # quantized types (float weights take the matvec's f32 family)
_KEYS = ("GM_WM", "GM_WN", "GM_TM", "GM_TN", "GM_WK", "GM_STAGES", "GM_LREG", "GM_MINB")
# per type: (WBS, SSB, MWS) of gemm.cu's stage-size formula
_SMEM = {2: (48, 16, 4), 3: (48, 16, 8), 6: (48, 16, 12), 7: (48, 16, 16), 8: (80, 16, 4),
         12: (48, 16, 16), 13: (80, 16, 16), 14: (48, 32, 20), 23: (48, 16, 8)}
_NULL = np.uint64(0)


def _cfg(text: str) -> dict:
    return dict(zip(_KEYS, (int(v) for v in text.split(","))))


# the built-in configuration by batch size, from the H200 h200-gemm campaign on gemm.cu variant
# 7 (research/tune/h200-gemm-nvidia-h200.jsonl: 4 models' shapes at 16 / 32 / 64 / 128 rows):
# at 16 rows 8 warp groups of one warp won every shape; up to 64 the 32 x 32 tile with 4 warp
# groups (32 outputs a thread) has the smallest mean loss against each shape's best (1.14x at
# 64: no single one wins there; the table's entries do); prefill chunks (128) the 64 x 32 tile
# with 2 warp groups
CONFIGS = ((16, _cfg("1,1,2,2,8,3,1,2")), (64, _cfg("1,1,2,4,4,3,1,2")), (1 << 30, _cfg("2,1,2,4,2,3,1,2")))


def default_config(nb: int) -> dict:
    for top, cfg in CONFIGS:
        if nb <= top:
            return dict(cfg)
    raise AssertionError("unreachable")


def launch_config(nb: int, config: dict | None = None) -> dict:
    """The GM_* tunables of a launch over nb rows: default_config(nb) with `config`'s GM_*
    (a tuning table's entry, a tune job's, kernel-check's) laid over it."""
    return {**default_config(nb), **{k: int(v) for k, v in (config or {}).items() if k.startswith("GM_")}}


def launch_shape(ggml_type: int, config: dict, N: int, nb: int, glu: bool):
    """(grid, block, dynamic shared bytes) of a launch (gemm.cu's launch contract)."""
    c = config
    BM, BN = c["GM_WM"] * c["GM_TM"] * 16, c["GM_WN"] * c["GM_TN"] * 8
    wk = c["GM_WK"]
    nthr = 32 * c["GM_WM"] * c["GM_WN"] * wk
    if wk not in (1, 2, 4, 8, 16) or c["GM_STAGES"] < 2 or (glu and c["GM_TM"] % 2) or \
            min(c["GM_WM"], c["GM_WN"], c["GM_TM"], c["GM_TN"], c["GM_MINB"]) < 1 or \
            not 0 <= c["GM_LREG"] <= 5 or nthr > 1024:
        raise MemraError(f"gemm: bad configuration {c} (GM_WK a power of two <= 16, GM_STAGES >= 2, "
                         f"GM_TM even for glu, GM_LREG in 0..5, at most 1024 threads = 32 * GM_WM * "
                         f"GM_WN * GM_WK)")
    obm = BM // 2 if glu else BM
    wbs, ssb, mws = _SMEM[ggml_type]
    stage = (BM * wbs + BN * 80 + BN * ssb + BM * mws + 15) // 16 * 16
    lv = 5 - (wk.bit_length() - 1)
    lsm = max(0, lv - c["GM_LREG"]) * (c["GM_TM"] * c["GM_TN"] * 4) * nthr * 4
    smem = max(c["GM_STAGES"] * wk * stage + lsm, (wk * BM * BN * 4) if wk > 1 else 0)
    return ((N + obm - 1) // obm, (nb + BN - 1) // BN), (nthr,), smem


def gemm(g, w, y, *, xq, xs, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
         canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb on the q8 activations xq/xs. config: GM_* tunables laid
    over default_config(nb) (a tuning table's entry, or kernel-check's)."""
    t = w.ggml_type
    if t not in _SMEM:
        raise MemraError(f"gemm: no tensor-core kernel for {MV.TYPES[t][0]} weights (quantized types only)")
    MV.check_glu("gemm", glu, w.rows)
    N = w.rows // 2 if glu else w.rows
    K = w.K
    if xq.dtype != np.int8 or xs.dtype != Q8_SCALE or xq.size < nb * K or xs.size < nb * K // 32:
        raise MemraError("gemm: xq/xs must be int8 / Q8_SCALE with nb rows of K")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and residual.size < nb * N):
        raise MemraError(f"gemm: y (and residual) must be f32 with >= {nb}x{N} values")
    cfg = launch_config(nb, config)
    grid, block, smem = launch_shape(t, cfg, N, nb, bool(glu))
    k = g.module(KERNEL_FILE, MV.type_defines(t, cfg, canary)).kernel("gemm_q8_glu" if glu else "gemm_q8")
    g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, residual if residual is not None else _NULL,
                              np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu])), shmem=smem, pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

_CHECK_NB = (9, 33, 64, 130)  # every built-in configuration, partial batch tiles
_CHECK_N, _CHECK_K = 200, 2560  # nu = 40 units a row: uneven slots


def compile_variants() -> list[tuple[str, dict]]:
    out = []
    for t in TYPES:
        for _, cfg in CONFIGS:
            out.append((KERNEL_FILE, MV.type_defines(t, cfg)))
    out.append((KERNEL_FILE, MV.type_defines(12, default_config(64), canary=1)))
    return out


def against_matvec(g, rng, name: str, w, wf, nb: int, glu: str | None, alias: bool, config=None,
                   canary: int = 0, launch=None):
    """A tensor-core kernel (`launch`: gemm, or memra.gpu.ops.mvt's mvt — the same arguments)
    on weight `w` (wf: its float64 dequantization) against the matvec's bits (same q8
    activations, y poisoned or holding the residual it aliases) and the float64 reference."""
    from memra.gpu.compare import Outcome, compare

    launch = launch or gemm
    N, K = (w.rows // 2 if glu else w.rows), w.K
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
    res = rng.standard_normal((nb, N)).astype(np.float32)
    outs = []
    for kind in ("matvec", "kernel"):
        y = g.to_device(res) if alias else g.empty((nb, N), np.float32)
        if not alias:
            y.poison()
        if kind == "matvec":
            MV.matvec(g, w, y, xq=xq, xs=xs, nb=nb, residual=y if alias else None, glu=glu)
        else:
            launch(g, w, y, xq=xq, xs=xs, nb=nb, residual=y if alias else None, glu=glu, config=config, canary=canary)
        g.sync()
        outs.append(y.numpy())
    q, s = quantize_q8_ref(x)
    xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
    o = compare(name, outs[1], MV.matvec_ref(wf, xv, res if alias else None, glu), MV.TOL)
    if not o.ok:
        return o
    bad = int(np.count_nonzero(outs[0].view(np.uint32) != outs[1].view(np.uint32)))
    if bad:
        return Outcome(name, False, f"{bad} of {outs[0].size} values differ from the matvec's bits", o.err)
    return Outcome(name, True, o.detail + "; = matvec bit for bit", o.err)


def check_case(g, rng, t: int, nb: int, glu: str | None, alias: bool, config=None, canary: int = 0, N=_CHECK_N,
               K=_CHECK_K, launch=None, label: str = "gemm"):
    """A fresh random weight of type t, N x K, through against_matvec."""
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = (f"{label} {MV.TYPES[t][0]} nb={nb} {N}x{K}{' glu-' + glu if glu else ''}{' +res(alias y)' if alias else ''}"
            f"{' ' + ','.join(str(v) for v in config.values()) if config else ''}")
    return against_matvec(g, rng, name, MV.upload_weight(g, raw, t), MV.dequant_rows(raw, t), nb, glu, alias,
                          config, canary, launch)


def checks(g, rng: np.random.Generator) -> Iterator:
    for t in TYPES:
        for nb in _CHECK_NB:
            glu = (None, "silu", "gelu", None)[_CHECK_NB.index(nb)]
            yield check_case(g, rng, t, nb, glu, alias=glu is None and nb == 130)
    # the K-quant and Q6_K shapes of an 8B layer's matvecs at decode batches
    for t, N, K, glu in ((12, 512, 4096, "silu"), (14, 256, 14336, None)):
        for nb in (16, 64):
            yield check_case(g, rng, t, nb, glu, alias=glu is None, N=N, K=K)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield check_case(g, rng, 12, 33, None, alias=False, canary=1)


# -- the tune hooks (memra/tune/measure.py) and the launch set's (memra.tune.launches) of a
# tensor-core matvec family: kernel "<name>" | "<name>_glu", variant "q8", shape {type, rows
# (2N for _glu: gate and up stacked), cols}, batch rows; config <the family's tunables> (laid
# over default_config(batch), as the plan's table entries are). gemm here (campaigns:
# tune/campaigns/h200-gemm*.toml) and mvt (memra.gpu.ops.mvt) share them: one Hooks each.

# Per (weight, batch, glu): the q8 activations, the matvec's output bits and the float64
# reference on them. A campaign measures the configurations of one shape and batch in a row
# (memra.tune.campaign orders jobs so); each of them is checked on these same inputs, so the
# float64 product (a 128256 x 4096 head at 64 rows: ~0.3 s on the host, the order of a job's
# whole budget) is computed once per shape and batch, not once per configuration.
_INPUTS: dict[tuple, tuple] = {}


class _TuneCase:
    """The shape's weight in the planes layout (random valid blocks, copies rotating past
    the L2: memra.gpu.ops.matvec's shape cache), nb rows of q8 activations; the family's
    launcher (gemm or mvt: `hooks`) runs the configuration."""

    def __init__(self, g, glu, t, rows, K, nb, cfg, rng, rotate_bytes, hooks=None):
        self.g, self.glu, self.t, self.nb, self.K = g, glu, t, nb, K
        self.hooks = hooks or HOOKS
        self.N = rows // 2 if glu else rows
        self.cfg = cfg
        self.ws, self.wf = MV._shape_weights(g, t, rows, K, rng, rotate_bytes)
        self.sets = len(self.ws)
        hit = _INPUTS.get((nb, glu))
        if hit is None or hit[0] is not self.ws[0]:  # the weight object itself: ids are reused
            _INPUTS.clear()  # one shape and batch at a time (the weight cache keeps one shape)
            hit = _INPUTS[(nb, glu)] = (self.ws[0], self._inputs(rng))
        self.xq, self.xs, self.ref, self.mv_bits = hit[1]
        self.y = g.empty((nb, self.N), np.float32)
        self.bytes = self.ws[0].nbytes + nb * (K + K // 32 * Q8_SCALE.itemsize + self.N * 4)

    def _inputs(self, rng):
        g, nb, K, act = self.g, self.nb, self.K, "silu" if self.glu else None
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        ym = g.empty((nb, self.N), np.float32)
        ym.poison()
        MV.matvec(g, self.ws[0], ym, xq=xq, xs=xs, nb=nb, glu=act)
        g.sync()
        q, s = quantize_q8_ref(x)
        xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
        return xq, xs, MV.matvec_ref(self.wf, xv, None, act), ym.numpy().view(np.uint32).copy()

    def launch(self, i: int) -> None:
        self.hooks.launcher()(self.g, self.ws[i % self.sets], self.y, xq=self.xq, xs=self.xs, nb=self.nb,
                      glu="silu" if self.glu else None, config=self.cfg)

    def check(self):
        """One launch on a poisoned y: the float64 reference at the matvec's TOL, then the
        matvec's bits on the same activations (the exactness contract: any configuration
        gives every row the matvec's bits)."""
        from memra.gpu.compare import compare

        self.y.poison()
        self.launch(0)
        self.g.sync()
        got = self.y.numpy()
        o = compare(self.hooks.name, got, self.ref, MV.TOL)
        if not o.ok:
            return False, o.err, o.detail
        bad = int(np.count_nonzero(got.view(np.uint32) != self.mv_bits))
        if bad:
            return False, o.err, f"{bad} of {got.size} values differ from the matvec's bits"
        return True, o.err, o.detail + "; = matvec bit for bit"


_LAUNCH_N = 259  # output rows checked of a larger weight: a partial last row tile


class Hooks:
    """A family's tune hooks (tune_case, is_builtin, tune_modules) and launch-set hooks
    (launch_cases, check_launch) from its module's launcher and configuration functions:
    name ("gemm" / "mvt": kernels name / name_glu, entries name_q8 / name_q8_glu, and the
    launcher module.<name>(g, w, y, xq=, xs=, nb=, glu=, config=), looked up at each launch),
    keys (its -D tunables), launch_config(nb, config), default_config(nb), shape_check(type,
    config, N, nb, glu) (raises for a configuration the launcher refuses), defines(type,
    config) (its module's -D defines)."""

    def __init__(self, name, module, kernel_file, keys, launch_config, default_config, shape_check, defines):
        self.name, self.module, self.kernel_file, self.keys = name, module, kernel_file, tuple(keys)
        self.launch_config, self.default_config = launch_config, default_config
        self.shape_check, self.defines = shape_check, defines

    def launcher(self):
        return getattr(self.module, self.name)

    @property
    def tune_variants(self) -> dict[str, tuple[str, ...]]:
        """The kernels tune_case measures and their variants (the module's TUNE_VARIANTS)."""
        return {self.name: ("q8",), self.name + "_glu": ("q8",)}

    def tune_args(self, kernel: str, variant: str, config: dict, shape: dict):
        """(type id, glu, N, K, nb, launch config) of a tune job, or MemraError: unknown
        kernel, variant, type or tunable, or a configuration the launcher refuses."""
        n = self.name
        if variant not in self.tune_variants.get(kernel, ()):
            raise MemraError(f"{n} tune: unknown kernel/variant {kernel}/{variant}")
        t = MV.type_id(shape["type"])
        if t not in TYPES:
            raise MemraError(f"{n} tune: {shape['type']} has no tensor-core kernel")
        bad = sorted(set(config or {}) - set(self.keys))
        if bad:
            raise MemraError(f"{n} tune: unknown tunables {bad} (known: {', '.join(self.keys)})")
        glu, rows, K, nb = kernel == n + "_glu", int(shape["rows"]), int(shape["cols"]), int(shape.get("batch", 1))
        if glu and rows % 2:
            raise MemraError(f"{n} tune: a {n}_glu weight stacks gate and up (an even row count, got {rows})")
        cfg = self.launch_config(nb, config)
        N = rows // 2 if glu else rows
        self.shape_check(t, cfg, N, nb, glu)  # a bad configuration fails here, before any compile
        return t, glu, N, K, nb, cfg

    def tune_case(self, g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
        t, glu, N, K, nb, cfg = self.tune_args(kernel, variant, config, shape)
        return _TuneCase(g, glu, t, int(shape["rows"]), K, nb, cfg, rng, rotate_bytes, self)

    def is_builtin(self, kernel: str, variant: str, config: dict, shape: dict) -> bool:
        """Whether a tune job's configuration is what the launcher runs at its batch without a table."""
        nb = int(shape.get("batch", 1))
        return self.launch_config(nb, config) == self.default_config(nb)

    def tune_modules(self, kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
        """The module a tune job loads (the job's type and launch configuration), for the
        campaign's parallel precompile; a configuration the launcher refuses raises, so it is
        never compiled (its job records why)."""
        t, _, _, _, _, cfg = self.tune_args(kernel, variant, config, shape)
        return [(self.kernel_file, self.defines(t, cfg))]

    def launch_cases(self, L, ctx) -> list[dict]:
        """A plan launch of the family's op (the q8 path in its row range): the module the
        launcher builds for its batch (default_config(nb) with the table's tunables laid over
        it), the exact batch, the K it loops over and whether the output aliases the residual."""
        t = MV.type_id(L.shape["type"])
        glu, nb, K = L.args.get("glu"), int(L.rows), int(L.shape["cols"])
        N = int(L.shape["rows"]) // (2 if glu else 1)
        cfg = self.launch_config(nb, L.config)
        res = bool(L.args.get("res"))
        return [{"file": self.kernel_file, "entry": f"{self.name}_q8_glu" if glu else f"{self.name}_q8",
                 "defines": self.defines(t, cfg), "bucket": nb, "tag": f"K{K}" + (" res=y" if res else ""),
                 "params": {"type": t, "N": N, "K": K, "nb": nb, "glu": glu, "res": res}}]

    def check_launch(self, g, rng, case):
        """The launch's module at its batch, K and residual aliasing, on a weight shared with
        the next cases of its shape (memra.gpu.ops.matvec's launch-set cache) and fresh
        activations: the matvec's bits (the exactness contract's oracle) and the float64
        reference."""
        p = case["params"]
        t, nb, K, glu, alias = p["type"], p["nb"], p["K"], p["glu"], p["res"]
        N = p["N"] if p["N"] <= 1024 else _LAUNCH_N
        cfg = {k: v for k, v in case["defines"].items() if k in self.keys}
        w, wf = MV._launch_weight(g, t, N, K, glu, rng)
        name = f"{case['entry']} {MV.TYPES[t][0]} nb={nb} {N}x{K}{' res=y' if alias else ''} {cfg}"
        return against_matvec(g, rng, name, w, wf, nb, glu, alias, cfg, launch=self.launcher())


HOOKS = Hooks("gemm", sys.modules[__name__], KERNEL_FILE, _KEYS, launch_config, default_config, launch_shape,
              MV.type_defines)
tune_case, is_builtin, tune_modules = HOOKS.tune_case, HOOKS.is_builtin, HOOKS.tune_modules
TUNE_VARIANTS = HOOKS.tune_variants
launch_cases, check_launch = HOOKS.launch_cases, HOOKS.check_launch
