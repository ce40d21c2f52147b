"""Tensor-core attention whose rows give the same bits in every packing (kernels/attn_fa.cu):
prefill chunks and decode rows on one arithmetic, so prefill = decode by construction.

    attn_fa(g, q, kcache, vcache, out, part_o, part_ml, pos, seq, block_table, max_blocks,
            n_tokens=..., n_kv=..., qpk=..., head_dim=..., window=..., scale=..., n_split=...,
            groups=d_table, n_groups=...)                  # or decode=True

q [n_tokens, n_head * head_dim] f32 (roped), the paged f16 pools and block table as
memra.gpu.ops.attention; out [n_tokens, n_head * head_dim] f32. A row's keys are cut into
splits of `split` keys at absolute positions (attn_fa.cu's FA_SPLIT, fixed per engine: part of
a row's bits), `n_split` = ceil(context / split) blocks along the grid's z (those past a row's
keys leave at once); `part_o` / `part_ml` are scratch of `scratch_shapes(...)` for the rows
with more than one split, merged by fa_combine.

Packings (the same bits): attn_fa over a table of token groups (`group_table`: a step's
runs of one sequence cut into groups of FA_WARPS * 16 / qpk tokens, 16 / qpk per warp, the
block's warps sharing the K/V tiles; any mix of sequences: a group never straddles two),
then fa_combine; and attn_fa_dec for decode rows (one token a block, its warps splitting
the output dims; head_dim % 64 == 0), which merges its splits, writes the q8 twin and, given
`rope`, ropes Q and appends K / V itself (one launch a decode layer, as attn_decode_rope).

Reference: softmax attention in float64 with q rounded to f16 (the kernel's input rounding;
the probabilities' f16 rounding stays in the tolerance): TOL = 1e-3 relative.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "attn_fa.cu"
FA_WARPS = 4
WARPS = (1, 2, 4, 8)  # FA_WARPS the prefill packing builds with (the decode packing: 4 only)
# the count of the entry a runner writes after a step's launched token groups, (rows, GROUPS_END):
# the kernel never reads it; tests/gpu_emulator.py takes the step's row count from it
GROUPS_END = -31249
SPLIT = 256  # keys per split (FA_SPLIT)
# MEMRA_ATTN=hybrid's defaults (attn_fa there runs prompt rows only; MEMRA_ATTN=fa's decode rows
# need SPLIT's parallelism): pp512 on the H200 across FA_SPLIT 256 .. 4096 x 4 / 8 warps
# (research/2026-12-03-session20, b/): 8B Q4_K_M @ d4096 7,025 t/s (256, 4) -> 8,163 (4096, 8),
# @ d0 9,203 -> 9,395; 1B @ d4096 35,797 -> 40,605, @ d0 51,318 -> 51,001 (within its runs'
# spread). A split's partials (rows x heads x splits x head size floats) and the block's K/V
# tiles, read once per 16 / qpk x warps tokens, were what the small split and 4 warps cost with
# v6; attn_fa.cu v8 (fewer instructions and one barrier a tile) runs fastest with FA_WARPS = 4 at
# split 4096 (research/2026-12-03-session21 §5: the 8B's 512 rows at depth 4096 248.8 µs at 4
# warps, 267.8 at 8; v6 at 8 warps 319.2), so hybrid keeps FA_WARPS. On the engine's grid
# (research/2026-12-03-session22 §2): the 8B / 1B equal at 4 and 8 (238.6 / 241.4 µs at depth
# 4096), SmolLM2 100.7 / 119.8, Gemma-3's global layers 210.0 / 328.8; the engine's pp512 at 4
# +0.5-1.5 % on the 8B and 1B.
PREFILL_SPLIT = 4096
TOL = 1e-3
_NULL = np.uint64(0)


def supports(head_dim: int, qpk: int) -> bool:
    """Whether attn_fa runs a model of this head size and query heads per KV head."""
    return head_dim % 32 == 0 and 0 < head_dim <= 256 and 1 <= qpk <= 16


def defines(head_dim: int, split: int = SPLIT, kv_block: int = 16, canary: int = 0, warps: int = FA_WARPS) -> dict:
    if head_dim % 32 or head_dim > 256:
        raise MemraError(f"attn_fa: head_dim {head_dim} must be a multiple of 32 up to 256")
    if split % 64 or split < 64:
        raise MemraError(f"attn_fa: split {split} must be a positive multiple of 64")
    if warps not in WARPS:
        raise MemraError(f"attn_fa: FA_WARPS {warps} must be one of {', '.join(map(str, WARPS))}")
    d = {"HEAD_DIM": head_dim, "FA_WARPS": warps, "FA_SPLIT": split, "KV_BLOCK": kv_block}
    if canary:
        # 1: a token does not see itself; 2 (kv.cuh): the block table ignored; 3 (rope.cuh): RoPE
        # rotates the wrong way (the fused decode packing)
        d["MEMRA_CANARY"] = int(canary)
    return d


def module(g, head_dim: int, split: int = SPLIT, kv_block: int = 16, canary: int = 0, warps: int = FA_WARPS):
    return g.module(KERNEL_FILE, defines(head_dim, split, kv_block, canary, warps))


def smem_bytes(head_dim: int, decode: bool, warps: int = FA_WARPS) -> int:
    """attn_fa.cu's FA_SMEM_DEC (decode) / FA_SMEM (prefill) of a module built with FA_WARPS = warps."""
    rs = head_dim * 2 + 16
    return (6 * 64 * rs + 16 * rs + warps * head_dim * 4) if decode else (4 * 64 * rs + warps * 16 * rs)


