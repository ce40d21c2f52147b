"""The GPU runner: one model on the device, a paged KV cache, and `step(rows)`, which
advances any mix of sequences — each at its own position, with its own sampling settings —
by executing the launch plan (memra.gpu.plan).

    r = Runner("model.gguf", max_len=4096, max_seqs=64)
    a, b = r.open(), r.open()                             # sequences (KV block-table rows)
    out = r.step([Row(a, prompt_a, sample=Sampling(temperature=0)),     # a prefill chunk
                  Row(b, prompt_b, logits="last")])                      # and another
    out = r.step([Row(a, [out[0].token], sample=...), Row(b, [t_b], ...)])  # a decode step
    r.close(a)

Rows whose sequences all differ and that feed one token each take the decode path: the
plan's decode step for the graph bucket (1, 2, 4, ..., 64 rows) captured once as a CUDA
graph over static buffers, padded rows masked (position -1: no key read, no KV row
written, no token committed), the next token chosen on the device and 4 bytes a row read
back. Any other mix (prompt chunks, several tokens of one sequence, K+1 verification
rows) runs the plan's prefill step over up to PREFILL_CHUNK token rows at a time (K/V
rows appended first, then attention), replayed as the CUDA graph of the smallest prefill
bucket that holds the chunk (1, 2, 4, 8, 16 to 128 by 16, then 192 to 512 by 64 rows; padded like decode),
then the head eagerly over the rows whose logits or token are wanted. A row's logits do
not depend on the path, the rows beside it or the bucket (every kernel keeps a row's reduction order fixed by its
shape; kernel-check compares the fused decode attention with the two-launch form and the
GEMM and mvt with the matvec bit for bit).

Sampling is on the device (kernels/sample.cu): greedy, or temperature / top-k / top-p /
min-p with a seed; the draw is a function of (logits, seed, position). Rows that want
penalties or a logit bias take their logits back (`logits="last"`) and sample on the host.

Constrained rows carry a vocabulary mask (Row.mask, kernels/mask.cu applies it before the
sampler). A decode step with masks runs as two graphs, the body (embedding to logits) and
the tail (mask + sampler), with the masks copied from a pinned host buffer between them on
the stream. A row's mask may be LATER: step(rows, fill=f) then launches the body first and
calls f(masks) while the device runs it, so the host's grammar work (llguidance) overlaps
the model's step; the copy is ordered after f returns and before the tail, so the tokens
are those of masks given up front.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from memra.env import env_choice, env_int
from memra.errors import ContextOverflowError, GGUFError, MemraError
from memra.gpu import plan as PLAN
from memra.gpu.kv import PagedKV, bytes_per_block, check_cache_device
from memra.gpu.ops import act as ACT
from memra.gpu.ops import attention as ATT
from memra.gpu.ops import attn_fa as FA
from memra.gpu.ops import embed as EMB
from memra.gpu.ops import gemm as GEMM
from memra.gpu.ops import gemm_f16 as GF
from memra.gpu.ops import gemm_tile as GT
from memra.gpu.ops import mask as MASK
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import mvt as MVT
from memra.gpu.ops import norm as NORM
from memra.gpu.ops import qf as QF
from memra.gpu.ops import rope as ROPE
from memra.gpu.ops import sample as SMP
from memra.gpu.q8 import Q8_SCALE
from memra.model import quants as Q
from memra.model.config import ModelConfig, read_config
from memra.model.gguf import GGUFFile, open_gguf
from memra.tune import tables as TABLES

log = logging.getLogger("memra.runner")

PREFILL_CHUNK = PLAN.PREFILL_CHUNK
MAX_ROWS = PLAN.MAX_ROWS
# decode steps a graph replays between read-backs of their ids (decode_run; memra bench's tg times the same chunks)
DECODE_CHUNK = 16
KV_BLOCK = 16  # positions per KV-cache block (kernels/kv.cuh)
LATER = "later"  # Row.mask: written by step()'s fill callback while the device runs the step's body


@dataclass
class Sampling:
    """The device sampler's settings for one row: temperature <= 0 is greedy."""
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1


@dataclass
class Seq:
    """A sequence: its block-table row (slot) and how many positions its KV cache holds."""
    slot: int
    n: int = 0


@dataclass
class Row:
    """One row of a step: `tokens` appended to `seq` at positions seq.n, seq.n + 1, ...;
    logits: "none", "last" or "all" of them back to the host; sample: choose the token
    after the last one on the device."""
    seq: Seq
    tokens: Sequence[int]
    logits: str = "none"
    sample: Sampling | None = None
    # int32 [ceil(n_vocab / 32)]: tokens the sampler may choose (bit set); LATER: step()'s fill writes it
    mask: np.ndarray | str | None = None
    # which arithmetic the rows take with MEMRA_ATTN=hybrid: True, generated tokens (decode's
    # attention, e.g. a forced run fed with its sampled token); False, prompt tokens (attn_fa,
    # even a one-token row alone, which would otherwise be a decode step); None, by the step's
    # shape: a decode step's rows are generated, the rows of any other step prompt rows.
    # verify() rows are always generated
    gen: bool | None = None


@dataclass
class RowOut:
    token: int | None = None
    logits: np.ndarray | None = None  # [n_vocab] ("last") or [len(tokens), n_vocab] ("all")


def _run_sampler(sampling) -> str:
    """The device sampler of a chain of decode steps: greedy when every row is."""
    return "greedy" if all(sm.greedy for sm in sampling) else "sample"


def _mask_index(launches) -> int:
    """Where a masked step's tail (the mask launch, then the sampler) begins."""
    for i, L in enumerate(launches):
        if L.op == "mask":
            return i
    raise MemraError("a masked step without a mask launch")


def _pow2_at_most(n: int, cap: int) -> int:
    """n rounded up to a power of two, at most cap (attn_fa's trimmed prefill grid)."""
    return min(1 << (n - 1).bit_length(), cap)


