"""Per-head Q/K RMSNorm + RoPE + KV-cache append in one launch (kernels/rope.cu).

    cs = g.to_device(rope_table(inv_freq, n_pos))   # once per context size
    rope_norm_kv(g, q, k, v, q_out, kcache, vcache, pos, seq, cs, block_table, max_blocks, n_tokens, ...,
                 config=None)

inv_freq: float64 [rope_dim/2] = freq_scale / (base^(2i/rope_dim) * factor_i), as
memra.cpu.reference.rope_inv_freq computes it; rope_table turns it into the float32 cos/sin of
every position, rounded from float64 exactly as memra.cpu.reference.rope rounds them. K/V
rows go into the paged cache through the block table (kernels/kv.cuh, memra.gpu.paging). The
reference is memra.cpu.reference's rms_norm and rope; the caches hold f16. Tolerances: q 1e-5
relative; cached K/V within one f16 rounding.

A q8_0 side (int8 kcache / vcache, kscale / vscale its f16 scale planes [n_blocks, kv_block,
n_kv * head_dim / 32] as uint16; kernels/kv.cuh): the module is built with KV_K_Q8 / KV_V_Q8 and
the row is quantized by llama.cpp CPU's q8_0 rule (memra.cpu.llamacpp.q8_0_quantize). Its
kernel-check is bit for bit: V's codes and scales against q8_0_quantize of the reference V
(exact), K's against q8_0_quantize of the kernel's own roped q output for a K head given the
same inputs as a Q head (the same rope.cuh arithmetic, so the same float32 bits).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "rope.cu"
WARPS = 4
TOL = 1e-5

_NULL = np.uint64(0)


def warps(config: dict | None) -> int:
    """Heads per block: config {"ROPE_WARPS": w} (a tuning table's choice), else WARPS. Each
    head is one warp's work whatever the block, so it never changes results."""
    w = int((config or {}).get("ROPE_WARPS", WARPS))
    if not 1 <= w <= 32:
        raise MemraError(f"rope: ROPE_WARPS must be in 1..32, got {w}")
    return w


def kv_defines(kv_q8=(False, False)) -> dict:
    """The defines of a KV cache's types (kernels/kv.cuh): KV_K_Q8 / KV_V_Q8 for a q8_0 side,
    nothing for f16 (an f16 module's defines, and so its SASS, are unchanged)."""
    return {**({"KV_K_Q8": 1} if kv_q8[0] else {}), **({"KV_V_Q8": 1} if kv_q8[1] else {})}


def cache_kinds(kcache, vcache, kscale, vscale, who: str, head_dim: int):
    """(k is q8_0, v is q8_0) of a launch's pools, checked: uint16 (f16 bits) or int8 (q8_0
    codes) [n_blocks, block, row] pools, a q8_0 side with its uint16 scale plane [n_blocks,
    block, row / 32] and head_dim % 32 == 0."""
    kinds = []
    for name, c, sc in (("K", kcache, kscale), ("V", vcache, vscale)):
        if c.dtype not in (np.uint16, np.int8) or len(c.shape) != 3:
            raise MemraError(f"{who}: the {name} cache holds f16 bits (uint16) or q8_0 codes (int8) in "
                             f"[n_blocks, block, row] pools")
        q8 = c.dtype == np.int8
        if q8 and (sc is None or sc.dtype != np.uint16 or tuple(sc.shape) != (*c.shape[:2], c.shape[2] // 32)
                   or head_dim % 32):
            raise MemraError(f"{who}: a q8_0 {name} cache needs head_dim % 32 == 0 and its uint16 scale plane "
                             f"[n_blocks, block, row / 32]")
        kinds.append(q8)
    return tuple(kinds)


def module(g, head_dim: int, canary: bool = False, config: dict | None = None, kv_block: int = 16,
           kv_q8=(False, False)):
    d = {"HEAD_DIM": head_dim, "ROPE_WARPS": warps(config), "KV_BLOCK": kv_block, **kv_defines(kv_q8)}
    if canary:
        d["MEMRA_CANARY"] = 1
    return g.module(KERNEL_FILE, d)


def rope_table(inv_freq: np.ndarray, n_pos: int) -> np.ndarray:
    """float32 [n_pos, len(inv_freq), 2]: (cos, sin) of p * inv_freq[i] for p < n_pos,
    evaluated in float64 and rounded to float32 (memra.cpu.reference.rope's values)."""
    theta = np.arange(n_pos, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    return np.stack([np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)], axis=-1)


def check_table(who: str, cs, rope_dim: int, head_dim: int) -> None:
    """A rope_table on the device that fits rope_dim (<= head_dim, even), or MemraError."""
    if cs.dtype != np.float32 or rope_dim > head_dim or rope_dim % 2 or len(cs.shape) != 3 \
            or cs.shape[1:] != (rope_dim // 2, 2):
        raise MemraError(f"{who}: rope_dim {rope_dim} vs head_dim {head_dim} and a float32 cos/sin table "
                         f"[n_pos, rope_dim/2, 2] (got {cs.dtype} {cs.shape})")


def rope_norm_kv(g, q, k, v, q_out, kcache, vcache, pos, seq, cs, block_table, max_blocks: int, *,
                 n_tokens: int, n_head: int, n_kv: int, head_dim: int, rope_dim: int, neox: bool,
                 q_stride: int, k_stride: int, v_stride: int, bias=None, q_norm=None, k_norm=None,
                 eps: float = 1e-6, pdl: bool = False, canary: bool = False, config: dict | None = None,
                 kscale=None, vscale=None) -> None:
    """q/k/v: float32 with token rows of q_stride/k_stride/v_stride floats (views into one
    fused QKV buffer are fine); q_out: [n_tokens, n_head * head_dim] f32;
    kcache/vcache: uint16 (f16 bits) pools [n_blocks, kv_block, n_kv * head_dim]; block_table:
    int32 [n_seq, max_blocks]; pos/seq: int32 [n_tokens] (seq: the block-table row, None: 0;
    pos -1: a padded row, nothing appended), every pos below cs's rows; cs: float32 device array
    [n_pos, rope_dim/2, 2] from rope_table; bias: float32 [(n_head + 2 n_kv) * head_dim] (q, k, v
    biases concatenated) or None. config: {"ROPE_WARPS": w} (default WARPS). kscale / vscale:
    the scale planes of a q8_0 (int8) kcache / vcache (module doc)."""
    kv_q8 = cache_kinds(kcache, vcache, kscale, vscale, "rope_norm_kv", head_dim)
    if block_table.dtype != np.int32:
        raise MemraError("rope_norm_kv: the block table is int32")
    if pos.dtype != np.int32 or q_out.dtype != np.float32:
        raise MemraError("rope_norm_kv: pos int32, q_out float32")
    check_table("rope_norm_kv", cs, rope_dim, head_dim)
    w = warps(config)
    kern = module(g, head_dim, canary, config, kcache.shape[1], kv_q8).kernel("rope_norm_kv")
    sargs = tuple(x if x is not None else _NULL for x in (kscale, vscale)) if any(kv_q8) else ()
    n_units = n_head + 2 * n_kv
    g.launch(kern, ((n_units + w - 1) // w, n_tokens), (32 * w,),
             (q, k, v, np.int32(q_stride), np.int32(k_stride), np.int32(v_stride), q_out, kcache, vcache,
              pos, seq if seq is not None else _NULL, bias if bias is not None else _NULL,
              q_norm if q_norm is not None else _NULL, k_norm if k_norm is not None else _NULL,
              cs, np.int32(cs.shape[0]), block_table, np.int32(max_blocks), np.int32(n_head), np.int32(n_kv),
              np.int32(rope_dim), np.int32(1 if neox else 0), np.float32(eps), *sargs), pdl=pdl)


def reference(q, k, v, pos, inv_freq, neox: bool, q_norm=None, k_norm=None, eps=1e-6, bias=None):
    """q [T, n_head, D], k/v [T, n_kv, D] float32 -> (q_out, k_out, v) as memra.cpu.reference
    computes them (k and v before their f16 rounding)."""
    from memra.cpu.reference import rms_norm, rope

    q = np.asarray(q, np.float32)
    k = np.asarray(k, np.float32)
    v = np.asarray(v, np.float32)
    if bias is not None:  # [q heads, k heads, v heads] * D
        T, nh, D = q.shape
        nkv = k.shape[1]
        b = np.asarray(bias, np.float32).reshape(-1, D)
        q, k, v = q + b[:nh], k + b[nh:nh + nkv], v + b[nh + nkv:]
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
    if k_norm is not None:
        k = rms_norm(k, k_norm, eps)
    pos = np.asarray(pos)
    return rope(q, pos, inv_freq, neox), rope(k, pos, inv_freq, neox), v


# -- kernel-check ------------------------------------------------------------------------

CASES = (  # (head_dim, n_head, n_kv, rope_dim, neox, qk_norm, freq factors, qkv bias)
    (64, 9, 3, 64, False, False, False, False),   # smollm2 / llama
    (64, 4, 2, 64, False, False, True, False),    # llama with rope_freqs
    (256, 4, 1, 256, True, True, False, False),   # gemma3
    (128, 8, 2, 128, True, True, False, False),   # qwen3
    (32, 4, 2, 32, True, False, False, True),     # qwen2 (QKV bias)
    (128, 4, 2, 64, False, False, False, False),  # partial rotary
)


def fused_inputs(g, rng, T: int, n_ctx: int, nh: int, nkv: int, D: int, rope_dim: int, qk_norm: bool,
                 bias: bool, blk: int = 16) -> dict:
    """The inputs of a kernel-check comparing a launch with RoPE and the KV append fused in
    (attention.cu's attn_decode_rope, attn_fa.cu's attn_fa_dec) against rope_norm_kv and the
    unfused launch: T decode rows, each its own sequence (a random block table of n_ctx
    positions); one QKV buffer (rows of `stride` floats) and its q / k / v views, the rope
    table, the optional Q/K norm weights and QKV bias, and the initial K / V pools (host)."""
    from memra.cpu.reference import rope_inv_freq
    from memra.gpu.paging import random_table

    f32 = np.float32
    table, n_blocks = random_table(rng, T, n_ctx, blk)
    stride = (nh + 2 * nkv) * D
    qkv = g.to_device(rng.standard_normal((T, stride)).astype(f32))
    return {
        "table": table, "d_table": g.to_device(table), "stride": stride, "qkv": qkv,
        "views": (qkv.view(shape=(T * stride,)), qkv.view(offset=nh * D * 4), qkv.view(offset=(nh + nkv) * D * 4)),
        "seq": g.to_device(np.arange(T, dtype=np.int32)),  # decode: one row per sequence
        "cs": g.to_device(rope_table(rope_inv_freq(rope_dim, 1e4), n_ctx)),
        "qn": g.to_device(rng.uniform(0.5, 1.5, D).astype(f32)) if qk_norm else None,
        "kn": g.to_device(rng.uniform(0.5, 1.5, D).astype(f32)) if qk_norm else None,
        "bias": g.to_device(rng.standard_normal(stride).astype(f32)) if bias else None,
        "cache0": [(rng.standard_normal((n_blocks, blk, nkv * D)) * 0.5).astype(np.float16).view(np.uint16)
                   for _ in range(2)],
    }


def unfused_rope(g, x: dict, q_out, kcache, vcache, pos, *, T: int, nh: int, nkv: int, D: int, rope_dim: int,
                 neox: bool, kscale=None, vscale=None) -> None:
    """The reference side of such a check: rope_norm_kv over fused_inputs' rows."""
    s = x["stride"]
    rope_norm_kv(g, *x["views"], q_out, kcache, vcache, pos, x["seq"], x["cs"], x["d_table"], x["table"].shape[1],
                 n_tokens=T, n_head=nh, n_kv=nkv, head_dim=D, rope_dim=rope_dim, neox=neox, q_stride=s, k_stride=s,
                 v_stride=s, bias=x["bias"], q_norm=x["qn"], k_norm=x["kn"], eps=1e-6, kscale=kscale, vscale=vscale)


def fused_verdict(name: str, runs, against: str, what=("output", "K cache", "V cache", "q8 twin", "q8 scales")):
    """Outcome of such a check: runs = [unfused, fused], each a list of host arrays in `what`
    order; every one must be the same bits."""
    from memra.gpu.compare import Outcome

    for w, a, b in zip(what, runs[0], runs[1]):
        if not np.array_equal(a, b, equal_nan=True):
            return Outcome(name, False, f"{w} differs from {against}")
    return Outcome(name, True, f"output, q8 twin and K/V rows bit-identical to {against}")


def compile_variants():
    out = [(KERNEL_FILE, {"HEAD_DIM": d, "ROPE_WARPS": WARPS, "KV_BLOCK": 16}) for d in sorted({c[0] for c in CASES})]
    out.append((KERNEL_FILE, {"HEAD_DIM": 64, "ROPE_WARPS": WARPS, "KV_BLOCK": 16, "MEMRA_CANARY": 1}))
    # the q8_0 cache (kernels/kv.cuh): K and V, and each side alone
    out += [(KERNEL_FILE, {"HEAD_DIM": d, "ROPE_WARPS": WARPS, "KV_BLOCK": 16, **kv_defines(kv)})
            for d, kv in Q8_VARIANTS]
    return out


Q8_VARIANTS = ((32, (True, True)), (64, (True, True)), (128, (True, True)), (256, (True, True)),
               (64, (True, False)), (64, (False, True)))


def _check(g, rng, case, canary=False, config=None, T=5):
    from memra.gpu.compare import Outcome, compare
    from memra.cpu.reference import rope_inv_freq

    from memra.gpu.paging import logical, pool_row, random_table

    D, nh, nkv, rd, neox, qkn, ff, has_bias = case
    n_ctx, n_seq, blk = 300, 2, 16
    table, n_blocks = random_table(rng, n_seq, n_ctx, blk)
    qkv = rng.standard_normal((T, (nh + 2 * nkv) * D)).astype(np.float32)
    stride = qkv.shape[1]
    # distinct positions (two tokens appending one cache row would race), one of them large
    pos = np.concatenate([rng.choice(n_ctx // 2, T - 1, replace=False),
                          rng.integers(n_ctx // 2, n_ctx, 1)]).astype(np.int32)
    seq = rng.integers(0, n_seq, T).astype(np.int32)
    base = float(rng.choice([1e4, 1e5, 1e6]))
    factors = rng.uniform(1, 4, rd // 2).astype(np.float32) if ff else None
    inv = rope_inv_freq(rd, base, float(rng.choice([1.0, 0.25])), factors)
    qn = rng.uniform(0.5, 1.5, D).astype(np.float32) if qkn else None
    kn = rng.uniform(0.5, 1.5, D).astype(np.float32) if qkn else None
    eps = 1e-6
    bias = rng.standard_normal((nh + 2 * nkv) * D).astype(np.float32) if has_bias else None

    d_qkv = g.to_device(qkv)
    q_out = g.empty((T, nh * D), np.float32)
    q_out.poison()
    kc = g.empty((n_blocks, blk, nkv * D), np.uint16)
    vc = g.empty((n_blocks, blk, nkv * D), np.uint16)
    kc.poison()
    vc.poison()
    fb = 4
    rope_norm_kv(g, d_qkv.view(shape=(T * stride,)), d_qkv.view(offset=nh * D * fb), d_qkv.view(offset=(nh + nkv) * D * fb),
                 q_out, kc, vc, g.to_device(pos), g.to_device(seq), g.to_device(rope_table(inv, n_ctx)),
                 g.to_device(table), table.shape[1], n_tokens=T, n_head=nh, n_kv=nkv, head_dim=D, rope_dim=rd,
                 neox=neox,
                 q_stride=stride, k_stride=stride, v_stride=stride,
                 bias=g.to_device(bias) if has_bias else None, q_norm=g.to_device(qn) if qkn else None, k_norm=g.to_device(kn) if qkn else None,
                 eps=eps, canary=canary, config=config)
    q = qkv[:, :nh * D].reshape(T, nh, D)
    k = qkv[:, nh * D:(nh + nkv) * D].reshape(T, nkv, D)
    v = qkv[:, (nh + nkv) * D:].reshape(T, nkv, D)
    rq, rk, rv = reference(q, k, v, pos, inv, neox, qn, kn, eps, bias)
    name = f"rope D={D} heads={nh}/{nkv} rope_dim={rd} {'neox' if neox else 'normal'}" + \
           (" qk_norm" if qkn else "") + (" factors" if ff else "") + (" bias" if has_bias else "")
    oq = compare(name + " q", q_out.numpy().reshape(T, nh, D), rq, TOL)
    kh = logical(kc.numpy().view(np.float16), table, n_ctx, blk)
    vh = logical(vc.numpy().view(np.float16), table, n_ctx, blk)
    gk = np.stack([kh[seq[t], pos[t]] for t in range(T)]).astype(np.float32).reshape(T, nkv, D)
    gv = np.stack([vh[seq[t], pos[t]] for t in range(T)]).astype(np.float32).reshape(T, nkv, D)
    # one f16 rounding of values that agree to ~1e-6: 2^-10 relative per element at most
    ok_k = compare(name + " kcache", gk, rk.astype(np.float16).astype(np.float32), 1e-3, kind="max")
    ok_v = compare(name + " vcache", gv, rv.astype(np.float16).astype(np.float32), 0, kind="exact")
    # untouched pool rows must keep their poison (no stray writes)
    mask = np.ones(n_blocks * blk, bool)
    mask[[pool_row(table, int(seq[t]), int(pos[t]), blk) for t in range(T)]] = False
    kp, vp = kc.numpy().reshape(n_blocks * blk, -1), vc.numpy().reshape(n_blocks * blk, -1)
    stray = int(np.count_nonzero(kp[mask] != 0xFFFF) + np.count_nonzero(vp[mask] != 0xFFFF))
    for o in (oq, ok_k, ok_v):
        if not o.ok:
            return o
    if stray:
        return Outcome(name, False, f"{stray} cache elements written outside the appended rows")
    return Outcome(name, True, f"{oq.detail}; k {ok_k.detail}", oq.err)


def q8_pools(g, n_blocks: int, blk: int, row: int, kv_q8) -> tuple:
    """(kcache, vcache, kscale, vscale) on the device, poisoned: int8 codes and uint16 scale
    planes for a q8_0 side, uint16 f16 bits (and None) for an f16 one."""
    out = []
    for q8 in kv_q8:
        c = g.empty((n_blocks, blk, row), np.int8 if q8 else np.uint16)
        sc = g.empty((n_blocks, blk, row // 32), np.uint16) if q8 else None
        for a in (c, sc):
            if a is not None:
                a.poison()
        out.append((c, sc))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def q8_codes(x: np.ndarray):
    """q8_0_quantize of x [..., n] as the pools hold it: int8 codes and f16 scale bits (uint16)."""
    from memra.cpu.llamacpp import q8_0_quantize

    q, d = q8_0_quantize(np.asarray(x, np.float32))
    return q, d.astype(np.float16).view(np.uint16)


def _check_q8(g, rng, case, kv_q8=(True, True), canary=False, config=None, T=5):
    """rope_norm_kv with a q8_0 side: q against the reference at TOL; the appended rows' codes
    and scales bit for bit (V: q8_0 of the reference V; K: q8_0 of the kernel's own q output
    for the Q head whose inputs the K head was given, the same float32 bits by rope.cuh); every
    other pool element untouched."""
    from memra.gpu.compare import Outcome, compare
    from memra.cpu.reference import rope_inv_freq
    from memra.gpu.paging import pool_row, random_table

    D, nh, nkv, rd, neox, qkn, ff, has_bias = case
    n_ctx, n_seq, blk = 300, 2, 16
    table, n_blocks = random_table(rng, n_seq, n_ctx, blk)
    q = rng.standard_normal((T, nh, D)).astype(np.float32)
    q[:, 0] *= np.float32(1e-3)  # a small head: its scales far from the others'
    k = q[:, :nkv].copy()        # K head j = Q head j's inputs
    v = (rng.standard_normal((T, nkv, D)) * rng.choice([0.01, 1.0, 30.0], (T, nkv, 1))).astype(np.float32)
    v[0, 0, :32] = 0.0           # an all-zero group (amax 0: id 0, codes 0, scale 0)
    if not has_bias:  # amax < 127 / FLT_MAX (denormals): id overflows, x * id is not finite, codes -128
        v[-1, -1, :32] = rng.choice([-1e-38, 1e-38, 0.0], 32).astype(np.float32)
    qkv = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
    stride = qkv.shape[1]
    pos = np.concatenate([rng.choice(n_ctx // 2, T - 1, replace=False),
                          rng.integers(n_ctx // 2, n_ctx, 1)]).astype(np.int32)
    seq = rng.integers(0, n_seq, T).astype(np.int32)
    factors = rng.uniform(1, 4, rd // 2).astype(np.float32) if ff else None
    inv = rope_inv_freq(rd, 1e4, 1.0, factors)
    qn = rng.uniform(0.5, 1.5, D).astype(np.float32) if qkn else None
    bias = None
    if has_bias:
        bq = rng.standard_normal((nh, D)).astype(np.float32)
        bias = np.concatenate([bq, bq[:nkv], rng.standard_normal((nkv, D)).astype(np.float32)]).reshape(-1)
    d_qkv = g.to_device(qkv)
    q_out = g.empty((T, nh * D), np.float32)
    q_out.poison()
    kc, vc, ks, vs = q8_pools(g, n_blocks, blk, nkv * D, kv_q8)
    sides = ([kc] + ([ks] if ks is not None else []), [vc] + ([vs] if vs is not None else []))
    before = [[a.numpy().copy() for a in side] for side in sides]
    rope_norm_kv(g, d_qkv.view(shape=(T * stride,)), d_qkv.view(offset=nh * D * 4), d_qkv.view(offset=(nh + nkv) * D * 4),
                 q_out, kc, vc, g.to_device(pos), g.to_device(seq), g.to_device(rope_table(inv, n_ctx)),
                 g.to_device(table), table.shape[1], n_tokens=T, n_head=nh, n_kv=nkv, head_dim=D, rope_dim=rd,
                 neox=neox, q_stride=stride, k_stride=stride, v_stride=stride,
                 bias=g.to_device(bias) if has_bias else None, q_norm=g.to_device(qn) if qkn else None,
                 k_norm=g.to_device(qn) if qkn else None, eps=1e-6, canary=canary, config=config,
                 kscale=ks, vscale=vs)
    rq, rk, rv = reference(q, k, v, pos, inv, neox, qn, qn, 1e-6, bias)
    kinds = "+".join(n for n, x in zip(("K", "V"), kv_q8) if x)
    name = f"rope q8_0 {kinds} D={D} heads={nh}/{nkv} rope_dim={rd} {'neox' if neox else 'normal'}" + \
           (" qk_norm" if qkn else "") + (" factors" if ff else "") + (" bias" if has_bias else "")
    qo = q_out.numpy().reshape(T, nh, D)
    oq = compare(name + " q", qo, rq, TOL)
    if not oq.ok:
        return oq
    rows = [pool_row(table, int(seq[t]), int(pos[t]), blk) for t in range(T)]
    for side, q8, src, arrs, olds in (("K", kv_q8[0], qo[:, :nkv], sides[0], before[0]),
                                      ("V", kv_q8[1], rv, sides[1], before[1])):
        planes = [a.numpy() for a in arrs]
        want = q8_codes(src.reshape(T, -1)) if q8 else \
            (src.reshape(T, -1).astype(np.float16).view(np.uint16),)
        for what, plane, old, w in zip(("codes" if q8 else "f16 bits", "scales"), planes, olds, want):
            flat = plane.reshape(n_blocks * blk, -1)
            got = flat[rows]
            if side == "K" and not q8:  # an f16 K: within one f16 rounding of the reference
                c = compare(name + " kcache", got.view(np.float16).astype(np.float32),
                            rk.reshape(T, -1).astype(np.float16).astype(np.float32), 1e-3, kind="max")
                if not c.ok:
                    return c
            elif not np.array_equal(got, w):
                n = int(np.count_nonzero(got != w))
                return Outcome(name, False, f"{side} {what}: {n} of {w.size} differ from q8_0_quantize")
            mask = np.ones(n_blocks * blk, bool)
            mask[rows] = False
            if not np.array_equal(flat[mask], old.reshape(n_blocks * blk, -1)[mask]):
                return Outcome(name, False, f"{side} {what}: pool elements written outside the appended rows")
    return Outcome(name, True, f"{oq.detail}; q8_0 codes and scales bit-exact", oq.err)


Q8_CASES = (  # (case index in CASES, (K q8_0, V q8_0))
    (0, (True, True)), (2, (True, True)), (3, (True, True)), (4, (True, True)), (5, (True, True)),
    (1, (True, False)), (0, (False, True)),
)


def checks(g, rng: np.random.Generator) -> Iterator:
    for case in CASES:
        yield _check(g, rng, case)
    for i, kv in Q8_CASES:
        yield _check_q8(g, rng, CASES[i], kv)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, CASES[0], canary=True)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "rope" (prefill, or decode with MEMRA_FUSED_ROPE=0): the module of
    the model's head size and the table's ROPE_WARPS, with the model's rope and Q/K facts."""
    c = ctx.cfg
    D = c.head_dim
    rows = int(L.rows)
    b = launch_bucket(rows)
    facts = (D, c.n_head, c.n_head_kv, c.rope_dim, bool(c.rope_neox), bool(c.qk_norm), bool(c.has_rope_freqs),
             bool(c.qkv_bias))
    kv = plan_kv_q8(ctx.plan)
    params = {"case": list(facts), "T": b, "config": dict(L.config) if L.config else None}
    if any(kv):
        params["kv_q8"] = list(kv)
    return [{"file": KERNEL_FILE, "entry": "rope_norm_kv",
             "defines": {"HEAD_DIM": D, "ROPE_WARPS": warps(L.config), "KV_BLOCK": ctx.kv_block, **kv_defines(kv)},
             "bucket": b,
             "tag": "heads={1}/{2} rope_dim={3} neox={4} qk_norm={5} factors={6} bias={7}".format(*facts),
             "params": params}]


def plan_kv_q8(plan) -> tuple:
    """(K q8_0, V q8_0) of a plan's KV cache (memra.gpu.plan.Planner's cache types)."""
    return (getattr(plan, "cache_type_k", "f16") == "q8_0", getattr(plan, "cache_type_v", "f16") == "q8_0")


def check_launch(g, rng, case):
    p = case["params"]
    if case["defines"].get("KV_BLOCK", 16) != 16:
        raise MemraError("rope check_launch: the checks use 16-position KV blocks")
    if p.get("kv_q8"):
        return _check_q8(g, rng, tuple(p["case"]), tuple(p["kv_q8"]), config=p["config"], T=p["T"])
    return _check(g, rng, tuple(p["case"]), config=p["config"], T=p["T"])


# -- tune hook (memra/tune/measure.py): kernel "rope_norm_kv", variant "default", shape
# {n_head, n_head_kv, head_dim}, batch tokens; config {"ROPE_WARPS": w}

# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"rope_norm_kv": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"rope tune: unknown kernel/variant {kernel}/{variant}")
    return _TuneCase(g, dict(config or {}), int(shape["n_head"]), int(shape["n_head_kv"]), int(shape["head_dim"]),
                     int(shape.get("batch", 1)), rng, rotate_bytes)


_TUNE_CTX = 16  # cache rows per sequence in the timing copies (only the row written matters)
_TUNE_BLOCK = _TUNE_CTX  # one KV block per sequence


class _TuneCase:
    """A decode step's launch: one token per sequence (batch tokens), full-width rotary
    (normal pairing, no Q/K norm), the fused QKV row as input; `sets` copies of the QKV rows,
    q_out and the two caches."""

    def __init__(self, g, config, nh, nkv, D, T, rng, rotate_bytes):
        from memra.cpu.reference import rope_inv_freq

        warps(config)  # a bad value fails here: a failed receipt
        if D % 2:
            raise MemraError(f"rope tune: head_dim must be even, got {D}")
        self.g, self.config, self.nh, self.nkv, self.D, self.T, self.rng = g, config, nh, nkv, D, T, rng
        self.stride = (nh + 2 * nkv) * D
        qkv_b, qo_b, kv_b = T * self.stride * 4, T * nh * D * 4, T * _TUNE_CTX * nkv * D * 2
        # read q/k/v and the cos/sin row, write q_out and one K and one V row per token
        self.bytes = qkv_b + T * D * 4 + qo_b + 2 * T * nkv * D * 2
        self.sets = max(1, -(-rotate_bytes // (qkv_b + qo_b + 2 * T * nkv * D * 2)))
        host = rng.standard_normal(T * self.stride).astype(np.float32)
        self.qkv = g.to_device(np.tile(host, self.sets))
        self.q_out = g.empty(self.sets * T * nh * D, np.float32)
        self.kc = g.empty(self.sets * kv_b // 2, np.uint16)
        self.vc = g.empty(self.sets * kv_b // 2, np.uint16)
        self.pos = g.to_device(rng.integers(0, _TUNE_CTX, T).astype(np.int32))
        self.seq = g.to_device(np.arange(T, dtype=np.int32))
        self.cs = g.to_device(rope_table(rope_inv_freq(D, 1e4, 1.0, None), _TUNE_CTX))
        self.table = g.to_device(np.arange(T, dtype=np.int32).reshape(T, 1))

    def launch(self, i: int) -> None:
        T, D, nh, nkv, st = self.T, self.D, self.nh, self.nkv, self.stride
        base = 4 * T * st * i
        q = self.qkv.view(np.float32, (T * st,), base)
        k = self.qkv.view(np.float32, (T * st - nh * D,), base + 4 * nh * D)
        v = self.qkv.view(np.float32, (T * st - (nh + nkv) * D,), base + 4 * (nh + nkv) * D)
        cache = (T * _TUNE_CTX // _TUNE_BLOCK, _TUNE_BLOCK, nkv * D)  # block t holds sequence t
        cb = 2 * T * _TUNE_CTX * nkv * D * i
        rope_norm_kv(self.g, q, k, v, self.q_out.view(np.float32, (T, nh * D), 4 * T * nh * D * i),
                     self.kc.view(np.uint16, cache, cb), self.vc.view(np.uint16, cache, cb), self.pos, self.seq,
                     self.cs, self.table, 1, n_tokens=T, n_head=nh, n_kv=nkv, head_dim=D, rope_dim=D,
                     neox=False, q_stride=st, k_stride=st, v_stride=st, config=self.config)

    def check(self):
        """The kernel-check on fresh inputs at this head shape and token count (q, cached K
        and V against memra.cpu.reference, no stray cache writes), with this configuration."""
        o = _check(self.g, self.rng, (self.D, self.nh, self.nkv, self.D, False, False, False, False),
                   config=self.config, T=self.T)
        return o.ok, o.err, o.detail
