"""`memra tune carry`: tuning receipts carried across a kernel source change that leaves the machine code
of every module they measured unchanged.

A tuning receipt (and the table entry frozen from it) names its kernel file's source hash, so any edit of
the file or of a header it includes makes it stale: freeze ignores it and the campaign has to run again.
When the edit only adds code behind a define the measured modules do not set (new entry points, as
kernels/matvec.cu's MV_NORM would), their machine code is unchanged and the measurements still hold.
`carry` proves that module by module: every module of the changed file that a receipt or a table entry of
the device names (the family's tune_modules hook) is compiled from the older tree and from this one for the
device's arch, and the CUBINs' code (code_sections: the .text sections, their relocations, the .nv.info
records, the shared-memory and parameter-bank sizes) is compared byte for byte; line tables, debug and
symbol tables are left out. When every module is identical it writes a carry record
{src, from_hash, to_hash, modules}; `memra tune freeze` then reads the receipts (and engine choices)
measured on from_hash as measured on to_hash. When some differ (an edit of a header that changes one
family's modules, as qtypes.cuh's K-quant scales change only the K-quant matvecs), the record is partial:
it names the receipts (`only`) and engine choices (`only_choices`) all of whose modules are identical, and
only those are read as current; the others stay on from_hash, stale, for their campaign to run again. A
file whose family has no tune_modules hook is not carried. A dispatch receipt (kernel dispatch /
dispatch_glu, variant the path, src the path's file: memra.tune.dispatch) measured its path's own module.

    memra tune carry --from REV                 # REV: the commit the receipts' sources were measured at
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Iterable, Mapping

from memra.errors import MemraError
from memra.tune.tables import combined_hash

SCHEMA = "memra.carry.v1"


def code_sections(cubin: bytes) -> dict[str, bytes]:
    """The sections of a CUBIN (ELF64) that decide what a module runs: .text.* and their .rel / .rela
    sections, .nv.info*, and the sizes of .nv.shared.* and .nv.constant0.* (NOBITS or zeros: their size is
    what matters). Line tables (-lineinfo), debug sections and symbol / string tables are left out."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise MemraError("not an ELF64 CUBIN")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        return name, typ, off, size

    _, _, stroff, strsize = header(shstrndx)
    names = cubin[stroff:stroff + strsize]
    out: dict[str, bytes] = {}
    for i in range(shnum):
        n, typ, off, size = header(i)
        name = names[n:names.index(b"\0", n)].decode()
        if name.startswith((".text.", ".rel.text.", ".rela.text.", ".nv.info")):
            out[name] = cubin[off:off + size] if typ != 8 else b""  # 8: SHT_NOBITS
        elif name.startswith((".nv.shared.", ".nv.constant0.")):
            out[name] = struct.pack("<Q", size)
    if not any(k.startswith(".text.") for k in out):
        raise MemraError("CUBIN without a .text section")
    return out


