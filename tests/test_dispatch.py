"""Dispatch by row count (memra.tune.dispatch): the q8 matvec's three bit-identical paths
timed per shape and bucket, frozen into the table, followed by the planner (CPU only:
synthetic receipts whose winners are known by construction)."""

from __future__ import annotations

import hashlib
import json

import pytest

from memra.gpu.compile import source_hash
from memra.gpu.plan import Planner
from memra.tune import dispatch as D
from memra.tune import freeze as F
from memra.tune import tables as T
from memra.tune.measure import is_builtin
from memra.tune.receipts import make_receipt, read_receipts, shape_key

from test_tune_gemm import llama_like

H200 = dict(device="NVIDIA H200", cc="9.0", sms=132, nvrtc="13.0")
DOWN = {"type": "Q4_K", "rows": 256, "cols": 512}       # llama_like's ffn_down
GATE_UP = {"type": "Q4_K", "rows": 1024, "cols": 256}   # its gate+up pair


def rec(path: str, us: float, batch: int, shape=DOWN, glu=False):
    return make_receipt(kernel=D.kernel_of(glu), variant=path, config={}, shape={**shape, "batch": batch},
                        src=D.SRC, src_hash=T._current_hash(D.SRC), ok=True, median_us=us, p20_us=us,
                        p80_us=us, reps=50, max_err=0.0, git_sha="0" * 40, **H200)


def frozen(tmp_path, rows, min_gain=0.03) -> dict:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = read_receipts([f], kinds=("tune",))
    return F.freeze(df, "NVIDIA H200", current_hashes={D.SRC: T._current_hash(D.SRC)}, builtin=is_builtin,
                    min_gain=min_gain)


def test_the_rule_is_the_planners_constants():
    assert [D.rule(r) for r in (1, 2, 3, 8, 15, 16, 64, 512)] == \
        ["matvec", "matvec", "mvt", "mvt", "mvt", "gemm", "gemm", "gemm"]


def test_a_dispatch_entry_hashes_its_three_kernels():
    parts = "+".join(source_hash(f) for f in ("matvec.cu", "mvt.cu", "gemm.cu"))
    assert T._current_hash(D.SRC) == hashlib.sha256(parts.encode()).hexdigest()[:16]
    assert T._current_hash("matvec.cu+gone.cu") is None  # a kernel file gone: stale


def test_freeze_keeps_the_fastest_path_per_bucket_and_the_rule_within_min_gain(tmp_path):
    rows = [rec("matvec", 10.0, 8), rec("mvt", 6.0, 8), rec("gemm", 5.0, 8),          # gemm by 20 %
            rec("matvec", 30.0, 32), rec("mvt", 12.0, 32), rec("gemm", 12.2, 32),     # mvt by 1.7 %
            rec("matvec", 3.0, 1), rec("mvt", 2.0, 1), rec("gemm", 2.5, 1)]
    e = frozen(tmp_path, rows)["entries"]["dispatch"][shape_key(DOWN)]
    assert e["8"]["variant"] == "gemm" and e["8"]["runner_up"]["variant"] == "mvt"
    assert e["32"]["variant"] == "gemm" and e["32"].get("kept_builtin")   # the rule's path, within 3 %
    assert e["1"]["variant"] == "mvt"
    assert frozen(tmp_path, rows, min_gain=0.0)["entries"]["dispatch"][shape_key(DOWN)]["32"]["variant"] == "mvt"


def _paths(plan: Planner, rows: int) -> dict:
    """{(op, shape key): (op of the launches, their row counts)} of a prefill step's matvecs
    (llama_like's two layers: each launch twice)."""
    out = {}
    for L in plan.step(rows, decode=False):
        if L.op in ("matvec", "mvt", "gemm"):
            k = (L.group, shape_key(L.shape))
            op, rs = out.get(k, (L.op, []))
            out[k] = (L.op, rs + [L.rows])
    return out