class Runner:
    def __init__(self, model, cfg: ModelConfig | None = None, *, max_len: int | None = None,
                 max_seqs: int = MAX_ROWS, kv_tokens: int | None = None, kv_memory: int | None = None,
                 kv_block: int | None = None, gpu=None, matvec_path: str | None = None,
                 pdl: bool | None = None, tune_table=None, gemm: bool | None = None,
                 mvt: bool | None = None, prefill_graph: bool | None = None, attn: str | None = None,
                 cache_type_k: str = "f16", cache_type_v: str = "f16"):
        """max_len: positions per sequence (default: the model's training context, at most
        32768); max_seqs: sequences open at once; the KV pool holds kv_tokens positions, or
        kv_memory bytes, or (neither given) max_seqs * max_len positions, at most 90 % of
        the free device memory. tune_table: None (MEMRA_TUNE_TABLE, else "auto"), "auto",
        "builtin", a table file, or a loaded table. cache_type_k / cache_type_v: f16 or q8_0
        (memra.gpu.kv; the pools sized by type, the rope / attention modules built for it;
        q8_0 turns MEMRA_ATTN=fa off)."""
        from memra.gpu.cuda import gpu as get_gpu

        self.gguf: GGUFFile = model if isinstance(model, GGUFFile) else open_gguf(model)
        self.cfg = cfg or read_config(self.gguf)
        self.g = gpu or get_gpu()
        self._open_tune_table(tune_table)
        path = matvec_path or os.environ.get("MEMRA_MATVEC_PATH", "q8")
        self.pdl = (os.environ.get("MEMRA_PDL", "1") != "0") if pdl is None else bool(pdl)
        fuse_rope = os.environ.get("MEMRA_FUSED_ROPE", "1") != "0"
        use_gemm = (os.environ.get("MEMRA_GEMM", "1") != "0") if gemm is None else bool(gemm)
        use_mvt = (os.environ.get("MEMRA_MVT", "1") != "0") if mvt is None else bool(mvt)
        use_tile = os.environ.get("MEMRA_TILE", "1") != "0"
        self.prefill_graph = (os.environ.get("MEMRA_PREFILL_GRAPH", "1") != "0") if prefill_graph is None \
            else bool(prefill_graph)
        asked = attn or os.environ.get("MEMRA_ATTN")  # None: the default, hybrid
        attn = asked or "hybrid"
        if attn not in ("decode", "fa", "hybrid"):
            raise MemraError(f"MEMRA_ATTN must be decode, fa or hybrid, got {attn!r}")
        self.spec = PLAN.ModelSpec.from_gguf(self.gguf)
        if cfg is not None and cfg != self.spec.cfg:  # e.g. the first L layers (memra.spec's trim drafter)
            from dataclasses import replace

            self.spec = replace(self.spec, cfg=self.cfg)
        check_cache_device("gpu", cache_type_k, cache_type_v)
        self.plan = PLAN.Planner(self.spec, self.tune_table, path=path, fuse_rope=fuse_rope,
                                 sms=self.g.info.sm_count, gemm=use_gemm, mvt=use_mvt, fa=attn == "fa",
                                 cache_type_k=cache_type_k, cache_type_v=cache_type_v, hybrid=attn == "hybrid",
                                 tile=use_tile)
        # the default falls back quietly where attn_fa cannot run; a path asked for says so
        say = log.warning if asked else log.info
        if attn != "decode" and self.plan.kv_q8:
            say("MEMRA_ATTN=%s: attn_fa reads an f16 KV cache only; decode attention used with the q8_0 cache", attn)
        elif attn != "decode" and not self.plan.use_fa:
            say("MEMRA_ATTN=%s: head size %d / %d query heads per KV head not supported by attn_fa; "
                "decode attention used", attn, self.cfg.head_dim, self.cfg.n_gqa)
        # the plan's kernel modules compile in parallel processes while the weights load (MEMRA_PRECOMPILE): a cold
        # start waits for the slowest module, not for their sum
        ahead = None
        if getattr(self.g, "compile_ahead", False) and env_choice("MEMRA_PRECOMPILE", "1", ("0", "1")) == "1":
            from memra.gpu.compile import AheadOfUse
            from memra.gpu.modules import plan_modules

            ahead = AheadOfUse(lambda: plan_modules(self.plan), self.g.info.arch)
        # whether a prompt row and a decode row at one position give the same bits (the gates'
        # prefill = decode check; without it, batched prompt rows = prompt rows one at a time)
        self.prefill_exact = not self.plan.hybrid
        self.path = path
        self.max_len = int(max_len or min(self.cfg.n_ctx_train, 32768))
        if self.max_len > self.cfg.n_ctx_train:
            log.warning("context %d exceeds the model's training context %d", self.max_len, self.cfg.n_ctx_train)
        self.kv_block = int(kv_block or env_int("MEMRA_KV_BLOCK", KV_BLOCK, lambda n: n >= 1 and not n & (n - 1),
                                                "a power of two"))
        self.max_seqs = int(max_seqs)
        per_block = bytes_per_block(self.cfg, self.kv_block, cache_type_k, cache_type_v)
        need = -(-self.max_len // self.kv_block)  # one sequence at the full context
        sized = kv_tokens is None and kv_memory is None and hasattr(self.g, "free_memory")
        if sized:
            # a context that cannot fit even with no weights on the device is refused before they
            # load (the exact check, with the weights' bytes known, follows the upload)
            self._refuse_context(need, int(0.9 * self.g.free_memory()) // per_block, per_block,
                                 "the free device memory before any weight is loaded")
        t0 = time.perf_counter()
        self._load_weights()
        log.info("weights on the device in %.2f s (%.0f MB)", time.perf_counter() - t0, self.weight_bytes / 1e6)
        # the step buffers first: the KV pool sized from the free memory must leave them room
        self._alloc_activations()
        if kv_tokens is None:
            if kv_memory is not None:
                n_blocks = int(kv_memory) // per_block
            else:
                n_blocks = self.max_seqs * need
                free = self.g.free_memory() if hasattr(self.g, "free_memory") else None
                if free is not None:
                    n_blocks = min(n_blocks, int(0.9 * free) // per_block)
        else:
            n_blocks = -(-int(kv_tokens) // self.kv_block)
        if sized:
            # the pool was sized from the device: refuse a context it cannot hold once, before any
            # work (a pool given in tokens or bytes may be smaller: the server then refuses the
            # requests that can never fit, one by one)
            self._refuse_context(need, n_blocks, per_block, "the device memory left after the weights")
        self.kv = PagedKV(self.g, self.cfg, n_blocks=max(1, n_blocks), block=self.kv_block,
                          max_seqs=self.max_seqs, max_len=self.max_len, cache_type_k=cache_type_k,
                          cache_type_v=cache_type_v)
        self.rope_cs = {k: self.g.to_device(ROPE.rope_table(inv, self.max_len)) for k, inv in self.rope_inv.items()}
        self._graphs: dict[tuple, object] = {}
        if ahead is not None:
            ahead.join()

    # -- set-up ---------------------------------------------------------------------------
    def _kv_scales(self, il: int) -> dict:
        """Layer il's q8_0 scale planes as the launchers' kscale / vscale (none for f16)."""
        return {"kscale": self.kv.k_scale[il] if self.kv.k_scale else None,
                "vscale": self.kv.v_scale[il] if self.kv.v_scale else None}

    def _refuse_context(self, need: int, blocks: int, per_block: int, where: str) -> None:
        """ContextOverflowError when `blocks` KV blocks (90 % of `where`) cannot hold the
        `need` blocks of one sequence at the full context."""
        if blocks < need:
            raise ContextOverflowError(
                f"a context of {self.max_len} tokens needs {need * per_block / 2**30:.2f} GiB of KV cache for one "
                f"sequence ({per_block} bytes per {self.kv_block} positions); 90 % of {where} holds "
                f"{max(0, blocks) * self.kv_block} positions: lower the context size")

    def _open_tune_table(self, which) -> None:
        if isinstance(which, dict):
            self.tune_table, self.tune_source = which, "given"
        else:
            which = None if which is None else str(which)
            info = self.g.info
            self.tune_table, self.tune_source = TABLES.resolve_table(which, info.name, info.cc, sms=info.sm_count)

    def _f32(self, name: str):
        return self.g.to_device(Q.dequantize_tensor(self._finite(name)).astype(np.float32).reshape(-1))

    def _finite(self, name: str):
        """The GGUF tensor `name`, its values all finite: a NaN or an infinity (a corrupt file)
        would run on the device as garbage tokens, so it is a GGUFError naming the tensor."""
        t = self.gguf.tensor(name)
        row = Q.first_nonfinite_row(t)
        if row is not None:
            raise GGUFError(self.gguf.path, f"tensor {name!r} holds NaN or infinite values (row {row}): "
                                            f"a corrupt file?")
        return t

    def _load_weights(self) -> None:
        c = self.cfg
        self.weight_bytes = 0
        emb = self._finite("token_embd.weight")
        self.embd_type = emb.ggml_type
        EMB.kernel_name(emb.ggml_type)  # raises for a type the gather does not read
        self.embd_table = self.g.to_device(np.ascontiguousarray(emb.data))
        self.weight_bytes += emb.n_bytes
        self.W: dict[str, MV.Weight] = {}
        for w in self.plan.weights():
            ts = [self._finite(n) for n in w.tensors]
            self.W[w.key] = MV.upload_weight(self.g, [t.data.reshape(t.rows, t.row_bytes()) for t in ts],
                                             ts[0].ggml_type)
            self.weight_bytes += self.W[w.key].nbytes
        names = ["output_norm.weight"]
        for il in range(c.n_layer):
            p = f"blk.{il}."
            names += [p + "attn_norm.weight", p + "ffn_norm.weight"]
            if c.qk_norm:
                names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
            if c.post_norms:
                names += [p + "post_attention_norm.weight", p + "post_ffw_norm.weight"]
        self.vec = {n: self._f32(n) for n in names}
        self.bias = {}
        if c.qkv_bias:
            for il in range(c.n_layer):
                self.bias[il] = self.g.to_device(np.concatenate([
                    Q.dequantize_tensor(self._finite(f"blk.{il}.attn_{x}.bias")).reshape(-1) for x in "qkv"
                ]).astype(np.float32))
        from memra.cpu.reference import rope_inv_freq

        factors = Q.dequantize_tensor(self._finite("rope_freqs.weight")) if c.has_rope_freqs else None
        self.rope_inv = {}
        for il in range(c.n_layer):
            key = self.plan.rope_key(il)
            if key not in self.rope_inv:
                self.rope_inv[key] = rope_inv_freq(c.rope_dim, key[0], key[1], factors).astype(np.float64)

    def _alloc_activations(self) -> None:
        c, g = self.cfg, self.g
        R = self.rows = max(MAX_ROWS, PREFILL_CHUNK)
        f, i32 = np.float32, np.int32
        self.buf = {
            "x": g.empty((R, c.n_embd), f), "h": g.empty((R, c.n_embd), f), "t1": g.empty((R, c.n_embd), f),
            "qkv": g.empty((R, c.q_dim + 2 * c.kv_dim), f), "qr": g.empty((R, c.q_dim), f),
            "ao": g.empty((R, c.q_dim), f), "ff": g.empty((R, c.n_ff), f), "ff2": g.empty((R, c.n_ff), f),
            "logits": g.empty((MAX_ROWS, c.n_vocab), f), "hsel": g.empty((MAX_ROWS, c.n_embd), f),
        }
        # the int8 twin of whichever activation feeds the next matvec(s): one buffer serves all
        kmax = max(c.n_embd, c.q_dim, c.n_ff)
        self.xq = g.empty(R * kmax, np.int8)
        self.xs = g.empty(R * kmax // 32, Q8_SCALE)
        # the f16 activations of gemm_f16 (the prompt rows' plan.f16_keys), one buffer as the twin
        self.xh = g.empty(R * kmax, np.uint16) if self.plan.f16_keys else None
        # the qf activations (the generated rows' plan.qf_keys, MEMRA_DECODE=qf): f16 in qf order and the S2 sums,
        # one pair as the twin; the workspace of qf_gemm's chains split across blocks and its counters (zero
        # between launches: each launch leaves them so)
        self.xqf = self.xs2 = self.qf_ws = self.qf_cnt = None
        if self.plan.qf_keys:
            self.xqf, self.xs2 = g.empty(R * kmax, np.uint16), g.empty(R * kmax // 16, f)
            n_ws, n_cnt = self.plan.qf_workspace(sorted(set(PLAN.GRAPH_BUCKETS) | set(PLAN.PREFILL_BUCKETS)))
            self.qf_ws = g.empty(max(1, n_ws), f)
            self.qf_cnt = g.to_device(np.zeros(max(1, n_cnt), i32))
        po, pml = ATT.scratch_shapes(R, c.n_head, self.plan.n_splits, c.head_dim)
        self.part_o, self.part_ml = g.empty(po, f), g.empty(pml, f)
        self.att_cnt = g.to_device(np.zeros(R * c.n_head, i32))  # zero between launches
        if self.plan.use_fa:  # attn_fa's split partials: every row, head and split of the context
            self.fa_n_split = FA.n_splits(self.max_len, self.plan.fa_split)
            po, pml = FA.scratch_shapes(R, c.n_head, self.fa_n_split, c.head_dim)
            self.fa_po, self.fa_pml = g.empty(po, f), g.empty(pml, f)
        # attn_fa's grid z in a prefill or verification step (its prefill packing): the splits its
        # deepest attn_fa row reaches, rounded up to a power of two (_fa_splits; set per step by
        # _upload_kinds, graphs keyed by it). A row's bits do not depend on it; the grid of the
        # whole context (fa_n_split: 128 splits at 32k) launched blocks that only left at once
        self.fa_splits = 1
        # MEMRA_FA_GRID=full (rollback seam, docs/FLAGS.md): both grids the whole context's / the
        # step's rows, as before session 19
        self.fa_grid_full = os.environ.get("MEMRA_FA_GRID", "trim") == "full"
        # and its grid x: the step's token groups rounded up to a power of two (at most the step's
        # rows; set by _upload_groups, graphs keyed by it), not one block a row
        self.fa_groups = 1
        # attn_fa's token groups of a prefill step's rows (memra.gpu.ops.attn_fa.group_table), one
        # table of up to R groups uploaded before the step (graphs read it at replay)
        self.p_grp = g.to_device(np.zeros((R + 1, 2), i32))
        # attn_decode's split count (grid y) in a prefill or verification step: the fewest that
        # lay its rows out as plan.n_splits does (ATT.splits_for; set per step by _pre_splits)
        self.pre_splits = self.plan.n_splits
        # attn_decode's grid y in a decode step: the plan's count, or on the MEMRA_ATT_DEPTH path the
        # deepest row's (_dec_splits_for; decode graphs are keyed by it)
        self.dec_splits = self.plan.n_splits
        # the attention switch (plan.att_switch): which attention modules a decode step launches
        # (plan.att_kind_of; graphs keyed by it)
        self.dec_kind = self.plan.att_kinds[-1]
        self._split_prefill = (not self.plan.use_fa or self.plan.hybrid) and \
            os.environ.get("MEMRA_PREFILL_SPLITS", "") != "full"
        # decode_run queues a chunk before yielding the last one's tokens (MEMRA_DECODE_AHEAD=0: after)
        self._decode_ahead = os.environ.get("MEMRA_DECODE_AHEAD", "") != "0"
        # MEMRA_GRAPH_STEPS (docs/FLAGS.md, an experiment): decode steps one graph launch of decode_run replays
        # (the step's launches captured that many times over: PDL across the steps' boundaries too)
        self.graph_steps = env_int("MEMRA_GRAPH_STEPS", 1, lambda v: v in (1, 2, 4, 8, 16), "1, 2, 4, 8 or 16")
        # a decode step's groups when attn_fa decodes on its prefill packing (head_dim % 64 != 0):
        # one row a group, fixed (rows of distinct sequences; a padded row has no keys)
        self.d_grp = g.to_device(np.stack([np.arange(R), np.ones(R)], 1).astype(i32))
        # the rows of a step that is not a decode step (prefill chunks, verification rows):
        # token, position and block-table row, one upload; a step of B rows (and its graph)
        # reads them as three runs of B ints (step_rows)
        self.p_rows = g.empty(3 * R, i32)
        # a hybrid plan's step of B rows that is not a decode step: the prompt rows' positions
        # (generated rows -1: attn_fa's rows) then the generated rows' (prompt rows -1:
        # attn_decode's), two runs of B ints (_kind_pos)
        self.p_kpos = g.empty(2 * R, i32)
        # row state of a decode step (the graphs' static buffers) and of the sampled rows of
        # an eager step: the token fed / chosen, its position, block-table row, draws made
        M = MAX_ROWS
        # valid from the start: a graph's warm-up runs on whatever they hold (positions -1)
        # one buffer, so a step's row state is one upload: rows tok, pos, seq, step
        state = np.zeros((4, M), i32)
        state[1] = -1
        self.r_state = g.to_device(state)
        self.r_tok, self.r_pos, self.r_seq, self.r_step = (
            self.r_state.view(shape=(M,), offset=4 * M * i) for i in range(4))
        self.r_fparams = g.to_device(np.zeros((M, 3), f))
        self.r_topk = g.to_device(np.zeros(M, i32))
        self.r_seed = g.to_device(np.zeros(M, np.uint64))
        # constrained rows' vocabulary masks (kernels/mask.cu reads them in the graph): every
        # token allowed until a step with a constrained row writes them, one upload a step
        # h_mask is page-locked where the driver allows it, so the upload is asynchronous:
        # stream-ordered before the step's tail, and not rewritten before the step's read-back
        self.mask_words = MASK.words_of(c.n_vocab)
        try:
            self.h_mask = g.pinned((M, self.mask_words), i32)
            self.mask_pinned = True
        except Exception as e:  # noqa: BLE001 - any refusal: fall back to pageable + sync upload
            log.warning("no pinned host buffer for the vocabulary masks (%s): their uploads wait", e)
            self.h_mask = np.empty((M, self.mask_words), i32)
            self.mask_pinned = False
        self.h_mask[:] = -1
        self.r_mask = g.to_device(self.h_mask)
        self.am_val = g.empty(M * SMP.ARGMAX_BLOCKS, f)
        self.am_idx = g.empty(M * SMP.ARGMAX_BLOCKS, i32)
        self.hist_len = 0
        self.r_hist = None
        self._ensure_hist(256)

    def _ensure_hist(self, n: int) -> None:
        if n <= self.hist_len:
            return
        self.hist_len = max(n, 2 * self.hist_len)
        self.r_hist = self.g.empty((MAX_ROWS, self.hist_len), np.int32)
        self._drop_graphs()  # the graphs point at the old history buffer

    def _drop_graphs(self) -> None:
        for gr in getattr(self, "_graphs", {}).values():
            for part in (gr if isinstance(gr, tuple) else (gr,)):
                part.close()
        self._graphs = {}

    # -- executing the plan -------------------------------------------------------------------
    def _twin(self, rows: int, K: int, row0: int = 0):
        if self.path != "q8":
            return None
        return (self.xq.view(shape=(rows, K), offset=row0 * K),
                self.xs.view(shape=(rows, K // 32), offset=row0 * K // 32 * Q8_SCALE.itemsize))

    def _qkv_views(self, L, rows: int):
        """(q, k, v) views of the QKV matvec output(s) and their row strides (floats)."""
        c = self.cfg
        qkv = self.buf["qkv"]
        v = [(qkv.view(offset=off, shape=(rows, width)), width) for off, width in L.args["views"]]
        if len(v) == 1:
            (y, w), = v
            return y, y.view(offset=c.q_dim * 4), y.view(offset=(c.q_dim + c.kv_dim) * 4), w, w, w
        if len(v) == 2:
            (y, w), (yv, wv) = v
            return y, y.view(offset=c.q_dim * 4), yv, w, w, wv
        (yq, wq), (yk, wk), (yv, wv) = v
        return yq, yk, yv, wq, wk, wv

    def _kind_pos(self, a, rows: int, pos):
        """The positions an attention launch reads: a hybrid step's prompt rows ("prompt") or
        generated rows ("gen"), the others -1 (p_kpos), else the step's own."""
        which = a.get("rows", "all")
        if which == "all":
            return pos
        return self.p_kpos.view(shape=(rows,), offset=0 if which == "prompt" else 4 * rows)

    def _upload_kinds(self, seq, pos, gen, size: int) -> str:
        """A step's rows by kind (gen: bool per row, None: all prompt rows) into p_kpos and
        attn_fa's group table (of the prompt rows), padded to `size`; returns the step's
        kinds ("p", "g" or "pg": which attention launches a hybrid plan makes). Plans that are
        not hybrid: the groups of every row, kinds "p"."""
        n = len(pos)
        if not self.plan.hybrid:
            self._upload_groups(seq, pos, size)
            return "p"
        gen = np.zeros(n, bool) if gen is None else np.asarray(gen, bool)
        kp = np.full((2, size), -1, np.int32)
        kp[0, :n] = np.where(gen, -1, pos)
        kp[1, :n] = np.where(gen, pos, -1)
        self.p_kpos.view(shape=(2, size)).upload(kp)
        self._upload_groups(seq, kp[0, :n], size)
        live = np.asarray(pos) >= 0
        kinds = ("p" if np.any(live & ~gen) else "") + ("g" if np.any(live & gen) else "")
        return kinds or "p"

    def _run(self, launches, rows: int, tok, pos, seq, state=None, g=None) -> None:
        """Issue the launches of one plan step over `rows` token rows (tok/pos/seq device
        arrays); state: the sampler's SeqState (decode and sampled rows); g: where the
        kernels are launched (default the runner's GPU; memra profile passes a recorder)."""
        c, pdl, B = self.cfg, self.pdl, self.buf
        g = g or self.g
        E = c.n_embd
        for L in launches:
            op, a = L.op, L.args
            if op == "embed":
                EMB.embed(g, self.embd_table, self.embd_type, c.n_vocab, E, tok, B["x"], c.embd_scale,
                          n_tokens=rows, pdl=pdl, config=L.config)
            elif op in ("norm", "add_norm"):
                tw = self._twin(rows, E)
                xq, xs = tw if tw is not None else (None, None)
                if op == "norm":
                    NORM.rmsnorm(g, B["x"], self.vec[a["w"]], B["h"], E, c.norm_eps, rows, xq=xq, xs=xs, pdl=pdl,
                                 config=L.config)
                else:
                    NORM.add_rmsnorm(g, B["x"], B[a["delta"]], self.vec[a["w"]], B["h"], E, c.norm_eps, rows,
                                     w_post=self.vec[a["w_post"]] if a.get("w_post") else None, xq=xq, xs=xs,
                                     pdl=pdl, config=L.config)
            elif op in PLAN.MATRIX_OPS:
                self._matvec(L, g)
            elif op == "quantize":
                K = a["K"]
                xq, xs = self._twin(rows, K)
                MV.quantize_q8(g, B[a["src"]].view(shape=(rows, K)), xq, xs, rows, config=L.config)
            elif op == "to_f16":
                K = a["K"]
                GF.to_f16(g, B[a["src"]].view(shape=(rows * K,)), self.xh.view(shape=(rows * K,)), rows * K, pdl=pdl)
            elif op == "to_qf":
                K = a["K"]
                QF.to_qf(g, B[a["src"]].view(shape=(rows * K,)), self.xqf.view(shape=(rows * K,)),
                         self.xs2.view(shape=(rows * K // 16,)), rows, K, pdl=pdl)
            elif op == "rope":
                q, k, v, qs, ks, vs = self._qkv_views(L, rows)
                il = L.layer
                ROPE.rope_norm_kv(
                    g, q, k, v, B["qr"], self.kv.k[il], self.kv.v[il], pos, seq, self.rope_cs[a["rope_key"]],
                    self.kv.d_table, self.kv.max_blocks, n_tokens=rows, n_head=c.n_head, n_kv=c.n_head_kv,
                    head_dim=c.head_dim, rope_dim=c.rope_dim, neox=c.rope_neox, q_stride=qs, k_stride=ks,
                    v_stride=vs, bias=self.bias.get(il), q_norm=self.vec.get(f"blk.{il}.attn_q_norm.weight"),
                    k_norm=self.vec.get(f"blk.{il}.attn_k_norm.weight"), eps=c.norm_eps, pdl=pdl,
                    config=L.config, **self._kv_scales(il))
            elif op in ("attention", "attention_rope"):
                il = L.layer
                rope = None
                pos_l = self._kind_pos(a, rows, pos)
                if op == "attention_rope":
                    q, k, v, qs, ks, vs = self._qkv_views(L, rows)
                    rope = ATT.RopeIn(q, k, v, qs, ks, vs, self.rope_cs[a["rope_key"]], c.rope_dim, c.rope_neox,
                                      c.norm_eps, self.bias.get(il), self.vec.get(f"blk.{il}.attn_q_norm.weight"),
                                      self.vec.get(f"blk.{il}.attn_k_norm.weight"))
                tw = self._twin(rows, c.q_dim) if a["twin"] else None
                ATT.attention(g, B["qr"], self.kv.k[il], self.kv.v[il], B["ao"], self.part_o, self.part_ml, pos_l, seq,
                              self.kv.d_table, self.kv.max_blocks, n_tokens=rows, n_kv=c.n_head_kv, n_gqa=c.n_gqa,
                              head_dim=c.head_dim, window=a["window"], scale=c.scale,
                              n_splits=self.pre_splits if a["prefill"] else self.dec_splits,
                              counters=self.att_cnt, xq=tw[0] if tw else None, xs=tw[1] if tw else None, pdl=pdl,
                              hpb=a["hpb"] if a["prefill"] else self.plan.att_hpb_at(rows, self.dec_splits),
                              config=L.config, rope=rope, rows_filter=(a.get("att_rows", 0), a.get("att_switch", 0)),
                              **self._kv_scales(il))
            elif op == "attention_fa":
                il = L.layer
                rope = None
                if a.get("fused"):
                    q, k, v, qs, ks, vs = self._qkv_views(L, rows)
                    rope = ATT.RopeIn(q, k, v, qs, ks, vs, self.rope_cs[a["rope_key"]], c.rope_dim, c.rope_neox,
                                      c.norm_eps, self.bias.get(il), self.vec.get(f"blk.{il}.attn_q_norm.weight"),
                                      self.vec.get(f"blk.{il}.attn_k_norm.weight"))
                tw = self._twin(rows, c.q_dim) if a["twin"] else None
                FA.attn_fa(g, B["qr"], self.kv.k[il], self.kv.v[il], B["ao"], self.fa_po, self.fa_pml,
                           self._kind_pos(a, rows, pos), seq, self.kv.d_table, self.kv.max_blocks, n_tokens=rows,
                           n_kv=c.n_head_kv, qpk=c.n_gqa,
                           head_dim=c.head_dim, window=a["window"], scale=c.scale,
                           n_split=self.fa_n_split if a["packing"] == "decode" else self.fa_splits,
                           split=a["split"], decode=a["packing"] == "decode",
                           n_groups=rows if a["packing"] == "decode" else self.fa_groups,
                           groups=self.d_grp if a["packing"] == "decode" else self.p_grp,
                           counters=self.att_cnt, xq=tw[0] if tw else None, xs=tw[1] if tw else None, rope=rope,
                           pdl=pdl, warps=a.get("warps", FA.FA_WARPS))
            elif op == "act_mul":
                ACT.act_mul(g, B["ff"], B["ff2"], B["ff"], c.n_ff, rows, c.act, pdl=pdl, config=L.config)
            elif op == "softcap":
                ACT.softcap(g, B["logits"], c.n_vocab, c.final_logit_softcap, rows, pdl=pdl)
            elif op == "argmax":
                SMP.argmax(g, B["logits"], c.n_vocab, rows, state, self.am_val, self.am_idx, pdl=pdl,
                           config=L.config)
            elif op == "mask":
                MASK.apply_mask(g, B["logits"], c.n_vocab, rows, self.r_mask, state.pos if state is not None else None,
                                pdl=pdl)
            elif op == "sample":
                SMP.sample(g, B["logits"], c.n_vocab, rows, self.r_fparams, self.r_topk, self.r_seed, state, pdl=pdl)
            else:
                raise MemraError(f"runner: no handler for launch op {op!r} ({L.name})")

    def _matvec(self, L, g) -> None:
        a, B = L.args, self.buf
        w = self.W[a["weight"]]
        N = w.rows // 2 if a["glu"] else w.rows
        K, n, r0 = w.K, L.rows, a["row0"]
        y = B[a["dst"]].view(offset=a["dst_offset"] + r0 * N * 4, shape=(n, N))
        res = B[a["res"]].view(offset=a["dst_offset"] + r0 * N * 4, shape=(n, N)) if a["res"] else None
        cfg = L.config

        def tuned(_n):
            return cfg

        if L.op == "gemm_f16":
            xh = self.xh.view(shape=(n, K), offset=2 * r0 * K)
            GF.gemm_f16(g, w, y, xh=xh, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, config=cfg)
        elif L.op == "qf":
            QF.qf(g, w, y, xh=self.xqf.view(shape=(n * K,), offset=2 * r0 * K),
                  xs2=self.xs2.view(shape=(n * K // 16,), offset=4 * r0 * K // 16), nb=n, residual=res, glu=a["glu"],
                  config=cfg, ws=self.qf_ws, cnt=self.qf_cnt, pdl=self.pdl)
        elif a["q8"]:
            xq, xs = self._twin(n, K, r0)
            if L.op == "gemm_tile":
                GT.gemm_tile(g, w, y, xq=xq, xs=xs, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, config=cfg)
            elif L.op == "gemm":
                GEMM.gemm(g, w, y, xq=xq, xs=xs, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, config=cfg)
            elif L.op == "mvt":
                MVT.mvt(g, w, y, xq=xq, xs=xs, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, config=cfg)
            else:
                MV.matvec(g, w, y, xq=xq, xs=xs, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, tuned=tuned)
        else:
            x = B[a["src"]].view(offset=r0 * K * 4, shape=(n, K))
            MV.matvec(g, w, y, x=x, nb=n, residual=res, glu=a["glu"], pdl=self.pdl, tuned=tuned)

    # -- sequences --------------------------------------------------------------------------
    def open(self) -> Seq:
        return Seq(self.kv.open())

    def close(self, seq: Seq) -> None:
        self.kv.close(seq.slot)
        seq.n = 0

    def rewind(self, seq: Seq, n: int) -> None:
        """Forget seq's positions from n on (their KV rows are rewritten when revisited)."""
        if not 0 <= n <= seq.n:
            raise MemraError(f"cannot rewind a sequence of {seq.n} positions to {n}")
        self.kv.truncate(seq.slot, n)
        seq.n = n

    def _check_tokens(self, ids) -> np.ndarray:
        t = np.asarray(ids)
        if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
            raise MemraError("tokens must be a non-empty 1-D sequence of integer ids")
        bad = (t < 0) | (t >= self.cfg.n_vocab)
        if bad.any():
            raise MemraError(f"token id {int(t[bad][0])} is outside the vocabulary [0, {self.cfg.n_vocab})")
        return t.astype(np.int32)

    def _reserve(self, seq: Seq, n_new: int) -> None:
        end = seq.n + n_new
        if end > self.max_len:
            raise ContextOverflowError(f"{seq.n} cached + {n_new} new tokens exceed the context of "
                                       f"{self.max_len} tokens")
        self.kv.reserve(seq.slot, end)
        self.kv.writable(seq.slot, seq.n, end)

    # -- stepping ---------------------------------------------------------------------------
    def step(self, rows: Sequence[Row], graph: bool = True, fill=None) -> list[RowOut]:
        """Advance every row's sequence by its tokens; returns one RowOut per row.
        graph=False issues a decode step's launches eagerly instead of replaying its graph
        (the replay-vs-eager check). fill: called once, fill(masks), when some row's mask is
        LATER: it writes those rows' masks into masks[i] (an int32 [len(rows), words] host
        array, row i = rows[i]; other rows are not read). On the decode path it runs while
        the device computes the step's logits; elsewhere before the step."""
        if not rows:
            return []
        later = [i for i, r in enumerate(rows) if isinstance(r.mask, str)]
        if any(rows[i].mask != LATER for i in later):
            raise MemraError(f"a row's mask is an int32 array, None or LATER, got {rows[later[0]].mask!r}")
        if later and fill is None:
            raise MemraError("rows with mask LATER need step(..., fill=...)")
        toks = [self._check_tokens(r.tokens) for r in rows]
        for r in rows:
            if r.logits not in ("none", "last", "all"):
                raise MemraError(f"row logits must be none, last or all, got {r.logits!r}")
        slots = [r.seq.slot for r in rows]
        for r, t in zip(rows, toks):
            self._reserve(r.seq, t.size)
        self.kv.sync()
        decode = len(rows) <= MAX_ROWS and all(t.size == 1 for t in toks) and len(set(slots)) == len(slots) \
            and all(r.logits != "all" for r in rows) and not (self.plan.hybrid and any(r.gen is False for r in rows))
        if not decode and later:  # the eager path reads the masks as it goes: fill them now
            buf = np.full((len(rows), self.mask_words), -1, np.int32)
            fill(buf)
            rows = [Row(r.seq, r.tokens, r.logits, r.sample, buf[i] if i in later else r.mask, r.gen)
                    for i, r in enumerate(rows)]
        if not decode:
            outs = self._eager(rows, toks)
        else:
            outs = self._decode(rows, toks, graph, fill=fill) if later else self._decode(rows, toks, graph)
        for r, t in zip(rows, toks):
            r.seq.n += t.size
        return outs

    def verify(self, seq: Seq, tokens: Sequence[int], sample: Sampling | None = None,
               graph: bool = True, masks=None, logits: str = "none"):
        """Speculative verification (memra.spec): append `tokens` (the last accepted token and
        the draft) to seq in one eager step over len(tokens) token rows and return the token
        the device sampler chooses after each of them: out[i] is drawn from the logits of
        tokens[:i+1] at position seq.n + i + 1, as plain decode would draw it there (the
        eager rows have decode's bits). Every token is fed (seq.n += len(tokens)); the caller
        rewinds the rejected ones. graph: replay the step of this row count as a CUDA graph
        (captured on its first use, after an eager run that loads every module).

        masks: None, or each row's vocabulary mask (int32 [len(tokens), ceil(n_vocab / 32)],
        or a list of rows; a row of -1 words or None allows every token): the step then
        applies them before the sampler (kernels/mask.cu, the launch a masked decode step
        has), so out[i] is what a constrained decode step under masks[i] chooses there (a
        constrained draft's verification; a constraint's forced run fed in one step). They
        are known before the step: written to the static mask buffer before the launch.
        logits: "last" or "all" also returns the rows' logits, (out, float32 [n_vocab] or
        [len(tokens), n_vocab]): the model's, as a decode step returns them (with masks the
        step then runs eagerly in two parts, the logits read before the mask launch, which
        writes -inf into them in place)."""
        t = self._check_tokens(tokens)
        n = t.size
        if n > MAX_ROWS:
            raise MemraError(f"a verification step takes at most {MAX_ROWS} tokens, got {n}")
        if logits not in ("none", "last", "all"):
            raise MemraError(f"verify's logits must be none, last or all, got {logits!r}")
        if masks is not None and len(masks) != n:
            raise MemraError(f"verify: {n} tokens need {n} mask rows, got {len(masks)}")
        self._reserve(seq, n)
        self.kv.sync()
        sm = sample or Sampling()
        sampler = "greedy" if sm.greedy else "sample"
        pos = np.arange(seq.n, seq.n + n, dtype=np.int32)
        self.p_rows.view(shape=(3, n)).upload(np.stack([t, pos, np.full(n, seq.slot, np.int32)]))
        feed = self.step_rows(n)
        # the sampler's state: each row's chosen token takes the position after its own
        state = np.zeros((4, MAX_ROWS), np.int32)
        state[1] = -1
        state[1, :n] = pos + 1
        self.r_state.upload(state)
        if sampler == "sample":
            self._set_sampling([sm] * n, n)
        if masks is not None:
            # the same launches as a masked decode step's tail (mask, then the sampler) over
            # these rows: every row live (positions >= 0), its mask read from r_mask[i]
            self._set_masks(list(masks))
            sampler += "+mask"
        self.pre_splits = self._pre_splits(pos)
        # generated rows: decode's arithmetic (a hybrid plan's attn_decode launch alone)
        kinds = self._upload_kinds(np.full(n, seq.slot, np.int32), pos, np.ones(n, bool), n)
        key = ("verify", n, sampler, self.pre_splits, self.fa_splits, self.fa_groups)
        gr = self._graphs.get(key) if graph else None
        raw = None
        if masks is not None and logits != "none":
            launches = self.plan.step(n, decode=False, sampler=sampler, kinds=kinds)
            k = _mask_index(launches)
            self._run(launches[:k], n, *feed, self._state(0, hist=False))
            V = self.cfg.n_vocab
            raw = self.buf["logits"].view(shape=(n, V)).numpy()
            self._run(launches[k:], n, *feed, self._state(0, hist=False))
        elif gr is not None:
            gr.launch()
        else:
            launches = self.plan.step(n, decode=False, sampler=sampler, kinds=kinds)
            self._run(launches, n, *feed, self._state(0, hist=False))
            if graph:  # every module is loaded now: capture this row count for next time
                with self.g.capture() as gr:
                    self._run(launches, n, *feed, self._state(0, hist=False))
                self._graphs[key] = gr
        seq.n += n
        out = [int(x) for x in self.r_tok.view(shape=(n,)).numpy()]
        if logits == "none":
            return out
        V = self.cfg.n_vocab
        if raw is not None:
            return out, (raw[-1] if logits == "last" else raw)
        if logits == "last":  # one row back, not n
            return out, self.buf["logits"].view(offset=(n - 1) * V * 4, shape=(V,)).numpy()
        return out, self.buf["logits"].view(shape=(n, V)).numpy()

    def _set_rows(self, rows: Sequence[tuple[int, int, int]]) -> None:
        """The decode rows' (token, position, block-table row), in one upload; the rows
        past them are padding (position -1) and every step counter starts at 0."""
        state = np.zeros((4, MAX_ROWS), np.int32)
        state[1] = -1
        for i, (t, p, slot) in enumerate(rows):
            state[0, i], state[1, i], state[2, i] = t, p, slot
        self.r_state.upload(state)

    def _set_sampling(self, samplings: Sequence[Sampling | None], n: int) -> None:
        fp = np.zeros((MAX_ROWS, 3), np.float32)
        tk = np.zeros(MAX_ROWS, np.int32)
        sd = np.zeros(MAX_ROWS, np.uint64)
        for i, s in enumerate(samplings[:n]):
            s = s or Sampling()
            fp[i] = (s.temperature, s.top_p, s.min_p)
            tk[i] = s.top_k
            sd[i] = s.seed & ((1 << 64) - 1)
        self.r_fparams.upload(fp)
        self.r_topk.upload(tk)
        self.r_seed.upload(sd)

    def _sampler_of(self, rows) -> str:
        samp = [r.sample for r in rows if r.sample is not None]
        if not samp:
            return "none"
        kind = "greedy" if all(s.greedy for s in samp) else "sample"
        return kind + "+mask" if any(r.mask is not None for r in rows if r.sample is not None) else kind

    def _set_masks(self, masks) -> None:
        """Row i's vocabulary mask (None: every token) into the device's mask rows, in one
        upload of the rows used."""
        self._write_masks(masks)
        self._upload_masks(len(masks))

    def _write_masks(self, masks) -> None:
        """Row i's mask into the host buffer's row i (None: every token; LATER: left for
        the fill callback)."""
        for i, m in enumerate(masks):
            if m is None:
                self.h_mask[i] = -1
            elif isinstance(m, str):
                continue
            else:
                m = np.asarray(m)
                if m.shape != (self.mask_words,) or m.dtype not in (np.int32, np.uint32):
                    raise MemraError(f"a row's mask is int32 [{self.mask_words}] (ceil(n_vocab / 32)), "
                                     f"got {m.dtype} {m.shape}")
                self.h_mask[i] = m.view(np.int32)

    def _upload_masks(self, n: int) -> None:
        """The host buffer's first n rows to the device: stream-ordered and not waited for
        when the buffer is pinned (every caller reads back before the buffer is rewritten)."""
        dst, src = self.r_mask.view(shape=(n, self.mask_words)), self.h_mask[:n]
        if self.mask_pinned:
            dst.upload_async(src)
        else:
            dst.upload(src)

    def _decode(self, rows, toks, graph: bool = True, fill=None) -> list[RowOut]:
        n = len(rows)
        Bk = PLAN.graph_bucket(n)
        ns = [r.seq.n for r in rows]
        self.dec_splits = self._dec_splits_for(max(ns))
        self.dec_kind = self.plan.att_kind_of(min(ns), max(ns))
        sampler = self._sampler_of(rows)
        raw = None
        self._set_rows([(int(t[0]), r.seq.n, r.seq.slot) for r, t in zip(rows, toks)])
        if sampler.startswith("sample"):
            self._set_sampling([r.sample for r in rows], n)
        if sampler.endswith("+mask"):
            # body (embedding .. logits), the masks, tail (mask + sampler): the masks given now
            # are written before the body, LATER ones by fill while the device runs it; the
            # copy is queued after fill returns, so the tail reads the same masks either way
            self._write_masks([r.mask if r.sample is not None else None for r in rows])
            if graph:
                body, tail = self._graph_parts(Bk, sampler)
                body.launch()
            else:
                launches = self.plan.step(Bk, decode=True, sampler=sampler, att_kind=self.dec_kind)
                k = _mask_index(launches)
                self._run(launches[:k], Bk, self.r_tok, self.r_pos, self.r_seq, self._state(1))
            if fill is not None:
                fill(self.h_mask[:n])
                for i, r in enumerate(rows):
                    if r.sample is None and isinstance(r.mask, str):
                        self.h_mask[i] = -1  # an unsampled row's logits come back unmasked
            if any(r.logits == "last" for r in rows):
                # the raw logits, read before the tail: the mask kernel writes -inf into them
                # in place, and a row's logits (log-probs) are the model's, not the mask's
                raw = self.buf["logits"].view(shape=(n, self.cfg.n_vocab)).numpy()
            self._upload_masks(n)
            if graph:
                tail.launch()
            else:
                self._run(launches[k:], Bk, self.r_tok, self.r_pos, self.r_seq, self._state(1))
        elif graph:
            self._graph(Bk, sampler).launch()
        else:
            self._run(self.plan.step(Bk, decode=True, sampler=sampler, att_kind=self.dec_kind), Bk, self.r_tok,
                      self.r_pos, self.r_seq, self._state(1))
        out = [RowOut() for _ in rows]
        if sampler != "none":
            chosen = self.r_tok.view(shape=(n,)).numpy()
            for i, r in enumerate(rows):
                if r.sample is not None:
                    out[i].token = int(chosen[i])
        if any(r.logits == "last" for r in rows):
            lg = raw if raw is not None else self.buf["logits"].view(shape=(n, self.cfg.n_vocab)).numpy()
            for i, r in enumerate(rows):
                if r.logits == "last":
                    out[i].logits = lg[i]
        return out

    def _state(self, advance: int, hist: bool = True):
        return SMP.SeqState(tok=self.r_tok, step=self.r_step, pos=self.r_pos,
                            hist=self.r_hist if hist else None, advance=advance)

    def _graph(self, bucket: int, sampler: str):
        """The captured decode step of `bucket` rows. Before the first capture the step runs
        once eagerly with every row masked (position -1: nothing is read from or written to
        the KV cache, no token committed), so every module is compiled and loaded outside
        the capture. Keyed by the split count dec_splits holds and the attention kind dec_kind."""
        return self._graph_steps(bucket, sampler, 1)

    def _graph_steps(self, bucket: int, sampler: str, steps: int):
        """`steps` decode steps of `bucket` rows in one graph (the step's launches captured that many times; each
        step reads and advances the rows' device state as a replay of the one-step graph does, so the same
        launches run in the same order), at dec_splits / dec_kind; one step is _graph's. Warmed up as _graph
        says."""
        key = (bucket, sampler, self.dec_splits, self.dec_kind)
        if steps > 1:
            key = ("steps",) + key + (steps,)
        gr = self._graphs.get(key)
        if gr is None:
            launches = self.plan.step(bucket, decode=True, sampler=sampler, att_kind=self.dec_kind)
            saved = self.r_pos.numpy()
            self.r_pos.upload(np.full(MAX_ROWS, -1, np.int32))
            self._run(launches, bucket, self.r_tok, self.r_pos, self.r_seq, self._state(1))
            self.r_pos.upload(saved)
            with self.g.capture() as gr:
                for _ in range(steps):
                    self._run(launches, bucket, self.r_tok, self.r_pos, self.r_seq, self._state(1))
            self._graphs[key] = gr
        return gr

    def _graph_parts(self, bucket: int, sampler: str):
        """(body, tail): the captured decode step of `bucket` rows with a masked sampler, cut
        before its mask launch, so the masks can be copied in between. Warmed up like _graph."""
        key = (bucket, sampler, "parts", self.dec_splits, self.dec_kind)
        parts = self._graphs.get(key)
        if parts is None:
            launches = self.plan.step(bucket, decode=True, sampler=sampler, att_kind=self.dec_kind)
            k = _mask_index(launches)
            saved = self.r_pos.numpy()
            self.r_pos.upload(np.full(MAX_ROWS, -1, np.int32))
            self._run(launches, bucket, self.r_tok, self.r_pos, self.r_seq, self._state(1))
            self.r_pos.upload(saved)
            parts = []
            for part in (launches[:k], launches[k:]):
                with self.g.capture() as gr:
                    self._run(part, bucket, self.r_tok, self.r_pos, self.r_seq, self._state(1))
                parts.append(gr)
            parts = tuple(parts)
            self._graphs[key] = parts
        return parts

    def _eager(self, rows, toks) -> list[RowOut]:
        """Token rows in chunks of PREFILL_CHUNK (rows of one sequence in order), then the
        head over the gathered rows whose logits or next token are wanted."""
        flat_tok = np.concatenate(toks)
        flat_pos = np.concatenate([np.arange(r.seq.n, r.seq.n + t.size, dtype=np.int32) for r, t in zip(rows, toks)])
        flat_seq = np.concatenate([np.full(t.size, r.seq.slot, np.int32) for r, t in zip(rows, toks)])
        flat_gen = np.concatenate([np.full(t.size, r.gen is True) for r, t in zip(rows, toks)])
        ends = np.cumsum([t.size for t in toks])
        # the flat index of every token row whose logits are needed, per row
        want: list[list[int]] = []
        for i, (r, t) in enumerate(zip(rows, toks)):
            last = int(ends[i]) - 1
            if r.logits == "all":
                want.append(list(range(last - t.size + 1, last + 1)))
            elif r.logits == "last" or r.sample is not None:
                want.append([last])
            else:
                want.append([])
        need = sorted({j for w in want for j in w})
        hrows: dict[int, np.ndarray] = {}   # flat index -> logits (host)
        sampled: dict[int, int] = {}
        for s, n in self._chunks(flat_gen):
            self._chunk(flat_tok[s:s + n], flat_pos[s:s + n], flat_seq[s:s + n], flat_gen[s:s + n])
            here = [j for j in need if s <= j < s + n]
            for k0 in range(0, len(here), MAX_ROWS):
                part = here[k0:k0 + MAX_ROWS]
                self._head(part, s, rows, want, flat_pos, hrows, sampled)
        out = []
        for i, (r, w) in enumerate(zip(rows, want)):
            o = RowOut()
            if r.logits == "all":
                o.logits = np.stack([hrows[j] for j in w])
            elif r.logits == "last":
                o.logits = hrows[w[-1]]
            if r.sample is not None:
                o.token = sampled[w[-1]]
            out.append(o)
        return out

    def _chunks(self, gen) -> list[tuple[int, int]]:
        """(start, rows) of the prefill steps over the flat token rows, in order: at most
        PREFILL_CHUNK rows each and, with the prompt tile (plan.use_tile: prompt rows' matmuls in
        another order than generated rows'), one row kind each (a new step where the kind changes)."""
        T, out, s = len(gen), [], 0
        while s < T:
            e = min(s + PREFILL_CHUNK, T)
            if self.plan.use_tile:
                change = np.flatnonzero(gen[s + 1:e] != gen[s])
                e = s + 1 + int(change[0]) if change.size else e
            out.append((s, e - s))
            s = e
        return out

    def _chunk(self, tok, pos, seq, gen=None) -> None:
        """One prefill step over n <= PREFILL_CHUNK token rows (no head): the captured
        step of the smallest prefill bucket that holds them, the rows past n padded
        (position -1: their K/V not written, no key read; a row's bits do not depend on
        the bucket), captured on a bucket's first use after an eager run of this chunk
        (which loads every module). MEMRA_PREFILL_GRAPH=0: n rows launched eagerly.
        gen: which rows are generated tokens (a hybrid plan's attn_decode rows)."""
        n = tok.size
        B = PLAN.prefill_bucket(n) if self.prefill_graph else n
        rows = np.zeros((3, B), np.int32)
        rows[1] = -1
        rows[0, :n], rows[1, :n], rows[2, :n] = tok, pos, seq
        self.p_rows.view(shape=(3, B)).upload(rows)
        kinds = self._upload_kinds(seq, pos, gen, B)
        if self.plan.hybrid:  # attn_decode's grid: the generated rows' (no attn_decode without them)
            self.pre_splits = self._pre_splits(np.where(gen, pos, -1)) if "g" in kinds else self.plan.n_splits
        else:
            self.pre_splits = self._pre_splits(pos)
        feed = self.step_rows(B)
        key = self.prefill_key(B, kinds)
        gr = self._graphs.get(key) if self.prefill_graph else None
        if gr is not None:
            gr.launch()
            return
        launches = self.plan.step(B, decode=False, kinds=kinds)
        self._run(launches, B, *feed)
        if self.prefill_graph:
            with self.g.capture() as gr:
                self._run(launches, B, *feed)
            self._graphs[key] = gr  # not uploaded ahead: memra.gpu.cuda.Graph.upload says why

    def _splits_at(self, max_pos: int, trim: bool) -> int:
        """attn_decode's grid y for rows whose deepest is at position max_pos: with trim, that
        row's split count rounded up to a power of two (ATT.splits_for: the bits of
        plan.n_splits), else (or with no live row) plan.n_splits."""
        if not trim or max_pos < 0:
            return self.plan.n_splits
        S, D, keys = self.plan.n_splits, self.cfg.head_dim, int(max_pos) + 1
        s = ATT.splits_for(keys, S, D, self.plan.att_cfg)
        if self.plan.att_switch:   # the short module's rows (fewer keys than the switch) laid out by its own config
            below, short = self.plan.att_switch
            s = max(s, ATT.splits_for(min(keys, below - 1), S, D, short))
        return s

    def _split_counts(self, trim: bool) -> list[int]:
        """Every count _splits_at can choose for this runner's contexts (it steps only where a module's
        splits_for does: evaluated on both sides of each such point)."""
        S, D = self.plan.n_splits, self.cfg.head_dim
        if not trim:
            return [S]
        cfgs = [self.plan.att_cfg] + ([self.plan.att_switch[1]] if self.plan.att_switch else [])
        marks = {m for c in cfgs for m in ATT.split_marks(self.max_len, S, D, c)}
        return sorted({self._splits_at(m - 1, True) for m in marks})

    def _dec_splits_for(self, max_pos: int) -> int:
        """A decode step's grid y: trimmed on the MEMRA_ATT_DEPTH path, else the plan's count."""
        return self._splits_at(max_pos, self.plan.att_depth)

    def _pre_splits(self, pos) -> int:
        """A prefill or verification step's grid y for rows at positions pos: trimmed unless
        MEMRA_PREFILL_SPLITS=full."""
        return self._splits_at(int(np.max(pos)), self._split_prefill)

    def prefill_split_counts(self) -> list[int]:
        """Every split count _pre_splits can choose for this runner's contexts."""
        return self._split_counts(self._split_prefill)

    def prefill_key(self, B: int, kinds: str) -> tuple:
        """The captured graph of a prefill step of bucket B and row kinds at this step's grids
        (attn_decode's split count, attn_fa's grid z and x): the graph _chunk replays."""
        return ("prefill", B, self.pre_splits, kinds, self.fa_splits, self.fa_groups)

    def fa_group_counts(self, B: int) -> list[int]:
        """Every grid x (fa_groups) _upload_groups can choose for a prefill chunk of bucket B,
        rounded up to a power of two and capped at B: its rows (more than the bucket below
        holds, at most B) make at least ceil(rows / tpb) groups, and at most floor(B / tpb)
        whole ones plus a part of each of its sequences (at most max_seqs)."""
        if not self.plan.use_fa or self.fa_grid_full:
            return [B] if self.plan.use_fa else [1]
        below = max((b for b in PLAN.PREFILL_BUCKETS if b < B), default=0)
        tpb = FA.prefill_tpb(self.cfg.n_gqa, self.plan.fa_warps)
        g, top = _pow2_at_most(-(-(below + 1) // tpb), B), _pow2_at_most(B // tpb + self.max_seqs, B)
        out = [g]
        while g < top:
            g = min(2 * g, B)
            out.append(g)
        return out

    def capture_prefill_splits(self) -> int:
        """For every prefill bucket already captured (its modules loaded by that eager run),
        the graphs of its other split counts and attn_fa grids (every group count its chunks
        can make: prompts of many sequences, or short remainders after a prefix-cache hit, make
        more groups than the warm-up's one long prompt), captured without running: a chunk at
        any depth and of any sequences then replays a graph. Returns how many were captured."""
        if not self.prefill_graph:
            return 0
        n = 0
        saved = self.pre_splits, self.fa_splits, self.fa_groups
        for B, kinds in sorted({(k[1], k[3]) for k in self._graphs if k[0] == "prefill"}):
            launches = self.plan.step(B, decode=False, kinds=kinds)
            feed = self.step_rows(B)
            # a step without attn_decode (a hybrid plan's prompt rows, MEMRA_ATTN=fa) has no use
            # for its split count, one without attn_fa's prefill packing none for attn_fa's
            dec = not self.plan.use_fa or (self.plan.hybrid and "g" in kinds)
            fa = self.plan.use_fa and (not self.plan.hybrid or "p" in kinds)
            # attn_fa's grid x: every count the bucket's chunks can make (the warm-up's among them), else the captured
            gxs = self.fa_group_counts(B) if fa else \
                sorted({k[5] for k in self._graphs if k[0] == "prefill" and k[1] == B and k[3] == kinds})
            for sp, fz, gx in itertools.product(self.prefill_split_counts() if dec else [self.plan.n_splits],
                                                self.fa_split_counts() if fa else [1], gxs):
                self.pre_splits, self.fa_splits, self.fa_groups = sp, fz, gx
                key = self.prefill_key(B, kinds)
                if key in self._graphs:
                    continue
                with self.g.capture() as gr:
                    self._run(launches, B, *feed)
                self._graphs[key] = gr
                n += 1
        self.pre_splits, self.fa_splits, self.fa_groups = saved
        return n

    def capture_decode_splits(self) -> int:
        """On the MEMRA_ATT_DEPTH path: every decode graph captured so far (its bucket and
        sampler kind) at each other split count a deeper step launches (_split_counts up to
        the context), so a decode step at any depth replays a graph. Each capture's warm-up run
        masks every row (nothing read from or written to the KV cache). With the attention switch also at each
        attention kind (plan.att_kind_of). Returns how many."""
        if not self.plan.att_depth and len(self.plan.att_kinds) == 1:
            return 0
        counts = self._split_counts(self.plan.att_depth)
        kinds = self.plan.att_kinds
        saved, n = (self.dec_splits, self.dec_kind), 0
        for key in [k for k in self._graphs if isinstance(k[0], int)]:   # (bucket, sampler[, "parts"], splits, kind)
            for sp in counts:
                for kd in kinds:
                    if key[:-2] + (sp, kd) in self._graphs:
                        continue
                    self.dec_splits, self.dec_kind = sp, kd
                    (self._graph_parts if len(key) == 5 else self._graph)(key[0], key[1])
                    n += 1
        self.dec_splits, self.dec_kind = saved
        return n

    def step_rows(self, size: int):
        """The (token, position, block-table row) views of a prefill or verification step of
        `size` rows: three runs of `size` ints in p_rows, as _chunk and verify upload them."""
        return tuple(self.p_rows.view(shape=(size,), offset=4 * size * i) for i in range(3))

    def _fa_splits(self, pos) -> int:
        """attn_fa's grid z for prefill-packing rows at positions pos (-1: not such a row): the
        splits of its deepest row's keys, rounded up to a power of two, at most fa_n_split."""
        if self.fa_grid_full:
            return self.fa_n_split
        deepest = int(np.max(pos, initial=-1))
        return 1 if deepest < 0 else _pow2_at_most(deepest // self.plan.fa_split + 1, self.fa_n_split)

    def fa_split_counts(self) -> list[int]:
        """Every grid z _fa_splits can choose for this runner's contexts."""
        if not self.plan.use_fa:
            return [1]
        if self.fa_grid_full:
            return [self.fa_n_split]
        out, z = [], 1
        while z < self.fa_n_split:
            out.append(z)
            z *= 2
        return out + [self.fa_n_split]

    def _upload_groups(self, seq, pos, size: int) -> None:
        """attn_fa's token groups of a prefill step's rows at positions pos (-1: not an attn_fa
        row), and its prefill grid: x their groups (fa_groups), z their splits (fa_splits)."""
        if self.plan.use_fa:
            self.fa_splits = self._fa_splits(pos)
            groups = FA.group_table(seq, pos, FA.prefill_tpb(self.cfg.n_gqa, self.plan.fa_warps))
            n = len(groups)  # at least 1 (a zero-count row when no row has a position)
            self.fa_groups = size if self.fa_grid_full else _pow2_at_most(n, size)
            tab = np.zeros((self.fa_groups + 1, 2), np.int32)
            tab[:n] = groups
            # after the launched groups, (rows, GROUPS_END): the step's row count, which the kernel
            # does not read (tests/gpu_emulator.py checks the groups' coverage of the step's rows with it)
            tab[self.fa_groups] = (size, FA.GROUPS_END)
            self.p_grp.view(shape=(self.fa_groups + 1, 2)).upload(tab)

    def _head(self, part, s, rows, want, flat_pos, hrows, sampled) -> None:
        """Logits of the flat token rows `part` (inside the chunk starting at s): their h
        rows gathered into hsel, quantized, the output projection; then the device sampler
        for those that are a sampling row's last token."""
        c, E, k = self.cfg, self.cfg.n_embd, len(part)
        for i, j in enumerate(part):
            self.g.copy(self.buf["hsel"].view(offset=i * E * 4, shape=(E,)),
                        self.buf["h"].view(offset=(j - s) * E * 4, shape=(E,)), E * 4)
        if self.plan.head_q8:
            xq, xs = self._twin(k, E)
            MV.quantize_q8(self.g, self.buf["hsel"].view(shape=(k, E)), xq, xs, k,
                           config=self.plan.tuned("quantize_q8", {"n": E}, k))
        last_of = {w[-1]: i for i, w in enumerate(want) if w and rows[i].sample is not None}
        samplings = [rows[last_of[j]].sample if j in last_of else None for j in part]
        sampler = "none" if not last_of else \
            ("greedy" if all(sm.greedy for sm in samplings if sm is not None) else "sample")
        masks = [rows[last_of[j]].mask if j in last_of else None for j in part]
        if sampler != "none":
            pos = np.array([flat_pos[j] + 1 if j in last_of else -1 for j in part], np.int32)
            self.r_pos.view(shape=(k,)).upload(pos)
            self.r_step.upload(np.zeros(MAX_ROWS, np.int32))
            if sampler == "sample":
                self._set_sampling(samplings, k)
            if any(m is not None for m in masks):
                self._set_masks(masks)
                sampler += "+mask"
        launches = self.plan.head(k, sampler, src="hsel")
        cut = _mask_index(launches) if sampler.endswith("+mask") else len(launches)
        self._run(launches[:cut], k, None, None, None, self._state(0, hist=False))
        # the raw logits (a host copy), read before the mask kernel writes -inf into them in place
        lg = self.buf["logits"].view(shape=(k, c.n_vocab)).numpy()
        if cut < len(launches):
            self._run(launches[cut:], k, None, None, None, self._state(0, hist=False))
        for i, j in enumerate(part):
            hrows[j] = lg[i]
        if sampler != "none":
            chosen = self.r_tok.view(shape=(k,)).numpy()
            for i, j in enumerate(part):
                if j in last_of:
                    sampled[j] = int(chosen[i])

    # -- several decode steps on the device --------------------------------------------------
    def decode_prepare(self, seqs: Sequence[Seq], first: Sequence[int], n: int, sampling: Sequence[Sampling],
                       hist: int = 16, last: int | None = None):
        """Set up `n` chained decode steps of up to 64 distinct sequences and return the
        graph whose replays run them: each replay feeds every row's token at its position
        and the sampler writes the next token and position back on the device (and into
        the history, r_hist[row, step], for `hist` steps before the step counter is reset
        by the caller). `first`: the token each sequence feeds first, at position seq.n.
        Blocks for the n positions are mapped now; seq.n is the caller's to advance. The graph
        has the split count of step `last` (default n - 1, the run's deepest: an earlier step
        needs the same or fewer splits) and the attention kind of steps 0..last (plan.att_kind_of)."""
        k = len(seqs)
        if not 1 <= k <= MAX_ROWS or len({s.slot for s in seqs}) != k:
            raise MemraError(f"a decode step takes 1 to {MAX_ROWS} distinct sequences, got {k}")
        for s in seqs:
            self._reserve(s, n)
        self.kv.sync()
        self._ensure_hist(hist)
        sampler = _run_sampler(sampling)
        deepest = max(s.n for s in seqs) + (n - 1 if last is None else last)
        self.dec_splits = self._dec_splits_for(deepest)
        self.dec_kind = self.plan.att_kind_of(min(s.n for s in seqs), deepest)
        gr = self._graph(PLAN.graph_bucket(k), sampler)  # captured first (its warm-up masks every row)
        self._set_rows([(int(self._check_tokens([t])[0]), s.n, s.slot) for s, t in zip(seqs, first)])
        if sampler == "sample":
            self._set_sampling(list(sampling), k)
        return gr

    def decode_chunks(self, lo: int, hi: int, n: int, chunk: int) -> list[tuple[int, int, str]]:
        """The chunks decode_run replays n decode steps in, rows starting at positions lo (the shallowest) .. hi
        (the deepest): (steps, split count, attention kind) of each — its deepest step's count (_dec_splits_for)
        and its rows' kind (plan.att_kind_of), the keys of the graph each chunk replays."""
        out, q = [], 0
        while q < n:
            m = min(chunk, n - q)
            out.append((m, self._dec_splits_for(hi + q + m - 1), self.plan.att_kind_of(lo + q, hi + q + m - 1)))
            q += m
        return out

    def decode_graph_at(self, rows: int, sampling: Sequence[Sampling], splits: int, kind: str, steps: int = 1):
        """The decode graph of `rows` rows (their sampling) at a chunk's split count and attention kind
        (decode_chunks; dec_splits / dec_kind set to them), of `steps` steps (_graph_steps), captured on first
        use: its warm-up masks every row, so the rows' state and the KV cache are left as they were."""
        self.dec_splits, self.dec_kind = splits, kind
        return self._graph_steps(PLAN.graph_bucket(rows), _run_sampler(sampling), steps)

    def chunk_launches(self, rows: int, sampling: Sequence[Sampling], chunk: tuple[int, int, str]) -> list:
        """(graph, launches) that replay one of decode_chunks' chunks: graph_steps steps a launch
        (MEMRA_GRAPH_STEPS), the remainder one step a launch."""
        m, sp, kd = chunk
        G = self.graph_steps
        big, rest = divmod(m, G) if G > 1 else (0, m)
        return [(self.decode_graph_at(rows, sampling, sp, kd, steps), times)
                for steps, times in ((G, big), (1, rest)) if times]

    def decode_run(self, seqs: Sequence[Seq], first: Sequence[int], n: int, sampling: Sequence[Sampling],
                   chunk: int = DECODE_CHUNK, more=None):
        """Yield, for n steps, the tokens the sequences choose (a list per step), replaying
        the decode graph `chunk` steps between read-backs of their ids (4 bytes a row a
        step). A chunk's ids are read back as soon as it ends and the next chunk is queued
        before they are yielded, so the device computes it while the consumer handles them
        (MEMRA_DECODE_AHEAD=0: queued after, the rollback). more (a callable, or None) is asked
        before each further chunk is queued: False ends the run after the steps already
        computed (fewer than n). The sequences' positions advance as steps are yielded; a
        consumer that stops early leaves at most two chunks of computed steps unread (their
        KV rows are rewritten when those positions are revisited)."""
        if n <= 0 or not seqs:
            return
        k = len(seqs)
        chunks = self.decode_chunks(min(s.n for s in seqs), max(s.n for s in seqs), n, chunk)
        self.decode_prepare(seqs, first, n, sampling, hist=chunk, last=min(chunk, n) - 1)
        ahead = self._decode_ahead
        done = 0   # chunks queued

        def go_on() -> bool:
            return done < len(chunks) and (more is None or more())

        def queue() -> int:
            nonlocal done
            if done:
                self.r_step.upload(np.zeros(MAX_ROWS, np.int32))
            for gr, times in self.chunk_launches(k, sampling, chunks[done]):
                for _ in range(times):
                    gr.launch()
            done += 1
            return chunks[done - 1][0]

        m = queue()
        while m:
            ids = self.r_hist.numpy()[:k, :m]  # waits for this chunk (the only one queued)
            nxt = queue() if ahead and go_on() else 0
            for j in range(m):
                for s in seqs:
                    s.n += 1
                yield [int(x) for x in ids[:, j]]
            if not ahead and go_on():
                nxt = queue()
            m = nxt

    # -- facts --------------------------------------------------------------------------------
    def kv_bytes_read(self, depth: int) -> int:
        """The f16 K and V bytes one sequence's decode step reads with `depth` tokens cached:
        depth + 1 keys a layer, at most the window on sliding-window layers."""
        c = self.cfg
        keys = sum(min(depth + 1, c.swa_window) if c.is_swa(il) else depth + 1 for il in range(c.n_layer))
        return keys * 2 * c.kv_dim * 2

    def bytes_per_step(self, depth: int = 0, rows: int = 1) -> int:
        """Device bytes a decode step of `rows` sequences, each `depth` tokens deep, reads:
        the weights once (bytes_per_token's) and each row's K/V."""
        return self.bytes_per_token(depth) + (rows - 1) * self.kv_bytes_read(depth)

    def bytes_per_token(self, depth: int = 0) -> int:
        """Device bytes one decode step of one sequence reads with `depth` tokens already
        cached: every weight matrix and norm/bias vector on the device (the output projection
        too, even when it is the tied embedding table), one row of the input embedding
        table, and the f16 K and V rows attention reads (depth + 1 keys; at most the window
        on sliding-window layers). Activations, rope tables and the KV row written are left
        out. tok/s x this = the achieved bandwidth of the decode roofline (memra bench)."""
        c = self.cfg
        n = sum(w.nbytes for w in self.W.values()) + sum(v.nbytes for v in self.vec.values())
        n += sum(b.nbytes for b in self.bias.values())
        n += self.embd_table.nbytes // c.n_vocab
        return n + self.kv_bytes_read(depth)
