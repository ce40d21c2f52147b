"""Tuning campaigns: TOML specs → jobs (kernel × variant × config × shape) → receipts.

A campaign (`tune/campaigns/*.toml`, format in tune/campaigns/README.md) names kernel
families, their variants, a grid of `-D` tunables (every combination is a config), and
shapes: explicit ones, and/or `ops` taken from models (`--model`): every matvec a model
decodes with (fused QKV, attention output, fused gate+up, down, output — each with its
tensor's GGUF type), its attention shapes at the campaign's context lengths, its
n_embd-wide row ops and its vocabulary-wide ops, each at the decode batch buckets. The
GEMM kernels, the prompt tile and the f16 prompt GEMM (PLAN_BATCH_KERNELS) take theirs per batch
from the plan's step at that many rows: the (shape, batch) pairs the engine launches through each.

`run_campaign` is the CPU half of `memra tune`: it skips what was already measured (same
device, kernel source hash, job) when resuming, calls the injected `measure(job)` (the
GPU half: compile, check against the CPU reference, time), turns each result into a
receipt and appends it at once, so an interrupted campaign loses at most one measurement.
"""

from __future__ import annotations

import itertools
import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from gguf.constants import GGMLQuantizationType

from memra.gpu.plan import ModelSpec
from memra.errors import MemraError
from memra.paths import read_text
from memra.tune.receipts import (append_receipts, config_key, iter_receipts, make_receipt, shape_batch,
                                 shape_key)
from memra.tune.tables import BATCH_BUCKETS
from memra.tune.tables import src_hash as kernel_src_hash

log = logging.getLogger("memra.tuning")

MATVEC_OPS = ("qkv", "attn_output", "gate_up", "down", "output")
# attention: {n_head, n_head_kv, head_dim, ctx} per context length (clipped to the sliding
# window on local layers); heads: {n_head, n_head_kv, head_dim} (rope / q-k norm / KV
# append); rows: {n: n_embd} (norms, residual adds); ffn: {n: n_ff} (gated activation);
# embed: {type, n: n_embd} (row gather from the token table); vocab: {n: n_vocab} (sampling)
OTHER_OPS = ("attention", "heads", "rows", "ffn", "embed", "vocab")
ALL_OPS = MATVEC_OPS + OTHER_OPS
DEFAULT_CTX = (512, 4096)
# Kernels the plan picks by the step's row count: the q8 path's matvecs run as the
# tensor-core GEMM (memra.gpu.ops.gemm) from GEMM_MIN_ROWS rows, and the skinny tensor-core
# matvec (memra.gpu.ops.mvt) from 2 rows below that, on quantized weights. Their
# model-derived jobs are the (shape, batch) pairs the plan's step at that many rows launches
# (plan_shapes), not every op shape at every batch.
# The prompt rows' GEMMs of MEMRA_ATTN=hybrid plans likewise: the weights a hybrid plan's prompt step
# at that many rows runs through the f16 prompt GEMM (memra.gpu.ops.gemm_f16: those it supports,
# under MEMRA_PROMPT_GEMM=f16, the default) and through the tile (memra.gpu.ops.gemm_tile: the
# others it supports, or those it supports under MEMRA_PROMPT_GEMM=tile).
# And the generated rows' matmuls of MEMRA_DECODE=qf (memra.gpu.ops.qf): the weights a hybrid plan with decode "qf"
# runs through qf in its decode step at that many rows (a step of generated rows above 64: verification, forced runs).
PLAN_BATCH_KERNELS = ("gemm", "gemm_glu", "mvt", "mvt_glu", "gemm_tile", "gemm_tile_glu", "gemm_f16",
                      "gemm_f16_glu", "qf", "qf_glu")
_PROMPT_OPS = ("gemm_tile", "gemm_f16")   # the hybrid prompt step's launches plan_shapes adds


class CampaignError(MemraError):
    """A campaign spec that is malformed or cannot be expanded."""


@dataclass(frozen=True)
class Job:
    kernel: str
    variant: str
    config: dict
    shape: dict  # includes "batch"
    src: str  # kernel source file under kernels/
    ops: tuple[str, ...] = ()  # where the shape comes from, e.g. ('smollm2-135m:qkv',)
    campaign: str = ""
    reps: int | None = None

    def key(self) -> tuple:
        return (self.kernel, self.variant, config_key(self.config), shape_key(self.shape),
                shape_batch(self.shape))

    def label(self) -> str:
        return (f"{self.kernel}/{self.variant} [{config_key(self.config) or 'default'}] "
                f"{shape_key(self.shape)} b{shape_batch(self.shape)}")