def tree_at(rev: str, dest: Path, root: Path) -> Path:
    """kernels/ of commit `rev` of the git checkout at root, extracted under dest; returns that folder."""
    try:
        tar = subprocess.run(["git", "-C", str(root), "archive", rev, "kernels"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        raise MemraError(f"git archive {rev} kernels: {detail.decode(errors='replace').strip() or e}") from None
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        try:
            t.extractall(dest, filter="data")
        except TypeError:  # a Python without extraction filters (before 3.11.4): git's own archive
            t.extractall(dest)
    return dest / "kernels"


def _family_modules(src: str, kernel: str, variant: str, config: Mapping, shape: Mapping) -> list[tuple[str, dict]]:
    from memra.tune.measure import family_module

    hook = getattr(family_module(src), "tune_modules", None)
    if hook is None:
        raise MemraError(f"{src}: its family has no tune_modules hook (the modules a receipt measured are unknown)")
    return hook(kernel, variant, dict(config), dict(shape))


def _path_kernel(kernel: str, variant: str) -> tuple[str, str]:
    """The (kernel, variant) whose module a receipt measured: a dispatch receipt's is its path's own job
    (memra.tune.dispatch.path_job: the path's kernel, _glu for dispatch_glu, variant q8)."""
    if kernel in ("dispatch", "dispatch_glu"):
        return variant + ("_glu" if kernel == "dispatch_glu" else ""), "q8"
    return kernel, variant


def row_modules(r: Mapping, src: str, family: str | None = None) -> dict[tuple, dict]:
    """The modules of kernel file `src` that one receipt / table entry (kernel, variant, config, shape) measured,
    keyed by (file, sorted defines); family: the receipt's src when it joins several files ("a+b"). A failed
    receipt (ok false: a configuration the family refused or that did not build) measured none."""
    out: dict[tuple, dict] = {}
    if not r.get("ok", True):
        return out
    kernel, variant = _path_kernel(r["kernel"], r["variant"])
    if kernel != r["kernel"]:   # a dispatch receipt: the path's own family, whatever src it was filed under
        from memra.tune.dispatch import PATH_SRC
        family = PATH_SRC[r["variant"]]
    for f, d in _family_modules(family or src, kernel, variant, r["config"], r["shape"]):
        if f == src:
            out[(f, tuple(sorted((k, str(v)) for k, v in d.items())))] = dict(d)
    return out


def modules_of(rows: Iterable[Mapping], src: str) -> dict[tuple, dict]:
    """The modules of kernel file `src` that these receipts / table entries measured (row_modules of each)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out.update(row_modules(r, src))
    return out


def receipt_id(r: Mapping) -> str:
    """A tune receipt's identity in a partial carry record: kernel, variant, shape key, batch, config key."""
    return f"{r['kernel']}|{r['variant']}|{r['shape_key']}|{int(r['batch'])}|{r['config_key']}"


def choice_id(c: Mapping) -> str:
    """An engine-choice record's identity in a partial carry record: kernel, shape key, batch, configuration."""
    return f"{c['kernel']}|{c['shape_key']}|{int(c['batch'])}|{json.dumps(dict(c['config']), sort_keys=True)}"


def plan(df, table: Mapping | None, device: str, old_root: Path, new_root: Path | None = None,
         arch: str = "sm_90a", compiler=None, log=print, choices=None) -> list[dict]:
    """Carry records for the device's receipts (a read_receipts DataFrame of kind tune) whose kernel file
    changed between old_root's tree and new_root's (default: kernel_dir()). Every module of a changed file
    that a receipt measured on the older tree's hash, or a table entry on it names, is compiled in both trees
    and compared (code_sections); a file is carried only when all are identical. Entries over several files
    ("a+b+c") are carried when each of their files is unchanged or carried. choices: engine-choice
    records (read_receipts kind engine-choice): their configurations' modules are compared too, with
    the variant of the table entry they name. compiler(root, file, arch, defines) -> cubin: compile one
    by one with it (default: memra.gpu.compile.compile_cubin with root, in parallel processes)."""
    from memra.gpu.compile import source_hash
    from memra.paths import kernel_dir

    new_root = new_root or kernel_dir()
    rows = df[df["device"] == device] if len(df) else df
    srcs = set(rows["src"]) if len(rows) else set()
    singles = {s for s in srcs if "+" not in s}
    hashes: dict[str, tuple[str, str]] = {}   # file -> (older tree's hash, this tree's)
    for f in sorted({p for s in srcs for p in s.split("+")}):
        try:
            hashes[f] = (source_hash(f, old_root), source_hash(f, new_root))
        except MemraError as e:
            log(f"{f}: {e}; not carried")
    entries = [dict(e, kernel=k, shape={**_shape(skey), "batch": int(b)})
               for k, shapes in (table or {}).get("entries", {}).items() for skey, by in shapes.items()
               for b, e in by.items()]
    variant = {(k, skey): e["variant"] for k, shapes in (table or {}).get("entries", {}).items()
               for skey, by in shapes.items() for e in by.values()}
    chosen = []   # (the choice as a table entry, its identity)
    for c in (choices.to_dict("records") if hasattr(choices, "to_dict") else choices or []):
        if c["device"] == device and (c["kernel"], c["shape_key"]) in variant:
            chosen.append(({"kernel": c["kernel"], "variant": variant[(c["kernel"], c["shape_key"])],
                            "config": c["config"], "shape": {**_shape(c["shape_key"]), "batch": int(c["batch"])},
                            "src": c["src"], "src_hash": c["src_hash"]}, choice_id(c)))
    # the receipts of the families whose src joins several files ("a+b": the family of the first, its modules in
    # either file) on their combined hash before the edit: a file's modules among theirs must be unchanged for them
    # to be carried (by the joint branch below), e.g. gemm_f16.cu's under gemm_f16.cu+gemm_f16_wg.cu, a file that
    # is never a receipt's src alone
    joint_old = {j: rows[(rows["src"] == j) & (rows["src_hash"] == combined_hash(hashes[p][0] for p in j.split("+")))]
                 .to_dict("records") for j in sorted(srcs - singles) if all(p in hashes for p in j.split("+"))}
    records, carried = [], {}
    for f, (old, new) in sorted(hashes.items()):
        if old == new:
            continue
        on_old = rows[(rows["src"] == f) & (rows["src_hash"] == old)] if f in singles else rows.iloc[:0]
        joint = [(j, r) for j, rs in joint_old.items() if f in j.split("+") for r in rs]
        if on_old.empty and not joint:
            continue
        recs_old = on_old.to_dict("records")
        ch_old = [(e, cid) for e, cid in chosen if e.get("src") == f and e.get("src_hash") == old]
        try:
            rmods = [row_modules(r, f) for r in recs_old]
            cmods = [row_modules(e, f) for e, _ in ch_old]
            jmods = [row_modules(r, f, family=j) for j, r in joint]
            mods = {k: d for m in rmods + cmods + jmods for k, d in m.items()}
            mods.update(modules_of([e for e in entries if e.get("src") == f and e.get("src_hash") == old], f))
        except MemraError as e:
            log(f"{f}: {e}; not carried")
            continue
        keys = list(mods)
        jobs = [(root, f, arch, mods[k]) for k in keys for root in (old_root, new_root)]
        secs = [code_sections(compiler(*j)) for j in jobs] if compiler else _sections_many(jobs)
        same = {k for k, a, b in zip(keys, secs[0::2], secs[1::2]) if a == b}
        differ = [mods[k] for k in keys if k not in same]
        if not differ:
            carried[f] = (old, new)
            if len(on_old):
                log(f"{f}: {len(mods)} modules identical on {arch}: {len(on_old)} receipts carried {old} -> {new}")
                records.append(_record(f, old, new, device, arch, len(mods), len(on_old)))
            else:
                log(f"{f}: {len(mods)} modules identical on {arch} (its receipts are under a joint src)")
            continue
        if not recs_old and not ch_old:
            log(f"{f}: {len(differ)} of {len(mods)} modules compile to different code (e.g. {differ[0]}); not carried")
            continue
        # partial: the receipts and choices every module of which is identical (a failed receipt measured none:
        # its failure may not hold on the new code, so it is not carried)
        only = [receipt_id(r) for r, m in zip(recs_old, rmods) if m and set(m) <= same]
        only_ch = [cid for (_, cid), m in zip(ch_old, cmods) if m and set(m) <= same]
        if not only and not only_ch:
            log(f"{f}: {len(differ)} of {len(mods)} modules compile to different code (e.g. {differ[0]}); not carried")
            continue
        log(f"{f}: {len(differ)} of {len(mods)} modules compile to different code (e.g. {differ[0]}): "
            f"{len(only)} of {len(recs_old)} receipts and {len(only_ch)} of {len(ch_old)} engine choices carried "
            f"{old} -> {new}, the rest stale")
        records.append({**_record(f, old, new, device, arch, len(same), len(only)), "only": sorted(only),
                        "only_choices": sorted(only_ch)})
    for s in sorted(srcs - singles):
        parts = s.split("+")
        if any(p not in hashes for p in parts) or all(hashes[p][0] == hashes[p][1] for p in parts):
            continue
        if not all(hashes[p][0] == hashes[p][1] or p in carried for p in parts):
            log(f"{s}: a file of it changed and is not carried; not carried")
            continue
        old, new = combined_hash(hashes[p][0] for p in parts), combined_hash(hashes[p][1] for p in parts)
        n = int(((rows["src"] == s) & (rows["src_hash"] == old)).sum())
        if n:
            log(f"{s}: each file unchanged or carried: {n} receipts carried {old} -> {new}")
            records.append(_record(s, old, new, device, arch, 0, n))
    return records


def _sections_job(job) -> dict[str, bytes]:
    from memra.gpu.compile import compile_cubin

    root, f, arch, defines = job
    return code_sections(compile_cubin(f, arch, defines, root=root))


def _sections_many(jobs: list[tuple]) -> list[dict[str, bytes]]:
    """code_sections of each (root, file, arch, defines) job, compiled in parallel processes (spawned: the
    parent may hold a CUDA context); one by one where they cannot start."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    workers = min(os.cpu_count() or 1, len(jobs))
    if workers > 1:
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
                return list(ex.map(_sections_job, jobs, chunksize=4))
        except BrokenProcessPool:
            pass
    return [_sections_job(j) for j in jobs]


def _shape(skey: str) -> dict:
    from memra.tune.receipts import shape_of_key

    return shape_of_key(skey)


def _record(src: str, old: str, new: str, device: str, arch: str, modules: int, receipts: int) -> dict:
    from memra.gpu.compile import nvrtc_version
    from memra.tune.receipts import git_sha, utc_now

    return {"schema": SCHEMA, "src": src, "from_hash": old, "to_hash": new, "device": device, "arch": arch,
            "modules": modules, "receipts": receipts, "nvrtc": "%d.%d" % nvrtc_version(), "git_sha": git_sha(),
            "ts": utc_now()}


def _records(carries) -> list[dict]:
    return carries.to_dict("records") if hasattr(carries, "to_dict") else list(carries)


def _partial(r: Mapping) -> bool:
    """Whether a carry record names the receipts it carries (`only`; a DataFrame row of a full record holds NaN)."""
    return isinstance(r.get("only"), list) or isinstance(r.get("only_choices"), list)


def hash_map(carries) -> dict[tuple[str, str, str], str]:
    """(device, src, from_hash) -> the newest hash it carries to, chains followed (a read_receipts
    DataFrame of kind carry, or records; partial records are left to apply)."""
    recs = [r for r in _records(carries) if not _partial(r)]
    step = {(r["device"], r["src"], r["from_hash"]): (r["to_hash"], str(r["ts"]))
            for r in sorted(recs, key=lambda r: str(r["ts"]))}
    out = {}
    for (dev, src, h) in step:
        path, cur = [h], h
        while (dev, src, cur) in step:
            nxt = step[(dev, src, cur)][0]
            if nxt in path:   # a file put back as it was (a carry there and back): the cycle's newest record's end
                cycle = path[path.index(nxt):]
                cur = max((step[(dev, src, x)] for x in cycle), key=lambda t: t[1])[0]
                break
            cur = nxt
            path.append(cur)
        out[(dev, src, h)] = cur
    return out


def apply(df, carries, ident=None):
    """df (receipts with device, src, src_hash columns) with each src_hash a carry record maps replaced by
    the hash it carries to; unchanged without carries. A partial record maps only the rows it names:
    ident(row) (default receipt_id; choice_id for engine choices) in its `only` (`only_choices`) list; full
    records are followed after it, and partial ones again, until nothing moves."""
    if carries is None or not len(carries) or not len(df):
        return df
    ident = ident or receipt_id
    key = "only_choices" if ident is choice_id else "only"
    m = hash_map(carries)
    part = {}
    for r in sorted((r for r in _records(carries) if _partial(r)), key=lambda r: str(r["ts"])):
        names = r.get(key) if isinstance(r.get(key), list) else []
        part[(r["device"], r["src"], r["from_hash"])] = (r["to_hash"], set(names))
    out = []
    for row in df.to_dict("records"):
        h, seen = row["src_hash"], set()
        while (row["device"], row["src"], h) not in seen:
            seen.add((row["device"], row["src"], h))
            h = m.get((row["device"], row["src"], h), h)
            p = part.get((row["device"], row["src"], h))
            if p is None or ident(row) not in p[1]:
                break
            h = p[0]
        out.append(h)
    df = df.copy()
    df["src_hash"] = out
    return df


def read_current(sources) -> tuple:
    """(tune receipts, engine-choice records) of `sources` (read_receipts DataFrames), each src_hash the hash its
    carry records in `sources` carry it to: what freeze reads, and what a further carry starts from."""
    from memra.tune.receipts import read_receipts

    carries = read_receipts(sources, kinds=("carry",))
    return (apply(read_receipts(sources, kinds=("tune",)), carries),
            apply(read_receipts(sources, kinds=("engine-choice",)), carries, choice_id))


def write(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
