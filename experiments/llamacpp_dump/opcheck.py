"""Op by op: each of memra's llamacpp-numerics ops fed llama.cpp's own input (from a dump),
its output compared bit for bit with llama.cpp's output.

    python experiments/llamacpp_dump/opcheck.py smollm2-135m "The capital of France is" [n_decode]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dump import Dumper, read_dump  # noqa: E402

from memra.model.aliases import resolve  # noqa: E402
from memra.model.gguf import open_gguf  # noqa: E402
from memra.cpu.reference import ReferenceModel, round_f16  # noqa: E402
from memra.text.tokenizer import Tokenizer  # noqa: E402


def cmp(label, ours, theirs):
    ours = np.asarray(ours, np.float32).reshape(-1)
    theirs = np.asarray(theirs, np.float32).reshape(-1)
    same = ours.view(np.uint32) == theirs.view(np.uint32)
    d = np.abs(ours.astype(np.float64) - theirs)
    rel = d / np.maximum(np.abs(theirs), 1e-30)
    flag = "OK " if same.all() else "BAD"
    print(f"{flag} {label:28s} equal {same.mean() * 100:7.3f} %  max|d| {d.max():.3e}  max rel {rel.max():.3e}")
    return same.all()


def layer_ops(m: ReferenceModel, t: dict, il: int, pos: np.ndarray, last: bool):
    c = m.cfg
    p = f"blk.{il}."
    w = m.weight
    sq = lambda a: np.asarray(a).reshape(-1, np.asarray(a).shape[-1])  # noqa: E731
    x_in = sq(t["embd"] if il == 0 and "inp_scaled" not in t else t.get(f"l_out-{il - 1}", t.get("inp_scaled")))
    if il == 0 and c.embd_scale != 1.0:
        x_in = sq(t["inp_scaled"]) if "inp_scaled" in t else x_in
    cmp(f"attn_norm-{il}", m._rms(x_in, w(p + "attn_norm.weight"), c.norm_eps), sq(t[f"attn_norm-{il}"]))
    h = sq(t[f"attn_norm-{il}"])
    cmp(f"Qcur-{il} (mm)", m._mm(h, p + "attn_q.weight"), sq(t[f"Qcur-{il}"]))
    cmp(f"Kcur-{il} (mm)", m._mm(h, p + "attn_k.weight"), sq(t[f"Kcur-{il}"]))
    cmp(f"Vcur-{il} (mm)", m._mm(h, p + "attn_v.weight"), sq(t[f"Vcur-{il}"]))
    n = h.shape[0]
    q0 = sq(t[f"Qcur-{il}"]).reshape(n, c.n_head, c.head_dim)
    k0 = sq(t[f"Kcur-{il}"]).reshape(n, c.n_head_kv, c.head_dim)
    if c.qk_norm:
        qn = m._rms(q0, w(p + "attn_q_norm.weight"), c.norm_eps)
        cmp(f"Qcur-{il} (norm)", qn, t[f"Qcur_normed-{il}"])
        q0 = t[f"Qcur_normed-{il}"].reshape(n, c.n_head, c.head_dim)
        kn = m._rms(k0, w(p + "attn_k_norm.weight"), c.norm_eps)
        cmp(f"Kcur-{il} (norm)", kn, t[f"Kcur_normed-{il}"])
        k0 = t[f"Kcur_normed-{il}"].reshape(n, c.n_head_kv, c.head_dim)
    rq = [k for k in t if k.startswith(f"Qcur-{il}#")][-1]
    rk = [k for k in t if k.startswith(f"Kcur-{il}#")][-1]
    cmp(f"Qcur-{il} (rope)", m._rope(q0, pos, il), t[rq])
    cmp(f"Kcur-{il} (rope)", m._rope(k0, pos, il), t[rk])
    # attention over llama.cpp's own f16 cache cells
    kc = sq(t[f"cache_k_l{il}_(view)"]).view(np.float16).astype(np.float32)
    vc = sq(t[f"cache_v_l{il}_(view)"]).view(np.float16).astype(np.float32)
    cache = m.new_cache(kc.shape[0])
    hi = int(pos[-1]) + 1
    cache.k[il][:] = kc.reshape(-1, c.n_head_kv, c.head_dim).transpose(1, 0, 2)
    cache.v[il][:] = vc.reshape(-1, c.n_head_kv, c.head_dim_v).transpose(1, 0, 2)
    cmp(f"K cache-{il}", cache.k[il][:, int(pos[0]):hi].transpose(1, 0, 2), round_f16(t[rk]))
    qr = np.asarray(t[rq]).reshape(n, c.n_head, c.head_dim)
    kqv = sq(t[f"kqv_out-{il}"])
    cmp(f"kqv_out-{il} (attn)", m._attention(il, qr, pos, cache), kqv)
    keys = list(t)
    a = sq(t[f"attn_out-{il}"] if f"attn_out-{il}" in t else t[keys[keys.index(f"kqv_out-{il}") + 1]])
    if last and a.shape[0] != n:
        kqv = kqv[-a.shape[0]:]
    cmp(f"attn_out-{il} (mm)", m._mm(kqv, p + "attn_output.weight")[-a.shape[0]:], a)
    if c.post_norms:
        cmp(f"attn_post_norm-{il}", m._rms(a, w(p + "post_attention_norm.weight"), c.norm_eps), sq(t[f"attn_post_norm-{il}"]))
        a = sq(t[f"attn_post_norm-{il}"])
    xi = x_in[-a.shape[0]:]
    fin = f"ffn_inp-{il}" if f"ffn_inp-{il}" in t else f"sa_out-{il}"
    cmp(f"{fin} (add)", xi + a, sq(t[fin]))
    fi = sq(t[fin])
    cmp(f"ffn_norm-{il}", m._rms(fi, w(p + "ffn_norm.weight"), c.norm_eps), sq(t[f"ffn_norm-{il}"]))
    h = sq(t[f"ffn_norm-{il}"])
    cmp(f"ffn_gate-{il} (mm)", m._mm(h, p + "ffn_gate.weight"), sq(t[f"ffn_gate-{il}"]))
    cmp(f"ffn_up-{il} (mm)", m._mm(h, p + "ffn_up.weight"), sq(t[f"ffn_up-{il}"]))
    gname = f"ffn_swiglu-{il}" if f"ffn_swiglu-{il}" in t else f"ffn_geglu-{il}"
    cmp(f"{gname}", m._glu(sq(t[f"ffn_gate-{il}"]), sq(t[f"ffn_up-{il}"])), sq(t[gname]))
    cmp(f"ffn_out-{il} (mm)", m._mm(sq(t[gname]), p + "ffn_down.weight"), sq(t[f"ffn_out-{il}"]))
    f = sq(t[f"ffn_out-{il}"])
    if c.post_norms:
        cmp(f"ffn_post_norm-{il}", m._rms(f, w(p + "post_ffw_norm.weight"), c.norm_eps), sq(t[f"ffn_post_norm-{il}"]))
        f = sq(t[f"ffn_post_norm-{il}"])
    cmp(f"l_out-{il} (add)", fi + f, sq(t[f"l_out-{il}"]))


def main(alias="smollm2-135m", text="The capital of France is", n_decode="0"):
    path = resolve(alias)
    g = open_gguf(path)
    m = ReferenceModel(g, numerics="llamacpp")
    ids = Tokenizer.from_gguf(g).encode(text) if False else None
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from peer import LlamaCppPeer
    with LlamaCppPeer(path) as peer:
        ids = peer.tokenize(text)
    d = Dumper(path)
    tmp = Path(tempfile.mkdtemp(prefix="opcheck"))
    d.eval(ids, want="*", dir=tmp / "p")
    t = read_dump(tmp / "p")
    pos = np.arange(len(ids))
    for il in range(m.cfg.n_layer):
        layer_ops(m, t, il, pos, il == m.cfg.n_layer - 1)
    c = m.cfg
    x = np.asarray(t[f"l_out-{c.n_layer - 1}"]).reshape(-1, c.n_embd)
    cmp("result_norm", m._rms(x, m.weight("output_norm.weight"), c.norm_eps), t["result_norm"])
    h = np.asarray(t["result_norm"]).reshape(-1, c.n_embd)
    cmp("result_output (mm)", m._mm(h, "token_embd.weight" if c.tied_output else "output.weight"), t["result_output"])


if __name__ == "__main__":
    main(*sys.argv[1:])
