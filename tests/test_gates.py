"""The exactness gates (memra.gpu.gate) bite: engine bugs injected on the emulated GPU
(tests/gpu_emulator.py) turn them red, and the unpatched engine passes them.

Each mutation patches the runner, the launch plan or the KV cache the way a real bug would
change it, then builds the engine and runs both gates: the prefill = decode cross-check and
the teacher-forced gate (the decode pass's log-probs against the CPU reference in the
numerics of the engine's path).

* The cross-check is exact: every mutation turns it red, on the default (q8) path.
* The teacher-forced gate compares across engines, so its bounds sit above the measured
  noise (memra.gpu.gate's module doc): on the q8 path, a 1e-7 summation difference flips
  8-bit activation roundings and moves log-probs by up to 0.25 without any bug, so only the
  mutations whose effect clears that (a norm weight, the block table, a stale K/V row, a
  dropped residual: max |Δ| 6.6 to 36, or NaN) are asserted red there; the rope-table and
  off-by-one-position bugs move log-probs by 0.6 and 0.34 at most on these tiny models and
  are the cross-check's to catch. On the f32 path (noise 7e-3, bound 0.03) every mutation
  turns the teacher-forced gate red too."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.cpu.reference import ReferenceModel
from memra.gpu import gate as G
from memra.gpu.engine import GPUEngine
from memra.gpu.kv import PagedKV
from memra.gpu.plan import Launch, Planner
from memra.gpu.runner import Runner
from memra.model.gguf import open_gguf

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _gates(path, matvec_path="q8", attn="decode"):
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), matvec_path=matvec_path, attn=attn)
    return G.run_gates(eng, PROMPT, reference=ReferenceModel(open_gguf(path), numerics=matvec_path))


def _patch_decode_step(monkeypatch, change):
    """Planner.step with `change(planner, launches)` applied to decode steps only."""
    real = Planner.step

    def step(self, rows, decode, sampler="none", kinds="p", **kw):
        out = real(self, rows, decode, sampler, kinds, **kw)
        return change(self, out) if decode else out

    monkeypatch.setattr(Planner, "step", step)


def rope_table_of_layer_0(monkeypatch):
    """Decode ropes every layer with layer 0's table (issue 16: on gemma3 the local layers'
    base 1e4 instead of the global layers' 1e6; logits moved by up to 0.56 and the old
    argmax gate still said MATCH)."""
    _patch_decode_step(monkeypatch, lambda p, out: [
        dataclasses.replace(L, args={**L.args, "rope_key": p.rope_key(0)}) if "rope_key" in L.args else L
        for L in out])


def wrong_norm_weight(monkeypatch):
    """Decode's FFN norm multiplies by the attention norm's weight of its layer."""
    _patch_decode_step(monkeypatch, lambda p, out: [
        dataclasses.replace(L, args={**L.args, "w": f"blk.{L.layer}.attn_norm.weight"})
        if L.name.endswith("ffn_norm") else L for L in out])


def position_off_by_one(monkeypatch):
    """Decode feeds each token at the position before its own (rope and the K/V row)."""
    real = Runner._decode

    def _decode(self, rows, toks, graph=True):
        moved = [r for r in rows if r.seq.n > 0]
        for r in moved:
            r.seq.n -= 1
        try:
            return real(self, rows, toks, graph)
        finally:
            for r in moved:
                r.seq.n += 1

    monkeypatch.setattr(Runner, "_decode", _decode)


def block_table_row(monkeypatch):
    """The block table maps every block of a sequence to its first one: positions 16 apart
    share a K/V row."""
    def sync(self):
        if self.dirty:
            t = self.table.copy()
            for s, n in enumerate(self.n_mapped):
                t[s, 1:n] = t[s, 0]
            self.d_table.upload(t)
            self.dirty = False

    monkeypatch.setattr(PagedKV, "sync", sync)


def stale_row(monkeypatch):
    """Decode attention reads the cache before the step's K/V row is appended (the fused
    launch split into attention, then RoPE + append: a stale row is read)."""
    def change(p, out):
        new = []
        for L in out:
            if L.op == "attention_rope":
                new.append(dataclasses.replace(L, op="attention"))
                new.append(Launch(L.name.replace("attention", "rope"), "rope", "rope_norm_kv", "default", p.heads,
                                  L.rows, p.rope_cfg, "heads", L.layer, L.args))
            else:
                new.append(L)
        return new

    _patch_decode_step(monkeypatch, change)


def residual_dropped(monkeypatch):
    """Decode's down projection forgets the residual add."""
    _patch_decode_step(monkeypatch, lambda p, out: [
        dataclasses.replace(L, args={**L.args, "res": None}) if L.group == "down" and L.args.get("res") else L
        for L in out])


