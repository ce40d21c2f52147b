"""The runner compiles its plan's kernel modules ahead of use (memra.gpu.compile.AheadOfUse, MEMRA_PRECOMPILE): the
modules it lists (memra.tune.launches.plan_modules) hold every module the runner then loads on the emulator
(tests/gpu_emulator.py records them), on the default plan, under MEMRA_DECODE=qf and on Gemma-3's; a module
already in the cubin cache is not compiled again; a failed compile is reported and left to the load."""

from __future__ import annotations

import pytest

from gpu_emulator import ModuleLog
from memra.gpu import compile as C
from memra.gpu.plan import PREFILL_CHUNK
from memra.gpu.runner import MAX_ROWS, Runner
from memra.gpu import modules as LS
from memra.tune.invariance import batch_invariance
from test_runner_emulated import PROMPT


class AheadGpu(ModuleLog):
    """The emulated device, compiling ahead as a real one does."""
    compile_ahead = True


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """The jobs handed to compile_many (nothing compiled: the emulator loads no CUBIN), the cubin cache empty."""
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))
    jobs = []

    def fake(todo, workers=None):
        for j in todo:
            jobs.append(j)
            yield j, None, 0.0
    monkeypatch.setattr(C, "compile_many", fake)
    return jobs


@pytest.mark.parametrize("arch, decode", [("llama", "q8"), ("llama", "qf"), ("gemma3", "q8")])
def test_the_plans_modules_hold_every_module_the_runner_loads(tiny_models, recorded, monkeypatch, arch, decode):
    monkeypatch.setenv("MEMRA_DECODE", decode)
    monkeypatch.delenv("MEMRA_PRECOMPILE", raising=False)
    r = Runner(tiny_models(arch, "Q4_K_M"), gpu=AheadGpu(1 << 28), max_len=96, max_seqs=16)
    assert recorded, "nothing compiled ahead"   # joined inside the constructor
    ahead = {(f, tuple(sorted((k, str(v)) for k, v in d.items()))) for f, _, d in recorded}
    assert {a for _, a, _ in recorded} == {"sm_90a"}
    assert batch_invariance(r, PROMPT, n_steps=4, co=9)["identical"]
    assert r.g.loaded, "the workload loaded nothing"
    missing = r.g.loaded - ahead
    assert not missing, f"loaded but not compiled ahead: {sorted(missing)[:3]}"


def _modules(plan, launches) -> set:
    ctx = LS.PlanContext(plan.cfg, plan, plan.path)
    return {(c["file"], tuple(sorted(c["defines"].items())))
            for L in launches for c in LS.family_module(LS.OP_FAMILY[L.op]).launch_cases(L, ctx)}


@pytest.mark.parametrize("decode", ["q8", "qf"])
def test_every_row_count_loads_listed_modules(tiny_models, monkeypatch, decode):
    """Whatever rows a step holds — the eager head over 1..64 gathered rows, a prompt chunk of 1..PREFILL_CHUNK rows of
    each kind — its modules are among the plan's (the runner's own plan: the device table its emulated H-class
    device resolves to)."""
    monkeypatch.setenv("MEMRA_DECODE", decode)
    plan = Runner(tiny_models("llama", "Q4_K_M"), gpu=ModuleLog(1 << 28), max_len=96, max_seqs=4).plan
    listed = {(f, tuple(sorted(d.items()))) for f, d in LS.plan_modules(plan)}
    for k in range(1, MAX_ROWS + 1):
        for sampler in LS.SAMPLERS:
            assert _modules(plan, plan.head(k, sampler, src="hsel")) <= listed, (k, sampler)
    kinds = ("p", "g") if plan.use_tile else ("p", "g", "pg")
    for rows in range(1, PREFILL_CHUNK + 1):
        for kind in kinds:
            assert _modules(plan, plan.step(rows, decode=False, kinds=kind)) <= listed, (rows, kind)


def test_rollback_seam_compiles_nothing(tiny_models, recorded, monkeypatch):
    monkeypatch.setenv("MEMRA_PRECOMPILE", "0")
    Runner(tiny_models("llama", "Q4_K_M"), gpu=AheadGpu(1 << 28), max_len=96, max_seqs=4)
    assert recorded == []


def test_cached_modules_are_not_compiled_again(recorded):
    mods = [("act.cu", {"ACT_THREADS": 256}), ("act.cu", {"ACT_THREADS": 128})]
    p = C.cubin_path("act.cu", "sm_90a", {"ACT_THREADS": 256})
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"cubin")
    a = C.AheadOfUse(lambda: mods, "sm_90a").join()
    assert recorded == [("act.cu", "sm_90a", {"ACT_THREADS": 128})]
    assert (a.compiled, a.cached, a.failed) == (1, 1, [])


def test_a_failed_compile_is_left_to_the_load(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))
    monkeypatch.setattr(C, "compile_many", lambda todo, workers=None: ((j, "error: boom", 0.0) for j in todo))
    a = C.AheadOfUse(lambda: [("act.cu", {"ACT_THREADS": 7})], "sm_90a").join()
    assert (a.compiled, a.failed) == (0, [("act.cu", "sm_90a", {"ACT_THREADS": 7})])
    assert "did not compile ahead" in caplog.text


def test_an_error_listing_the_modules_is_only_logged(caplog):
    def broken():
        raise RuntimeError("no plan")
    a = C.AheadOfUse(broken, "sm_90a").join()
    assert (a.compiled, a.cached) == (0, 0)
    assert "compiling kernel modules ahead failed (RuntimeError: no plan)" in caplog.text
