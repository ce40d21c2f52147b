#!/usr/bin/env python3
"""sass_compare: kernels/gemm_tile.cu against the prototypes' exact-chain builds (CPU only).

For every weight type x timed configuration x {plain, glu}: NVRTC (sm_90a, memra's options, -I kernels/
and the source's folder, ptxas -v) of gemm_tile.cu and of the prototype's GT_FORM 1 (split-K 1) build of
the same configuration, then static SASS instruction counts per opcode class (nvdisasm) in
  loop  = the stage loop (the outermost loop holding IMMAs: the K loop, refill and scalar pass included),
  inner = the innermost IMMA loop (the pair / half loop when GT_PU / GT_SU leave it rolled),
  rest  = the function outside the stage loop (prologue, epilogue),
and registers / spills / dynamic shared memory (launch.py's formula, checked against the prototype's).

    python3 experiments/tile_land/sass_compare.py            # the table (sass_compare.txt)
    python3 experiments/tile_land/sass_compare.py -v         # plus the opcode-level differences of each loop

Prototypes: experiments/gemm_tile2/gemm_tile2.cu (Q4_K; gemm_tile, gemm_tile_glu), gemm_tile2_q40.cu
(GT_QT 2 / 8; gemm_q40[_glu], gemm_q80[_glu]), gemm_tile2_q6k.cu (gemm_tile_q6k, plain only: the new glu
entry is compared with the prototype's plain kernel).
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]
import launch  # noqa: E402
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
from tile import ptxas_info  # noqa: E402
from tile import compile_module as _compile  # noqa: E402


def compile_module(src: Path, defs: dict) -> tuple[bytes, str]:
    return _compile(defs, src)

if not shutil.which("nvdisasm"):
    try:
        import nvidia.cu13 as _cu  # the pip wheel's binaries
        os.environ["PATH"] = str(Path(list(_cu.__path__)[0]) / "bin") + os.pathsep + os.environ["PATH"]
    except Exception:
        pass

NEW = ROOT / "kernels" / "gemm_tile.cu"
P_K4 = ROOT / "experiments/gemm_tile2/gemm_tile2.cu"
P_Q40 = ROOT / "experiments/gemm_tile2_q40/gemm_tile2_q40.cu"
P_Q6K = ROOT / "experiments/gemm_tile2_q6k/gemm_tile2_q6k.cu"

CLASSES = (
    ("IMMA", r"^IMMA"), ("HMMA", r"^HMMA"), ("LDS", r"^LDS(\.|$)"), ("LDSM", r"^LDSM"), ("LDGSTS", r"^LDGSTS"),
    ("STS", r"^STS"), ("LDG", r"^LDG(\.|$)"), ("STG", r"^STG"), ("I2F", r"^I2F"), ("FFMA", r"^FFMA"),
    ("FMUL", r"^FMUL"), ("FADD", r"^FADD"), ("MUFU", r"^MUFU"), ("f16cvt", r"^(HADD2|F2F|HMUL2)"),
    ("BAR", r"^(BAR|DEPBAR|LDGDEPBAR)"), ("BRA", r"^(BRA|BRX|BSSY|BSYNC|BREAK|WARPSYNC|EXIT|CALL|RET)"),
    ("intALU", r"^(LOP3|SHF|IADD3|IMAD|PRMT|SGXT|BMSK|ISETP|LEA|SEL|IMNMX|FLO|POPC|BREV|IABS|VIADD|VIMNMX|P2R|R2P"
               r"|PLOP3|FSEL|FSETP|FSETP|UIADD3|ULOP3|USHF|UIMAD|ULEA|USEL|UISETP|UMOV|ULDC|S2R|S2UR|R2UR|UPRMT|USEL)"),
    ("MOV", r"^(MOV|CS2R)"), ("LDL/STL", r"^(LDL|STL)"),
)
KEYS = [k for k, _ in CLASSES] + ["pad", "other", "total"]


def disasm(cubin: bytes, fn: str) -> list[str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(["nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout
    body = out.split(f".text.{fn}:")[1].split(".text.")[0]
    ins = []
    for line in body.splitlines():
        if re.match(r"^\.L\w+:", line.strip()):
            ins.append(line.strip())
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            ins.append(re.sub(r"/\*[0-9a-f]*\*/|\s+", " ", line).strip().rstrip(" ;"))
    return ins


def opcode(s: str) -> str:
    s = re.sub(r"^@!?U?P\w+\s+", "", s.strip())
    return s.split()[0] if s else ""


def classify(seg: list[str]) -> dict:
    c = {k: 0 for k in KEYS}
    for s in seg:
        if s.startswith(".L"):
            continue
        if s.startswith("@!PT "):   # never executed (predicate constant false): ptxas fill, e.g. @!PT LDS RZ, [RZ]
            c["pad"] += 1
            c["total"] += 1
            continue
        op = opcode(s)
        for k, p in CLASSES:
            if re.search(p, op):
                c[k] += 1
                break
        else:
            c["other"] += 1
        c["total"] += 1
    return c


def loops(ins: list[str]) -> list[tuple[int, int]]:
    out = []
    for h, s in enumerate(ins):
        if s.startswith(".L"):
            lab = s.rstrip(":")
            be = [i for i in range(h + 1, len(ins)) if re.search(r"\bBRA\b", ins[i]) and f"({lab})" in ins[i]]
            if be:
                out.append((h, be[-1]))
    return out


def segments(ins: list[str]) -> dict:
    lp = loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    outer = max(with_imma, key=lambda hb: hb[1] - hb[0])
    inner = min(with_imma, key=lambda hb: hb[1] - hb[0])
    seg = {"loop": ins[outer[0]:outer[1] + 1],
           "inner": ins[inner[0]:inner[1] + 1] if inner != outer else [],
           "rest": ins[:outer[0]] + ins[outer[1] + 1:]}
    return seg


# (type, config name, new-file defines, prototype source, prototype defines, prototype plain / glu entries)
def cases():
    out = []
    G24, G22 = {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 2}, {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}
    # tile2 F1 timed: 2,4,2 pf2 (the default), 2,2,3 (pf1); 2,2,3 pf2 (F0 timed) is the spill-free 2,2,3
    for name, g, pf in (("2,4,2 pf2", G24, 2), ("2,2,3 pf1", G22, 1), ("2,2,3 pf2", G22, 2)):
        out.append(("Q4_K", name, {"MV_TYPE": 12, **g, "GT_PF": pf}, P_K4, {**g, "GT_FORM": 1, "GT_PF": pf},
                    ("gemm_tile", "gemm_tile_glu")))
    for qt, tn in ((2, "Q4_0"), (8, "Q8_0")):
        fns = ("gemm_q40", "gemm_q40_glu") if qt == 2 else ("gemm_q80", "gemm_q80_glu")
        cfgs = [("2,4,2 pf2", G24, 2, 1), ("2,4,2 pf1", G24, 1, 1), ("2,2,3 pf2", G22, 2, 1)]
        if qt == 2:
            cfgs.append(("2,2,2 pf1 minb2", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 2}, 1, 2))
        for name, g, pf, mb in cfgs:
            out.append((tn, name, {"MV_TYPE": qt, **g, "GT_PF": pf, "GT_MINB": mb}, P_Q40,
                        {"GT_QT": qt, **g, "GT_FORM": 1, "GT_PF": pf, "GT_MINB": mb}, fns))
    for name, g in (("2,4,2 pf1", G24), ("2,2,3 pf1", G22)):
        out.append(("Q6_K", name, {"MV_TYPE": 14, **g, "GT_PF": 1}, P_Q6K, {**g, "GT_FORM": 1, "GT_PF": 1},
                    ("gemm_tile_q6k", "gemm_tile_q6k")))
    return out


def proto_smem(src: Path, defs: dict) -> int:
    """The prototype's own SMEM_TOTAL formula (GT_FORM 1), for the cross-check of launch.py's."""
    wm, wn, ns = defs["GT_WM"], defs["GT_WN"], defs["GT_STAGES"]
    bm, bn = 64 * wm, 32 * wn
    if src == P_K4:
        return ns * (bm * 144 + bn * 272 + bm * 16 + bn * 64) + 2 * (8 * bm * 12 + 8 * bn * 8)
    if src == P_Q40:
        rb = 128 if defs["GT_QT"] == 2 else 256
        return ns * (bm * (rb + 16) + bn * 272 + bm * 16 + bn * 64) + 2 * (8 * bm * 8 + 8 * bn * 4)
    return ns * (bm * 208 + bn * 272 + bm * 20 + bn * 64) + 2 * (8 * bm * 8 + bm * 4 + 8 * bn * 4)


def fmt(c: dict) -> str:
    return " ".join(f"{c[k]:5d}" for k in KEYS)


def diff_ops(a: list[str], b: list[str]) -> str:
    ca = collections.Counter(opcode(s) for s in a if not s.startswith(".L"))
    cb = collections.Counter(opcode(s) for s in b if not s.startswith(".L"))
    d = {k: cb[k] - ca[k] for k in set(ca) | set(cb) if cb[k] != ca[k]}
    return ", ".join(f"{k} {v:+d}" for k, v in sorted(d.items(), key=lambda kv: (-abs(kv[1]), kv[0]))) or "none"


def main() -> int:
    verbose = "-v" in sys.argv
    head = " ".join(f"{k[:5]:>5s}" for k in KEYS)
    print("SASS classes (static instruction counts; sm_90a) — new = kernels/gemm_tile.cu, "
          "proto = the prototype's GT_FORM 1 split-K-1 build of the same configuration")
    print(f"{'type':5s} {'config':16s} {'kind':5s} {'seg':5s} {'build':5s} | {head}")
    compile_rows = []
    summary = []
    cache = {}
    for tn, name, nd, psrc, pd, pfns in cases():
        ncub, nlog = compile_module(NEW, nd)
        key = (str(psrc), tuple(sorted(pd.items())))
        if key not in cache:
            cache[key] = compile_module(psrc, pd)
        pcub, plog = cache[key]
        ggml = nd["MV_TYPE"]
        cfg = {k: v for k, v in nd.items() if k != "MV_TYPE"}
        smem = launch.smem_bytes(ggml, cfg)
        psm = proto_smem(psrc, pd)
        for kind, fn, pfn in (("plain", "gemm_tile", pfns[0]), ("glu", "gemm_tile_glu", pfns[1])):
            r, sp = ptxas_info(nlog, fn)
            pr, psp = ptxas_info(plog, pfn)
            compile_rows.append((tn, name, kind, r, sp, smem, pr, psp, psm))
            ns, ps = segments(disasm(ncub, fn)), segments(disasm(pcub, pfn))
            for seg in ("loop", "inner", "rest"):
                cn, cp = classify(ns[seg]), classify(ps[seg])
                if seg == "loop":
                    summary.append((tn, name, kind, cp, cn))
                print(f"{tn:5s} {name:16s} {kind:5s} {seg:5s} proto | {fmt(cp)}")
                print(f"{tn:5s} {name:16s} {kind:5s} {seg:5s} new   | {fmt(cn)}")
                dl = {k: cn[k] - cp[k] for k in KEYS if cn[k] != cp[k]}
                print(f"{'':5s} {'':16s} {'':5s} {seg:5s} delta | "
                      + (" ".join(f"{k} {v:+d}" for k, v in dl.items()) if dl else "identical"))
                if verbose and dl:
                    print(f"{'':34s}opcodes: {diff_ops(ps[seg], ns[seg])}")
            print(flush=True)
    work = ("IMMA", "HMMA", "LDSM", "LDS", "LDGSTS", "STS", "LDG", "STG", "I2F", "FFMA", "FMUL", "FADD", "MUFU",
            "f16cvt", "BAR", "LDL/STL")
    print("summary, stage loop (static): the data-path classes " + "/".join(work)
          + " new vs proto; then the address / control classes (intALU, MOV, BRA, pad = never-executed @!PT"
          " fill, other) and the total")
    for tn, name, kind, cp, cn in summary:
        dw = {k: cn[k] - cp[k] for k in work if cn[k] != cp[k]}
        da = {k: cn[k] - cp[k] for k in ("intALU", "MOV", "BRA", "pad", "other") if cn[k] != cp[k]}
        print(f"{tn:5s} {name:16s} {kind:5s} IMMA {cn['IMMA']:4d} | data path: "
              + (" ".join(f"{k} {v:+d}" for k, v in dw.items()) if dw else "equal")
              + " | addr/ctrl: " + (" ".join(f"{k} {v:+d}" for k, v in da.items()) if da else "equal")
              + f" | total {cp['total']} -> {cn['total']} ({100.0 * (cn['total'] - cp['total']) / cp['total']:+.1f} %)")
    print()
    print("compile table (new file; proto = the prototype's same configuration; smem = launch.py's formula, "
          "proto smem = the prototype's)")
    print(f"{'type':5s} {'config':16s} {'kind':5s} {'regs':>4s} {'spill':>5s} {'smem':>7s} | {'proto regs':>10s} "
          f"{'spill':>5s} {'smem':>7s}")
    ok = True
    for tn, name, kind, r, sp, smem, pr, psp, psm in compile_rows:
        print(f"{tn:5s} {name:16s} {kind:5s} {r:4d} {sp:5d} {smem:7d} | {pr:10d} {psp:5d} {psm:7d}"
              + ("" if smem == psm else "  SMEM MISMATCH"))
        ok &= smem == psm
    spills = [f"{tn} {name} {kind} ({sp} B)" for tn, name, kind, r, sp, *_ in compile_rows if sp]
    print("smem formula (launch.py) = the prototypes' for every build" if ok else "FAIL: smem formula")
    print("builds with spills: " + (", ".join(spills) if spills else "none"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
