"""Receipts schema, campaigns, the runner, freeze and the start-up table lookup (CPU only,
synthetic receipts whose winners are known by construction)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from memra.tune import campaign as C
from memra.tune import freeze as F
from memra.tune import tables as T
from memra.model.config import ModelConfig
from memra.tune.receipts import (SCHEMA, ReceiptError, append_receipts, make_receipt, normalize_cc,
                                 read_receipts)

H200 = dict(device="NVIDIA H200", cc="9.0", sms=132, nvrtc="13.0")
H100 = dict(device="NVIDIA H100 80GB HBM3", cc=(9, 0), sms=132, nvrtc="13.0")
SHAPE = {"type": "Q4_K", "rows": 4096, "cols": 4096}


def rec(us=None, *, kernel="matvec", variant="dp4a", config=None, batch=1, shape=SHAPE,
        src="matvec.cu", src_hash="aaaa", dev=H200, ok=True, error=None, ts=None, **kw):
    timing = dict(median_us=us, p20_us=us * 0.98, p80_us=us * 1.03, reps=100,
                  bytes=9_437_184) if ok else {}
    return make_receipt(kernel=kernel, variant=variant, config=config or {"NWARPS": 4},
                        shape={**shape, "batch": batch}, src=src, src_hash=src_hash, ok=ok,
                        error=error, max_err=0.0 if ok else 0.5, peak_gbps=4500.0,
                        git_sha="0" * 40, ts=ts, **dev, **timing, **kw)


# ---------------------------------------------------------------- receipts


def test_receipt_derives_bandwidth_and_round_trips(tmp_path):
    r = rec(10.0)
    # 9437184 bytes in 10 µs = 943.7 GB/s; of 4500 GB/s = 20.97 %
    assert r["gbps"] == pytest.approx(943.7184)
    assert r["pct_peak"] == pytest.approx(100 * 943.7184 / 4500)
    assert r["schema"] == SCHEMA and r["cc"] == "9.0"
    f = tmp_path / "r.jsonl"
    append_receipts(f, [r, rec(ok=False, error="CompileError: boom", variant="fma")])
    df = read_receipts([f])
    assert list(df["ok"]) == [True, False]
    assert df.loc[0, "shape_key"] == "cols=4096,rows=4096,type=Q4_K"
    assert df.loc[0, "config_key"] == "NWARPS=4" and df.loc[0, "config.NWARPS"] == 4
    assert df.loc[0, "batch"] == 1 and df.loc[1, "line"] == 2
    assert df.loc[1, "error"] == "CompileError: boom" and pd.isna(df.loc[1, "median_us"])


def test_failed_receipt_is_never_timed():
    with pytest.raises(ReceiptError, match="never timed"):
        make_receipt(kernel="k", variant="v", config={}, shape={"n": 1}, src="k.cu",
                     src_hash="h", ok=False, error="wrong", median_us=1.0, p20_us=1.0,
                     p80_us=1.0, reps=3, **H200)
    with pytest.raises(ReceiptError, match="without an error"):
        make_receipt(kernel="k", variant="v", config={}, shape={"n": 1}, src="k.cu",
                     src_hash="h", ok=False, **H200)
    with pytest.raises(ReceiptError, match="without median_us"):
        make_receipt(kernel="k", variant="v", config={}, shape={"n": 1}, src="k.cu",
                     src_hash="h", ok=True, **H200)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(schema=2), "schema 2 is not supported"),
    (lambda r: r.pop("src_hash"), "'src_hash' is missing"),
    (lambda r: r.update(ok="yes"), "'ok' has str"),
    (lambda r: r.update(sms=True), "'sms' has bool"),
    (lambda r: r.update(p20_us=99.0), "timings out of order"),
    (lambda r: r.update(config={"N": [1, 2]}), "config values"),
    (lambda r: r["shape"].update(batch=0), "batch 0"),
])
def test_malformed_line_names_file_and_line(tmp_path, mutate, message):
    good, bad = rec(10.0), rec(11.0)
    mutate(bad)
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ReceiptError, match=rf"r\.jsonl:3: .*{message}"):
        read_receipts(f)


def test_non_json_line_is_reported(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(rec(1.0)) + "\n{not json\n")
    with pytest.raises(ReceiptError, match=r"r\.jsonl:2: not JSON"):
        read_receipts(f)
    with pytest.raises(ReceiptError, match="no such receipts"):
        read_receipts(tmp_path / "missing.jsonl")


def test_append_refuses_invalid_rows(tmp_path):
    r = rec(1.0)
    r["ok"] = 1
    with pytest.raises(ReceiptError):
        append_receipts(tmp_path / "x.jsonl", [r])
    assert not (tmp_path / "x.jsonl").exists()


def test_normalize_cc():
    assert normalize_cc((9, 0)) == normalize_cc("sm_90a") == normalize_cc(90) == "9.0"
    assert normalize_cc("12.0") == normalize_cc("sm_120a") == "12.0"
    with pytest.raises(Exception, match="compute capability"):
        normalize_cc("hopper")


# ---------------------------------------------------------------- freeze


def _write(tmp_path, rows, name="r.jsonl"):
    f = tmp_path / name
    append_receipts(f, rows)
    return f


def test_freeze_picks_fastest_ok_config_with_margin(tmp_path):
    rows = [
        rec(10.0, config={"NWARPS": 2}),
        rec(8.0, config={"NWARPS": 4}),
        rec(9.0, variant="fma", config={"NWARPS": 4}),
        rec(ok=False, error="max_err 0.5 > 1e-3", config={"NWARPS": 8}),  # "faster" but wrong
        # batch 3 runs in the batch-4 graph: it competes in bucket 4
        rec(30.0, config={"NWARPS": 2}, batch=3),
        rec(20.0, config={"NWARPS": 4}, batch=4),
        # another device's receipts never count
        rec(1.0, config={"NWARPS": 2}, dev=H100),
    ]
    df = read_receipts(_write(tmp_path, rows))
    table = F.freeze(df, "NVIDIA H200")
    e1 = table["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["1"]
    assert (e1["variant"], e1["config"], e1["median_us"]) == ("dp4a", {"NWARPS": 4}, 8.0)
    assert e1["margin"] == pytest.approx(9.0 / 8.0 - 1)
    assert e1["runner_up"] == {"variant": "fma", "config": {"NWARPS": 4}, "median_us": 9.0}
    assert (e1["candidates"], e1["failed"], e1["src_hash"]) == (3, 1, "aaaa")
    assert e1["receipt"].endswith("r.jsonl:2")
    e4 = table["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["4"]
    assert (e4["config"], e4["margin"]) == ({"NWARPS": 4}, pytest.approx(0.5))
    assert table["device"] == "NVIDIA H200" and table["cc"] == "9.0" and table["sms"] == 132
    assert table["sources"] == {"matvec.cu": "aaaa"}
    assert table["receipts"] == [str((tmp_path / "r.jsonl").resolve())]


@pytest.mark.parametrize("fast, min_gain, kept", [(9.9, 0.03, True), (9.0, 0.03, False), (9.9, 0.0, False)])
def test_freeze_keeps_builtin_unless_beaten_by_min_gain(tmp_path, fast, min_gain, kept):
    """The built-in configuration (NWARPS 4 here) stays unless the fastest one leads it by
    at least min_gain: 9.9 vs 10.0 is a 1 % lead, 9.0 vs 10.0 an 11 % one."""
    df = read_receipts(_write(tmp_path, [rec(fast, config={"NWARPS": 2}), rec(10.0, config={"NWARPS": 4}),
                                         rec(12.0, config={"NWARPS": 8})]))
    builtin = lambda row: row["config"] == {"NWARPS": 4}  # noqa: E731
    e = F.freeze(df, "NVIDIA H200", builtin=builtin, min_gain=min_gain)["entries"]["matvec"][
        "cols=4096,rows=4096,type=Q4_K"]["1"]
    if kept:
        assert (e["config"], e["median_us"], e.get("kept_builtin")) == ({"NWARPS": 4}, 10.0, True)
        assert e["runner_up"]["config"] == {"NWARPS": 2} and e["margin"] == pytest.approx(fast / 10.0 - 1)
    else:
        assert (e["config"], e["median_us"], e.get("kept_builtin")) == ({"NWARPS": 2}, fast, None)


def test_matvec_is_builtin_follows_the_launcher_default():
    from memra.gpu.ops import matvec as MV

    shape = {"type": "Q4_0", "rows": 2048, "cols": 2048, "batch": 1}
    d = MV.default_config(2, "q8", 2048, 2048, 1)
    grid_axes = {k: d[k] for k in ("MV_NWARPS", "MV_ROWS", "MV_UNROLL")}
    assert MV.is_builtin("matvec", "q8", grid_axes, shape)
    assert not MV.is_builtin("matvec", "q8", {**grid_axes, "MV_ROWS": 2 * d["MV_ROWS"]}, shape)
    # matvec_glu rows stack gate and up: the default is that of N = rows / 2
    g = MV.default_config(2, "q8", 8192, 2048, 1, True)
    assert MV.is_builtin("matvec_glu", "q8", {"MV_ROWS": g["MV_ROWS"], "MV_UNROLL": g["MV_UNROLL"]},
                         {"type": "Q4_0", "rows": 16384, "cols": 2048, "batch": 1})


def test_freeze_single_candidate_and_all_failed(tmp_path):
    other = {"type": "Q8_0", "rows": 576, "cols": 576}
    df = read_receipts(_write(tmp_path, [
        rec(5.0), rec(ok=False, error="CompileError: x", shape=other),
    ]))
    table = F.freeze(df, "NVIDIA H200")
    e = table["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["1"]
    assert e["margin"] is None and e["runner_up"] is None and e["candidates"] == 1
    assert "cols=576,rows=576,type=Q8_0" not in table["entries"]["matvec"]
    assert table["no_winner"] == [{"kernel": "matvec", "shape": "cols=576,rows=576,type=Q8_0",
                                   "batch": 1, "failed": 1}]


def test_freeze_repeated_measurements_score_by_median(tmp_path):
    # NWARPS=2 once lucky (7.0) but its median of three is 10; NWARPS=4 steady at 9
    df = read_receipts(_write(tmp_path, [
        rec(7.0, config={"NWARPS": 2}), rec(10.0, config={"NWARPS": 2}), rec(12.0, config={"NWARPS": 2}),
        rec(9.0, config={"NWARPS": 4}),
    ]))
    e = F.freeze(df, "NVIDIA H200")["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["1"]
    assert e["config"] == {"NWARPS": 4} and e["runner_up"]["median_us"] == 10.0


def test_freeze_uses_only_current_source(tmp_path):
    df = read_receipts(_write(tmp_path, [
        rec(1.0, config={"NWARPS": 2}, src_hash="old", ts="2026-01-01T00:00:00Z"),
        rec(9.0, config={"NWARPS": 4}, src_hash="new", ts="2026-02-01T00:00:00Z"),
        rec(10.0, config={"NWARPS": 8}, src_hash="new", ts="2026-02-01T00:00:01Z"),
    ]))
    # without hashes: the latest measured source is current
    e = F.freeze(df, "NVIDIA H200")["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["1"]
    assert (e["config"], e["src_hash"], e["candidates"]) == ({"NWARPS": 4}, "new", 2)
    # with the hashes of the files on disk
    e = F.freeze(df, "NVIDIA H200", current_hashes={"matvec.cu": "old"})["entries"]["matvec"][
        "cols=4096,rows=4096,type=Q4_K"]["1"]
    assert (e["config"], e["src_hash"]) == ({"NWARPS": 2}, "old")


def test_freeze_stand_in_fills_only_what_the_device_lacks(tmp_path):
    """--stand-in: an H100's receipts (same cc, same SM count) fill the H200 entries the H200 has no
    current receipts of its own for, and say so; where the H200 has its own, the H100's never count
    (here the H100 times NWARPS 2 faster at batch 1, which must not win)."""
    other = {"type": "Q8_0", "rows": 576, "cols": 576}
    df = read_receipts(_write(tmp_path, [
        rec(9.0, config={"NWARPS": 4}), rec(10.0, config={"NWARPS": 2}),
        rec(1.0, config={"NWARPS": 2}, dev=H100),
        rec(3.0, config={"NWARPS": 8}, dev=H100, shape=other), rec(4.0, config={"NWARPS": 4}, dev=H100, shape=other),
        rec(2.0, config={"NWARPS": 8}, dev=H100, batch=64),
        rec(5.0, config={"NWARPS": 8}, dev=H100, batch=64, src_hash="old", ts="2020-01-01T00:00:00Z"),
    ]))
    alone = F.freeze(df, "NVIDIA H200")
    assert list(alone["entries"]["matvec"]) == ["cols=4096,rows=4096,type=Q4_K"]
    assert list(alone["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]) == ["1"]
    t = F.freeze(df, "NVIDIA H200", stand_ins=[H100["device"]], current_hashes={"matvec.cu": "aaaa"})
    by = t["entries"]["matvec"]
    own = by["cols=4096,rows=4096,type=Q4_K"]["1"]
    assert (own["config"], own["candidates"], "measured_on" in own) == ({"NWARPS": 4}, 2, False)
    filled = by["cols=576,rows=576,type=Q8_0"]["1"]
    assert (filled["config"], filled["measured_on"], filled["candidates"]) == ({"NWARPS": 8}, H100["device"], 2)
    b64 = by["cols=4096,rows=4096,type=Q4_K"]["64"]
    assert (b64["config"], b64["median_us"], b64["measured_on"]) == ({"NWARPS": 8}, 2.0, H100["device"])
    assert t["device"] == "NVIDIA H200"
    # a part unlike the device (another SM count) cannot stand in; nor one without receipts
    df2 = read_receipts(_write(tmp_path, [rec(9.0), rec(1.0, dev={**H100, "device": "H100 PCIe", "sms": 114})],
                               name="r2.jsonl"))
    with pytest.raises(Exception, match="'H100 PCIe': not a part like 'NVIDIA H200'.*114"):
        F.freeze(df2, "NVIDIA H200", stand_ins=["H100 PCIe"])
    with pytest.raises(Exception, match="'RTX 5090': no receipts"):
        F.freeze(df2, "NVIDIA H200", stand_ins=["RTX 5090"])


def test_freeze_unknown_device(tmp_path):
    df = read_receipts(_write(tmp_path, [rec(1.0)]))
    with pytest.raises(Exception, match="no receipts for device 'RTX 5090'.*NVIDIA H200"):
        F.freeze(df, "RTX 5090")


def test_table_file_name_and_round_trip(tmp_path):
    df = read_receipts(_write(tmp_path, [rec(2.0)]))
    path = F.write_table(F.freeze(df, "NVIDIA H200"), tmp_path / "defaults")
    assert path.name == "nvidia-h200.json" and "h200" in path.name
    t = T.read_table(path)
    assert T.lookup(t, "matvec", SHAPE, 1) == T.Choice("dp4a", {"NWARPS": 4})


# ---------------------------------------------------------------- lookup and fallback


def _table(device="NVIDIA H200", cc="9.0", sms=132, entries=None, src_hash="aaaa"):
    e = entries or {"matvec": {"cols=4096,rows=4096,type=Q4_K": {
        "1": {"variant": "dp4a", "config": {"NWARPS": 4}, "src": "matvec.cu", "src_hash": src_hash},
        "8": {"variant": "fma", "config": {"NWARPS": 8}, "src": "matvec.cu", "src_hash": src_hash}}}}
    return {"format": T.TABLE_FORMAT, "device": device, "cc": cc, "sms": sms,
            "batch_buckets": list(T.BATCH_BUCKETS), "entries": e}


def test_batch_bucket():
    assert [T.batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 64, 100, 300, 600)] == [1, 2, 4, 4, 8, 8, 16, 64, 128, 512, 512]
    with pytest.raises(Exception):
        T.batch_bucket(0)


def test_lookup_by_shape_and_bucket():
    t = _table()
    assert T.lookup(t, "matvec", {**SHAPE, "batch": 1}) == ("dp4a", {"NWARPS": 4})
    assert T.lookup(t, "matvec", SHAPE, 5) == ("fma", {"NWARPS": 8})  # batch 5 → bucket 8
    assert T.lookup(t, "matvec", SHAPE, 8).variant == "fma"
    assert T.lookup(t, "matvec", SHAPE, 2) is None  # bucket 2 never measured: launcher default
    assert T.lookup(t, "matvec", {**SHAPE, "rows": 1024}, 1) is None
    assert T.lookup(t, "attention", SHAPE, 1) is None
    assert T.lookup(T.builtin_table(), "matvec", SHAPE, 1) is None


def _save(d, table):
    d.mkdir(exist_ok=True)
    (d / f"{T.device_slug(table['device'])}.json").write_text(json.dumps(table))


def _hash_ok(src):
    return "aaaa"


def test_fallback_chain_exact_cc_builtin(tmp_path, caplog):
    d = tmp_path / "defaults"
    _save(d, _table("NVIDIA H200", "9.0", 132))
    _save(d, _table("NVIDIA H100 PCIe", "9.0", 114, src_hash="aaaa"))
    _save(d, _table("NVIDIA GeForce RTX 5090", "12.0", 170))
    caplog.set_level("INFO", logger="memra.tuning")

    t, src = T.load_table("NVIDIA H200", (9, 0), directory=d, current_hash=_hash_ok)
    assert (src, t["device"]) == ("exact", "NVIDIA H200")
    # an sm_90 part with no table of its own takes the same-cc table nearest in SM count
    t, src = T.load_table("NVIDIA H100 SXM5 80GB", "9.0", sms=132, directory=d, current_hash=_hash_ok)
    assert (src, t["device"]) == ("cc", "NVIDIA H200")
    t, src = T.load_table("NVIDIA H100 NVL", "9.0", sms=114, directory=d, current_hash=_hash_ok)
    assert (src, t["device"]) == ("cc", "NVIDIA H100 PCIe")
    t, src = T.load_table("NVIDIA L4", "8.9", directory=d, current_hash=_hash_ok)
    assert src == "builtin" and t["entries"] == {} and t["stale"] == []
    assert T.lookup(t, "matvec", SHAPE, 1) is None
    assert "built-in defaults" in caplog.text and "exact table" in caplog.text


def test_changing_an_entry_changes_the_lookup(tmp_path):
    d = tmp_path / "defaults"
    table = _table()
    _save(d, table)
    t, _ = T.load_table("NVIDIA H200", "9.0", directory=d, current_hash=_hash_ok)
    assert T.lookup(t, "matvec", SHAPE, 1).config == {"NWARPS": 4}
    table["entries"]["matvec"]["cols=4096,rows=4096,type=Q4_K"]["1"]["config"] = {"NWARPS": 2}
    _save(d, table)
    t, _ = T.load_table("NVIDIA H200", "9.0", directory=d, current_hash=_hash_ok)
    assert T.lookup(t, "matvec", SHAPE, 1).config == {"NWARPS": 2}


def test_resolve_table_for_ab_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMRA_TUNE_TABLE", raising=False)   # None means the variable, else auto
    d = tmp_path / "defaults"
    _save(d, _table())
    t, src = T.resolve_table(None, "NVIDIA H200", "9.0", directory=d, current_hash=_hash_ok)
    assert src == "exact" and T.lookup(t, "matvec", SHAPE, 1) is not None
    t, src = T.resolve_table("builtin", "NVIDIA H200", "9.0", directory=d, current_hash=_hash_ok)
    assert src == "builtin" and T.lookup(t, "matvec", SHAPE, 1) is None
    # an explicit file is used whatever the device (e.g. an H100 table tried on the H200)
    t, src = T.resolve_table(str(d / "nvidia-h200.json"), "NVIDIA L4", "8.9", current_hash=lambda s: "x")
    assert src == "file" and T.lookup(t, "matvec", SHAPE, 8).variant == "fma" and len(t["stale"]) == 2
    with pytest.raises(T.TableError, match="cannot read"):
        T.resolve_table(str(d / "missing.json"), "NVIDIA H200", "9.0")


def test_bench_table_default_is_the_env_then_auto(tmp_path, monkeypatch):
    """`memra bench` / `memra profile` without --tune-table take $MEMRA_TUNE_TABLE as the engine does, both
    through resolve_table (session 30: an A/B whose arm set only the variable silently ran the shipped
    table); the flag still overrides it."""
    from types import SimpleNamespace

    from memra.cli.bench import _open_table

    d = tmp_path / "defaults"
    _save(d, _table())
    info = SimpleNamespace(name="NVIDIA L4", cc="8.9", sm_count=58)   # no table of this device anywhere
    monkeypatch.setenv("MEMRA_TUNE_TABLE", str(d / "nvidia-h200.json"))
    t, label = _open_table(None, info)
    assert label == f"file:{t['path']}" and T.lookup(t, "matvec", SHAPE, 1) is not None
    t, label = _open_table("builtin", info)
    assert label == "builtin"
    monkeypatch.setenv("MEMRA_TUNE_TABLE", str(d / "missing.json"))
    with pytest.raises(T.TableError, match="cannot read"):
        _open_table(None, info)


def test_staleness_detected_and_warned(tmp_path, caplog):
    d = tmp_path / "defaults"
    entries = {
        "matvec": {"cols=4096,rows=4096,type=Q4_K": {
            "1": {"variant": "dp4a", "config": {}, "src": "matvec.cu", "src_hash": "aaaa"}}},
        "attention": {"ctx=512,head_dim=64,n_head=9,n_head_kv=3": {
            "1": {"variant": "split", "config": {}, "src": "attention.cu", "src_hash": "bbbb"}}},
        "gone": {"n=576": {"1": {"variant": "x", "config": {}, "src": "gone.cu", "src_hash": "cccc"}}},
    }
    _save(d, _table(entries=entries))
    now = {"matvec.cu": "aaaa", "attention.cu": "b2b2", "gone.cu": None}.get
    caplog.set_level("INFO", logger="memra.tuning")
    t, _ = T.load_table("NVIDIA H200", "9.0", directory=d, current_hash=now)
    assert [(s["kernel"], s["table_hash"], s["current_hash"]) for s in t["stale"]] == [
        ("attention", "bbbb", "b2b2"), ("gone", "cccc", None)]
    assert "2 entries" in caplog.text and "changed" in caplog.text
    # stale entries are still used (they passed their check); the warning asks for a re-tune
    assert T.lookup(t, "attention", "ctx=512,head_dim=64,n_head=9,n_head_kv=3", 1).variant == "split"


def test_show_without_gpu_lists_every_table(tmp_path):
    d = tmp_path / "defaults"
    _save(d, _table("NVIDIA H200"))
    _save(d, _table("NVIDIA GeForce RTX 5090", "12.0", 170, src_hash="old"))
    out = F.show(None, directory=d, current_hash=_hash_ok)
    assert out["gpu"] is None and [t["device"] for t in out["tables"]] == [
        "NVIDIA GeForce RTX 5090", "NVIDIA H200"]
    assert {s["table"].endswith("nvidia-geforce-rtx-5090.json") for s in out["stale"]} == {True}
    assert len(out["stale"]) == 2
    json.dumps(out)  # what --json prints
    here = F.show({"name": "NVIDIA H200", "cc": "9.0", "sms": 132}, directory=d, current_hash=_hash_ok)
    assert here["source"] == "exact" and here["stale"] == [] and len(here["tables"]) == 1


def test_corrupt_table_is_a_clear_error(tmp_path):
    d = tmp_path / "defaults"
    d.mkdir()
    (d / "x.json").write_text("{\"format\": 1, \"device\": \"X\"}")
    with pytest.raises(T.TableError, match=r"x\.json: field 'cc' is missing"):
        T.load_table("X", "9.0", directory=d)
    (d / "x.json").write_text("[1, 2")
    with pytest.raises(T.TableError, match="not a JSON table"):
        T.list_tables(d)


def test_device_slug():
    assert T.device_slug("NVIDIA H200") == "nvidia-h200"
    assert T.device_slug("NVIDIA GeForce RTX 5090") == "nvidia-geforce-rtx-5090"


# ---------------------------------------------------------------- campaigns


def llama_like(n_layer=2, types=None) -> C.ModelSpec:
    cfg = ModelConfig(arch="llama", n_vocab=1000, n_ctx_train=4096, n_embd=256, n_layer=n_layer,
                      n_head=8, n_head_kv=2, head_dim=32, head_dim_v=32, n_ff=512, norm_eps=1e-5,
                      rope_base=1e4, rope_dim=32, rope_neox=False)
    t = {"output.weight": "Q6_K", "token_embd.weight": "Q4_K"}
    for i in range(n_layer):
        for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            t[f"blk.{i}.{n}.weight"] = "Q4_K"
    t.update(types or {})
    return C.ModelSpec("tiny", cfg, t)


def test_model_shapes_fuse_same_type_and_split_mixed():
    # layer 1's attn_v is Q6_K (as llama.cpp's Q4_K_M does on some layers): its QKV cannot fuse
    m = llama_like(types={"blk.1.attn_v.weight": "Q6_K", "blk.1.ffn_down.weight": "Q6_K"})
    from memra.tune.receipts import shape_key as sk
    got = sorted((op, sk(s)) for op, s in C.model_shapes(m, ctx=[128]))
    assert got == sorted([
        ("qkv", "cols=256,rows=384,type=Q4_K"),   # 256 + 2*64 fused
        ("qkv", "cols=256,rows=320,type=Q4_K"),   # layer 1: q and k fused (as the engine does)
        ("qkv", "cols=256,rows=64,type=Q6_K"),    # layer 1: v alone
        ("attn_output", "cols=256,rows=256,type=Q4_K"),
        ("gate_up", "cols=256,rows=1024,type=Q4_K"),
        ("down", "cols=512,rows=256,type=Q4_K"),
        ("down", "cols=512,rows=256,type=Q6_K"),
        ("output", "cols=256,rows=1000,type=Q6_K"),
        ("attention", "ctx=128,head_dim=32,n_head=8,n_head_kv=2"),
        ("heads", "head_dim=32,n_head=8,n_head_kv=2"),
        ("rows", "n=256"),
        ("ffn", "n=512"),
        ("embed", "n=256,type=Q4_K"),
        ("vocab", "n=1000"),
    ])


def test_model_shapes_smollm2_from_gguf():
    # SmolLM2-135M: n_embd 576, 9 heads / 3 KV heads of 64, n_ff 1536, vocab 49152, all
    # matrices Q4_1, tied output through the Q8_0 token embedding (read off the GGUF header)
    m = C.model_info("smollm2-135m")
    from memra.tune.receipts import shape_key as sk
    mv = sorted((op, sk(s)) for op, s in C.model_shapes(m, ctx=[512]) if op in C.MATVEC_OPS)
    assert mv == sorted([
        ("qkv", "cols=576,rows=960,type=Q4_1"),
        ("attn_output", "cols=576,rows=576,type=Q4_1"),
        ("gate_up", "cols=576,rows=3072,type=Q4_1"),
        ("down", "cols=1536,rows=576,type=Q4_1"),
        ("output", "cols=576,rows=49152,type=Q8_0"),
    ])


def test_model_shapes_gemma3_sliding_window_attention():
    m = C.model_info("gemma3-270m")
    att = sorted(s["ctx"] for op, s in C.model_shapes(m, ctx=[256, 4096]) if op == "attention")
    # 512-token window on local layers: ctx 4096 gives a 512 span there and 4096 on global ones
    assert att == [256, 512, 4096]


CAMPAIGN = """
name = "demo"
batches = [1, 4]
ctx = [128]

