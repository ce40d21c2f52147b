"""`memra kernel-check`: every kernel module the engine can launch, against its CPU reference,
with canaries; a receipt of the run; and whether a committed receipt still covers HEAD.

Each kernel family lives in one module under memra/gpu/ops/ and offers five functions:

    compile_variants() -> list[tuple[str, dict]]
        every (kernel file, -D defines) its own checks build, its canaries included;
    checks(g: memra.gpu.cuda.Gpu, rng: np.random.Generator) -> Iterator[Outcome]
        runs each kernel/variant on fresh random inputs (never zeros) with its outputs
        poisoned before the launch (memra.gpu.cuda.poison_byte: a value no kernel writes),
        and compares with the numpy reference (memra.gpu.compare.compare);
    canaries(g, rng) -> Iterator[Outcome]
        deliberately wrong variants (compiled with -DMEMRA_CANARY=...): each must FAIL its
        comparison, or the check itself is too weak and kernel-check goes red;
    launch_cases(L, ctx) -> list[dict] / check_launch(g, rng, case) -> Outcome
        the engine's own launches (memra.tune.launches: every plan launch of the real and
        benchmark models, every bucket, sampler, rollback seam and tuned-table entry),
        each run with exactly the module the runner would load.

A family that yields no check or no canary fails the run (a gate that checks nothing is
red, not green). FAMILIES is memra.tune.launches.FAMILY_MODULE, the whole list (a literal
dict, no registration machinery): add a line there when a family module appears.

On a GPU a complete run (no --only) fills `report`, from which `make_receipt` writes the
receipt: the device, the hash of every kernel source, the launch set covered, the kernel
files each family loaded and the verdict (an incremental run: see run_kernel_check's base).
`status(device)` compares the committed receipt (research/kernel-check/<device>.json) with the
sources and the launch set at HEAD: current only when it was green, no source changed and
every launch the engine can make now is in it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from memra.tune.launches import FAMILY_MODULE as FAMILIES

RECEIPT_SCHEMA = "memra.kernel-check-receipt/1"
STATUS_DEVICE = "nvidia-h200"  # the device whose committed receipt CI checks


def _family_modules(only: str | None):
    names = list(FAMILIES) if only is None else [f.strip() for f in only.split(",")]
    for fam in names:
        if fam not in FAMILIES:
            raise KeyError(f"unknown kernel family {fam!r} (known: {', '.join(FAMILIES)})")
        yield fam, FAMILIES[fam]


def _dtext(defines: dict) -> str:
    return " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))


def _case_label(c: dict) -> str:
    return f"{c['entry']} [{_dtext(c['defines'])}] rows={c['bucket']}{' ' + c['tag'] if c.get('tag') else ''}"


def run_kernel_check(only: str | None = None, compile_only: bool = False, seed: int | None = None,
                     archs: Sequence[str] | None = None, models: Sequence[str] | None = None,
                     report: dict | None = None, base: dict | None = None) -> Iterator[str]:
    """Yield one line per check; the last line is 'ALL GREEN ...' or 'FAILED ...'.

    base (a green receipt of the device this run's receipt stands for: receipt_device, same
    arch and SM count): check only the launch cases it lacks; its
    families' own checks and canaries stand for this run (same sources, same modules), and
    `report` receives the union of both launch sets (see base_problem for what a base must
    satisfy). Where kernel sources changed since the base, a family whose recorded kernel
    files (what its checks, canaries and launches loaded, with what those include) reach a
    changed one runs whole: its checks, its canaries and every launch case of it.

    The families' own checks and canaries, then every case of the engine's launch set
    (memra.tune.launches over `models`, default launches.MODELS, and the device's tuning
    table). compile_only: compile the families' variants and every module of the launch set
    (over every table on this machine) for each arch in `archs` (default
    memra.gpu.compile.ARCHS) with NVRTC (no GPU needed). `report` (a dict) receives what a
    receipt records."""
    from memra.gpu.compile import ARCHS, compile_many
    from memra.tune import launches as LS
    from memra.tune import tables as TABLES

    failures = passed = caught = 0
    if base is not None and (only is not None or compile_only):
        yield "FAILED: an incremental run (base receipt) checks every family's new cases: no --only or --compile-only"
        return
    try:
        fams = list(_family_modules(only))
    except KeyError as e:
        yield f"FAILED: {e.args[0]}"
        return
    g = None
    if not compile_only:
        from memra.gpu.cuda import gpu, has_gpu

        if not has_gpu():
            yield "FAILED: no CUDA GPU here (use --compile-only to just compile the kernels)"
            return
        g = gpu()
        yield f"device: {g.info.name} ({g.info.arch}, {g.info.sm_count} SMs)"
    stands_for = None
    if g is not None:
        table, source = TABLES.load_table(g.info.name, g.info.cc, sms=g.info.sm_count)
        tables = [table] if source != "builtin" else []
        stands_for = receipt_device(g.info.name, g.info.sm_count, table, source)
        if stands_for != g.info.name:
            yield (f"receipt: {TABLES.device_slug(stands_for)} (this {g.info.arch} part with {g.info.sm_count} SMs "
                   f"runs the table frozen on {stands_for}: the same modules, grids and launch set)")
    else:
        tables = TABLES.list_tables()
    changed = changed_sources(base) if base is not None else []   # a base comes without compile_only
    why = base_problem(base, stands_for, changed, arch=g.info.arch, sms=g.info.sm_count) if base is not None else ""
    if why:
        yield f"FAILED: the base receipt cannot be extended: {why}"
        return
    # the launch set: every plan launch over the models and tables
    from_specs: list[str] = []
    specs, missing = LS.model_specs(tuple(models) if models else LS.MODELS, from_specs=from_specs)
    for m in from_specs:
        yield f"NOTE  launch set: model {m} from its exported spec ({LS.SPECS_ENV}; the file is not here)"
    for m in missing:  # a GPU run's receipt must cover every model; compiling covers what is here
        failures += not compile_only
        yield f"{'NOTE' if compile_only else 'FAIL'}  launch set: model {m}"
    sms = g.info.sm_count if g is not None else 132
    fam_names = [f for f, _ in fams]
    try:
        cases = LS.launch_set(specs, tables, sms=sms, families=fam_names)
    except Exception as e:
        failures += 1
        cases = {}
        yield f"FAIL  launch set: {type(e).__name__}: {e}"
    yield (f"launch set: {len(cases)} cases ({', '.join(f'{k} {v}' for k, v in LS.summary(cases).items())}) "
           f"over {len(specs)} models, {len(LS.launch_modules(cases))} modules; tables: builtin"
           + "".join(f", {t.get('device')} ({t.get('path')})" for t in tables))
    covered = set(base.get("launch_set", [])) if base is not None else set()
    # families the base does not hold (new since it) run whole; so do those a changed source reaches
    # (their base checks no longer stand)
    recheck = {f for f in fam_names if f not in base.get("families", {})} if base is not None else set()
    if changed:
        files = {f: set(base.get("families", {}).get(f, {}).get("files", [])) for f in fam_names}
        for c in cases.values():
            files.get(c["family"], set()).add(c["file"])
        reach = {n for n in set().union(*files.values()) if include_closure([n]) & set(changed)}
        recheck |= {f for f in fam_names if files[f] & reach}
    todo = {k: c for k, c in cases.items() if k not in covered or c["family"] in recheck}
    if base is not None:
        yield (f"incremental: {len(todo)} of the {len(cases)} launch cases to check (the base receipt "
               f"{base.get('git_sha')}, {base.get('ts')}: {len(covered)}); "
               + (f"kernel sources changed since it ({', '.join(changed)}): families run whole: "
                  f"{', '.join(sorted(recheck)) or 'none'}; the others' own checks and canaries stand"
                  if changed else "its families' own checks and canaries stand (the same kernel sources)"))
    by_family: dict[str, list] = {f: [] for f in fam_names}
    for key, c in todo.items():
        by_family[c["family"]].append((key, c))
    for items in by_family.values():  # cases of one weight shape together: its random weight is reused
        items.sort(key=lambda kc: (kc[1]["params"].get("type", 0), kc[1]["params"].get("K", 0),
                                   kc[1]["params"].get("N", 0), str(kc[1]["params"].get("glu")), kc[0]))
    # fresh inputs each run unless a seed is asked for (to reproduce a failure)
    seed = int(np.random.SeedSequence().entropy % (1 << 31)) if seed is None else seed
    yield f"seed: {seed}"
    rng = np.random.default_rng(seed)
    mods = {}
    for fam, modname in fams:
        try:
            mods[fam] = importlib.import_module(modname)
        except Exception as e:  # a family that cannot even be imported is a failure
            failures += 1
            yield f"FAIL  {fam}: cannot import {modname}: {e}"
    if compile_only or g is not None:
        # every module once (NVRTC in parallel processes); on a GPU into the cubin cache
        # before the checks load them, reported there only when it fails
        jobs, seen = [], set()
        for fam, mod in mods.items():
            own = [] if base is not None and fam not in recheck else list(mod.compile_variants())
            mine = own + [(c["file"], c["defines"]) for _, c in by_family[fam]]
            for f, d in mine:
                for arch in (archs or ARCHS) if compile_only else (g.info.arch,):
                    k = (f, arch, tuple(sorted(d.items())))
                    if k not in seen:
                        seen.add(k)
                        jobs.append((fam, (f, arch, dict(d))))
        fam_of = {(f, a, tuple(sorted(d.items()))): fam for fam, (f, a, d) in jobs}
        for (kernel_file, arch, defines), log, secs in compile_many([j for _, j in jobs]):
            fam = fam_of[(kernel_file, arch, tuple(sorted(defines.items())))]
            if log is None:
                if compile_only:
                    passed += 1
                    yield f"PASS  {fam} compile {arch} {kernel_file} {_dtext(defines)} ({secs:.1f} s)"
            else:
                failures += 1
                yield f"FAIL  {fam} compile {arch} {kernel_file} {_dtext(defines)}\n{log}"
    if compile_only:  # canaries run on a GPU: a compile-only run has none to catch
        yield (f"FAILED: {failures} failed, {passed} compiled" if failures else
               f"ALL GREEN ({passed} compiled; checks and canaries need a GPU)")
        return
    per_family = {}
    # the kernel files each family loads (through g.module), recorded in the receipt: a later
    # incremental run reads which families a changed source reaches from them
    loaded: dict[str, set] = {f: set() for f in mods}
    current = [""]
    module = g.module

    def tracked(kernel_file, defines=None):
        loaded[current[0]].add(kernel_file)
        return module(kernel_file, defines)

    g.module = tracked
    try:
        for fam, mod in mods.items():
            current[0] = fam
            n_checks = n_canaries = fam_fail = 0
            whole = base is None or fam in recheck
            base_fam = dict(base.get("families", {}).get(fam, {})) if base is not None else {}
            if not whole and not by_family[fam]:
                per_family[fam] = base_fam
                continue
            try:
                for o in (mod.checks(g, rng) if whole else ()):
                    n_checks += 1
                    fam_fail += not o.ok
                    yield f"{'PASS' if o.ok else 'FAIL'}  {fam} {o.name}: {o.detail}"
            except Exception as e:
                fam_fail += 1
                yield f"FAIL  {fam} checks: {type(e).__name__}: {e}"
            for key, c in by_family[fam]:
                try:
                    o = mod.check_launch(g, rng, c)
                    ok, detail = o.ok, o.detail
                except Exception as e:
                    ok, detail = False, f"{type(e).__name__}: {e}"
                n_checks += 1
                fam_fail += not ok
                yield f"{'PASS' if ok else 'FAIL'}  {fam} launch {_case_label(c)}: {detail}"
            if not whole:  # the base run's canaries of these sources stand
                b = base_fam
                if int(b.get("canaries", 0)) < 1:
                    fam_fail += 1
                    yield f"FAIL  {fam}: the base receipt ran no canary of it (a full run is needed)"
                failures += fam_fail
                passed += n_checks - min(fam_fail, n_checks)
                per_family[fam] = {"checks": int(b.get("checks", 0)) + n_checks,
                                   "launch_cases": int(b.get("launch_cases", 0)) + len(by_family[fam]),
                                   "canaries": int(b.get("canaries", 0)), "failed": fam_fail, "new_checks": n_checks}
                if "files" in b:  # a base without them: this run saw only the new cases' files
                    per_family[fam]["files"] = sorted(set(b["files"]) | loaded[fam])
                continue
            try:
                for o in mod.canaries(g, rng):
                    n_canaries += 1
                    if o.ok:
                        fam_fail += 1
                        yield f"FAIL  {fam} canary {o.name} was NOT caught: {o.detail}"
                    else:
                        caught += 1
                        yield f"PASS  {fam} canary {o.name} caught: {o.detail}"
            except Exception as e:
                fam_fail += 1
                yield f"FAIL  {fam} canaries: {type(e).__name__}: {e}"
            if n_checks == 0 or n_canaries == 0:
                fam_fail += 1
                yield f"FAIL  {fam}: {n_checks} checks and {n_canaries} canaries (a family needs at least one of each)"
            failures += fam_fail
            passed += n_checks - min(fam_fail, n_checks)
            per_family[fam] = {"checks": n_checks, "launch_cases": len(by_family[fam]), "canaries": n_canaries,
                               "failed": fam_fail, "files": sorted(loaded[fam])}
    finally:
        del g.module  # the method again
    green = failures == 0
    if report is not None:
        from memra.gpu.compile import nvrtc_version

        report.update(device=g.info.name, stands_for=stands_for,
                      cc=".".join(str(x) for x in g.info.cc) if isinstance(g.info.cc, tuple)
                      else str(g.info.cc), sms=g.info.sm_count, arch=g.info.arch,
                      nvrtc=".".join(str(x) for x in nvrtc_version()), seed=seed, complete=only is None,
                      all_green=green, failures=failures, families=per_family,
                      models=[s.name for s in specs], models_missing=missing, models_from_specs=from_specs,
                      tables=[{"device": t.get("device"), "path": t.get("path"), "frozen_at": t.get("frozen_at")}
                              for t in tables],
                      launch_set=sorted(set(cases) | covered))
        if base is not None:
            report["incremental"] = {"base_git_sha": base.get("git_sha"), "base_ts": base.get("ts"),
                                     "base_device": base.get("device"),
                                     "base_seed": base.get("seed"), "base_cases": len(covered),
                                     "new_cases": len(todo), "changed_sources": changed,
                                     "rechecked_families": sorted(recheck)}
    if not green:
        yield f"FAILED: {failures} failed, {passed} passed, {caught} canaries caught"
    elif base is not None:
        yield (f"ALL GREEN ({passed} checks passed: {len(todo)} launch cases"
               + (f" and the whole of {', '.join(sorted(recheck))}" if recheck else "")
               + f"; with the base receipt's {len(covered)} the receipt covers {len(set(cases) | covered)})")
    else:
        yield f"ALL GREEN ({passed} checks passed, {len(cases)} of them the engine's launches, {caught} canaries caught)"


def receipt_device(device: str, sms: int, table: dict, source: str) -> str:
    """The device whose receipt a run on `device` writes: its own, or — where it runs by compute
    capability the table frozen on another part with its SM count (an H100 SXM on the H200's
    table) — that table's device. The arch, the SM count and the table fix every module, grid
    and launch case, so such a run checks the same launches (the receipt's `device` names the
    part it ran on)."""
    if source == "cc" and table.get("device") and int(table.get("sms") or 0) == sms:
        return table["device"]
    return device


def base_problem(base: dict, device: str, changed: Sequence[str], *, arch: str | None = None,
                 sms: int | None = None) -> str:
    """Why a receipt cannot be the base of an incremental run whose receipt stands for `device`
    (receipt_device; "" when it can): it must be a green receipt of this schema, for the same
    device (its slug) and of the same arch and SM count; where kernel sources changed since it,
    every family of it must record the kernel files it loaded (receipts without them need a
    full run; a family it does not hold is new and runs whole). changed: changed_sources(base)."""
    from memra.tune.tables import device_slug

    if base.get("schema") != RECEIPT_SCHEMA:
        return f"schema {base.get('schema')!r} is not {RECEIPT_SCHEMA}"
    if not base.get("all_green"):
        return "its run was not ALL GREEN"
    if base.get("slug") != device_slug(device):
        return f"it is {base.get('slug')!r}'s receipt, this run writes {device_slug(device)!r}'s"
    for k, v in (("arch", arch), ("sms", sms)):
        if v is not None and base.get(k) != v:
            return f"it ran with {k} {base.get(k)!r}, this device has {v!r}"
    # a family the base does not hold at all is new: it runs whole (its own checks, canaries and cases)
    fams = base.get("families", {})
    blind = sorted(f for f in FAMILIES if f in fams and "files" not in fams[f])
    if changed and blind:
        return (f"kernel sources changed since ({', '.join(changed)}) and it does not record the kernel files of "
                f"{', '.join(blind)}: a full run is needed")
    return ""


def changed_sources(base: dict) -> list[str]:
    """The kernel sources added, removed or changed since `base` (a receipt)."""
    now, old = kernel_sources(), base.get("sources", {})
    return sorted(n for n in set(old) | set(now) if old.get(n) != now.get(n))


def include_closure(files) -> set[str]:
    """`files` (kernel file names) and every kernel source they include, transitively
    (memra.gpu.compile.source_names); a file no longer there stands for itself."""
    from memra.errors import MemraError
    from memra.gpu.compile import source_names

    out = set()
    for f in files:
        try:
            out.update(source_names(f))
        except MemraError:  # removed since the base: a changed source itself
            out.add(f)
    return out


def all_green(lines: list[str]) -> bool:
    """True when a finished run_kernel_check() ended green (for the CLI's exit code)."""
    return bool(lines) and lines[-1].startswith("ALL GREEN")


# -- receipts and their currency -------------------------------------------------------------

def kernel_sources() -> dict[str, str]:
    """{file: sha256[:16]} of every kernel source (kernels/*.cu and *.cuh)."""
    from memra.paths import kernel_dir

    d = kernel_dir()
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in sorted(d.iterdir()) if p.suffix in (".cu", ".cuh")}