# ---------------------------------------------------------------- model shapes


SYNTH_PREFIX = "synth:"  # synth:SHAPE:QUANT, as `memra bench` spells a synthetic model


class _Header:
    """read_config's view of a GGUF header that exists only as metadata and tensor names."""

    def __init__(self, path: str, arch: str, metadata: dict, tensors: Mapping):
        self.path, self.arch, self.metadata, self.tensors = path, arch, metadata, tensors

    def tensor(self, name: str):
        raise CampaignError(f"{self.path}: tensor {name} is not available from a synthetic header")


def synth_info(spec: str) -> ModelSpec:
    """Shapes of a synthetic model (synth:SHAPE:QUANT) from its shape's hyper-parameters
    and the synthesizer's tensor plan: the same config and tensor types as the file `memra
    bench` would make, without making it."""
    from memra.model.config import read_config
    from memra.model.synth import header

    parts = spec[len(SYNTH_PREFIX):].split(":")
    if len(parts) != 2 or not all(parts):
        raise CampaignError(f"{spec!r}: a synthetic model is spelled synth:SHAPE:QUANT "
                            f"(e.g. synth:llama3-8b:Q4_K_M)")
    arch, meta, tensors = header(*parts)
    # the file's tokenizer gives n_vocab; the header leaves the tokenizer out, so say it here
    n_vocab = next(tp.shape[0] for tp in tensors if tp.name == "token_embd.weight")
    meta = {**meta, f"{arch}.vocab_size": n_vocab}
    cfg = read_config(_Header(spec, arch, meta, {tp.name: tp for tp in tensors}))
    return ModelSpec(spec, cfg, {tp.name: tp.ggml_type.name for tp in tensors})


def model_info(name_or_path: str) -> ModelSpec:
    """A model's shapes: an alias or GGUF path (header read only), or synth:SHAPE:QUANT."""
    from memra.model.aliases import resolve
    from memra.model.config import read_config
    from memra.model.gguf import open_gguf

    if name_or_path.startswith(SYNTH_PREFIX):
        return synth_info(name_or_path)
    g = open_gguf(resolve(name_or_path))
    name = name_or_path if not os.path.exists(name_or_path) else Path(name_or_path).stem
    return ModelSpec(name, read_config(g), {n: t.type_name for n, t in g.tensors.items()})


def plan_shapes(m: ModelSpec, rows: int) -> list[tuple[str, str, dict]]:
    """(op, kernel, shape) of every launch of the step the engine runs over `rows` token
    rows, read off the launch plan (built-in configurations): a decode step (greedy sampler)
    up to the largest CUDA-graph bucket, a prefill chunk (no head) above it, up to
    PREFILL_CHUNK rows (the most one step runs). The step's row count decides some kernels:
    the q8 path's matvecs run as the tensor-core GEMM from GEMM_MIN_ROWS rows. Then the
    gemm_f16 and gemm_tile launches of a MEMRA_ATTN=hybrid plan's prompt step of `rows` rows
    (MEMRA_PROMPT_GEMM picks between them; none when the model has no weight either takes), and the qf launches
    of a MEMRA_DECODE=qf plan's step of generated rows (MEMRA_QF_HEAD: the head's too), which no other kernel's list
    depends on."""
    from memra.gpu.plan import MAX_ROWS, PREFILL_CHUNK, Planner

    if not 1 <= rows <= PREFILL_CHUNK:
        raise CampaignError(f"batch {rows}: the engine runs 1..{PREFILL_CHUNK} rows a step "
                            f"(decode up to {MAX_ROWS}, prefill chunks of up to {PREFILL_CHUNK})")
    plan = Planner(m)
    steps = plan.step(rows, decode=True, sampler="greedy") if rows <= MAX_ROWS else plan.step(rows, decode=False)
    seen: dict[tuple, tuple[str, str, dict]] = {}
    for L in steps:
        if L.rows == rows:  # a matvec's 8-row chunks are launches of their own row count
            seen.setdefault((L.group, L.kernel, shape_key(L.shape)), (L.group, L.kernel, dict(L.shape)))
    hybrid = Planner(m, hybrid=True)
    for L in hybrid.step(rows, decode=False, kinds="p") if hybrid.use_tile else ():
        if L.op in _PROMPT_OPS and L.rows == rows:
            seen.setdefault((L.group, L.kernel, shape_key(L.shape)), (L.group, L.kernel, dict(L.shape)))
    qf = Planner(m, hybrid=True, decode="qf")
    gen = () if not qf.qf_keys else qf.step(rows, decode=True, sampler="greedy") if rows <= MAX_ROWS else \
        qf.step(rows, decode=False, kinds="g")
    for L in gen:
        if L.op == "qf" and L.rows == rows:
            seen.setdefault((L.group, L.kernel, shape_key(L.shape)), (L.group, L.kernel, dict(L.shape)))
    return list(seen.values())


