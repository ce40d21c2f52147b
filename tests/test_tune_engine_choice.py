"""Engine-choice records (memra.tune.receipts validate_engine_choice): a table entry's configuration chosen by
the engine's own tg128 A/B (experiments/engine_tune) rather than by its launch timed alone. `memra tune
freeze` lays a record over the entry it names when the entry's frozen configuration is the A/B's base and
the kernel source is the one it ran; otherwise the entry keeps the campaign's choice and the freeze says why."""

from __future__ import annotations

import json

from memra.gpu.compile import source_hash
from memra.tune.receipts import append_receipts, check_line
from test_tune_pdl import _frozen_norms, _norm_receipt


def _choice(base: int, chosen: int, **over) -> dict:
    rec = {"schema": 1, "kind": "engine-choice", "device": "NVIDIA H200", "kernel": "rmsnorm",
           "shape_key": "n=4096", "batch": 1, "base_config": {"NORM_THREADS": base},
           "config": {"NORM_THREADS": chosen}, "src": "norm.cu", "src_hash": source_hash("norm.cu"),
           "gain": 0.012, "evidence": ["research/x/bench.jsonl"], "git_sha": "abc1234", "ts": "2026-12-04T12:00:00Z"}
    return {**rec, **over}


def _write(tmp_path, *choices):
    f = tmp_path / "r.jsonl"
    append_receipts(f, [_norm_receipt(4096, 1.0, 256), _norm_receipt(4096, 1.5, 512), _norm_receipt(576, 1.0, 128)])
    with open(tmp_path / "engine-choices.jsonl", "w") as out:
        for c in choices:
            out.write(json.dumps(c) + "\n")
    return tmp_path


def test_a_record_is_checked_like_any_receipt():
    kind, problems = check_line(_choice(256, 512))
    assert kind.name == "engine-choice" and problems == []
    assert any("evidence" in p for p in check_line(_choice(256, 512, evidence=[]))[1])
    assert any("nothing chosen" in p for p in check_line(_choice(256, 256))[1])
    assert any("'gain'" in p for p in check_line({k: v for k, v in _choice(256, 512).items() if k != "gain"})[1])


def test_freeze_lays_a_matching_choice_over_its_entry(tmp_path):
    """The campaign alone picks 256 threads (1.0 against 1.5 µs); the engine's A/B chose 512 over 256: the
    entry says 512, keeps the timing of what ran alone, and names the record; the other entry is untouched."""
    from test_research import memra

    d = _write(tmp_path, _choice(256, 512))
    entries = _frozen_norms(d, tmp_path / "t")
    e = entries["n=4096"]
    assert e["config"] == {"NORM_THREADS": 512} and e["median_us"] == 1.0
    assert e["engine_choice"]["base_config"] == {"NORM_THREADS": 256} and e["engine_choice"]["gain"] == 0.012
    assert e["engine_choice"]["receipt"].endswith("engine-choices.jsonl:1")
    assert entries["n=576"]["config"] == {"NORM_THREADS": 128} and "engine_choice" not in entries["n=576"]
    r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / "u"))
    assert r.returncode == 0 and "engine choice rmsnorm n=4096 batch 1: {'NORM_THREADS': 512}" in r.stderr
    from memra.tune.freeze import summarize_table

    table = json.loads((tmp_path / "u" / "nvidia-h200.json").read_text())
    timing = {row["shape"]: row["timing"] for row in summarize_table(table)}
    assert timing == {"n=4096": "plain, engine +1.2 %", "n=576": "plain"}


def test_a_choice_against_another_base_or_an_older_kernel_is_not_applied(tmp_path):
    from test_research import memra

    for i, (rec, why) in enumerate(((_choice(128, 512), "is not the A/B's base"),
                                    (_choice(256, 512, src_hash="0000000000000000"), "changed since the A/B"),
                                    (_choice(256, 512, shape_key="n=8192"), "no such entry"))):
        d = _write(tmp_path / str(i), rec) if (tmp_path / str(i)).mkdir() is None else None
        assert _frozen_norms(d, tmp_path / f"t{i}")["n=4096"]["config"] == {"NORM_THREADS": 256}
        r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / f"u{i}"))
        assert r.returncode == 0 and "not applied" in r.stderr and why in r.stderr, r.stderr



