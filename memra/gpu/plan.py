"""The launch plan: the one place that knows which kernels a model runs, with which shapes,
variants and configurations, in which order, on which buffers.

    spec = ModelSpec.from_gguf(gguf)                    # config + tensor types, no weights
    plan = Planner(spec, table, sms=132)                # fixed choices made once
    for L in plan.step(rows=64, decode=True): ...       # one decode step of 64 rows
    plan.step(rows=128, decode=False)                   # one prefill chunk of 128 token rows
    plan.weights()                                       # the device weights the launches read

Three things read the list: the runner executes it (memra.gpu.runner, one handler per
`op`), `memra tune` takes its jobs from it (memra.tune.campaign), and `memra profile` times
it launch by launch. Nothing else writes down a model's tensor layout or fusion rules.

A Launch is data: `op` names the runner's handler, `args` its operands (weight keys,
symbolic buffer names — x, h, t1, qkv, qr, ao, ff, ff2, logits — and flags), and
`kernel`/`variant`/`shape`/`rows`/`config` say what a tuning receipt would call it.

Exactness shapes the choices made here: a row's reduction order may depend on its shape
and on tunables shared by every row count, never on the batch. So the matvec and GEMM
configurations may differ per batch bucket (their row order depends on K only), MV_KSPLIT
is refused, and the norm, RoPE and attention tunables are looked up once (batch 1) and
used at every row count (they set a row's reduction order). Attention's heads per block
are the exception: they never change a head's bits, so from ATT_GROUP_ROWS rows a block
takes the whole GQA group (att_hpb_rows). With MEMRA_ATTN=hybrid a row's arithmetic is also
chosen by its kind, never by what runs beside it: prompt rows take attn_fa and the f16
tensor-core GEMM's order (memra.gpu.ops.gemm_f16, on the weights it supports; else
kernels/gemm_tile.cu's chain order where that supports the weight; MEMRA_PROMPT_GEMM=tile: the
chain order wherever it did before gemm_f16), generated rows attn_decode and mv_q8's order.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from memra.env import env_choice, env_int
from memra.errors import MemraError, UnsupportedModelError
from memra.gpu.ops import attention as ATT
from memra.gpu.ops import attn_fa as FA
from memra.gpu.ops import gemm as GEMM
from memra.gpu.ops import gemm_f16 as GF
from memra.gpu.ops import gemm_tile as GT
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import mvt as MVT
from memra.gpu.ops import norm as NORM
from memra.gpu.ops import qf as QF
from memra.gpu.ops import rope as ROPE
from memra.model.config import ModelConfig, read_config
from memra.tune import tables as TABLES
from memra.tune.receipts import shape_key, shape_of_key

log = logging.getLogger("memra.plan")

MAX_ROWS = 64        # decode rows per step (the largest CUDA-graph bucket)
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# row counts a prefill chunk's CUDA graph is captured at (a chunk of n rows replays the
# smallest that holds it, the rows past n padded: position -1, nothing read or written)
_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 320, 384, 448, 512)


def _prefill_chunk() -> int:
    """Token rows per prefill launch set: 512 (a 512-token prompt is one chunk: its GEMMs run
    each weight tile over 512 rows at once and its ~10 launches a layer are paid once);
    MEMRA_PREFILL_CHUNK (a rollback seam, read at import) sets 64..512, one of the buckets.
    A row's bits do not depend on it (chunk invariance)."""
    v = os.environ.get("MEMRA_PREFILL_CHUNK", "").strip()
    if not v:
        return 512
    if not v.isdigit() or int(v) < MAX_ROWS or int(v) not in _BUCKETS:
        raise MemraError(f"MEMRA_PREFILL_CHUNK must be one of {[b for b in _BUCKETS if b >= MAX_ROWS]}, got {v!r}")
    return int(v)


PREFILL_CHUNK = _prefill_chunk()
PREFILL_BUCKETS = tuple(b for b in _BUCKETS if b <= PREFILL_CHUNK)
ATT_GROUP_ROWS = 16  # from this many rows an attention block takes the whole GQA group (MEMRA_ATT_GROUP_ROWS)


def _bucket(rows: int, buckets: tuple, what: str) -> int:
    for b in buckets:
        if rows <= b:
            return b
    raise MemraError(f"a {what} holds at most {buckets[-1]} rows, got {rows}")


# the table entries that choose a q8 matvec's path per shape and row bucket (matvec, mvt or
# gemm: the same bits; measured by `memra tune dispatch`, memra.tune.dispatch)
DISPATCH_KERNELS = ("dispatch", "dispatch_glu")


# the plan ops that are a weight's product (the runner's _matvec handles them; profile counts their ops)
MATRIX_OPS = ("matvec", "gemm", "mvt", "gemm_tile", "gemm_f16", "qf")
# MEMRA_PROMPT_GEMM (docs/FLAGS.md): the kernel of MEMRA_ATTN=hybrid's prompt rows' layer matmuls
PROMPT_GEMMS = ("tile", "f16")
# MEMRA_DECODE (docs/FLAGS.md): the arithmetic of MEMRA_ATTN=hybrid's generated rows' layer matmuls on the weights
# kernels/qf.cu supports ("q8": mv_q8's order, matvec / mvt / gemm.cu by row count; "qf": kernels/qf.cu)
DECODES = ("q8", "qf")


def dispatch_kernel(glu: bool) -> str:
    return DISPATCH_KERNELS[1] if glu else DISPATCH_KERNELS[0]


def dispatch_paths(ggml_type: int) -> tuple[str, ...]:
    """The q8 matvec paths whose kernels run weights of this type."""
    return ("matvec",) + tuple(p for p, types in (("mvt", MVT.TYPES), ("gemm", GEMM.TYPES)) if ggml_type in types)


def dispatch_rule(rows: int) -> str:
    """A q8 matvec's path without a dispatch entry: the GEMM from GEMM_MIN_ROWS rows, mvt from
    MVT_MIN_ROWS, else mv_q8."""
    if rows >= GEMM.GEMM_MIN_ROWS:
        return "gemm"
    return "mvt" if rows >= MVT.MVT_MIN_ROWS else "matvec"


ATT_SHORT = {"ATT_TC": 0, "ATT_TILE": 32}   # the attention switch's short module unless MEMRA_ATT_SWITCH names another