def model_shapes(m: ModelSpec, ctx: Iterable[int] = DEFAULT_CTX) -> list[tuple[str, dict]]:
    """(op, shape without batch) for every distinct shape the model decodes with, read off
    its launch plan (memra.gpu.plan, built-in configurations: a shape does not depend on
    the table): the decode step at one row, and the prefill step's separate RoPE launch.
    The op is the launch's campaign group (qkv, attn_output, gate_up, down, output,
    attention, heads, rows, ffn, embed, vocab); attention shapes come at each of the
    campaign's context lengths, clipped to the sliding window on local layers."""
    from memra.gpu.plan import Planner

    plan = Planner(m)
    seen: dict[tuple, tuple[str, dict]] = {}

    def add(op: str, shape: dict):
        seen.setdefault((op, shape_key(shape)), (op, shape))

    for L in plan.step(1, decode=True, sampler="greedy") + plan.step(2, decode=False):
        if L.kernel == "attn_decode":
            w = L.args["window"]
            for n in ctx:
                add("attention", {**plan.heads, "ctx": min(n, w) if w else n})
        else:
            add(L.group, dict(L.shape))
    return list(seen.values())


# ---------------------------------------------------------------- specs

_TOP_KEYS = {"name", "description", "batches", "ctx", "reps", "kernels"}
_KERNEL_KEYS = {"name", "src", "variants", "grid", "configs", "shapes", "ops", "types", "batches", "reps"}


def load_campaign(path: str | os.PathLike) -> dict:
    """Parse and check a campaign TOML file."""
    path = Path(path)
    text = read_text(path, error=CampaignError)
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(f"{path}: not valid TOML ({e})") from None
    spec.setdefault("name", path.stem)
    check_campaign(spec, str(path))
    return spec


def _ints(v, what: str, where: str) -> list[int]:
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool)
                                                   and x > 0 for x in v):
        raise CampaignError(f"{where}: {what} must be a non-empty list of positive integers")
    return v


def _reps(v, where: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise CampaignError(f"{where}: reps must be a positive integer, got {v!r}")


def check_campaign(spec: Mapping, where: str = "campaign") -> None:
    unknown = set(spec) - _TOP_KEYS
    if unknown:
        raise CampaignError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_TOP_KEYS)})")
    for k in ("batches", "ctx"):
        if k in spec:
            _ints(spec[k], k, where)
    if "reps" in spec:
        _reps(spec["reps"], where)
    kernels = spec.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        raise CampaignError(f"{where}: no [[kernels]] entries")
    for i, k in enumerate(kernels):
        kw = f"{where}: kernels[{i}]"
        if not isinstance(k, dict):
            raise CampaignError(f"{kw} is not a table")
        unknown = set(k) - _KERNEL_KEYS
        if unknown:
            raise CampaignError(f"{kw}: unknown keys {sorted(unknown)} (known: {sorted(_KERNEL_KEYS)})")
        if not isinstance(k.get("name"), str) or not k["name"]:
            raise CampaignError(f"{kw}: 'name' (the kernel family) is missing")
        kw = f"{where}: kernel {k['name']}"
        v = k.get("variants")
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise CampaignError(f"{kw}: 'variants' must be a non-empty list of names")
        for name, values in (k.get("grid") or {}).items():
            if not isinstance(values, list) or not values or not all(
                    isinstance(x, (int, float, str, bool)) for x in values):
                raise CampaignError(f"{kw}: grid {name} must be a non-empty list of values")
        listed = k.get("configs", [])
        if not isinstance(listed, list) or not all(
                isinstance(c, dict) and set(c) - {"batches"} and all(
                    isinstance(x, (int, float, str, bool)) for n, x in c.items() if n != "batches")
                for c in listed):
            raise CampaignError(f"{kw}: 'configs' must be a list of non-empty tables of tunables")
        for c in listed:
            if "batches" in c:
                _ints(c["batches"], "'configs' batches", kw)
        ops = k.get("ops", [])
        bad = [o for o in ops if o not in ALL_OPS]
        if bad:
            raise CampaignError(f"{kw}: unknown ops {bad} (known: {', '.join(ALL_OPS)})")
        shapes = k.get("shapes", [])
        if not isinstance(shapes, list) or not all(isinstance(s, dict) and s for s in shapes):
            raise CampaignError(f"{kw}: 'shapes' must be a list of tables")
        types = k.get("types", [])
        if not isinstance(types, list):
            raise CampaignError(f"{kw}: 'types' must be a list of GGUF tensor types")
        for t in [s["type"] for s in shapes if "type" in s] + types:
            if not isinstance(t, str) or t.upper() not in GGMLQuantizationType.__members__:
                raise CampaignError(f"{kw}: unknown tensor type {t!r} (GGUF types such as Q4_0, Q4_K, Q8_0, F16)")
        if not shapes and not ops:
            raise CampaignError(f"{kw}: give 'shapes', or 'ops' to take shapes from --model")
        if "batches" in k:
            _ints(k["batches"], "batches", kw)
        if "reps" in k:
            _reps(k["reps"], kw)


