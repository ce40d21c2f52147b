"""MEMRA_NORM_PRO: a decode step's RMSNorm (and quantize) folded into the prologue of the mv_q8
launches that read it (memra.gpu.plan.Planner._prologues, memra.gpu.ops.matvec.Prologue).

The plan side on its own (which launches go, which readers take what), and the engine on the CPU
emulator (tests/gpu_emulator.py: mv_q8n's contract is rmsnorm + its q8 twin, then mv_q8): the
decode logits must be the unfused engine's bit for bit, graph and eager, on every architecture
(Gemma-3's add_rmsnorm is never folded; its quantizes are). The kernel's own bits against the
pair are kernel-check's and experiments/norm_pro/probe.py's, on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_emulator import FakeGpu, ModuleLog
from memra.errors import MemraError
from memra.gpu import plan as PLAN
from memra.gpu.engine import GPUEngine
from memra.gpu.ops import matvec as MV
from memra.model.gguf import open_gguf

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _planner(path, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("MEMRA_NORM_PRO", raising=False)
    else:
        monkeypatch.setenv("MEMRA_NORM_PRO", value)
    return PLAN.Planner(PLAN.ModelSpec.from_gguf(open_gguf(path)))


def test_groups_parse(monkeypatch):
    for v, want in (("", set()), ("0", set()), ("1", set(PLAN.PROLOGUE_GROUPS)), ("all", set(PLAN.PROLOGUE_GROUPS)),
                    ("qkv, down", {"qkv", "down"})):
        monkeypatch.setenv("MEMRA_NORM_PRO", v)
        assert PLAN.prologue_groups() == want
    monkeypatch.setenv("MEMRA_NORM_PRO", "qkv,norm")
    with pytest.raises(MemraError, match="unknown group.*norm"):
        PLAN.prologue_groups()


def test_plan_folds_the_norms_of_a_decode_step(tiny_models, monkeypatch):
    path = tiny_models("llama", "Q4_K_M")
    base = _planner(path, monkeypatch, None)
    p = _planner(path, monkeypatch, "all")
    n_layer = p.cfg.n_layer
    before, after = base.step(1, decode=True, sampler="greedy"), p.step(1, decode=True, sampler="greedy")
    ops = [L.op for L in after]
    assert "norm" not in ops and "quantize" not in ops
    # every other launch is kept, in order; the readers differ by their prologue alone
    kept = [L for L in before if L.op not in ("norm", "quantize")]
    assert [L.name for L in kept] == [L.name for L in after]
    pro = {L.name: L.args.get("prologue") for L in after}
    norms = [L.args["w"] for L in before if L.op == "norm"]
    assert [pro[f"blk.{il}.qkv"]["w"] for il in range(n_layer)] + [pro["output"]["w"]] == norms[0::2]
    assert [pro[f"blk.{il}.gate_up"]["w"] for il in range(n_layer)] == [f"blk.{il}.ffn_norm.weight"
                                                                         for il in range(n_layer)]
    for il in range(n_layer):
        assert pro[f"blk.{il}.qkv"]["src"] == "x" and pro[f"blk.{il}.down"] == {"src": "ff", "w": None, "threads": 32}
        assert pro[f"blk.{il}.attn_output"] is None  # the attention writes its twin itself: no quantize to fold
    t = pro["blk.0.qkv"]["threads"]
    assert t == p.norm_threads and t % 32 == 0


def test_plan_folds_only_what_it_is_asked(tiny_models, monkeypatch):
    path = tiny_models("llama", "Q4_K_M")
    p = _planner(path, monkeypatch, "down")
    after = p.step(1, decode=True)
    assert [L.op for L in after].count("norm") == p.cfg.n_layer * 2 + 1
    assert all((L.args.get("prologue") is not None) == (L.group == "down") for L in after if L.op == "matvec")
    # prompt chunks and steps whose readers are not mv_q8 keep every launch
    full = _planner(path, monkeypatch, "all")
    assert not any("prologue" in L.args for L in full.step(4, decode=False))
    assert not any("prologue" in L.args for L in full.step(16, decode=True))  # the GEMM reads the twin


def test_gemma_folds_its_add_rmsnorm(tiny_models, monkeypatch):
    """Gemma-3's post-norm add_rmsnorm folded: the reader computes x + rmsnorm(delta) * w_post itself
    and its first reader writes the sums to the residual's other buffer, so the residual moves
    x -> x2 -> x ... one fold at a time; the head's reader writes nothing."""
    path = tiny_models("gemma3", "Q4_K_M")
    p = _planner(path, monkeypatch, "all")
    after = p.step(1, decode=True, sampler="greedy")
    ops = [L.op for L in after]
    assert "add_norm" not in ops and "quantize" not in ops and ops.count("norm") == 0
    pros = [(L.name, L.args["prologue"]) for L in after if L.args.get("prologue") and L.args["prologue"].get("delta")]
    firsts = [(n, pr) for n, pr in pros if pr["x_out"] is not None or n == "output"]
    assert len(firsts) == 2 * p.cfg.n_layer
    cur = "x"
    for n, pr in firsts:
        assert pr["src"] == cur and pr["threads"] == p.add_norm_threads and pr["w_post"] and pr["delta"] == "t1"
        nxt = "x2" if cur == "x" else "x"
        assert pr["x_out"] == (None if n == "output" else nxt)
        cur = nxt
    # a partial fold: the add_norms that stay update the buffer the residual is in
    q = _planner(path, monkeypatch, "gate_up")
    kept = [L for L in q.step(1, decode=True) if L.op == "add_norm"]
    folded = [L for L in q.step(1, decode=True) if (L.args.get("prologue") or {}).get("delta")]
    assert len(kept) == len(folded) == p.cfg.n_layer
    assert [L.args["x"] for L in kept] == ["x2" if il % 2 == 0 else "x" for il in range(p.cfg.n_layer)]