def test_a_record_names_its_objective_in_the_freeze_note(tmp_path):
    """A choice made on another objective than tg128 at one depth (the 8B's attention on the step time summed
    over two depth cells) says so where freeze reports it; a record without one reads as tg128."""
    from test_research import memra

    d = _write(tmp_path, _choice(256, 512, objective="tg128 step time summed over depth 0 and 4096"))
    r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / "u"))
    assert r.returncode == 0
    assert "(engine tg128 step time summed over depth 0 and 4096 +1.2 % over {'NORM_THREADS': 256})" in r.stderr
    e = json.loads((tmp_path / "u" / "nvidia-h200.json").read_text())["entries"]["rmsnorm"]["n=4096"]["1"]
    assert e["engine_choice"]["objective"] == "tg128 step time summed over depth 0 and 4096"
    (tmp_path / "plain").mkdir()
    d2 = _write(tmp_path / "plain", _choice(256, 512))
    r = memra("tune", "freeze", str(d2), "--out-dir", str(tmp_path / "v"))
    assert r.returncode == 0 and "(engine tg128 +1.2 % over {'NORM_THREADS': 256})" in r.stderr


def test_a_peers_choice_applies_only_to_the_entries_its_receipts_made(tmp_path):
    """Freezing an H100 whose receipts cover n=576 only, the H200's receipts stand in for n=4096 (no --device:
    peers of one compute capability and SM count): the H200's engine choice for n=4096 comes with them; an H100
    entry of its own would not take it (the A/B ran on the H200's entry)."""
    from test_research import memra

    d = _write(tmp_path, _choice(256, 512), _choice(128, 256, shape_key="n=576"))
    h100 = {"device": "NVIDIA H100 80GB HBM3"}
    append_receipts(d / "r.jsonl", [{**_norm_receipt(576, 0.5, 128), **h100}])
    r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / "u"))
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "u" / "nvidia-h100-80gb-hbm3.json").read_text())["entries"]["rmsnorm"]
    assert t["n=4096"]["1"]["config"] == {"NORM_THREADS": 512} and t["n=4096"]["1"]["measured_on"] == "NVIDIA H200"
    assert t["n=576"]["1"]["config"] == {"NORM_THREADS": 128} and "measured_on" not in t["n=576"]["1"]
    assert "engine_choice" not in t["n=576"]["1"]
    assert "it was made on NVIDIA H200, the entry on NVIDIA H100 80GB HBM3" in r.stderr


def test_a_group_applies_all_or_none(tmp_path):
    """Records sharing a `group` (one A/B changed those entries together: its gain belongs to the set) apply only
    when every member can: one member whose base is not its entry's keeps both entries as the campaign froze them,
    and freeze names the member that broke the group; a whole group applies and each entry names it."""
    from test_research import memra

    (tmp_path / "a").mkdir()
    d = _write(tmp_path / "a", _choice(256, 512, group="early"), _choice(64, 256, shape_key="n=576", group="early"))
    entries = _frozen_norms(d, tmp_path / "t")
    assert entries["n=4096"]["config"] == {"NORM_THREADS": 256} and "engine_choice" not in entries["n=4096"]
    assert entries["n=576"]["config"] == {"NORM_THREADS": 128}
    r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / "u"))
    assert r.returncode == 0
    assert ("engine choice rmsnorm n=4096 batch 1: not applied, its group 'early' is not whole (engine choice "
            "rmsnorm n=576 batch 1: the entry's configuration") in r.stderr, r.stderr
    (tmp_path / "b").mkdir()
    d = _write(tmp_path / "b", _choice(256, 512, group="early"), _choice(128, 256, shape_key="n=576", group="early"))
    entries = _frozen_norms(d, tmp_path / "v")
    assert entries["n=4096"]["config"] == {"NORM_THREADS": 512} and entries["n=576"]["config"] == {"NORM_THREADS": 256}
    assert entries["n=576"]["engine_choice"]["group"] == "early"
    assert any("group must be" in p for p in check_line(_choice(256, 512, group=""))[1])
    # a record without a group beside a grouped one (read as NaN from the records' frame) stands alone
    (tmp_path / "c").mkdir()
    d = _write(tmp_path / "c", _choice(256, 512), _choice(128, 256, shape_key="n=576", group="g2"))
    r = memra("tune", "freeze", str(d), "--out-dir", str(tmp_path / "w"))
    assert r.returncode == 0
    assert "n=4096 batch 1: {'NORM_THREADS': 512} (engine tg128 +1.2 % over {'NORM_THREADS': 256})\n" in r.stderr, r.stderr
    assert "n=576 batch 1: {'NORM_THREADS': 256} (engine tg128 +1.2 % over {'NORM_THREADS': 128}, group 'g2')" in r.stderr