# (mutation, model, whether the q8 path's teacher-forced gate must see it too)
MUTATIONS = [(rope_table_of_layer_0, "gemma3", False), (wrong_norm_weight, "llama", True),
             (position_off_by_one, "qwen3", False), (block_table_row, "llama", True), (stale_row, "qwen2", True),
             (residual_dropped, "llama", True)]
QUANT = {"llama": "Q4_K_M", "qwen2": "Q8_0", "qwen3": "Q4_0", "gemma3": "Q4_K_M"}


@pytest.mark.parametrize("matvec_path", ["q8", "f32"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_gates_pass_the_engine_as_it_is(tiny_models, arch, matvec_path):
    from flatness import assert_not_flat

    path = tiny_models(arch, QUANT[arch])
    x, t = _gates(path, matvec_path)
    assert x.verdict == "MATCH" and x.positions == G.TF_POSITIONS, x.line()
    assert t.verdict == "MATCH" and t.positions == G.TF_POSITIONS, t.line()
    if matvec_path == "q8":  # the oracle of the mutations below must not be flat
        ref = ReferenceModel(open_gguf(path), numerics="q8")
        assert_not_flat(G.reference_logits(ref, x.tokens), f"tiny {arch}")


@pytest.mark.parametrize("attn", ["decode", "hybrid"])
@pytest.mark.parametrize("matvec_path", ["q8", "f32"])
@pytest.mark.parametrize("mutation,arch,tf_q8", MUTATIONS, ids=[m.__name__ for m, _, _ in MUTATIONS])
def test_an_injected_engine_bug_turns_the_gates_red(tiny_models, monkeypatch, mutation, arch, tf_q8, matvec_path,
                                                    attn):
    """Each bug of decode steps turns the cross-check red, with one attention arithmetic
    (prefill = decode) and with two (decode steps = the same rows batched as generated rows)."""
    path = tiny_models(arch, QUANT[arch])
    mutation(monkeypatch)
    x, t = _gates(path, matvec_path, attn)
    assert x.verdict == "MISMATCH", x.line()
    if matvec_path == "f32" or tf_q8:
        assert t.verdict == "MISMATCH", t.line()
    assert G.failed(x, t)


def test_cross_check_reports_the_first_differing_position(tiny_models, monkeypatch):
    """Only decode steps from position 20 on are wrong: the gate names position 20."""
    real = Runner._decode

    def _decode(self, rows, toks, graph=True):
        out = real(self, rows, toks, graph)
        if rows[0].seq.n >= 20:
            out[0].logits = out[0].logits + np.float32(1e-3) * (np.arange(out[0].logits.size) % 3)
        return out

    monkeypatch.setattr(Runner, "_decode", _decode)
    eng = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=64, gpu=FakeGpu(1 << 28))
    x, dec = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.first_diff, x.n_diff, x.positions) == ("MISMATCH", 20, 12, 32), x.line()
    assert 1e-3 <= x.max_abs_diff <= 2.1e-3 and dec.shape == (32, eng.cfg.n_vocab)


def test_cross_check_sees_non_finite_logits(tiny_models, monkeypatch):
    """NaN logits in both passes are the same bits, but never a MATCH."""
    real = Runner.step

    def step(self, rows, graph=True):
        out = real(self, rows, graph)
        for o in out:
            if o.logits is not None:
                o.logits = o.logits.copy()
                o.logits[..., 7] = np.nan
        return out

    monkeypatch.setattr(Runner, "step", step)
    eng = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=64, gpu=FakeGpu(1 << 28))
    x, _ = G.cross_check(eng, PROMPT)
    assert x.verdict == "MISMATCH" and x.first_diff == 0 and "not finite" in x.detail, x.line()