def _switch(keys, over, base: dict | None, head_dim: int) -> tuple[int, dict]:
    """(keys, the short module's configuration: base with `over` laid over it), or MemraError naming what is wrong:
    the one check of a switch, whether the table's entry or MEMRA_ATT_SWITCH names it."""
    if not isinstance(keys, int) or keys < 1:
        raise MemraError(f"switch must be a key count >= 1, got {keys!r}")
    if not isinstance(over, dict) or any(k not in ATT.TUNABLES for k in over):
        raise MemraError(f"short must map tunables among {', '.join(ATT.TUNABLES)}, got {over!r}")
    short = {**(base or {}), **over}
    ATT.defines(head_dim, short)
    if ATT.is_short(short) and keys > ATT.SHORT_MAX + 1:
        raise MemraError(f"a short module of ATT_KERNEL 1 (attn_short.cu) takes rows of at most {ATT.SHORT_MAX} keys: "
                         f"switch <= {ATT.SHORT_MAX + 1}, got {keys}")
    return keys, short


def _setting(var: str, example: str, table: dict | None, keys_key: str, over_key: str, default_over: dict,
             base: dict | None, head_dim: int, fixed: dict | None = None):
    """A switch's (keys, config) from the environment variable `var` (0 off, KEYS, or KEYS:X=N,...) or, where it is
    empty, from the table entry's `keys_key` / `over_key`; None when off. The config is `base` with the values given
    (default_over without) and `fixed` laid over it, checked by _switch; a bad value a MemraError naming `var`."""
    v = os.environ.get(var, "").strip()
    if v == "0":
        return None
    if v == "":
        if not table or keys_key not in table:
            return None
        return _switch(table[keys_key], {**table.get(over_key, default_over), **(fixed or {})}, base, head_dim)
    head, _, rest = v.partition(":")
    try:
        keys = int(head)
        over = {k.strip(): int(x) for k, x in (kv.split("=") for kv in rest.split(",") if kv.strip())} \
            if rest else default_over
    except ValueError:
        raise MemraError(f"{var} must be 0, KEYS or KEYS:X=N,... (e.g. {example}), got {v!r}") from None
    try:
        return _switch(keys, {**over, **(fixed or {})}, base, head_dim)
    except MemraError as e:
        raise MemraError(f"{var}={v!r}: {e}") from None


def att_switch(att_cfg: dict | None, head_dim: int, table: dict | None = None):
    """The attention switch: None (off), or (keys, short config): a row of fewer than `keys` keys (its own count)
    runs attn_decode at the short config (att_cfg with ATT_SHORT, or with the ATT_* values given), the others at
    att_cfg, each module filtering its rows (attention.cu's ATT_ROWS, v12). On where the table's attn_decode entry
    names `switch` (table: that entry's configuration, whose `short` may name the short module's ATT_* values; a
    measured engine choice: research/2026-12-05-session36); MEMRA_ATT_SWITCH (docs/FLAGS.md) overrides it: 0 off
    (the rollback), KEYS, or KEYS:ATT_X=N,... for another short module ("256:ATT_TC=0,ATT_TILE=32")."""
    return _setting("MEMRA_ATT_SWITCH", "256:ATT_TC=0,ATT_TILE=32", table, "switch", "short", ATT_SHORT, att_cfg,
                    head_dim)


FIRST = {"ATT_KERNEL": 1}   # the first module's configuration always names attn_short.cu


def att_first(head_dim: int, table: dict | None = None):
    """The attention switch's first module: None (off), or (keys, config): a row of fewer than `keys` keys runs
    kernels/attn_short.cu (ATT_KERNEL 1) at that config, after the switch's modules
    (whose short one also takes such a row where a step launches both: attn_short's bits stand, the same K / V rows
    appended twice). On where the table's attn_decode entry names `switch0` (its `short0` the configuration:
    attn_short's tunables); MEMRA_ATT_SWITCH0 (docs/FLAGS.md) overrides it: 0 off, KEYS, or KEYS:SHORT_X=N,..."""
    return _setting("MEMRA_ATT_SWITCH0", "193:ATT_WARPS=16", table, "switch0", "short0", {}, None, head_dim, FIRST)


def graph_bucket(rows: int) -> int:
    return _bucket(rows, GRAPH_BUCKETS, "decode step")


def prefill_bucket(rows: int) -> int:
    return _bucket(rows, PREFILL_BUCKETS, "prefill chunk")


@dataclass(frozen=True)
class ModelSpec:
    """What the plan needs from a model: its config and each tensor's GGUF type name."""
    name: str
    cfg: ModelConfig
    types: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_gguf(cls, g, name: str | None = None) -> "ModelSpec":
        return cls(name or str(getattr(g, "path", "model")), read_config(g),
                   {n: t.type_name for n, t in g.tensors.items()})

    def type(self, tensor: str) -> str:
        try:
            return self.types[tensor]
        except KeyError:
            raise UnsupportedModelError(f"model {self.name}: tensor {tensor} is missing") from None


@dataclass(frozen=True)
class Weight:
    """A device weight the plan's matvecs read: GGUF tensors of one type stacked by rows."""
    key: str
    tensors: tuple[str, ...]
    type: str
    rows: int          # stacked output rows (gate and up both counted for a GLU weight)
    cols: int
    glu: str | None = None


@dataclass(frozen=True)
class Launch:
    name: str
    op: str
    kernel: str
    variant: str
    shape: Mapping
    rows: int
    config: Mapping | None = None
    group: str = ""     # the campaign's op name (qkv, attn_output, gate_up, down, output, ...)
    layer: int = -1
    args: Mapping = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.name} {self.kernel}/{self.variant} {shape_key(self.shape)} x{self.rows}"


