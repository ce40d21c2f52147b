"""experiments/timeline: the decode step's in-graph timeline probe. Its kernel copy builds for sm_90a with the timer
reads in (kernels/ untouched), and its host half (the step, the plan's labels, the replays, the report) runs on the
emulator, where a launch writes its event as the probe would on the device."""
import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpu_emulator import FakeGpu
from memra.gpu.runner import Runner

ROOT = Path(__file__).resolve().parents[1]


def _timeline():
    spec = importlib.util.spec_from_file_location("timeline_probe", ROOT / "experiments" / "timeline" / "timeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_probe_copy_builds_with_the_timer_reads(tmp_path, monkeypatch):
    import memra.gpu.compile as C
    from memra.gpu.compile import compile_cubin

    tl = _timeline()
    before = {p.name: p.read_bytes() for p in (ROOT / "kernels").iterdir() if p.is_file()}
    files = tl.build(tmp_path / "kernels")
    assert {p.name: p.read_bytes() for p in (ROOT / "kernels").iterdir() if p.is_file()} == before
    assert set(files.values()) == {p.name for p in (ROOT / "kernels").glob("*.cu")}
    common = (tmp_path / "kernels" / "common.cuh").read_text()
    assert "%%globaltimer" in common and tl.WAIT_LINE not in common and 'extern "C"' in common
    norm = (tmp_path / "kernels" / "norm.cu").read_text().splitlines()
    assert norm[0].startswith("#define MEMRA_TL_FILE ") and norm[1] == '#line 1 "norm.cu"'
    assert norm[2:] == (ROOT / "kernels" / "norm.cu").read_text().splitlines()   # __LINE__ is the original's
    monkeypatch.setattr(C, "kernel_dir", lambda: tmp_path / "kernels")
    cub = compile_cubin("norm.cu", "sm_90a", {}, use_cache=False)
    assert cub[:4] == b"\x7fELF"
    if shutil.which("nvdisasm"):
        (tmp_path / "norm.cubin").write_bytes(cub)
        sass = subprocess.run(["nvdisasm", "-c", str(tmp_path / "norm.cubin")], capture_output=True, text=True).stdout
        assert "SR_GLOBALTIMER" in sass


def test_analyse_medians_and_the_critical_path():
    tl = _timeline()
    # two replays of three launches: waits return at 1000, 2000, 4000 (+50 in the second's last two); block 0
    # reached each wait 200 ns before it returned
    post = np.array([[1000, 2000, 4000], [11000, 12050, 14050]])
    ev = np.zeros((6, tl.WORDS), np.uint64)
    ev[:, 1] = post.ravel()
    ev[:, 0] = post.ravel() - 200
    ev[:, 2] = [(1 << 20) | 7, (2 << 20) | 9, (1 << 20) | 11] * 2
    a = tl.analyse(ev, 2)
    assert a["events"] == 3
    assert list(a["crit_ns"][:2]) == [1025.0, 2000.0] and np.isnan(a["crit_ns"][2])
    assert np.isnan(a["lag_ns"][0]) and list(a["lag_ns"][1:]) == [825.0, 1800.0]
    assert list(a["wait_ns"]) == [200.0] * 3 and a["span_ns"] == 3025.0 and a["tick_ns"] == 200
    with pytest.raises(ValueError):
        tl.analyse(ev[:5], 2)


class _ProbedGpu(FakeGpu):
    """The emulator with a clock and the probe: while the pointer is set, every kernel that runs appends an event
    (block 0 reaches its wait 300 ns after the previous one returned, the wait returns 200 ns later)."""

    def __init__(self, heap):
        super().__init__(heap)
        self.on, self.events, self.clock = False, [], 0

    def time_ms(self, fn, reps=50, warmup=5):
        fn()
        return np.full(reps, 0.01)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        real = self.record

        def record(op):
            def run():
                op()
                if self.on:
                    self.clock += 500
                    self.events.append((self.clock - 200, self.clock, (3 << 20) | len(kernel.name), 5, kernel.name))
            real(run)

        self.record = record
        try:
            super().launch(kernel, grid, block, args, shmem, pdl)
        finally:
            del self.record

    def install_probe(self, monkeypatch, tl, held: int) -> list:
        """tl's device hooks on this GPU: the pointer turns the probe on (`held` modules), a read takes the
        events; returns the kernel names of the events read, in order."""
        names = []

        def read(buf):
            names.extend(e[4] for e in self.events)
            ev = np.array([e[:4] for e in self.events], np.uint64).reshape(-1, tl.WORDS)
            self.events.clear()
            return ev

        monkeypatch.setattr(tl, "set_pointer", lambda g_, ptr: setattr(g_, "on", bool(ptr)) or held)
        monkeypatch.setattr(tl, "read_events", read)
        monkeypatch.setattr(tl, "reset_events", lambda buf: self.events.clear())
        return names


def test_record_and_report_label_every_launch_of_the_step(tiny_models, monkeypatch):
    tl = _timeline()
    g = _ProbedGpu(1 << 28)
    path = tiny_models("llama", "Q4_K_M")
    r = Runner(path, max_len=96, max_seqs=2, kv_tokens=2 * 96, gpu=g)
    names = g.install_probe(monkeypatch, tl, held=4)
    calls, ev, off_us, on_us, held = tl.record(r, rows=2, depth=12, reps=5, chunk=2)
    assert held == 4 and off_us == on_us == 10.0 and not g.on
    assert len(ev) == 5 * len(calls) and names == [k for _, k in calls] * 5
    plan = r.plan.step(2, decode=True, sampler="greedy", att_kind=r.dec_kind)
    # each plan launch's kernels in a run (the head's argmax is two), the plan's launches in order
    assert [L.name for i, (L, _) in enumerate(calls) if i == 0 or calls[i - 1][0] is not L] == [L.name for L in plan]
    out = tl.report(calls, ev, 5, {3: "matvec.cu"}, {"model": "tiny"}, off_us, on_us, held)
    launches, step = out[:-1], out[-1]
    assert step["labelled"] and step["events"] == len(calls) == len(launches)
    assert all(x["crit_us"] == 0.5 and x["wait_us"] == 0.2 and x["lag_us"] == 0.3 for x in launches[1:-1])
    assert launches[-1]["crit_us"] is None and launches[0]["lag_us"] is None
    assert [x["kernel"] for x in launches] == [k for _, k in calls] and launches[0]["site"].startswith("matvec.cu:")
    assert abs(sum(step["crit_us_by_group"].values()) - 0.5 * (len(calls) - 1)) < 1e-6
    assert step["span_us"] == round(0.5 * (len(calls) - 1), 2)
    assert r.kv.alloc.n_free == r.kv.alloc.n_blocks


def test_the_command_writes_its_json_lines(tiny_models, monkeypatch, tmp_path):
    """timeline.py MODEL ... --out: the whole command on the emulator (the probe's compile and pointer stood in)."""
    import json

    import gpu_emulator as EMU

    import memra.gpu.compile as C

    tl = _timeline()
    monkeypatch.setattr(C, "kernel_dir", C.kernel_dir)   # the command points it at its copy: put back after
    g = EMU.install(monkeypatch, _ProbedGpu(1 << 28))
    monkeypatch.setattr(tl, "prebuild", lambda path, dst, arch: 0)
    g.install_probe(monkeypatch, tl, held=2)
    out = tmp_path / "tl.jsonl"
    tl.main([str(tiny_models("llama", "Q4_K_M")), "-d", "8", "--reps", "4", "--chunk", "2", "--out", str(out)])
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    step = recs[-1]
    assert step["kind"] == "timeline-step" and step["labelled"] and step["rows"] == 1 and step["depth"] == 8
    assert len(recs) == step["events"] + 1 and all(r["kind"] == "timeline-launch" and r["kernel"] for r in recs[:-1])
    assert step["device"] == "emulated" and step["modules_probed"] == 2
    # --summarize: the step by group, each group's alone time from a memra profile line of the same step beside it
    names = [r["name"] for r in recs[:-1]]
    prof = tmp_path / "profile.jsonl"
    prof.write_text(json.dumps({"model": step["model"], "rows": 1, "depth": 8,
                                "launches": [{"name": n, "us": 2.0} for n in dict.fromkeys(names)]}) + "\n")
    lines = tl.summarize(out, prof)
    assert lines[0].startswith(f"{step['model']}: 1 row(s) at depth 8") and "attention" in "\n".join(lines)
    emb = next(line for line in lines if line.split()[0] == "embed").split()
    assert emb[1] == "1" and float(emb[3]) == 2.0   # one launch, its alone time