def sources_hash(sources: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name, digest in sorted(sources.items()):
        h.update(name.encode() + b"\0" + digest.encode() + b"\n")
    return h.hexdigest()[:16]


def launch_set_hash(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


def make_receipt(report: dict) -> dict:
    """The receipt of a complete kernel-check run (run_kernel_check's `report`)."""
    from memra.tune.receipts import git_sha, utc_now
    from memra.tune.tables import device_slug

    src = kernel_sources()
    keys = report["launch_set"]
    return {"schema": RECEIPT_SCHEMA, "ts": utc_now(), "git_sha": git_sha(), "device": report["device"],
            "slug": device_slug(report.get("stands_for") or report["device"]), "cc": report["cc"],
            "sms": report["sms"], "arch": report["arch"], "nvrtc": report["nvrtc"], "seed": report["seed"],
            "all_green": report["all_green"],
            "failures": report["failures"], "families": report["families"], "sources": src,
            "sources_hash": sources_hash(src), "models": report["models"], "models_missing": report["models_missing"],
            "tables": report["tables"], "launch_set_hash": launch_set_hash(keys), "launch_set": keys,
            **({"incremental": report["incremental"]} if report.get("incremental") else {}),
            **({"models_from_specs": report["models_from_specs"]} if report.get("models_from_specs") else {})}


def receipt_path(device: str, out: str | Path | None = None) -> Path:
    """Where a receipt of `device` goes: `out` (a folder, or a .json file), else
    $MEMRA_HOME/receipts/kernel-check/ (the source tree is written only when asked)."""
    from memra.paths import receipts_dir
    from memra.tune.tables import device_slug

    if out is not None and str(out).endswith(".json"):
        return Path(out)
    folder = Path(out) if out is not None else receipts_dir() / "kernel-check"
    return folder / f"{device_slug(device)}.json"


def write_receipt(receipt: dict, path: Path) -> Path:
    from memra.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(receipt, indent=1, sort_keys=True) + "\n").encode())
    return path


