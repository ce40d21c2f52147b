"""Tables of where the GEMM kernels' warps stall, from the ncu exports of experiments/gemm_tile/prof.sh
(research/2026-12-02-session15/prof: ncu-sass-{1..4}.csv.gz, ncu-raw.csv.gz). Stdlib + numpy/pandas.

    python3 experiments/gemm_tile/ncu_report.py [PROF_DIR] [--top 25] [--producers 8]

Per launch: warp-stall samples by reason, the top instructions by samples, samples per code region
(and per reason within a region), the nearest writers of the registers the top short_sb / long_sb /
wait instructions touch, and derived counters from the raw page.

Regions are heuristic, from the SASS (no line info in the export): loops are the backward branches;
the tile kernel (launches 1, 2) = prologue | K-stage loop [activation cp.async (up to LDGDEPBAR) |
weight staging (LDG, unpack, STS of the next stage) | k32 loop | min-term HMMA tail] | epilogue;
kernels/gemm.cu (3, 4) = prologue | slot loop [two unit loops, each: cp.async (W, x, scales) | row
scalars (meta unpack) | k32 body] + slot merge | epilogue. Inside a k32 body: LDSM/LDS = fragment
loads, IMMA, I2F/FMUL/FFMA/FADD = formula, LOP3/SHF/PRMT feeding an IMMA = weight unpack, else
address/loop. BAR/DEPBAR and any instruction whose samples are mostly 'barrier' = barrier.
A stall sample is charged to the instruction the warp waits to issue (the consumer).
"""
import argparse
import csv
import gzip
import io
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

LAUNCHES = {1: "gemm_tile_glu 2,4,3 tcm nb=512", 2: "gemm_tile_glu 2,4,3 nb=512",
            3: "gemm.cu gemm_q8_glu nb=512", 4: "gemm.cu gemm_q8_glu nb=64"}
TILE = {1, 2}
REASONS = ["short_sb", "long_sb", "wait", "barrier", "lg", "mio", "math", "dispatch", "not_selected",
           "selected", "branch_resolving", "no_inst", "imc", "drain", "membar", "misc", "tex", "sleep"]


def load_sass(path: Path) -> pd.DataFrame:
    lines = gzip.open(path, "rt").read().splitlines()
    rows = list(csv.reader(lines[1:]))
    hdr, body = rows[0], []
    for r in rows[1:]:
        if r[0] == "Kernel Name":   # the export repeats the function; keep the first copy
            break
        body.append(r)
    df = pd.DataFrame(body, columns=hdr)
    out = pd.DataFrame({"addr": df["Address"].map(lambda a: int(a, 16)), "src": df["Source"].str.strip()})
    out["samples"] = df["Warp Stall Sampling (All Samples)"].astype(int)
    out["exec"] = df["Instructions Executed"].astype(int)
    for r in REASONS:
        out[r] = df["stall_" + r].astype(int) if "stall_" + r in df else 0
    out["idx"] = (out["addr"] - out["addr"].iloc[0]) // 16
    out["op"] = out["src"].str.replace(r"^@!?U?P\w+\s+", "", regex=True).str.split().str[0]
    out["base"] = out["op"].str.split(".").str[0]
    return out.reset_index(drop=True)


# ---- registers (dests, srcs) of a SASS line, with vector widths ----
NODEST = {"STS", "STG", "ST", "STL", "LDGSTS", "BAR", "BRA", "DEPBAR", "LDGDEPBAR", "EXIT", "RED", "BSSY",
          "BSYNC", "WARPSYNC", "NOP", "CALL", "RET"}


def _width(op: str) -> int:
    for suf, w in ((".128", 4), (".64", 2)):
        if suf in op:
            return w
    if op.startswith("LDSM"):
        return int(op.rsplit(".", 1)[1])
    if op.startswith(("IMMA", "HMMA")):
        return 4
    if op.startswith(("CS2R", "IMAD.WIDE")):
        return 2
    return 1


def _expand(tok: str, w: int) -> set:
    out = set()
    for m in re.finditer(r"\bR(\d+)(\.64)?", tok):
        n = int(m.group(1))
        k = 2 if m.group(2) else w
        out |= {n + i for i in range(k)}
    return out


def regs(src: str):
    s = re.sub(r"^@!?U?P\w+\s+", "", src).rstrip(" ;")
    op, _, rest = s.partition(" ")
    ops = [o.strip() for o in re.split(r",\s*(?![^\[]*\])", rest) if o.strip()]
    base = op.split(".")[0]
    dst, srcs = set(), set()
    if not ops:
        return dst, srcs
    if base in ("IMMA", "HMMA"):
        dst = _expand(ops[0], 4)
        for o, w in zip(ops[1:], (4, 2, 4)):
            srcs |= _expand(o, w)
        return dst, srcs
    first = 0 if base in NODEST else 1
    if first:
        dst = _expand(ops[0], _width(op) if base in ("LDS", "LDSM", "LDG", "LD", "LDL", "CS2R", "IMAD") else 1)
    for o in ops[first:]:
        w = _width(op) if (base in ("STS", "STG", "ST") and "[" not in o) else 1
        srcs |= _expand(o, w)
    return dst, srcs


