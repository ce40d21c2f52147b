"""How much does coarser activation quantization cost? Teacher-forced log-probs of the real models on the CPU
reference, activations of quantized-weight matmuls rounded per B values (d = amax / 127, q = rint(x / d), the GPU
engine's q8 rule with block B) against exact float32 activations.

The question behind it (experiments/act256/README.md): an activation scale per 256 for K-quant layers (the format
llama.cpp's CPU path already multiplies K-quants with, q8_K) would let the matvec / GEMM sum a super-block's eight
sub-blocks in integers and do the float work once per 256 instead of once per 32. Before any kernel: does per-256
hold the model's outputs as well as per-32 does?

    python3 experiments/act256/quality.py [--models smollm2-135m gemma3-270m] [--out experiments/act256/quality.jsonl]

Arms (each against "f32"): q8 (per 32 everywhere: today's engine), kq256 (per 256 on the K-quant weights, per 32 on
the rest: the proposal), all64 / all128 / all256 / allrow (that block on every quantized weight whose K it divides,
per 32 elsewhere: the sensitivity curve), llamacpp (llama.cpp CPU's own numerics, q8_K on K-quants).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from memra.cpu import reference as REF
from memra.model.quants import F16, BF16, F32, Q4_K, Q5_K, Q6_K

K_QUANTS = {Q4_K, Q5_K, Q6_K}

TEXT = (
    "The river begins in the high meadows, where snow lingers until early summer and the ground stays soft "
    "underfoot. For the first few miles it is hardly more than a stream, and a child could step across it without "
    "getting her shoes wet. Farther down, other streams join it, and by the time it reaches the old mill town it is "
    "wide enough to carry small boats. The town grew up around the mill, which ground wheat and barley for the farms "
    "in the valley. When the railway arrived, the mill lost its trade, and for many years the building stood empty. "
    "Then a group of residents bought it, repaired the roof, and turned the ground floor into a library and a cafe. "
    "On Saturday mornings there is a market in the square outside, with bread, cheese, apples and honey from the "
    "surrounding hills. Below the town the valley opens out, and the river slows and bends through wide fields. "
    "Herons stand in the shallows, and in autumn the geese stop here on their way south. Scientists from the "
    "university measure the water every month: its temperature, how clear it is, and how much oxygen it carries. "
    "Their records go back nearly fifty years, and they show that the river is cleaner now than it was when the "
    "factories upstream still emptied their waste into it. Fish that had disappeared have returned, and otters have "
    "been seen again near the bridge. The river finally reaches the sea at a broad estuary, where the fresh water "
    "mixes with the tide. Mud flats appear twice a day, and thousands of wading birds feed on them. It is a quiet "
    "place, and on a calm evening the only sounds are the birds and the slow movement of the water."
)


class Arm(REF.ReferenceModel):
    """numerics "q8" with the activation block chosen per weight by `pick(name, type, K) -> block`."""

    def __init__(self, g, pick):
        super().__init__(g, numerics="q8")
        self.pick = pick
        self.blocks: dict[str, int] = {}

    def _round_act(self, x, name):
        t = self.g.tensor(name).ggml_type
        if t in (F16, BF16, F32):
            return x, None
        b = self.pick(name, t, x.shape[1])
        self.blocks[name] = b
        return REF.q8_gpu(x, b), None


def picks():
    def kq256(name, t, k):
        return 256 if t in K_QUANTS and k % 256 == 0 else 32

    def all_(b):
        return lambda name, t, k: (k if b == "row" else b) if (b == "row" or k % b == 0) else 32
    def only(b, part):   # block b on the weights whose name holds `part` (K permitting), per 32 elsewhere
        return lambda name, t, k: b if part in name and k % b == 0 else 32

    return {"q8": lambda name, t, k: 32, "kq256": kq256, "all64": all_(64), "all128": all_(128),
            "all256": all_(256), "allrow": all_("row"),
            "down256": only(256, "ffn_down"), "out256": only(256, "attn_output"),
            "qkv192": lambda name, t, k: 192 if any(p in name for p in ("attn_q", "attn_k", "attn_v")) and k % 192 == 0
            else 32,
            "gu192": lambda name, t, k: 192 if ("ffn_gate" in name or "ffn_up" in name) and k % 192 == 0 else 32,
            "gu320": lambda name, t, k: 320 if ("ffn_gate" in name or "ffn_up" in name) and k % 320 == 0 else 32,
            "qkv320": lambda name, t, k: 320 if any(p in name for p in ("attn_q", "attn_k", "attn_v"))
            and k % 320 == 0 else 32,
            "nodown256": lambda name, t, k: 32 if "ffn_down" in name else (256 if k % 256 == 0 else
                                                                            (192 if k % 192 == 0 else 32))}


def logprobs(model, toks):
    cache = model.new_cache(len(toks) + 1)
    logits = model.forward(toks, cache, all_logits=True).astype(np.float64)
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def compare(ref, lp, toks):
    nxt = np.asarray(toks[1:])
    r, a = ref[:-1], lp[:-1]
    pr = np.exp(r)
    kl = (pr * (r - a)).sum(-1)
    tr = r[np.arange(len(nxt)), nxt]
    ta = a[np.arange(len(nxt)), nxt]
    return {"kl_mean": float(kl.mean()), "kl_p99": float(np.quantile(kl, 0.99)), "kl_max": float(kl.max()),
            "dlp_max": float(np.abs(ta - tr).max()), "dlp_mean": float(np.abs(ta - tr).mean()),
            "top1_agree": float((r.argmax(-1) == a.argmax(-1)).mean()),
            "ppl": float(np.exp(-ta.mean())), "ppl_ref": float(np.exp(-tr.mean()))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--arms", nargs="+", default=["q8", "kq256", "all64", "all128", "all256", "allrow", "llamacpp"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from memra.model.aliases import resolve
    from memra.model.gguf import GGUFFile
    from memra.text.tokenizer import Tokenizer

    out = open(a.out, "w") if a.out else None
    for name in a.models:
        g = GGUFFile(resolve(name))
        toks = Tokenizer.from_gguf(g).encode(TEXT)
        t0 = time.time()
        ref = logprobs(REF.ReferenceModel(g, numerics="f32"), toks)
        print(f"{name}: {len(toks)} tokens, f32 reference {time.time() - t0:.1f} s", file=sys.stderr)
        for arm in a.arms:
            t0 = time.time()
            if arm == "llamacpp":
                m, blocks = REF.ReferenceModel(g, numerics="llamacpp"), {}
            else:
                m = Arm(g, picks()[arm])
                blocks = m.blocks
            row = {"model": name, "arm": arm, "tokens": len(toks), **compare(ref, logprobs(m, toks), toks)}
            if blocks:
                hist: dict[int, int] = {}
                for b in blocks.values():
                    hist[b] = hist.get(b, 0) + 1
                row["blocks"] = {str(k): v for k, v in sorted(hist.items())}
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            print(f"  {arm}: {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
