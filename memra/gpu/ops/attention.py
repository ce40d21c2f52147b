"""Decode attention over the f16 KV cache: split-KV flash-decoding + combine (kernels/attention.cu).

    attention(g, q, kcache, vcache, out, part_o, part_ml, pos, seq, block_table, max_blocks,
              n_tokens=..., n_kv=..., n_gqa=..., head_dim=..., window=..., scale=..., n_splits=...,
              counters=None, xq=None, xs=None, config=None)

config (a tuning table's choice): {"ATT_WARPS", "ATT_TILE", "ATT_MIN_CHUNK"} (-D tunables;
the three change a head's reduction order, so one engine uses one value for every launch),
"ATT_RING" (K/V tiles through a cp.async ring of that many stages in dynamic shared memory, 0:
registers; bit-neutral; ring_for gives the default), "ATT_EARLY" (attn_decode_rope issues the
ring's first tiles before the PDL wait and writes its own key's row into the ring; bit-neutral;
0 / 1, default 1, only with a ring) and "hpb" (query heads per block; never changes results).

With `counters` (int32 [n_tokens * n_kv], zeroed once, left zeroed) it is one launch
(attn_decode: the last split block of each KV head merges), else two (attn_split +
attn_combine). xq/xs (fused variant, head_dim % 32 == 0): the output's q8 twin, bit-identical
to memra.gpu.ops.matvec.quantize_q8 of the output.

Each token t attends to the keys [max(0, pos[t] + 1 - window), pos[t]] (window 0: all) of
its sequence, block-table row seq[t] (None: 0), read from the paged pools [n_blocks, kv_block,
n_kv * head_dim] through block_table [n_seq, max_blocks] (kernels/kv.cuh, memra.gpu.paging);
pos[t] = -1 marks a padded row (no key read, nothing written). Prefill runs the same kernel
with one query per prompt
token and gets the same bits as decode. `n_splits` is fixed per engine (the split layout
depends only on the number of keys), `part_o`/`part_ml` are scratch of
`scratch_shapes(...)`. Reference: softmax attention in float64 over the cached f16 values.
Tolerance: 1e-5 relative.

config "ATT_KERNEL" 1 takes the module from kernels/attn_short.cu instead (the attention switch's short or
first module, memra.gpu.plan: rows of fewer than its switch's <= SHORT_MAX + 1 keys, the row filter's mode 1 only;
one block a head, one split; f16 K/V; its tunables ATT_WARPS, SHORT_PF, SHORT_KB, SHORT_VB): another float order,
checked against the float64 reference, its two entries against each other bit for bit (_check_short).

A q8_0 KV cache (kernels/kv.cuh; either side alone): int8 kcache / vcache code pools with
kscale / vscale, their uint16 (f16 bits) scale planes [n_blocks, kv_block, n_kv * head_dim /
32]; the module is built with KV_K_Q8 / KV_V_Q8 and reads d * q in fp32, then the f16 path's
arithmetic, so a q8_0 launch computes what an f16 one would on the q8_0 round trip of every
K/V value; the fused variant appends by llama.cpp's q8_0 rule (memra.cpu.llamacpp). Reference:
the same float64 attention over the round-tripped values, same tolerance; the fused launch's
appended codes and scales bit for bit against rope_norm_kv's (itself checked bit for bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "attention.cu"
TILE = 64
TOL = 1e-5

_NULL = np.uint64(0)


def warps_for(head_dim: int) -> int:
    """Warps per block: 8 from head size 128 (measured on the H200, research/attn-probe-*:
    the per-head work per thread bounds the short-context latency), else 4."""
    return 8 if head_dim >= 128 else 4


TUNABLES = ("ATT_WARPS", "ATT_TILE", "ATT_MIN_CHUNK", "ATT_RING", "ATT_EARLY", "ATT_TC",
            "ATT_KERNEL", "SHORT_PF", "SHORT_KB", "SHORT_VB")
# ATT_KERNEL 1: the module comes from kernels/attn_short.cu (rows of fewer than SHORT_MAX + 1 keys, one block a
# head, f16 K/V, the row filter's mode 1 only: the attention switch's short module), its SHORT_* tunables with it
SHORT_FILE = "attn_short.cu"
SHORT_MAX = 256    # attn_short.cu's SHORT_MAX: the most keys a row it computes may have
SHORT_DEFAULTS = {"ATT_WARPS": 16, "SHORT_PF": 2, "SHORT_KB": 8, "SHORT_VB": 8}


def is_short(config: dict | None) -> bool:
    """Whether a configuration names attn_short.cu's module (ATT_KERNEL 1)."""
    return bool(int((config or {}).get("ATT_KERNEL", 0)))


def kernel_file(config: dict | None) -> str:
    return SHORT_FILE if is_short(config) else KERNEL_FILE


RING = 2   # stages (research/2026-12-02-session17 section 3: 3 stages no better, 2 blocks an SM at head 128)


def ring_for(head_dim: int) -> int:
    """ATT_RING's default: RING stages (MEMRA_ATT_RING, the rollback seam of docs/FLAGS.md: 0 or
    2..4) up to head 128 (1.08-1.31x at 4,096-16,384 keys, within +-2 % at 64-1,024 a launch:
    research/2026-12-02-session17); 0 above (a stage of 64 keys would be 64 KiB: not measured).
    module_defines adds the cases that hold whatever the config says (a q8_0 cache, a ring too
    small for the key-group sums)."""
    from memra.env import env_int

    v = env_int("MEMRA_ATT_RING", RING, lambda n: n in (0, 2, 3, 4), "0 (K/V through registers) or 2..4 ring stages")
    return 0 if head_dim > 128 else v


def early_default() -> int:
    """ATT_EARLY's default: 1 (attention.cu v8: attn_decode_rope's ring prologue before the PDL
    wait; -0.2 to -0.5 µs a launch from 64 keys, research/2026-12-03-session23); MEMRA_ATT_EARLY=0,
    the rollback seam of docs/FLAGS.md, builds v7's code. Bit-neutral either way."""
    from memra.env import env_int

    return env_int("MEMRA_ATT_EARLY", 1, lambda n: n in (0, 1), "1 (the ring prologue before the PDL wait) or 0 (v7)")