def loops(df: pd.DataFrame):
    """(start idx, end idx) of every executed backward branch."""
    out = []
    for i, r in df[df["base"] == "BRA"].iterrows():
        m = re.search(r"0x([0-9a-f]+)\s*$", r["src"])
        if m and r["exec"] > 0:
            t = (int(m.group(1), 16) - df["addr"].iloc[0]) // 16
            if t < r["idx"]:
                out.append((int(t), int(r["idx"])))
    return out


def feeds_imma(df, i, dst, limit=80):
    for j in range(i + 1, min(i + limit, len(df))):
        d, s = regs(df.at[j, "src"])
        if dst & s:
            return df.at[j, "base"] in ("IMMA", "LOP3", "SHF", "PRMT", "IADD3") and (
                df.at[j, "base"] == "IMMA" or feeds_imma(df, j, d, limit // 2))
        if dst & d:
            return False
    return False


def classify(df: pd.DataFrame, tile: bool) -> pd.Series:
    L = loops(df)
    outer = max(L, key=lambda t: t[1] - t[0])
    inner = sorted(t for t in L if t != outer and t[1] - t[0] > 50)   # the k32 / unit loops
    reg = []
    for i, r in df.iterrows():
        x, base = r["idx"], r["base"]
        bar = base in ("BAR", "DEPBAR") or (r["samples"] > 20 and r["barrier"] > 0.5 * r["samples"])
        if x < outer[0]:
            reg.append("prologue"); continue
        if x > outer[1]:
            reg.append("epilogue"); continue
        if bar:
            reg.append("barrier"); continue
        if tile:
            jl = inner[0]
            cp_end = df[(df["idx"] > outer[0]) & (df["base"] == "LDGDEPBAR")]["idx"].min()
            if x <= cp_end:
                reg.append("act cp.async (LDGSTS)")
            elif x < jl[0]:
                reg.append("weight staging (LDG/unpack/STS)")
            elif x > jl[1]:
                reg.append("overhead (addr/loop)" if x == outer[1] else "min-term HMMA tail (LDS/HMMA)")
            else:
                reg.append(body_region(df, i, base))
            continue
        lp = [t for t in inner if t[0] <= x <= t[1]]
        if not lp:
            reg.append("slot merge (gemm.cu)"); continue
        lo, hi = lp[0]
        seg = df[(df["idx"] >= lo) & (df["idx"] <= hi)]
        cp_end = seg[seg["base"] == "LDGDEPBAR"]["idx"].min()
        first_ldsm = seg[seg["base"] == "LDSM"]["idx"].min()
        if x <= cp_end:
            reg.append("cp.async staging (W, x, scales)")
        elif x < first_ldsm:
            reg.append("row scalars (meta unpack)")
        else:
            reg.append(body_region(df, i, base))
    return pd.Series(reg, index=df.index)


def body_region(df, i, base):
    if base == "IMMA":
        return "IMMA"
    if base == "HMMA":
        return "min-term HMMA tail (LDS/HMMA)"
    if base in ("LDSM", "LDS"):
        return "k32 fragment/scalar loads (LDSM/LDS)"
    if base in ("I2F", "I2FP", "FMUL", "FFMA", "FADD"):
        return "formula (I2F/FMUL/FFMA/FADD)"
    if base in ("LOP3", "SHF", "PRMT") and feeds_imma(df, i, regs(df.at[i, "src"])[0]):
        return "weight unpack (in k32 body)"
    return "overhead (addr/loop)"


def top_reasons(r, n=3):
    v = sorted(((r[k], k) for k in REASONS if r[k] > 0), reverse=True)[:n]
    return " ".join(f"{k}:{c}" for c, k in v)


def producers(df, i, loop):
    """Nearest earlier writer (circular inside the enclosing loop) of each register instruction i touches."""
    d, s = regs(df.at[i, "src"])
    want, war, found = set(d | s), set(d), {}
    lo, hi = loop if loop else (0, i)
    order = list(range(i - 1, lo - 1, -1)) + list(range(hi, i, -1))
    for dist, j in enumerate(order, 1):
        if not want and not war:
            break
        dj, sj = regs(df.at[j, "src"])
        hit = want & dj
        if hit:
            found[j] = (sorted(hit), dist, "")
            want -= hit
        hw = war & sj if df.at[j, "base"] in ("STS", "STG", "ST", "LDGSTS", "STL") else set()
        if hw:   # write-after-read: a store still reading the register this instruction overwrites
            found[j] = (sorted(hw), dist, " WAR")
        war -= sj | dj
    return found


def report(prof: Path, top: int, nprod: int) -> str:
    out = []
    p = out.append
    pd.set_option("display.width", 200)
    for k, name in LAUNCHES.items():
        df = load_sass(prof / f"ncu-sass-{k}.csv.gz")
        df["region"] = classify(df, k in TILE)
        tot = df["samples"].sum()
        p(f"\n## launch {k}: {name}  ({tot} samples, {df['exec'].sum()} warp instructions, "
          f"{df.loc[df.base == 'IMMA', 'exec'].sum()} IMMA)")
        by = df[REASONS].sum().sort_values(ascending=False)
        p("reasons: " + ", ".join(f"{r} {v} ({100 * v / tot:.1f}%)" for r, v in by.items() if v))
        g = df.groupby("region")
        t = pd.DataFrame({"samples": g["samples"].sum(), "exec": g["exec"].sum()})
        t["%samp"] = (100 * t["samples"] / tot).round(1)
        t["%inst"] = (100 * t["exec"] / df["exec"].sum()).round(1)
        t["top reasons (% of region)"] = [", ".join(f"{r} {100 * v / max(1, t.at[reg, 'samples']):.0f}"
                                                    for r, v in g[REASONS].sum().loc[reg].sort_values(ascending=False).head(4).items() if v)
                                          for reg in t.index]
        p("\nregions:\n" + t.sort_values("samples", ascending=False).to_string())
        tp = df.sort_values("samples", ascending=False).head(top)
        p(f"\ntop {top} instructions:")
        for i, r in tp.iterrows():
            p(f"  {r['idx']:5d} {r['samples']:6d} {100 * r['samples'] / tot:4.1f}%  {r['src'][:58]:58s} "
              f"[{r['region']}]  {top_reasons(r)}")
        if k in (1, 3):
            L = loops(df)
            for reason in ("short_sb", "long_sb", "wait"):
                p(f"\n{reason}: top consumers and the nearest writers of their registers")
                for i, r in df.sort_values(reason, ascending=False).head(nprod).iterrows():
                    lp = min((t for t in L if t[0] <= r["idx"] <= t[1]), key=lambda t: t[1] - t[0], default=None)
                    pr = producers(df, i, lp)
                    w = "; ".join(f"{df.at[j, 'op']}@{df.at[j, 'idx']} (-{dist}) R{','.join(map(str, rr[:2]))}{tag}"
                                  for j, (rr, dist, tag) in sorted(pr.items(), key=lambda kv: kv[1][1])[:4])
                    p(f"  {r['idx']:5d} {r[reason]:5d} {r['src'][:50]:50s} <- {w}")
    p("\n## raw counters (ncu-raw.csv.gz)\n" + raw_table(prof).to_string())
    return "\n".join(out)


RAW = [("duration us", "gpu__time_duration.sum", 1e3),
       ("SM thru %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1),
       ("issue active %", "sm__issue_active.avg.pct_of_peak_sustained_elapsed", 1),
       ("IPC (active)", "sm__inst_executed.avg.per_cycle_active", 1),
       ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
       ("IMMA inst % peak", "sm__inst_executed_pipe_tensor_op_imma.avg.pct_of_peak_sustained_active", 1),
       ("HMMA inst % peak", "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active", 1),
       ("tensor pipe cycles %", "TPC.TriageCompute.sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed", 1),
       ("FMA pipe %", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", 1),
       ("ALU pipe %", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", 1),
       ("LSU pipe %", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", 1),
       ("smem bank confl ld", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", 1),
       ("smem bank confl st", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", 1),
       ("smem wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", 1),
       ("L2 thru %", "lts__t_sectors.avg.pct_of_peak_sustained_elapsed", 1),
       ("DRAM thru %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1),
       ("smem ld wavefronts %", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum.pct_of_peak_sustained_elapsed", 1),
       ("MIO inst issued %", "sm__mio_inst_issued.avg.pct_of_peak_sustained_elapsed", 1)]


def raw_table(prof: Path) -> pd.DataFrame:
    txt = gzip.open(prof / "ncu-raw.csv.gz", "rt").read()
    raw = pd.read_csv(io.StringIO(txt), low_memory=False)
    raw = raw[raw["ID"].notna()].reset_index(drop=True)   # drop the units row

    def num(col):
        if col not in raw:
            return pd.Series([np.nan] * len(raw))
        return pd.to_numeric(raw[col].astype(str).str.replace(",", ""), errors="coerce")

    t = pd.DataFrame({name: num(col) * sc for name, col, sc in RAW})
    for k in range(len(t)):   # instruction mix from the SASS exports' executed counts
        df = load_sass(prof / f"ncu-sass-{k + 1}.csv.gz")
        n_mma = df.loc[df.base.isin(["IMMA", "HMMA"]), "exec"].sum()
        t.loc[k, "warp inst (SASS)"] = df["exec"].sum()
        t.loc[k, "inst / IMMA"] = df["exec"].sum() / df.loc[df.base == "IMMA", "exec"].sum()
        t.loc[k, "inst / (IMMA+HMMA)"] = df["exec"].sum() / n_mma
    t.index = [f"{i + 1}" for i in range(len(t))]
    return t.T.map(lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("prof", nargs="?", default=str(Path(__file__).resolve().parents[2] / "research/2026-12-02-session15/prof"))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--producers", type=int, default=8)
    a = ap.parse_args()
    print(report(Path(a.prof), a.top, a.producers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
