"""The GPU engine: weights on the device in their GGUF block formats, an f16 KV cache,
batched prefill, and a decode step captured as one CUDA graph with the next token chosen
on the device.

    e = GPUEngine("model.gguf", n_ctx=4096)
    logits = e.prefill(ids)                 # appends ids, float32 [n_vocab] of the last one
    logits = e.decode(token)                # appends one token
    ids = e.generate_greedy(prompt_ids, n)  # graph replays; 4 bytes a token come back
    ids = e.generate(prompt_ids, n, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    gate = argmax_gate(e, prompt_ids)       # prefill vs token-by-token decode

It also speaks the CPU reference's protocol (`new_cache(n_ctx)`, `forward(tokens, cache)`),
so memra.generate and the CLI drive it like `memra.cpu.reference.ReferenceModel`.

One decode step, per layer: QKV matvec (one launch when Q, K and V share a type) → Q/K
norm + RoPE + KV append → split-KV attention + combine → output projection (residual add
fused into the matvec, or a post-norm + residual + next norm for gemma3) → RMSNorm →
gate+up matvec with the activation fused → down projection (residual fused). Then the
output norm, the vocabulary matvec and argmax/sampling, which writes the next token and
advances the position in device memory: replaying the graph needs no host work.

Numerics: every kernel reduces a row in an order fixed by its shape alone, and the
attention split layout depends only on the number of keys, so prefill (many rows per
launch) and decode (one row) give the same bits, as do a sequence alone or in a batch.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from memra.model import quants as Q
from memra.tune import tables as TUNE
from memra.model.config import ModelConfig, read_config
from memra.errors import ContextOverflowError, MemraError, UnsupportedModelError
from memra.model.gguf import GGUFFile, open_gguf, type_name
from memra.tune.receipts import shape_key, shape_of_key
from memra.gpu.ops import act as ACT
from memra.gpu.ops import attention as ATT
from memra.gpu.ops import embed as EMB
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import norm as NORM
from memra.gpu.ops import rope as ROPE
from memra.gpu.ops import sample as SMP

log = logging.getLogger("memra.engine")

PREFILL_CHUNK = 128  # prompt tokens per batched forward pass
NEAR_TIE = 0.05  # argmax gate: a top-2 logit margin below this is a near-tie


@dataclass
class _Layer:
    attn_norm: object
    ffn_norm: object
    qkv: list  # linears: [QKV] or [QK, V] or [Q, K, V]
    wo: object
    ffn: object  # fused gate+up linear (glu) or None
    gate: object  # separate gate / up linears when their types differ
    up: object
    down: object
    rope_key: tuple  # (base, scale): the layer's RoPE table in GPUEngine.rope_cs
    window: int
    bias: object = None
    q_norm: object = None
    k_norm: object = None
    post_attn: object = None
    post_ffw: object = None


@dataclass
class _Lin:
    w: object  # memra.gpu.ops.matvec.Weight
    glu: str | None = None  # "silu" / "gelu": w stacks [gate; up], the output is act(gate) * up

    @property
    def n_rows(self) -> int:  # output values per token
        return self.w.rows // 2 if self.glu else self.w.rows


@dataclass
class GPUCache:
    """A handle on the engine's KV cache (the reference protocol's cache object). `pos`
    tokens are stored; setting it lower rewinds."""
    engine: "GPUEngine"
    n_ctx: int
    seq: int = 0
    pos: int = 0


class GPUEngine:
    def __init__(self, model, cfg: ModelConfig | None = None, n_ctx: int | None = None,
                 batch: int = 1, gpu=None, matvec_path: str | None = None, pdl: bool | None = None,
                 tune_table=None):
        """tune_table: which tuning table the launches take their configurations from —
        None (MEMRA_TUNE_TABLE, else "auto"), "auto" (this device's table, else one of its
        compute capability, else none), "builtin" (none: every launcher's built-in default),
        a table file, or an already loaded table (memra.tune.tables.resolve_table's dict)."""
        from memra.gpu.cuda import gpu as get_gpu

        self.gguf: GGUFFile = model if isinstance(model, GGUFFile) else open_gguf(model)
        self.cfg = cfg or read_config(self.gguf)
        self._validate()
        self.g = gpu or get_gpu()
        self._open_tune_table(tune_table)
        self.batch = int(batch)
        # "q8" (default): activations quantized to int8 per 32 (dp4a), as llama.cpp does, the
        # CPU reference's numerics="q8" is its oracle; "f32" (rollback seam): activations stay
        # float32, weights dequantized in registers (oracle: numerics="f32"). Float weight
        # types always take the f32 path.
        self.path = matvec_path or os.environ.get("MEMRA_MATVEC_PATH", "q8")
        if self.path not in ("f32", "q8"):
            raise MemraError(f"matvec path must be f32 or q8, got {self.path!r}")
        # decode: RoPE and the KV append inside the attention launch (rows are distinct sequences)
        self.fuse_rope = os.environ.get("MEMRA_FUSED_ROPE", "1") != "0"
        # programmatic dependent launch: each kernel's launch overlaps the previous one's tail
        self.pdl = (os.environ.get("MEMRA_PDL", "1") != "0") if pdl is None else bool(pdl)
        if not 1 <= self.batch <= MV.BUCKETS[-1]:
            raise MemraError(f"batch must be in 1..{MV.BUCKETS[-1]}, got {batch}")
        self._fixed_configs()  # norms, RoPE, attention: one configuration at every row count
        t0 = time.perf_counter()
        self._load_weights()
        log.info("weights on the device in %.2f s (%.0f MB)", time.perf_counter() - t0, self.weight_bytes / 1e6)
        self.n_ctx = 0
        self._graphs: dict[str, object] = {}
        self._alloc_activations()
        if n_ctx:
            self._alloc_cache(int(n_ctx))
        self.pos = [0] * self.batch  # host mirror: tokens stored per sequence

    # -- set-up ---------------------------------------------------------------------------
    def _open_tune_table(self, which) -> None:
        if isinstance(which, dict):
            self.tune_table, self.tune_source = which, "given"
        else:
            which = (os.environ.get("MEMRA_TUNE_TABLE") or "auto") if which is None else str(which)
            info = self.g.info
            self.tune_table, self.tune_source = TUNE.resolve_table(which, info.name, info.cc, sms=info.sm_count)
        self._choices: dict[tuple, dict | None] = {}

    def _tuned(self, kernel: str, shape: dict, batch: int, variant: str = "default") -> dict | None:
        """The tuning table's configuration for one launch, or None (the launcher's built-in
        default). Looked up when launches are issued on the host (set-up, prefill, graph
        capture), cached per kernel, shape and batch bucket; a graph replay never looks."""
        key = (kernel, variant, tuple(sorted(shape.items())), TUNE.batch_bucket(batch))
        if key not in self._choices:
            ch = TUNE.lookup(self.tune_table, kernel, shape, batch)
            cfg = None
            if ch is not None and ch.variant != variant:
                # e.g. an f32-path matvec winner while this engine runs the q8 path: the
                # variant decides the numerics, so the engine's path is not switched per shape
                log.info("tuning: %s %s b%d: the table's variant %s is not this engine's %s; built-in "
                         "default used", kernel, shape, batch, ch.variant, variant)
            elif ch is not None and ch.config.get("MV_KSPLIT", 1) != 1:
                # split-K changes a row's summation order: prefill and decode would no longer
                # give the same bits (the engine's batch-invariance contract)
                log.warning("tuning: %s %s b%d: MV_KSPLIT=%s is not used (it would make results depend "
                            "on the batch); built-in default used", kernel, shape, batch, ch.config["MV_KSPLIT"])
            elif ch is not None:
                cfg = dict(ch.config)
                log.debug("tuning: %s %s b%d: %s", kernel, shape, batch, cfg)
            self._choices[key] = cfg
        return self._choices[key]

    def _fixed_configs(self) -> None:
        """The table's choices for the norms, RoPE and attention, looked up once, for the
        batch-1 bucket, and used by every launch of their shape at any row count:
        NORM_THREADS and ATT_WARPS/ATT_TILE/ATT_MIN_CHUNK set a row's reduction order, so
        prefill and decode must share them (the batch-invariance contract, as MV_KSPLIT is
        refused); ROPE_WARPS and hpb never change bits and simply come along. Attention
        entries are per context length: the one measured at the shortest ctx is taken (the
        short-context decode the campaign times). An entry the launcher refuses for this
        model is logged and the built-in default used."""
        c = self.cfg
        E = c.n_embd

        def checked(kernel, shape, validate):
            cfg = self._tuned(kernel, shape, 1) if shape is not None else None
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
        heads = {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}
        self.rope_cfg = checked("rope_norm_kv", heads, ROPE.warps)
        ctxs = []  # the context lengths the table has a batch-1 attention entry for
        for key in self.tune_table.get("entries", {}).get("attn_decode", {}):
            ctx = shape_of_key(key).get("ctx")
            if ctx is not None and key == shape_key({**heads, "ctx": ctx}) and \
                    TUNE.lookup(self.tune_table, "attn_decode", key, 1) is not None:
                ctxs.append(int(ctx))

        def att_ok(d):
            ATT.defines(c.head_dim, d)
            if c.n_gqa % int(d.get("hpb", 1)):
                raise MemraError(f"hpb={d['hpb']} does not divide the {c.n_gqa} query heads per KV head")

        self.att_cfg = checked("attn_decode", {**heads, "ctx": min(ctxs)} if ctxs else None, att_ok)
        # query heads per attention block; the splits follow the number of head blocks
        self.att_hpb = int((self.att_cfg or {}).get("hpb", 0)) or ATT.heads_per_block(c.n_head_kv, c.n_gqa)
        self.n_splits = ATT.default_splits(c.n_head // self.att_hpb, self.g.info.sm_count)

    def _validate(self) -> None:
        c = self.cfg
        if c.head_dim_v != c.head_dim:
            raise UnsupportedModelError(f"head sizes K {c.head_dim} != V {c.head_dim_v} are not supported on the GPU")
        if c.head_dim % 8 or c.head_dim > 1024:
            raise UnsupportedModelError(f"head size {c.head_dim} is not supported on the GPU (multiple of 8, <= 1024)")
        for dim, what in ((c.n_embd, "n_embd"), (c.n_ff, "n_ff"), (c.q_dim, "n_head * head_dim")):
            if dim % 64:
                raise UnsupportedModelError(f"{what} = {dim} is not a multiple of 64 (the GPU matvec's unit)")

    def _f32(self, name: str):
        return self.g.to_device(Q.dequantize_tensor(self.gguf.tensor(name)).astype(np.float32).reshape(-1))

    def _linear(self, names: Sequence[str], glu: str | None = None) -> "_Lin":
        """One weight on the device; several tensors of one type are stacked by rows
        (fused QKV; gate+up with the activation applied in the matvec when glu is set)."""
        ts = [self.gguf.tensor(n) for n in names]
        w = MV.upload_weight(self.g, [t.data.reshape(t.rows, t.row_bytes()) for t in ts], ts[0].ggml_type)
        self.weight_bytes += w.nbytes
        return _Lin(w, glu)

    def _load_weights(self) -> None:
        c, gg = self.cfg, self.gguf
        self.weight_bytes = 0
        emb = gg.tensor("token_embd.weight")
        self.embd_type = emb.ggml_type
        EMB.kernel_name(emb.ggml_type)  # raises for a type the gather does not read
        self.embd_table = self.g.to_device(np.ascontiguousarray(emb.data))
        self.weight_bytes += emb.n_bytes
        self.output = self._linear(["token_embd.weight" if c.tied_output else "output.weight"])
        self.output_norm = self._f32("output_norm.weight")
        act = "gelu" if c.act == "gelu_tanh" else "silu"
        factors = Q.dequantize_tensor(gg.tensor("rope_freqs.weight")) if c.has_rope_freqs else None
        from memra.cpu.reference import rope_inv_freq

        self.layers: list[_Layer] = []
        self.rope_inv: dict[tuple, np.ndarray] = {}  # float64 inverse frequencies per (base, scale)
        self.rope_cs: dict[tuple, object] = {}  # their cos/sin tables, [n_ctx, rope_dim/2, 2]
        for il in range(c.n_layer):
            p = f"blk.{il}."
            names = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
            types = [gg.tensor(n).ggml_type for n in names]
            # Q, K, V as one matvec when they share a type (gemma3 Q4_K_M mixes Q8_0 V in)
            if len(set(types)) == 1:
                groups = [names]
            elif types[0] == types[1]:
                groups = [names[:2], names[2:]]
            else:
                groups = [[n] for n in names]
            qkv = [self._linear(grp) for grp in groups]
            gate_t = gg.tensor(p + "ffn_gate.weight").ggml_type
            up_t = gg.tensor(p + "ffn_up.weight").ggml_type
            if gate_t == up_t:
                ffn, gate, up = self._linear([p + "ffn_gate.weight", p + "ffn_up.weight"], glu=act), None, None
            else:
                ffn, gate, up = None, self._linear([p + "ffn_gate.weight"]), self._linear([p + "ffn_up.weight"])
            swa = c.is_swa(il)
            scale = 1.0 if (swa and c.rope_base_swa is not None) else c.rope_freq_scale
            key = (c.layer_rope_base(il), scale)
            if key not in self.rope_inv:
                self.rope_inv[key] = rope_inv_freq(c.rope_dim, key[0], key[1], factors).astype(np.float64)
            bias = None
            if c.qkv_bias:
                bias = self.g.to_device(np.concatenate([
                    Q.dequantize_tensor(gg.tensor(p + f"attn_{x}.bias")).reshape(-1) for x in "qkv"]).astype(np.float32))
            self.layers.append(_Layer(
                attn_norm=self._f32(p + "attn_norm.weight"), ffn_norm=self._f32(p + "ffn_norm.weight"),
                qkv=qkv, wo=self._linear([p + "attn_output.weight"]), ffn=ffn, gate=gate, up=up,
                down=self._linear([p + "ffn_down.weight"]), rope_key=key,
                window=c.swa_window if swa else 0, bias=bias,
                q_norm=self._f32(p + "attn_q_norm.weight") if c.qk_norm else None,
                k_norm=self._f32(p + "attn_k_norm.weight") if c.qk_norm else None,
                post_attn=self._f32(p + "post_attention_norm.weight") if c.post_norms else None,
                post_ffw=self._f32(p + "post_ffw_norm.weight") if c.post_norms else None))

    def _alloc_activations(self) -> None:
        c, g = self.cfg, self.g
        R = self.rows = max(self.batch, PREFILL_CHUNK)
        f = np.float32
        self.qkv_dim = c.q_dim + 2 * c.kv_dim
        self.x = g.empty((R, c.n_embd), f)
        self.h = g.empty((R, c.n_embd), f)
        self.t1 = g.empty((R, c.n_embd), f)
        self.qkv = g.empty((R, self.qkv_dim), f)  # the QKV matvec's output(s), see _qkv_views
        self.qr = g.empty((R, c.q_dim), f)
        self.ao = g.empty((R, c.q_dim), f)
        self.ff = g.empty((R, c.n_ff), f)
        self.ff2 = g.empty((R, c.n_ff), f)
        # int8 twin of whichever activation feeds the next matvec(s) (q8 path): each is
        # consumed before the next one is quantized, so one buffer serves all of them
        kmax = max(c.n_embd, c.q_dim, c.n_ff)
        self.xq = g.empty(R * kmax, np.int8)
        self.xs = g.empty(R * kmax // 32, MV.Q8_SCALE)
        po, pml = ATT.scratch_shapes(R, c.n_head, self.n_splits, c.head_dim)
        self.part_o, self.part_ml = g.empty(po, f), g.empty(pml, f)
        self.att_cnt = g.to_device(np.zeros(R * c.n_head, np.int32))  # zero between launches
        self.logits = g.empty((self.batch, c.n_vocab), f)
        self.logits_all = None  # [PREFILL_CHUNK, n_vocab], made on the first all_logits request
        i32 = np.int32
        # prefill rows
        self.p_tok, self.p_pos, self.p_seq = g.empty(R, i32), g.empty(R, i32), g.empty(R, i32)
        # decode state, one row per sequence: the graph reads tok/pos, the sampler writes them
        self.d_tok, self.d_pos = g.empty(self.batch, i32), g.empty(self.batch, i32)
        self.d_seq = g.to_device(np.arange(self.batch, dtype=i32))
        self.d_step = g.to_device(np.zeros(self.batch, i32))
        self.hist_len = 0
        self.d_hist = None
        self.am_val = g.empty(self.batch * SMP.ARGMAX_BLOCKS, f)
        self.am_idx = g.empty(self.batch * SMP.ARGMAX_BLOCKS, i32)
        self.s_fparams = g.to_device(np.zeros((self.batch, 3), f))
        self.s_topk = g.to_device(np.zeros(self.batch, i32))
        self.s_seed = g.to_device(np.zeros(self.batch, np.uint64))
        self._ensure_hist(256)

    def _ensure_hist(self, n: int) -> None:
        if n <= self.hist_len:
            return
        self.hist_len = max(n, 2 * self.hist_len)
        self.d_hist = self.g.empty((self.batch, self.hist_len), np.int32)
        self._drop_graphs()  # the graphs point at the old history buffer

    def _alloc_cache(self, n_ctx: int) -> None:
        c = self.cfg
        if n_ctx > c.n_ctx_train:
            log.warning("context %d exceeds the model's training context %d", n_ctx, c.n_ctx_train)
        self.kv_bytes = 2 * c.n_layer * self.batch * n_ctx * c.kv_dim * 2
        self.kcache = [self.g.empty((self.batch, n_ctx, c.kv_dim), np.uint16) for _ in range(c.n_layer)]
        self.vcache = [self.g.empty((self.batch, n_ctx, c.kv_dim), np.uint16) for _ in range(c.n_layer)]
        self.rope_cs = {k: self.g.to_device(ROPE.rope_table(inv, n_ctx)) for k, inv in self.rope_inv.items()}
        self.n_ctx = n_ctx
        self._drop_graphs()
        self.pos = [0] * self.batch

    def _drop_graphs(self) -> None:
        for gr in self._graphs.values():
            gr.close()
        self._graphs = {}

    # -- the forward pass -------------------------------------------------------------------
    def _twin(self, rows: int, K: int):
        """The int8 twin buffer viewed as [rows, K] (+ scales); None on the f32 path."""
        if self.path != "q8":
            return None
        return self.xq.view(shape=(rows, K)), self.xs.view(shape=(rows, K // 32))

    def _q8(self, x, rows: int):
        """Quantize `rows` rows of x (q8 path) for the matvecs that read it next; None on
        the f32 path."""
        K = x.shape[-1] if len(x.shape) > 1 else x.size // rows
        tw = self._twin(rows, K)
        if tw is not None:
            MV.quantize_q8(self.g, x.view(shape=(rows, K)), tw[0], tw[1], rows,
                           config=self._tuned("quantize_q8", {"n": K}, rows))
        return tw

    def _matvec(self, lin: _Lin, x, y, rows: int, res=None, q=None) -> None:
        w = lin.w
        variant = "q8" if q is not None and w.ggml_type not in MV.FLOAT_TYPES else "f32"
        shape = {"type": MV.TYPES[w.ggml_type][0], "rows": w.rows, "cols": w.K}
        kernel = "matvec_glu" if lin.glu else "matvec"

        def tuned(n: int):  # per launch of n rows (the launcher chunks batches by 8)
            return self._tuned(kernel, shape, n, variant)

        if variant == "q8":
            MV.matvec(self.g, w, y, xq=q[0], xs=q[1], nb=rows, residual=res, glu=lin.glu, pdl=self.pdl,
                      tuned=tuned)
        else:
            MV.matvec(self.g, w, y, x=x, nb=rows, residual=res, glu=lin.glu, pdl=self.pdl, tuned=tuned)

    def _norm(self, w, rows: int, delta=None, w_post=None):
        """h = rmsnorm(x) * w, after x += delta (post-normed when w_post): one launch that
        also writes h's q8 twin on the q8 path. Returns that twin (or None)."""
        c, E = self.cfg, self.cfg.n_embd
        tw = self._twin(rows, E)
        xq, xs = tw if tw is not None else (None, None)
        if delta is None:
            NORM.rmsnorm(self.g, self.x, w, self.h, E, c.norm_eps, rows, xq=xq, xs=xs, pdl=self.pdl,
                         config=self.norm_cfg["rmsnorm"])
        else:
            NORM.add_rmsnorm(self.g, self.x, delta, w, self.h, E, c.norm_eps, rows, w_post=w_post,
                             xq=xq, xs=xs, pdl=self.pdl, config=self.norm_cfg["add_rmsnorm"])
        return tw

    def _layers(self, rows: int, tok, pos, seq, decode: bool = False) -> None:
        """Embed `rows` tokens and run every layer; leaves rmsnorm(x) * output_norm in h
        (and, on the q8 path, its twin in xq/xs). Returns that twin."""
        c, g, pdl = self.cfg, self.g, self.pdl
        E = c.n_embd
        EMB.embed(g, self.embd_table, self.embd_type, c.n_vocab, E, tok, self.x, c.embd_scale, n_tokens=rows,
                  pdl=pdl, config=self._tuned("embed", {"type": type_name(self.embd_type), "n": E}, rows))
        qh = self._norm(self.layers[0].attn_norm, rows)
        att_q8 = self.path == "q8" and c.head_dim % 32 == 0
        for il, L in enumerate(self.layers):
            q, k, v, qs, ks, vs = self._qkv_views(L, rows, qh)
            rope = None
            if decode and self.fuse_rope:  # one row per sequence: attention ropes and appends itself
                rope = ATT.RopeIn(q, k, v, qs, ks, vs, self.rope_cs[L.rope_key], c.rope_dim, c.rope_neox,
                                  c.norm_eps, L.bias, L.q_norm, L.k_norm)
            else:
                ROPE.rope_norm_kv(
                    g, q, k, v, self.qr, self.kcache[il], self.vcache[il], pos, seq, self.rope_cs[L.rope_key],
                    n_tokens=rows, n_head=c.n_head, n_kv=c.n_head_kv, head_dim=c.head_dim, n_ctx=self.n_ctx,
                    rope_dim=c.rope_dim, neox=c.rope_neox, q_stride=qs, k_stride=ks, v_stride=vs,
                    bias=L.bias, q_norm=L.q_norm, k_norm=L.k_norm, eps=c.norm_eps, pdl=pdl, config=self.rope_cfg)
            tw = self._twin(rows, c.q_dim) if att_q8 else None
            ATT.attention(g, self.qr, self.kcache[il], self.vcache[il], self.ao, self.part_o, self.part_ml,
                          pos, seq, n_tokens=rows, n_kv=c.n_head_kv, n_gqa=c.n_gqa, head_dim=c.head_dim,
                          n_ctx=self.n_ctx, window=L.window, scale=c.scale, n_splits=self.n_splits,
                          counters=self.att_cnt, xq=tw[0] if tw else None, xs=tw[1] if tw else None, pdl=pdl,
                          hpb=self.att_hpb, config=self.att_cfg, rope=rope)
            qa = tw if att_q8 else self._q8(self.ao, rows)
            if c.post_norms:
                self._matvec(L.wo, self.ao, self.t1, rows, q=qa)
                qh = self._norm(L.ffn_norm, rows, delta=self.t1, w_post=L.post_attn)
            else:
                self._matvec(L.wo, self.ao, self.x, rows, res=self.x, q=qa)
                qh = self._norm(L.ffn_norm, rows)
            if L.ffn is not None:
                self._matvec(L.ffn, self.h, self.ff, rows, q=qh)
            else:
                self._matvec(L.gate, self.h, self.ff, rows, q=qh)
                self._matvec(L.up, self.h, self.ff2, rows, q=qh)
                ACT.act_mul(g, self.ff, self.ff2, self.ff, c.n_ff, rows, c.act, pdl=pdl,
                            config=self._tuned("act_mul", {"n": c.n_ff}, rows))
            qf = self._q8(self.ff, rows)
            nxt = self.layers[il + 1].attn_norm if il + 1 < len(self.layers) else self.output_norm
            if c.post_norms:
                self._matvec(L.down, self.ff, self.t1, rows, q=qf)
                qh = self._norm(nxt, rows, delta=self.t1, w_post=L.post_ffw)
            else:
                self._matvec(L.down, self.ff, self.x, rows, res=self.x, q=qf)
                qh = self._norm(nxt, rows)
        return qh

    def _qkv_views(self, L: _Layer, rows: int, qh=None):
        """Run the layer's QKV matvec(s) on h; returns the q, k, v views and their row strides.
        Each matvec writes rows of its own width, packed one after another in self.qkv."""
        c = self.cfg
        outs, off = [], 0
        for lin in L.qkv:
            y = self.qkv.view(offset=off, shape=(rows, lin.n_rows))
            self._matvec(lin, self.h, y, rows, q=qh)
            outs.append((y, lin.n_rows))
            off += rows * lin.n_rows * 4
        if len(outs) == 1:
            (y, w), = outs
            return y, y.view(offset=c.q_dim * 4), y.view(offset=(c.q_dim + c.kv_dim) * 4), w, w, w
        if len(outs) == 2:
            (y, w), (yv, wv) = outs
            return y, y.view(offset=c.q_dim * 4), yv, w, w, wv
        (yq, wq), (yk, wk), (yv, wv) = outs
        return yq, yk, yv, wq, wk, wv

    def _output(self, h_rows, out, rows: int, qh=None) -> None:
        """Logits of `rows` rows of h; qh: their q8 twin when already made (else made here)."""
        self._matvec(self.output, h_rows, out, rows, q=qh if qh is not None else self._q8(h_rows, rows))
        if self.cfg.final_logit_softcap:
            ACT.softcap(self.g, out, self.cfg.n_vocab, self.cfg.final_logit_softcap, rows, pdl=self.pdl)

    def _decode_step(self, sampler: str) -> None:
        """All launches of one decode step for the `batch` sequences (captured as a graph)."""
        B = self.batch
        qh = self._layers(B, self.d_tok, self.d_pos, self.d_seq, decode=True)
        self._output(self.h, self.logits, B, qh)
        st = SMP.SeqState(tok=self.d_tok, step=self.d_step, pos=self.d_pos, hist=self.d_hist)
        if sampler == "greedy":
            SMP.argmax(self.g, self.logits, self.cfg.n_vocab, B, st, self.am_val, self.am_idx, pdl=self.pdl,
                       config=self._tuned("argmax", {"n": self.cfg.n_vocab}, B))
        elif sampler == "sample":
            SMP.sample(self.g, self.logits, self.cfg.n_vocab, B, self.s_fparams, self.s_topk, self.s_seed, st,
                       pdl=self.pdl)
        # "none": logits only (pos is advanced by the host)

    def _graph(self, sampler: str):
        """The captured decode step. Before the first capture the step runs once eagerly
        without a sampler, so every module is compiled and loaded outside the capture; it
        computes exactly what the first replay recomputes (the KV row at d_pos for d_tok),
        so callers capture only once d_tok/d_pos hold the next step's input."""
        gr = self._graphs.get(sampler)
        if gr is None:
            self._decode_step("none")
            with self.g.capture() as gr:
                self._decode_step(sampler)
            gr.upload()
            self._graphs[sampler] = gr
        return gr

    # -- public API -------------------------------------------------------------------------
    def reset(self, n_ctx: int | None = None) -> None:
        """Forget every sequence (and resize the KV cache when n_ctx differs)."""
        if n_ctx is not None and n_ctx != self.n_ctx:
            self._alloc_cache(n_ctx)
        self.pos = [0] * self.batch

    def bytes_per_token(self, depth: int = 0) -> int:
        """Device bytes one decode step reads with `depth` tokens already in the KV cache:
        every weight matrix and norm/bias vector on the device (the output projection too,
        even when it is the tied embedding table), one row of the input embedding table, and
        the f16 K and V rows attention reads (depth + 1 keys; at most the window on
        sliding-window layers). Activations, the rope tables and the KV row written are left
        out. tok/s x this = the achieved bandwidth of the decode roofline (memra bench)."""
        c = self.cfg
        mats, vecs = [self.output], [self.output_norm]
        for L in self.layers:
            mats += [*L.qkv, L.wo, L.ffn, L.gate, L.up, L.down]
            vecs += [L.attn_norm, L.ffn_norm, L.q_norm, L.k_norm, L.post_attn, L.post_ffw, L.bias]
        n = sum(m.w.nbytes for m in mats if m is not None) + sum(v.nbytes for v in vecs if v is not None)
        n += self.embd_table.nbytes // c.n_vocab
        keys = sum(min(depth + 1, L.window) if L.window else depth + 1 for L in self.layers)
        return n + keys * 2 * c.kv_dim * 2

    def _need_cache(self) -> None:
        if not self.n_ctx:
            self._alloc_cache(min(4096, self.cfg.n_ctx_train))

    def _check_tokens(self, ids) -> np.ndarray:
        t = np.asarray(ids)
        if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
            raise MemraError("tokens must be a non-empty 1-D sequence of integer ids")
        bad = (t < 0) | (t >= self.cfg.n_vocab)
        if bad.any():
            raise MemraError(f"token id {int(t[bad][0])} is outside the vocabulary [0, {self.cfg.n_vocab})")
        return t.astype(np.int32)

    def prefill(self, ids: Sequence[int], seq: int = 0, all_logits: bool = False) -> np.ndarray:
        """Append `ids` to sequence `seq`; returns the float32 logits of the last token
        ([n_vocab]) or of every token ([len(ids), n_vocab]) with all_logits."""
        self._need_cache()
        toks = self._check_tokens(ids)
        p0 = self.pos[seq]
        if p0 + toks.size > self.n_ctx:
            raise ContextOverflowError(f"{p0} cached + {toks.size} new tokens exceed the context of {self.n_ctx} tokens")
        out = []
        for s in range(0, toks.size, PREFILL_CHUNK):
            chunk = toks[s:s + PREFILL_CHUNK]
            T = chunk.size
            self.p_tok.view(shape=(T,)).upload(chunk)
            self.p_pos.view(shape=(T,)).upload(np.arange(p0 + s, p0 + s + T, dtype=np.int32))
            self.p_seq.view(shape=(T,)).upload(np.full(T, seq, np.int32))
            qh = self._layers(T, self.p_tok, self.p_pos, self.p_seq)
            if all_logits:
                if self.logits_all is None:
                    self.logits_all = self.g.empty((PREFILL_CHUNK, self.cfg.n_vocab), np.float32)
                self._output(self.h, self.logits_all, T, qh)
                out.append(self.logits_all.view(shape=(T, self.cfg.n_vocab)).numpy())
            elif s + T == toks.size:
                last = self.h.view(offset=(T - 1) * self.cfg.n_embd * 4, shape=(self.cfg.n_embd,))
                row = self.logits.view(offset=seq * self.cfg.n_vocab * 4, shape=(self.cfg.n_vocab,))
                self._output(last, row, 1)
                out.append(row.numpy())
        self.pos[seq] = p0 + toks.size
        return np.concatenate(out) if all_logits else out[-1]

    def decode(self, token: int, graph: bool = True) -> np.ndarray:
        """Append one token to sequence 0 (batch 1) and return its float32 logits [n_vocab].
        graph=False runs the same launches eagerly (for the replay-vs-eager check)."""
        if self.batch != 1:
            raise MemraError("decode(token) drives batch 1; use decode_batch for several sequences")
        return self.decode_batch([token], graph=graph)[0]

    def decode_batch(self, tokens: Sequence[int], graph: bool = True) -> np.ndarray:
        """One token for each of the `batch` sequences; logits [batch, n_vocab]."""
        self._need_cache()
        toks = self._check_tokens(tokens)
        if toks.size != self.batch:
            raise MemraError(f"decode_batch needs {self.batch} tokens, got {toks.size}")
        if max(self.pos) >= self.n_ctx:
            raise ContextOverflowError(f"the context of {self.n_ctx} tokens is full")
        self.d_tok.upload(toks)
        self.d_pos.upload(np.asarray(self.pos, np.int32))
        if graph:
            self._graph("none").launch()
        else:
            self._decode_step("none")
        self.pos = [p + 1 for p in self.pos]
        return self.logits.numpy()

    def _first_token(self, sampler: str) -> None:
        """Choose the token after the prompt from the prefill's logits (row per sequence),
        without advancing pos (the prompt's positions are already counted)."""
        st = SMP.SeqState(tok=self.d_tok, step=self.d_step, pos=None, hist=self.d_hist)
        if sampler == "greedy":
            SMP.argmax(self.g, self.logits, self.cfg.n_vocab, self.batch, st, self.am_val, self.am_idx,
                       config=self._tuned("argmax", {"n": self.cfg.n_vocab}, self.batch))
        else:
            SMP.sample(self.g, self.logits, self.cfg.n_vocab, self.batch, self.s_fparams, self.s_topk,
                       self.s_seed, st)

    def _start(self, prompts: Sequence[Sequence[int]], n: int, sampler: str):
        """Reset the cache, prefill each sequence's prompt and choose its first token on the
        device (n >= 1 tokens to come); returns the decode graph whose replays give the rest."""
        if len(prompts) != self.batch:
            raise MemraError(f"this engine decodes {self.batch} sequences at a time, got {len(prompts)} prompts")
        self._need_cache()
        longest = max(len(p) for p in prompts) + n - 1
        if longest > self.n_ctx:
            raise ContextOverflowError(f"prompt + {n} tokens need {longest} positions, the context holds {self.n_ctx}")
        self._ensure_hist(n)
        self.pos = [0] * self.batch
        for b, p in enumerate(prompts):
            self.prefill(p, seq=b)
        self.d_pos.upload(np.asarray(self.pos, np.int32))
        self.d_step.upload(np.zeros(self.batch, np.int32))
        self._first_token(sampler)
        return self._graph(sampler)

    def _set_sampling(self, temperature: float, top_k: int, top_p: float, min_p: float, seed: int) -> None:
        """The device sampler's parameters, the same for every sequence."""
        self.s_fparams.upload(np.tile(np.array([temperature, top_p, min_p], np.float32), (self.batch, 1)))
        self.s_topk.upload(np.full(self.batch, top_k, np.int32))
        self.s_seed.upload(np.full(self.batch, seed & ((1 << 64) - 1), np.uint64))

    def _generate(self, prompts: Sequence[Sequence[int]], n: int, sampler: str) -> list[list[int]]:
        if n <= 0:
            return [[] for _ in prompts]
        gr = self._start(prompts, n, sampler)
        for _ in range(n - 1):  # each replay: forward the last token, choose the next
            gr.launch()
        hist = self.d_hist.numpy()  # the only read-back: n ids per sequence
        self.pos = [p + n - 1 for p in self.pos]
        return [[int(t) for t in hist[b, :n]] for b in range(self.batch)]

    def stream(self, prompt_ids: Sequence[int], n: int, *, temperature: float = 0.0, top_k: int = 40,
               top_p: float = 0.95, min_p: float = 0.05, seed: int = 0, chunk: int = 16):
        """Yield up to n tokens after the prompt (sequence 0, batch 1; the cache is reset
        first), chosen on the device: greedy at temperature <= 0, else drawn as generate()
        draws them. The graph replays `chunk` steps between read-backs of their ids (4 bytes
        a token), so a consumer may stop early (end of generation) and waste at most a chunk."""
        if self.batch != 1:
            raise MemraError("stream drives batch 1")
        if n <= 0:
            return
        sampler = "greedy" if temperature <= 0 else "sample"
        if sampler == "sample":
            self._set_sampling(temperature, top_k, top_p, min_p, seed)
        gr = self._start([prompt_ids], n, sampler)
        n_prompt = self.pos[0]
        done = 0  # tokens yielded; token i sits at d_hist[0, i]
        while done < n:
            k = min(chunk, n - done)
            for _ in range(k - 1 if done == 0 else k):  # the first token came from the prefill
                gr.launch()
            ids = self.d_hist.view(offset=done * 4, shape=(k,)).numpy()
            self.pos[0] = n_prompt + done + k - 1  # tokens stored: the prompt and the fed ones
            for t in ids:
                done += 1
                yield int(t)

    def generate_greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        """n greedy tokens after the prompt (sequence 0; the cache is reset first)."""
        if self.batch != 1:
            return self._generate([prompt_ids] * self.batch, n, "greedy")[0]
        return self._generate([prompt_ids], n, "greedy")[0]

    def generate_greedy_batch(self, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        return self._generate(prompts, n, "greedy")

    def generate(self, prompt_ids: Sequence[int], n: int, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, seed: int = 0) -> list[int]:
        """n tokens drawn on the device (llama.cpp's order: top-k, top-p, min-p, temperature);
        the same seed gives the same tokens."""
        self._set_sampling(temperature, top_k, top_p, min_p, seed)
        return self._generate([prompt_ids] * self.batch, n, "sample")[0]

    # -- the CPU reference's protocol (memra.generate, the CLI) -----------------------------
    def new_cache(self, n_ctx: int) -> GPUCache:
        if n_ctx != self.n_ctx:
            self._alloc_cache(n_ctx)
        self.pos = [0] * self.batch
        return GPUCache(self, n_ctx)

    def forward(self, tokens: Sequence[int], cache: GPUCache, all_logits: bool = False) -> np.ndarray:
        if cache.engine is not self or cache.n_ctx != self.n_ctx:
            raise MemraError("this cache belongs to another engine or an older context size")
        self.pos[cache.seq] = cache.pos  # the caller may have rewound it
        toks = self._check_tokens(tokens)
        if toks.size == 1 and not all_logits and self.batch == 1:
            logits = self.decode(int(toks[0]))
        else:
            logits = self.prefill(toks, seq=cache.seq, all_logits=all_logits)
        cache.pos = self.pos[cache.seq]
        return logits


Engine = GPUEngine  # the name memra.cli loads


# -- the argmax gate ----------------------------------------------------------------------

@dataclass
class GateResult:
    verdict: str  # MATCH | NEAR-TIE | MISMATCH
    prefill_argmax: int
    decode_argmax: int
    margin: float  # top-2 logit margin of the decode logits
    max_abs_diff: float  # between the two logit vectors
    bound: float = NEAR_TIE

    def line(self) -> str:
        return (f"argmax gate: {self.verdict} (prefill {self.prefill_argmax}, decode {self.decode_argmax}, "
                f"top-2 margin {self.margin:.4f}, near-tie bound {self.bound}, max |Δlogit| {self.max_abs_diff:.2e})")


def argmax_gate(engine: GPUEngine, prompt_ids: Sequence[int], bound: float = NEAR_TIE) -> GateResult:
    """Last-position argmax of a batched prefill vs token-by-token decode of the same prompt.
    MATCH when equal; NEAR-TIE when they differ but either run's top-2 logit margin is
    below `bound`; MISMATCH otherwise (the engine is wrong: figures after it are void).
    Leaves the engine's cache reset."""
    ids = list(prompt_ids)
    engine.reset()
    a = engine.prefill(ids)
    engine.reset()
    b = None
    for t in ids:
        b = engine.decode(t)
    engine.reset()
    ia, ib = int(np.argmax(a)), int(np.argmax(b))

    from memra.cpu.reference import top2_margin

    m = min(top2_margin(a), top2_margin(b))
    verdict = "MATCH" if ia == ib else ("NEAR-TIE" if m < bound else "MISMATCH")
    return GateResult(verdict, ia, ib, m, float(np.max(np.abs(a - b))), bound)
