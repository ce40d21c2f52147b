"""Every kernel launch the engine can make, read off the launch plan: the set `memra
kernel-check` runs and compiles, and that its receipt records.

    specs = model_specs()                       # the real models' and the benchmarks' shapes
    cases = launch_set(specs, [table])          # {key: case}, deduplicated
    launch_modules(cases)                       # (kernel file, defines) to compile (memra.gpu.modules)

For every model, every table (the built-in defaults and the tables given: a device's own,
so each tuned configuration is launched) and every rollback seam the runner reads
(MEMRA_MATVEC_PATH q8 / f32, MEMRA_FUSED_ROPE on / off, a q8_0 KV cache, MEMRA_GEMM when the GEMM family
exists, MEMRA_MVT when the mvt family exists, MEMRA_ATTN=fa and hybrid when the attn_fa family exists,
hybrid with MEMRA_TILE=0 when the gemm_tile family exists too, and hybrid with MEMRA_PROMPT_GEMM=tile
when the gemm_f16 family does: its prompt steps launch gemm_tile where the default's launch gemm_f16; hybrid with
MEMRA_DECODE=qf when the qf family does: its generated rows launch qf where the default's launch mv_q8's order), the planner (memra.gpu.plan) lists
its launches: decode steps at every CUDA-graph bucket with each sampler (none, greedy, sample), prefill chunks of 1 to 8 rows (every matvec
batch, and mvt's 8-row bucket), of 9 and 15 rows (mvt's two-tile bucket) and of 16, 17, 64, 65
and 128 rows (the GEMM's configurations) and of 512 (the largest chunk), and the head over every
gathered-row path (memra.gpu.modules.HEAD_ROWS: 1 to 9, 15-17, 32, 33, 64) (with the quantize_q8
launch that runner._head makes outside the plan). Each family module (memra/gpu/ops/) maps a
plan launch to the cases that run exactly its module: `launch_cases(L, ctx)` gives the entry
point, the -D defines the launcher would build, the row bucket, and what `check_launch`
needs to run it on random inputs against the family's reference.

A case's key is (family, entry point, defines, bucket, tag): the tag names a run-time path
the same module takes differently (a residual aliased with the output, a sliding window, a
post-norm...). The bucket is the row count for matvec launches (1..8: the module's MV_B
and the masked rows), else the row count's power of two up to 8: a kernel's code does not
depend on the rows beyond the grid, whose extent tests/gpu_emulator.py checks for every
launch against the kernel's launch contract.

Table entries of shapes no listed model has are launched too (`table_cases`), so every
configuration a device table holds is executed by kernel-check.
"""

from __future__ import annotations

import json
import logging
from typing import Iterable, Mapping, Sequence

# a plan's launches and their modules (memra.gpu.modules: below the harness, the runner compiles them ahead of use)
from memra.gpu.modules import FAMILY_MODULE, PlanContext, family_module, launch_modules, plan_cases  # noqa: F401

log = logging.getLogger("memra.kernelcheck")

# the real models and the synthetic shapes the benchmarks and GPU tests run
MODELS = ("smollm2-135m", "gemma3-270m", "synth:llama3-8b:Q4_K_M", "synth:llama3-8b:Q4_0",
          "synth:llama3-8b:Q8_0", "synth:llama-1b:Q4_0", "synth:tiny-llama:Q4_K_M", "synth:tiny-qwen2:Q8_0",
          "synth:tiny-qwen3:Q4_0", "synth:tiny-gemma3:Q4_K_M")


def case_key(case: Mapping) -> str:
    return json.dumps([case["family"], case["entry"], sorted(case["defines"].items()), case["bucket"],
                       case.get("tag", "")], separators=(",", ":"))


# MEMRA_MODEL_SPECS (docs/FLAGS.md): a JSON file of models' specs (spec_json: the config and every tensor's type,
# all a launch set reads of a model) for a machine that lacks the real files (a device reached through a transfer
# limit: the real models, and the tokenizer the tiny synthetic shapes take their vocabulary from);
# `python3 -m memra kernel-check --export-specs FILE` writes it where the models are. CI's `--status` rebuilds the
# launch set from the models themselves, so a spec that drifted from its model shows as uncovered cases.
SPECS_ENV = "MEMRA_MODEL_SPECS"


def spec_json(spec) -> dict:
    from dataclasses import asdict

    return {"name": spec.name, "cfg": asdict(spec.cfg), "types": dict(sorted(spec.types.items()))}


