"""kernel-check's launch set (memra.tune.launches) and receipts (memra.tune.kernelcheck), on the
CPU: the set holds every module the engine loads (the emulated runner's own launches are the
oracle), each case's check runs and passes on the emulator (whose geometry check also sees
every tuned configuration's grid), a family without checks or canaries fails the run, the
checks catch what the canaries break, and a receipt's currency follows the sources and the
launch set. The last test is CI's view of the GPU evidence: the committed H200 receipt must
cover HEAD."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu
from memra.errors import MemraError
from memra.gpu.ops import attention as ATT
from memra.gpu.plan import ModelSpec
from memra.gpu.runner import Row, Runner, Sampling
from memra.model.gguf import open_gguf
from memra.tune import kernelcheck as KC
from memra.tune import launches as LS

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


def _modules(cases):
    return {(c["file"], e, tuple(sorted(c["defines"].items()))) for c in cases.values() for e in c["entry"].split("+")}


def _recorded(g):
    seen = set()
    real = g.launch

    def launch(kernel, grid, block, args, shmem=0, pdl=False):
        seen.add((kernel.module.kernel_file, kernel.name, tuple(sorted(kernel.defines.items()))))
        return real(kernel, grid, block, args, shmem, pdl)

    g.launch = launch
    return seen


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("gemma3", "Q4_K_M")])
def test_launch_set_holds_every_module_the_engine_loads(tiny_models, monkeypatch, arch, quant):
    """The emulated runner with the table it picks (the H200's, by compute capability): a
    20-token prefill (the GEMM from 16 rows), decode steps of one and three sequences
    (greedy and sampled), on the q8 and f32 paths and with RoPE unfused; every module it
    loads is a case of the launch set built from the model's header."""
    path = tiny_models(arch, quant)
    seen, tables = set(), []
    for env in ({}, {"MEMRA_MATVEC_PATH": "f32"}, {"MEMRA_FUSED_ROPE": "0"}):
        for k in ("MEMRA_MATVEC_PATH", "MEMRA_FUSED_ROPE"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        g = FakeGpu(1 << 28)
        rec = _recorded(g)
        r = Runner(path, gpu=g, max_len=64, max_seqs=4)
        tables.append(r.tune_table)
        seqs = [r.open() for _ in range(3)]
        r.step([Row(seqs[0], PROMPT * 2, sample=Sampling(0.0))])
        r.step([Row(seqs[1], PROMPT[:3]), Row(seqs[2], PROMPT[:5], logits="last")])
        r.step([Row(seqs[0], [5], sample=Sampling(0.0))])
        r.step([Row(s, [7], sample=Sampling(0.9, 40, 0.95, 0.05, 3)) for s in seqs])
        r.step([Row(s, [8], logits="last") for s in seqs], graph=False)
        seen |= rec
    assert tables[0].get("entries"), "the emulated device should pick the H200 table (cc 9.0)"
    cases = LS.launch_set([ModelSpec.from_gguf(open_gguf(path), arch)], [tables[0]])
    missing = seen - _modules(cases)
    assert not missing, sorted(missing)[:5]
    assert {c["family"] for c in cases.values()} >= {"matvec", "gemm", "norm", "rope", "attention", "embed", "sample"}


def test_launch_set_holds_the_decode_attention_at_every_split_count(tiny_models, monkeypatch):
    """On the MEMRA_ATT_DEPTH path (on with hybrid) a decode step's attention blocks take the whole GQA group once
    its split count fills the SMs (plan.att_hpb_at): a module of its own (N_GQA). The emulated runner's decode
    graphs at every split count its context reaches (capture_decode_splits), on the q8 and f32 paths: every module
    they load is a case of the launch set, the whole-group ones among them."""
    path = tiny_models("llama", "Q4_K_M")
    seen, table, cfg = set(), None, None
    for env in ({}, {"MEMRA_MATVEC_PATH": "f32"}):
        monkeypatch.delenv("MEMRA_MATVEC_PATH", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        g = FakeGpu(1 << 30)
        rec = _recorded(g)
        r = Runner(path, gpu=g, max_len=16384, max_seqs=1)   # 128 splits: 2 KV heads x 128 fill 132 SMs
        assert r.plan.att_depth and r.cfg.n_gqa > 1
        table, cfg = r.tune_table, r.cfg
        s = r.open()
        r.step([Row(s, PROMPT, sample=Sampling(0.0))])
        r.step([Row(s, [5], sample=Sampling(0.0))])
        assert r.capture_decode_splits() > 0
        seen |= rec
    whole = {m for m in seen if m[0] == "attention.cu" and dict(m[2]).get("N_GQA") == cfg.n_gqa}
    assert whole, "no decode graph reached the whole-group module"
    cases = LS.launch_set([ModelSpec.from_gguf(open_gguf(path), "llama")], [table])
    missing = seen - _modules(cases)
    assert not missing, sorted(missing)[:5]
    # and as the runner launches it: one row, with the q8 twin (q8 path) and without (f32 path)
    got = {c["params"]["twin"] for c in cases.values() if c["family"] == "attention" and c["bucket"] == 1
           and c["entry"] == "attn_decode_rope" and c["defines"]["N_GQA"] == cfg.n_gqa}
    assert got == {False, True}, got


def test_a_case_key_names_the_switch_and_the_fa_twin(monkeypatch):
    """What changes a module or its check is in the case key: attention.cu's row filter (ATT_SWITCH, a define the
    launch's config lacks) — a launch set at another switch holds other row-filter cases — and attn_fa's fused
    decode entry with the q8 twin (q8 path) or without (f32 path), whose twin-less case checks the launch without
    xq and passes on the emulator."""
    from memra.tune.tables import read_table, tables_dir

    table = read_table(tables_dir() / "nvidia-h200.json")
    specs, missing = LS.model_specs(("synth:tiny-llama:Q4_K_M",))
    assert not missing

    def filtered(switch):
        monkeypatch.setenv("MEMRA_ATT_SWITCH", switch)
        return {k for k, c in LS.launch_set(specs, [table]).items()
                if c["family"] == "attention" and c["params"].get("switch")}

    a, b = filtered("48"), filtered("64")
    assert a and b and not a & b
    monkeypatch.delenv("MEMRA_ATT_SWITCH")
    fa = [c for c in LS.launch_set(specs, [table]).values() if c["entry"] == "attn_fa_dec+rope"]
    assert {c["params"]["twin"] for c in fa} == {False, True}
    assert len({LS.case_key(c) for c in fa}) == len(fa)
    g, rng = FakeGpu(1 << 30), np.random.default_rng(0)
    c = next(c for c in fa if not c["params"]["twin"])
    o = LS.family_module("attn_fa").check_launch(g, rng, c)
    assert o.ok and "no twin" in o.name, (o.name, o.detail)


def _one_per_module(cases):
    out, seen = [], set()
    for c in cases.values():
        k = (c["family"], c["entry"], tuple(sorted(c["defines"].items())))
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def test_every_launch_check_runs_and_passes_on_the_emulator():
    """One case of every module of two tiny models' launch sets (tuned configurations
    included) through its family's check_launch on the emulator: the checks run, their
    references agree with the launch contracts, and every launch's grid passes the
    emulator's geometry check."""
    specs, missing = LS.model_specs(("synth:tiny-llama:Q4_K_M", "synth:tiny-gemma3:Q4_K_M", "synth:tiny-qwen2:Q8_0"))
    assert not missing
    from memra.tune.tables import read_table, tables_dir

    cases = LS.launch_set(specs, [read_table(tables_dir() / "nvidia-h200.json")])
    todo = _one_per_module(cases)
    assert len(todo) > 30
    g, rng = FakeGpu(1 << 30), np.random.default_rng(0)
    bad = []
    for c in todo:
        o = LS.family_module(c["family"]).check_launch(g, rng, c)
        if not o.ok:
            bad.append((c["entry"], c["defines"], o.detail))
    assert not bad, bad[:3]


def test_table_entries_of_unlisted_shapes_are_launched():
    """A table entry no listed model reaches still becomes a case, with its configuration."""
    table = {"device": "X", "entries": {
        "matvec": {"cols=1024,rows=777,type=Q4_K": {"1": {"variant": "q8", "config": {"MV_NWARPS": 8, "MV_ROWS": 4},
                                                          "src": "matvec.cu", "src_hash": "x"}}},
        "rmsnorm": {"n=3072": {"1": {"variant": "default", "config": {"NORM_THREADS": 384}, "src": "norm.cu",
                                     "src_hash": "x"}}}}}
    cases = LS.launch_set([], [table])
    mv = [c for c in cases.values() if c["entry"] == "mv_q8"]
    assert mv and all(c["defines"]["MV_ROWS"] == 4 and c["defines"]["MV_NWARPS"] == 8 for c in mv)
    assert any(c["entry"] == "rmsnorm" and c["defines"]["NORM_THREADS"] == 384 for c in cases.values())


def test_every_entry_of_the_h200_table_is_executed():
    """Each entry of tune/defaults/nvidia-h200.json is a case of the launch set kernel-check
    runs for that device, with the entry's tunables in its defines (launches.unexecuted_entries)."""
    from memra.tune.tables import read_table, tables_dir

    table = read_table(tables_dir() / "nvidia-h200.json")
    specs, missing = LS.model_specs()
    assert not missing, missing
    cases = list(LS.launch_set(specs, [table]).values())
    assert sum(len(b) for s in table["entries"].values() for b in s.values()) > 50
    assert not LS.unexecuted_entries(table, cases)


def test_unexecuted_entries_names_what_no_case_runs():
    """An entry whose tunable no launch passes (a dropped define), a dispatch entry of a path no case takes and a
    kernel no launch knows are named; the entries the cases run are not."""
    table = {"device": "X", "entries": {
        "quantize_q8": {"n=1536": {"1": {"variant": "default", "config": {"Q8_WARPS": 8, "Q8_PDL_TRIGGER": 2}}}},
        "rmsnorm": {"n=576": {"1": {"variant": "default", "config": {"NORM_THREADS": 256}}}},
        "dispatch": {"cols=576,rows=960,type=Q4_1": {"8": {"variant": "gemm", "config": {}}}},
        "mystery": {"n=1": {"1": {"variant": "default", "config": {}}}}}}
    cases = [{"entry": "quantize_q8", "defines": {"Q8_WARPS": 8}, "bucket": 1, "params": {}},
             {"entry": "rmsnorm", "defines": {"NORM_THREADS": 256, "NORM_MAXV": 1}, "bucket": 1, "params": {}},
             {"entry": "mvt_q8", "defines": {}, "bucket": 8, "params": {"type": 3, "K": 576}}]
    got = LS.unexecuted_entries(table, cases)
    assert [g.split(" ")[0] for g in got] == ["quantize_q8", "dispatch", "mystery"]
    cases[0]["defines"]["Q8_PDL_TRIGGER"] = 2
    cases[2]["entry"] = "gemm_q8"
    assert [g.split(" ")[0] for g in LS.unexecuted_entries(table, cases)] == ["mystery"]


# the emulator's heap for a whole gemm_f16 family run: its allocator never frees, and the table's cases at the 8B's
# K (activations of up to 512 x 14,336) take ~750 MiB of it (session 44's campaign entries)
GEMM_F16_HEAP = 3 << 29


def _emulated_kernel_check(monkeypatch, heap=None, **kw):
    EMU.install(monkeypatch, FakeGpu(heap) if heap else None)
    return list(KC.run_kernel_check(models=["synth:tiny-llama:Q4_K_M"], seed=1, **kw))


def test_a_family_without_checks_or_canaries_fails_the_run(monkeypatch):
    import sys
    import types

    empty = types.ModuleType("memra_empty_family")
    empty.compile_variants = lambda: []
    empty.checks = lambda g, rng: iter(())
    empty.canaries = lambda g, rng: iter(())
    monkeypatch.setitem(sys.modules, "memra_empty_family", empty)
    monkeypatch.setitem(KC.FAMILIES, "empty", "memra_empty_family")
    lines = _emulated_kernel_check(monkeypatch, only="empty")
    assert "FAIL  empty: 0 checks and 0 canaries (a family needs at least one of each)" in lines
    assert lines[-1].startswith("FAILED") and not KC.all_green(lines)


def test_softcap_and_argmax_checks_catch_their_canaries(monkeypatch):
    """What the new canaries break (kernels/act.cu: softcap leaves the last value unwritten;
    sample.cu: argmax ties to the largest index), done to the emulator's kernel models: the
    families' checks fail, and pass on the models as they are."""
    from memra.gpu.ops import act as ACT
    from memra.gpu.ops import sample as SMP

    g, rng = FakeGpu(1 << 26), np.random.default_rng(2)
    assert ACT._check_softcap(g, rng, rows=2, n=1000).ok
    assert SMP._check_argmax(g, rng, 3, 5000).ok
    real_softcap = EMU._KERNELS["softcap"]

    def softcap_drops_last(g_, k, grid, v):
        x, n, cap = v
        keep = EMU._f32(g_, x, n)[-1]
        real_softcap(g_, k, grid, v)
        EMU._f32(g_, x, n)[-1] = keep

    def argmax_ties_high(g_, k, grid, v):
        pv, pi, nb, tok, pos, step, hist, hist_len, advance = v
        for b in range(grid[0]):
            vals = EMU._f32(g_, pv, (b + 1) * nb)[b * nb:]
            idxs = g_.mem(pi, np.int32, (b + 1) * nb)[b * nb:]
            best = max(range(nb), key=lambda j: (vals[j], idxs[j]))
            EMU._commit(g_, b, int(idxs[best]), tok, pos, step, hist, hist_len, advance)

    def partial_ties_high(g_, k, grid, v):
        logits, n, pv, pi = v
        nb, rows = grid[0], grid[1]
        seg = -(-n // nb)
        for b in range(rows):
            lg = EMU._f32(g_, logits + 4 * b * n, n)
            for j in range(nb):
                s = lg[j * seg:min(n, (j + 1) * seg)]
                EMU._f32(g_, pv, rows * nb)[b * nb + j] = s.max()
                g_.mem(pi, np.int32, rows * nb)[b * nb + j] = j * seg + int(len(s) - 1 - np.argmax(s[::-1]))

    monkeypatch.setitem(EMU._KERNELS, "softcap", softcap_drops_last)
    monkeypatch.setitem(EMU._KERNELS, "argmax_final", argmax_ties_high)
    monkeypatch.setitem(EMU._KERNELS, "argmax_partial", partial_ties_high)
    assert not ACT._check_softcap(g, rng, rows=2, n=1000).ok
    assert not SMP._check_argmax(g, rng, 3, 5000).ok


def test_poison_is_no_value_a_kernel_writes():
    from memra.gpu.cuda import poison_byte
    from memra.gpu.q8 import Q8_SCALE

    g = FakeGpu(1 << 20)
    q, s, f, t = g.empty(64, np.int8), g.empty(2, Q8_SCALE), g.empty(4, np.float32), g.empty(4, np.int32)
    for a in (q, s, f, t):
        a.poison()
    assert np.all(q.numpy() == -128)  # quantize_q8's values lie in [-127, 127]
    assert np.all(s.numpy()["d"] < 0) and np.all(np.abs(s.numpy()["s"]) > 32 * 127)
    assert np.all(np.isnan(f.numpy())) and np.all(t.numpy() == -1)
    assert poison_byte(np.uint16) == 0xFF  # f16 bits: NaN


# -- receipts and their currency --------------------------------------------------------------

TINY = ("synth:tiny-llama:Q4_K_M",)


@pytest.fixture
def receipt(monkeypatch, tmp_path):
    """A green receipt over the tiny llama's launch set (LS.MODELS narrowed to it)."""
    from memra.tune.tables import read_table, tables_dir

    monkeypatch.setattr(LS, "MODELS", TINY)
    specs, _ = LS.model_specs(TINY)
    cases = LS.launch_set(specs, [read_table(tables_dir() / "nvidia-h200.json")])
    report = {"device": "NVIDIA H200", "cc": "9.0", "sms": 132, "arch": "sm_90a", "nvrtc": "13.0", "seed": 1,
              "all_green": True, "failures": 0, "families": {}, "models": list(TINY), "models_missing": [],
              "tables": [], "launch_set": sorted(cases)}
    r = KC.make_receipt(report)
    path = KC.write_receipt(r, KC.receipt_path("NVIDIA H200", tmp_path))
    assert path == tmp_path / "nvidia-h200.json"
    return r, path


def test_a_green_receipt_is_current_until_a_source_changes(receipt, monkeypatch):
    r, path = receipt
    st = KC.status("NVIDIA H200", path)
    assert st["current"] and st["stale"] == [] and st["uncovered"] == [], st["reason"]
    assert st["sources_hash"] == r["sources_hash"] and set(r["sources"]) >= {"matvec.cu", "qtypes.cuh", "gemm.cu"}
    real = KC.kernel_sources
    monkeypatch.setattr(KC, "kernel_sources", lambda: {**real(), "matvec.cu": "0" * 16, "new.cu": "1" * 16})
    st = KC.status("nvidia-h200", path)
    assert not st["current"] and st["stale"] == ["matvec.cu", "new.cu"] and "2 kernel sources changed" in st["reason"]
    json.dumps(st)


def test_status_names_table_entries_no_launch_runs(receipt, tmp_path, monkeypatch):
    """A table entry whose tunable the launcher drops (session 47's quantize_q8 trigger) is named in the status's
    `unexecuted` (the tiny models' launch set leaves other entries there too: the real models reach them)."""
    from memra.gpu.ops import matvec as MV
    from memra.tune import tables as TB

    r, path = receipt
    t = json.loads((TB.tables_dir() / "nvidia-h200.json").read_text())
    e = t["entries"]["quantize_q8"]
    key = sorted(e)[0]
    b = sorted(e[key])[0]
    e[key][b]["config"] = {**e[key][b]["config"], "Q8_PDL_TRIGGER": 2}
    d = tmp_path / "tables"
    d.mkdir()
    (d / "nvidia-h200.json").write_text(json.dumps(t))
    monkeypatch.setattr(TB, "tables_dir", lambda: d)
    assert not any(u.startswith("quantize_q8") for u in KC.status("nvidia-h200", path)["unexecuted"])  # passed
    real = MV.q8_defines
    monkeypatch.setattr(MV, "q8_defines", lambda c: {"Q8_WARPS": real(c)["Q8_WARPS"]})
    st = KC.status("nvidia-h200", path)
    assert f"quantize_q8 [{key}] b{b} {e[key][b]['config']}" in st["unexecuted"]


def test_a_receipt_missing_launches_or_red_is_not_current(receipt, tmp_path):
    r, path = receipt
    short = dict(r, launch_set=r["launch_set"][1:])
    p = KC.write_receipt(short, tmp_path / "short.json")
    st = KC.status("nvidia-h200", p)
    assert not st["current"] and st["uncovered"] == r["launch_set"][:1]
    red = KC.write_receipt(dict(r, all_green=False), tmp_path / "red.json")
    assert "not ALL GREEN" in KC.status("nvidia-h200", red)["reason"]
    none = KC.status("nvidia-h200", tmp_path / "absent.json")
    assert none["receipt"] is None and not none["current"] and none["sources_hash"] == r["sources_hash"]


def test_cli_status_json(receipt, monkeypatch):
    from typer.testing import CliRunner

    from memra.cli import app

    r, path = receipt
    res = CliRunner().invoke(app, ["kernel-check", "--status", "--json", "--out", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"device", "receipt", "sources_hash", "current", "stale"} <= set(doc) and doc["current"] is True
    monkeypatch.setattr(KC, "kernel_sources", lambda: {"matvec.cu": "0" * 16})
    res = CliRunner().invoke(app, ["kernel-check", "--status", "--out", str(path)])
    assert res.exit_code == 1 and "NOT current" in res.stdout


def _incremental_base(monkeypatch, drop_families=("matvec", "attention", "norm")):
    """A green base receipt of the emulated device over the tiny llama's launch set, less the
    first case of each family in drop_families; the cases it dropped; the whole set."""
    from memra.tune import tables as TABLES

    EMU.install(monkeypatch)
    monkeypatch.setattr(LS, "MODELS", TINY)
    specs, _ = LS.model_specs(TINY)
    table, source = TABLES.load_table("emulated", (9, 0), sms=132)
    cases = LS.launch_set(specs, [table] if source != "builtin" else [], sms=132)
    dropped = [next(k for k, c in sorted(cases.items()) if c["family"] == f) for f in drop_families]
    fams = {f: {"checks": 5, "launch_cases": 3, "canaries": 1, "failed": 0} for f in KC.FAMILIES}
    report = {"device": "emulated", "stands_for": KC.receipt_device("emulated", 132, table, source),
              "cc": "9.0", "sms": 132, "arch": "sm_90a", "nvrtc": "13.0", "seed": 7,
              "all_green": True, "failures": 0, "families": fams, "models": list(TINY), "models_missing": [],
              "tables": [], "launch_set": sorted(set(cases) - set(dropped))}
    return KC.make_receipt(report), dropped, cases


def test_an_incremental_run_checks_only_the_cases_its_base_lacks(monkeypatch, tmp_path):
    """`kernel-check --add-to`: the launch cases the base receipt lacks, each against its
    reference (here on the emulator), none of the base's, no family checks or canaries (the
    base's stand: same sources); the receipt covers both and is current."""
    base, dropped, cases = _incremental_base(monkeypatch)
    report = {}
    lines = list(KC.run_kernel_check(models=TINY, seed=1, report=report, base=base))
    assert KC.all_green(lines), lines[-5:]
    assert any(ln.startswith(f"incremental: 3 of the {len(cases)} launch cases") for ln in lines)
    launched = [ln for ln in lines if " launch " in ln and ln.startswith(("PASS", "FAIL"))]
    assert len(launched) == 3 and all(ln.startswith("PASS") for ln in launched)
    assert not any(" canary " in ln for ln in lines)
    assert report["launch_set"] == sorted(cases) and report["incremental"]["new_cases"] == 3
    assert report["families"]["matvec"]["checks"] == 6 and report["families"]["matvec"]["canaries"] == 1
    # the base recorded no files: the new cases' alone would understate what the family loads
    assert "files" not in report["families"]["matvec"]
    r = KC.make_receipt(report)
    assert r["incremental"]["base_seed"] == 7
    path = KC.write_receipt(r, tmp_path / "inc.json")
    st = KC.status("emulated", path)
    assert st["uncovered"] == [] and st["stale"] == [] and st["incremental"]["new_cases"] == 3


def test_a_family_the_base_does_not_hold_runs_whole(monkeypatch):
    """A kernel family new since the base receipt (absent from its families): an incremental run
    checks it whole (its own checks, canaries and every case of it), the others' base stands."""
    base, _, cases = _incremental_base(monkeypatch, drop_families=())
    EMU.install(monkeypatch, FakeGpu(GEMM_F16_HEAP))
    fams = {f: v for f, v in base["families"].items() if f != "gemm_f16"}
    mine = {k for k, c in cases.items() if c["family"] == "gemm_f16"}
    base = dict(base, families=fams, launch_set=sorted(set(base["launch_set"]) - mine))
    report = {}
    lines = list(KC.run_kernel_check(models=TINY, seed=1, report=report, base=base))
    assert KC.all_green(lines), lines[-5:]
    assert any(ln.startswith(f"incremental: {len(mine)} of the {len(cases)} launch cases") and
               "families run whole" not in ln for ln in lines)
    assert any(ln.startswith("PASS  gemm_f16 canary") for ln in lines)
    assert not any(" canary " in ln for ln in lines if not ln.startswith("PASS  gemm_f16"))
    assert report["families"]["gemm_f16"]["canaries"] >= 1 and report["families"]["gemm_f16"]["launch_cases"] == len(mine)


def test_an_incremental_run_refuses_a_base_it_cannot_extend(monkeypatch):
    base, _, _ = _incremental_base(monkeypatch)

    def run(b, **kw):
        return list(KC.run_kernel_check(models=TINY, seed=1, base=b, **kw))

    red = run(dict(base, all_green=False))[-1]
    assert red.startswith("FAILED: the base receipt cannot be extended") and "its run was not ALL GREEN" in red
    # another table's receipt, or one of another arch or SM count (the launch set differs)
    assert "this run writes 'nvidia-h200''s" in run(dict(base, slug="nvidia-h100-pcie"))[-1]
    assert "it ran with sms 114, this device has 132" in run(dict(base, sms=114))[-1]
    assert "it ran with arch 'sm_100a'" in run(dict(base, arch="sm_100a"))[-1]
    changed = dict(base, sources={**base["sources"], "matvec.cu": "0" * 16})
    assert ("kernel sources changed since (matvec.cu) and it does not record the kernel files of "
            in run(changed)[-1]) and run(changed)[-1].endswith("a full run is needed")
    assert run(base, only="matvec")[-1].startswith("FAILED: an incremental run")
    # a family whose canaries the base never ran: its new cases cannot stand on it
    no_canary = dict(base, families={**base["families"], "matvec": {"checks": 1, "canaries": 0}})
    lines = run(no_canary)
    assert "FAIL  matvec: the base receipt ran no canary of it (a full run is needed)" in lines
    assert lines[-1].startswith("FAILED")


def test_a_part_on_another_parts_table_writes_that_parts_receipt(monkeypatch, tmp_path):
    """A device that runs, by compute capability, the table frozen on another part with its SM
    count (the emulated sm_90a part with 132 SMs on the H200's table, as an H100 SXM) checks the
    same launch set: its receipt is the H200's (slug), names the part it ran on (device), and can
    extend an H200 receipt; a part with another SM count writes its own, and cannot."""
    from memra.tune import tables as TABLES

    base, dropped, cases = _incremental_base(monkeypatch)
    assert base["slug"] == "nvidia-h200" and base["device"] == "emulated"
    h200 = dict(base, device="NVIDIA H200")   # a receipt the H200 itself wrote
    report = {}
    lines = list(KC.run_kernel_check(models=TINY, seed=1, report=report, base=h200))
    assert KC.all_green(lines), lines[-5:]
    assert any(ln.startswith("receipt: nvidia-h200 (this sm_90a part with 132 SMs runs the table frozen on NVIDIA "
                             "H200") for ln in lines)
    r = KC.make_receipt(report)
    assert (r["slug"], r["device"], r["incremental"]["base_device"]) == ("nvidia-h200", "emulated", "NVIDIA H200")
    assert KC.receipt_path(r["slug"], tmp_path) == tmp_path / "nvidia-h200.json"
    # the table is chosen by the SM count too: a 114-SM part on it writes its own receipt
    table, source = TABLES.load_table("NVIDIA H100 PCIe", (9, 0), sms=114)
    assert source == "cc" and KC.receipt_device("NVIDIA H100 PCIe", 114, table, source) == "NVIDIA H100 PCIe"
    assert KC.receipt_device("NVIDIA H200", 132, table, "exact") == "NVIDIA H200"


def test_an_incremental_run_reruns_whole_the_families_a_changed_source_reaches(monkeypatch, tmp_path):
    """A base that records the kernel files each family loaded (as every run now does), with
    attn_fa.cu changed since: the attn_fa family runs whole (its checks, canaries and every
    launch case of it, the ones the base covered too), the others only the cases the base
    lacks; the receipt covers all of it, records the files, and is current."""
    base, dropped, cases = _incremental_base(monkeypatch)
    files = {f: sorted({c["file"] for c in cases.values() if c["family"] == f}) for f in KC.FAMILIES}
    assert files["attn_fa"] == ["attn_fa.cu"]
    assert not any("attn_fa.cu" in KC.include_closure(v) for f, v in files.items() if f != "attn_fa")
    base = dict(base, families={f: dict(v, files=files[f]) for f, v in base["families"].items()},
                sources={**KC.kernel_sources(), "attn_fa.cu": "0" * 16})
    # the emulator models the wrong variants of attn_fa's unfused canaries, not the fused
    # decode + RoPE one (its kernel model has no MEMRA_CANARY path there): left out here
    from memra.gpu.ops import attn_fa as FA

    canaries = FA.canaries
    monkeypatch.setattr(FA, "canaries", lambda g, rng: (o for o in canaries(g, rng) if "fused" not in o.name))
    report = {}
    lines = list(KC.run_kernel_check(models=TINY, seed=1, report=report, base=base))
    assert KC.all_green(lines), lines[-5:]
    n_fa = sum(c["family"] == "attn_fa" for c in cases.values())
    head = next(ln for ln in lines if ln.startswith("incremental: "))
    assert f"incremental: {n_fa + 3} of the {len(cases)} launch cases to check" in head
    assert "kernel sources changed since it (attn_fa.cu): families run whole: attn_fa;" in head
    launched = [ln for ln in lines if " launch " in ln and ln.startswith("PASS")]
    assert sum(" attn_fa launch " in ln for ln in launched) == n_fa and len(launched) == n_fa + 3
    canaries = [ln for ln in lines if " canary " in ln]
    assert canaries and all(ln.startswith("PASS  attn_fa canary") for ln in canaries)
    inc = report["incremental"]
    assert inc["changed_sources"] == ["attn_fa.cu"] and inc["rechecked_families"] == ["attn_fa"]
    fa = report["families"]["attn_fa"]
    assert fa["canaries"] >= 1 and fa["launch_cases"] == n_fa and "attn_fa.cu" in fa["files"]
    assert report["families"]["matvec"]["files"] == files["matvec"]
    path = KC.write_receipt(KC.make_receipt(report), tmp_path / "inc.json")
    st = KC.status("emulated", path)
    assert st["current"] and st["stale"] == [] and st["uncovered"] == []


def test_a_full_run_records_the_kernel_files_each_family_loads(monkeypatch):
    """What a changed source's families are read from: the files a family's checks, canaries
    and launches loaded, the modules other families' kernels serve included (gemm_tile's glu
    checks compare with act.cu's act_mul)."""
    report = {}
    lines = _emulated_kernel_check(monkeypatch, only="gemm_tile", report=report)
    assert KC.all_green(lines), lines[-3:]
    assert {"gemm_tile.cu", "act.cu"} <= set(report["families"]["gemm_tile"]["files"])
    assert KC.include_closure(["gemm_tile.cu"]) == {"gemm_tile.cu", "common.cuh", "q8.cuh"}


def test_cli_add_to_takes_a_readable_receipt_and_every_family(tmp_path):
    from typer.testing import CliRunner

    from memra.cli import app

    res = CliRunner().invoke(app, ["kernel-check", "--add-to", str(tmp_path / "absent.json")])
    assert res.exit_code != 0 and "--add-to" in res.output and "not a readable receipt" in res.output
    (tmp_path / "r.json").write_text("{}")
    res = CliRunner().invoke(app, ["kernel-check", "--add-to", str(tmp_path / "r.json"), "--only", "matvec"])
    assert res.exit_code != 0 and "no --only or --compile-only" in res.output


def test_committed_kernel_check_receipt_is_current():
    """CI's view of the GPU evidence: the H200 receipt committed in research/kernel-check/
    covers the kernel sources and every launch the engine can make at HEAD (a missing receipt
    fails too: `memra kernel-check --out research/kernel-check/` on the H200 writes it)."""
    st = KC.status(KC.STATUS_DEVICE)
    assert st["current"], f"{st['reason']} (receipt {st['receipt']}, stale {st['stale']}, " \
                          f"{len(st['uncovered'])} launch cases uncovered)"


def test_the_shipped_table_switches_attention_by_shape(monkeypatch):
    """Where the H200 table's attn_decode entry names the attention switch (an engine choice; the 8B shape's does),
    the launch set (what kernel-check covers) holds both modules with their row filters at its keys — the short one
    at the entry's `short` values (default 32-key tiles, CUDA-core body), the long one at the entry's — and where it
    does not, no filter; MEMRA_ATT_SWITCH=0 (the rollback) leaves one module and no filter."""
    from memra.gpu.plan import ATT_SHORT
    from memra.tune.tables import read_table, shape_key, tables_dir

    monkeypatch.delenv("MEMRA_ATT_SWITCH", raising=False)
    table = read_table(tables_dir() / "nvidia-h200.json")

    def switches(model):
        specs, missing = LS.model_specs((model,))
        assert not missing
        return specs[0].cfg, {(c["params"]["switch"], c["file"], c["defines"].get("ATT_TC"),
                               c["defines"].get("ATT_TILE")) for c in
                              LS.launch_set(specs, [table]).values() if c["family"] == "attention"
                              and "switch" in c["params"] and c["params"]["D"] == specs[0].cfg.head_dim
                              and "kv_q8" not in c["params"]}

    named = 0
    for model in ("synth:llama3-8b:Q4_K_M", "synth:llama-1b:Q4_0"):
        cfg, got = switches(model)
        heads = {"n_head": cfg.n_head, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim, "ctx": 64}
        e = table["entries"]["attn_decode"][shape_key(heads)]["1"]["config"]
        if "switch" not in e:
            assert got == set()
            continue
        named += 1
        short = {**e, **e.get("short", ATT_SHORT)}
        mod = (ATT.SHORT_FILE, None, None) if ATT.is_short(short) else \
            (ATT.KERNEL_FILE, short.get("ATT_TC", 1), short["ATT_TILE"])   # attn_short.cu (ATT_KERNEL 1): its own
        first = {(e["switch0"], ATT.SHORT_FILE, None, None)} if "switch0" in e else set()
        assert got == {(e["switch"], *mod), (e["switch"], ATT.KERNEL_FILE, 1, e["ATT_TILE"])} | first
    assert named >= 1
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "0")
    assert switches("synth:llama3-8b:Q4_K_M")[1] == set()


def test_att_switch_launches_check_their_row_filter_on_the_emulator(monkeypatch):
    """With MEMRA_ATT_SWITCH the launch set holds the short and the long attention modules' configurations, each case
    naming the switch, and their checks (the configuration, then attention.cu's row filter) pass on the
    emulator."""
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "48")
    specs, missing = LS.model_specs(("synth:tiny-llama:Q4_K_M",))
    assert not missing
    from memra.tune.tables import read_table, tables_dir

    cases = [c for c in LS.launch_set(specs, [read_table(tables_dir() / "nvidia-h200.json")]).values()
             if c["family"] == "attention" and c["params"].get("switch")]
    assert {(c["defines"]["ATT_TILE"], c["defines"]["ATT_TC"]) for c in cases} >= {(32, 0)} and \
        {c["params"]["switch"] for c in cases} == {48}
    g, rng = FakeGpu(1 << 30), np.random.default_rng(0)
    for c in _one_per_module({k: c for k, c in enumerate(cases)}):
        o = LS.family_module("attention").check_launch(g, rng, c)
        assert o.ok and "row filter" in o.name, (o.name, o.detail)


def test_exported_specs_stand_for_models_that_are_not_here(tmp_path, monkeypatch):
    """`kernel-check --export-specs` writes each real model's config and tensor types; with MEMRA_MODEL_SPECS naming
    that file, a machine without the model files (a models folder empty) builds the same specs, hence the same launch
    set, and kernel-check says which models came from the file; without it they are missing."""
    from memra.model.aliases import ALIASES

    f = tmp_path / "specs.json"
    names = LS.export_specs(f, ("smollm2-135m", "synth:tiny-llama:Q4_K_M"))
    assert names == ["smollm2-135m", "synth:tiny-llama:Q4_K_M"] and "smollm2-135m" in ALIASES
    (here,), missing = LS.model_specs(("smollm2-135m",), fetch=True)
    assert not missing
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path / "home"))           # no model files there
    monkeypatch.delenv(LS.SPECS_ENV, raising=False)
    took = []
    specs, missing = LS.model_specs(("smollm2-135m",), from_specs=took)
    assert not specs and missing and took == []
    monkeypatch.setenv(LS.SPECS_ENV, str(f))
    (spec,), missing = LS.model_specs(("smollm2-135m",), from_specs=took)
    assert not missing and spec == here and took == ["smollm2-135m"]
    assert LS.launch_set([spec]).keys() == LS.launch_set([here]).keys()
    # a synthetic shape that cannot be built here (its tokenizer's vocabulary unreadable) comes from the file too
    from memra.tune import campaign

    (tiny,), _ = LS.model_specs(("synth:tiny-llama:Q4_K_M",))
    monkeypatch.setattr(campaign, "model_info", lambda n: (_ for _ in ()).throw(OSError("offline")))
    took = []
    (spec,), missing = LS.model_specs(("synth:tiny-llama:Q4_K_M",), from_specs=took)
    assert not missing and spec == tiny and took == ["synth:tiny-llama:Q4_K_M"]
    monkeypatch.delenv(LS.SPECS_ENV)
    assert LS.model_specs(("synth:tiny-llama:Q4_K_M",))[1]
    monkeypatch.setenv(LS.SPECS_ENV, str(f))
    f.write_text("not json")
    with pytest.raises(MemraError, match="MEMRA_MODEL_SPECS=.*not a readable spec file"):
        LS.model_specs(("smollm2-135m",))