def configs(grid: Mapping[str, list], listed: Iterable[Mapping] = ()) -> list[dict]:
    """Every combination of the grid's values (one empty config for an empty grid), then
    the explicitly listed configs not already among them. Listed configs alone (no grid)
    are just those: a handful of candidates where a grid's product would be too many. A
    listed config may keep a `batches` list (the batches it is tried at; see _at_batch)."""
    names = sorted(grid)
    listed = [dict(c) for c in listed]
    out = [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))] \
        if grid or not listed else []
    seen = {config_key(c) for c in out}
    for c in listed:
        key = config_key({n: v for n, v in c.items() if n != "batches"})
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _at_batch(cfg: dict, batch: int) -> dict | None:
    """A config as tried at `batch` (its `batches` key dropped), or None when it lists
    batches without this one."""
    if "batches" not in cfg:
        return cfg
    return {n: v for n, v in cfg.items() if n != "batches"} if batch in cfg["batches"] else None


def expand_campaign(spec: Mapping, models: Iterable[ModelSpec] = (), *,
                    kernels: Iterable[str] | None = None) -> list[Job]:
    """The campaign's jobs, in a stable order: per kernel entry, shape, batch, variant, config.
    `kernels` restricts to those families. Shapes appearing in several models are measured
    once, with every source listed in the job's `ops`."""
    models = list(models)
    check_campaign(spec)
    keep = set(kernels) if kernels is not None else None
    if keep is not None:
        unknown = keep - {k["name"] for k in spec["kernels"]}
        if unknown:
            raise CampaignError(f"campaign {spec.get('name')}: no kernels named {sorted(unknown)}")
    derived = [(m, model_shapes(m, spec.get("ctx", DEFAULT_CTX))) for m in models]
    per_rows: dict[tuple[int, int], list] = {}  # (model index, rows) -> plan_shapes

    def launched(i: int, rows: int) -> list:
        if (i, rows) not in per_rows:
            per_rows[(i, rows)] = plan_shapes(models[i], rows)
        return per_rows[(i, rows)]

    jobs: list[Job] = []
    for k in spec["kernels"]:
        if keep is not None and k["name"] not in keep:
            continue
        batches = k.get("batches", spec.get("batches", list(BATCH_BUCKETS)))
        shapes: dict[str, tuple[dict, list[str]]] = {}
        for s in k.get("shapes", []):
            shapes.setdefault(shape_key(s), ({x: v for x, v in s.items() if x != "batch"}, []))
        # (shape key, batch) pairs the plan launches a PLAN_BATCH_KERNELS kernel at
        at_batch: set[tuple[str, int]] | None = None
        if k.get("ops"):
            if not models:
                raise CampaignError(f"campaign {spec.get('name')}: kernel {k['name']} takes its "
                                    f"shapes from a model ({', '.join(k['ops'])}): pass --model")
            types = set(k.get("types", [])) or None

            def wanted(op, s):
                return op in k["ops"] and (types is None or "type" not in s or s["type"] in types)

            if k["name"] in PLAN_BATCH_KERNELS:
                at_batch = set()
                for i, m in enumerate(models):
                    for b in batches:
                        for op, kernel, s in launched(i, b):
                            if kernel == k["name"] and wanted(op, s):
                                src = f"{m.name}:{op}"
                                lst = shapes.setdefault(shape_key(s), (s, []))[1]
                                if src not in lst:
                                    lst.append(src)
                                at_batch.add((shape_key(s), b))
            else:
                for m, pairs in derived:
                    for op, s in pairs:
                        if wanted(op, s):
                            shapes.setdefault(shape_key(s), (s, []))[1].append(f"{m.name}:{op}")
        grid = configs(k.get("grid") or {}, k.get("configs", []))
        explicit = {shape_key(x) for x in k.get("shapes", [])}
        for _, (s, ops) in sorted(shapes.items()):
            explicit_batch = [b["batch"] for b in k.get("shapes", []) if shape_key(b) == shape_key(s)
                              and "batch" in b]
            for b in explicit_batch or batches:
                if at_batch is not None and shape_key(s) not in explicit and (shape_key(s), b) not in at_batch:
                    continue  # the plan does not launch this kernel on this shape at b rows
                for variant in k["variants"]:
                    for cfg in (x for x in (_at_batch(c, b) for c in grid) if x is not None):
                        jobs.append(Job(kernel=k["name"], variant=variant, config=cfg,
                                        shape={**s, "batch": b}, src=k.get("src", f"{k['name']}.cu"),
                                        ops=tuple(ops), campaign=spec.get("name", ""),
                                        reps=k.get("reps", spec.get("reps"))))
    return jobs