def committed_dir() -> Path:
    """research/kernel-check/ of the checkout: the receipts CI checks for currency."""
    from memra.paths import research_dir

    return research_dir() / "kernel-check"


def status(device: str = STATUS_DEVICE, path: str | Path | None = None) -> dict:
    """Whether the committed receipt of `device` (a name or slug; `path`: another receipt
    file) covers HEAD: {"device", "receipt", "sources_hash", "current", "stale", ...}.
    stale: kernel sources added, removed or changed since the receipt; uncovered: cases of
    the launch set the engine can make now (the receipt's models, the device's shipped
    table) that the receipt does not hold; unexecuted: entries of that table no case runs
    with their tunables (launches.unexecuted_entries: the table would say what the engine does
    not do), reported apart from `current`."""
    from memra.tune import launches as LS
    from memra.tune.tables import device_slug, read_table, tables_dir

    slug = device_slug(device)
    p = Path(path) if path is not None else committed_dir() / f"{slug}.json"
    src = kernel_sources()
    out = {"device": slug, "receipt": None, "sources_hash": sources_hash(src), "current": False, "stale": [],
           "uncovered": [], "unexecuted": [], "reason": ""}
    if not p.is_file():
        out["reason"] = f"no receipt at {p}"
        return out
    r = json.loads(p.read_text(encoding="utf-8"))
    out.update(receipt=str(p), ran_on=r.get("device"), receipt_sources_hash=r.get("sources_hash"),
               git_sha=r.get("git_sha"), ts=r.get("ts"), all_green=bool(r.get("all_green")),
               launch_cases=len(r.get("launch_set", [])), incremental=r.get("incremental"))
    old = r.get("sources", {})
    out["stale"] = sorted(n for n in set(old) | set(src) if old.get(n) != src.get(n))
    specs, missing = LS.model_specs(r.get("models") or LS.MODELS, fetch=True)
    table_file = tables_dir() / f"{slug}.json"
    tables = [read_table(table_file)] if table_file.is_file() else []
    now = LS.launch_set(specs, tables)
    have = set(r.get("launch_set", []))
    out["uncovered"] = sorted(k for k in now if k not in have)
    # entries of the table that no launch runs as they say (a dropped tunable, a shape no plan reaches): not the
    # receipt's currency but the table's honesty, so reported beside it (the CLI warns); with models missing the
    # launch set is partial and says nothing about it
    out["unexecuted"] = LS.unexecuted_entries(tables[0], now.values()) if tables and not missing else []
    reasons = []
    if r.get("schema") != RECEIPT_SCHEMA:
        reasons.append(f"schema {r.get('schema')!r} is not {RECEIPT_SCHEMA}")
    if not r.get("all_green"):
        reasons.append("the receipt's run was not ALL GREEN")
    if out["stale"]:
        reasons.append(f"{len(out['stale'])} kernel sources changed since ({', '.join(out['stale'])})")
    if out["uncovered"]:
        reasons.append(f"{len(out['uncovered'])} of the engine's {len(now)} launch cases are not in it")
    if missing:
        reasons.append(f"models not readable here: {'; '.join(missing)}")
    if set(LS.MODELS) - set(r.get("models") or []):
        reasons.append(f"it did not cover {', '.join(sorted(set(LS.MODELS) - set(r.get('models') or [])))}")
    out["current"] = not reasons
    out["reason"] = "; ".join(reasons) or "the receipt covers the kernel sources and launch set at HEAD"
    return out