def test_the_planner_follows_the_table_and_falls_back_to_the_rule():
    m = llama_like()
    table = {"batch_buckets": list(T.BATCH_BUCKETS), "entries": {
        "dispatch": {shape_key(DOWN): {"8": {"variant": "gemm", "config": {}},
                                       "32": {"variant": "matvec", "config": {}}}},
        "dispatch_glu": {shape_key(GATE_UP): {"8": {"variant": "mvt", "config": {}}}}}}
    plain, tuned = Planner(m, {}), Planner(m, table)
    down = ("down", shape_key(DOWN))
    # 8 rows: the rule's mvt, the table's GEMM; 32 rows: the rule's GEMM, the table's four
    # 8-row mv_q8 launches; other shapes and buckets keep the rule
    assert _paths(plain, 8)[down] == ("mvt", [8] * 2) and _paths(tuned, 8)[down] == ("gemm", [8] * 2)
    assert _paths(plain, 32)[down] == ("gemm", [32] * 2) and _paths(tuned, 32)[down] == ("matvec", [8] * 8)
    assert _paths(tuned, 8)[("gate_up", shape_key(GATE_UP))][0] == "mvt"
    assert {k: v for k, v in _paths(tuned, 8).items() if k[0] not in ("down", "gate_up")} == \
        {k: v for k, v in _paths(plain, 8).items() if k[0] not in ("down", "gate_up")}
    # a path that is off (MEMRA_GEMM=0: the runner's gemm=False) falls back to the rule
    assert _paths(Planner(m, table, gemm=False), 8)[down] == ("mvt", [8] * 2)
    assert _paths(Planner(m, table, gemm=False), 64)[down] == ("matvec", [8] * 16)


def test_dispatch_receipts_name_their_path_and_entries_all_three(tmp_path):
    """A dispatch receipt names its path's kernel file, so a change to gemm.cu leaves the matvec
    and mvt receipts current (--resume keeps them: the same job key and src_hash) and only the
    gemm path is re-timed; the frozen entry names the three files and the hash of their hashes,
    so the table calls it stale when any of them changes."""
    def prec(path, us, batch):
        return {**rec(path, us, batch), "src": D.PATH_SRC[path], "src_hash": T._current_hash(D.PATH_SRC[path])}

    rows = [prec("matvec", 10.0, 8), prec("mvt", 6.0, 8), prec("gemm", 7.0, 8)]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = read_receipts([f], kinds=("tune",))
    hashes = {src: T._current_hash(src) for src in D.PATH_SRC.values()}
    t = F.freeze(df, "NVIDIA H200", current_hashes=hashes, entry_src=D.entry_src(T._current_hash))
    e = t["entries"]["dispatch"][shape_key(DOWN)]["8"]
    assert e["variant"] == "mvt" and e["src"] == D.SRC and e["src_hash"] == T._current_hash(D.SRC)
    assert t["sources"][D.SRC] == T._current_hash(D.SRC)
    assert T.stale_entries(t) == []
    assert T.stale_entries(t, lambda src: "changed" if "gemm.cu" in src else T._current_hash(src))
    # gemm.cu changed: its receipt is no longer current, the other two still compete
    t2 = F.freeze(df, "NVIDIA H200", current_hashes={**hashes, "gemm.cu": "new"},
                  entry_src=D.entry_src(T._current_hash))
    e2 = t2["entries"]["dispatch"][shape_key(DOWN)]["8"]
    assert e2["variant"] == "mvt" and e2["runner_up"]["variant"] == "matvec"
    # and --resume's done keys (memra.tune.campaign) still hold the matvec / mvt jobs
    from memra.tune.campaign import _done_keys
    done = _done_keys(f, "NVIDIA H200")
    jobs = [j for j in D.jobs(["synth:tiny-llama:Q4_K_M"], None, rows=(8,))
            if shape_key(j.shape) == shape_key(DOWN) and j.kernel == "dispatch"]
    assert sorted(j.variant for j in jobs) == ["gemm", "matvec", "mvt"]
    assert all(j.key() + (T._current_hash(j.src),) in done for j in jobs)


def test_dispatch_jobs_time_every_available_path_with_its_table_config():
    m = "synth:tiny-llama:Q4_K_M"
    table = {"batch_buckets": list(T.BATCH_BUCKETS), "entries": {}}
    jobs = D.jobs([m], table, rows=(1, 16))
    assert jobs and {j.kernel for j in jobs} <= set(D.KERNELS)
    assert all(j.src == D.PATH_SRC[j.variant] for j in jobs)  # a path's time depends on its kernel only
    by = {}
    for j in jobs:
        by.setdefault((j.kernel, shape_key(j.shape), j.shape["batch"]), set()).add(j.variant)
    assert all(v == {"matvec", "mvt", "gemm"} for v in by.values())
    p = D.path_job(jobs[0])
    assert p.kernel in ("matvec", "matvec_glu", "mvt", "mvt_glu", "gemm", "gemm_glu") and p.variant == "q8"
    assert p.src == D.PATH_SRC[jobs[0].variant] and p.shape == jobs[0].shape