def test_teacher_forced_deltas_and_bound():
    """position_deltas: the next token, both top-1s; the verdict follows the bound."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 50)).astype(np.float32) * 3

    class Ref:
        numerics = "q8"

        def new_cache(self, n):
            return [0]

        def forward(self, toks, cache):
            cache[0] += 1
            return ref[cache[0] - 1]

    toks = [3, 9, 1, 4]
    got = ref.copy()
    t = G.teacher_forced(got, toks, Ref(), bound=0.05)
    assert t.verdict == "MATCH" and t.max_delta < 1e-6 and t.positions == 4
    got[2, toks[3]] += 0.3  # the next token's logit at position 2
    t = G.teacher_forced(got, toks, Ref(), bound=0.05)
    assert t.verdict == "MISMATCH" and t.first_over == 2 and t.n_over == 1 and t.worst == 2
    assert 0.2 < t.max_delta < 0.3
    got[3, :] = np.nan
    t = G.teacher_forced(got, toks, Ref(), bound=0.05)
    assert t.n_over == 2 and t.max_delta == np.inf


def test_run_gates_skips_the_reference_for_large_models(tiny_models, monkeypatch):
    monkeypatch.setattr(G, "REF_MAX_PARAMS", 1000)
    eng = GPUEngine(tiny_models("llama", "Q4_K_M"), n_ctx=64, gpu=FakeGpu(1 << 28))
    x, t = G.run_gates(eng, PROMPT)
    assert x.verdict == "MATCH" and t.verdict == "SKIPPED" and "weights" in t.detail
    assert not G.failed(x, t)


# -- two attention arithmetics (prefill_exact = False) ----------------------------------------

N_VOCAB = 40


class PositionEngine:
    """An engine whose logits depend on the position only: a one-token prompt row gives
    prompt[p], a decode step dec[p] (default: prompt[p]), a row of a batched prefill chunk
    batched.get(p, prompt[p]) (a bug of batched prompt chunks), a row of a batched chunk of
    generated rows gen_batched.get(p, dec[p]) (a bug of decode steps or of batched rows)."""

    path = "q8"
    max_len = 64

    def __init__(self, prompt, dec=None, batched=None, prefill_exact=None, gen_batched=None):
        from types import SimpleNamespace

        self.prompt, self.dec, self.batched, self.n = prompt, prompt if dec is None else dec, batched or {}, 0
        self.gen_batched = gen_batched or {}
        self.cfg = SimpleNamespace(n_vocab=prompt.shape[1])
        self.kv = SimpleNamespace(k=[], v=[])
        if prefill_exact is not None:
            self.prefill_exact = prefill_exact

    def reset(self):
        self.n = 0

    def decode(self, tok):
        self.n += 1
        return self.dec[self.n - 1].copy()

    def prefill(self, toks, all_logits=False, gen=False):
        if gen:  # generated rows batched: decode's rows unless gen_batched says otherwise
            rows = [self.gen_batched.get(p, self.dec[p]).copy() for p in range(self.n, self.n + len(toks))]
        else:
            rows = [(self.batched.get(p, self.prompt[p]) if len(toks) > 1 else self.prompt[p]).copy()
                    for p in range(self.n, self.n + len(toks))]
        self.n += len(toks)
        return np.stack(rows) if all_logits else rows[-1]


def _table():
    """32 positions of logits in [-2, 2] with one clear top-1 (margin >= 3) each."""
    rng = np.random.default_rng(1)
    t = np.clip(rng.standard_normal((G.TF_POSITIONS, N_VOCAB)), -2, 2).astype(np.float32)
    t[np.arange(len(t)), rng.integers(0, N_VOCAB, len(t))] = 5.0
    return t


def _moved(row, changes):
    out = row.copy()
    for tok, v in changes.items():
        out[tok] = v
    return out


def _one_ulp_up(row, tok):
    return _moved(row, {tok: np.nextafter(row[tok], np.float32(np.inf))})


def test_exact_engine_one_ulp_is_still_a_mismatch():
    t = _table()
    moved = {5: _one_ulp_up(t[5], 3)}
    for eng in (PositionEngine(t, batched=moved), PositionEngine(t, batched=moved, prefill_exact=True)):
        x, dec = G.cross_check(eng, PROMPT)
        assert (x.verdict, x.first_diff, x.n_diff, x.positions, x.exact) == ("MISMATCH", 5, 1, 32, True), x.line()
        assert x.max_abs_diff == float(moved[5][3]) - float(t[5, 3]) > 0
        assert x.line().startswith("gate prefill=decode: MISMATCH at position 5 of 32 (1 positions differ")
        assert np.array_equal(dec, t) and G.failed(x)
    x, _ = G.cross_check(PositionEngine(t), PROMPT)
    assert x.line() == "gate prefill=decode: MATCH (32 positions, logits bit-identical and finite)"


def test_two_arithmetics_prompt_rows_equal_batched_is_a_match_whatever_decode_gives():
    """Prompt rows one at a time = the batched prefill, bit for bit: MATCH, though decode
    differs. Decode at position 5: the top-1's logit - d; at 7: the top-1 swapped with a
    token 1.2 below it (log-probs move by exactly 1.2, a top-1 flip: the old log-prob rule's
    MISMATCH); at 9: every logit + 0.25 (log-probs kept, bits not). Reported, not judged:
    max |Δ log-prob| 1.2 (at 7), top-1 differs at 1 position."""
    t = _table()
    dec = t.copy()
    top5 = int(np.argmax(t[5]))
    dec[5, top5] -= np.float32(0.05)
    top7, other = int(np.argmax(t[7])), (int(np.argmax(t[7])) + 1) % N_VOCAB
    t[7, other] = np.float32(5 - 1.2)
    dec[7] = _moved(t[7], {top7: t[7, other], other: t[7, top7]})
    dec[9] = t[9] + np.float32(0.25)
    m = float(t[7, top7]) - float(t[7, other])
    x, got = G.cross_check(PositionEngine(t, dec, prefill_exact=False), PROMPT)
    assert (x.verdict, x.exact, x.positions, x.first_diff, x.n_diff, x.n_top1_diff) == \
        ("MATCH", False, 32, None, 0, 1), x.line()
    assert abs(x.max_delta - m) < 1e-9 and not G.failed(x)
    assert x.line() == ("gate prefill=decode (two arithmetics: prompt rows batched = one at a time, decode "
                        "steps = generated rows batched, bit for bit): MATCH (32 positions); decode rows vs prompt rows: max |Δ log-prob| 1.2, top-1 "
                        "differs at 1 positions")
    assert np.array_equal(got, dec)  # the teacher-forced gate's input: the decode rows
    x, _ = G.cross_check(PositionEngine(t, prefill_exact=False), PROMPT)
    assert (x.verdict, x.max_delta, x.n_top1_diff) == ("MATCH", 0.0, 0)


def test_two_arithmetics_batched_one_ulp_from_one_at_a_time_is_a_mismatch():
    """Decode = prompt rows everywhere; the batched prefill 1 ulp off at position 12."""
    t = _table()
    eng = PositionEngine(t, batched={12: _one_ulp_up(t[12], 4)}, prefill_exact=False)
    x, _ = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.exact, x.first_diff, x.n_diff, x.positions) == ("MISMATCH", False, 12, 1, 32), x.line()
    assert x.max_abs_diff == float(np.nextafter(t[12, 4], np.float32(np.inf))) - float(t[12, 4]) > 0
    a = int(np.argmax(t[12]))
    assert (x.prefill_argmax, x.decode_argmax) == (a, a) and G.failed(x)
    assert x.line().startswith("gate prefill=decode (two arithmetics: prompt rows batched = one at a time, "
                               "decode steps = generated rows batched, bit for bit): MISMATCH at position 12 of 32 (1 "
                               "positions differ; there max |Δlogit| ")
    assert f"argmax prefill {a} vs one at a time {a})" in x.line()


def test_two_arithmetics_decode_steps_one_ulp_from_batched_generated_rows_is_a_mismatch():
    """Prompt rows batched = one at a time everywhere; the decode step at position 6 is 1 ulp
    off the same row batched as a generated row (a bug of decode steps: their graph, their
    plan) and the generated rows' batch differs at 9 too: MISMATCH at 6, both counted."""
    t = _table()
    dec = t.copy()
    dec[6] = _one_ulp_up(t[6], 2)
    eng = PositionEngine(t, dec, prefill_exact=False, gen_batched={6: t[6], 9: _one_ulp_up(t[9], 1)})
    x, got = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.exact, x.first_diff, x.n_diff) == ("MISMATCH", False, 6, 2), x.line()
    assert x.max_abs_diff == float(dec[6, 2]) - float(t[6, 2]) > 0 and G.failed(x)
    assert "decode steps against the same rows batched as generated rows" in x.line()
    a = int(np.argmax(t[6]))
    assert f"argmax prefill {a} vs decode {a}" in x.line() and np.array_equal(got, dec)


