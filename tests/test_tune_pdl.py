"""`memra tune run --pdl`: a campaign timed with programmatic dependent launches, as the engine
launches (memra.tune.measure), its receipts marked `timing: pdl`, never compared with plain-timed
ones (resume, freeze). CPU only: the GPU emulator records each launch's PDL flag."""

from __future__ import annotations

import json

from gpu_emulator import FakeGpu
from memra.gpu.compile import source_hash
from memra.tune import campaign as C
from memra.tune.freeze import timing_of
from memra.tune.receipts import append_receipts, make_receipt, read_receipts

CTX = {"device": "emulated", "cc": (9, 0), "sms": 132, "nvrtc": "13.0"}
SPEC = {"name": "t", "batches": [16], "reps": 3, "kernels": [{
    "name": "gemm", "src": "gemm.cu", "variants": ["q8"],
    "shapes": [{"type": "Q4_0", "rows": 96, "cols": 256}],
    "configs": [{"GM_WK": 8}, {"GM_WK": 4}]}]}


class PdlLog(FakeGpu):
    """The emulator, each launch's pdl flag recorded."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.flags = []

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        self.flags.append(bool(pdl))
        return super().launch(kernel, grid, block, args, shmem, pdl)


def _gpu():
    g = PdlLog(1 << 26)
    g.info.l2_bytes = 1 << 19
    g.time_ms = lambda fn, reps=50, warmup=5: [fn() or 0.05 for _ in range(reps)]
    return g


def test_pdl_timing_launches_with_pdl_and_marks_the_receipts(tmp_path):
    from memra.tune.measure import gpu_measure

    for pdl in (False, True):
        g = _gpu()
        out = tmp_path / f"r{int(pdl)}.jsonl"
        ctx = {**CTX, "timing": "pdl"} if pdl else CTX
        counts = C.run_campaign(C.expand_campaign(SPEC), gpu_measure(g, seed=0, pdl=pdl), out, context=ctx)
        assert counts == {"measured": 2, "failed": 0, "skipped": 0}
        assert g.flags and set(g.flags) == {pdl}          # every launch of the case, check included
        df = read_receipts(out)
        assert list(timing_of(df)) == ["pdl" if pdl else ""] * 2
        assert df["ok"].all()


def test_resume_counts_only_receipts_of_the_same_timing(tmp_path):
    from memra.tune.measure import gpu_measure

    out = tmp_path / "r.jsonl"
    C.run_campaign(C.expand_campaign(SPEC), gpu_measure(_gpu(), seed=0), out, context=CTX)
    pdl_ctx = {**CTX, "timing": "pdl"}
    again = C.run_campaign(C.expand_campaign(SPEC), gpu_measure(_gpu(), seed=0, pdl=True), out, context=pdl_ctx,
                           resume=True)
    assert again == {"measured": 2, "failed": 0, "skipped": 0}  # the plain receipts do not count
    for ctx, pdl in ((pdl_ctx, True), (CTX, False)):
        assert C.run_campaign(C.expand_campaign(SPEC), gpu_measure(_gpu(), seed=0, pdl=pdl), out, context=ctx,
                              resume=True) == {"measured": 0, "failed": 0, "skipped": 2}


def _norm_receipt(n, us, threads, **extra):
    """A passing H200 rmsnorm receipt measured on today's norm.cu."""
    return make_receipt(kernel="rmsnorm", variant="default", config={"NORM_THREADS": threads},
                        shape={"n": n, "batch": 1}, src="norm.cu", src_hash=source_hash("norm.cu"), ok=True,
                        median_us=us, p20_us=us, p80_us=us, reps=10, bytes=2 * n, device="NVIDIA H200", cc="9.0",
                        sms=132, nvrtc="13.0", **extra)


def _frozen_norms(receipts, out_dir, *flags) -> dict:
    """`memra tune freeze RECEIPTS --json FLAGS...`: its table's batch-1 rmsnorm entries by shape."""
    from test_research import memra

    r = memra("tune", "freeze", str(receipts), "--out-dir", str(out_dir), "--json", *flags)
    assert r.returncode == 0, r.stderr
    (table,) = json.loads(r.stdout)
    return {s: e["1"] for s, e in table["entries"]["rmsnorm"].items()}