def test_a_choice_timed_with_a_replaced_path_configuration_is_left_to_the_rule(tmp_path):
    """A dispatch receipt times a path with the configuration the path launched then; after a
    later campaign changes that path's table entry, its receipts time a launch the engine no
    longer makes, so the (shape, row count) has no measured choice until the path is re-timed:
    freeze's second pass leaves it to the rule. A bucket whose paths all carry the current
    configurations keeps its entry, and one re-timed receipt decides it again."""
    old, new = {"MV_NWARPS": 4, "MV_ROWS": 1}, {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_PREFETCH": 1}

    def r(path, us, batch, config):
        return {**rec(path, us, batch), "config": config}

    # the matvec path's own table entries: bucket 1 re-tuned (new), bucket 8 as it was timed (old)
    mv = [make_receipt(kernel="matvec", variant="q8", config=c, shape={**DOWN, "batch": b}, src=D.SRC,
                       src_hash=T._current_hash(D.SRC), ok=True, median_us=us, p20_us=us, p80_us=us, reps=50,
                       max_err=0.0, git_sha="0" * 40, **H200)
          for c, b, us in ((new, 1, 2.0), (old, 1, 3.0), (old, 8, 9.0))]
    rows = mv + [r("matvec", 3.0, 1, old), r("mvt", 5.0, 1, {}), r("gemm", 6.0, 1, {}),
                 r("matvec", 10.0, 8, old), r("mvt", 6.0, 8, {}), r("gemm", 7.0, 8, {})]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in rows))
    df = read_receipts([f], kinds=("tune",))
    kw = dict(current_hashes={D.SRC: T._current_hash(D.SRC)})
    first = F.freeze(df, "NVIDIA H200", **kw)
    assert first["entries"]["matvec"][shape_key(DOWN)]["1"]["config"] == new
    assert first["entries"]["dispatch"][shape_key(DOWN)]["1"]["config"] == old   # timed on the old launch
    keep, left = D.launched_keep(df, first)
    assert left == [("dispatch", shape_key(DOWN), 1)]
    t = F.freeze(df, "NVIDIA H200", keep=keep, **kw)
    e = t["entries"]["dispatch"][shape_key(DOWN)]
    assert set(e) == {"8"} and e["8"]["variant"] == "mvt"            # bucket 1: the rule (matvec)
    assert t["entries"]["matvec"] == first["entries"]["matvec"]       # the paths' own entries unchanged
    # `memra tune dispatch --resume` re-times the matvec path with the new configuration: decided again
    f.write_text(f.read_text() + json.dumps(r("matvec", 2.0, 1, new)) + "\n")
    df = read_receipts([f], kinds=("tune",))
    keep, left = D.launched_keep(df, F.freeze(df, "NVIDIA H200", **kw))
    assert left == []
    e = F.freeze(df, "NVIDIA H200", keep=keep, **kw)["entries"]["dispatch"][shape_key(DOWN)]
    assert e["1"]["variant"] == "matvec" and e["1"]["config"] == new and e["1"]["candidates"] == 3


def test_an_engine_choice_on_a_path_leaves_its_dispatch_choice_to_the_rule(tmp_path):
    """An engine-choice record replaces the matvec entry's configuration (memra.tune.freeze
    apply_engine_choices, before launched_keep as `memra tune freeze` runs them): the bucket's dispatch
    receipts timed the replaced launch, so the bucket is left to the rule like after a re-campaign."""
    old, new = {"MV_NWARPS": 8, "MV_ROWS": 2}, {"MV_NWARPS": 4, "MV_ROWS": 2}
    mv = make_receipt(kernel="matvec", variant="q8", config=old, shape={**DOWN, "batch": 1}, src="matvec.cu",
                      src_hash=T._current_hash("matvec.cu"), ok=True, median_us=2.0, p20_us=2.0, p80_us=2.0,
                      reps=50, max_err=0.0, git_sha="0" * 40, **H200)
    rows = [mv] + [{**rec(p, us, 1), "config": c} for p, us, c in (("matvec", 3.0, old), ("mvt", 5.0, {}),
                                                                  ("gemm", 6.0, {}))]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in rows))
    df = read_receipts([f], kinds=("tune",))
    kw = dict(current_hashes={s: T._current_hash(s) for s in ("matvec.cu", D.SRC)})
    t = F.freeze(df, "NVIDIA H200", **kw)
    assert t["entries"]["dispatch"][shape_key(DOWN)]["1"]["config"] == old
    assert D.launched_keep(df, t)[1] == []
    choice = {"device": "NVIDIA H200", "kernel": "matvec", "shape_key": shape_key(DOWN), "batch": 1,
              "base_config": old, "config": new, "src": "matvec.cu", "src_hash": T._current_hash("matvec.cu"),
              "gain": 0.01, "evidence": ["x.jsonl"], "ts": "2026-12-04T12:00:00Z"}
    (note,) = F.apply_engine_choices(t, [choice], T._current_hash)
    assert "not applied" not in note and t["entries"]["matvec"][shape_key(DOWN)]["1"]["config"] == new
    keep, left = D.launched_keep(df, t)
    assert left == [("dispatch", shape_key(DOWN), 1)]
    assert "dispatch" not in F.freeze(df, "NVIDIA H200", keep=keep, **kw)["entries"]   # the rule: matvec