@pytest.mark.parametrize("where", ["both prompt passes", "batched", "decode"])
def test_two_arithmetics_non_finite_logits_are_a_mismatch(where):
    """NaN at position 3: in the prompt rows (the same bits batched and one at a time), in
    the batched prefill only, or in a decode row."""
    t = _table()
    nan = _moved(t[3], {0: np.nan})
    if where == "decode":
        dec = t.copy()
        dec[3] = nan
        eng = PositionEngine(t, dec, prefill_exact=False)
    elif where == "batched":
        eng = PositionEngine(t, batched={3: nan}, prefill_exact=False)
    else:
        t[3] = nan
        eng = PositionEngine(t, prefill_exact=False)
    x, _ = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.first_diff, x.n_diff) == ("MISMATCH", 3, 1) and x.max_delta == math.inf, x.line()
    assert G.failed(x)
    assert "not finite" in x.detail
    assert x.max_abs_diff == (0.0 if where == "decode" else math.inf) and ("decode" in x.detail) == (where == "decode")


def test_two_arithmetics_on_the_emulated_gpu(tiny_models, monkeypatch):
    """MEMRA_ATTN=hybrid on the emulated engine: MATCH (the decode rows differ from the
    prompt rows, reported); an injected bug of batched prompt chunks only (a step's last
    prompt row left out of attn_fa's rows when it has several: that row's attention is not
    computed) turns it red at the chunk's last row."""
    path = tiny_models("llama", "Q4_K_M")
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid")
    x, dec = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.exact, x.positions) == ("MATCH", False, 32), x.line()
    assert x.max_delta > 0 and dec.shape == (32, eng.cfg.n_vocab), x.line()
    assert x.line().startswith("gate prefill=decode (two arithmetics: prompt rows batched = one at a time, "
                               "decode steps = generated rows batched, bit for bit): MATCH (32 positions); decode rows "
                               "vs prompt rows: max |Δ log-prob| ")
    real = Runner._upload_kinds

    def _upload_kinds(self, seq, pos, gen, size):
        prompt = np.flatnonzero((np.asarray(pos) >= 0) & ~(np.zeros(len(pos), bool) if gen is None else
                                                           np.asarray(gen, bool)))
        if prompt.size > 1:
            pos = np.array(pos)
            pos[prompt[-1]] = -1
        return real(self, seq, pos, gen, size)

    monkeypatch.setattr(Runner, "_upload_kinds", _upload_kinds)
    x, _ = G.cross_check(GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid"), PROMPT)
    assert (x.verdict, x.exact, x.first_diff) == ("MISMATCH", False, 31) and G.failed(x), x.line()


@pytest.mark.parametrize("prompt_gemm", ["tile", "f16"])
def test_two_arithmetics_with_the_prompt_gemm(prompt_gemm, tiny_models, monkeypatch):
    """Hybrid with the prompt rows' GEMM — the tile (kernels/gemm_tile.cu, emulated by the chain; the
    tiny model's weights made to qualify) or the f16 one (MEMRA_PROMPT_GEMM's default): the gate is
    MATCH; a GEMM whose outputs depend on the batch (a chunk of several rows missing its last row's
    products) turns it red."""
    from memra.gpu.ops import gemm_f16 as GF
    from memra.gpu.ops import gemm_tile as GT

    monkeypatch.setattr(GT, "MIN_ROW_TILES", 1)
    monkeypatch.delenv("MEMRA_TILE", raising=False)
    monkeypatch.setenv("MEMRA_PROMPT_GEMM", prompt_gemm)
    path = tiny_models("llama", "Q4_K_M")
    eng = GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid")
    assert eng.plan.use_tile and bool(eng.plan.f16_keys) == (prompt_gemm == "f16")
    x, _ = G.cross_check(eng, PROMPT)
    assert (x.verdict, x.exact, x.positions) == ("MATCH", False, 32), x.line()
    mod, name = (GT, "gemm_tile") if prompt_gemm == "tile" else (GF, "gemm_f16")
    real = getattr(mod, name)

    def short(g, w, y, *, nb, **kw):  # a chunk's last row left out when it has several
        real(g, w, y, nb=nb - 1 if nb > 1 else nb, **kw)

    monkeypatch.setattr(mod, name, short)
    x, _ = G.cross_check(GPUEngine(path, n_ctx=64, gpu=FakeGpu(1 << 28), attn="hybrid"), PROMPT)
    assert x.verdict == "MISMATCH" and G.failed(x), x.line()


# -- memra run --device gpu -------------------------------------------------------------------

@pytest.fixture
def run_cli(monkeypatch, tiny_models):
    """`memra run --device gpu` in-process on the emulated engine."""
    from typer.testing import CliRunner

    from gpu_emulator import install
    from memra.cli import app

    install(monkeypatch)
    return CliRunner(), app, tiny_models("llama", "Q4_K_M")


def test_cli_run_prints_both_gates_first(run_cli, monkeypatch):
    runner, app, path = run_cli
    monkeypatch.setenv("MEMRA_ATTN", "decode")  # one attention arithmetic: the exact lines
    r = runner.invoke(app, ["run", str(path), "--prompt", "The capital of France is", "-n", "6", "--temp", "0",
                            "--device", "gpu", "--json"])
    assert r.exit_code == 0, r.output
    assert "gate prefill=decode: MATCH" in r.output and "gate teacher-forced: MATCH" in r.output
    doc = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("{")))
    assert doc["gate"]["cross_check"]["verdict"] == "MATCH" and doc["gate"]["teacher_forced"]["verdict"] == "MATCH"
    assert len(doc["tokens"]) == 6


