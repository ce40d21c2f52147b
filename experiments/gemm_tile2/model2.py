"""model2: a numpy model of gemm_tile2.cu's index maps and schedule (CPU), replayed on small problems
against the float64 reference (tile2.py --dry-run runs it).

What is modelled (a transcription of the kernel's maps, in program order, all warps of a block):
- the cp.async ring: each thread's 16-byte chunks (raw weights, activations, meta, Q8Scale: sources()
  / load_group()), their coverage (every smem byte of a slot written exactly once), the group schedule
  (prologue P, 0 .. NS-2, NS-1; then s + NS inside step 7 of stage s) and cp.async.wait_group;
- the scalar pass (row_pass / the column loop): 6-bit scale unpack, dsc / 16 for odd sub-blocks, the
  float-area layouts rperm / cperm (main formula) and aperm / bperm (the min term's fragment order);
- the k loop in the order of GT_PF / GT_PASS / GT_MINS: ldmatrix.x4 lane addresses on the raw tile
  (row stride 144, byte 32 j') and the x tile (stride 272), the nibble masks, the PTX fragment layouts
  of mma.m16n8k32 (u8 x s8) and mma.m16n8k8 (tf32), the scalar loads of each lane, the formula (float64:
  the magic FFMA fma(M + I', dsc', -M dsc') is exact in float64), the epilogue's maps;
- a race check: every smem location a cp.async group writes may land anywhere between its issue and
  the barrier after the wait that retires it, and every scalar-pass write anywhere in its barrier
  interval; a read of such a location inside that window is reported as a race.
The model adds the 3xTF32 min term's lo*lo product so that it is exact in float64 (the kernel drops it).
A transcription slip made identically in the kernel and here passes; mutations show the model catches
wrong maps (mutation_tests()).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chain_mv"))
from chain_ref import fma32  # noqa: E402  (the correctly rounded float32 fma; chain_ref.py checks it against rationals)

Q4_K = 12
WS, TS = 144, 272
MAGF = 12582912.0


class Race(Exception):
    pass


def _cfg(defs):
    wm, wn = int(defs.get("GT_WM", 2)), int(defs.get("GT_WN", 4))
    c = dict(WM=wm, WN=wn, BM=64 * wm, BN=32 * wn, NT=32 * wm * wn, NS=int(defs.get("GT_STAGES", 2)),
             FORM=int(defs.get("GT_FORM", 0)), PF=int(defs.get("GT_PF", 1)), PU=int(defs.get("GT_PU", 1)),
             MINS=int(defs.get("GT_MINS", 2)), PASS=int(defs.get("GT_PASS", 7)), XROT=int(defs.get("GT_XROT", 1)))
    BM, BN, NT, NS, F = c["BM"], c["BN"], c["NT"], c["NS"], c["FORM"]
    c["RS"], c["CS"] = 8 * BM * (12 if F else 16), 8 * BN * (8 if F else 12)
    c["WT"], c["XT"], c["MT"], c["ST"] = BM * WS, BN * TS, BM * 16, BN * 64
    c["OFF_W"] = 0
    c["OFF_X"] = NS * c["WT"]
    c["OFF_M"] = c["OFF_X"] + NS * c["XT"]
    c["OFF_S"] = c["OFF_M"] + NS * c["MT"]
    c["OFF_F"] = c["OFF_S"] + NS * c["ST"]
    c["FB"] = c["RS"] + c["CS"]
    c["TOTAL"] = c["OFF_F"] + 2 * c["FB"]
    c["WCH"], c["XCH"], c["SCH"] = BM * 8 // NT, BN * 16 // NT, BN * 4 // NT
    c["RPT"], c["CPT"] = NT // BM, NT // BN
    return c


def rperm(r):
    w, l = r >> 6, r & 63
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1)


def cperm(c):
    w, l = c >> 5, c & 31
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1)


def aperm(r, j, mut=()):
    w, l = r >> 6, r & 63
    h, jj = (l >> 3) & 1, j >> 2
    if "aperm" in mut:
        h, jj = jj, h
    return (32 * (4 * w + (l >> 4)) + 4 * (l & 7) + (j & 3)) * 4 + h + 2 * jj


def bperm(c, j):
    w, l = c >> 5, c & 31
    return (32 * (4 * w + (l >> 3)) + 4 * (l & 7) + (j & 3)) * 4 + (j >> 2)


def tf32_split(v: float):
    """(hi, lo): hi with 10 explicit mantissa bits (round to nearest), lo = v - hi (float64)."""
    if v == 0 or not np.isfinite(v):
        return v, 0.0
    e = np.floor(np.log2(abs(v)))
    q = 2.0 ** (e - 10)
    hi = float(np.round(v / q) * q)
    return hi, v - hi


class Block:
    """One block of gemm_tile2 replayed in program order."""

    def __init__(self, raw, q, xsd, xss, defs, glu, ob, cb, nb, mut=(), ks=1, z=0):
        from memra.gpu.ops.matvec import pack_planes
        self.c = c = _cfg(defs)
        self.mut = set(mut)
        self.glu, self.ob, self.cb, self.nb = glu, ob, cb, nb
        rows, K = raw.shape[0], q.shape[1]
        self.N = rows // 2 if glu else rows
        self.nsb = K // 256 // ks          # split-K part z: super-blocks [z nsb, (z + 1) nsb)
        self.sb0 = z * self.nsb
        self.ks = ks
        self.bulk, self.meta = pack_planes(raw, Q4_K)
        self.q = q.view(np.uint8)
        xsb = np.zeros(xsd.shape, dtype=[("d", "<f4"), ("s", "<i4")])
        xsb["d"], xsb["s"] = xsd, xss
        self.xsb = xsb.view(np.uint8).reshape(xsd.shape[0], -1)
        self.sm = np.zeros(c["TOTAL"], np.uint8)         # cp.async regions (bytes)
        self.fl = np.full(2 * c["FB"] // 4, np.nan)       # float area (float64 model of the floats)
        self.iv = 0                                       # barrier interval
        self.reads = {}                                   # interval -> set of flat byte offsets (4-byte granular)
        self.pass_w = {}                                  # interval -> set of float-area byte offsets
        self.groups = []                                  # [issue interval, retire interval or None, offsets]
        self.acc = np.zeros((c["WM"] * c["WN"], 32, 4, 4, 4))
        self._chunk_maps()

    # ---- addresses
    def wrow(self, r):
        if not self.glu:
            return self.ob + r
        w, l = r >> 6, r & 63
        return (0 if l < 32 else self.N) + self.ob + 32 * w + (l & 31)

    def _chunk_maps(self):
        c = self.c
        BM, BN, NT = c["BM"], c["BN"], c["NT"]
        self.wmap, self.xmap, self.smap = [], [], []
        for t in range(NT):
            r, part = (c["WCH"] * t) >> 3, (c["WCH"] * t) & 7
            for i in range(c["WCH"]):
                self.wmap.append((r * WS + 16 * part + 16 * i, r, 16 * part + 16 * i))
            xcol, xpart = (c["XCH"] * t) >> 4, (c["XCH"] * t) & 15
            rot = 4 * (t & 1) if c["XCH"] == 8 and c["XROT"] else 0
            for i in range(c["XCH"]):
                ii = (rot + i) & (c["XCH"] - 1)
                self.xmap.append((xcol * TS + 16 * xpart + 16 * ii, xcol, 16 * xpart + 16 * ii))
            scol, spart = (c["SCH"] * t) >> 2, (c["SCH"] * t) & 3
            for i in range(c["SCH"]):
                self.smap.append((scol * 64 + 16 * spart + 16 * i, scol, 16 * spart + 16 * i))
        # coverage: every byte of the rows / columns' data written exactly once
        for m, n, stride, width in ((self.wmap, BM, WS, 128), (self.xmap, BN, TS, 256), (self.smap, BN, 64, 64)):
            cov = np.zeros(n * stride, np.int64)
            for d, _, _ in m:
                cov[d:d + 16] += 1
            want = np.zeros(n * stride, np.int64)
            for r in range(n):
                want[r * stride: r * stride + width] = 1
            assert np.array_equal(cov, want), "a loader map does not cover its tile exactly once"

    def phase_conflicts(self):
        """{map: worst number of lanes of one 8-lane LDGSTS phase on one 16-byte bank slot} for the
        per-thread chunk maps (instruction i of thread t = the map's entry t * per + i)."""
        c = self.c
        out = {}
        for name, m, per, stride in (("W", self.wmap, c["WCH"], WS), ("X", self.xmap, c["XCH"], TS),
                                     ("S", self.smap, c["SCH"], 64)):
            worst = 1
            for i in range(per):
                for ph in range(0, c["NT"], 8):
                    slots = [(m[t * per + i][0] // 16) % 8 for t in range(ph, ph + 8)]
                    worst = max(worst, max(slots.count(x) for x in slots))
            out[name] = worst
        return out

    def col(self, cc):
        return min(self.cb + cc, self.nb - 1)

    # ---- cp.async ring
    def _issue(self, writes):
        offs = set()
        for dst, data in writes:
            self.sm[dst:dst + 16] = data   # applied at issue; the race check covers any later landing
            offs.update(range(dst - dst % 4, dst + 16, 4))
        self.groups.append([self.iv, None, offs])

    def load_meta0(self):
        c = self.c
        sb = self.sb0
        wr = [(c["OFF_M"] + 16 * t, self.meta[self.wrow(t), 16 * sb:16 * sb + 16]) for t in range(c["BM"])]
        wr += [(c["OFF_S"] + d, self.xsb[self.col(cc), 64 * sb + o:64 * sb + o + 16]) for d, cc, o in self.smap]
        self._issue(wr)

    def load_group(self, t):
        c = self.c
        NS, wr = c["NS"], []
        if t < self.nsb:
            sl, sb = t % NS, self.sb0 + t
            wr += [(c["OFF_W"] + sl * c["WT"] + d, self.bulk[self.wrow(r), 128 * sb + o: 128 * sb + o + 16]) for d, r, o in self.wmap]
            wr += [(c["OFF_X"] + sl * c["XT"] + d, self.q[self.col(cc), 256 * sb + o: 256 * sb + o + 16]) for d, cc, o in self.xmap]
        if t + 1 < self.nsb:
            sb = self.sb0 + t + 1
            sl = (t if "ring" in self.mut else t + 1) % NS
            wr += [(c["OFF_M"] + sl * c["MT"] + 16 * r, self.meta[self.wrow(r), 16 * sb: 16 * sb + 16]) for r in range(c["BM"])]
            wr += [(c["OFF_S"] + sl * c["ST"] + d, self.xsb[self.col(cc), 64 * sb + o: 64 * sb + o + 16]) for d, cc, o in self.smap]
        self._issue(wr)

    def wait(self, n):
        pend = [g for g in self.groups if g[1] is None]
        for g in pend[:len(pend) - n] if n else pend:
            g[1] = self.iv   # lands by the next barrier at the latest

    def bar(self):
        self.iv += 1

    def _read(self, flat_offs):
        self.reads.setdefault(self.iv, set()).update(o - o % 4 for o in flat_offs)

    # ---- scalar pass
    def scalar_pass(self, t):
        c = self.c
        BM, BN, NT = c["BM"], c["BN"], c["NT"]
        sl, fb = t % c["NS"], (t & 1) * c["FB"] // 4
        wrote = set()

        def put(i, v):
            self.fl[fb + i] = v
            wrote.add(c["OFF_F"] + 4 * (fb + i))
        for th in range(NT):
            r, part = th % BM, th // BM
            base = c["OFF_M"] + sl * c["MT"] + 16 * r
            self._read(range(base, base + 16, 4))
            m = self.sm[base: base + 16].astype(np.int64)
            d = float(np.frombuffer(bytes(self.sm[base: base + 2]), "<f2")[0])
            dmin = float(np.frombuffer(bytes(self.sm[base + 2: base + 4]), "<f2")[0])
            JN = 8 // c["RPT"]
            for j in range(part * JN, part * JN + JN):
                if j < 4:
                    sc, mn = m[4 + j] & 63, m[8 + j] & 63
                else:
                    sc = (m[8 + j] & 0xF) | ((m[j] >> 6) << 4)
                    mn = (m[8 + j] >> 4) | ((m[4 + j] >> 6) << 4)
                dsc = d * sc * (0.0625 if (j & 1) and "div16" not in self.mut else 1.0)
                ndmm = -(dmin * mn)
                p = rperm(r)
                if c["FORM"] == 0:
                    put(2 * (j * BM + p), dsc)
                    put(2 * (j * BM + p) + 1, -MAGF * dsc)
                    hi, lo = tf32_split(ndmm)
                    put(4 * BM * 4 + aperm(r, j, self.mut), hi)     # byte 8 BM * 8 -> float 16 BM
                    put(4 * BM * 4 + 8 * BM + aperm(r, j, self.mut), lo)
                else:
                    put(3 * (j * BM + p), dsc)
                    put(3 * (j * BM + p) + 1, -MAGF * dsc)
                    put(3 * (j * BM + p) + 2, ndmm)
        cs0 = c["RS"] // 4
        for th in range(NT):
            cc, JC = th % BN, 8 // c["CPT"]
            j0 = (th // BN) * JC
            for j in range(j0, j0 + JC):
                o = c["OFF_S"] + sl * c["ST"] + 64 * cc + 8 * j
                self._read([o, o + 4])
                dx = float(np.frombuffer(bytes(self.sm[o:o + 4]), "<f4")[0])
                S = int(np.frombuffer(bytes(self.sm[o + 4:o + 8]), "<i4")[0])
                sx = dx * S
                if c["FORM"] == 0:
                    put(cs0 + j * BN + cperm(cc), dx)
                    hi, lo = tf32_split(sx)
                    bo = 1 if "bperm" in self.mut else 2
                    put(cs0 + 8 * BN + bperm(cc, j), hi)
                    put(cs0 + 8 * BN + bperm(cc, j) + bo, lo)
                else:
                    put(cs0 + 2 * (j * BN + cperm(cc)), dx)
                    put(cs0 + 2 * (j * BN + cperm(cc)) + 1, sx)
        self.pass_w.setdefault(self.iv, set()).update(wrote)

    # ---- fragment loads (all warps)
    def ldsm4(self, addrs):
        """addrs[warp][lane] flat byte addresses -> regs [warp][4][32 lanes][4 bytes]."""
        out = np.zeros((len(addrs), 4, 32, 4), np.uint8)
        offs = []
        for w, a in enumerate(addrs):
            for i in range(4):
                for t in range(32):
                    o = a[8 * i + t // 4] + 4 * (t % 4)
                    out[w, i, t] = self.sm[o:o + 4]
                    offs.append(o)
        self._read(offs)
        return out

    def warps(self):
        c = self.c
        return [(w // c["WN"], w % c["WN"]) for w in range(c["WM"] * c["WN"])]

    def load_raw(self, s, jp):
        c = self.c
        lanes = np.arange(32)
        res = []
        for mi in range(4):
            addrs = []
            for wm, wn in self.warps():
                if "araddr" in self.mut:
                    a_off = (wm * 64 + (lanes & 7) + 8 * (lanes >> 4)) * WS + 16 * ((lanes >> 3) & 1)
                else:
                    a_off = (wm * 64 + (lanes & 7) + 8 * ((lanes >> 3) & 1)) * WS + 16 * (lanes >> 4)
                addrs.append(c["OFF_W"] + (s % c["NS"]) * c["WT"] + a_off + mi * 16 * WS + 32 * jp)
            res.append(self.ldsm4(addrs))
        return np.stack(res, 1)   # [warp][mi][4][32][4]

    def load_b(self, s, j):
        c = self.c
        lanes = np.arange(32)
        res = []
        for np_ in range(2):
            addrs = []
            for wm, wn in self.warps():
                b_off = (wn * 32 + (lanes & 7) + 8 * (lanes >> 4)) * TS + 16 * ((lanes >> 3) & 1)
                addrs.append(c["OFF_X"] + (s % c["NS"]) * c["XT"] + b_off + np_ * 16 * TS + 32 * j)
            res.append(self.ldsm4(addrs))
        r = np.stack(res, 1)   # [warp][np][4][32][4]: regs B[2np][0], B[2np][1], B[2np+1][0], B[2np+1][1]
        B = np.zeros((r.shape[0], 4, 2, 32, 4), np.uint8)
        for n in range(4):
            B[:, n, 0] = r[:, n // 2, 2 * (n % 2)]
            B[:, n, 1] = r[:, n // 2, 2 * (n % 2) + 1]
        return B

    def _flt(self, byte_addr, n):
        i = (byte_addr - self.c["OFF_F"]) // 4
        self._read(range(byte_addr, byte_addr + 4 * n, 4))
        return self.fl[i:i + n]

    def load_s(self, s, j):
        """[warp][lane] -> (rs, cs) of the lane (GT_FORM 0: 16 + 8 floats; 1: 24 + 16)."""
        c = self.c
        F, BM, BN = c["FORM"], c["BM"], c["BN"]
        out = {}
        for w, (wm, wn) in enumerate(self.warps()):
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                fb = c["OFF_F"] + (s & 1) * c["FB"]
                r = fb + (wm * 64 + 8 * g) * (12 if F else 8) + j * BM * (12 if F else 8)
                cc = fb + c["RS"] + (wn * 32 + 8 * tig) * (8 if F else 4) + j * BN * (8 if F else 4)
                out[(w, lane)] = (self._flt(r, 24 if F else 16).copy(), self._flt(cc, 16 if F else 8).copy())
        return out

    def load_min(self, s, mis):
        """A quads (hi, lo) of m tiles mis and the B quads: [warp][lane]."""
        c = self.c
        fb = c["OFF_F"] + (s & 1) * c["FB"]
        out = {}
        for w, (wm, wn) in enumerate(self.warps()):
            for lane in range(32):
                rm = fb + 8 * c["BM"] * 8 + (wm * 4 * 32 + lane) * 16
                cm = fb + c["RS"] + 8 * c["BN"] * 4 + (wn * 4 * 32 + lane) * 16
                A = {mi: (self._flt(rm + 512 * mi, 4).copy(), self._flt(rm + 8 * c["BM"] * 4 + 512 * mi, 4).copy()) for mi in mis}
                Bq = [self._flt(cm + 512 * ni, 4).copy() for ni in range(4)]
                out[(w, lane)] = (A, Bq)
        return out

    # ---- math
    def compute(self, raw, B, S, hi):
        c = self.c
        for w in range(len(self.warps())):
            for mi in range(4):
                regs = raw[w, mi]   # [4][32][4] u8
                a = (regs & 0xF0) if (hi and "nibble" not in self.mut) else (regs & 0x0F)
                A = np.zeros((16, 32), np.int64)
                for i in range(4):   # PTX m16n8k32 A: a_i of lane (g, tig): row g + 8 (i & 1), k 16 (i >> 1) + 4 tig + b
                    for lane in range(32):
                        g, tig = lane >> 2, lane & 3
                        A[g + 8 * (i & 1), 16 * (i >> 1) + 4 * tig: 16 * (i >> 1) + 4 * tig + 4] = a[i, lane]
                for ni in range(4):
                    Bm = np.zeros((32, 8), np.int64)
                    for i in range(2):   # b_i of lane (g, tig): k 16 i + 4 tig + b, column g
                        for lane in range(32):
                            g, tig = lane >> 2, lane & 3
                            Bm[16 * i + 4 * tig: 16 * i + 4 * tig + 4, g] = B[w, ni, i, lane].view(np.int8)
                    I = A @ Bm
                    for lane in range(32):
                        g, tig = lane >> 2, lane & 3
                        rs, cs = S[(w, lane)]
                        for e in range(4):
                            h, ce = e >> 1, e & 1
                            Iv = float(I[g + 8 * h, 2 * tig + ce])
                            rr, ccn = 2 * mi + h, 2 * ni + ce
                            if c["FORM"] == 0:
                                p = (MAGF + Iv) * rs[2 * rr] + rs[2 * rr + 1]
                                self.acc[w, lane, mi, ni, e] += p * cs[ccn]
                            else:
                                p = (MAGF + Iv) * rs[3 * rr] + rs[3 * rr + 1]
                                self.acc[w, lane, mi, ni, e] += p * cs[2 * ccn] + rs[3 * rr + 2] * cs[2 * ccn + 1]

    def min_term(self, Mf, mis):
        for w in range(len(self.warps())):
            for mi in mis:
                for ni in range(4):
                    for ah in (0, 1):
                        for bh in (0, 1):   # hi hi, hi lo, lo hi (the kernel) + lo lo (exact model)
                            A = np.zeros((16, 8))
                            Bm = np.zeros((8, 8))
                            for lane in range(32):
                                g, tig = lane >> 2, lane & 3
                                Aq, Bq = Mf[(w, lane)]
                                a = Aq[mi][ah]
                                A[g, tig], A[g + 8, tig], A[g, tig + 4], A[g + 8, tig + 4] = a
                                b = Bq[ni][2 * bh: 2 * bh + 2]
                                Bm[tig, g], Bm[tig + 4, g] = b
                            D = A @ Bm
                            for lane in range(32):
                                g, tig = lane >> 2, lane & 3
                                for e in range(4):
                                    self.acc[w, lane, mi, ni, e] += D[g + 8 * (e >> 1), 2 * tig + (e & 1)]

    # ---- the kernel's schedule
    def run(self):
        c = self.c
        NS, nsb, PF, F = c["NS"], self.nsb, c["PF"], c["FORM"]
        self.load_meta0()
        for s in range(NS - 1):
            self.load_group(s)
        self.wait(NS - 2)
        self.bar()
        self.scalar_pass(0)
        if c["PASS"] == 7 and nsb > 1:
            self.scalar_pass(1)
        self.bar()
        self.load_group(NS - 1)

        def next_stage(s):
            self.wait(NS - 2)
            self.bar()
            self.load_group(s + NS)
            if c["PASS"] == 7 and s + 2 < nsb:
                self.scalar_pass(s + 2 if "passbuf" not in self.mut else s + 1)

        rawc = fcB = fcS = None
        if PF:
            rawc, fcB, fcS = self.load_raw(0, 0), self.load_b(0, 0), self.load_s(0, 0)
        for s in range(nsb):
            mf = None
            for j in range(8):
                hi = j & 1
                if PF:
                    if PF == 2 and "pf2race" not in self.mut:
                        fcS = self.load_s(s, j)
                    if j == 7:
                        next_stage(s)
                    if PF == 2 and "pf2race" in self.mut:
                        fcS = self.load_s(s, j)
                    rawn = fnB = fnS = None
                    if j < 7:
                        if hi:
                            rawn = self.load_raw(s, (j + 1) >> 1)
                        fnB = self.load_b(s, j + 1)
                        if PF == 1:
                            fnS = self.load_s(s, j + 1)
                    elif s + 1 < nsb:
                        rawn = self.load_raw(s + 1, 0)
                        fnB = self.load_b(s + 1, 0)
                        if PF == 1:
                            fnS = self.load_s(s + 1, 0)
                else:
                    if not hi:
                        rawc = self.load_raw(s, j >> 1)
                    fcB, fcS = self.load_b(s, j), self.load_s(s, j)
                if F == 0 and c["MINS"] == 0 and j == 0:
                    mf = self.load_min(s, range(4))
                if F == 0 and c["MINS"] == 1 and j < 4:
                    m2 = self.load_min(s, [j])
                    mf = m2 if mf is None else {k: ({**mf[k][0], **m2[k][0]}, m2[k][1]) for k in m2}
                if c["PASS"] < 7 and j == c["PASS"] and s + 1 < nsb:
                    self.scalar_pass(s + 1)
                self.compute(rawc, fcB, fcS, hi)
                if F == 0 and c["MINS"] == 0 and j == 0:
                    self.min_term(mf, range(4))
                if F == 0 and c["MINS"] == 1 and j < 4:
                    self.min_term(mf, [j])
                if F == 0 and c["MINS"] == 2 and j == 0:
                    for mi in range(4):
                        self.min_term(self.load_min(s, [mi]), [mi])
                if PF:
                    fcB = fnB
                    if PF == 1:
                        fcS = fnS
                    if hi:
                        rawc = rawn
            if not PF:
                next_stage(s)
        self.check_races()
        return self.outputs()

    def check_races(self):
        for g in self.groups:
            a, b, offs = g
            b = self.iv if b is None else b
            for i in range(a, b + 1):
                bad = self.reads.get(i, set()) & offs
                if bad:
                    raise Race(f"cp.async group issued in interval {a} (retired by {b}) overlaps {len(bad)} reads in interval {i}")
        for i, offs in self.pass_w.items():
            bad = self.reads.get(i, set()) & offs
            # the pass's own reads are of the meta / Q8Scale slots, never of the float area it writes
            if bad:
                raise Race(f"scalar pass in interval {i} writes {len(bad)} float-area words read in that interval")

    def outputs(self):
        out = {}
        if self.ks > 1:   # raw partials by weight row (the kernel's ws[z][col][wrow])
            for w, (wm, wn) in enumerate(self.warps()):
                for lane in range(32):
                    g, tig = lane >> 2, lane & 3
                    for ni in range(4):
                        for e in range(4):
                            col = self.cb + wn * 32 + ni * 8 + 2 * tig + (e & 1)
                            if col < self.nb:
                                for mi in range(4):
                                    out[(self.wrow(wm * 64 + 16 * mi + 8 * (e >> 1) + g), col)] = self.acc[w, lane, mi, ni, e]
            return out
        for w, (wm, wn) in enumerate(self.warps()):
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for ni in range(4):
                    for e in range(4):
                        col = self.cb + wn * 32 + ni * 8 + 2 * tig + (e & 1)
                        if col >= self.nb:
                            continue
                        if self.glu:
                            for mi in range(2):
                                row = self.ob + wm * 32 + 16 * mi + 8 * (e >> 1) + g
                                gt, up = self.acc[w, lane, mi, ni, e], self.acc[w, lane, mi + 2, ni, e]
                                out[(row, col)] = gt / (1 + np.exp(-np.clip(gt, -700, 700))) * up
                        else:
                            for mi in range(4):
                                out[(self.ob + wm * 64 + 16 * mi + 8 * (e >> 1) + g, col)] = self.acc[w, lane, mi, ni, e]
        return out


def replay(defs, glu, K=1024, nb=40, seed=5, mut=(), ks=1):
    """Every block of a small problem through Block.run(); (float64 rel err against the reference,
    every output once?)."""
    import tile as T
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    rng = np.random.default_rng(seed)
    c = _cfg(defs)
    BM, BN = c["BM"], c["BN"]
    obm = BM // 2 if glu else BM
    N = 2 * obm
    raw = MV.random_weight(Q4_K, 2 * N if glu else N, K, rng)
    x = T.make_x(rng, nb, K)
    q, s = quantize_q8_ref(x)
    ref = T.ref_rows(raw, glu, T.q8_dequant(x), np.arange(N))
    got = {}
    parts = [{} for _ in range(ks)]
    for bx in range(N // obm):
        for by in range(-(-nb // BN)):
            for z in range(ks):
                blk = Block(raw, q, s["d"], s["s"], defs, glu, bx * obm, by * BN, nb, mut, ks, z).run()
                dst = got if ks == 1 else parts[z]
                assert not (set(blk) & set(dst)), "an output written twice"
                dst.update(blk)
    if ks > 1:   # gemm_tile_reduce: parts in z order, then the glu
        for r in range(N):
            for cc in range(nb):
                a = sum(parts[z][(r, cc)] for z in range(ks))
                if glu:
                    u = sum(parts[z][(N + r, cc)] for z in range(ks))
                    a = a / (1 + np.exp(-np.clip(a, -700, 700))) * u
                got[(r, cc)] = a
    assert set(got) == {(r, cc) for r in range(N) for cc in range(nb)}, "outputs missing"
    y = np.array([[got[(r, cc)] for r in range(N)] for cc in range(nb)])
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref)), N


# ---------------------------------------------------------------------------------------
# the exact float32 chain of GT_FORM 1 (CPU reference for a bitwise device check)

def q4k_row_scalars(meta_row: np.ndarray):
    """(dsc [nsb, 8], ndmm [nsb, 8]) float32 of one row's meta plane (16 bytes per super-block)."""
    m = meta_row.reshape(-1, 16).astype(np.int64)
    d = m[:, 0:2].astype(np.uint8).copy().view("<f2").astype(np.float32)[:, 0]
    dmin = m[:, 2:4].astype(np.uint8).copy().view("<f2").astype(np.float32)[:, 0]
    sc = np.zeros((m.shape[0], 8), np.int64)
    mn = np.zeros_like(sc)
    for j in range(8):
        if j < 4:
            sc[:, j], mn[:, j] = m[:, 4 + j] & 63, m[:, 8 + j] & 63
        else:
            sc[:, j] = (m[:, 8 + j] & 0xF) | ((m[:, j] >> 6) << 4)
            mn[:, j] = (m[:, 8 + j] >> 4) | ((m[:, 4 + j] >> 6) << 4)
    dsc = (d[:, None] * sc.astype(np.float32)).astype(np.float32)     # exact (<= 17 bits)
    ndmm = (-(dmin[:, None] * mn.astype(np.float32))).astype(np.float32)
    return dsc, ndmm


def chain_ref(raw: np.ndarray, rows: np.ndarray, q: np.ndarray, xsd: np.ndarray, xss: np.ndarray) -> np.ndarray:
    """y[b, r] (float32) of the GT_FORM 1 chain for weight rows `rows` (plain, no activation): for each
    k32 block i in increasing k: p = fl(I dsc), acc = fma(p, dx, acc), acc = fma(ndmm, sx, acc), sx = fl(dx S)."""
    from memra.gpu.ops.matvec import pack_planes
    bulk, meta = pack_planes(raw[rows], Q4_K)
    nb, K = q.shape
    nblk = K // 32
    # weights' 4-bit q per element (k order) from the qs bytes: element 64 j' + l low, 64 j' + 32 + l high
    qs = bulk.reshape(len(rows), -1, 4, 32)
    w = np.zeros((len(rows), K // 256, 8, 32), np.int64)
    w[:, :, 0::2, :] = qs & 15
    w[:, :, 1::2, :] = qs >> 4
    w = w.reshape(len(rows), nblk, 32)
    qx = q.astype(np.int64).reshape(nb, nblk, 32)
    I = np.einsum("rik,bik->rbi", w, qx)                                # exact ints [rows, nb, nblk]
    dsc = np.zeros((len(rows), nblk), np.float32)
    ndmm = np.zeros_like(dsc)
    for n in range(len(rows)):
        a, b = q4k_row_scalars(meta[n])
        dsc[n], ndmm[n] = a.reshape(-1), b.reshape(-1)
    dx = xsd.astype(np.float32)
    sx = (dx.astype(np.float64) * xss.astype(np.float64)).astype(np.float32)   # fl(dx S)
    acc = np.zeros((len(rows), nb), np.float32)
    for i in range(nblk):
        p = (I[:, :, i].astype(np.float64) * dsc[:, i, None].astype(np.float64)).astype(np.float32)
        acc = fma32(p, np.broadcast_to(dx[None, :, i], acc.shape), acc)
        acc = fma32(np.broadcast_to(ndmm[:, i, None], acc.shape), np.broadcast_to(sx[None, :, i], acc.shape), acc)
    return acc.T
