"""model_q40: a numpy model of gemm_tile2_q40.cu's index maps, fragment builds and schedule (CPU),
replayed on small problems against float64 and, bit for bit, against the exact float32 chain.

What is modelled (a transcription of the kernel, in program order, all warps of a block):
- the cp.async ring: each thread's 16-byte chunks (raw weights with the Q8_0 rotation, activations with
  GT_XROT's, meta, Q8Scale: sources() / load_group()), their coverage (every byte of a slot's rows /
  columns written exactly once), the group schedule (prologue P, 0 .. NS-2, NS-1; then s + NS inside
  step 7 of stage s) and cp.async.wait_group;
- the scalar pass: f16 d of each block, d / 16 for Q4_0, the float-area layouts rperm / cperm;
- the k loop in the order of GT_PF / GT_PASS: ldmatrix.x2 (Q4_0) / .x4 (Q8_0) lane addresses on the raw
  tile (row stride 144 / 272), the Q4_0 nibble builds as 32-bit word operations on the ldmatrix words
  (lo(w) = ((w << 4) & 0xF0F0F0F0) ^ 0x80808080, hi(w) = (w & 0xF0F0F0F0) ^ 0x80808080) and their
  assignment to a0..a3, the B ldmatrix.x4 on the x tile (stride 272), the PTX fragment layout of
  mma.m16n8k32 s8 x s8, the magic-biased accumulator (int32 0x4B400000 + I' reinterpreted as float32),
  each lane's scalar loads, the two FFMAs in float32 (correctly rounded, model2.fma32), the epilogue;
- a race check: a cp.async group's writes may land anywhere between its issue and the barrier after the
  wait that retires it, a scalar-pass write anywhere in its barrier interval; a read of such a location
  inside that window is reported as a race.
Because the arithmetic is the kernel's float32 (not float64), the model's plain ks = 1 outputs must equal
chain_ref (an independent definition of the chain from the GGUF rows) bit for bit.
A transcription slip made identically in the kernel and here passes; mutations show what is caught.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gemm_tile2"))
sys.path.insert(0, str(HERE.parent / "gemm_tile"))
from model2 import fma32  # noqa: E402  (exact float32 fma, checked in gemm_tile2's dry run and again here)

Q4_0, Q8_0 = 2, 8
TS = 272
MAGIC = 0x4B400000
MAGF = np.float32(12582912.0)


class Race(Exception):
    pass


def _cfg(defs):
    qt = int(defs.get("GT_QT", 2))
    wm, wn = int(defs.get("GT_WM", 2)), int(defs.get("GT_WN", 4))
    c = dict(QT=qt, WM=wm, WN=wn, BM=64 * wm, BN=32 * wn, NT=32 * wm * wn, NS=int(defs.get("GT_STAGES", 2)),
             PF=int(defs.get("GT_PF", 1)), PFB=int(defs.get("GT_PFB", 1)), PASS=int(defs.get("GT_PASS", 7)), XROT=int(defs.get("GT_XROT", 1)))
    BM, BN, NT, NS = c["BM"], c["BN"], c["NT"], c["NS"]
    c["RB"] = 128 if qt == Q4_0 else 256
    c["CPR"], c["WS"] = c["RB"] // 16, c["RB"] + 16
    c["RS"], c["CS"] = 8 * BM * 8, 8 * BN * 4
    c["WT"], c["XT"], c["MT"], c["ST"] = BM * c["WS"], BN * TS, BM * 16, BN * 64
    c["OFF_W"] = 0
    c["OFF_X"] = NS * c["WT"]
    c["OFF_M"] = c["OFF_X"] + NS * c["XT"]
    c["OFF_S"] = c["OFF_M"] + NS * c["MT"]
    c["OFF_F"] = c["OFF_S"] + NS * c["ST"]
    c["FB"] = c["RS"] + c["CS"]
    c["TOTAL"] = c["OFF_F"] + 2 * c["FB"]
    c["WCH"], c["XCH"], c["SCH"] = BM * c["CPR"] // NT, BN * 16 // NT, BN * 4 // NT
    c["RPT"], c["CPT"] = NT // BM, NT // BN
    return c


def smem_bytes(defs) -> int:
    return _cfg(defs)["TOTAL"]


def rperm(r, mut=()):
    w, l = r >> 6, r & 63
    if "rperm" in mut:   # row halves h and m tiles swapped in the position
        return 64 * w + 8 * (l & 7) + 2 * ((l >> 3) & 1) + ((l >> 4) & 1) + 4 * (l >> 5)
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1)


def cperm(c):
    w, l = c >> 5, c & 31
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1)


def q4_lo(w, mut=()):
    if "shift" in mut:
        return ((w & np.uint32(0x0F0F0F0F)) ^ np.uint32(0x80808080)).astype(np.uint32)
    return (((w << np.uint32(4)) & np.uint32(0xF0F0F0F0)) ^ np.uint32(0x80808080)).astype(np.uint32)


def q4_hi(w, mut=()):
    if "offset" in mut:
        return (w & np.uint32(0xF0F0F0F0)).astype(np.uint32)
    return ((w & np.uint32(0xF0F0F0F0)) ^ np.uint32(0x80808080)).astype(np.uint32)


class Block:
    """One block of gemm_tile2_q40 replayed in program order."""

    def __init__(self, raw, q, xsd, xss, defs, glu, ob, cb, nb, mut=(), ks=1, z=0):
        from memra.gpu.ops.matvec import pack_planes
        self.c = c = _cfg(defs)
        self.mut = set(mut)
        self.glu, self.ob, self.cb, self.nb = glu, ob, cb, nb
        rows, K = raw.shape[0], q.shape[1]
        self.N = rows // 2 if glu else rows
        self.nsb = K // 256 // ks
        self.sb0 = z * self.nsb
        self.ks = ks
        self.bulk, self.meta = pack_planes(raw, c["QT"])
        assert self.bulk.shape[1] == K // 256 * c["RB"] and self.meta.shape[1] == K // 16
        self.q = q.view(np.uint8)
        xsb = np.zeros(xsd.shape, dtype=[("d", "<f4"), ("s", "<i4")])
        xsb["d"], xsb["s"] = xsd, xss
        self.xsb = xsb.view(np.uint8).reshape(xsd.shape[0], -1)
        self.sm = np.zeros(c["TOTAL"], np.uint8)
        self.fl = np.full(2 * c["FB"] // 4, np.nan, np.float32)
        self.iv = 0
        self.reads = {}
        self.pass_w = {}
        self.groups = []
        self.acc = np.zeros((c["WM"] * c["WN"], 32, 4, 4, 4), np.float32)
        self._chunk_maps()

    def wrow(self, r):
        if not self.glu:
            return self.ob + r
        w, l = r >> 6, r & 63
        return (0 if l < 32 else self.N) + self.ob + 32 * w + (l & 31)

    def _chunk_maps(self):
        c = self.c
        BM, BN, NT, CPR, WS = c["BM"], c["BN"], c["NT"], c["CPR"], c["WS"]
        self.wmap, self.xmap, self.smap = [], [], []
        for t in range(NT):
            r, part = (c["WCH"] * t) // CPR, (c["WCH"] * t) % CPR
            rot = 4 * (t & 1) if (c["WCH"] == 8 and CPR == 16 and c["XROT"]) else 0
            for i in range(c["WCH"]):
                ii = (rot + i) & (c["WCH"] - 1) if rot else i
                self.wmap.append((r * WS + 16 * part + 16 * ii, r, 16 * part + 16 * ii))
            xcol, xpart = (c["XCH"] * t) >> 4, (c["XCH"] * t) & 15
            rot = 4 * (t & 1) if c["XCH"] == 8 and c["XROT"] else 0
            for i in range(c["XCH"]):
                ii = (rot + i) & (c["XCH"] - 1)
                self.xmap.append((xcol * TS + 16 * xpart + 16 * ii, xcol, 16 * xpart + 16 * ii))
            scol, spart = (c["SCH"] * t) >> 2, (c["SCH"] * t) & 3
            for i in range(c["SCH"]):
                self.smap.append((scol * 64 + 16 * spart + 16 * i, scol, 16 * spart + 16 * i))
        for m, n, stride, width in ((self.wmap, BM, WS, c["RB"]), (self.xmap, BN, TS, 256), (self.smap, BN, 64, 64)):
            cov = np.zeros(n * stride, np.int64)
            for d, _, _ in m:
                cov[d:d + 16] += 1
            want = np.zeros(n * stride, np.int64)
            for r in range(n):
                want[r * stride: r * stride + width] = 1
            assert np.array_equal(cov, want), "a loader map does not cover its tile exactly once"

    def phase_conflicts(self):
        c = self.c
        out = {}
        for name, m, per in (("W", self.wmap, c["WCH"]), ("X", self.xmap, c["XCH"]), ("S", self.smap, c["SCH"])):
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
            self.sm[dst:dst + 16] = data
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
        NS, RB, wr = c["NS"], c["RB"], []
        if t < self.nsb:
            sl, sb = t % NS, self.sb0 + t
            wr += [(c["OFF_W"] + sl * c["WT"] + d, self.bulk[self.wrow(r), RB * sb + o: RB * sb + o + 16]) for d, r, o in self.wmap]
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
            g[1] = self.iv

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
        scale = np.float32(0.0625 if c["QT"] == Q4_0 and "div16" not in self.mut else 1.0)

        def put(i, v):
            self.fl[fb + i] = v
            wrote.add(c["OFF_F"] + 4 * (fb + i))
        for th in range(NT):
            r, JR = th % BM, 8 // c["RPT"]
            j0 = (th // BM) * JR
            for j in range(j0, j0 + JR):
                o = c["OFF_M"] + sl * c["MT"] + 16 * r + 2 * j
                self._read([o])
                d = np.float32(np.frombuffer(bytes(self.sm[o:o + 2]), "<f2")[0]) * scale
                p = rperm(r, self.mut)
                put(2 * (j * BM + p), d)
                put(2 * (j * BM + p) + 1, -MAGF * d)
        cs0 = c["RS"] // 4
        for th in range(NT):
            cc, JC = th % BN, 8 // c["CPT"]
            j0 = (th // BN) * JC
            for j in range(j0, j0 + JC):
                o = c["OFF_S"] + sl * c["ST"] + 64 * cc + 8 * j
                self._read([o])
                put(cs0 + j * BN + cperm(cc), np.frombuffer(bytes(self.sm[o:o + 4]), "<f4")[0])
        self.pass_w.setdefault(self.iv, set()).update(wrote)

    # ---- fragment loads (all warps)
    def ldsm(self, addrs, n):
        """addrs[warp][lane] flat byte addresses (matrix i's row r from lane 8 i + r) -> words
        [warp][n][32 lanes] uint32 (lane t: row t / 4, bytes 4 (t % 4) ..)."""
        out = np.zeros((len(addrs), n, 32, 4), np.uint8)
        offs = []
        for w, a in enumerate(addrs):
            for i in range(n):
                for t in range(32):
                    o = int(a[8 * i + t // 4]) + 4 * (t % 4)
                    out[w, i, t] = self.sm[o:o + 4]
                    offs.append(o)
        self._read(offs)
        return out.view("<u4")[..., 0]

    def warps(self):
        c = self.c
        return [(w // c["WN"], w % c["WN"]) for w in range(c["WM"] * c["WN"])]

    def load_raw(self, s, j):
        """[warp][mi][RAWN][32] words of step j: Q4_0 ldmatrix.x2 at byte 16 j, Q8_0 .x4 at byte 32 j."""
        c = self.c
        lanes = np.arange(32)
        q4 = c["QT"] == Q4_0
        res = []
        for mi in range(4):
            addrs = []
            for wm, wn in self.warps():
                if "araddr" in self.mut:
                    row, byte = (lanes & 7) + 8 * (lanes >> 4), 16 * ((lanes >> 3) & 1)
                else:
                    row, byte = (lanes & 7) + 8 * ((lanes >> 3) & 1), (0 if q4 else 16 * (lanes >> 4))
                a_off = (wm * 64 + row) * c["WS"] + byte
                addrs.append(c["OFF_W"] + (s % c["NS"]) * c["WT"] + a_off + mi * 16 * c["WS"] + (16 if q4 else 32) * j)
            res.append(self.ldsm(addrs, 2 if q4 else 4))
        return np.stack(res, 1)

    def load_b(self, s, j):
        c = self.c
        lanes = np.arange(32)
        res = []
        for np_ in range(2):
            addrs = []
            for wm, wn in self.warps():
                b_off = (wn * 32 + (lanes & 7) + 8 * (lanes >> 4)) * TS + 16 * ((lanes >> 3) & 1)
                addrs.append(c["OFF_X"] + (s % c["NS"]) * c["XT"] + b_off + np_ * 16 * TS + 32 * j)
            res.append(self.ldsm(addrs, 4))
        r = np.stack(res, 1)   # [warp][np][4][32]: B[2np][0], B[2np][1], B[2np+1][0], B[2np+1][1]
        B = np.zeros((r.shape[0], 4, 2, 32), np.uint32)
        for n in range(4):
            B[:, n, 0] = r[:, n // 2, 2 * (n % 2)]
            B[:, n, 1] = r[:, n // 2, 2 * (n % 2) + 1]
        return B

    def load_s(self, s, j):
        """(rs [warp][32][16], cs [warp][32][8]) float32 of each lane's LDS.128s."""
        c = self.c
        BM, BN = c["BM"], c["BN"]
        nw = len(self.warps())
        rs, cs = np.zeros((nw, 32, 16), np.float32), np.zeros((nw, 32, 8), np.float32)
        fb = c["OFF_F"] + (s & 1) * c["FB"]
        for w, (wm, wn) in enumerate(self.warps()):
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                r = fb + (wm * 64 + 8 * g) * 8 + j * BM * 8
                cc = fb + c["RS"] + (wn * 32 + 8 * tig) * 4 + j * BN * 4
                self._read(range(r, r + 64, 4))
                self._read(range(cc, cc + 32, 4))
                i, k = (r - c["OFF_F"]) // 4, (cc - c["OFF_F"]) // 4
                rs[w, lane], cs[w, lane] = self.fl[i:i + 16], self.fl[k:k + 8]
        return rs, cs

    # ---- math
    def afrag(self, raw_w_mi):
        """The 4 A words of each lane [4][32] from the step's raw words [RAWN][32]."""
        if self.c["QT"] == Q8_0:
            return raw_w_mi
        r0, r1 = raw_w_mi[0], raw_w_mi[1]
        if "nibble" in self.mut:   # a1 / a2 swapped
            return np.stack([q4_lo(r0, self.mut), q4_hi(r0, self.mut), q4_lo(r1, self.mut), q4_hi(r1, self.mut)])
        return np.stack([q4_lo(r0, self.mut), q4_lo(r1, self.mut), q4_hi(r0, self.mut), q4_hi(r1, self.mut)])

    def compute(self, raw, B, S):
        rs, cs = S
        lanes = np.arange(32)
        g, tig = lanes >> 2, lanes & 3
        for w in range(len(self.warps())):
            for mi in range(4):
                a = self.afrag(raw[w, mi]).astype("<u4").view(np.uint8).reshape(4, 32, 4).view(np.int8)
                A = np.zeros((16, 32), np.int64)
                for i in range(4):   # a_i of lane (g, tig): row g + 8 (i & 1), k 16 (i >> 1) + 4 tig + b
                    for b in range(4):
                        A[g + 8 * (i & 1), 16 * (i >> 1) + 4 * tig + b] = a[i, :, b]
                for ni in range(4):
                    Bm = np.zeros((32, 8), np.int64)
                    bb = B[w, ni].astype("<u4").view(np.uint8).reshape(2, 32, 4).view(np.int8)
                    for i in range(2):   # b_i of lane (g, tig): k 16 i + 4 tig + b, column g
                        for b in range(4):
                            Bm[16 * i + 4 * tig + b, g] = bb[i, :, b]
                    I = A @ Bm
                    for e in range(4):
                        h, ce = e >> 1, e & 1
                        Iv = I[g + 8 * h, 2 * tig + ce]
                        assert np.all(np.abs(Iv) < 2 ** 22), "magic bias range"
                        cbits = (MAGIC + Iv).astype(np.int32).view(np.float32)   # the IMMA's accumulator bits
                        rr, ccn = 2 * mi + h, 2 * ni + ce
                        p = fma32(cbits, rs[w, :, 2 * rr], rs[w, :, 2 * rr + 1])
                        self.acc[w, :, mi, ni, e] = fma32(p, cs[w, :, ccn], self.acc[w, :, mi, ni, e])

    # ---- the kernel's schedule
    def run(self):
        c = self.c
        NS, nsb, PF = c["NS"], self.nsb, c["PF"]
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
            for j in range(8):
                if PF:
                    if PF == 2 and "pf2race" not in self.mut:
                        fcS = self.load_s(s, j)
                    if j == 7:
                        next_stage(s)
                    if PF == 2 and "pf2race" in self.mut:
                        fcS = self.load_s(s, j)
                    rawn = fnB = fnS = None
                    if j < 7:
                        rawn = self.load_raw(s, j + 1)
                        fnB = self.load_b(s, j + 1)
                        if PF == 1:
                            fnS = self.load_s(s, j + 1)
                    elif s + 1 < nsb or c["PFB"]:   # GT_PFB 1: also at the last stage (stale, unused)
                        rawn = self.load_raw(s + 1, 0)
                        fnB = self.load_b(s + 1, 0)
                        if PF == 1:
                            fnS = self.load_s(s + 1, 0)
                else:
                    rawc = self.load_raw(s, j)
                    fcB, fcS = self.load_b(s, j), self.load_s(s, j)
                if c["PASS"] < 7 and j == c["PASS"] and s + 1 < nsb:
                    self.scalar_pass(s + 1)
                self.compute(rawc, fcB, fcS)
                if PF:
                    fcB, rawc = fnB, rawn
                    if PF == 1:
                        fcS = fnS
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
            if bad:
                raise Race(f"scalar pass in interval {i} writes {len(bad)} float-area words read in that interval")

    def outputs(self):
        """{(row, col): float32} (ks > 1: raw partials by weight row; glu: (gate, up) pairs)."""
        out = {}
        for w, (wm, wn) in enumerate(self.warps()):
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for ni in range(4):
                    for e in range(4):
                        col = self.cb + wn * 32 + ni * 8 + 2 * tig + (e & 1)
                        if col >= self.nb:
                            continue
                        if self.ks > 1 or not self.glu:
                            for mi in range(4):
                                r = wm * 64 + 16 * mi + 8 * (e >> 1) + g
                                row = self.wrow(r) if self.ks > 1 else self.ob + r
                                out[(row, col)] = self.acc[w, lane, mi, ni, e]
                        else:
                            for mi in range(2):
                                row = self.ob + wm * 32 + 16 * mi + 8 * (e >> 1) + g
                                out[(row, col)] = (self.acc[w, lane, mi, ni, e], self.acc[w, lane, mi + 2, ni, e])
        return out


def silu64(a):
    a = np.asarray(a, np.float64)
    return a / (1 + np.exp(-np.clip(a, -700, 700)))


def ref_rows(raw, qt, glu, xv, outs):
    """float64 reference y[:, outs] from memra's dequant_rows / matvec_ref."""
    from memra.gpu.ops import matvec as MV
    N = raw.shape[0] // 2 if glu else raw.shape[0]
    rows = np.concatenate([outs, N + outs]) if glu else outs
    wf = MV.dequant_rows(raw[rows], qt).astype(np.float64)
    return MV.matvec_ref(wf, xv, None, "silu" if glu else None)


def replay(defs, glu, K=1024, nb=40, seed=5, mut=(), ks=1):
    """Every block of a small problem through Block.run(): (float64 rel err, chain bits differing (plain,
    ks 1; else -1), N)."""
    import tile as T
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    rng = np.random.default_rng(seed)
    c = _cfg(defs)
    BM, BN = c["BM"], c["BN"]
    obm = BM // 2 if glu else BM
    N = 2 * obm
    raw = MV.random_weight(c["QT"], 2 * N if glu else N, K, rng)
    x = T.make_x(rng, nb, K)
    q, s = quantize_q8_ref(x)
    ref = ref_rows(raw, c["QT"], glu, T.q8_dequant(x), np.arange(N))
    got, parts = {}, [{} for _ in range(ks)]
    for bx in range(N // obm):
        for by in range(-(-nb // BN)):
            for z in range(ks):
                blk = Block(raw, q, s["d"], s["s"], defs, glu, bx * obm, by * BN, nb, mut, ks, z).run()
                dst = got if ks == 1 else parts[z]
                assert not (set(blk) & set(dst)), "an output written twice"
                dst.update(blk)
    if ks > 1:   # gemm_tile_reduce: float32 adds in z order, then the glu
        red = {}
        for r in range(2 * N if glu else N):
            for cc in range(nb):
                a = parts[0][(r, cc)]
                for z in range(1, ks):
                    a = np.float32(a + parts[z][(r, cc)])
                red[(r, cc)] = a
        got = {(r, cc): ((red[(r, cc)], red[(N + r, cc)]) if glu else red[(r, cc)]) for r in range(N) for cc in range(nb)}
    assert set(got) == {(r, cc) for r in range(N) for cc in range(nb)}, "outputs missing"
    if glu:
        y = np.array([[silu64(got[(r, cc)][0]) * np.float64(got[(r, cc)][1]) for r in range(N)] for cc in range(nb)])
    else:
        y = np.array([[got[(r, cc)] for r in range(N)] for cc in range(nb)], np.float64)
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    bits = -1
    if not glu and ks == 1:
        ch = chain_ref(raw, c["QT"], np.arange(N), q, s["d"])
        bits = int(np.count_nonzero(y.astype(np.float32).view(np.uint32) != ch.view(np.uint32)))
    return err, bits, N


# ---------------------------------------------------------------------------------------
# the exact float32 chain (GT_FORM 1; the device's bitwise check), defined from the GGUF rows

def block_ints(raw: np.ndarray, qt: int, K: int):
    """(q [rows, K/32, 32] int64 weights' integers (Q4_0: nibble - 8), d [rows, K/32] float32) from GGUF rows."""
    rows = raw.shape[0]
    bb = 18 if qt == Q4_0 else 34
    blk = raw.reshape(rows, K // 32, bb)
    d = blk[:, :, 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    if qt == Q4_0:
        qs = blk[:, :, 2:18].astype(np.int64)
        q = np.concatenate([(qs & 15) - 8, (qs >> 4) - 8], axis=2)   # element l low, l + 16 high
    else:
        q = blk[:, :, 2:34].view(np.int8).astype(np.int64)
    return q, d


def chain_ref(raw: np.ndarray, qt: int, rows: np.ndarray, q: np.ndarray, xsd: np.ndarray) -> np.ndarray:
    """y[b, r] float32 of the chain for weight rows `rows` (plain): acc = 0; for each k32 block i in
    increasing k: acc = fma(fl(I_i d_i), dx_i, acc), I_i the exact int dot of the block."""
    nb, K = q.shape
    w, d = block_ints(raw[rows], qt, K)
    qx = q.astype(np.int64).reshape(nb, K // 32, 32)
    I = np.einsum("rik,bik->rbi", w, qx)
    dx = xsd.astype(np.float32)
    acc = np.zeros((len(rows), nb), np.float32)
    for i in range(K // 32):
        p = (I[:, :, i].astype(np.float64) * d[:, i, None].astype(np.float64)).astype(np.float32)   # fl(I d): exact product, one rounding
        acc = fma32(p, np.broadcast_to(dx[None, :, i], acc.shape), acc)
    return acc.T
