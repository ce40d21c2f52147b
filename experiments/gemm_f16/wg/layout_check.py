"""gemm_f16_wg.cu's index arithmetic and ring protocol, replayed on the CPU (numpy, no device).

Two halves, kept apart on purpose:
- the kernel side, copied from gemm_f16_wg.cu by hand: the producer's swizzled st.shared of the dequantized
  weight units (sw128, T::goff's columns folded to the pair's parity, wrow's glu interleave), its cp.async of
  the X chunks (xoff, dst + 2048 q), the descriptors it builds (sw128_desc, start + 32 kk a k16 step, the
  consumer's m64 tile at + 8192 (WG_MT c + mt)) and the epilogue's (m, n) of accumulator 4j + e;
- the hardware side, written from the PTX ISA text, not from the kernel: a descriptor's fields (start
  address bits 0-13, LBO 16-29, SBO 32-45, base offset 49-51, layout 62-63, each in 16-byte units), the
  K-major 128-byte-swizzle canonical layout (8 rows x 128 bytes an atom, atoms SBO apart along M / N, row r of
  an atom 128 bytes after row r - 1, 16-byte chunk c of a row stored at chunk c XOR (address bits 7-9): the
  swizzle is a function of the absolute shared address, which is why atoms are 1024-aligned), what
  wgmma.mma_async m64nNk16 computes from them (D[i][j] += sum_k A[i][k] B[k][j], A M x K and B K x N both
  K-major: A[i][k] at the operand's row i, B[k][j] at its row j) and the m64nNk16 f32 D fragment (thread t,
  register i: row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (t % 4) + i % 2).

Checks, for Q4_K glu, Q6_K plain (its units interleave over 128 elements) and Q4_0 plain, at WG_BN 128 and
256 (and WG_MT 2), a block with a partial last activation-row tile (rows past nb zero-filled) and K long
enough to wrap the ring: every shared byte of a stage written once; every output (m, n) the epilogue writes
sums W[n, k] x[m, k] (glu: the gate from row n, the up from row N + n, in one thread) over each k exactly
once; every output of the block written, nothing for m >= nb. And the ring's mbarrier protocol (init counts,
parities, the producer's pairs, WG_INFLIGHT's delayed release) run as a random interleaving of the 3
warpgroups' programs: no deadlock, every stage read only while its slot holds it.

Planted slips (session 42, each in a scratch copy of this file, run once, not kept): the producer's XOR
taken with (r >> 1) & 7 instead of r & 7 -> caught at every configuration ("A rows hold different k at one
step", "k mismatch between A and B"); the descriptor's SBO 512 bytes instead of 1024 -> caught at every
configuration ("B row j is not activation row m0 + j"); the consumer's full[] parity ((i / S) + 1) & 1 in
the protocol model -> caught at every ring ("producer writes slot 0 (stage 0) while warps [..] read it": the
fresh barrier's preceding phase counts as complete, so the consumer ran ahead of the producer). The
protocol model also found a real deadlock of the first draft: WG_STAGES 2 with WG_INFLIGHT 1 (the producer
waits for both slots of a pair, the second is released only after a stage of that pair is issued); the
kernel now refuses it (static_assert WG_STAGES >= 2 + WG_INFLIGHT) and main() checks the model still
deadlocks there. Review (session 42): a descriptor base offset of 1 (the ISA requires 0 for patterns on a
1024-byte boundary) -> caught ("base offset: 0 ...").

    python3 experiments/gemm_f16/wg/layout_check.py      # ~10 s
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from index_check import goff, wrow  # noqa: E402  (qtypes.cuh's T::goff and the kernels' glu row interleave)

BK = 64


# ------------------------------------------------------------------------------------------ the kernel side


def sw128(r: int, j: int) -> int:
    return (r >> 3) * 1024 + (r & 7) * 128 + ((j ^ (r & 7)) << 4)


def sw128_desc(addr: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)


class Geo:
    def __init__(self, bn: int, mt: int, stages: int):
        self.BN, self.MT, self.S = bn, mt, stages
        self.BM = 128 * mt
        self.W_BYTES, self.X_BYTES = self.BM * 128, bn * 128
        self.STAGE = self.W_BYTES + self.X_BYTES
        self.XPT = bn * 8 // 128
        self.NACC = bn // 2


def producer_writes(geo: Geo, t: str, glu: bool, N: int, K: int, nb: int, n0: int, m0: int, base: int):
    """{stage i: (w_addr, w_tag, x_addr, x_tag)}: the byte address of every f16 the producer writes and what it
    holds (weight: global row * K + k; x: row * K + k, -1 for a zero-filled row), as the kernel computes them."""
    NS = K // BK
    out = {}
    for P in range(NS // 2):
        par = P & 1
        ia, ib = 2 * P, 2 * P + 1
        wa, wb = base + (ia % geo.S) * geo.STAGE, base + (ib % geo.S) * geo.STAGE
        wadr = {ia: [], ib: []}
        wtag = {ia: [], ib: []}
        for p in range(128):
            for i in range(geo.MT):
                r = p + 128 * i
                gr = wrow(r, n0, N, glu)
                for h in range(2):
                    u = 2 * P + h
                    for g in range(4):
                        col = goff(t, 2 * par + h, g) - 128 * par     # the kernel's constant form
                        kk = goff(t, u, g)                              # the element the group really holds
                        assert kk - 128 * P == col, (t, u, g)
                        wt = wb if col & 64 else wa
                        st = ib if col & 64 else ia
                        j = (col & 63) >> 3
                        for half in range(2):
                            for e in range(8):
                                wadr[st].append(wt + sw128(r, j + half) + 2 * e)
                                wtag[st].append(gr * K + kk + 8 * half + e)
        xadr = {ia: [], ib: []}
        xtag = {ia: [], ib: []}
        for p in range(128):
            r0, jx = p >> 3, p & 7
            for i, xt in ((ia, wa + geo.W_BYTES), (ib, wb + geo.W_BYTES)):
                dst = xt + sw128(r0, jx)
                for q in range(geo.XPT):
                    m = m0 + r0 + 16 * q
                    ok = m < nb
                    src_row = m if ok else 0
                    xoff = (src_row * K + 8 * jx) * 2
                    for e in range(8):
                        xadr[i].append(dst + 2048 * q + 2 * e)
                        # source element: (xoff + 128 i) / 2 + e = row * K + 64 i + 8 jx + e
                        xtag[i].append((xoff + 2 * BK * i) // 2 + e if ok else -1)
        for i in (ia, ib):
            out[i] = (np.array(wadr[i]), np.array(wtag[i]), np.array(xadr[i]), np.array(xtag[i]))
    return out


def consumer_descs(geo: Geo, base: int, i: int, c: int, mt: int, kk: int) -> tuple[int, int]:
    wt = base + (i % geo.S) * geo.STAGE
    xt = wt + geo.W_BYTES
    return sw128_desc(wt + (geo.MT * c + mt) * 8192 + 32 * kk), sw128_desc(xt + 32 * kk)


def epilogue(geo: Geo, glu: bool, N: int, nb: int, n0: int, m0: int, c: int, mt: int, tt: int):
    """[(register, m, n, role)] of consumer c's thread tt (0..127), m64 tile mt: what the kernel writes."""
    lane, warp = tt & 31, tt >> 5
    gid, tig = lane >> 2, lane & 3
    r0 = 64 * (geo.MT * c + mt) + 16 * warp
    outs = []
    for j in range(geo.NACC // 4):
        m = m0 + 8 * j + 2 * tig
        if glu:
            n = n0 + (r0 >> 1) + gid
            for e in range(2):
                if m + e >= nb:
                    continue
                outs.append((4 * j + e, m + e, n, "gate"))
                outs.append((4 * j + 2 + e, m + e, n, "up"))
        else:
            n = n0 + r0 + gid
            for e in range(4):
                mm, nn = m + (e & 1), n + 8 * (e >> 1)
                if mm >= nb:
                    continue
                outs.append((4 * j + e, mm, nn, "y"))
    return outs


# ------------------------------------------------------------------------------------------ the hardware side

def decode_desc(d: int) -> dict:
    """The PTX ISA's shared-memory matrix descriptor fields (bytes where the ISA says 'byte offset >> 4')."""
    return {"start": (d & 0x3FFF) << 4, "lbo": ((d >> 16) & 0x3FFF) << 4, "sbo": ((d >> 32) & 0x3FFF) << 4,
            "base_offset": (d >> 49) & 7, "layout": (d >> 62) & 3}


def swizzle128(addr: np.ndarray) -> np.ndarray:
    """128-byte swizzle of absolute shared addresses: the 16-byte chunk bits [4, 7) XOR bits [7, 10)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def operand_addrs(desc: int, rows: int) -> np.ndarray:
    """[rows, 16] byte addresses of the f16 elements (row, k) of a K-major operand of one k16 step (32 bytes of
    K a row) in the 128-byte-swizzle canonical layout, as the ISA defines it from the descriptor."""
    f = decode_desc(desc)
    assert f["layout"] == 1, "not the 128-byte swizzle"
    # PTX ISA, matrix descriptor format: the base offset is 0 when the swizzle's repeating pattern starts on a
    # 1024-byte boundary (128-byte swizzle), else (pattern start address >> 7) & 7 -- the pattern's start, not the
    # matrix start address. swizzle128 below is a function of the absolute address, i.e. it presumes every
    # pattern starts on a 1024-byte boundary, so the descriptor must carry base offset 0 wherever its start lies
    # inside the pattern (a start 32 kk bytes into an atom row included).
    assert f["base_offset"] == 0, "base offset: 0 for patterns on a 1024-byte boundary"
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    logical = f["start"] + (r // 8) * f["sbo"] + (r % 8) * 128 + 2 * k   # LBO unused: K within one atom row
    return swizzle128(logical)


def d_fragment(t: int, i: int) -> tuple[int, int]:
    """(row, column) of the m64nNk16 f32 accumulator register i of warpgroup thread t."""
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (t % 4) + (i & 1)


# ------------------------------------------------------------------------------------------ the check

def check(t: str, glu: bool, bn: int, mt: int, stages: int, K: int, nb: int, n_block: int, m_block: int,
          smem_start: int = 0x2A0) -> list[str]:
    geo = Geo(bn, mt, stages)
    obm = geo.BM // 2 if glu else geo.BM
    N = 2 * obm
    n0, m0 = n_block * obm, m_block * geo.BN
    base = (smem_start + 1023) & ~1023            # the kernel's round-up of the dynamic shared base
    errs: list[str] = []
    # periodicity the kernel's constant columns rely on
    for u in range(8):
        for g in range(4):
            if goff(t, u + 4, g) != goff(t, u, g) + 256:
                errs.append(f"{t}: goff({u + 4}, {g}) != goff({u}, {g}) + 256")
    writes = producer_writes(geo, t, glu, N, K, nb, n0, m0, base)
    NS = K // BK
    # count[tile row, column, k]: how many times the product W[row's weight row, k] x[column's row, k] is summed
    count = np.zeros((geo.BM, geo.BN, K), np.int16)
    wrow_of = np.full(geo.BM, -2, np.int64)
    for i in range(NS):
        wadr, wtag, xadr, xtag = writes[i]
        wt = base + (i % geo.S) * geo.STAGE
        smem = {}
        for name, adr, tag, lo, size in (("W", wadr, wtag, wt, geo.W_BYTES), ("X", xadr, xtag, wt + geo.W_BYTES,
                                                                               geo.X_BYTES)):
            if len(np.unique(adr)) != len(adr):
                errs.append(f"stage {i}: {name} tile: a byte written twice")
            if len(adr) != size // 2 or adr.min() < lo or adr.max() >= lo + size:
                errs.append(f"stage {i}: {name} tile: {len(adr)} of {size // 2} halves, in [{adr.min() - lo}, "
                            f"{adr.max() - lo}] of [0, {size})")
            smem.update(zip(adr.tolist(), tag.tolist()))
        if errs:
            return errs
        for c in range(2):
            for mti in range(mt):
                for kk in range(BK // 16):
                    da, db = consumer_descs(geo, base, i, c, mti, kk)
                    aa, ba = operand_addrs(da, 64), operand_addrs(db, geo.BN)
                    try:
                        at = np.vectorize(smem.__getitem__)(aa)
                        bt = np.vectorize(smem.__getitem__)(ba)
                    except KeyError as e:
                        errs.append(f"stage {i} consumer {c}: reads byte {e} nobody wrote")
                        return errs
                    ak, ar = at % K, at // K               # [64, 16]
                    bk = np.where(bt >= 0, bt % K, -1)
                    br = np.where(bt >= 0, bt // K, -1)    # [BN, 16]
                    if not np.all(ak == ak[:1]):
                        errs.append(f"stage {i} kk {kk}: A rows hold different k at one step")
                    if not np.all(ar == ar[:, :1]):
                        errs.append(f"stage {i} kk {kk}: an A row mixes weight rows")
                    valid = br[:, 0] >= 0
                    if not np.all((bk[valid] == ak[0][None, :])):
                        errs.append(f"stage {i} kk {kk}: k mismatch between A and B")
                    cols = np.arange(geo.BN)
                    if not np.all(br[valid] == (m0 + cols[valid])[:, None]):
                        errs.append(f"stage {i} kk {kk}: B row j is not activation row m0 + j")
                    rows = 64 * (mt * c + mti) + np.arange(64)
                    prev = wrow_of[rows]
                    if np.any((prev != -2) & (prev != ar[:, 0])):
                        errs.append(f"stage {i}: tile row's weight row changes between stages")
                    wrow_of[rows] = ar[:, 0]
                    kv = ak[0]
                    for kq in range(16):
                        count[rows[:, None], cols[None, :], kv[kq]] += 1
                    if len(errs) > 10:
                        return errs
    # the epilogue against the D fragment
    written: dict = {}
    for c in range(2):
        for mti in range(mt):
            for tt in range(128):
                for reg, m, n, role in epilogue(geo, glu, N, nb, n0, m0, c, mti, tt):
                    row, col = d_fragment(tt, reg)
                    R = 64 * (mt * c + mti) + row
                    if m != m0 + col:
                        errs.append(f"register {reg} of thread {tt}: column {col} written as m {m}")
                    want = (N + n) if role == "up" else n
                    if wrow_of[R] != want:
                        errs.append(f"weight row {wrow_of[R]} where the epilogue writes {role} of n {n}")
                    if not np.all(count[R, col] == 1):
                        bad = np.flatnonzero(count[R, col] != 1)
                        errs.append(f"(m {m}, n {n}, {role}): k {bad[:4]} summed {count[R, col, bad[:4]]} times")
                    written.setdefault((m, n), set()).add((role, c, tt))
                    if len(errs) > 10:
                        return errs
    want = {(m, n) for m in range(m0, min(m0 + geo.BN, nb)) for n in range(n0, n0 + obm)}
    if set(written) != want:
        errs.append(f"outputs written {len(written)}, want {len(want)}")
    if glu:
        for key, who in written.items():
            roles = {r for r, _, _ in who}
            threads = {(c, tt) for _, c, tt in who}
            if roles != {"gate", "up"} or len(threads) != 1:
                errs.append(f"{key}: gate and up not in one thread ({who})")
                break
    return errs


# ------------------------------------------------------------------------------------------ the ring protocol

class MBar:
    """An mbarrier as the ISA describes it: a phase completes when its pending arrivals reach zero; then the
    phase number advances and the count reloads. try_wait.parity(p) is true once the phase of parity p that
    precedes the current one has completed, i.e. when the current phase's parity differs from p."""

    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def test(self, parity: int) -> bool:
        return (self.phase & 1) != parity


def protocol(S: int, NS: int, inflight: int, seed: int) -> str | None:
    """Runs the producer's 128 threads and the two consumers' 8 warps as generators in a random interleaving.
    Returns an error string, or None."""
    full = [MBar(128) for _ in range(S)]
    empty = [MBar(8) for _ in range(S)]
    slot = [None] * S                 # the stage a slot holds
    reading = [set() for _ in range(S)]   # warps whose wgmma may still read the slot
    err: list[str] = []

    def producer(tid):
        for P in range(NS // 2):
            for i in (2 * P, 2 * P + 1):
                if i >= S:
                    while not empty[i % S].test(((i // S) - 1) & 1):
                        yield
            for i in (2 * P, 2 * P + 1):
                s = i % S
                if reading[s]:
                    err.append(f"producer writes slot {s} (stage {i}) while warps {sorted(reading[s])} read it")
                slot[s] = i
                yield
            for i in (2 * P, 2 * P + 1):
                full[i % S].arrive()
                yield

    def consumer(w):
        outstanding = []
        for i in range(NS):
            s = i % S
            while not full[s].test((i // S) & 1):
                yield
            if slot[s] != i:
                err.append(f"warp {w} reads slot {s} for stage {i} but it holds {slot[s]}")
            reading[s].add(w)
            outstanding.append(i)
            yield
            while len(outstanding) > inflight:        # wgmma.wait_group inflight
                done = outstanding.pop(0)
                if slot[done % S] != done:
                    err.append(f"stage {done} overwritten before warp {w}'s wgmma finished")
                reading[done % S].discard(w)
                if done == i - inflight:
                    empty[done % S].arrive()
            yield
        for done in outstanding:
            reading[done % S].discard(w)

    rng = random.Random(seed)
    actors = [producer(t) for t in range(128)] + [consumer(w) for w in range(8)]
    live = list(range(len(actors)))
    steps = 0
    while live:
        k = rng.choice(live)
        try:
            next(actors[k])
        except StopIteration:
            live.remove(k)
        steps += 1
        if err:
            return err[0]
        if steps > 200000 * NS:
            return "deadlock (no progress)"
    return None


def main() -> int:
    bad = 0
    cases = [("Q4_K", True), ("Q6_K", False), ("Q4_0", False)]
    for bn, mt in ((128, 1), (256, 1), (128, 2)):
        for t, glu in cases:
            nb = bn + 37                    # the block of rows m0 = bn .. nb - 1: a partial last tile
            errs = check(t, glu, bn, mt, stages=3, K=512, nb=nb, n_block=1, m_block=1)
            print(f"BN {bn} MT {mt} {t} {'glu' if glu else 'plain'}: {'OK' if not errs else errs[:4]}", flush=True)
            bad += bool(errs)
    for S, NS, inflight in ((4, 16, 1), (4, 16, 0), (3, 12, 1), (2, 8, 0), (6, 24, 1)):
        res = [protocol(S, NS, inflight, seed) for seed in range(3)]
        fails = [r for r in res if r]
        print(f"protocol S {S} stages {NS} inflight {inflight}: {'OK' if not fails else fails[0]}", flush=True)
        bad += bool(fails)
    # the kernel's static_assert(WG_STAGES >= 2 + WG_INFLIGHT): below it the ring deadlocks
    r = protocol(2, 8, 1, 0)
    print(f"protocol S 2 stages 8 inflight 1 (excluded by the kernel's static_assert): "
          f"{'deadlocks, as expected' if r and 'deadlock' in r else 'UNEXPECTED: ' + str(r)}", flush=True)
    bad += not (r and "deadlock" in r)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
