"""`memra tune carry` (memra.tune.carry): receipts carried across a kernel source change only when every module
they measured compiles to the same code (NVRTC on the CPU, CUBIN code sections compared), and freeze reading
carried receipts as current."""

from __future__ import annotations

import shutil

import pytest

from memra.gpu.compile import compile_cubin, source_hash
from memra.paths import kernel_dir
from memra.tune import carry as CARRY
from memra.tune import freeze as F
from memra.tune.receipts import check_line, make_receipt, read_receipts
from memra.tune.tables import combined_hash

H200 = dict(device="NVIDIA H200", cc="9.0", sms=132, nvrtc="13.0")
SHAPE = {"type": "Q4_0", "rows": 256, "cols": 512, "batch": 1}
CFG = {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_UNROLL": 2}


def _rec(src_hash, us=5.0, config=CFG, ts="2026-12-01T00:00:00Z"):
    return make_receipt(kernel="matvec", variant="q8", config=config, shape=SHAPE, src="matvec.cu",
                        src_hash=src_hash, ok=True, max_err=0.0, peak_gbps=4500.0, git_sha="0" * 40, ts=ts,
                        median_us=us, p20_us=us, p80_us=us, reps=10, bytes=100_000, **H200)


def _tree(tmp_path, name, edit=None):
    """A copy of kernels/ with matvec.cu edited by edit(text)."""
    root = tmp_path / name
    shutil.copytree(kernel_dir(), root)
    if edit:
        f = root / "matvec.cu"
        f.write_text(edit(f.read_text()))
    return root


def _df(tmp_path, rows):
    f = tmp_path / "r.jsonl"
    f.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    return read_receipts([f], kinds=("tune",))


def test_code_sections_of_a_real_module():
    s = CARRY.code_sections(compile_cubin("matvec.cu", "sm_90a", {"MV_TYPE": 2, "MV_B": 1, **CFG}, root=kernel_dir()))
    assert {".text.mv_q8", ".text.mv_q8_glu"} <= set(s) and all(len(s[k]) > 1000 for k in (".text.mv_q8",))
    with pytest.raises(Exception, match="ELF64"):
        CARRY.code_sections(b"not a cubin")


def test_carried_when_the_code_is_the_same_and_not_when_it_differs(tmp_path):
    """Old tree: kernels/ with a comment added at the top of matvec.cu (every line moves, the code does not):
    carried. Old tree with a kernel change: not carried."""
    old = _tree(tmp_path, "old", lambda t: "// an older comment\n// and another\n" + t)
    new = kernel_dir()
    h_old, h_new = source_hash("matvec.cu", old), source_hash("matvec.cu", new)
    assert h_old != h_new
    df = _df(tmp_path, [_rec(h_old)])
    logs = []
    recs = CARRY.plan(df, None, "NVIDIA H200", old, new, log=logs.append)
    assert [(r["src"], r["from_hash"], r["to_hash"], r["modules"], r["receipts"]) for r in recs] == \
        [("matvec.cu", h_old, h_new, 1, 1)]
    kind, problems = check_line(recs[0])
    assert kind.name == "carry" and not problems
    # the combined entries over it follow
    both = _df(tmp_path, [_rec(h_old), {**_rec("x"), "src": "matvec.cu+q8.cu",
                                        "src_hash": combined_hash([h_old, source_hash("q8.cu")])}])
    recs = CARRY.plan(both, None, "NVIDIA H200", old, new, log=logs.append)
    assert [r["src"] for r in recs] == ["matvec.cu", "matvec.cu+q8.cu"]
    assert recs[1]["to_hash"] == combined_hash([h_new, source_hash("q8.cu")])
    # a change of the code: the unit loop's canary on (MEMRA_CANARY 1 as the default)
    bad = _tree(tmp_path, "bad", lambda t: t.replace("#define MEMRA_CANARY 0", "#define MEMRA_CANARY 1", 1))
    df = _df(tmp_path, [_rec(source_hash("matvec.cu", bad))])
    assert CARRY.plan(df, None, "NVIDIA H200", bad, new, log=logs.append) == []
    assert any("compile to different code" in m for m in logs)


def test_a_failed_receipt_measured_no_module(tmp_path):
    """A campaign's failed receipt (a configuration that was refused or did not build) measured no module: none is
    compiled for it (norm's hook refuses such a configuration outright, which stopped norm.cu's carry), and it is
    carried with the rest (the record maps the file's hash)."""
    old = _tree(tmp_path, "old", lambda t: "// an older comment\n" + t)
    h_old = source_hash("matvec.cu", old)
    bad = make_receipt(kernel="matvec", variant="q8", config={"MV_NWARPS": 3}, shape=SHAPE, src="matvec.cu",
                       src_hash=h_old, ok=False, error="bad configuration", git_sha="0" * 40,
                       ts="2026-12-01T00:00:00Z", **H200)
    recs = CARRY.plan(_df(tmp_path, [_rec(h_old), bad]), None, "NVIDIA H200", old, kernel_dir(), log=lambda m: None)
    assert [(r["src"], r["modules"], r["receipts"]) for r in recs] == [("matvec.cu", 1, 2)]


def test_freeze_reads_carried_receipts_as_current(tmp_path):
    df = _df(tmp_path, [_rec("old", 4.0, {"MV_NWARPS": 8, "MV_ROWS": 1}), _rec("old", 5.0)])
    carries = [{"schema": CARRY.SCHEMA, "src": "matvec.cu", "from_hash": "old", "to_hash": "mid",
                "device": "NVIDIA H200", "ts": "2026-12-02T00:00:00Z"},
               {"schema": CARRY.SCHEMA, "src": "matvec.cu", "from_hash": "mid", "to_hash": "new",
                "device": "NVIDIA H200", "ts": "2026-12-03T00:00:00Z"}]
    assert not F.freeze(df, "NVIDIA H200", current_hashes={"matvec.cu": "new"})["entries"].get("matvec")
    e = F.freeze(CARRY.apply(df, carries), "NVIDIA H200", current_hashes={"matvec.cu": "new"})["entries"]
    (entry,) = e["matvec"].values()
    assert entry["1"]["src_hash"] == "new" and entry["1"]["config"] == {"MV_NWARPS": 8, "MV_ROWS": 1}
    # another device's receipts are not carried
    other = CARRY.apply(df.assign(device="RTX 5090"), carries)
    assert set(other["src_hash"]) == {"old"}


def test_table_entries_and_engine_choices_name_modules_too(tmp_path):
    """The modules compared are those of the receipts, of the table's entries on the old hash (at their batch
    bucket) and of the engine choices (with their entry's variant): here a table entry at bucket 4 and a choice
    of another configuration add two modules to the receipt's one."""
    old = _tree(tmp_path, "old", lambda t: "// an older comment\n" + t)
    h_old = source_hash("matvec.cu", old)
    skey = "cols=512,rows=256,type=Q4_0"
    table = {"entries": {"matvec": {skey: {"4": {"variant": "q8", "config": CFG, "src": "matvec.cu",
                                                  "src_hash": h_old}}}}}
    choice = {"device": "NVIDIA H200", "kernel": "matvec", "shape_key": skey, "batch": 4, "src": "matvec.cu",
              "src_hash": h_old, "config": {"MV_NWARPS": 8, "MV_ROWS": 1}}
    seen = []

    def compile_one(root, f, arch, d):
        seen.append((root == old, d["MV_B"], d["MV_NWARPS"]))
        return compile_cubin(f, arch, d, root=root)

    recs = CARRY.plan(_df(tmp_path, [_rec(h_old)]), table, "NVIDIA H200", old, kernel_dir(), compiler=compile_one,
                      log=lambda m: None, choices=[choice])
    assert [r["modules"] for r in recs] == [3]
    assert sorted(set(seen)) == [(False, 1, 4), (False, 4, 4), (False, 4, 8), (True, 1, 4), (True, 4, 4), (True, 4, 8)]


def test_tree_at_extracts_a_commits_kernels(tmp_path):
    from memra.paths import project_root

    root = CARRY.tree_at("HEAD", tmp_path, project_root())
    assert (root / "matvec.cu").is_file() and source_hash("q8.cu", root)
    with pytest.raises(Exception, match="git archive"):
        CARRY.tree_at("no-such-rev-anywhere", tmp_path / "x", project_root())


def test_cli_carries_receipts_an_earlier_carry_moved(tmp_path, monkeypatch):
    """`memra tune carry` reads the receipts as freeze does, earlier carry records applied: a receipt measured two
    source edits ago (hash A, carried A -> the --from tree's hash) is carried on to this tree's. Without that the
    second edit found nothing at --from's hash and carried nothing (session 47's rehearsal of glu_twin's landing)."""
    import json

    from typer.testing import CliRunner

    from memra.cli import app

    old = _tree(tmp_path, "old", lambda t: "// an older comment\n" + t)
    h_old, h_new = source_hash("matvec.cu", old), source_hash("matvec.cu", kernel_dir())
    src = tmp_path / "in.jsonl"
    first = {"schema": CARRY.SCHEMA, "src": "matvec.cu", "from_hash": "A", "to_hash": h_old, "device": "NVIDIA H200",
             "arch": "sm_90a", "modules": 1, "receipts": 1, "nvrtc": "13.0", "git_sha": "0" * 40,
             "ts": "2026-12-02T00:00:00Z"}
    src.write_text(json.dumps(_rec("A")) + "\n" + json.dumps(first) + "\n")
    monkeypatch.setattr(CARRY, "tree_at", lambda rev, dest, root: old)
    out = tmp_path / "carry.jsonl"
    res = CliRunner().invoke(app, ["tune", "carry", "--from", "HEAD", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert (rec["from_hash"], rec["to_hash"], rec["receipts"]) == (h_old, h_new, 1)


def test_a_carry_there_and_back_maps_to_the_newest_end():
    """A kernel file edited, carried, then put back and carried again (session 49's matvec.cu): the receipts of
    either hash, and of a hash that carried into the cycle, are current at the newest record's to_hash, not at the
    first edit's."""
    from memra.tune.carry import hash_map

    def rec(a, b, ts):
        return {"device": "D", "src": "f.cu", "from_hash": a, "to_hash": b, "ts": ts}

    m = hash_map([rec("old", "a", "1"), rec("a", "b", "2"), rec("b", "a", "3")])
    assert m[("D", "f.cu", "a")] == "a" and m[("D", "f.cu", "b")] == "a" and m[("D", "f.cu", "old")] == "a"
    m = hash_map([rec("a", "b", "1"), rec("b", "c", "2")])   # no cycle: the chain's end
    assert m[("D", "f.cu", "a")] == "c"


def _rec_q8(src_hash, us=4.0):
    """A receipt of a Q8_0 shape (another module of matvec.cu than _rec's Q4_0 one)."""
    return {**_rec(src_hash, us), "shape": {**SHAPE, "type": "Q8_0"}}


def test_a_partial_carry_names_the_receipts_whose_modules_are_the_same(tmp_path):
    """An edit that changes the code of one type's modules only (here the older tree had the canary on for Q8_0):
    the record is partial — it names the Q4_0 receipt (its module compiles to the same code) and not the Q8_0 one —
    and apply / freeze read only the named receipt as current; the other stays stale. A failed receipt is not
    carried by a partial record (its failure may not hold on the new code)."""
    old = _tree(tmp_path, "old", lambda t: t.replace("#ifndef MEMRA_CANARY\n",
                                                      "#if MV_TYPE == 8\n#define MEMRA_CANARY 1\n#endif\n"
                                                      "#ifndef MEMRA_CANARY\n", 1))
    new = kernel_dir()
    h_old, h_new = source_hash("matvec.cu", old), source_hash("matvec.cu", new)
    failed = make_receipt(kernel="matvec", variant="q8", config={"MV_NWARPS": 3}, shape=SHAPE, src="matvec.cu",
                          src_hash=h_old, ok=False, error="bad configuration", git_sha="0" * 40,
                          ts="2026-12-01T00:00:00Z", **H200)
    df = _df(tmp_path, [_rec(h_old), _rec_q8(h_old), failed])
    logs = []
    (rec,) = CARRY.plan(df, None, "NVIDIA H200", old, new, log=logs.append)
    assert (rec["from_hash"], rec["to_hash"], rec["modules"], rec["receipts"]) == (h_old, h_new, 1, 1)
    assert rec["only"] == [CARRY.receipt_id(df.iloc[0])] and rec["only_choices"] == []
    kind, problems = check_line(rec)
    assert kind.name == "carry" and not problems
    assert any("1 of 2 modules compile to different code" in m and "1 of 3 receipts" in m for m in logs)
    moved = CARRY.apply(df, [rec])
    assert list(moved["src_hash"]) == [h_new, h_old, h_old]
    e = F.freeze(moved, "NVIDIA H200", current_hashes={"matvec.cu": h_new})["entries"]["matvec"]
    assert set(e) == {"cols=512,rows=256,type=Q4_0"}
    # a later full record from the new hash carries the named receipt on, not the others
    nxt = {"schema": CARRY.SCHEMA, "src": "matvec.cu", "from_hash": h_new, "to_hash": "next", "device": "NVIDIA H200",
           "ts": "2026-12-09T00:00:00Z"}
    assert list(CARRY.apply(df, [rec, nxt])["src_hash"]) == ["next", h_old, h_old]


def test_a_partial_record_carries_the_engine_choices_it_names():
    import pandas as pd

    rec = {"schema": CARRY.SCHEMA, "src": "matvec.cu", "from_hash": "a", "to_hash": "b", "device": "D", "ts": "1",
           "only": [], "only_choices": []}
    ch = pd.DataFrame([{"device": "D", "src": "matvec.cu", "src_hash": "a", "kernel": "matvec", "batch": 1,
                        "shape_key": "cols=512,rows=256,type=Q4_0", "config": {"MV_NWARPS": 8}},
                       {"device": "D", "src": "matvec.cu", "src_hash": "a", "kernel": "matvec", "batch": 1,
                        "shape_key": "cols=512,rows=256,type=Q8_0", "config": {"MV_NWARPS": 8}}])
    rec["only_choices"] = [CARRY.choice_id(ch.iloc[0])]
    assert list(CARRY.apply(ch, [rec], CARRY.choice_id)["src_hash"]) == ["b", "a"]


def test_dispatch_receipts_name_their_paths_module():
    """A dispatch receipt (kernel dispatch / dispatch_glu, variant the path, src the path's file) measured the
    path's own module: row_modules resolves it through the path's hook (gemm.cu's and mvt.cu's hooks refused the
    dispatch kernel names, which stopped their carry: session 53's `memra tune carry` of a qtypes.cuh edit)."""
    shape = {"type": "Q4_0", "rows": 256, "cols": 512, "batch": 16}
    for src, variant, kernel in (("gemm.cu", "gemm", "dispatch"), ("mvt.cu", "mvt", "dispatch_glu"),
                                 ("matvec.cu", "matvec", "dispatch")):
        r = {"kernel": kernel, "variant": variant, "config": {}, "shape": shape if src != "matvec.cu" else SHAPE,
             "ok": True}
        direct = {"kernel": variant + ("_glu" if kernel == "dispatch_glu" else ""), "variant": "q8",
                  "config": {}, "shape": r["shape"], "ok": True}
        mods = CARRY.row_modules(r, src)
        assert mods and mods == CARRY.row_modules(direct, src), src


def test_a_file_under_a_joint_src_is_compared_and_carried(tmp_path):
    """gemm_f16's receipts name src gemm_f16.cu+gemm_f16_wg.cu: neither file is ever a receipt's src alone, so an
    edit of a header both include (session 53's qtypes.cuh) left them uncarried even with every module unchanged.
    Now each file's modules among the joint family's are compared and the joint record follows."""
    old = tmp_path / "old"
    shutil.copytree(kernel_dir(), old)
    f = old / "gemm_f16_wg.cu"
    f.write_text("// an older comment\n" + f.read_text())
    src = "gemm_f16.cu+gemm_f16_wg.cu"
    h_old = combined_hash([source_hash("gemm_f16.cu", old), source_hash("gemm_f16_wg.cu", old)])
    h_new = combined_hash([source_hash("gemm_f16.cu"), source_hash("gemm_f16_wg.cu")])
    r = make_receipt(kernel="gemm_f16", variant="f16", src=src, src_hash=h_old, ok=True, max_err=0.0,
                     config={"WG_BN": 128, "WG_INFLIGHT": 1, "WG_MT": 1, "WG_PREFETCH": 1, "WG_STAGES": 4},
                     shape={"batch": 64, "cols": 512, "rows": 256, "type": "Q4_0"}, peak_gbps=4500.0,
                     git_sha="0" * 40, ts="2026-12-01T00:00:00Z", median_us=5.0, p20_us=5.0, p80_us=5.0, reps=10,
                     bytes=100_000, **H200)
    logs = []
    recs = CARRY.plan(_df(tmp_path, [r]), None, "NVIDIA H200", old, kernel_dir(), log=logs.append)
    assert [(x["src"], x["from_hash"], x["to_hash"], x["receipts"]) for x in recs] == [(src, h_old, h_new, 1)], logs
    assert any("gemm_f16_wg.cu" in m and "modules identical" in m for m in logs)