# ---------------------------------------------------------------- runner


def _done_keys(path: Path, device: str, timing: str | None = None) -> set[tuple]:
    done = set()
    if path.exists():
        for _, r in iter_receipts(path):
            if r["device"] == device and r.get("timing") == timing:
                done.add((r["kernel"], r["variant"], config_key(r["config"]), shape_key(r["shape"]),
                          shape_batch(r["shape"]), r["src_hash"]))
    return done


def run_campaign(jobs: Iterable[Job], measure: Callable[[Job], Mapping], out_path: str | os.PathLike,
                 *, context: Mapping, resume: bool = False,
                 src_hash: Callable[[str], str] | None = None,
                 progress: Callable[[int, int, Job, dict | None], None] | None = None) -> dict:
    """Measure each job and append its receipt to `out_path`.

    context: the device facts every receipt carries — device, cc, sms, nvrtc, and
    optionally peak_gbps (the measured copy bandwidth), git_sha and timing ("pdl": measured
    with programmatic dependent launches, memra.tune.measure; absent: plain launches).
    measure(job) -> {ok, max_err, error, median_us, p20_us, p80_us, reps, bytes}: it checks
    the configuration against the CPU reference first and times it only when the check
    passes. A MemraError it raises (e.g. CompileError) is recorded as a failed receipt.
    resume: skip jobs already in `out_path` for this device, kernel source hash and timing
    (failed ones too: the same source fails the same way).
    progress(done, total, job, receipt or None when skipped) is called after each job.
    Returns counts: measured, failed, skipped."""
    src_hash = src_hash or kernel_src_hash
    jobs = list(jobs)
    out_path = Path(out_path)
    done = _done_keys(out_path, context["device"], context.get("timing")) if resume else set()
    hashes: dict[str, str] = {}
    counts = {"measured": 0, "failed": 0, "skipped": 0}
    for i, job in enumerate(jobs, 1):
        if job.src not in hashes:
            hashes[job.src] = src_hash(job.src)
        h = hashes[job.src]
        if (*job.key(), h) in done:
            counts["skipped"] += 1
            if progress:
                progress(i, len(jobs), job, None)
            continue
        try:
            result = dict(measure(job))
        except MemraError as e:
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        ok = bool(result.get("ok"))
        if not ok:
            # never timed: keep only what the check found
            result = {"ok": False, "max_err": result.get("max_err"),
                      "error": result.get("error") or "check failed (no error text given)"}
        receipt = make_receipt(
            kernel=job.kernel, variant=job.variant, config=job.config, shape=job.shape,
            src=job.src, src_hash=h, device=context["device"], cc=context["cc"],
            sms=context["sms"], nvrtc=context["nvrtc"], peak_gbps=context.get("peak_gbps"),
            git_sha=context.get("git_sha"), campaign=job.campaign, ops=list(job.ops),
            **({"timing": context["timing"]} if context.get("timing") else {}),
            **{k: result.get(k) for k in ("ok", "median_us", "p20_us", "p80_us", "reps",
                                          "bytes", "max_err", "error")})
        append_receipts(out_path, [receipt])
        counts["measured" if ok else "failed"] += 1
        if not ok:
            log.info("tune: %s failed: %s", job.label(), receipt["error"].splitlines()[0])
        if progress:
            progress(i, len(jobs), job, receipt)
    return counts