def spec_from_json(d: Mapping):
    from memra.gpu.plan import ModelSpec
    from memra.model.config import ModelConfig

    cfg = dict(d["cfg"])
    cfg["swa_layers"] = tuple(cfg.get("swa_layers") or ())
    return ModelSpec(d["name"], ModelConfig(**cfg), dict(d["types"]))


def _exported_specs() -> dict:
    import os
    from pathlib import Path

    f = os.environ.get(SPECS_ENV, "").strip()
    if not f:
        return {}
    try:
        return {d["name"]: d for d in json.loads(Path(f).read_text(encoding="utf-8"))}
    except (OSError, ValueError, KeyError, TypeError) as e:
        from memra.errors import MemraError

        raise MemraError(f"{SPECS_ENV}={f}: not a readable spec file ({e})") from None


def export_specs(path, names: Sequence[str] = MODELS) -> list[str]:
    """Write the specs (spec_json) of `names` (real models pulled where missing) to `path`, for MEMRA_MODEL_SPECS on
    a machine without the files; the names written."""
    from pathlib import Path

    from memra.atomic import write_atomic
    from memra.tune.campaign import model_info

    docs = [spec_json(model_info(n)) for n in names]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(path), (json.dumps(docs, sort_keys=True) + "\n").encode())
    return [d["name"] for d in docs]


def model_specs(names: Sequence[str] = MODELS, fetch: bool = False, from_specs: list | None = None):
    """(specs, missing): ModelSpec of each model that can be read here (a real model's
    header, a synthetic model's shapes), else (without `fetch`) its exported spec where
    MEMRA_MODEL_SPECS holds one (its name appended to `from_specs`), and 'name: why' for those
    that cannot. An alias not in the model cache is fetched only with `fetch` (kernel-check
    never downloads)."""
    from memra.model.aliases import ALIASES
    from memra.paths import models_dir
    from memra.tune.campaign import model_info

    specs, missing = [], []
    exported = _exported_specs()
    took = from_specs if from_specs is not None else []
    for n in names:
        if n in ALIASES and not fetch and not (models_dir() / ALIASES[n].filename).is_file():
            if n in exported:
                specs.append(spec_from_json(exported[n]))
                took.append(n)
                continue
            missing.append(f"{n}: not in {models_dir()} (memra pull {n})")
            continue
        try:
            specs.append(model_info(n))
        except Exception as e:
            if n in exported and not fetch:   # e.g. a tiny synthetic shape whose vocabulary is a real tokenizer's
                specs.append(spec_from_json(exported[n]))
                took.append(n)
                continue
            missing.append(f"{n}: {type(e).__name__}: {e}")
    return specs, missing


def family_available(family: str) -> bool:
    """Whether a kernel family exists with its launch-set hooks (launch_cases, check_launch)."""
    m = family_module(family)
    return m is not None and hasattr(m, "launch_cases") and hasattr(m, "check_launch")


def _plans(spec, table, sms: int):
    from memra.gpu.plan import Planner

    # (gemm, mvt) on the q8 path: both seams off, the default (both on), MEMRA_MVT=0 alone (the
    # matvec at 2..15 rows beside the GEMM); MEMRA_GEMM=0 alone loads no module these do not
    for path in ("q8", "f32"):
        for fuse in (True, False):
            seams = [(False, False)]
            if path == "q8":
                if family_available("gemm"):
                    seams += [(True, True), (True, False)] if family_available("mvt") else [(True, False)]
                elif family_available("mvt"):
                    seams += [(False, True)]
            for gemm, mvt in seams:
                yield path, gemm, Planner(spec, table, path=path, fuse_rope=fuse, sms=sms, gemm=gemm, mvt=mvt)
        # MEMRA_ATTN=fa: attention on attn_fa.cu (RoPE unfused either way), the default seams
        gemm, mvt = (family_available("gemm"), family_available("mvt")) if path == "q8" else (False, False)
        plan = Planner(spec, table, path=path, sms=sms, gemm=gemm, mvt=mvt, fa=family_available("attn_fa"))
        if plan.use_fa:
            yield path, gemm, plan
            # MEMRA_ATTN=hybrid: prompt rows on attn_fa, generated rows on attn_decode (both
            # launches in a step holding both kinds: memra.gpu.modules.plan_launches)
            for fuse in (True, False):
                yield path, gemm, Planner(spec, table, path=path, fuse_rope=fuse, sms=sms, gemm=gemm, mvt=mvt,
                                          hybrid=True, tile=family_available("gemm_tile"))
            # MEMRA_TILE=0: hybrid with every row's matmuls in mv_q8's order
            if family_available("gemm_tile") and path == "q8":
                yield path, gemm, Planner(spec, table, path=path, sms=sms, gemm=gemm, mvt=mvt, hybrid=True, tile=False)
            # MEMRA_PROMPT_GEMM=tile (the rollback): hybrid with the prompt rows' matmuls on the tile's
            # chain order where the default puts them on gemm_f16
            if family_available("gemm_f16") and family_available("gemm_tile") and path == "q8":
                yield path, gemm, Planner(spec, table, path=path, sms=sms, gemm=gemm, mvt=mvt, hybrid=True,
                                          prompt_gemm="tile")
            # MEMRA_DECODE=qf: hybrid with the generated rows' matmuls on kernels/qf.cu where it takes the weight
            if family_available("qf") and family_available("gemm_tile") and path == "q8":
                yield path, gemm, Planner(spec, table, path=path, sms=sms, gemm=gemm, mvt=mvt, hybrid=True,
                                          decode="qf")
        # a q8_0 KV cache (K and V; --cache-type-k/-v q8_0): the rope and attention modules built
        # for it (KV_K_Q8 / KV_V_Q8), RoPE fused and not, the default seams
        if spec.cfg.head_dim % 32 == 0:
            for fuse in (True, False):
                yield path, gemm, Planner(spec, table, path=path, fuse_rope=fuse, sms=sms, gemm=gemm, mvt=mvt,
                                          cache_type_k="q8_0", cache_type_v="q8_0")