[[kernels]]
name = "matvec"
variants = ["dp4a", "fma"]
ops = ["qkv", "down"]
types = ["Q4_K"]
[kernels.grid]
NWARPS = [2, 4]
ROWS = [1]

[[kernels]]
name = "rmsnorm"
src = "norm.cu"
variants = ["plain"]
shapes = [{n = 4096}, {n = 576, batch = 2}]
"""


def test_expand_campaign(tmp_path):
    p = tmp_path / "demo.toml"
    p.write_text(CAMPAIGN)
    spec = C.load_campaign(p)
    jobs = C.expand_campaign(spec, [llama_like()])
    mv = [j for j in jobs if j.kernel == "matvec"]
    # 2 shapes (fused qkv, down) × 2 batches × 2 variants × 2 configs
    assert len(mv) == 16 and {j.src for j in mv} == {"matvec.cu"}
    assert {(j.shape["rows"], j.shape["cols"]) for j in mv} == {(384, 256), (256, 512)}
    assert {j.shape["batch"] for j in mv} == {1, 4}
    assert {C.config_key(j.config) for j in mv} == {"NWARPS=2,ROWS=1", "NWARPS=4,ROWS=1"}
    assert mv[0].ops in (("tiny:qkv",), ("tiny:down",)) and mv[0].campaign == "demo"
    norm = [j for j in jobs if j.kernel == "rmsnorm"]
    assert sorted((j.shape["n"], j.shape["batch"]) for j in norm) == [(576, 2), (4096, 1), (4096, 4)]
    assert {j.src for j in norm} == {"norm.cu"} and norm[0].config == {}
    assert len({j.key() for j in jobs}) == len(jobs)
    assert [j.kernel for j in C.expand_campaign(spec, [llama_like()], kernels=["rmsnorm"])] == ["rmsnorm"] * 3


def test_expand_merges_shapes_shared_by_models():
    a, b = llama_like(), llama_like()
    b = C.ModelSpec("other", b.cfg, b.types)
    spec = {"name": "x", "batches": [1], "kernels": [
        {"name": "matvec", "variants": ["v"], "ops": ["qkv"]}]}
    jobs = C.expand_campaign(spec, [a, b])
    assert len(jobs) == 1 and jobs[0].ops == ("tiny:qkv", "other:qkv")


@pytest.mark.parametrize("text, message", [
    ("[[kernels]]\nname='m'\nvariants=['a']\nops=['qkv']\nbogus=1", "unknown keys \\['bogus'\\]"),
    ("[[kernels]]\nname='m'\nvariants=[]\nops=['qkv']", "'variants'"),
    ("[[kernels]]\nname='m'\nvariants=['a']\nops=['mlp']", "unknown ops"),
    ("[[kernels]]\nname='m'\nvariants=['a']", "give 'shapes', or 'ops'"),
    ("batches=[0]\n[[kernels]]\nname='m'\nvariants=['a']\nops=['qkv']", "batches"),
    ("[[kernels]\n", "not valid TOML"),
    ("name='x'", "no \\[\\[kernels\\]\\]"),
])
def test_bad_campaign_specs(tmp_path, text, message):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(C.CampaignError, match=message):
        C.load_campaign(p)


def test_model_ops_need_a_model():
    spec = {"name": "x", "kernels": [{"name": "matvec", "variants": ["v"], "ops": ["qkv"]}]}
    with pytest.raises(C.CampaignError, match="pass --model"):
        C.expand_campaign(spec)


def test_committed_campaigns_expand(monkeypatch):
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parent.parent / "tune" / "campaigns").glob("*.toml"))
    assert files, "no campaign committed under tune/campaigns"
    m = C.model_info("smollm2-135m")
    # the prompt GEMMs' campaigns (h200-gemm-f16, h200-gemm-tile*) have no job on SmolLM2 (no weight
    # the tile or gemm_f16 takes): the 1B synthetic model's shapes are their jobs, the tile's under
    # MEMRA_PROMPT_GEMM=tile (under the default, f16, gemm_f16 takes every one of them); qf's (h200-qf) none on
    # either (no Q4_K or Q6_K layer weight): the 8B Q4_K_M's are its jobs
    big = C.model_info("synth:llama-1b:Q4_0")
    k_quants = C.model_info("synth:llama3-8b:Q4_K_M")
    for f in files:
        spec = C.load_campaign(f)
        if "gemm-tile" in f.name:
            monkeypatch.setenv("MEMRA_PROMPT_GEMM", "tile")
        else:
            monkeypatch.delenv("MEMRA_PROMPT_GEMM", raising=False)
        prompt = "gemm-tile" in f.name or "gemm-f16" in f.name
        other = [k_quants] if "-qf" in f.name else [big] if prompt else []
        assert C.expand_campaign(spec, [m]) or (other and C.expand_campaign(spec, other)), f


# ---------------------------------------------------------------- runner


class FakeMeasure:
    """Times by formula; config NWARPS=8 fails its check, NWARPS=16 fails to compile."""

    def __init__(self):
        self.calls = []

    def __call__(self, job):
        from memra.errors import CompileError

        self.calls.append(job.key())
        w = job.config.get("NWARPS", 1)
        if w == 16:
            raise CompileError(job.src, ["-DNWARPS=16"], "too many resources requested")
        if w == 8:
            return {"ok": False, "max_err": 0.25, "error": "max_err 0.25 > tolerance 1e-3",
                    "median_us": 1.0}  # a timing a buggy measure returned anyway: dropped
        us = 10.0 / w
        return {"ok": True, "max_err": 1e-6, "median_us": us, "p20_us": us, "p80_us": us * 1.1,
                "reps": 50, "bytes": 1_000_000}


def _jobs():
    spec = {"name": "t", "batches": [1], "kernels": [{
        "name": "matvec", "variants": ["v"], "grid": {"NWARPS": [2, 4, 8, 16]},
        "shapes": [{"type": "Q4_K", "rows": 64, "cols": 256}]}]}
    return C.expand_campaign(spec)


def test_run_campaign_records_failures_untimed(tmp_path):
    out = tmp_path / "tune" / "r.jsonl"
    seen = []
    counts = C.run_campaign(_jobs(), FakeMeasure(), out, context={**H200, "peak_gbps": 4000.0},
                            src_hash=lambda s: "h1", progress=lambda i, n, j, r: seen.append((i, n, r is None)))
    assert counts == {"measured": 2, "failed": 2, "skipped": 0}
    assert seen == [(1, 4, False), (2, 4, False), (3, 4, False), (4, 4, False)]
    df = read_receipts(out)
    by = {r["config.NWARPS"]: r for _, r in df.iterrows()}
    assert by[4]["ok"] and by[4]["median_us"] == 2.5 and by[4]["gbps"] == pytest.approx(400.0)
    assert by[4]["pct_peak"] == pytest.approx(10.0) and by[4]["src_hash"] == "h1"
    assert not by[8]["ok"] and pd.isna(by[8]["median_us"]) and by[8]["max_err"] == 0.25
    assert "max_err 0.25" in by[8]["error"]
    assert not by[16]["ok"] and by[16]["error"].startswith("CompileError: NVRTC failed")
    # freeze over the runner's receipts: NWARPS=4 (2.5 µs) beats NWARPS=2 (5 µs) by 100 %
    e = F.freeze(df, "NVIDIA H200")["entries"]["matvec"]["cols=256,rows=64,type=Q4_K"]["1"]
    assert e["config"] == {"NWARPS": 4} and e["margin"] == pytest.approx(1.0) and e["failed"] == 2


def test_resume_skips_same_device_and_source(tmp_path):
    out = tmp_path / "r.jsonl"
    jobs = _jobs()
    C.run_campaign(jobs[:2], FakeMeasure(), out, context=H200, src_hash=lambda s: "h1")
    m = FakeMeasure()
    counts = C.run_campaign(jobs, m, out, context=H200, src_hash=lambda s: "h1", resume=True)
    assert counts == {"measured": 0, "failed": 2, "skipped": 2} and len(m.calls) == 2
    # a failed job is not re-run either
    m = FakeMeasure()
    assert C.run_campaign(jobs, m, out, context=H200, src_hash=lambda s: "h1", resume=True)[
        "skipped"] == 4 and m.calls == []
    # changed kernel source, or another device: everything runs again
    m = FakeMeasure()
    C.run_campaign(jobs, m, out, context=H200, src_hash=lambda s: "h2", resume=True)
    assert len(m.calls) == 4
    m = FakeMeasure()
    C.run_campaign(jobs, m, out, context=H100, src_hash=lambda s: "h1", resume=True)
    assert len(m.calls) == 4
    # without --resume nothing is skipped
    m = FakeMeasure()
    C.run_campaign(jobs, m, out, context=H200, src_hash=lambda s: "h1")
    assert len(m.calls) == 4
    assert len(read_receipts(out)) == 2 + 2 + 0 + 4 + 4 + 4


def test_campaign_refused_when_a_family_has_no_tune_hook():
    from memra.errors import MemraError
    from memra.tune.measure import require_hooks

    jobs = [C.Job("k", "v", {}, {"n": 1, "batch": 1}, "nosuch.cu")]
    with pytest.raises(MemraError, match=r"nosuch\.cu \(no module memra\.gpu\.ops\.nosuch\)"):
        require_hooks(jobs)


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K_M"), ("gemma3", "Q4_K_M"), ("qwen2", "Q4_0")])
def test_synthetic_model_shapes_without_the_file(tiny_models, arch, quant):
    # oracle: the header of the file `memra synth` writes for the same shape and mix
    real = C.model_info(str(tiny_models(arch, quant)))
    syn = C.model_info(f"synth:tiny-{arch}:{quant}")
    assert syn.cfg == real.cfg
    assert dict(syn.types) == dict(real.types)
    assert C.model_shapes(syn, ctx=[64]) == C.model_shapes(real, ctx=[64])


def test_synthetic_model_spelling_errors():
    with pytest.raises(C.CampaignError, match="synth:SHAPE:QUANT"):
        C.model_info("synth:llama3-8b")
    from memra.errors import MemraError

    with pytest.raises(MemraError, match="unknown shape"):
        C.model_info("synth:llama9-8b:Q4_K_M")