def n_splits(context: int, split: int = SPLIT) -> int:
    return max(1, -(-int(context) // split))


def scratch_shapes(n_tokens: int, n_head: int, n_split: int, head_dim: int):
    return (n_tokens, n_head, n_split, head_dim), (n_tokens, n_head, n_split, 2)


def prefill_tpb(qpk: int, warps: int = FA_WARPS) -> int:
    """Tokens per block of the prefill packing (FA_WARPS = warps)."""
    if not 1 <= qpk <= 16:
        raise MemraError(f"attn_fa: {qpk} query heads per KV head (1..16 supported)")
    return warps * (16 // qpk)


def can_decode_pack(head_dim: int) -> bool:
    return head_dim % 64 == 0


def group_table(seq, pos, tpb: int, size: int | None = None) -> np.ndarray:
    """attn_fa's token groups for rows with block-table rows `seq` and positions `pos`
    (host arrays): int32 [size, 2] of (first row, count), each group at most tpb consecutive
    rows of one sequence, padded rows (position < 0) in none; rows of the table past the
    groups have count 0 (size: the launch's grid, default the number of groups)."""
    seq, pos = np.asarray(seq), np.asarray(pos)
    out: list[tuple[int, int]] = []
    t, n = 0, seq.size
    while t < n:
        if pos[t] < 0:
            t += 1
            continue
        e = t + 1
        while e < n and e - t < tpb and pos[e] >= 0 and seq[e] == seq[t]:
            e += 1
        out.append((t, e - t))
        t = e
    size = len(out) if size is None else int(size)
    if len(out) > size:
        raise MemraError(f"attn_fa: {len(out)} token groups do not fit a table of {size}")
    tab = np.zeros((max(size, 1), 2), np.int32)
    if out:
        tab[:len(out)] = out
    return tab


def attn_fa(g, q, kcache, vcache, out, part_o, part_ml, pos, seq, block_table, max_blocks: int, *,
            n_tokens: int, n_kv: int, qpk: int, head_dim: int, window: int, scale: float, n_split: int,
            groups=None, n_groups: int = 0, softcap: float = 0.0, split: int = SPLIT, decode: bool = False,
            counters=None, xq=None, xs=None, rope=None, pdl: bool = False, canary: int = 0,
            warps: int = FA_WARPS) -> None:
    """decode: attn_fa_dec over the n_tokens rows (one a block; head_dim % 64 == 0, else
    attn_fa one token a group); it merges a row's splits itself (counters: int32 [n_tokens *
    n_kv], zero), writes the q8 twin when xq / xs are given, and with rope
    (memra.gpu.ops.attention.RopeIn: rows of distinct sequences) ropes Q and appends each
    row's K and V itself (q is then unused), rope_norm_kv's bits. Else attn_fa over `groups`
    (device int32 [n_groups, 2], group_table's), n_groups blocks along x, then fa_combine
    when n_split > 1. warps: the prefill packing's FA_WARPS (groups of warps * 16 / qpk tokens:
    group_table's tpb must be prefill_tpb(qpk, warps)); the decode packing builds with 4."""
    n_head = n_kv * qpk
    if kcache.dtype != np.uint16 or vcache.dtype != np.uint16 or pos.dtype != np.int32:
        raise MemraError("attn_fa: the KV cache holds f16 bits (uint16); pos is int32")
    if part_o.size < n_tokens * n_head * n_split * head_dim or part_ml.size < n_tokens * n_head * n_split * 2:
        raise MemraError("attn_fa: scratch buffers too small for this many tokens / splits")
    dec = decode and can_decode_pack(head_dim)
    if (rope is not None or xq is not None) and not dec:
        raise MemraError("attn_fa: RoPE and the q8 twin fuse only into the decode packing (head_dim % 64 == 0)")
    m = module(g, head_dim, split, kcache.shape[1], canary, FA_WARPS if dec else warps)
    tail = (np.int32(window), np.float32(scale), np.float32(softcap))
    rows = (pos, seq if seq is not None else _NULL, block_table, np.int32(max_blocks))
    if dec:
        if counters is None or counters.dtype != np.int32 or counters.size < n_tokens * n_kv:
            raise MemraError("attn_fa: the decode packing needs int32 counters [n_tokens * n_kv] (zero)")
        if xq is not None and (xq.dtype != np.int8 or xq.size < n_tokens * n_head * head_dim or xs is None):
            raise MemraError("attn_fa: the q8 twin needs int8 xq [n_tokens, n_head * head_dim] and its scales")
        if rope is not None:
            from memra.gpu.ops.rope import check_table

            r = rope
            check_table("attn_fa", r.cs, r.rope_dim, head_dim)
            rargs = (r.q, r.k, r.v, np.int32(r.q_stride), np.int32(r.k_stride), np.int32(r.v_stride),
                     *(x if x is not None else _NULL for x in (r.bias, r.q_norm, r.k_norm)), r.cs,
                     np.int32(r.cs.shape[0]), np.int32(r.rope_dim), np.int32(1 if r.neox else 0), np.float32(r.eps))
        else:
            rargs = (_NULL, _NULL, _NULL, np.int32(0), np.int32(0), np.int32(0), _NULL, _NULL, _NULL, _NULL,
                     np.int32(0), np.int32(0), np.int32(0), np.float32(0))
        g.launch(m.kernel("attn_fa_dec"), (n_tokens, n_kv, n_split), (32 * FA_WARPS,),
                 (q if q is not None else _NULL, *rargs, kcache, vcache, part_o, part_ml, counters, out,
                  xq if xq is not None else _NULL, xs if xs is not None else _NULL, *rows, np.int32(n_kv),
                  np.int32(qpk), *tail), smem_bytes(head_dim, True), pdl=pdl)
        return
    if groups is None or n_groups < 1:
        raise MemraError("attn_fa: the prefill packing needs its token groups (group_table)")
    g.launch(m.kernel("attn_fa"), (n_groups, n_kv, n_split), (32 * warps,),
             (q, kcache, vcache, part_o, part_ml, out, *rows, groups, np.int32(n_kv), np.int32(qpk), *tail),
             smem_bytes(head_dim, False, warps), pdl=pdl)
    if n_split > 1:
        g.launch(m.kernel("fa_combine"), (n_head, n_tokens), (head_dim,),
                 (part_o, part_ml, out, pos, np.int32(window), np.int32(n_split)), pdl=pdl)


def reference(q, kcache, vcache, pos, seq, n_kv: int, window: int, scale: float, softcap: float = 0.0):
    """memra.gpu.ops.attention.reference with q rounded to f16, as the kernel reads it."""
    from memra.gpu.ops.attention import reference as ref

    return ref(np.asarray(q, np.float32).astype(np.float16).astype(np.float32), kcache, vcache, pos, seq, n_kv,
               window, scale, softcap)


# -- kernel-check ------------------------------------------------------------------------

CASES = (  # (head_dim, qpk, n_kv, window, softcap, T, split)
    (64, 3, 3, 0, 0.0, 24, 256),       # smollm2
    (64, 4, 8, 0, 0.0, 20, 256),       # llama-1b
    (128, 4, 2, 0, 0.0, 20, 256),      # llama3-8b head size
    (256, 4, 1, 0, 0.0, 12, 256),      # gemma3 global layers
    (256, 4, 1, 300, 0.0, 12, 256),    # gemma3 sliding window
    (128, 4, 2, 0, 30.0, 8, 128),      # soft-capped scores, smaller splits
    (64, 1, 4, 0, 0.0, 16, 64),        # no GQA, one tile a split
    (64, 8, 1, 0, 0.0, 8, 512),        # wide GQA group
)


def _check(g, rng, case, canary: int = 0):
    """A chunk of T consecutive tokens of one sequence (and T single tokens of other
    sequences): the prefill packing, one token a block and (head_dim % 64 == 0) the decode
    packing must give the same bits, within TOL of the float64 reference."""
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.paging import random_table, scatter

    D, G, nkv, window, cap, T, split = case
    n_ctx, n_seq, blk = 1100, 3, 16
    nh = nkv * G
    kc = (rng.standard_normal((n_seq, n_ctx, nkv, D)) * 0.7).astype(np.float16)
    vc = rng.standard_normal((n_seq, n_ctx, nkv, D)).astype(np.float16)
    table, n_blocks = random_table(rng, n_seq, n_ctx, blk)
    kp = g.to_device(scatter(kc.view(np.uint16).reshape(n_seq, n_ctx, -1), table, n_blocks, blk, 0xFFFF))
    vp = g.to_device(scatter(vc.view(np.uint16).reshape(n_seq, n_ctx, -1), table, n_blocks, blk, 0xFFFF))
    d_table = g.to_device(table)
    q = rng.standard_normal((T, nh, D)).astype(np.float32)
    start = int(rng.integers(0, n_ctx - T))
    pos = np.arange(start, start + T, dtype=np.int32)
    seq = np.zeros(T, np.int32)
    scale = 1.0 / math.sqrt(D)
    n_split = n_splits(n_ctx, split)
    po_shape, pml_shape = scratch_shapes(T, nh, n_split, D)
    part_o, part_ml = g.empty(po_shape, np.float32), g.empty(pml_shape, np.float32)
    out = g.empty((T, nh * D), np.float32)
    d_q, d_pos, d_seq = g.to_device(q), g.to_device(pos), g.to_device(seq)
    name = f"attn_fa D={D} qpk={G} n_kv={nkv} window={window} softcap={cap:g} T={T} split={split}"
    runs = {}
    # "prefill8": the prefill packing built with 8 warps (MEMRA_FA_WARPS=8: 128 rows a block)
    packings = ("prefill", "token", "prefill8") + (("decode",) if can_decode_pack(D) else ())
    counters = g.to_device(np.zeros(T * nkv, np.int32))
    for pk in packings:
        for a in (part_o, part_ml, out):
            a.poison()
        w = 8 if pk == "prefill8" else FA_WARPS
        tab = group_table(seq, pos, prefill_tpb(G, w) if pk.startswith("prefill") else 1, size=T)
        attn_fa(g, d_q, kp, vp, out, part_o, part_ml, d_pos, d_seq, d_table, table.shape[1], n_tokens=T, n_kv=nkv,
                qpk=G, head_dim=D, window=window, scale=scale, n_split=n_split, groups=g.to_device(tab), n_groups=T,
                softcap=cap, split=split, decode=pk == "decode", counters=counters, canary=canary, warps=w)
        runs[pk] = out.numpy()
    if "decode" in packings and np.any(counters.numpy()):
        return Outcome(name, False, "the decode packing left its split counters non-zero")
    ref = reference(q, kc.astype(np.float32), vc.astype(np.float32), pos, seq, nkv, window, scale, cap)
    o = compare(name, runs["prefill"], ref, TOL)
    if not o.ok:
        return o
    for pk in packings[1:]:
        if not np.array_equal(runs[pk].view(np.uint32), runs["prefill"].view(np.uint32)):
            return Outcome(name, False, f"the {pk} packing differs from the prefill packing")
    return Outcome(name, True, o.detail + f"; packings {'/'.join(packings)} bit-identical", o.err)


ROPE_CASES = (  # (head_dim, qpk, n_kv, window, rope_dim, neox, qk_norm, bias, split)
    (64, 3, 3, 0, 64, False, False, False, 256),       # smollm2
    (64, 4, 8, 0, 64, False, False, False, 256),       # llama-1b
    (128, 4, 2, 0, 64, True, False, True, 256),        # partial rotary, QKV bias
    (256, 4, 1, 300, 256, True, True, False, 256),     # gemma3: sliding window, Q/K norm
    (64, 2, 2, 0, 64, False, False, False, 64),        # one tile a split: many splits
)


def _check_rope_fused(g, rng, case, canary: int = 0, T: int = 6, twin: bool = True):
    """The decode packing with RoPE, the KV append, the split merge and the q8 twin inside
    (attn_fa_dec fused) against rope_norm_kv + the one-token prefill packing (+ fa_combine)
    + quantize_q8 on the same inputs: output, K/V rows and q8 twin must be the same bits. T
    decode rows, each its own sequence, at positions with one split, two, many. twin=False:
    the launch without the q8 twin (the f32 path's; no xq), output and K/V rows compared."""
    from memra.gpu.ops import rope as ROPE
    from memra.gpu.ops.attention import rope_in
    from memra.gpu.ops.matvec import quantize_q8
    from memra.gpu.q8 import Q8_SCALE

    D, G, nkv, window, rd, neox, qkn, has_bias, split = case
    nh, n_ctx, f32 = nkv * G, 1100, np.float32
    n_split = n_splits(n_ctx, split)
    x = ROPE.fused_inputs(g, rng, T, n_ctx, nh, nkv, D, rd, qkn, has_bias)
    table, d_table, seq, cache0 = x["table"], x["d_table"], x["seq"], x["cache0"]
    pos_h = np.concatenate([[0, 63, split, n_ctx - 1], rng.integers(1, n_ctx, max(0, T - 4))])[:T].astype(np.int32)
    pos = g.to_device(pos_h)
    po_shape, pml_shape = scratch_shapes(T, nh, n_split, D)
    runs = []
    for fused in (False, True):
        kc, vc = g.to_device(cache0[0]), g.to_device(cache0[1])
        out = g.empty((T, nh * D), f32)
        xq, xs = g.empty((T, nh * D), np.int8), g.empty((T, nh * D // 32), Q8_SCALE)
        part_o, part_ml = g.empty(po_shape, f32), g.empty(pml_shape, f32)
        for a in (out, xq, xs, part_o, part_ml):
            a.poison()
        kw = dict(n_tokens=T, n_kv=nkv, qpk=G, head_dim=D, window=window, scale=1 / math.sqrt(D), n_split=n_split,
                  split=split)
        if fused:
            r = rope_in(x, rd, neox)
            attn_fa(g, None, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1], decode=True,
                    counters=g.to_device(np.zeros(T * nkv, np.int32)), xq=xq if twin else None,
                    xs=xs if twin else None, rope=r, canary=canary, **kw)
        else:
            qr = g.empty((T, nh * D), f32)
            ROPE.unfused_rope(g, x, qr, kc, vc, pos, T=T, nh=nh, nkv=nkv, D=D, rope_dim=rd, neox=neox)
            tab = g.to_device(group_table(np.arange(T), pos_h, 1, size=T))
            attn_fa(g, qr, kc, vc, out, part_o, part_ml, pos, seq, d_table, table.shape[1], groups=tab, n_groups=T,
                    **kw)
            if twin:
                quantize_q8(g, out, xq, xs, T)
        runs.append([out.numpy(), kc.numpy(), vc.numpy()] + ([xq.numpy(), xs.numpy().view(np.uint8)] if twin else []))
    name = (f"attn_fa decode+rope fused D={D} qpk={G} n_kv={nkv} window={window} rope_dim={rd} split={split}"
            f"{' neox' if neox else ''}{' qk_norm' if qkn else ''}{' bias' if has_bias else ''}"
            f"{'' if twin else ' no twin'}")
    return ROPE.fused_verdict(name, runs, "rope_norm_kv + attn_fa" + (" + quantize_q8" if twin else ""))


def compile_variants():
    out = [(KERNEL_FILE, defines(c[0], c[6], warps=w)) for c in CASES for w in (FA_WARPS, 8)]
    out += [(KERNEL_FILE, defines(c[0], c[8])) for c in ROPE_CASES]
    out += [(KERNEL_FILE, defines(64, SPLIT, canary=k)) for k in (1, 3)] + [(KERNEL_FILE, defines(128, SPLIT, canary=2))]
    return list({(f, tuple(sorted(d.items()))): (f, d) for f, d in out}.values())


def checks(g, rng: np.random.Generator) -> Iterator:
    for case in CASES:
        yield _check(g, rng, case)
    for case in ROPE_CASES:
        yield _check_rope_fused(g, rng, case)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, CASES[0], canary=1)
    yield _check(g, rng, CASES[2], canary=2)
    yield _check_rope_fused(g, rng, ROPE_CASES[0], canary=3)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "attention_fa": the module of the model's head size and the plan's
    split, the entry its packing launches (attn_fa_dec for decode rows, RoPE fused or not;
    else attn_fa and fa_combine), the layer's window."""
    c = ctx.cfg
    D = c.head_dim
    split = int(L.args.get("split", SPLIT))
    decode = L.args.get("packing") == "decode" and can_decode_pack(D)
    fused = decode and bool(L.args.get("fused"))
    rows = int(L.rows)
    b = launch_bucket(rows)
    window = int(L.args.get("window", 0))
    rope = [c.rope_dim, bool(c.rope_neox), bool(c.qk_norm), bool(c.qkv_bias)] if fused else None
    twin = fused and bool(L.args.get("twin"))   # the fused decode entry writes the q8 twin where the launch asks
    return [{"file": KERNEL_FILE, "entry": ("attn_fa_dec+rope" if fused else "attn_fa_dec") if decode
             else "attn_fa+fa_combine",
             "defines": defines(D, split, ctx.kv_block,
                                warps=FA_WARPS if decode else int(L.args.get("warps", FA_WARPS))),
             "bucket": b,
             "tag": f"heads={c.n_head}/{c.n_head_kv} window={window}" +
             (" rope_dim={0} neox={1} qk_norm={2} bias={3} twin={4}".format(*rope, twin) if fused else ""),
             "params": {"D": D, "qpk": c.n_gqa, "n_kv": c.n_head_kv, "window": window, "split": split,
                        "T": max(b, 2), "rope": rope, "twin": twin}}]


def check_launch(g, rng, case):
    p = case["params"]
    if p.get("rope") is not None:
        rd, neox, qkn, bias = p["rope"]
        return _check_rope_fused(g, rng, (p["D"], p["qpk"], p["n_kv"], p["window"], rd, neox, qkn, bias, p["split"]),
                                 T=max(int(p["T"]), 4), twin=p.get("twin", True))
    return _check(g, rng, (p["D"], p["qpk"], p["n_kv"], p["window"], 0.0, p["T"], p["split"]))
