#!/usr/bin/env python3
"""sass_count: registers, spills and the per-unit instruction count of mvt.cu's K loop, on the CPU.

Compiles mvt.cu through NVRTC (sm_90a, the options mvt_check.py uses, plus ptxas -v), disassembles
mvt_q8 with nvdisasm and counts the warp instructions one unit costs on the common path: from
the loop head (the label the K loop's back-edge jumps to) to the end of the last n tile's
accumulation, without the producer's empty-slot skip loop (a self-loop, taken only when a slot
ends), plus the consumer's advance up to its first branch. Slot merges (once per slot, i.e.
every nu / 32 units) are left out. With both n tiles live (nb > 8 at TN 2).

    python3 experiments/mvt/sass_count.py                      # the README's table
    python3 experiments/mvt/sass_count.py MV_TYPE=12 MVT_TN=1  # one module (extra -D as K=V)
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# nvdisasm: the CUDA toolkit's, else the nvidia-cuda wheel's (pip)
if not shutil.which("nvdisasm"):
    try:
        import nvidia.cu13 as _cu  # the pip wheel's binaries
        os.environ["PATH"] = str(Path(list(_cu.__path__)[0]) / "bin") + os.pathsep + os.environ["PATH"]
    except Exception:
        pass
KDIR = HERE.parents[1] / "kernels"
# the mvt.cu to count: kernels/mvt.cu, or MVT_SRC=<file> (a variant beside it; headers from kernels/)
SRC = Path(os.environ["MVT_SRC"]) if os.environ.get("MVT_SRC") else None


def compile_cubin(defs: dict) -> tuple[bytes, str]:
    from cuda.core import Program, ProgramOptions

    opts = ProgramOptions(name="mvt.cu", arch="sm_90a", std="c++17", lineinfo=True, include_path=[str(KDIR)],
                          define_macro=[(k, str(v)) for k, v in sorted(defs.items())], ptxas_options=["-v"])
    log = io.StringIO()
    obj = Program((SRC or KDIR / "mvt.cu").read_text(), "c++", opts).compile("cubin", logs=log)
    return bytes(obj.code), log.getvalue()


def regs(log: str, fn: str = "mvt_q8") -> tuple[int, int]:
    part = log.split(f"Compiling entry function '{fn}'")[1]
    r = int(re.search(r"Used (\d+) registers", part).group(1))
    sp = re.search(r"(\d+) bytes spill stores", part)
    return r, int(sp.group(1)) if sp else 0


def disasm(cubin: bytes, fn: str) -> list[str]:
    """The SASS of function fn, one entry per instruction (offset comments and the trailing ';'
    stripped) or label ('.L_x_N:'), in order."""
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
    """An instruction's opcode with its predicate guard dropped ("@!P0 BRA x" -> "BRA")."""
    s = re.sub(r"^@!?U?P\w+\s+", "", s.strip())
    return s.split()[0] if s else ""


def classify(seg: list[str], classes) -> dict:
    """Instructions of seg (labels skipped) by the first of classes ((name, opcode regex), ...)
    that matches, plus "other" and "total"."""
    c = {k: 0 for k, _ in classes}
    c["other"] = c["total"] = 0
    for s in seg:
        if s.startswith(".L"):
            continue
        op = opcode(s)
        for k, p in classes:
            if re.search(p, op):
                c[k] += 1
                break
        else:
            c["other"] += 1
        c["total"] += 1
    return c


# SASS classes of a GEMM-like K loop (experiments/gemm_v9, gemm_v10, gemm_tile): (name, opcode regex)
GEMM_CLASSES = (
    ("IMMA", r"^IMMA"), ("LDS", r"^LDS(\.|$)"), ("LDSM", r"^LDSM"), ("LDGSTS", r"^LDGSTS"), ("STS", r"^STS"),
    ("I2F", r"^I2F"), ("FFMA", r"^FFMA"), ("FMUL", r"^FMUL"), ("FADD", r"^FADD"), ("f16cvt", r"^(HADD2|F2F|HMUL2)"),
    ("SHFL", r"^SHFL"), ("BAR", r"^(BAR|DEPBAR|LDGDEPBAR)"),
    ("BRA", r"^(BRA|BRX|BSSY|BSYNC|BREAK|WARPSYNC|EXIT|CALL|RET)"),
    ("intALU", r"^(LOP3|SHF|IADD3|IMAD|PRMT|SGXT|BMSK|ISETP|LEA|SEL|IMNMX|FLO|POPC|BREV|IABS|VIADD|VIMNMX|P2R|R2P|PLOP3|FSEL|FSETP|UIADD3|ULOP3|USHF|UIMAD|ULEA|USEL|UISETP|UMOV|ULDC|S2R|S2UR|R2UR)"),
    ("MOV", r"^(MOV|CS2R)"),
)