class Planner:
    def __init__(self, spec: ModelSpec, table: Mapping | None = None, *, path: str = "q8",
                 fuse_rope: bool = True, sms: int = 132, gemm: bool = True, att_group_rows: int | None = None,
                 mvt: bool = True, fa: bool = False, cache_type_k: str = "f16", cache_type_v: str = "f16",
                 hybrid: bool = False, tile: bool = True, prompt_gemm: str | None = None, decode: str | None = None):
        if path not in ("q8", "f32"):
            raise MemraError(f"matvec path must be f32 or q8, got {path!r}")
        self.spec, self.cfg = spec, spec.cfg
        self.table = table or {}
        self.path, self.fuse_rope, self.sms, self.use_gemm = path, fuse_rope, int(sms), gemm
        self.use_mvt = bool(mvt)
        # attention on kernels/attn_fa.cu (MEMRA_ATTN=fa): prefill and decode on one tensor-core
        # arithmetic (decode: RoPE, the merge and the q8 twin inside; prefill: their own
        # launches); its head sizes only
        # KV cache types (memra.gpu.kv): a q8_0 side builds the rope / attention modules with
        # KV_K_Q8 / KV_V_Q8 (kernels/kv.cuh); attn_fa reads f16 only, so q8_0 turns it off
        self.cache_type_k, self.cache_type_v = cache_type_k, cache_type_v
        self.kv_q8 = cache_type_k == "q8_0" or cache_type_v == "q8_0"
        self.use_fa = (bool(fa) or bool(hybrid)) and FA.supports(spec.cfg.head_dim, spec.cfg.n_gqa) and not self.kv_q8
        # MEMRA_ATTN=hybrid: prompt rows on attn_fa's prefill packing, generated rows (decode steps,
        # verification rows, forced runs) on attn_decode: each row's arithmetic is fixed by its
        # kind, so both stay batch-invariant, but a prompt row and a decode row at one position
        # differ in bits (step's kinds; docs/FLAGS.md)
        self.hybrid = bool(hybrid) and self.use_fa
        # a runtime parameter (docs/FLAGS.md): attn_fa's split size is part of its rows' bits;
        # hybrid (prompt rows only) takes the large split, MEMRA_ATTN=fa the decode rows' one
        self.fa_split = env_int("MEMRA_FA_SPLIT", FA.PREFILL_SPLIT if self.hybrid else FA.SPLIT,
                                 lambda n: 64 <= n <= 32768 and n % 64 == 0, "a multiple of 64 in 64..32768")
        # a runtime parameter (docs/FLAGS.md): warps a block of attn_fa's prefill packing (16 /
        # qpk tokens each, sharing the block's K/V tiles); bit-neutral (kernel-check compares packings)
        self.fa_warps = env_int("MEMRA_FA_WARPS", FA.FA_WARPS, lambda n: n in FA.WARPS, " or ".join(map(str, FA.WARPS)))
        self.att_group_rows = env_int("MEMRA_ATT_GROUP_ROWS", ATT_GROUP_ROWS, lambda n: n >= 0,
                                      "a non-negative integer") if att_group_rows is None else int(att_group_rows)
        self._validate()
        self._weights = self._plan_weights()
        # a measurement knob (docs/FLAGS.md): the fewest output tiles a weight needs for the tile
        # (GT.MIN_ROW_TILES); it decides which weights' prompt rows take the chain order
        tile_min = env_int("MEMRA_TILE_MIN", GT.MIN_ROW_TILES, lambda n: n >= 1, "a positive integer")
        # MEMRA_ATTN=hybrid's prompt rows' layer matmuls on kernels/gemm_tile.cu (the chain order)
        # on the weights it supports (GT.supports: by the weight alone), generated rows' on
        # mv_q8's order (matvec, mvt or gemm.cu by row count); MEMRA_TILE=0 (the runner's
        # tile=False) keeps every row on mv_q8's order. With the tile a step holds one row kind
        # (kinds "p" or "g"); a model none of whose weights it supports runs as without it
        # MEMRA_PROMPT_GEMM (docs/FLAGS.md; prompt_gemm=None reads it), under the tile's condition
        # (hybrid, the q8 path, MEMRA_TILE on): with the default "f16" the prompt rows' layer matmuls on
        # the weights gemm_f16 supports (GF.supports: by the weight alone) take one to_f16 launch per
        # source activation and a gemm_f16 launch (f16 activations and f16-rounded weights, one f32
        # accumulator an output: chunk-, batch- and configuration-invariant, another arithmetic than
        # the chain's), the other weights the tile or mv_q8's order as above; "tile" (the rollback)
        # keeps the choice above for every weight
        if prompt_gemm is None:
            prompt_gemm = env_choice("MEMRA_PROMPT_GEMM", "f16", PROMPT_GEMMS)
        elif prompt_gemm not in PROMPT_GEMMS:
            raise MemraError(f"prompt_gemm must be {' or '.join(PROMPT_GEMMS)}, got {prompt_gemm!r}")
        self.prompt_gemm = prompt_gemm
        prompt_order = self.hybrid and tile and path == "q8"
        layer = [w for k, ws in self._weights.items() if k != "output" for w in ws]  # the head keeps mv_q8's order
        self.f16_keys = frozenset(
            w.key for w in layer
            if GF.supports(MV.type_id(w.type), w.rows // 2 if w.glu else w.rows, w.cols, bool(w.glu))
        ) if prompt_order and prompt_gemm == "f16" else frozenset()
        self.tile_keys = frozenset(  # the layer weights the tile takes
            w.key for w in layer if w.key not in self.f16_keys
            and GT.supports(MV.type_id(w.type), w.rows // 2 if w.glu else w.rows, w.cols, bool(w.glu), tile_min)
        ) if prompt_order else frozenset()
        # MEMRA_DECODE (docs/FLAGS.md; decode=None reads it), under the same condition: with "qf" the generated
        # rows' (decode steps', verification rows', forced runs') layer matmuls on the weights kernels/qf.cu supports
        # (QF.supports: Q4_K and Q6_K, by the weight alone) take one to_qf launch per source activation and a qf launch
        # (qf_mv up to 8 rows, qf_gemm above: the same bits; another arithmetic than mv_q8's), every generated row
        # of every step alike, so a row's tokens do not depend on its batch; "q8" (the default) keeps mv_q8's order
        if decode is None:
            decode = env_choice("MEMRA_DECODE", "q8", DECODES)
        elif decode not in DECODES:
            raise MemraError(f"decode must be {' or '.join(DECODES)}, got {decode!r}")
        self.decode = decode
        # (MEMRA_QF_Q6K=0, the rollback seam: the Q6_K weights keep mv_q8's order); with MEMRA_QF_HEAD=1 (opt-in until
        # measured) the head too, every row it takes (a prompt's last, a generated row's), else mv_q8's order
        qf_types = (12,) if env_choice("MEMRA_QF_Q6K", "1", ("0", "1")) == "0" else QF.TYPES
        qf_ws = layer + (list(self._weights["output"]) if env_choice("MEMRA_QF_HEAD", "0", ("0", "1")) == "1" else [])
        self.qf_keys = frozenset(
            w.key for w in qf_ws if (t := MV.type_id(w.type)) in qf_types
            and QF.supports(t, w.rows // 2 if w.glu else w.rows, w.cols, bool(w.glu))
        ) if prompt_order and decode == "qf" else frozenset()
        # prompt and generated rows in arithmetics of their own (the tile's, gemm_f16's, qf's): a step holds one
        # row kind
        self.use_tile = bool(self.tile_keys or self.f16_keys or self.qf_keys)
        self._choices: dict[tuple, object] = {}  # tuned() configurations and _dispatch paths
        self._fixed_configs()

    @property
    def head_q8(self) -> bool:
        """Whether the head reads its rows' q8 twin (runner._head quantizes the gathered rows): on the q8 path, with
        the head not on qf."""
        return self.path == "q8" and self._weights["output"][0].key not in self.qf_keys

    # -- the model --------------------------------------------------------------------------
    def _validate(self) -> None:
        c = self.cfg
        if c.head_dim_v != c.head_dim:
            raise UnsupportedModelError(f"head sizes K {c.head_dim} != V {c.head_dim_v} are not supported on the GPU")
        if c.head_dim % 8 or c.head_dim > 1024:
            raise UnsupportedModelError(f"head size {c.head_dim} is not supported on the GPU (multiple of 8, <= 1024)")
        if self.kv_q8 and c.head_dim % 32:
            raise UnsupportedModelError(f"a q8_0 KV cache needs a head size that is a multiple of 32, got {c.head_dim}")
        for dim, what in ((c.n_embd, "n_embd"), (c.n_ff, "n_ff"), (c.q_dim, "n_head * head_dim")):
            if dim % 64:
                raise UnsupportedModelError(f"{what} = {dim} is not a multiple of 64 (the GPU matvec's unit)")

    def _plan_weights(self) -> dict[str, list[Weight]]:
        """Per layer (and "output"): the matvec weights. Q, K, V are one weight when they
        share a type (gemma3 Q4_K_M mixes Q8_0 V in: then Q+K and V, or all three apart);
        gate and up are one GLU weight (the activation applied in the matvec) when they
        share a type, else two weights and an act_mul launch."""
        c, s = self.cfg, self.spec
        act = "gelu" if c.act == "gelu_tanh" else "silu"
        out: dict[str, list[Weight]] = {}

        def stack(key, names, rows, cols, glu=None):
            return Weight(key, tuple(names), s.type(names[0]), rows, cols, glu)

        for il in range(c.n_layer):
            p = f"blk.{il}."
            names = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
            dims = [c.q_dim, c.kv_dim, c.kv_dim]
            types = [s.type(n) for n in names]
            if len(set(types)) == 1:
                groups = [[0, 1, 2]]
            elif types[0] == types[1]:
                groups = [[0, 1], [2]]
            else:
                groups = [[0], [1], [2]]
            ws = [stack(p + "qkv" + ("" if len(groups) == 1 else str(j)), [names[i] for i in grp],
                        sum(dims[i] for i in grp), c.n_embd) for j, grp in enumerate(groups)]
            ws.append(stack(p + "attn_output", [p + "attn_output.weight"], c.n_embd, c.q_dim))
            if s.type(p + "ffn_gate.weight") == s.type(p + "ffn_up.weight"):
                ws.append(stack(p + "gate_up", [p + "ffn_gate.weight", p + "ffn_up.weight"], 2 * c.n_ff,
                                c.n_embd, act))
            else:
                ws.append(stack(p + "gate", [p + "ffn_gate.weight"], c.n_ff, c.n_embd))
                ws.append(stack(p + "up", [p + "ffn_up.weight"], c.n_ff, c.n_embd))
            ws.append(stack(p + "down", [p + "ffn_down.weight"], c.n_embd, c.n_ff))
            out[str(il)] = ws
        head = "token_embd.weight" if c.tied_output else "output.weight"
        out["output"] = [stack("output", [head], c.n_vocab, c.n_embd)]
        return out

    def weights(self) -> list[Weight]:
        return [w for ws in self._weights.values() for w in ws]

    def layer_weights(self, il: int) -> dict[str, Weight]:
        return {w.key.split(".", 2)[-1]: w for w in self._weights[str(il)]}

    # -- configurations ---------------------------------------------------------------------
    def tuned(self, kernel: str, shape: dict, batch: int, variant: str = "default") -> dict | None:
        """The table's configuration for one launch, or None (the launcher's built-in default)."""
        key = (kernel, variant, tuple(sorted(shape.items())), TABLES.batch_bucket(batch))
        if key not in self._choices:
            ch = TABLES.lookup(self.table, kernel, shape, batch)
            cfg = None
            if ch is not None and ch.variant != variant:
                # e.g. an f32-path matvec winner while this engine runs the q8 path: the
                # variant decides the numerics, so the path is not switched per shape
                log.info("tuning: %s %s b%d: the table's variant %s is not this engine's %s; built-in "
                         "default used", kernel, shape, batch, ch.variant, variant)
            elif ch is not None and ch.config.get("MV_KSPLIT", 1) != 1:
                # split-K changes a row's summation order (batch invariance)
                log.warning("tuning: %s %s b%d: MV_KSPLIT=%s is not used (it would make results depend "
                            "on the batch); built-in default used", kernel, shape, batch, ch.config["MV_KSPLIT"])
            elif ch is not None:
                cfg = dict(ch.config)
            self._choices[key] = cfg
        return self._choices[key]

    def _fixed_configs(self) -> None:
        """The norms', RoPE's and attention's table choices, looked up once for batch 1 and
        used at every row count (their tunables set a row's reduction order). Attention
        entries are per context length: the shortest context's is taken. An entry the
        launcher refuses for this model is logged and the built-in default used."""
        c = self.cfg
        E = c.n_embd

        def checked(kernel, shape, validate):
            cfg = self.tuned(kernel, shape, 1) if shape is not None else None
            if cfg is not None:
                try:
                    validate(cfg)
                except MemraError as e:
                    log.warning("tuning: %s %s: %s; built-in default used", kernel, shape, e)
                    cfg = None
            log.info("tuning: %s %s: %s", kernel, shape, cfg if cfg is not None else "built-in default")
            return cfg

        self.norm_cfg = {"rmsnorm": checked("rmsnorm", {"n": E}, lambda d: NORM.launch_config(E, True, d)),
                         "add_rmsnorm": checked("add_rmsnorm", {"n": E}, lambda d: NORM.launch_config(E, False, d))}
        self.heads = {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}
        self.rope_cfg = checked("rope_norm_kv", self.heads, ROPE.warps)
        ctxs = []  # the context lengths the table has a batch-1 attention entry for
        for key in self.table.get("entries", {}).get("attn_decode", {}):
            ctx = shape_of_key(key).get("ctx")
            if ctx is not None and key == shape_key({**self.heads, "ctx": ctx}) and \
                    TABLES.lookup(self.table, "attn_decode", key, 1) is not None:
                ctxs.append(int(ctx))

        def att_ok(d):
            ATT.defines(c.head_dim, d)
            if ATT.is_short(d):
                raise MemraError("ATT_KERNEL 1 (attn_short.cu) runs only below a switch: the entry's `short` (under "
                                 "its `switch`) or its first module (`switch0` / `short0`)")
            if c.n_gqa % int(d.get("hpb", 1)):
                raise MemraError(f"hpb={d['hpb']} does not divide the {c.n_gqa} query heads per KV head")
            if "switch" in d:   # the attention switch (att_switch): keys, and the short module's configuration
                _switch(d["switch"], d.get("short", ATT_SHORT), d, c.head_dim)
            if "switch0" in d:   # its first module (att_first)
                _switch(d["switch0"], {**d.get("short0", {}), **FIRST}, None, c.head_dim)
            if "splits" in d:   # the plan's split count (below)
                ATT.check_splits(d["splits"])

        self.att_ctx = min(ctxs) if ctxs else 64
        att = checked("attn_decode", {**self.heads, "ctx": self.att_ctx} if ctxs else None, att_ok)
        self.att_cfg = None if att is None else {k: v for k, v in att.items()
                                                 if k not in ("switch", "short", "switch0", "short0", "splits")}
        self.att_hpb = int((self.att_cfg or {}).get("hpb", 0)) or ATT.heads_per_block(c.n_head_kv, c.n_gqa)
        self.n_splits = ATT.default_splits(c.n_head // self.att_hpb, self.sms)
        self.att_switch = att_switch(self.att_cfg, c.head_dim, att)
        if self.att_switch and ATT.is_short(self.att_switch[1]) and self.kv_q8:
            # attn_short.cu reads an f16 cache: a q8_0 one keeps attention.cu's short module
            log.info("attention: a q8_0 KV cache runs attention.cu's short module, not attn_short.cu's")
            self.att_switch = (self.att_switch[0], {**(self.att_cfg or {}), **ATT_SHORT})
        self.att_first = None if self.kv_q8 else att_first(c.head_dim, att)
        if self.att_first and self.att_switch and self.att_first[0] > self.att_switch[0]:
            raise MemraError(f"the attention switch's first module takes rows below {self.att_first[0]} keys, past "
                             f"the switch's {self.att_switch[0]}: switch0 must be <= switch")
        # MEMRA_ATT_DEPTH (docs/FLAGS.md; on by default with hybrid, whose prompt rows do not run
        # attn_decode): the split count the whole GQA group's blocks would get (more splits: part
        # of every row's bits), decode grids of the deepest row's split count (keyed graphs) and
        # the whole group a block once its KV heads x splits fill the SMs (att_hpb_at);
        # research/2026-12-02-session12 (depth/) and 2026-12-03-session20 measured it
        depth = os.environ.get("MEMRA_ATT_DEPTH", "")
        if depth not in ("", "0", "1"):
            raise MemraError(f"MEMRA_ATT_DEPTH must be 0 or 1, got {depth!r}")
        self.att_depth = depth == "1" or (depth == "" and self.hybrid)
        if self.att_depth:
            self.n_splits = max(self.n_splits, ATT.default_splits(c.n_head_kv, self.sms))
        # the entry's `splits`: the split count itself, an engine choice measured at depth (it shapes only rows of
        # more than ATT_MIN_CHUNK x splits keys: shorter rows are cut into ATT_MIN_CHUNK-key splits at any count)
        if att is not None and "splits" in att:
            self.n_splits = int(att["splits"])
        # a measurement knob (docs/FLAGS.md): the split count is part of every row's bits
        n = env_int("MEMRA_ATT_SPLITS", self.n_splits, lambda n: 1 <= n <= ATT.MAX_SPLITS,
                     f"an integer in 1..{ATT.MAX_SPLITS}")
        if n != self.n_splits:
            log.info("attention: %d splits per head block (MEMRA_ATT_SPLITS; default %d)", n, self.n_splits)
            self.n_splits = n

    def att_hpb_rows(self, rows: int) -> int:
        """Query heads per attention block for a launch over `rows` token rows: the batch-1
        choice (table or heads_per_block) below att_group_rows rows, the whole GQA group from
        there: many rows fill the machine without splitting the group, and K/V are read once
        for it. A head's bits do not depend on its block's heads (attention.cu), and the
        split count stays the batch-1 one (the split layout is part of a row's reduction
        order), so the choice is free per launch."""
        return self.cfg.n_gqa if 0 < self.att_group_rows <= rows else self.att_hpb

    def att_hpb_at(self, rows: int, splits: int) -> int:
        """Query heads per block of a decode launch over `rows` rows on a grid of `splits`
        splits: att_hpb_rows(rows); on the MEMRA_ATT_DEPTH path the whole group once n_kv x
        splits blocks fill the SMs (K/V then read once for the group; bit-neutral)."""
        if self.att_depth and self.cfg.n_head_kv * splits >= self.sms:
            return self.cfg.n_gqa
        return self.att_hpb_rows(rows)

    # -- the steps --------------------------------------------------------------------------
    def _matvec(self, out: list, name: str, group: str, il: int, w: Weight, rows: int, src: str, dst: str,
                dst_offset: int = 0, res: str | None = None, prompt: bool = False) -> None:
        """The launches of one matvec over `rows` rows: prompt rows of a plan with the tile
        (use_tile) on a weight it supports, one kernels/gemm_tile.cu launch (the chain order), or
        on a weight gemm_f16 supports (MEMRA_PROMPT_GEMM=f16, the default), _gemm_f16's launches;
        else on the q8 path the one of _dispatch (one tensor-core GEMM launch, kernels/gemm.cu;
        one skinny tensor-core matvec launch, kernels/mvt.cu, MEMRA_MVT=0: the runner's
        mvt=False; both the matvec's bits), else matvec launches of at most 8 rows each (MV_B
        buckets 1/4/8; the f32 family on quantized weights runs row by row)."""
        t = MV.type_id(w.type)
        q8 = self.path == "q8" and t not in MV.FLOAT_TYPES
        variant = "q8" if q8 else "f32"
        shape = {"type": w.type, "rows": w.rows, "cols": w.cols}
        kernel = "matvec_glu" if w.glu else "matvec"
        base = dict(weight=w.key, src=src, dst=dst, dst_offset=dst_offset, res=res, glu=w.glu, q8=q8)
        if prompt and w.key in self.f16_keys:
            self._gemm_f16(out, name, group, il, w, rows, src, shape, base)
            return
        if not prompt and w.key in self.qf_keys:
            self._qf(out, name, group, il, w, rows, src, shape, base)
            return
        if prompt and w.key in self.tile_keys:
            tk = "gemm_tile_glu" if w.glu else "gemm_tile"
            out.append(Launch(name, "gemm_tile", tk, "chain", shape, rows, self.tuned(tk, shape, rows, "chain"),
                              group, il, {**base, "row0": 0}))
            return
        path = self._dispatch(t, shape, w.glu, rows) if q8 else "matvec"
        if path == "gemm":
            gk = "gemm_glu" if w.glu else "gemm"
            out.append(Launch(name, "gemm", gk, variant, shape, rows, self.tuned(gk, shape, rows, variant),
                              group, il, {**base, "row0": 0}))
            return
        if path == "mvt":
            mk = "mvt_glu" if w.glu else "mvt"
            out.append(Launch(name, "mvt", mk, variant, shape, rows, self.tuned(mk, shape, rows, variant),
                              group, il, {**base, "row0": 0}))
            return
        chunk = 8 if q8 or t in MV.FLOAT_TYPES else 1
        for r0 in range(0, rows, chunk):
            n = min(chunk, rows - r0)
            out.append(Launch(name, "matvec", kernel, variant, shape, n, self.tuned(kernel, shape, n, variant),
                              group, il, {**base, "row0": r0}))

    def _gemm_f16(self, out: list, name: str, group: str, il: int, w: Weight, rows: int, src: str, shape: dict,
                  base: dict) -> None:
        """A prompt matmul on gemm_f16 (MEMRA_PROMPT_GEMM=f16, the default): _converted's to_f16 launch into the
        runner's one f16 buffer, then the gemm_f16 launch."""
        self._converted(out, name, group, il, w, rows, src, shape, base, "to_f16", "gemm_f16", "f16")

    def _qf(self, out: list, name: str, group: str, il: int, w: Weight, rows: int, src: str, shape: dict,
            base: dict) -> None:
        """A generated rows' matmul on kernels/qf.cu (MEMRA_DECODE=qf): _converted's to_qf launch into the runner's
        qf buffers, then the qf launch (its kernel by the row count: memra.gpu.ops.qf)."""
        self._converted(out, name, group, il, w, rows, src, shape, base, "to_qf", "qf", "qf")

    def _converted(self, out: list, name: str, group: str, il: int, w: Weight, rows: int, src: str, shape: dict,
                   base: dict, conv: str, op: str, variant: str) -> None:
        """A matmul whose family converts its own input: the `conv` launch of its source activation, unless the
        launch just before converted that source or is another `op` launch reading it (and not writing it: q/k/v
        weights or gate and up reading h share one conversion), then the `op` launch."""
        prev = out[-1] if out else None
        shared = prev is not None and prev.args.get("src") == src and (
            prev.op == conv or (prev.op == op and prev.args.get("dst") != src))
        if not shared:
            out.append(Launch(name + conv.removeprefix("to"), conv, conv, "default", {"n": w.cols}, rows, None, group,
                              il, {"src": src, "K": w.cols}))
        k = op + "_glu" if w.glu else op
        out.append(Launch(name, op, k, variant, shape, rows, self.tuned(k, shape, rows, variant), group, il,
                          {**base, "q8": False, "row0": 0}))

    def qf_workspace(self, rows: Sequence[int]) -> tuple[int, int]:
        """(ws floats, cnt ints) the qf launches of this plan need at any of these row counts (0, 0 without)."""
        ws = cnt = 0
        shapes = {(w.type, w.rows, w.cols, bool(w.glu)) for w in self.weights() if w.key in self.qf_keys}
        for t, wr, cols, glu in shapes:   # (every layer's weight of a shape launches alike)
            shape = {"type": t, "rows": wr, "cols": cols}
            k = "qf_glu" if glu else "qf"
            for n in rows:
                a, b = QF.workspace(wr // 2 if glu else wr, cols, n, glu, self.tuned(k, shape, n, "qf"), MV.type_id(t))
                ws, cnt = max(ws, a), max(cnt, b)
        return ws, cnt

    def _dispatch(self, t: int, shape: dict, glu: bool, rows: int) -> str:
        """The q8 matvec's path at `rows` rows (matvec, mvt or gemm: the same bits): the table's
        dispatch entry for this shape and row bucket (memra.tune.dispatch), else dispatch_rule's;
        a path that is off (MEMRA_GEMM=0, MEMRA_MVT=0) or lacks the weight type falls back to
        the rule, and the rule's to mv_q8's 8-row launches."""
        want = dispatch_rule(rows)
        key = ("dispatch", glu, tuple(sorted(shape.items())), TABLES.batch_bucket(rows), want)
        if key not in self._choices:  # looked up once (not per step built)
            off = {p for p, use in (("mvt", self.use_mvt), ("gemm", self.use_gemm)) if not use}
            on = set(dispatch_paths(t)) - off
            ch = TABLES.lookup(self.table, dispatch_kernel(glu), shape, rows)
            self._choices[key] = ch.variant if ch is not None and ch.variant in on else \
                want if want in on else "matvec"
        return self._choices[key]

    def _own_input(self, w: Weight, prompt: bool) -> bool:
        """Whether a weight's matmul in a step of this row kind converts its own input (gemm_f16's to_f16, qf's
        to_qf), so no q8 twin of it is needed."""
        return w.key in (self.f16_keys if prompt else self.qf_keys)

    def _quantize(self, out: list, name: str, src: str, K: int, rows: int, group: str, il: int = -1) -> None:
        if self.path == "q8":
            out.append(Launch(name, "quantize", "quantize_q8", "default", {"n": K}, rows,
                              self.tuned("quantize_q8", {"n": K}, rows), group, il, {"src": src, "K": K}))

    def _norm(self, out: list, name: str, w: str, rows: int, il: int, delta: str | None = None,
              w_post: str | None = None) -> None:
        E = self.cfg.n_embd
        if delta is None:
            out.append(Launch(name, "norm", "rmsnorm", "default", {"n": E}, rows, self.norm_cfg["rmsnorm"],
                              "rows", il, {"w": w}))
        else:
            out.append(Launch(name, "add_norm", "add_rmsnorm", "default", {"n": E}, rows,
                              self.norm_cfg["add_rmsnorm"], "rows", il, {"w": w, "delta": delta, "w_post": w_post}))

    @property
    def att_kinds(self) -> tuple[str, ...]:
        """The att_kind values a decode step of this plan may take (att_kind_of); the last launches every module."""
        base = ("short", "long", "both") if self.att_switch else ("both",)
        if not self.att_first:
            return base
        return ("first",) + base + tuple(k + "+first" for k in base if k != "long")

    def step(self, rows: int, decode: bool, sampler: str = "none", kinds: str = "p",
             att_kind: str | None = None) -> list[Launch]:
        """Every launch of one forward step over `rows` token rows: decode (one row per
        sequence; RoPE and the KV append inside attention when fused) or a prefill chunk
        (rows may share a sequence: RoPE + append first, then attention). sampler: "none"
        (logits only), "greedy" or "sample" (the next token chosen on the device). kinds
        (hybrid plans' steps that are not decode steps): which row kinds the step holds, "p"
        (prompt rows: attn_fa over the rows the runner's prompt positions name), "g" (generated
        rows: attn_decode over its generated positions) or "pg" (both launches); ignored
        elsewhere. att_kind (the attention switch, a decode step): which attn_decode modules it launches,
        "short", "long" or "both", with the first module (att_first) "first" alone or "+first" after them (the
        runner's: att_kind_of); None (and every prefill step): all of them (att_kinds' last)."""
        if kinds not in ("p", "g", "pg"):
            raise MemraError(f"step kinds must be p, g or pg, got {kinds!r}")
        every = self.att_kinds[-1]
        att_kind = every if att_kind is None else att_kind
        if att_kind not in self.att_kinds:
            raise MemraError(f"step att_kind must be one of {', '.join(self.att_kinds)}, got {att_kind!r}")
        if self.use_tile and not decode and kinds == "pg":
            raise MemraError("a step of a plan with the prompt tile holds one row kind (p or g), got pg")
        # the layer matmuls of prompt rows (not the head: every row's logits take mv_q8's order)
        pr = self.use_tile and not decode and kinds == "p"
        c = self.cfg
        E = c.n_embd
        q8 = self.path == "q8"
        # attn_fa in this step (a hybrid plan's decode steps run attn_decode); its decode packing
        # merges its splits and writes the q8 twin itself (and ropes when fused); its prefill
        # packing leaves RoPE, the merge and the twin to their launches
        fa_step = self.use_fa and not (self.hybrid and decode)
        fa_dec = fa_step and decode and FA.can_decode_pack(c.head_dim)
        # (a hybrid step of generated rows alone: attn_decode, which writes the twin itself)
        att_q8 = q8 and c.head_dim % 32 == 0 and (not fa_step or fa_dec or (self.hybrid and kinds == "g"))
        out: list[Launch] = []
        emb_t = self.spec.type("token_embd.weight")
        out.append(Launch("embed", "embed", "embed", "default", {"type": emb_t, "n": E}, rows,
                          self.tuned("embed", {"type": emb_t, "n": E}, rows), "embed"))
        self._norm(out, "blk.0.attn_norm", "blk.0.attn_norm.weight", rows, 0)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            lw = self.layer_weights(il)
            off = 0
            qkv = [w for k, w in lw.items() if k.startswith("qkv")]
            views = []
            for w in qkv:
                self._matvec(out, p + "qkv", "qkv", il, w, rows, "h", "qkv", dst_offset=off, prompt=pr)
                views.append((off, w.rows))
                off += rows * w.rows * 4
            window = c.swa_window if c.is_swa(il) else 0
            att_shape = {**self.heads, "ctx": self.att_ctx}
            att_args = {"views": tuple(views), "window": window, "twin": att_q8, "rope_key": self.rope_key(il),
                        "hpb": self.att_hpb_rows(rows), "prefill": not decode}
            if fa_step:
                fused = fa_dec and self.fuse_rope
                if not fused:
                    out.append(Launch(p + "rope", "rope", "rope_norm_kv", "default", self.heads, rows, self.rope_cfg,
                                      "heads", il, att_args))
                if not self.hybrid or "p" in kinds:
                    out.append(Launch(p + "attention", "attention_fa", "attn_fa", "default", self.heads, rows, None,
                                      "attention", il, {**att_args, "split": self.fa_split, "fused": fused,
                                                        "warps": self.fa_warps,
                                                        "packing": "decode" if decode else "prefill",
                                                        "rows": "prompt" if self.hybrid else "all"}))
                if self.hybrid and "g" in kinds:
                    self._att_decode(out, p + "attention_gen", "attention", att_shape, rows, il,
                                     {**att_args, "rows": "gen"}, every)
            elif decode and self.fuse_rope:
                self._att_decode(out, p + "attention", "attention_rope", att_shape, rows, il, att_args, att_kind)
            else:
                out.append(Launch(p + "rope", "rope", "rope_norm_kv", "default", self.heads, rows, self.rope_cfg,
                                  "heads", il, att_args))
                self._att_decode(out, p + "attention", "attention", att_shape, rows, il, att_args,
                                 att_kind if decode else every)
            # (the q8 twins of ao and ff feed attn_output and down alone: none where those take gemm_f16 or qf)
            if not att_q8 and not self._own_input(lw["attn_output"], pr):
                self._quantize(out, p + "attn_q8", "ao", c.q_dim, rows, "ffn", il)
            if c.post_norms:
                self._matvec(out, p + "attn_output", "attn_output", il, lw["attn_output"], rows, "ao", "t1", prompt=pr)
                self._norm(out, p + "ffn_norm", p + "ffn_norm.weight", rows, il, delta="t1",
                           w_post=p + "post_attention_norm.weight")
            else:
                self._matvec(out, p + "attn_output", "attn_output", il, lw["attn_output"], rows, "ao", "x", res="x",
                             prompt=pr)
                self._norm(out, p + "ffn_norm", p + "ffn_norm.weight", rows, il)
            if "gate_up" in lw:
                self._matvec(out, p + "gate_up", "gate_up", il, lw["gate_up"], rows, "h", "ff", prompt=pr)
            else:
                self._matvec(out, p + "gate", "gate_up", il, lw["gate"], rows, "h", "ff", prompt=pr)
                self._matvec(out, p + "up", "gate_up", il, lw["up"], rows, "h", "ff2", prompt=pr)
                out.append(Launch(p + "act_mul", "act_mul", "act_mul", "default", {"n": c.n_ff}, rows,
                                  self.tuned("act_mul", {"n": c.n_ff}, rows), "ffn", il))
            if not self._own_input(lw["down"], pr):
                self._quantize(out, p + "ffn_q8", "ff", c.n_ff, rows, "ffn", il)
            nxt = f"blk.{il + 1}.attn_norm.weight" if il + 1 < c.n_layer else "output_norm.weight"
            nname = f"blk.{il + 1}.attn_norm" if il + 1 < c.n_layer else "output_norm"
            if c.post_norms:
                self._matvec(out, p + "down", "down", il, lw["down"], rows, "ff", "t1", prompt=pr)
                self._norm(out, nname, nxt, rows, il, delta="t1", w_post=p + "post_ffw_norm.weight")
            else:
                self._matvec(out, p + "down", "down", il, lw["down"], rows, "ff", "x", res="x", prompt=pr)
                self._norm(out, nname, nxt, rows, il)
        if sampler != "none" or decode:
            out.extend(self.head(rows, sampler))
        return out

    def _att_decode(self, out: list, name: str, op: str, shape: dict, rows: int, il: int, args: dict,
                    kind: str) -> None:
        """The attn_decode launch of a layer: one at the table's configuration, or with the attention switch
        (att_switch) the short module's (rows of fewer than its keys) and the long one's (the rest), as `kind`
        asks; the first module (att_first) after them where the kind names it."""
        base = kind.removesuffix("+first")
        if base == "first":
            pass
        elif self.att_switch is None:
            out.append(Launch(name, op, "attn_decode", "default", shape, rows, self.att_cfg, "attention", il, args))
        else:
            keys, short = self.att_switch
            if base in ("short", "both"):
                out.append(Launch(name, op, "attn_decode", "default", shape, rows, short, "attention", il,
                                  {**args, "att_rows": 1, "att_switch": keys}))
            if base in ("long", "both"):
                out.append(Launch(name + "_long", op, "attn_decode", "default", shape, rows, self.att_cfg,
                                  "attention", il, {**args, "att_rows": 2, "att_switch": keys}))
        if kind.endswith("first"):
            keys, first = self.att_first
            out.append(Launch(name + "_first", op, "attn_decode", "default", shape, rows, first, "attention", il,
                              {**args, "att_rows": 1, "att_switch": keys}))

    def att_kind_of(self, lo: int, hi: int) -> str:
        """The attention switch: the att_kind of a decode step whose rows sit at positions lo..hi: "short" when
        every row of every layer has fewer keys than the switch, "long" when none has, else "both" (a
        sliding-window layer's rows have at most its window's keys); with a first module (att_first) "first" when
        every row has fewer keys than its switch, that kind + "+first" when some row has."""
        c = self.cfg
        fewest = min(lo + 1, c.swa_window) if any(c.swa_layers) else lo + 1
        if self.att_switch is None:
            kind = "both"
        else:
            keys = self.att_switch[0]
            kind = "short" if hi + 1 < keys else "long" if fewest >= keys else "both"
        if self.att_first and fewest < self.att_first[0]:
            return "first" if hi + 1 < self.att_first[0] else kind + "+first"
        return kind

    def head(self, rows: int, sampler: str = "none", src: str = "h") -> list[Launch]:
        """The output projection of `rows` rows of h (whose q8 twin the last norm made) into
        logits, the soft-cap, and the sampler. A sampler "greedy+mask" / "sample+mask" applies
        the rows' vocabulary masks (constrained decoding, kernels/mask.cu) before it."""
        c = self.cfg
        out: list[Launch] = []
        masked = sampler.endswith("+mask")
        sampler = sampler.removesuffix("+mask")
        if masked and sampler == "none":
            raise MemraError("a vocabulary mask needs a sampler (greedy+mask or sample+mask)")
        self._matvec(out, "output", "output", -1, self._weights["output"][0], rows, src, "logits")
        if c.final_logit_softcap:
            out.append(Launch("softcap", "softcap", "softcap", "default", {"n": c.n_vocab}, rows, None, "vocab"))
        if masked:
            out.append(Launch("mask", "mask", "apply_mask", "default", {"n": c.n_vocab}, rows, None, "vocab"))
        if sampler == "greedy":
            out.append(Launch("argmax", "argmax", "argmax", "default", {"n": c.n_vocab}, rows,
                              self.tuned("argmax", {"n": c.n_vocab}, rows), "vocab"))
        elif sampler == "sample":
            out.append(Launch("sample", "sample", "sample", "default", {"n": c.n_vocab}, rows, None, "vocab"))
        elif sampler != "none":
            raise MemraError(f"unknown sampler {sampler!r}")
        return out

    def rope_key(self, il: int) -> tuple[float, float]:
        """(base, scale) of layer il's RoPE table."""
        c = self.cfg
        swa = c.is_swa(il)
        scale = 1.0 if (swa and c.rope_base_swa is not None) else c.rope_freq_scale
        return (c.layer_rope_base(il), scale)