def tc_supported(d: dict) -> bool:
    """Whether a module's defines can run split_body on the tensor cores (attn_tc.cuh's static_asserts): the
    ring with f16 K and V, head 64 or 128, up to 8 query heads a block, a 16-key slice a warp or a warp pair."""
    D, G, w, tile = int(d["HEAD_DIM"]), int(d["N_GQA"]), int(d["ATT_WARPS"]), int(d["ATT_TILE"])
    return (int(d.get("ATT_RING", 0)) >= 2 and not d.get("KV_K_Q8") and not d.get("KV_V_Q8")
            and D in (64, 128) and G <= 8 and tile in (16 * w, 8 * w)
            and ring_bytes(d) >= tile // 16 * 8 * D * 4)


def tc_default() -> int:
    """ATT_TC's default where tc_supported: 1 (attention.cu v11, the split body on the tensor cores);
    MEMRA_ATT_TC=0, the rollback seam of docs/FLAGS.md, keeps v10's CUDA-core body (another float order)."""
    from memra.env import env_int

    return env_int("MEMRA_ATT_TC", 1, lambda n: n in (0, 1), "1 (the tensor-core split body) or 0 (v10's)")


def ring_bytes(defines: dict) -> int:
    """The dynamic shared memory of a module's split kernels: ATT_RING f16 K and V tiles."""
    ring = int(defines.get("ATT_RING", 0))
    return ring * 2 * int(defines["ATT_TILE"]) * int(defines["HEAD_DIM"]) * 2 if ring else 0


def defines(head_dim: int, config: dict | None = None) -> dict:
    """The -D tunables of a launch: the built-in rule (warps_for, TILE) with config's
    ATT_* laid over it, checked."""
    given = {k: int(v) for k, v in (config or {}).items() if k in TUNABLES}
    if given.get("ATT_KERNEL", 0) not in (0, 1):
        raise MemraError(f"attention: ATT_KERNEL must be 0 (attention.cu) or 1 (attn_short.cu), got "
                         f"{given['ATT_KERNEL']}")
    if given.get("ATT_KERNEL"):
        return _short_defines(head_dim, given)
    d = {"ATT_WARPS": warps_for(head_dim), "ATT_TILE": TILE, **given}
    if not 1 <= d["ATT_WARPS"] <= 32:
        raise MemraError(f"attention: ATT_WARPS must be in 1..32, got {d['ATT_WARPS']}")
    if d["ATT_TILE"] < 1 or d.get("ATT_MIN_CHUNK", 1) < 1:
        raise MemraError(f"attention: ATT_TILE and ATT_MIN_CHUNK must be positive ({d})")
    if head_dim % 8 or head_dim > 8 * 32 * d["ATT_WARPS"]:
        raise MemraError(f"attention: head_dim {head_dim} must be a multiple of 8 and <= {8 * 32 * d['ATT_WARPS']}")
    if not 0 <= d.get("ATT_RING", 0) <= 4 or d.get("ATT_RING") == 1:
        raise MemraError(f"attention: ATT_RING must be 0 or 2..4 stages, got {d['ATT_RING']}")
    return d


def _short_defines(head_dim: int, d: dict) -> dict:
    """attn_short.cu's tunables: SHORT_DEFAULTS laid under the config's (its ATT_WARPS and SHORT_*; the other ATT_*
    are attention.cu's and are dropped), checked as its static_asserts would."""
    d = {"ATT_KERNEL": 1, **SHORT_DEFAULTS, **{k: v for k, v in d.items() if k in SHORT_DEFAULTS}}
    w = d["ATT_WARPS"]
    if head_dim % 32 or head_dim > 256 or 32 * w < head_dim or 32 * w < SHORT_MAX or w > 32:
        raise MemraError(f"attention: ATT_KERNEL 1 (attn_short.cu) needs head_dim a multiple of 32 up to 256 and "
                         f"ATT_WARPS in {SHORT_MAX // 32}..32 with 32 x ATT_WARPS >= head_dim; got head_dim "
                         f"{head_dim}, {d}")
    if not 1 <= d["SHORT_PF"] <= d["SHORT_KB"] or d["SHORT_VB"] < 1:
        raise MemraError(f"attention: attn_short needs 1 <= SHORT_PF <= SHORT_KB and SHORT_VB >= 1, got {d}")
    return d


def module_defines(head_dim: int, n_gqa: int, config: dict | None = None, kv_block: int = 16,
                   kv_q8=(False, False)) -> dict:
    """A module's -D macros: head size, heads per block, the tunables (ring_for's ATT_RING and
    early_default's ATT_EARLY unless the config names them; ATT_RING 0 always for a q8_0 cache,
    which attn_ring.cuh refuses), the KV layout."""
    from memra.gpu.ops.rope import kv_defines

    if is_short(config):
        if any(kv_q8):
            raise MemraError("attention: ATT_KERNEL 1 (attn_short.cu) reads an f16 KV cache only")
        return {"HEAD_DIM": head_dim, "N_GQA": n_gqa, **defines(head_dim, config), "KV_BLOCK": kv_block}
    d = {"HEAD_DIM": head_dim, "N_GQA": n_gqa, "ATT_RING": ring_for(head_dim), "ATT_EARLY": early_default(),
         **defines(head_dim, config),
         "KV_BLOCK": kv_block, **kv_defines(kv_q8)}
    if any(kv_q8) or ("ATT_RING" not in (config or {}) and ring_bytes(d) < red_bytes(d)):
        d["ATT_RING"] = 0   # q8_0 is never staged; a default ring too small for the key-group sums: registers
    want = int((config or {}).get("ATT_TC", tc_default()))
    if want and "ATT_TC" in (config or {}) and not tc_supported(d):
        raise MemraError(f"attention: ATT_TC 1 needs the ring, f16 K/V, head 64 or 128, <= 8 heads a block and "
                         f"ATT_TILE 16 or 8 x ATT_WARPS ({d})")
    d["ATT_TC"] = int(bool(want) and tc_supported(d))
    return d


def red_bytes(d: dict) -> int:
    """attention.cu's key-group sum buffer `red` (RED_R x N_GQA x HEAD_DIM floats: its constants
    KG, SMEM_OTHER, RED_CAP, RED_R, with MAX_SPLITS 256), which ATT_RING hosts in its ring after
    the key loop (attn_ring.cuh's static_assert: the ring must hold it)."""
    D, G, T, nt = int(d["HEAD_DIM"]), int(d["N_GQA"]), int(d["ATT_TILE"]), 32 * int(d["ATT_WARPS"])
    kg = nt // (D // 8)
    other = 4 * (G * T + 3 * G + G * MAX_SPLITS + G + G * D + G * D + D) + 64
    cap = (48 * 1024 - other) // 4
    return (kg if kg * G * D <= cap else cap // (G * D)) * G * D * 4


def short_module_defines(head_dim: int, config: dict, keys: int, kv_block: int = 16,
                         kv_q8=(False, False)) -> dict:
    """attn_short.cu's module as the engine launches it: one head a block, the rows of fewer than `keys` keys (the
    row filter's mode 1; keys <= SHORT_MAX + 1)."""
    if not 1 <= keys <= SHORT_MAX + 1:
        raise MemraError(f"attention: ATT_KERNEL 1 (attn_short.cu) computes the rows of fewer than its switch's keys "
                         f"only: row filter (1, keys <= {SHORT_MAX + 1}), got keys {keys}")
    return {**module_defines(head_dim, 1, config, kv_block, kv_q8), "ATT_ROWS": 1, "ATT_SWITCH": int(keys)}


def module(g, head_dim: int, n_gqa: int, canary: bool = False, config: dict | None = None, kv_block: int = 16,
           kv_q8=(False, False), rows_filter: tuple[int, int] = (0, 0)):
    if is_short(config):
        if canary or rows_filter[0] != 1:
            raise MemraError(f"attention: attn_short.cu has no canary and runs with the row filter's mode 1 only "
                             f"(canary {canary}, row filter {rows_filter})")
        return g.module(SHORT_FILE, short_module_defines(head_dim, config, rows_filter[1], kv_block, kv_q8))
    d = module_defines(head_dim, n_gqa, config, kv_block, kv_q8)
    if canary:
        # 1: a token does not see itself; 2: the block table ignored; 4 (q8_0): the scale plane ignored
        d["MEMRA_CANARY"] = int(canary)
    if rows_filter[0]:
        d["ATT_ROWS"], d["ATT_SWITCH"] = int(rows_filter[0]), int(rows_filter[1])
    return g.module(KERNEL_FILE, d)


MAX_SPLITS = 256  # the fused kernel's merge table (MAX_SPLITS in attention.cu)


def default_splits(n_kv: int, sm_count: int) -> int:
    """Splits per (token, head block) for n_blocks head blocks (n_head / heads_per_block):
    about two blocks per SM at long contexts."""
    return int(min(MAX_SPLITS, max(8, math.ceil(2 * sm_count / n_kv))))




MIN_CHUNK = 128  # attention.cu's ATT_MIN_CHUNK default


def check_splits(v) -> int:
    """A plan's split count as a table entry names it (`splits`): an integer in 1..MAX_SPLITS, or MemraError."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SPLITS:
        raise MemraError(f"splits must be an integer in 1..{MAX_SPLITS}, got {v!r}")
    return v


def _split_cap(head_dim: int, config: dict | None) -> int:
    """The most keys a row may have per split for key_range to cut it into ATT_MIN_CHUNK-key
    splits: ATT_MIN_CHUNK rounded down to ATT_TILE."""
    d = defines(head_dim, config)
    tile = int(d["ATT_TILE"])
    return int(d.get("ATT_MIN_CHUNK", MIN_CHUNK)) // tile * tile


def splits_for(max_keys: int, n_splits: int, head_dim: int, config: dict | None = None) -> int:
    """The split count (grid y) a launch over rows of at most max_keys keys needs for the bits
    it would get from n_splits: key_range cuts a row of n keys into chunks of max(ATT_MIN_CHUNK,
    roundup(ceil(n / S), ATT_TILE)), which is ATT_MIN_CHUNK for every S >= n / cap (cap =
    ATT_MIN_CHUNK rounded down to ATT_TILE), so any S' with ceil(max_keys / cap) <= S' <=
    n_splits lays every such row out as n_splits does. The smallest power of two in that range,
    else n_splits (deeper rows' chunks depend on S). A prefill chunk's blocks past its deepest
    row's splits only leave at once; at depth 0 they were most of the grid."""
    if is_short(config):   # attn_short.cu: a row is one block a head (grid y 1)
        return 1
    cap = _split_cap(head_dim, config)
    if cap < 1 or max_keys > cap * n_splits:
        return n_splits
    need = max(1, -(-int(max_keys) // cap))
    s = 1
    while s < need:
        s *= 2
    return min(s, n_splits)


def split_marks(max_keys: int, n_splits: int, head_dim: int, config: dict | None = None) -> list[int]:
    """Key counts in 1..max_keys on both sides of every point where splits_for steps: where the
    deepest row crosses cap x a power of two or cap x n_splits."""
    cap = _split_cap(head_dim, config)
    marks = {1, int(max_keys)}
    if cap >= 1:
        k = 1
        while k <= 2 * n_splits:
            marks |= {cap * k, cap * k + 1}
            k *= 2
        marks |= {cap * n_splits, cap * n_splits + 1}
    return sorted(m for m in marks if 1 <= m <= max_keys)


def heads_per_block(n_kv: int, n_gqa: int) -> int:
    """Query heads per block (N_GQA): the largest divisor of n_gqa that still gives at
    least 16 head blocks, so short contexts (one split) spread over SMs; K/V are read once
    per block. The result does not depend on it (see attention.cu)."""
    best = 1
    for h in range(1, n_gqa + 1):
        if n_gqa % h == 0 and n_kv * n_gqa // h >= 16:
            best = h
    return best


def scratch_shapes(n_tokens: int, n_head: int, n_splits: int, head_dim: int):
    return (n_tokens, n_head, n_splits, head_dim), (n_tokens, n_head, n_splits, 2)


@dataclass
class RopeIn:
    """attention(..., rope=RopeIn(...)): the QKV rows before RoPE and rope_norm_kv's
    parameters (memra.gpu.ops.rope); the fused kernel (attn_decode_rope) ropes Q itself and
    appends each row's K and V, giving rope_norm_kv + attn_decode's bits. Only for rows
    whose sequences differ (decode): a row must not read another row's appended key."""
    q: object
    k: object
    v: object
    q_stride: int
    k_stride: int
    v_stride: int
    cs: object  # memra.gpu.ops.rope.rope_table on the device
    rope_dim: int
    neox: bool
    eps: float = 1e-6
    bias: object = None
    q_norm: object = None
    k_norm: object = None


def rope_in(x: dict, rope_dim: int, neox: bool) -> RopeIn:
    """The RopeIn of memra.gpu.ops.rope.fused_inputs' rows (a fused launch's kernel-check)."""
    s = x["stride"]
    return RopeIn(*x["views"], s, s, s, x["cs"], rope_dim, neox, 1e-6, x["bias"], x["qn"], x["kn"])


def attention(g, q, kcache, vcache, out, part_o, part_ml, pos, seq, block_table, max_blocks: int, *,
              n_tokens: int, n_kv: int, n_gqa: int, head_dim: int, window: int, scale: float, n_splits: int,
              softcap: float = 0.0, counters=None, xq=None, xs=None, pdl: bool = False,
              canary: bool = False, hpb: int | None = None, config: dict | None = None,
              rope: RopeIn | None = None, kscale=None, vscale=None, rows_filter: tuple[int, int] = (0, 0)) -> None:
    """n_splits: per head block; counters: int32 [n_tokens * n_kv * n_gqa / hpb] (zero);
    hpb: query heads per block (default config's "hpb", else heads_per_block(n_kv, n_gqa));
    config: see the module doc; rope: RoPE and the KV append fused in (q is then unused);
    kscale / vscale: the scale planes of a q8_0 (int8) kcache / vcache (module doc); rows_filter (mode,
    keys): attention.cu's ATT_ROWS / ATT_SWITCH (mode 1: only the rows of fewer than `keys` keys, 2: only the
    others; the plan's attention switch, memra.gpu.plan.att_switch), 0 every row."""
    from memra.gpu.ops.rope import cache_kinds

    n_head = n_kv * n_gqa
    hpb = hpb or int((config or {}).get("hpb", 0)) or heads_per_block(n_kv, n_gqa)
    if hpb < 1 or n_gqa % hpb:
        raise MemraError(f"attention: {hpb} heads per block must divide the {n_gqa} query heads per KV head")
    short = is_short(config)
    if short:   # attn_short.cu: one head a block (its bits do not depend on it), one split a row
        hpb = 1
    nhb = n_head // hpb
    nt = 32 * defines(head_dim, config)["ATT_WARPS"]
    kv_q8 = cache_kinds(kcache, vcache, kscale, vscale, "attention", head_dim)
    if rows_filter[0] and counters is None:
        raise MemraError("attention: a row filter runs on the one-launch variant only (give counters)")
    if pos.dtype != np.int32:
        raise MemraError("attention: pos is int32")
    if block_table.dtype != np.int32:
        raise MemraError("attention: the block table is int32")
    if part_o.size < n_tokens * n_head * n_splits * head_dim or part_ml.size < n_tokens * n_head * n_splits * 2:
        raise MemraError("attention: scratch buffers too small for this many tokens / splits")
    if out.size < n_tokens * n_head * head_dim or (rope is None and q.size < n_tokens * n_head * head_dim):
        raise MemraError("attention: q or out too small")
    if rope is not None and counters is None:
        raise MemraError("attention: RoPE fuses only into the one-launch variant (give counters)")
    m = module(g, head_dim, hpb, canary, config, kcache.shape[1], kv_q8, rows_filter)
    shm = ring_bytes(m.defines)
    if short:
        n_splits = 1
    tail = (pos, seq if seq is not None else _NULL, block_table, np.int32(max_blocks), np.int32(n_kv),
            np.int32(n_gqa), np.int32(window), np.float32(scale), np.float32(softcap),
            *(tuple(x if x is not None else _NULL for x in (kscale, vscale)) if any(kv_q8) else ()))
    if counters is not None:
        if n_splits > MAX_SPLITS or counters.dtype != np.int32 or counters.size < n_tokens * nhb:
            raise MemraError(f"attention: fused variant needs n_splits <= {MAX_SPLITS} and int32 counters "
                             f"[n_tokens * n_head / heads per block]")
        if xq is not None and (head_dim % 32 or xq.dtype != np.int8 or xq.size < n_tokens * n_head * head_dim):
            raise MemraError("attention: q8 output needs head_dim % 32 == 0 and int8 xq [n_tokens, n_head * head_dim]")
        xargs = (xq if xq is not None else _NULL, xs if xs is not None else _NULL)
        if rope is not None:
            from memra.gpu.ops.rope import check_table

            r = rope
            check_table("attention", r.cs, r.rope_dim, head_dim)
            opt = [x if x is not None else _NULL for x in (r.bias, r.q_norm, r.k_norm)]
            g.launch(m.kernel("attn_decode_rope"), (nhb, n_splits, n_tokens), (nt,),
                     (r.q, r.k, r.v, np.int32(r.q_stride), np.int32(r.k_stride), np.int32(r.v_stride), *opt,
                      r.cs, np.int32(r.cs.shape[0]), np.int32(r.rope_dim), np.int32(1 if r.neox else 0),
                      np.float32(r.eps), kcache, vcache, part_o, part_ml, counters, out, *xargs, *tail),
                     shmem=shm, pdl=pdl)
            return
        g.launch(m.kernel("attn_decode"), (nhb, n_splits, n_tokens), (nt,),
                 (q, kcache, vcache, part_o, part_ml, counters, out, *xargs, *tail), shmem=shm, pdl=pdl)
        return
    g.launch(m.kernel("attn_split"), (nhb, n_splits, n_tokens), (nt,),
             (q, kcache, vcache, part_o, part_ml, *tail), shmem=shm, pdl=pdl)
    g.launch(m.kernel("attn_combine"), (n_head, n_tokens), (min(head_dim, 256),),
             (part_o, part_ml, out, np.int32(n_splits)), pdl=pdl)


def reference(q, kcache, vcache, pos, seq, n_kv: int, window: int, scale: float, softcap: float = 0.0):
    """q [T, n_head, D]; caches [n_seq, n_ctx, n_kv, D] (float values of the f16 cache);
    returns [T, n_head * D] float64."""
    q = np.asarray(q, np.float64)
    T, n_head, D = q.shape
    G = n_head // n_kv
    out = np.empty((T, n_head, D))
    for t in range(T):
        p = int(pos[t])
        s = int(seq[t]) if seq is not None else 0
        lo = max(0, p + 1 - window) if window else 0
        K = np.asarray(kcache[s, lo:p + 1], np.float64)  # [n, n_kv, D]
        V = np.asarray(vcache[s, lo:p + 1], np.float64)
        for h in range(n_head):
            sc = K[:, h // G] @ q[t, h] * scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            w = np.exp(sc - sc.max())
            out[t, h] = (w @ V[:, h // G]) / w.sum()
    return out.reshape(T, n_head * D)


# -- kernel-check ------------------------------------------------------------------------

CASES = (  # (head_dim, n_gqa, n_kv, window, softcap, n_splits, T, heads per block)
    (64, 3, 3, 0, 0.0, 88, 4, 1),      # smollm2
    (64, 3, 3, 0, 0.0, 88, 4, 3),      # smollm2, one block per KV head
    (256, 4, 1, 0, 0.0, 256, 3, 1),    # gemma3 global layers
    (256, 4, 1, 37, 0.0, 256, 3, 4),   # gemma3 sliding window
    (128, 4, 2, 0, 0.0, 8, 3, 2),      # qwen3 / llama3 head size, few splits (long chunks)
    (128, 4, 2, 0, 30.0, 33, 2, 4),    # soft-capped scores
    (32, 2, 2, 16, 0.0, 64, 4, 2),     # qwen2 tiny, small window
    (64, 1, 4, 0, 0.0, 1, 2, 1),       # no GQA, one split
    (64, 8, 1, 0, 0.0, 16, 2, 8),      # wide GQA group
)


def compile_variants():
    vs = sorted({(c[0], c[7]) for c in CASES} | {(c[0], c[3]) for c in ROPE_CASES})
    out = [(KERNEL_FILE, {"HEAD_DIM": d, "N_GQA": gq, "ATT_WARPS": warps_for(d), "ATT_TILE": TILE, "KV_BLOCK": 16})
           for d, gq in vs]
    for d, gq in ((64, 1), (256, 1)):
        out.append((KERNEL_FILE, {"HEAD_DIM": d, "N_GQA": gq, "ATT_WARPS": warps_for(d), "ATT_TILE": TILE,
                                  "KV_BLOCK": 16, "MEMRA_CANARY": 1}))
    out.append((KERNEL_FILE, {"HEAD_DIM": 128, "N_GQA": 2, "ATT_WARPS": warps_for(128), "ATT_TILE": TILE,
                              "KV_BLOCK": 16, "MEMRA_CANARY": 2}))
    # ATT_RING (the default up to head 128): every such case module, its canaries, and 32-key tiles
    out += [(f, {**d, "ATT_RING": RING}) for f, d in list(out) if d["HEAD_DIM"] <= 128]
    out.append((KERNEL_FILE, {"HEAD_DIM": 128, "N_GQA": 1, "ATT_WARPS": 8, "ATT_TILE": 32, "KV_BLOCK": 16,
                              "ATT_RING": RING}))
    # ATT_TC (v11) on every ring module that can take it, and at the other warp layout of its 64-key tile
    tc = [(f, {**d, "ATT_TC": 1}) for f, d in out if d.get("ATT_RING") and tc_supported(d)]
    out += tc + [(f, {**d, "ATT_WARPS": 8 if d["ATT_WARPS"] == 4 else 4}) for f, d in tc
                 if d["ATT_TILE"] == 64 and "MEMRA_CANARY" not in d]
    # the q8_0 cache (kernels/kv.cuh): every case's module with K and V q8_0, each side alone
    # once, and the canary (the scale plane ignored)
    from memra.gpu.ops.rope import kv_defines

    q8 = sorted({(c[0], c[7], (True, True)) for c in CASES} | {(c[0], c[3], (True, True)) for c in ROPE_CASES}
                | {(CASES[i][0], CASES[i][7], kv) for i, kv in Q8_SIDE_CASES})
    out += [(KERNEL_FILE, {"HEAD_DIM": d, "N_GQA": gq, "ATT_WARPS": warps_for(d), "ATT_TILE": TILE, "KV_BLOCK": 16,
                           **kv_defines(kv)}) for d, gq, kv in q8]
    out.append((KERNEL_FILE, {"HEAD_DIM": 64, "N_GQA": 1, "ATT_WARPS": warps_for(64), "ATT_TILE": TILE,
                              "KV_BLOCK": 16, **kv_defines((True, True)), "MEMRA_CANARY": 4}))
    # attn_short.cu (ATT_KERNEL 1): SHORT_CASES' modules
    out += [(SHORT_FILE, short_module_defines(c[0], cfg, keys)) for c, keys, cfg in SHORT_CASES]
    return out


Q8_SIDE_CASES = ((4, (True, False)), (7, (False, True)))  # (index in CASES, (K q8_0, V q8_0)): one side alone


def _q8_side(g, vals, table, n_blocks, blk):
    """A q8_0 pool of vals (float [n_seq, n_ctx, n_kv, D], as the f16 cache holds them) on the
    device: (codes on the host, scales on the device, round-tripped vals as float32)."""
    from memra.cpu.llamacpp import q8_0_dequantize
    from memra.gpu.ops.rope import q8_codes
    from memra.gpu.paging import scatter

    n_seq, n_ctx = vals.shape[:2]
    q, d = q8_codes(vals.astype(np.float32).reshape(n_seq, n_ctx, -1))
    rt = q8_0_dequantize(q, d.view(np.float16).astype(np.float32)).reshape(vals.shape)
    return scatter(q, table, n_blocks, blk, -128), g.to_device(scatter(d, table, n_blocks, blk, 0xFFFF)), rt


def _check(g, rng, case, canary=False, fused=False, config=None, twin=None, kv_q8=(False, False)):
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.q8 import Q8_SCALE, q8_twin_matches

    from memra.gpu.paging import random_table, scatter

    D, G, nkv, window, cap, S, T, hpb = case
    n_ctx, n_seq, blk = 1100, 2, 16
    nh = nkv * G
    kc = (rng.standard_normal((n_seq, n_ctx, nkv, D)) * 0.7).astype(np.float16)
    vc = rng.standard_normal((n_seq, n_ctx, nkv, D)).astype(np.float16)
    table, n_blocks = random_table(rng, n_seq, n_ctx, blk)
    kp = scatter(kc.view(np.uint16).reshape(n_seq, n_ctx, -1), table, n_blocks, blk, 0xFFFF)
    vp = scatter(vc.view(np.uint16).reshape(n_seq, n_ctx, -1), table, n_blocks, blk, 0xFFFF)
    q = rng.standard_normal((T, nh, D)).astype(np.float32)
    sc_args = {}
    if kv_q8[0]:
        kp, sc_args["kscale"], kc = _q8_side(g, kc, table, n_blocks, blk)
    if kv_q8[1]:
        vp, sc_args["vscale"], vc = _q8_side(g, vc, table, n_blocks, blk)
    # short and long contexts, the first position, the last
    pos = np.concatenate([[0, n_ctx - 1], rng.integers(1, n_ctx, max(0, T - 2))])[:T].astype(np.int32)
    seq = rng.integers(0, n_seq, T).astype(np.int32)
    scale = 1.0 / math.sqrt(D)
    po_shape, pml_shape = scratch_shapes(T, nh, S, D)
    part_o, part_ml = g.empty(po_shape, np.float32), g.empty(pml_shape, np.float32)
    out = g.empty((T, nh * D), np.float32)
    for a in (part_o, part_ml, out):
        a.poison()
    counters = g.to_device(np.zeros(T * nh // hpb, np.int32)) if fused else None
    q8 = fused and D % 32 == 0 and twin is not False
    xq = g.empty((T, nh * D), np.int8) if q8 else None
    xs = g.empty((T, nh * D // 32), Q8_SCALE) if q8 else None
    args = (g.to_device(q), g.to_device(kp), g.to_device(vp), out,
            part_o, part_ml, g.to_device(pos), g.to_device(seq), g.to_device(table), table.shape[1])
    kw = dict(n_tokens=T, n_kv=nkv, n_gqa=G, head_dim=D, window=window, scale=scale,
              n_splits=S, softcap=cap, counters=counters, xq=xq, xs=xs, canary=canary, hpb=hpb, config=config,
              **sc_args)
    attention(g, *args, **kw)
    ref = reference(q, kc.astype(np.float32), vc.astype(np.float32), pos, seq, nkv, window, scale, cap)
    name = f"attention{' fused' if fused else ''} D={D} gqa={G} n_kv={nkv} window={window} softcap={cap:g} " \
           f"splits={S} T={T} heads/block={hpb}{' ' + str(config) if config else ''}" + \
           (" q8_0 " + "+".join(n for n, x in zip("KV", kv_q8) if x) if any(kv_q8) else "")
    first = out.numpy()
    o = compare(name, first, ref, TOL)
    if not fused or not o.ok:
        return o
    # the counters were put back to zero: a second launch merges again, to the same bits
    out.poison()
    attention(g, *args, **kw)
    if not np.array_equal(out.numpy(), first, equal_nan=True):
        return Outcome(name, False, "a second launch (counters reused) gives different output")
    if int(np.count_nonzero(counters.numpy())):
        return Outcome(name, False, "counters not reset to zero")
    if hpb != 1:  # a head's bits do not depend on the heads sharing its block
        out.poison()
        one = dict(kw, hpb=1, counters=g.to_device(np.zeros(T * nh, np.int32)))
        attention(g, *args, **one)
        if not np.array_equal(out.numpy(), first, equal_nan=True):
            return Outcome(name, False, "one head per block gives different bits")
    mod = module_defines(D, hpb, config, blk, kv_q8)
    ring, tc = mod["ATT_RING"], mod["ATT_TC"]
    if ring and not tc:  # the K/V ring moves loads only: the register path's bits
        out.poison()
        attention(g, *args, **dict(kw, config={**(config or {}), "ATT_RING": 0},
                                   counters=g.to_device(np.zeros(T * nh // hpb, np.int32))))
        if not np.array_equal(out.numpy(), first, equal_nan=True):
            return Outcome(name, False, f"ATT_RING {ring} and ATT_RING 0 give different bits")
    pair = None
    if tc and mod["ATT_TILE"] == 64:  # a warp a 16-key slice (4 warps) and a warp pair a slice (8): one arithmetic
        other = {**(config or {}), "ATT_WARPS": 8 if mod["ATT_WARPS"] == 4 else 4}
        if tc_supported(module_defines(D, hpb, other, blk, kv_q8)):
            pair = other["ATT_WARPS"]
            out.poison()
            attention(g, *args, **dict(kw, config=other, counters=g.to_device(np.zeros(T * nh // hpb, np.int32))))
            if not np.array_equal(out.numpy(), first, equal_nan=True):
                return Outcome(name, False, f"ATT_TC at {mod['ATT_WARPS']} and {pair} warps give different bits")
    if q8 and not q8_twin_matches(xq, xs, first):
        return Outcome(name, False, "q8 twin differs from quantize_q8 of the output")
    return Outcome(name, True, o.detail + "; relaunch identical" + ("; = 1 head/block" if hpb != 1 else "")
                   + (f"; ring {ring} = registers" if ring and not tc else "")
                   + (f"; tensor cores, = {pair} warps" if pair else "; tensor cores" if tc else "")
                   + ("; q8 twin bit-exact" if q8 else ""))


ROPE_CASES = (  # (head_dim, n_gqa, n_kv, heads per block, window, rope_dim, neox, qk_norm, bias)
    (64, 3, 3, 1, 0, 64, False, False, False),     # smollm2
    (64, 4, 2, 2, 0, 64, False, False, False),     # llama, two heads a block
    (256, 4, 1, 1, 37, 256, True, True, False),    # gemma3, sliding window, Q/K norm
    (128, 4, 2, 4, 0, 64, True, False, True),      # partial rotary, QKV bias, one block per KV head
)

SHORT_CASES = (  # (a ROPE_CASES case, switch keys, configuration): attn_short.cu's modules in checks()
    (ROPE_CASES[0], 129, {"ATT_KERNEL": 1}),                                        # smollm2, 16 warps
    (ROPE_CASES[2], 257, {"ATT_KERNEL": 1, "ATT_WARPS": 8, "SHORT_KB": 2}),         # gemma3, window 37
    (ROPE_CASES[3], 97, {"ATT_KERNEL": 1, "SHORT_PF": 1, "SHORT_VB": 4}),           # partial rotary, bias
)


def _fused_outputs(g, T: int, nh: int, S: int, D: int, twin: bool = True):
    """A fused check's output, q8 twin (or None, None) and split scratch for T rows, poisoned."""
    from memra.gpu.q8 import Q8_SCALE

    f32 = np.float32
    out = g.empty((T, nh * D), f32)
    xq, xs = (g.empty((T, nh * D), np.int8), g.empty((T, nh * D // 32), Q8_SCALE)) if twin else (None, None)
    po, pml = scratch_shapes(T, nh, S, D)
    part_o, part_ml = g.empty(po, f32), g.empty(pml, f32)
    for a in (out, xq, xs, part_o, part_ml):
        if a is not None:
            a.poison()
    return out, xq, xs, part_o, part_ml


def _check_rope_fused(g, rng, case, canary=False, config=None, T=3, S=None, twin=True, kv_q8=(False, False)):
    """attn_decode_rope against rope_norm_kv + attn_decode on the same inputs: output, q8
    twin and the appended K/V rows must be the same bits. T rows, each its own sequence.
    kv_q8: a q8_0 side (its initial pool: the f16 cache's values quantized), its codes and
    scales compared too."""
    from memra.gpu.ops import rope as ROPE

    D, G, nkv, hpb, window, rd, neox, qkn, has_bias = case
    nh, n_ctx, f32 = nkv * G, 700, np.float32
    S = S or default_splits(nh // hpb, 132)
    x = ROPE.fused_inputs(g, rng, T, n_ctx, nh, nkv, D, rd, qkn, has_bias)
    table, d_table, seq, cache0 = x["table"], x["d_table"], x["seq"], x["cache0"]
    # one split, two, many, then anywhere
    pos = g.to_device(np.concatenate([[0, 64, n_ctx - 1], rng.integers(1, n_ctx, max(0, T - 3))])[:T].astype(np.int32))
    init = []
    for c0, q8 in zip(cache0, kv_q8):
        init.append(ROPE.q8_codes(c0.view(np.float16).astype(f32)) if q8 else (c0, None))
    runs = []
    for fused in (False, True):
        kc, vc = g.to_device(init[0][0]), g.to_device(init[1][0])
        scl = {n: g.to_device(i[1]) for n, i in zip(("kscale", "vscale"), init) if i[1] is not None}
        out, xq, xs, part_o, part_ml = _fused_outputs(g, T, nh, S, D, twin)
        kw = dict(n_tokens=T, n_kv=nkv, n_gqa=G, head_dim=D, window=window, scale=1 / math.sqrt(D),
                  n_splits=S, counters=g.to_device(np.zeros(T * nh, np.int32)), xq=xq, xs=xs, hpb=hpb, config=config,
                  **scl)
        if fused:
            r = rope_in(x, rd, neox)
            attention(g, None, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1], rope=r,
                      canary=canary, **kw)
        else:
            qr = g.empty((T, nh * D), f32)
            ROPE.unfused_rope(g, x, qr, kc, vc, pos, T=T, nh=nh, nkv=nkv, D=D, rope_dim=rd, neox=neox, **scl)
            attention(g, qr, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1], **kw)
        runs.append([a.numpy() for a in (out, kc, vc, *scl.values())]
                    + ([xq.numpy(), xs.numpy().view(np.uint8)] if twin else []))
    name = (f"attention+rope fused D={D} gqa={G} n_kv={nkv} heads/block={hpb} window={window} rope_dim={rd}"
            f"{' neox' if neox else ''}{' qk_norm' if qkn else ''}{' bias' if has_bias else ''}"
            + (" q8_0 " + "+".join(n for n, x in zip("KV", kv_q8) if x) if any(kv_q8) else ""))
    what = ("output", "K cache", "V cache") + tuple(f"{n} scales" for n, x in zip("KV", kv_q8) if x) \
        + ("q8 twin", "q8 scales")
    return ROPE.fused_verdict(name, runs, "rope_norm_kv + attn_decode", what)


def _check_rows_filter(g, rng, case, keys: int, config=None, S=None, fused: bool = True):
    """attention.cu's row filter (ATT_ROWS / ATT_SWITCH, v12): attn_decode_rope (fused;
    else rope_norm_kv, then attn_decode) over rows on both sides of `keys` (keys - 1 and keys among them), as the
    unfiltered module and as its ATT_ROWS 1 and 2 modules at the same configuration (a sliding-window case whose
    window is below `keys`: every row on the short side, as in the engine). Each filtered launch alone
    writes its own rows exactly as the unfiltered one (output, q8 twin, appended K/V rows) and leaves the other rows'
    poisoned outputs and cache rows as they were; one after the other they give the unfiltered launch's bits; the
    counters are back to zero."""
    from memra.gpu.compare import Outcome
    from memra.gpu.ops import rope as ROPE

    D, G, nkv, hpb, window, rd, neox, qkn, has_bias = case
    nh, n_ctx, f32, T = nkv * G, max(700, keys + 64), np.float32, 6
    S = S or default_splits(nh // hpb, 132)
    x = ROPE.fused_inputs(g, rng, T, n_ctx, nh, nkv, D, rd, qkn, has_bias)
    table, d_table, seq, cache0 = x["table"], x["d_table"], x["seq"], x["cache0"]
    p = np.array([keys - 2, keys - 1, 0, n_ctx - 1, keys + 5, max(0, keys - 40)], np.int32)
    n = np.minimum(p + 1, window) if window > 0 else p + 1
    pos = g.to_device(p)
    name = f"attention{'+rope' if fused else ''} row filter ATT_SWITCH={keys} D={D} gqa={G} n_kv={nkv} " \
        f"heads/block={hpb} window={window}" + \
        (f" {config}" if config else "")
    # a sliding-window layer whose window is below the switch has every row short (the engine still launches
    # both modules in a step of both kinds): the long module must then write nothing, the short one every row
    if not ((n < keys).any() and (n >= keys).any()) and not (0 < window < keys and (n < keys).all()):
        return Outcome(name, False, "the case's rows do not straddle the switch")

    def run(modes):
        kc, vc = g.to_device(cache0[0]), g.to_device(cache0[1])
        out, xq, xs, part_o, part_ml = _fused_outputs(g, T, nh, S, D)
        cnt = g.to_device(np.zeros(T * nh, np.int32))
        q = None
        if not fused:   # every row roped and appended first, then the attention launches
            q = g.empty((T, nh * D), f32)
            ROPE.unfused_rope(g, x, q, kc, vc, pos, T=T, nh=nh, nkv=nkv, D=D, rope_dim=rd, neox=neox)
        for m in modes:
            attention(g, q, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1],
                      rope=rope_in(x, rd, neox) if fused else None, n_tokens=T, n_kv=nkv, n_gqa=G, head_dim=D,
                      window=window, scale=1 / math.sqrt(D), n_splits=S, counters=cnt, xq=xq, xs=xs, hpb=hpb,
                      config=config, rows_filter=(m, keys))
        if int(np.count_nonzero(cnt.numpy())):
            return None
        return (out.numpy().view(np.uint32).reshape(T, -1), xq.numpy().reshape(T, -1),
                xs.numpy().view(np.uint8).reshape(T, -1), kc.numpy(), vc.numpy())

    whole = run([0])
    if whole is None:
        return Outcome(name, False, "counters not reset to zero")
    untouched = run([])   # the poison and the initial cache as a launch that writes nothing leaves them
    for modes, mine in (([1], n < keys), ([2], n >= keys), ([1, 2], np.ones(T, bool))):
        got = run(modes)
        if got is None:
            return Outcome(name, False, f"ATT_ROWS {modes}: counters not reset to zero")
        for what, a, b, u in zip(("output", "q8 twin", "q8 scales"), got, whole, untouched):
            if not np.array_equal(a[mine], b[mine]):
                return Outcome(name, False, f"ATT_ROWS {modes}: its rows' {what} differ from the unfiltered launch's")
            if not np.array_equal(a[~mine], u[~mine]):
                return Outcome(name, False, f"ATT_ROWS {modes}: another module's rows' {what} were written")
        cells = np.zeros(whole[3].shape[:2], bool)   # the pool rows [block, offset] this module's rows append
        blk = cells.shape[1]
        for t in np.flatnonzero(mine):
            cells[table[t, p[t] // blk], p[t] % blk] = True
        for what, a, b, u in zip(("K cache", "V cache"), got[3:], whole[3:], untouched[3:]):
            if not np.array_equal(a, np.where(cells[:, :, None], b, u)):
                return Outcome(name, False, f"ATT_ROWS {modes}: the {what} is not the unfiltered launch's on its rows' "
                                            "keys and untouched elsewhere")
    return Outcome(name, True, "each module writes its rows as the unfiltered launch and nothing else; both together "
                               "give its bits; counters back to zero")


def _check_short(g, rng, case, keys: int, config: dict, T: int = 6, twin: bool = True):
    """An attn_short.cu module (ATT_KERNEL 1) as the switch launches it (row filter mode 1 at `keys`) over T decode
    rows on both sides of the switch (1, 2, keys - 1 and keys keys, deeper; a sliding window's rows capped by it),
    each its own sequence: attn_decode_rope and rope_norm_kv + attn_decode give the same bits (outputs, q8 twin, K /
    V pools: the fused launch appends its rows' keys as rope_norm_kv does); the short rows' outputs match the float64
    reference at TOL over the appended cache, their q8 twin is quantize_q8's bits of them; the other rows' outputs,
    twin and (fused) cache rows are untouched; the counters stay zero."""
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.ops import rope as ROPE
    from memra.gpu.paging import logical
    from memra.gpu.q8 import quantize_q8_ref

    D, G, nkv, _, window, rd, neox, qkn, has_bias = case
    nh, n_ctx, f32 = nkv * G, max(400, keys + 64), np.float32
    name = f"attn_short rows below {keys} keys D={D} gqa={G} n_kv={nkv} window={window} {config}"
    x = ROPE.fused_inputs(g, rng, T, n_ctx, nh, nkv, D, rd, qkn, has_bias)
    table, d_table, seq, cache0 = x["table"], x["d_table"], x["seq"], x["cache0"]
    p = np.array(([0, 1, keys - 2, keys - 1, keys + 5] + [int(v) for v in rng.integers(0, n_ctx, T)])[:T], np.int32)
    n = np.minimum(p + 1, window) if window > 0 else p + 1
    short = n < keys
    pos = g.to_device(p)
    runs = []
    for fused in (False, True):
        kc, vc = g.to_device(cache0[0]), g.to_device(cache0[1])
        out, xq, xs, part_o, part_ml = _fused_outputs(g, T, nh, 1, D, twin)
        cnt = g.to_device(np.zeros(T * nh, np.int32))
        q = None
        if not fused:
            q = g.empty((T, nh * D), f32)
            ROPE.unfused_rope(g, x, q, kc, vc, pos, T=T, nh=nh, nkv=nkv, D=D, rope_dim=rd, neox=neox)
        attention(g, q, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1],
                  rope=rope_in(x, rd, neox) if fused else None, n_tokens=T, n_kv=nkv, n_gqa=G, head_dim=D,
                  window=window, scale=1 / math.sqrt(D), n_splits=1, counters=cnt, xq=xq, xs=xs, config=config,
                  rows_filter=(1, keys))
        if int(np.count_nonzero(cnt.numpy())):
            return Outcome(name, False, "counters written")
        runs.append((out.numpy(), xq.numpy().reshape(T, -1) if twin else None,
                     xs.numpy().view(np.uint8).reshape(T, -1) if twin else None, kc.numpy(), vc.numpy(),
                     q.numpy() if q is not None else None))
    (o0, q0, s0, k0, v0, qr), (o1, q1, s1, k1, v1, _) = runs
    # the fused launch appends only its own rows' keys: the unfused pools there, the initial ones elsewhere
    cells = np.zeros(k0.shape[:2], bool)
    blk = cells.shape[1]
    for t in np.flatnonzero(short):
        cells[table[t, p[t] // blk], p[t] % blk] = True
    for what, a, b in (("K cache", k1, np.where(cells[:, :, None], k0, cache0[0])),
                       ("V cache", v1, np.where(cells[:, :, None], v0, cache0[1]))):
        if not np.array_equal(a, b):
            return Outcome(name, False, f"attn_decode_rope's {what} is not rope_norm_kv's on its rows' keys and "
                                        "untouched elsewhere")
    for what, a, b in (("output", o0, o1), ("q8 twin", q0, q1), ("q8 scales", s0, s1)):
        if a is not None and not np.array_equal(a, b, equal_nan=True):
            return Outcome(name, False, f"{what}: attn_decode_rope differs from rope_norm_kv + attn_decode")
    for what, a, byte in (("output", o0, 0xFF), ("q8 twin", q0, 0x80), ("q8 scales", s0, 0x80)):
        if a is not None and not (a.reshape(T, -1)[~short].view(np.uint8) == byte).all():
            return Outcome(name, False, f"a long row's {what} was written")
    kf = logical(k0, table, n_ctx, blk).view(np.float16).astype(f32).reshape(T, n_ctx, nkv, D)
    vf = logical(v0, table, n_ctx, blk).view(np.float16).astype(f32).reshape(T, n_ctx, nkv, D)
    rows = np.flatnonzero(short)
    ref = reference(qr.reshape(T, nh, D)[rows], kf, vf, p[rows], rows, nkv, window, 1 / math.sqrt(D))
    c = compare(name, o0[rows], ref, TOL)
    if not c.ok:
        return c
    if twin:
        tq, ts = quantize_q8_ref(o0[rows])
        if not (np.array_equal(q0[rows].reshape(tq.shape), tq)
                and np.array_equal(s0[rows].reshape(-1), ts.view(np.uint8).reshape(-1))):
            return Outcome(name, False, "q8 twin differs from quantize_q8 of the output")
    return Outcome(name, True, f"{c.detail}; fused = unfused bit for bit (K/V rows rope_norm_kv's); long rows "
                               "untouched" + ("; q8 twin bit-exact" if twin else ""), c.err)


SPLIT_CASES = (  # (head_dim, n_gqa, n_kv, splits, rows, depth, config): a prefill chunk at depth
    (64, 3, 3, 88, 96, 0, None),                        # smollm2 at depth 0: 1 split of 88
    (128, 4, 8, 33, 64, 700, None),                     # llama3-8b at depth: 8 splits of 33
    (64, 4, 2, 16, 40, 400, {"ATT_MIN_CHUNK": 100}),    # ATT_MIN_CHUNK not a multiple of ATT_TILE
)


def _check_split_count(g, rng, case):
    """A prefill chunk's rows (consecutive positions of one sequence) through attn_decode with
    the plan's split count and with splits_for's smaller grid: the same bits (out and q8 twin)."""
    from memra.gpu.compare import Outcome
    from memra.gpu.paging import random_table, scatter

    D, G, nkv, S, T, depth, config = case
    nh, blk = nkv * G, 16
    n_ctx = depth + T
    table, n_blocks = random_table(rng, 1, n_ctx, blk)
    kv = [g.to_device(scatter((rng.standard_normal((1, n_ctx, nkv * D)) * 0.7).astype(np.float16).view(np.uint16),
                              table, n_blocks, blk, 0xFFFF)) for _ in range(2)]
    q = g.to_device(rng.standard_normal((T, nh * D)).astype(np.float32))
    pos = np.arange(depth, depth + T, dtype=np.int32)
    s_eff = splits_for(int(pos.max()) + 1, S, D, config)
    runs = []
    for n_splits in (S, s_eff):
        out, xq, xs, part_o, part_ml = _fused_outputs(g, T, nh, n_splits, D)
        attention(g, q, kv[0], kv[1], out, part_o, part_ml, g.to_device(pos), g.to_device(np.zeros(T, np.int32)),
                  g.to_device(table), table.shape[1], n_tokens=T, n_kv=nkv, n_gqa=G, head_dim=D, window=0,
                  scale=1 / math.sqrt(D), n_splits=n_splits, counters=g.to_device(np.zeros(T * nh, np.int32)),
                  xq=xq, xs=xs, hpb=G, config=config)
        runs.append((out.numpy(), xq.numpy(), xs.numpy().view(np.uint8)))
    name = f"attention split count D={D} gqa={G} n_kv={nkv} splits {S} -> {s_eff} rows {depth}..{depth + T - 1}" \
           f"{' ' + str(config) if config else ''}"
    if s_eff >= S:
        return Outcome(name, False, f"splits_for kept all {S} splits for a chunk it should shrink")
    for what, a, b in zip(("output", "q8 twin", "q8 scales"), runs[0], runs[1]):
        if not np.array_equal(a, b, equal_nan=True):
            return Outcome(name, False, f"{what} differs between {S} and {s_eff} splits")
    return Outcome(name, True, f"output and q8 twin bit-identical with {s_eff} of {S} splits")


def checks(g, rng: np.random.Generator) -> Iterator:
    for case in CASES:
        yield _check(g, rng, case)
        yield _check(g, rng, case, fused=True)
    for case in ROPE_CASES:
        yield _check_rope_fused(g, rng, case)
    for case in SPLIT_CASES:
        yield _check_split_count(g, rng, case)
    for case, keys, cfg in SHORT_CASES:
        yield _check_short(g, rng, case, keys, cfg)
    # the q8_0 cache: every case with K and V q8_0 (two launches and one), each side alone, the
    # fused RoPE + append
    for case in CASES:
        yield _check(g, rng, case, kv_q8=(True, True))
        yield _check(g, rng, case, fused=True, kv_q8=(True, True))
    for i, kv in Q8_SIDE_CASES:
        yield _check(g, rng, CASES[i], fused=True, kv_q8=kv)
    for case in ROPE_CASES:
        yield _check_rope_fused(g, rng, case, kv_q8=(True, True))


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, CASES[0], canary=True)
    yield _check(g, rng, CASES[4], canary=2, fused=True)
    yield _check(g, rng, CASES[2], canary=True, fused=True)
    yield _check_rope_fused(g, rng, ROPE_CASES[0], canary=True)
    yield _check(g, rng, CASES[7], canary=4, fused=True, kv_q8=(True, True))  # the scale plane ignored


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "attention" (attn_decode, after rope_norm_kv: prefill, or decode
    with MEMRA_FUSED_ROPE=0) or "attention_rope" (attn_decode_rope: decode): the module of
    the model's head size, the launch's heads per block and the table's ATT_* tunables; the
    layer's window, the q8 twin on the q8 path, the plan's split count."""
    from memra.gpu.ops.rope import plan_kv_q8

    c, plan = ctx.cfg, ctx.plan
    D = c.head_dim
    hpb = int(L.args.get("hpb", plan.att_hpb))
    # a decode launch's heads per block follow its grid (the runner's plan.att_hpb_at at the step's split count):
    # on the MEMRA_ATT_DEPTH path the whole GQA group once the splits fill the SMs, a module of its own (N_GQA);
    # a table entry's case (launches.table_cases: no planner) keeps its own; attn_short.cu launches one head a block
    at = getattr(plan, "att_hpb_at", None)
    hpbs = [1] if is_short(L.config) else [hpb] if L.args.get("prefill") or at is None else \
        sorted({hpb, *(at(int(L.rows), s) for s in (1, plan.n_splits))})
    kv = plan_kv_q8(plan)
    fused = L.op == "attention_rope"
    rows = int(L.rows)
    b = launch_bucket(rows)
    window, twin = int(L.args.get("window", 0)), bool(L.args.get("twin"))
    rope = [c.rope_dim, bool(c.rope_neox), bool(c.qk_norm), bool(c.qkv_bias)] if fused else None
    # the row filter's mode and keys are module defines (ATT_ROWS / ATT_SWITCH) the launch's `d` lacks: the tag
    # names them, so a case at another switch is another case (kernel-check runs it)
    rf = int(L.args.get("att_rows") or 0)
    tag = f"heads={c.n_head}/{c.n_head_kv} window={window} twin={twin}" + (
        " rope_dim={0} neox={1} qk_norm={2} bias={3}".format(*rope) if fused else "") + (
        f" rows={rf} switch={int(L.args['att_switch'])}" if rf else "")
    return [{"file": kernel_file(L.config), "entry": "attn_decode_rope" if fused else "attn_decode",
             "defines": module_defines(D, h, L.config, ctx.kv_block, kv), "bucket": b, "tag": tag,
             "params": {"D": D, "qpk": c.n_gqa, "n_kv": c.n_head_kv, "hpb": h, "window": window, "twin": twin,
                        "splits": plan.n_splits, "T": b, "rope": rope,
                        "config": dict(L.config) if L.config else None, **({"kv_q8": list(kv)} if any(kv) else {}),
                        # the plan's attention switch: the module's configuration as above, then its row filter
                        **({"switch": int(L.args["att_switch"])} if rf else {})}}
            for h in hpbs]


def check_launch(g, rng, case):
    """attn_decode against the float64 reference (relaunch, counters, one head per block
    and the q8 twin checked too); attn_decode_rope against rope_norm_kv + attn_decode."""
    p = case["params"]
    kv = tuple(p.get("kv_q8") or (False, False))
    if is_short(p["config"]):
        rd, neox, qkn, bias = p["rope"] or (p["D"], False, False, False)
        return _check_short(g, rng, (p["D"], p["qpk"], p["n_kv"], 1, p["window"], rd, neox, qkn, bias),
                            p["switch"], p["config"], T=max(p["T"], 6), twin=p["twin"])
    if p["rope"] is not None:
        rd, neox, qkn, bias = p["rope"]
        o = _check_rope_fused(g, rng, (p["D"], p["qpk"], p["n_kv"], p["hpb"], p["window"], rd, neox, qkn, bias),
                              config=p["config"], T=p["T"], S=p["splits"], twin=p["twin"], kv_q8=kv)
    else:
        rd, neox, qkn, bias = p["D"], False, False, False
        o = _check(g, rng, (p["D"], p["qpk"], p["n_kv"], p["window"], 0.0, p["splits"], p["T"], p["hpb"]), fused=True,
                   config=p["config"], twin=p["twin"], kv_q8=kv)
    if not o.ok or not p.get("switch"):
        return o
    return _check_rows_filter(g, rng, (p["D"], p["qpk"], p["n_kv"], p["hpb"], p["window"], rd, neox, qkn, bias),
                              p["switch"], config=p["config"], S=p["splits"], fused=p["rope"] is not None)


# -- tune hook (memra/tune/measure.py): kernel "attn_decode" (the fused launch the engine runs),
# variant "default", shape {n_head, n_head_kv, head_dim, ctx}, batch tokens; config ATT_WARPS,
# ATT_TILE, ATT_MIN_CHUNK and "hpb" (query heads per block, must divide n_gqa)

# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"attn_decode": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"attention tune: unknown kernel/variant {kernel}/{variant}")
    return _TuneCase(g, dict(config or {}), int(shape["n_head"]), int(shape["n_head_kv"]), int(shape["head_dim"]),
                     int(shape["ctx"]), int(shape.get("batch", 1)), rng, rotate_bytes)


_TUNE_BLOCK = 16  # KV block of the timing caches (the engine's default)


def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """(kernel file, defines) of the module a tune job loads (_TuneCase: one module, hpb query heads a block, the
    timing caches' KV block); memra tune carry compares them across a change of attention.cu."""
    if kernel != "attn_decode" or variant != "default":
        raise MemraError(f"attention tune: unknown kernel/variant {kernel}/{variant}")
    nh, nkv, D = int(shape["n_head"]), int(shape["n_head_kv"]), int(shape["head_dim"])
    hpb = int((config or {}).get("hpb", 0)) or heads_per_block(nkv, nh // nkv)
    if is_short(config):
        return [(SHORT_FILE, short_module_defines(D, dict(config), int(shape["ctx"]) + 1, _TUNE_BLOCK))]
    return [(KERNEL_FILE, module_defines(D, hpb, dict(config or {}), _TUNE_BLOCK))]


class _TuneCase:
    """A decode step's attention as the engine launches it (attn_decode_rope: RoPE and the
    KV append inside, from the QKV matvec's rows): one token per sequence (batch tokens),
    each at position ctx - 1 so it attends to ctx cached keys, n_splits as the engine picks
    them (default_splits of the head-block count; a config's `splits`, the table entry's, on the
    grid the runner trims it to: splits_for), the q8 twin written when head_dim % 32
    == 0 (the engine's q8 path). `sets` copies of the QKV rows, the caches and the outputs."""

    def __init__(self, g, config, nh, nkv, D, ctx, T, rng, rotate_bytes):
        from memra.gpu.q8 import Q8_SCALE

        if nkv < 1 or nh % nkv or ctx < 1:
            raise MemraError(f"attention tune: bad shape n_head={nh} n_head_kv={nkv} ctx={ctx}")
        self.G = nh // nkv
        self.hpb = int(config.get("hpb", 0)) or heads_per_block(nkv, self.G)
        if self.hpb < 1 or self.G % self.hpb:
            raise MemraError(f"attention: hpb={self.hpb} must divide the {self.G} query heads per KV head")
        defines(D, config)  # a bad value fails here: a failed receipt
        self.g, self.config, self.nh, self.nkv, self.D, self.ctx, self.T, self.rng = g, config, nh, nkv, D, ctx, T, rng
        self.S = default_splits(nh // self.hpb, g.info.sm_count)
        if "splits" in config:   # a plan's split count (the table entry's `splits`), launched as the runner trims it
            self.S = splits_for(ctx, check_splits(config["splits"]), D, config)
        self.q8 = D % 32 == 0
        qb, kvb = T * (nh + 2 * nkv) * D * 4, T * ctx * nkv * D * 2  # keys read (the pool's tail is not)
        q8b = T * nh * D + T * nh * D // 32 * Q8_SCALE.itemsize if self.q8 else 0
        self.bytes = qb + 2 * kvb + T * nh * D * 4 + q8b  # QKV rows and the caches read; out (and its twin) written
        self.sets = max(1, -(-rotate_bytes // self.bytes))
        kv = (rng.standard_normal(T * -(-ctx // _TUNE_BLOCK) * _TUNE_BLOCK * nkv * D) * 0.7).astype(np.float16).view(np.uint16)
        self.kc = g.to_device(np.tile(kv, self.sets))
        self.vc = g.to_device(np.tile(kv[::-1].copy(), self.sets))
        self.out = g.empty(self.sets * T * nh * D, np.float32)
        self.xq = g.empty(self.sets * T * nh * D, np.int8) if self.q8 else None
        self.xs = g.empty(self.sets * T * nh * D // 32, Q8_SCALE) if self.q8 else None
        po, pml = scratch_shapes(T, nh, self.S, D)
        self.part_o, self.part_ml = g.empty(po, np.float32), g.empty(pml, np.float32)
        self.counters = g.to_device(np.zeros(T * nh, np.int32))  # left zero by every launch
        self.pos = g.to_device(np.full(T, ctx - 1, np.int32))
        self.seq = g.to_device(np.arange(T, dtype=np.int32))
        # sequence t's positions in pool blocks [t * nblk, (t + 1) * nblk), in order
        self.nblk = -(-ctx // _TUNE_BLOCK)
        self.table = g.to_device(np.arange(T * self.nblk, dtype=np.int32).reshape(T, self.nblk))
        # the decode launch the engine makes: RoPE and the KV append inside (attn_decode_rope),
        # from the QKV matvec's rows (q, k, v of a token in one row)
        from memra.gpu.ops.rope import rope_table
        from memra.cpu.reference import rope_inv_freq

        self.inv = rope_inv_freq(D, 1e4)
        self.cs = g.to_device(rope_table(self.inv, ctx))
        self.row = (nh + 2 * nkv) * D
        self.qkv = g.to_device(np.tile(rng.standard_normal(T * self.row).astype(np.float32), self.sets))

    def _run(self, qkv, kc, vc, out, xq, xs):
        D, nh, nkv, r = self.D, self.nh, self.nkv, self.row
        rope = RopeIn(qkv.view(np.float32, (self.T * r,), 0), qkv.view(np.float32, (1,), 4 * nh * D),
                      qkv.view(np.float32, (1,), 4 * (nh + nkv) * D), r, r, r, self.cs, D, False)
        attention(self.g, None, kc, vc, out, self.part_o, self.part_ml, self.pos, self.seq, self.table, self.nblk,
                  n_tokens=self.T, n_kv=nkv, n_gqa=self.G, head_dim=D, window=0,
                  scale=1.0 / math.sqrt(D), n_splits=self.S, counters=self.counters, xq=xq, xs=xs,
                  hpb=self.hpb, config=self.config, rope=rope,
                  rows_filter=(1, self.ctx + 1) if is_short(self.config) else (0, 0))

    def launch(self, i: int) -> None:
        T, nh, nkv, D = self.T, self.nh, self.nkv, self.D
        nq, nk = T * nh * D, T * self.nblk * _TUNE_BLOCK * nkv * D
        cache = (T * self.nblk, _TUNE_BLOCK, nkv * D)
        q8 = (self.xq.view(np.int8, (nq,), nq * i), self.xs.view(None, (nq // 32,), nq // 32 * i * self.xs.dtype.itemsize)) \
            if self.q8 else (None, None)
        nr = T * self.row
        self._run(self.qkv.view(np.float32, (nr,), 4 * nr * i), self.kc.view(np.uint16, cache, 2 * nk * i),
                  self.vc.view(np.uint16, cache, 2 * nk * i), self.out.view(np.float32, (nq,), 4 * nq * i), *q8)

    def check(self):
        """Fresh q, K, V; poisoned outputs; against the float64 reference at TOL, the
        counters left zero, the q8 twin equal to quantize_q8 of the output."""
        from memra.gpu.compare import compare
        from memra.gpu.q8 import Q8_SCALE, q8_twin_matches

        g, rng, T, nh, nkv, D, ctx = self.g, self.rng, self.T, self.nh, self.nkv, self.D, self.ctx
        cap = self.nblk * _TUNE_BLOCK  # positions the table maps per sequence
        kc = (rng.standard_normal((T, cap, nkv, D)) * 0.7).astype(np.float16)
        vc = rng.standard_normal((T, cap, nkv, D)).astype(np.float16)
        qkv = rng.standard_normal((T, self.row)).astype(np.float32)
        out = g.empty((T, nh * D), np.float32)
        xq = g.empty((T, nh * D), np.int8) if self.q8 else None
        xs = g.empty((T, nh * D // 32), Q8_SCALE) if self.q8 else None
        for a in (out, xq, xs, self.part_o, self.part_ml):
            if a is not None:
                a.poison()
        pool = (T * self.nblk, _TUNE_BLOCK, nkv * D)  # the table is the identity: pool order = (t, position)
        kd, vd = g.to_device(kc.view(np.uint16).reshape(pool)), g.to_device(vc.view(np.uint16).reshape(pool))
        self._run(g.to_device(qkv), kd, vd, out, xq, xs)
        g.sync()
        from memra.gpu.ops.rope import reference as rope_reference

        pos = np.full(T, ctx - 1)
        rq, rk, rv = rope_reference(qkv[:, :nh * D].reshape(T, nh, D), qkv[:, nh * D:(nh + nkv) * D].reshape(T, nkv, D),
                                    qkv[:, (nh + nkv) * D:].reshape(T, nkv, D), pos, self.inv, False)
        kc[:, ctx - 1], vc[:, ctx - 1] = rk.astype(np.float16), rv.astype(np.float16)  # the appended rows
        kc, vc = kc[:, :ctx], vc[:, :ctx]
        scale = 1.0 / math.sqrt(D)
        ref = reference(rq, kc.astype(np.float32), vc.astype(np.float32), pos, np.arange(T), nkv, 0, scale)
        o = out.numpy()
        c = compare(f"attn_decode heads={nh}/{nkv} D={D} ctx={ctx} T={T} hpb={self.hpb} splits={self.S}", o, ref, TOL)
        err = c.err
        if not c.ok:
            return False, err, c.detail
        if np.count_nonzero(self.counters.numpy()):
            return False, err, "counters not reset to zero"
        if self.q8 and not q8_twin_matches(xq, xs, o):
            return False, err, "q8 twin differs from quantize_q8 of the output"
        return True, err, c.detail