def loops(ins: list[str]) -> list[tuple[int, int]]:
    """(head, back-edge) index pairs of nvdisasm lines: a label and the last branch back to it from below."""
    out = []
    for h, s in enumerate(ins):
        if s.startswith(".L"):
            lab = s.rstrip(":")
            be = [i for i in range(h + 1, len(ins)) if re.search(r"\bBRA\b", ins[i]) and f"({lab})" in ins[i]]
            if be:
                out.append((h, be[-1]))
    return out


def basic_blocks(lines: list[str]) -> list[list[str]]:
    """Split nvdisasm lines into basic blocks: at labels and after branches / exits."""
    out, cur = [], []
    for s in lines:
        if s.startswith(".L") and cur:
            out.append(cur)
            cur = []
        cur.append(s)
        if re.search(r"\b(BRA|BRX|EXIT)\b", s):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def unit_segment(ins: list[str]) -> tuple[list[str], list[str]]:
    """The common path of one K-loop unit in disasm's list: the body (loop head to the first
    label after the loop copy's last IMMA, the producer's empty-slot self-loops left out) and
    the advance (from there to the next branch)."""
    is_lab = lambda s: s.startswith(".L")
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    # loop head: a label before the first IMMA that a later branch jumps back to
    head = back = None
    for h in reversed([i for i in range(imma[0]) if is_lab(ins[i])]):
        lab = ins[h].rstrip(":")
        be = [i for i in range(imma[0], len(ins)) if "BRA" in ins[i] and f"({lab})" in ins[i]]
        if be:
            head, back = h, be[-1]
            break
    # end of the unit body: the first label after the last IMMA of this loop copy
    last = max(i for i in imma if i < back)
    end = next(i for i in range(last, back) if is_lab(ins[i]))
    # self-loops inside the body (the producer's empty-slot skip): excluded
    skip = set()
    for i in range(head, end):
        if is_lab(ins[i]):
            lab = ins[i].rstrip(":")
            for j in range(i + 1, end):
                if "BRA" in ins[j] and f"({lab})" in ins[j]:
                    skip.update(range(i, j + 1))
    body = [ins[i] for i in range(head, end) if i not in skip and not is_lab(ins[i])]
    adv = []
    for i in range(end, back + 1):
        if is_lab(ins[i]):
            continue
        adv.append(ins[i])
        if "BRA" in ins[i]:
            break
    return body, adv


def unit_count(cubin: bytes, fn: str = "mvt_q8") -> dict:
    body, adv = unit_segment(disasm(cubin, fn))
    kinds = {k: sum(1 for s in body if re.search(p, s)) for k, p in
             (("IMMA", r"IMMA"), ("LDG", r"LDG"), ("float", r"^(@\S+ )?(FFMA|FMUL|FADD|I2FP|HADD2)"))}
    return {"unit": len(body) + len(adv), **kinds}


TABLE = [  # (label, defines)
    ("Q4_K TN2", {"MV_TYPE": 12, "MVT_TN": 2}), ("Q4_K TN1", {"MV_TYPE": 12, "MVT_TN": 1}),
    ("Q4_K TN2 KPERM", {"MV_TYPE": 12, "MVT_TN": 2, "MVT_KPERM": 1}),
    ("Q4_K TN2 no JFIX", {"MV_TYPE": 12, "MVT_TN": 2, "MVT_JFIX": 0}),
    ("Q4_K TN2 no PIN", {"MV_TYPE": 12, "MVT_TN": 2, "MVT_PIN": 0}),
    ("Q6_K TN2", {"MV_TYPE": 14, "MVT_TN": 2}), ("Q6_K TN1", {"MV_TYPE": 14, "MVT_TN": 1}),
    ("Q4_0 TN2", {"MV_TYPE": 2, "MVT_TN": 2}), ("Q4_0 TN1", {"MV_TYPE": 2, "MVT_TN": 1}),
    ("Q8_0 TN2", {"MV_TYPE": 8, "MVT_TN": 2}), ("Q8_0 TN1", {"MV_TYPE": 8, "MVT_TN": 1}),
    ("Q5_K TN2", {"MV_TYPE": 13, "MVT_TN": 2}), ("IQ4_XS TN2", {"MV_TYPE": 23, "MVT_TN": 2}),
]


def main() -> int:
    rows = TABLE
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        rows = [(" ".join(sys.argv[1:]), d)]
    print(f"{'module (WK 8, PF 2, MINB 2 unless given)':42s} {'regs':>5s} {'spill':>6s} {'instr/unit':>10s} "
          f"{'IMMA':>5s} {'LDG':>4s} {'float':>6s}")
    for name, defs in rows:
        cub, log = compile_cubin(defs)
        r, sp = regs(log)
        c = unit_count(cub)
        print(f"{name:42s} {r:5d} {sp:6d} {c['unit']:10d} {c['IMMA']:5d} {c['LDG']:4d} {c['float']:6d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