@pytest.mark.parametrize("arch,quant,groups", [("llama", "Q4_K_M", "all"), ("qwen2", "Q8_0", "all"),
                                               ("qwen3", "Q4_0", "all"), ("gemma3", "Q4_K_M", "all"),
                                               ("gemma3", "Q4_K_M", "gate_up,output")])
def test_engine_logits_bit_identical(tiny_models, monkeypatch, arch, quant, groups):
    """Prefill (unchanged) then decode steps, graph and eager: the folded engine's logits are the
    unfused engine's, bit for bit, on the emulator (which also checks every mv_q8n launch's grid
    and dynamic shared memory against matvec.cu's contract)."""
    path = tiny_models(arch, quant)
    monkeypatch.delenv("MEMRA_NORM_PRO", raising=False)
    base = GPUEngine(path, n_ctx=48, gpu=FakeGpu(1 << 28))
    toks = base.generate_greedy(PROMPT, 6)
    monkeypatch.setenv("MEMRA_NORM_PRO", groups)
    g = ModuleLog(1 << 28)
    eng = GPUEngine(path, n_ctx=48, gpu=g)
    assert eng.generate_greedy(PROMPT, 6) == toks
    assert any(f == MV.KERNEL_FILE and "MV_NORM" in dict(d) for f, d in g.loaded)  # the folded launches ran
    for graph in (True, False):
        for e in (base, eng):
            e.reset()
            e.prefill(PROMPT)
        for t in toks:
            a, b = base.decode(t, graph=graph), eng.decode(t, graph=graph)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{arch}: token {t} graph={graph}"


def test_launch_set_checks_the_folded_launches(monkeypatch):
    """kernel-check's launch set from a folded plan holds mv_q8n cases (the module the runner
    loads), and each passes check_launch on the emulator: the fused launch against rmsnorm /
    quantize_q8 + mv_q8, bit for bit."""
    from memra.tune import launches as LS
    from memra.tune.tables import read_table, tables_dir

    monkeypatch.setenv("MEMRA_NORM_PRO", "all")
    specs, missing = LS.model_specs(("synth:tiny-llama:Q4_K_M", "synth:tiny-qwen2:Q8_0", "synth:tiny-gemma3:Q4_K_M"))
    assert not missing
    cases = [c for c in LS.launch_set(specs, [read_table(tables_dir() / "nvidia-h200.json")]).values()
             if c["entry"].startswith("mv_q8n")]
    assert {(c["params"]["norm"], c["params"]["add"]) for c in cases} == {(True, False), (False, False), (True, True)}
    assert {c["entry"] for c in cases} == {"mv_q8n", "mv_q8n_glu"}
    g, rng = FakeGpu(1 << 29), np.random.default_rng(0)
    for c in cases:
        o = MV.check_launch(g, rng, c)
        assert o.ok and "bit-identical" in o.detail, o.detail


def test_engine_batch_of_matvec_chunks(tiny_models, monkeypatch):
    """Decode steps of 3 rows on mv_q8 chunks (MEMRA_MVT=0, MEMRA_GEMM=0): the folded launches take
    nb = 3 rows (and the residual's second buffer three rows); the batch's logits equal the
    unfolded engine's bit for bit, on llama (norms) and Gemma-3 (add_rmsnorm)."""
    monkeypatch.setenv("MEMRA_MVT", "0")
    monkeypatch.setenv("MEMRA_GEMM", "0")
    prompts = [PROMPT, PROMPT[:4], [1, 5, 9, 200, 3000]]
    for arch in ("llama", "gemma3"):
        path = tiny_models(arch, "Q4_K_M")
        got = []
        for v in ("", "all"):
            monkeypatch.setenv("MEMRA_NORM_PRO", v)
            g = ModuleLog(1 << 28)
            eng = GPUEngine(path, n_ctx=48, batch=3, gpu=g)
            for i, p in enumerate(prompts):
                eng.prefill(p, seq=i)
            got.append([eng.decode_batch([7, 8, 9]), eng.decode_batch([10, 11, 12], graph=False)])
            folded = {dict(d).get("MV_B") for f, d in g.loaded if f == MV.KERNEL_FILE and "MV_NORM" in dict(d)}
            assert folded == ({"4"} if v else set()), (arch, v, folded)
        for a, b in zip(*got):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), arch