def _add(cases: dict, fam: str, c: dict, source: str) -> None:
    c = {"family": fam, **c}
    key = case_key(c)
    if key not in cases:
        c["sources"] = []
        cases[key] = c
    if source not in cases[key]["sources"] and len(cases[key]["sources"]) < 8:
        cases[key]["sources"].append(source)


def launch_set(specs: Iterable, tables: Sequence[Mapping] = (), sms: int = 132,
               families: Sequence[str] | None = None, other_entries: bool = True) -> dict[str, dict]:
    """{key: case} over every model, table (the built-in defaults always included), path,
    fusion and step of the module doc, then (other_entries) the table entries no model
    reached."""
    from memra.tune.tables import builtin_table

    tabs = [builtin_table()] + [t for t in tables if t and t.get("entries")]
    cases: dict[str, dict] = {}
    mods = {f: family_module(f) for f in FAMILY_MODULE}
    for spec in specs:
        for ti, table in enumerate(tabs):
            tname = "builtin" if ti == 0 else str(table.get("device") or table.get("path"))
            for path, gemm, plan in _plans(spec, table, sms):
                for fam, L, c in plan_cases(PlanContext(spec.cfg, plan, path), gemm, mods, families):
                    _add(cases, fam, c, f"{spec.name} {tname} {path}: {L.name} x{L.rows}")
    for table in tabs[1:] if other_entries else ():
        for fam, L, ctx, source in table_cases(table, sms):
            if families is not None and fam not in families:
                continue
            for c in mods[fam].launch_cases(L, ctx):
                _add(cases, fam, c, source)
    return dict(sorted(cases.items()))