def test_the_head_is_timed_and_frozen_at_decode_buckets_only(tmp_path):
    """A prefill chunk computes no logits, so the output head is never multiplied over 128 rows:
    no dispatch job times it there, and freeze leaves out an older receipt that did."""
    from memra.gpu.plan import MAX_ROWS
    from memra.tune.measure import reached

    jobs = D.jobs(["synth:tiny-llama:Q4_K_M"], None, rows=(64, 128))
    heads = [j for j in jobs if any(o.endswith(":output") for o in j.ops)]
    assert heads and all(j.shape["batch"] <= MAX_ROWS for j in heads)
    assert any(j.shape["batch"] == 128 for j in jobs)   # the layers' matvecs are timed there
    assert D.launched("output", 64) and not D.launched("output", 128) and D.launched("down", 128)
    head = {"type": "Q6_K", "rows": 4096, "cols": 256}
    rows = [{**rec(p, us, 128, shape=head), "ops": ["m:output"]} for p, us in (("gemm", 5.0), ("mvt", 9.0))]
    rows += [{**rec(p, us, 64, shape=head), "ops": ["m:output"]} for p, us in (("gemm", 5.0), ("mvt", 9.0))]
    rows += [{**rec("gemm", 3.0, 128), "ops": ["m:down"]}]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = read_receipts([f], kinds=("tune",))
    t = F.freeze(df, "NVIDIA H200", current_hashes={D.SRC: T._current_hash(D.SRC)}, keep=reached)
    assert set(t["entries"]["dispatch"][shape_key(head)]) == {"64"}
    assert set(t["entries"]["dispatch"][shape_key(DOWN)]) == {"128"}
    assert set(F.freeze(df, "NVIDIA H200", current_hashes={D.SRC: T._current_hash(D.SRC)})
               ["entries"]["dispatch"][shape_key(head)]) == {"64", "128"}


def test_the_launch_set_leaves_dispatch_entries_to_the_plan():
    from memra.tune.launches import table_cases

    table = {"device": "x", "batch_buckets": list(T.BATCH_BUCKETS), "entries": {
        "dispatch": {shape_key(DOWN): {"8": {"variant": "gemm", "config": {}, "src": D.SRC, "src_hash": "h"}}}}}
    assert list(table_cases(table)) == []


@pytest.mark.parametrize("variant, batch, builtin", [("gemm", 16, True), ("mvt", 16, False), ("mvt", 4, True)])
def test_is_builtin_of_a_dispatch_receipt(variant, batch, builtin):
    row = {"kernel": "dispatch", "variant": variant, "config": {}, "shape": DOWN, "batch": batch, "src": D.SRC}
    assert is_builtin(row) is builtin


@pytest.mark.parametrize("batch", [2, 12, 24])
def test_dispatch_jobs_check_on_the_emulator(batch):
    """Every path of a shape runs its family's tune case at any row count (mv_q8 above 8 rows
    in 8-row launches, as the engine launches it) and passes its check on the emulator."""
    import numpy as np

    from gpu_emulator import FakeGpu
    from memra.tune.measure import family_module

    shape = {"type": "Q4_K", "rows": 96, "cols": 512}
    for glu in (False, True):
        for path in D.PATHS:
            j = D.path_job(type("J", (), dict(kernel=D.kernel_of(glu), variant=path, config={},
                                             shape={**shape, "batch": batch}, ops=(), campaign="", reps=None))())
            g = FakeGpu(1 << 26)
            case = family_module(j.src).tune_case(g, j.kernel, j.variant, {}, dict(j.shape),
                                                  np.random.default_rng(0), 1 << 20)
            ok, _, detail = case.check()
            assert ok, (path, glu, batch, detail)