def test_cli_run_exits_on_a_mismatch_before_any_text_or_figure(run_cli, monkeypatch):
    runner, app, path = run_cli
    wrong_norm_weight(monkeypatch)  # a bug both paths share: the teacher-forced gate's to catch
    r = runner.invoke(app, ["run", str(path), "--prompt", "The capital of France is", "-n", "6", "--temp", "0",
                            "--device", "gpu"])
    assert r.exit_code == 1
    assert "gate teacher-forced: MISMATCH" in r.output and "memra: error: exactness gate MISMATCH" in r.output
    assert not r.stdout.strip() and "tok/s" not in r.output


def test_cli_run_with_two_attention_arithmetics_prints_and_records_the_report(run_cli, monkeypatch):
    """MEMRA_ATTN=hybrid: the gate line names the two-arithmetic rule, the JSON records the
    decode-vs-prompt report; the run goes on."""
    runner, app, path = run_cli
    monkeypatch.setenv("MEMRA_ATTN", "hybrid")
    r = runner.invoke(app, ["run", str(path), "--prompt", "The capital of France is", "-n", "6", "--temp", "0",
                            "--device", "gpu", "--json"])
    assert r.exit_code == 0, r.output
    assert ("gate prefill=decode (two arithmetics: prompt rows batched = one at a time, decode steps = "
            "generated rows batched, bit for bit): "
            "MATCH") in r.output and "gate teacher-forced: MATCH" in r.output
    doc = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("{")))
    x = doc["gate"]["cross_check"]
    assert x["verdict"] == "MATCH" and x["exact"] is False and x["max_delta"] > 0 and "n_top1_diff" in x
    assert len(doc["tokens"]) == 6


def test_failed_passes_any_verdict_but_mismatch():
    x = G.CrossCheck("MATCH", 4)
    assert not G.failed(x, dataclasses.replace(x, verdict="NEAR-TIE"), G.TeacherForced("SKIPPED"))
    assert G.failed(x, dataclasses.replace(x, verdict="MISMATCH"))