def test_freeze_keeps_the_two_timings_apart(tmp_path):
    """The plain receipt is slower, the PDL one faster: `freeze` takes the plain one alone,
    `freeze --pdl` the PDL one alone."""
    def rec(us, threads, **extra):
        return _norm_receipt(4096, us, threads, **extra)

    f = tmp_path / "r.jsonl"
    append_receipts(f, [rec(3.0, 256), rec(4.0, 512), rec(1.0, 512, timing="pdl"), rec(2.0, 256, timing="pdl")])
    for flag, want in (([], 256), (["--pdl"], 512)):
        e = _frozen_norms(f, tmp_path / f"d{len(flag)}", *flag)["n=4096"]
        assert e["config"] == {"NORM_THREADS": want} and e["candidates"] == 2


def test_freeze_pdl_takes_the_plain_receipts_where_no_pdl_ones_are(tmp_path):
    """`freeze --pdl` over a PDL campaign that timed one shape of two: that shape's entry from its
    PDL receipts alone (the plain ones there, faster here, not compared with them), the other
    shape's from its plain receipts; plain `freeze` ignores the PDL receipts."""
    rec = _norm_receipt
    f = tmp_path / "r.jsonl"
    append_receipts(f, [rec(4096, 1.0, 256), rec(4096, 1.5, 512), rec(576, 2.0, 128), rec(576, 1.0, 256),
                        rec(4096, 3.0, 256, timing="pdl"), rec(4096, 2.5, 512, timing="pdl")])
    for flag, want in (([], {"n=4096": (256, 1.0), "n=576": (256, 1.0)}),
                       (["--pdl"], {"n=4096": (512, 2.5), "n=576": (256, 1.0)})):
        got = {s: (e["config"]["NORM_THREADS"], e["median_us"])
               for s, e in _frozen_norms(f, tmp_path / f"d{len(flag)}", *flag).items()}
        assert got == want


def test_freeze_pdl_match_takes_pdl_receipts_only_where_named(tmp_path):
    """`freeze --pdl --pdl-match EXPR`: PDL-timed receipts for the entries EXPR names ("KERNEL
    SHAPE_KEY", whole-matched), the plain ones elsewhere even where PDL ones exist; a bad
    expression and --pdl-match without --pdl are refused by name."""
    from test_research import memra

    rec = _norm_receipt
    f = tmp_path / "r.jsonl"
    append_receipts(f, [rec(4096, 1.0, 256), rec(4096, 1.5, 512), rec(576, 1.0, 256), rec(576, 2.0, 128),
                        rec(4096, 3.0, 256, timing="pdl"), rec(4096, 2.5, 512, timing="pdl"),
                        rec(576, 3.0, 256, timing="pdl"), rec(576, 2.0, 128, timing="pdl")])
    cases = ((["--pdl"], {"n=4096": (512, 2.5), "n=576": (128, 2.0)}),
             (["--pdl", "--pdl-match", "rmsnorm n=4096"], {"n=4096": (512, 2.5), "n=576": (256, 1.0)}),
             (["--pdl", "--pdl-match", "rmsnorm n=40"], {"n=4096": (256, 1.0), "n=576": (256, 1.0)}))
    for i, (flag, want) in enumerate(cases):
        entries = _frozen_norms(f, tmp_path / f"d{i}", *flag)
        got = {s: (e["config"]["NORM_THREADS"], e["median_us"]) for s, e in entries.items()}
        assert got == want, flag
        # an entry frozen from PDL-timed receipts says so (the table's provenance), the others do not
        timed = {s: e.get("timing") for s, e in entries.items()}
        assert timed == {s: ("pdl" if us in (2.0, 2.5) else None) for s, (_, us) in want.items()}, flag
    r = memra("tune", "freeze", str(f), "--out-dir", str(tmp_path / "x"), "--pdl", "--pdl-match", "rmsnorm (")
    assert r.returncode != 0 and "--pdl-match" in r.stderr and "regular expression" in r.stderr
    r = memra("tune", "freeze", str(f), "--out-dir", str(tmp_path / "y"), "--pdl-match", "rmsnorm n=4096")
    assert r.returncode != 0 and "--pdl-match needs --pdl" in r.stderr
