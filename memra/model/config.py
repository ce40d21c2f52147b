"""Model hyper-parameters per architecture, read from GGUF metadata.

One flat dataclass describes all supported architectures (llama, qwen2, qwen3, gemma3):
they are one decoder shape with a few switches, and the forward passes (CPU reference and
GPU engine) read the switches rather than the architecture name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from memra.errors import GGUFError, UnsupportedModelError
from memra.model.gguf import GGUFFile

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # K (and Q) head size
    head_dim_v: int
    n_ff: int
    norm_eps: float
    rope_base: float
    rope_dim: int  # rotated dims per head (<= head_dim)
    rope_neox: bool  # NeoX (split halves) vs normal (adjacent pairs)
    rope_freq_scale: float = 1.0  # linear position scaling (1 / factor)
    rope_base_swa: float | None = None  # rope base on sliding-window layers (gemma3)
    has_rope_freqs: bool = False  # per-dimension frequency factors tensor (Llama-3.1 style)
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each Q/K head before RoPE
    post_norms: bool = False  # gemma3: norm after attention and after FFN, before the residual add
    embd_scale: float = 1.0  # token embeddings multiplied by this
    act: str = "silu"  # "silu" or "gelu_tanh" on the gate
    tied_output: bool = False
    attn_scale: float = 0.0  # multiplier on Q·K; 0 → 1/sqrt(head_dim)
    swa_window: int = 0  # sliding-window size (0: none)
    swa_layers: tuple[bool, ...] = field(default=())  # per layer: uses the sliding window
    final_logit_softcap: float = 0.0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def v_dim(self) -> int:
        return self.n_head_kv * self.head_dim_v

    @property
    def scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[layer]

    def layer_rope_base(self, layer: int) -> float:
        if self.is_swa(layer) and self.rope_base_swa is not None:
            return self.rope_base_swa
        return self.rope_base


def _scalar(g: GGUFFile, key: str, default=None, *, required=False):
    v = g.metadata.get(key, default)
    if v is None and required:
        raise GGUFError(g.path, f"metadata {key} is missing")
    if isinstance(v, np.ndarray):  # per-layer arrays: memra supports uniform values only
        if v.size == 0 or not np.all(v == v.flat[0]):
            raise UnsupportedModelError(f"{g.path}: per-layer values for {key} are not supported")
        v = v.flat[0].item()
    return v


def _shown(v) -> str:
    if isinstance(v, (list, np.ndarray)):
        return f"an array of {len(v)}"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(g: GGUFFile, key: str, default=None, *, required=False, minimum: int = 1) -> int:
    """An integer hyper-parameter: an integer value (not a string, float or bool) of at least
    `minimum`, else a GGUFError naming the key and the value found."""
    v = _scalar(g, key, default, required=required)
    if isinstance(v, bool) or not isinstance(v, int):
        raise GGUFError(g.path, f"metadata {key} = {_shown(v)} is not an integer")
    if v < minimum:
        raise GGUFError(g.path, f"metadata {key} = {v} is out of range (at least {minimum})")
    return v


def _float(g: GGUFFile, key: str, default: float, *, positive: bool = False) -> float:
    """A finite, non-negative (or positive) number, else a GGUFError naming the key."""
    v = _scalar(g, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GGUFError(g.path, f"metadata {key} = {_shown(v)} is not a number")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise GGUFError(g.path, f"metadata {key} = {v} is out of range (a finite number "
                                f"{'above' if positive else 'at least'} 0)")
    return v


_BLOCK = re.compile(r"blk\.(\d+)\.")


def read_config(g: GGUFFile) -> ModelConfig:
    arch = g.arch
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{g.path}: architecture {arch!r} is not supported (memra runs {', '.join(ARCHITECTURES)})")
    p = arch + "."
    n_embd = _int(g, p + "embedding_length", required=True)
    n_layer = _int(g, p + "block_count", required=True)
    n_head = _int(g, p + "attention.head_count", required=True)
    n_head_kv = _int(g, p + "attention.head_count_kv", n_head)
    if p + "attention.key_length" not in g.metadata and n_embd % n_head:
        raise GGUFError(g.path, f"{p}embedding_length {n_embd} is not a multiple of {p}attention.head_count "
                                f"{n_head} (and {p}attention.key_length is not set)")
    head_dim = _int(g, p + "attention.key_length", n_embd // n_head)
    head_dim_v = _int(g, p + "attention.value_length", head_dim)
    n_ff = _int(g, p + "feed_forward_length", required=True)
    eps = _float(g, p + "attention.layer_norm_rms_epsilon", 1e-5)
    rope_base = _float(g, p + "rope.freq_base", 10000.0, positive=True)
    rope_dim = _int(g, p + "rope.dimension_count", head_dim)
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, list) else None
    n_vocab = _int(g, p + "vocab_size", 0, minimum=0)
    if n_vocab and n_tokens is not None and n_vocab != n_tokens:
        raise GGUFError(g.path, f"metadata {p}vocab_size = {n_vocab} does not match the {n_tokens} tokens "
                                f"of tokenizer.ggml.tokens")
    n_vocab = n_vocab or n_tokens or g.tensor("token_embd.weight").shape[0]
    n_ctx = _int(g, p + "context_length", 4096)

    if n_head % n_head_kv:
        raise GGUFError(g.path, f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    if rope_dim > head_dim or rope_dim % 2:
        raise GGUFError(g.path, f"rope.dimension_count {rope_dim} does not fit head size {head_dim}")
    # every layer needs its own tensors: a corrupt count must not size the per-layer tables
    n_blocks = len({m.group(1) for name in g.tensors if (m := _BLOCK.match(name))})
    if n_layer > n_blocks:
        raise GGUFError(g.path, f"metadata {p}block_count = {n_layer}, but the file has tensors of "
                                f"{n_blocks} layers (blk.N.*)")

    scaling = _scalar(g, p + "rope.scaling.type", "none")
    factor = _float(g, p + "rope.scaling.factor", 1.0) or 1.0  # 0: unset, as llama.cpp reads it
    if scaling in ("none", None) or factor == 1.0:
        freq_scale = 1.0
    elif scaling == "linear":
        freq_scale = 1.0 / factor
    else:
        raise UnsupportedModelError(f"{g.path}: rope scaling type {scaling!r} is not supported")

    kw: dict = dict(
        arch=arch, n_vocab=n_vocab, n_ctx_train=n_ctx, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, head_dim_v=head_dim_v, n_ff=n_ff,
        norm_eps=eps, rope_base=rope_base, rope_dim=rope_dim, rope_freq_scale=freq_scale,
        has_rope_freqs="rope_freqs.weight" in g.tensors,
        tied_output="output.weight" not in g.tensors,
    )
    if arch == "llama":
        kw.update(rope_neox=False)
    elif arch == "qwen2":
        kw.update(rope_neox=True, qkv_bias=True)
    elif arch == "qwen3":
        kw.update(rope_neox=True, qk_norm=True)
    elif arch == "gemma3":
        window = _int(g, p + "attention.sliding_window", 0, minimum=0)
        pattern = _int(g, p + "attention.sliding_window_pattern", 6, minimum=0) or 6
        # every pattern-th layer is global, the others use the sliding window
        swa = tuple(window > 0 and (i % pattern) != pattern - 1 for i in range(n_layer))
        kw.update(rope_neox=True, qk_norm=True, post_norms=True, embd_scale=math.sqrt(n_embd),
                  act="gelu_tanh", swa_window=window, swa_layers=swa, rope_base_swa=10000.0,
                  attn_scale=1.0 / math.sqrt(head_dim),
                  final_logit_softcap=_float(g, p + "final_logit_softcapping", 0.0))
    return ModelConfig(**kw)