def table_cases(table: Mapping, sms: int = 132):
    """(family, launch, context, source) for each table entry, as the planner would make it
    for a model of that shape (heads: full rotary, no Q/K norm or bias, no window). Entries
    the planner would refuse (a split-K matvec, a variant another path runs, heads per block
    that do not divide the group) are left out, as the engine leaves them."""
    from types import SimpleNamespace

    from memra.gpu.ops import matvec as MV
    from memra.gpu.plan import Launch
    from memra.tune.receipts import shape_of_key

    for kernel, shapes in sorted(table.get("entries", {}).items()):
        for skey, by_batch in sorted(shapes.items()):
            shape = shape_of_key(skey)
            for b, e in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
                cfg, rows, src = dict(e["config"]), int(b), f"table {table.get('device')}: {kernel} [{skey}] b{b}"
                if kernel in ("matvec", "matvec_glu"):
                    t = MV.type_id(shape["type"])
                    q8 = e["variant"] == "q8"
                    if cfg.get("MV_KSPLIT", 1) != 1 or (q8 and t in MV.FLOAT_TYPES):
                        continue
                    glu = "silu" if kernel == "matvec_glu" else None
                    ctx = PlanContext(SimpleNamespace(), None, "q8" if q8 else "f32")
                    for nb in sorted({min(rows, 8), max(1, min(rows, 8) - 1)}):
                        if not q8 and t not in MV.FLOAT_TYPES and nb > 1:
                            continue
                        L = Launch(kernel, "matvec", kernel, e["variant"], shape, nb, cfg, kernel, -1,
                                   {"glu": glu, "q8": q8, "res": None})
                        yield "matvec", L, ctx, src
                elif kernel in ("mvt", "mvt_glu"):
                    if family_available("mvt") and e["variant"] == "q8":
                        L = Launch(kernel, "mvt", kernel, "q8", shape, rows, cfg, kernel, -1,
                                   {"glu": "silu" if kernel == "mvt_glu" else None, "q8": True, "res": None})
                        yield "mvt", L, PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("gemm", "gemm_glu"):
                    if family_available("gemm") and e["variant"] == "q8":
                        L = Launch(kernel, "gemm", kernel, "q8", shape, rows, cfg, kernel, -1,
                                   {"glu": "silu" if kernel == "gemm_glu" else None, "q8": True, "res": None})
                        yield "gemm", L, PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("gemm_tile", "gemm_tile_glu"):
                    if family_available("gemm_tile") and e["variant"] == "chain":
                        L = Launch(kernel, "gemm_tile", kernel, "chain", shape, rows, cfg, kernel, -1,
                                   {"glu": "silu" if kernel == "gemm_tile_glu" else None, "q8": True, "res": None})
                        yield "gemm_tile", L, PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("gemm_f16", "gemm_f16_glu"):
                    if family_available("gemm_f16") and e["variant"] == "f16":
                        L = Launch(kernel, "gemm_f16", kernel, "f16", shape, rows, cfg, kernel, -1,
                                   {"glu": "silu" if kernel == "gemm_f16_glu" else None, "q8": False, "res": None})
                        yield "gemm_f16", L, PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("qf", "qf_glu"):
                    if family_available("qf") and e["variant"] == "qf":
                        L = Launch(kernel, "qf", kernel, "qf", shape, rows, cfg, kernel, -1,
                                   {"glu": "silu" if kernel == "qf_glu" else None, "q8": False, "res": None})
                        yield "qf", L, PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("rope_norm_kv", "attn_decode"):
                    # a model of these heads with the plain facts (full rotary, no Q/K norm or bias)
                    from memra.gpu.ops import attention as ATT

                    D, nh, nkv = int(shape["head_dim"]), int(shape["n_head"]), int(shape["n_head_kv"])
                    cfg_ns = SimpleNamespace(head_dim=D, n_head=nh, n_head_kv=nkv, n_gqa=nh // nkv, rope_dim=D,
                                             rope_neox=False, qk_norm=False, has_rope_freqs=False, qkv_bias=False)
                    if kernel == "rope_norm_kv":
                        L = Launch(kernel, "rope", kernel, "default", shape, rows, cfg, "heads", -1, {})
                        yield "rope", L, PlanContext(cfg_ns, None, "q8"), src
                    else:
                        hpb = int(cfg.get("hpb", 0)) or ATT.heads_per_block(nkv, nh // nkv)
                        if (nh // nkv) % hpb:
                            continue
                        plan_ns = SimpleNamespace(att_hpb=hpb,
                                                  n_splits=int(cfg.get("splits", 0)) or ATT.default_splits(nh // hpb, sms))
                        L = Launch(kernel, "attention_rope", kernel, "default", shape, rows, cfg, "attention", -1,
                                   {"window": 0, "twin": D % 32 == 0})
                        yield "attention", L, PlanContext(cfg_ns, plan_ns, "q8"), src
                elif kernel == "quantize_q8":
                    yield "matvec", Launch(kernel, "quantize", kernel, "default", shape, rows, cfg, "", -1,
                                           {"K": int(shape["n"])}), PlanContext(SimpleNamespace(), None, "q8"), src
                elif kernel in ("rmsnorm", "add_rmsnorm"):
                    op = "norm" if kernel == "rmsnorm" else "add_norm"
                    args = {"w": "w"} if op == "norm" else {"w": "w", "delta": "t1", "w_post": "wp"}
                    yield "norm", Launch(kernel, op, kernel, "default", shape, rows, cfg, "rows", -1, args), \
                        PlanContext(SimpleNamespace(n_embd=int(shape["n"])), None, "q8"), src
                elif kernel == "embed":
                    yield "embed", Launch(kernel, "embed", kernel, "default", shape, rows, cfg, "embed"), \
                        PlanContext(SimpleNamespace(n_embd=int(shape["n"])), None, "q8"), src
                elif kernel == "argmax":
                    yield "sample", Launch(kernel, "argmax", kernel, "default", shape, rows, cfg, "vocab"), \
                        PlanContext(SimpleNamespace(n_vocab=int(shape["n"])), None, "q8"), src
                elif kernel == "act_mul":
                    yield "act", Launch(kernel, "act_mul", kernel, "default", shape, rows, cfg, "ffn"), \
                        PlanContext(SimpleNamespace(n_ff=int(shape["n"]), act="silu"), None, "q8"), src


# a table kernel's launch entry points (prefix), and a dispatch entry's path's entry point: what
# unexecuted_entries looks for among the cases
ENTRY_OF = {"matvec": "mv_", "matvec_glu": "mv_", "attn_decode": "attn_decode", "rope_norm_kv": "rope_norm_kv",
            "rmsnorm": "rmsnorm", "add_rmsnorm": "add_rmsnorm", "embed": "embed_", "argmax": "argmax_partial",
            "quantize_q8": "quantize_q8", "gemm": "gemm_q8", "gemm_glu": "gemm_q8_glu", "mvt": "mvt_q8",
            "mvt_glu": "mvt_q8_glu", "gemm_tile": "gemm_tile", "gemm_tile_glu": "gemm_tile_glu",
            "gemm_f16": "gemm_f16", "gemm_f16_glu": "gemm_f16_glu", "qf": "qf_", "qf_glu": "qf_"}
PATH_OF = {"dispatch": {"matvec": "mv_q8", "mvt": "mvt_q8", "gemm": "gemm_q8"},
           "dispatch_glu": {"matvec": "mv_q8_glu", "mvt": "mvt_q8_glu", "gemm": "gemm_q8_glu"}}


def unexecuted_entries(table: Mapping, cases: Iterable[Mapping]) -> list[str]:
    """The entries of `table` that no case of `cases` (launch_set over it) runs with the entry's tunables in its
    defines — a launcher that drops a tunable, or an entry no plan reaches, leaves the table saying what the engine
    does not do (session 47: quantize_q8 / rmsnorm PDL triggers the launchers did not pass). A dispatch entry names
    the path a shape runs at a row bucket: some case of that weight type, K and bucket runs that path's kernel with the
    entry's configuration (the launch set merges launches that differ only in N, so N is not compared); an attention
    entry's switch (and its short module) is the row filter of its cases (params), its switch0 that of some
    attn_short.cu case."""
    from memra.gpu.ops import attention as ATT
    from memra.gpu.ops.matvec import TYPES as MV_TYPES

    type_id = {v[0]: k for k, v in MV_TYPES.items()}
    cases = list(cases)
    out = []
    for kernel, shapes in table.get("entries", {}).items():
        for skey, by_batch in shapes.items():
            for b, e in by_batch.items():
                want = {("N_GQA" if k == "hpb" else k): v for k, v in e["config"].items()
                        if k not in ("switch", "short", "switch0", "short0")}
                switch, switch0 = e["config"].get("switch"), e["config"].get("switch0")
                if kernel in PATH_OF:
                    shp = dict(kv.split("=") for kv in skey.split(","))
                    entry = PATH_OF[kernel].get(e.get("variant"))
                    hit = entry is not None and any(
                        c["entry"] == entry and c["bucket"] == int(b)
                        and c["params"].get("type") == type_id.get(shp.get("type"))
                        and c["params"].get("K") == int(shp["cols"])
                        and all(c["defines"].get(k) == v for k, v in want.items()) for c in cases)
                    if not hit:
                        out.append(f"{kernel} [{skey}] b{b} {e.get('variant')} {e['config']}")
                    continue
                pre = ENTRY_OF.get(kernel)
                hit = pre is not None and any(
                    c["entry"].startswith(pre) and all(c["defines"].get(k) == v for k, v in want.items())
                    and (switch is None or c["params"].get("switch") == switch) for c in cases)
                if hit and switch0 is not None:   # its first module: attn_short's cases at that switch
                    hit = any(c["entry"].startswith(pre) and c["file"] == ATT.SHORT_FILE
                              and c["params"].get("switch") == switch0 for c in cases)
                if not hit:
                    out.append(f"{kernel} [{skey}] b{b} {e['config']}")
    return out


def summary(cases: Mapping[str, Mapping]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in cases.values():
        out[c["family"]] = out.get(c["family"], 0) + 1
    return dict(sorted(out.items()))
