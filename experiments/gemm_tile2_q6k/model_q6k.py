"""model_q6k.py — a numpy transcription of gemm_tile2_q6k.cu's data movement and arithmetic, replayed for
whole small problems, and the CPU references the device run compares bit for bit.

replay(defs, N, K, nb, ks, mut) runs every block of the grid in the kernel's program order: each thread's
cp.async chunks (load_group / load_meta / load_scales, byte offsets as in the kernel) into a byte image of
the shared memory, the ring (a cp.async write is pending from its issue until the cp.async.wait_group +
__syncthreads that retires it: a read of a pending byte is a race), the cooperative scalar pass (rperm /
cperm, the meta window's 2 (sb & 1) offset; a shared write is tagged with its barrier interval and a read
in the same interval by the k loop is a race), per warp the ldmatrix.x4 lane addresses on the raw ql / qh
and activation tiles, build_s / build per lane word, the PTX fragment layouts of m16n8k16 (A: a0 row g
k 4 tig.., a1 row g + 8; B: b0 k 4 tig.., column g; D: c0 (g, 2 tig), c1 (g, 2 tig + 1), c2, c3 rows + 8)
and m16n8k32 (the offset IMMA of GT_SIGNED 0), the formulas (float32 with a correctly rounded fma),
the GT_PF register schedule (raw words of the next half loaded after quarters 2 / 3, B one step ahead),
the epilogue and the split-K reduction in z order. A transcription: a slip made identically in the
kernel and here passes; the mutations check that the model notices the slips it is meant to.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile2"))
from model2 import fma32  # noqa: E402  (correctly rounded float32 fma)

Q6_K = 14
MAGF = np.float32(12582912.0)
MAGIC = 0x4B400000


class Race(Exception):
    pass


def u32(a):
    return np.asarray(a, dtype=np.uint64) & 0xFFFFFFFF


def consts(defs):
    WM, WN, NS = int(defs.get("GT_WM", 2)), int(defs.get("GT_WN", 4)), int(defs.get("GT_STAGES", 2))
    form = int(defs.get("GT_FORM", 0))
    NT, BM, BN = 32 * WM * WN, 64 * WM, 32 * WN
    WS, TS, MS = 208, 272, 20
    RS = 8 * BM * 8 + BM * 4 if form else 8 * BM * 16
    CS = 8 * BN * 4
    c = dict(WM=WM, WN=WN, NS=NS, form=form, NT=NT, BM=BM, BN=BN, WS=WS, TS=TS, MS=MS, RS=RS, CS=CS,
             WT=BM * WS, XT=BN * TS, MT=BM * MS, ST=BN * 64, signed=int(defs.get("GT_SIGNED", 1)),
             pf=int(defs.get("GT_PF", 1)), coop=int(defs.get("GT_COOP", 0)))
    c["OFF_W"] = 0
    c["OFF_X"] = NS * c["WT"]
    c["OFF_M"] = c["OFF_X"] + NS * c["XT"]
    c["OFF_S"] = c["OFF_M"] + NS * c["MT"]
    c["OFF_F"] = c["OFF_S"] + NS * c["ST"]
    c["F"] = RS + CS
    c["OFF_U"] = c["OFF_F"] + 2 * c["F"]
    c["SMEM"] = c["OFF_U"] + (BM * 272 if c["coop"] else 0)
    c["WCH"], c["XCH"], c["SCH"] = BM * 12 // NT, BN * 16 // NT, BN * 4 // NT
    c["MCH"] = -(-BM * 5 // NT)
    c["RPT"], c["CPT"] = NT // BM, NT // BN
    return c


def rperm(r):
    w, l = r >> 6, r & 63
    return 64 * w + 8 * (l & 7) + 2 * (l >> 4) + ((l >> 3) & 1)


def cperm(c):
    w, l = c >> 5, c & 31
    return 32 * w + 8 * ((l >> 1) & 3) + 2 * (l >> 3) + (l & 1)


# The kernel's inline-asm LOP3 helpers, evaluated from gemm_tile2_q6k.cu's own text (their LUT immediates
# and operand order), not from their intent: ptxas executes the LUT, so a LUT that does not compute what
# its comment says must show up here. (It did: and_m's 0x88 is b & c = m & 0 = 0, which dropped every qh
# bit on the H200 while this model, which wrote H & m, passed.)
SRC = HERE / "gemm_tile2_q6k.cu"


def lop3(a, b, c, lut):
    """PTX lop3.b32: bit i of the result = bit (4 a_i + 2 b_i + c_i) of lut (lut = F(0xF0, 0xCC, 0xAA))."""
    a, b, c = u32(a), u32(b), u32(c)
    r = np.zeros_like(a)
    for idx in range(8):
        if (lut >> idx) & 1:
            ma = a if idx & 4 else ~a
            mb = b if idx & 2 else ~b
            mc = c if idx & 1 else ~c
            r |= ma & mb & mc
    return r & 0xFFFFFFFF


def kernel_lop3(src=None):
    """{helper name: (operand tokens, lut)} of the one-lop3 helpers sel_nib / and_m in the kernel source.
    Operand tokens: '%1'.. the helper's asm inputs in order, or a literal."""
    import re
    text = (src or SRC).read_text() if not isinstance(src, str) else src
    out = {}
    for name in ("sel_nib", "and_m"):
        m = re.search(r"uint32_t " + name + r"\([^)]*\)\s*\{[^}]*?asm\(\"lop3\.b32 %0, ([^,]+), ([^,]+), ([^,]+), "
                      r"(0x[0-9A-Fa-f]+);\"\s*:\s*\"=r\"\(r\)\s*:([^;]*)\);", text, re.S)
        assert m, f"model_q6k: no single-lop3 helper {name} in {SRC.name}"
        ins = re.findall(r'"r"\(([^)]*)\)', m.group(5))
        ops = []
        for tok in m.group(1, 2, 3):
            tok = tok.strip()
            if tok.startswith("%"):
                e = ins[int(tok[1:]) - 1].strip().rstrip("u").rstrip("U")
                ops.append(int(e, 0) if e[:1].isdigit() else e)   # a literal, or the helper's argument name
            else:
                ops.append(int(tok, 0))
        out[name] = (ops, int(m.group(4), 16))
    return out


_LOP3 = None


def _helper(name, args, mut=()):
    """Evaluate helper `name` with its arguments {arg name: value} by the kernel's lop3."""
    global _LOP3
    if _LOP3 is None:
        _LOP3 = kernel_lop3()
    ops, lut = _LOP3[name]
    if name == "and_m" and "andlut" in mut:
        lut = 0x88
    return lop3(*[args[o] if isinstance(o, str) else o for o in ops], lut)


def sel_nib(T, lo, mut=()):
    return _helper("sel_nib", {"T": T, "lo": lo}, mut)


def and_m(H, m, mut=()):
    return _helper("and_m", {"H": H, "m": m}, mut)


def build_s(L, H, g, mut=()):
    """The kernel's build_s as written: sel_nib(and_m(H, mask) (shifted) + off, L (>> 4))."""
    L, H = u32(L), u32(H)
    off = 0xF0F0F0F0 if "offset16" in mut else 0xE0E0E0E0
    if g == 0:
        return sel_nib((and_m(H, 0x03030303, mut) * 16 + off) & 0xFFFFFFFF, L, mut)
    if g == 1:
        return sel_nib((and_m(H, 0x0C0C0C0C, mut) * 4 + off) & 0xFFFFFFFF, L, mut)
    if g == 2:
        return sel_nib((and_m(H, 0x30303030, mut) + off) & 0xFFFFFFFF, L >> 4, mut)
    if "qhshift" in mut:   # quarter 3 takes quarter 2's qh bits 4-5
        return sel_nib((and_m(H, 0x30303030, mut) + off) & 0xFFFFFFFF, L >> 4, mut)
    return sel_nib(((and_m(H, 0xC0C0C0C0, mut) >> 2) + off) & 0xFFFFFFFF, L >> 4, mut)


def build_s_intent(L, H, g):
    """build_s as its comment defines it: the bytes q - 32 (s8) of quarter g, q = lo | hi << 4, byte by byte."""
    L, H = u32(L), u32(H)
    r = np.zeros_like(L)
    for k in range(4):
        lo = (L >> (8 * k + 4 * (g >> 1))) & 15
        hi = (H >> (8 * k + 2 * g)) & 3
        r |= (((lo | hi << 4) + 224) & 0xFF) << (8 * k)
    return r


def build_u(L, H, g):
    L, H = u32(L), u32(H)
    if g == 0:
        return (L & 0x0F0F0F0F) | (((H & 0x03030303) << 4) & 0xFFFFFFFF)
    if g == 1:
        return (L & 0x0F0F0F0F) | (((H & 0x0C0C0C0C) << 2) & 0xFFFFFFFF)
    if g == 2:
        return ((L >> 4) & 0x0F0F0F0F) | (H & 0x30303030)
    return ((L >> 4) & 0x0F0F0F0F) | ((H >> 2) & 0x30303030)


def bytes_of(words, signed):
    """[32] u32 words -> [32, 4] int64 bytes (little-endian), s8 or u8."""
    b = np.stack([(words >> (8 * i)) & 0xFF for i in range(4)], -1).astype(np.int64)
    return np.where(b >= 128, b - 256, b) if signed else b


def wrap32(v):
    v = np.asarray(v, np.int64) & 0xFFFFFFFF
    return np.where(v >= 2 ** 31, v - 2 ** 32, v)


def mma_k16(a0, a1, b0, C, a_signed):
    """m16n8k16 8-bit: lanes' a0, a1, b0 words, C [32, 4] int -> D [32, 4] int32."""
    A = np.zeros((16, 16), np.int64)
    B = np.zeros((16, 8), np.int64)
    ab0, ab1, bb = bytes_of(a0, a_signed), bytes_of(a1, a_signed), bytes_of(b0, True)
    for l in range(32):
        g, t = l >> 2, l & 3
        A[g, 4 * t:4 * t + 4] = ab0[l]
        A[g + 8, 4 * t:4 * t + 4] = ab1[l]
        B[4 * t:4 * t + 4, g] = bb[l]
    D = A @ B
    out = np.zeros((32, 4), np.int64)
    for l in range(32):
        g, t = l >> 2, l & 3
        out[l] = [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
    return wrap32(out + C)


def mma_off(b0, b1, c0):
    """GT_SIGNED 0's offset IMMA (m16n8k32 s8): A = -32 on rows 0-7 x k 0-15 and rows 8-15 x k 16-31."""
    Da = mma_k16(np.full(32, 0xE0E0E0E0), np.zeros(32, np.int64), b0, 0, True)   # rows 0-7: -32 Sa
    Db = mma_k16(np.zeros(32, np.int64), np.full(32, 0xE0E0E0E0), b1, 0, True)   # rows 8-15: -32 Sb
    return wrap32(np.stack([Da[:, 0], Da[:, 1], Db[:, 2], Db[:, 3]], -1) + c0)


class Smem:
    """Byte image of a block's shared memory; pending cp.async bytes (group id) and the barrier
    interval of each plain shared write."""

    def __init__(self, n):
        self.b = np.zeros(n, np.uint8)
        self.pend = np.full(n, -1, np.int64)
        self.wiv = np.full(n, -1, np.int64)
        self.iv = 0
        self.groups = []      # [(gid, [(dst, bytes)])]
        self.cur = []
        self.gid = 0

    def cp_async(self, dst, src_bytes):
        self.cur.append((dst, src_bytes))
        self.pend[dst:dst + len(src_bytes)] = self.gid

    def commit(self):
        self.groups.append((self.gid, self.cur))
        self.cur = []
        self.gid += 1

    def wait(self, n):
        """cp.async.wait_group n then __syncthreads: all but the newest n groups land."""
        keep = self.groups[len(self.groups) - n:] if n else []
        for gid, writes in self.groups[:len(self.groups) - n]:
            for dst, data in writes:
                self.b[dst:dst + len(data)] = data
                sel = self.pend[dst:dst + len(data)] == gid
                self.pend[dst:dst + len(data)][sel] = -1
        self.groups = keep
        self.barrier()

    def barrier(self):
        self.iv += 1

    def read(self, a, n, what=""):
        if (self.pend[a:a + n] >= 0).any():
            raise Race(f"read of a pending cp.async byte ({what} at {a})")
        return self.b[a:a + n]

    def read_k(self, a, n, what=""):   # a read by the k loop: no pass write in the same barrier interval
        if (self.wiv[a:a + n] == self.iv).any():
            raise Race(f"read of a shared write (scalar pass or unpack) in the same barrier interval ({what} at {a})")
        return self.read(a, n, what)

    def write(self, a, data):
        data = np.asarray(data).view(np.uint8).ravel()
        if (self.pend[a:a + len(data)] >= 0).any():
            raise Race(f"shared write over a pending cp.async byte at {a}")
        self.b[a:a + len(data)] = data
        self.wiv[a:a + len(data)] = self.iv

    def u32(self, addrs, what="", k=True):
        return np.array([self.read_k(int(a), 4, what).view(np.uint32)[0] if k else self.read(int(a), 4, what).view(np.uint32)[0]
                         for a in addrs], np.uint64)


def ldsm4(sm, addr, what):
    """ldmatrix.x4 (b16, no trans): lane addresses [32] -> 4 regs [32] u32 (matrix i from lanes 8 i ..)."""
    regs = []
    for i in range(4):
        rows = addr[8 * i:8 * i + 8]
        regs.append(sm.u32([rows[l >> 2] + 4 * (l & 3) for l in range(32)], what))
    return regs


def replay(defs, N, K, nb, ks=1, mut=(), seed=0, raw=None, x=None):
    """(y [nb, N] float32 of the replay, raw, q, xs) for a random problem (or the given raw / x)."""
    from memra.gpu.ops.matvec import pack_planes, random_weight
    from memra.gpu.q8 import quantize_q8_ref
    c = consts(defs)
    rng = np.random.default_rng(seed)
    if raw is None:
        raw = random_weight(Q6_K, N, K, rng)
    if x is None:
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0
    q, s = quantize_q8_ref(x)
    bulk, meta = pack_planes(raw, Q6_K)
    gb, gm = bulk.ravel(), meta.ravel()
    gx = q.view(np.uint8).ravel()
    gs = s.view(np.uint8).ravel()
    assert K % 512 == 0 and (K // 256) % ks == 0 and N % c["BM"] == 0 and not (ks > 1 and c["form"] == 1)
    ws = np.full((ks, nb, N), np.nan, np.float32)
    written = np.zeros((ks, nb, N), np.int64)
    for bx in range(N // c["BM"]):
        for by in range(-(-nb // c["BN"])):
            for bz in range(ks):
                block(c, bx, by, bz, ks, N, K, nb, gb, gm, gx, gs, ws, written, mut)
    cols = np.arange(nb)
    assert (written[:, cols] == 1).all(), "every output written exactly once"
    y = ws[0].copy()
    for z in range(1, ks):   # gemm_tile_q6k_reduce: z order
        y = (y + ws[z]).astype(np.float32)
    return y, raw, q, s


def block(c, bx, by, bz, ks, N, K, nb, gb, gm, gx, gs, ws, written, mut):
    NS, NT, BM, BN, WS, TS, MS = c["NS"], c["NT"], c["BM"], c["BN"], c["WS"], c["TS"], c["MS"]
    form, signed, pf, coop = c["form"], c["signed"], c["pf"], c["coop"]
    ob, cb = bx * BM, by * BN
    nsb = K // 256 // ks
    sb0 = bz * nsb
    nblk = K // 256
    sm = Smem(c["SMEM"])

    def load_meta(slot, sb):
        for t in range(NT):
            for i in range(c["MCH"]):
                cc = t + NT * i
                if cc < BM * 5:
                    r, part = cc // 5, cc % 5
                    shift = 0 if "metawin" in mut else 2 * (sb & 1)
                    src = (ob + r) * nblk * 18 + 18 * sb - shift + 4 * part
                    assert src % 4 == 0 and src + 4 <= gm.size, "meta cp.async alignment / bounds"
                    sm.cp_async(c["OFF_M"] + slot * c["MT"] + MS * r + 4 * part, gm[src:src + 4])

    def load_scales(slot, sb):
        for t in range(NT):
            scol, spart = (c["SCH"] * t) >> 2, (c["SCH"] * t) & 3
            xs = min(cb + scol, nb - 1) * (K // 32) * 8 + 16 * spart
            for i in range(c["SCH"]):
                src = xs + 64 * sb + 16 * i
                sm.cp_async(c["OFF_S"] + slot * c["ST"] + scol * 64 + 16 * spart + 16 * i, gs[src:src + 16])

    def load_group(tt):
        if tt < nsb:
            sb, slot = sb0 + tt, tt % NS
            for t in range(NT):
                r, part = (c["WCH"] * t) // 12, (c["WCH"] * t) % 12
                wq = (ob + r) * (K // 256 * 192) + 192 * sb + 16 * part
                for i in range(c["WCH"]):
                    sm.cp_async(c["OFF_W"] + slot * c["WT"] + r * WS + 16 * part + 16 * i, gb[wq + 16 * i:wq + 16 * i + 16])
                xcol, xpart = (c["XCH"] * t) >> 4, (c["XCH"] * t) & 15
                xq = min(cb + xcol, nb - 1) * K + 256 * sb + 16 * xpart
                rot = 64 * (t & 1) if c["XCH"] == 8 else 0
                for i in range(c["XCH"]):
                    xr = -rot if (c["XCH"] == 8 and i >= 4) else rot
                    src = xq + xr + 16 * i
                    sm.cp_async(c["OFF_X"] + slot * c["XT"] + xcol * TS + 16 * xpart + xr + 16 * i, gx[src:src + 16])
        if tt + 1 < nsb:
            mslot = tt % NS if "ring" in mut else (tt + 1) % NS
            load_meta(mslot, sb0 + tt + 1)
            load_scales(mslot, sb0 + tt + 1)
        sm.commit()

    def scalar_pass(ts, sb):
        slot = ts % NS
        f = c["OFF_F"] + (ts & 1) * c["F"]
        for t in range(NT):
            if t < BM * c["RPT"]:
                JR = 8 // c["RPT"]
                r, j0 = t % BM, (t // BM) * JR
                m = c["OFF_M"] + slot * c["MT"] + MS * r + 2 * (sb & 1)
                d = np.float32(sm.read(m + 16, 2).copy().view(np.float16)[0])
                p = rperm(r)
                for jj in range(JR):
                    j = j0 + jj
                    sc2 = sm.read(m + 2 * j, 2).copy().view(np.int8).astype(np.int64)
                    sa, sbb = int(sc2[0]), int(sc2[1 if "scidx" not in mut else 0])
                    if form == 0:
                        da, db = np.float32(d * np.float32(sa)), np.float32(d * np.float32(sbb))
                        sm.write(f + 16 * (j * BM + p), np.array([da, -MAGF * da, db, -MAGF * db], np.float32))
                    else:
                        sm.write(f + 8 * (j * BM + p), np.array([sa, sbb], np.int32))
                if form == 1 and j0 == 0:
                    sm.write(f + 8 * BM * 8 + 4 * p, np.array([d], np.float32))
            if t < BN * c["CPT"]:
                JC = 8 // c["CPT"]
                col, j0 = t % BN, (t // BN) * JC
                for jj in range(JC):
                    j = j0 + jj
                    dx = sm.read(c["OFF_S"] + slot * c["ST"] + 64 * col + 8 * j, 4).copy().view(np.float32)
                    sm.write(c["OFF_F"] + (ts & 1) * c["F"] + c["RS"] + 4 * (j * BN + cperm(col)), dx)

    def unpack(slot):   # GT_COOP: all threads, raw slot -> the int8 tile of q - 32 (stride 272)
        for u in range(BM * 4):
            r, n, lh = u >> 2, (u >> 1) & 1, u & 1
            src = c["OFF_W"] + slot * c["WT"] + r * WS + 16 * lh
            L0 = sm.read(src + 64 * n, 16, "unpack ql").copy().view(np.uint32).astype(np.uint64)
            L1 = sm.read(src + 64 * n + 32, 16, "unpack ql").copy().view(np.uint32).astype(np.uint64)
            H = sm.read(src + 128 + 32 * n, 16, "unpack qh").copy().view(np.uint32).astype(np.uint64)
            for gq in range(4):
                wds = build_s(L1 if gq & 1 else L0, H, gq, mut).astype(np.uint32)
                sm.write(c["OFF_U"] + r * 272 + 128 * n + 16 * lh + 32 * gq, wds)

    # prologue
    load_meta(0, sb0)
    load_scales(0, sb0)
    sm.commit()
    for s in range(NS - 1):
        load_group(s)
    sm.wait(NS - 2)
    scalar_pass(0, sb0)
    if nsb > 1:
        scalar_pass(1, sb0 + 1)
    if coop:
        unpack(0)
    sm.barrier()
    load_group(NS - 1)

    lane = np.arange(32)
    g, tig = lane >> 2, lane & 3
    warps = []
    for warp in range(NT // 32):
        wm, wn = warp // c["WN"], warp % c["WN"]
        if "araddr" in mut:
            a_off = (wm * 64 + (lane & 7) + 8 * (lane >> 4)) * WS + 16 * ((lane >> 3) & 1)
        else:
            a_off = (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + 16 * (lane >> 4)
        b_off = (wn * 32 + (lane & 7) + 8 * (lane >> 4)) * TS + 16 * ((lane >> 3) & 1)
        r_off = (wm * 64 + 8 * g) * (8 if form else 16)
        c_off = c["RS"] + (wn * 32 + 8 * tig) * 4
        u_off = c["OFF_U"] + (wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1)) * 272 + 16 * (lane >> 4)
        warps.append(dict(wm=wm, wn=wn, a_off=a_off, b_off=b_off, r_off=r_off, c_off=c_off, u_off=u_off, Ac=None, An=None,
                          acc=np.zeros((4, 4, 4, 32), np.float32), L=[[None, None] for _ in range(4)], H=[None] * 4,
                          Bc=None, Bn=None))

    def addr(w, s):
        return dict(w=c["OFF_W"] + (s % NS) * c["WT"] + w["a_off"], x=c["OFF_X"] + (s % NS) * c["XT"] + w["b_off"],
                    r=c["OFF_F"] + (s & 1) * c["F"] + w["r_off"], c=c["OFF_F"] + (s & 1) * c["F"] + w["c_off"],
                    f=c["OFF_F"] + (s & 1) * c["F"])

    def load_L(w, a, n, cpl):
        for mi in range(4):
            w["L"][mi][cpl] = ldsm4(sm, a["w"] + mi * 16 * WS + 64 * n + 32 * cpl, "ql")

    def load_H(w, a, n):
        for mi in range(4):
            w["H"][mi] = ldsm4(sm, a["w"] + mi * 16 * WS + 128 + 32 * n, "qh")

    def load_au(w, j):
        return [ldsm4(sm, w["u_off"] + mi * 16 * 272 + 32 * j, "unpacked tile") for mi in range(4)]

    def load_b(a, j):
        B = [None] * 4
        for np_ in range(2):
            r = ldsm4(sm, a["x"] + np_ * 16 * TS + 32 * j, "x")
            B[2 * np_], B[2 * np_ + 1] = (r[0], r[1]), (r[2], r[3])
        return B

    def f32(words):
        return np.asarray(words, np.uint64).astype(np.uint32).view(np.float32)

    def compute(w, a, j, gq):
        cs = np.stack([f32(sm.u32(a["c"] + j * BN * 4 + 4 * k, "cols")) for k in range(8)])   # [8, 32]
        rbase = a["r"] + j * BM * (8 if form else 16)
        B = w["Bc"]
        c0 = 0 if form else MAGIC
        if signed or coop:
            o = [np.full((32, 4), c0, np.int64) for _ in range(4)]
        else:
            o = [mma_off(B[ni][0], B[ni][1], c0) for ni in range(4)]
        signed_a = signed or coop
        if form == 1:
            dd = np.stack([f32(sm.u32(a["f"] + 8 * BM * 8 + (w["wm"] * 64 + 8 * g) * 4 + 4 * k, "d")) for k in range(8)])
        for mi in range(4):
            if form == 0:
                rs = [[f32(sm.u32(rbase + 32 * mi + 16 * h + 4 * k, "rows")) for k in range(4)] for h in range(2)]
            else:
                rs = [[wrap32(sm.u32(rbase + 16 * mi + 8 * h + 4 * k, "rows")) for k in range(2)] for h in range(2)]
            Lw, Hw = (None, None) if coop else (w["L"][mi][gq & 1], w["H"][mi])
            if coop:
                A = w["Ac"][mi]
            else:
                A = [build_s(Lw[r], Hw[r], gq, mut) if signed else build_u(Lw[r], Hw[r], gq) for r in range(4)]
            for ni in range(4):
                oa = np.stack([o[ni][:, 0], o[ni][:, 1], o[ni][:, 0], o[ni][:, 1]], -1)
                ob_ = np.stack([o[ni][:, 2], o[ni][:, 3], o[ni][:, 2], o[ni][:, 3]], -1)
                ca = mma_k16(A[0], A[1], B[ni][0], oa, signed_a)
                cbv = mma_k16(A[2], A[3], B[ni][1], ob_, signed_a)
                for e in range(4):
                    h, cc = e >> 1, 2 * ni + (e & 1)
                    accv = w["acc"][mi, ni, e]
                    if form == 0:
                        pa = fma32(f32(ca[:, e] & 0xFFFFFFFF), rs[h][0], rs[h][1])
                        t_ = fma32(pa, cs[cc], accv)
                        pb = fma32(f32(cbv[:, e] & 0xFFFFFFFF), rs[h][2], rs[h][3])
                        w["acc"][mi, ni, e] = fma32(pb, cs[cc], t_)
                    else:
                        J = wrap32(ca[:, e] * rs[h][0] + cbv[:, e] * rs[h][1])
                        p = (J.astype(np.float32) * dd[2 * mi + h]).astype(np.float32)
                        assert (np.abs(J) <= 2 ** 24).all()
                        w["acc"][mi, ni, e] = fma32(p, cs[cc], accv)

    ac = {id(w): addr(w, 0) for w in warps}
    if coop:
        for w in warps:
            w["Ac"] = load_au(w, 0)
            w["Bc"] = load_b(ac[id(w)], 0)
        for s in range(nsb):
            for j in range(8):
                for w in warps:
                    a = ac[id(w)]
                    if j < 7:
                        w["Bn"] = load_b(a, j + 1)
                        w["An"] = load_au(w, j + 1)
                    compute(w, a, j, j & 3)
                if j == 7:
                    sm.wait(NS - 2)
                    load_group(s + NS)
                    if s + 2 < nsb:
                        scalar_pass(s + 2, sb0 + s + 2)
                    if s + 1 < nsb:
                        unpack((s + 1) % NS)
                        if "coopbar" not in mut:
                            sm.barrier()
                        for w in warps:
                            w["Bn"] = load_b(addr(w, s + 1), 0)
                            w["An"] = load_au(w, 0)
                for w in warps:
                    w["Bc"], w["Ac"] = w["Bn"], w["An"]
            for w in warps:
                ac[id(w)] = addr(w, s + 1)
    if pf and not coop:
        for w in warps:
            a = ac[id(w)]
            load_L(w, a, 0, 0)
            load_L(w, a, 0, 1)
            load_H(w, a, 0)
            w["Bc"] = load_b(a, 0)
    for s in (range(nsb) if not coop else ()):
        for n in range(2):
            for qq in range(4):
                j = 4 * n + qq
                for w in warps:   # the barrier interval's reads of every warp, in program order
                    a = ac[id(w)]
                    if pf:
                        if j < 7:
                            w["Bn"] = load_b(a, j + 1)
                        compute(w, a, j, qq)
                        if j == (1 if "pfearly" in mut else 2):
                            load_L(w, a, 1, 0)
                        if j == 3:
                            load_L(w, a, 1, 1)
                            load_H(w, a, 1)
                    else:
                        if qq == 0:
                            load_L(w, a, n, 0)
                            load_L(w, a, n, 1)
                            load_H(w, a, n)
                        w["Bc"] = load_b(a, j)
                        compute(w, a, j, qq)
                if pf and j == 7:
                    sm.wait(NS - 2)
                    load_group(s + NS)
                    if s + 2 < nsb:
                        scalar_pass(s + (1 if "passbuf" in mut else 2), sb0 + s + 2)
                    if s + 1 < nsb:
                        for w in warps:
                            an = addr(w, s + 1)
                            w["Bn"] = load_b(an, 0)
                            load_L(w, an, 0, 0)
                            load_L(w, an, 0, 1)
                            load_H(w, an, 0)
                if pf:
                    for w in warps:
                        w["Bc"] = w["Bn"]
        if not pf:
            sm.wait(NS - 2)
            load_group(s + NS)
            if s + 2 < nsb:
                scalar_pass(s + (1 if "passbuf" in mut else 2), sb0 + s + 2)
        for w in warps:
            ac[id(w)] = addr(w, s + 1)
    for w in warps:   # epilogue (split-K: the part of z)
        for ni in range(4):
            for e in range(4):
                col = cb + w["wn"] * 32 + ni * 8 + 2 * tig + (e & 1)
                for mi in range(4):
                    row = ob + w["wm"] * 64 + 16 * mi + 8 * (e >> 1) + g
                    ok = col < nb
                    ws[bz, col[ok], row[ok]] = w["acc"][mi, ni, e][ok]
                    np.add.at(written, (bz, col[ok], row[ok]), 1)


# ---------------------------------------------------------------------------------------
# references (independent of the kernel's maps: ggml's element order decoded directly)

def q6k_ints(raw, rows):
    """(qm [R, K] int64 = q - 32 per element in k order, sc [R, K/16] int64, d [R, K/256] float32)."""
    R = len(rows)
    blk = raw[rows].reshape(R, -1, 210)
    ql, qh = blk[..., :128].astype(np.int64), blk[..., 128:192].astype(np.int64)
    sc = blk[..., 192:208].copy().view(np.int8).astype(np.int64)
    d = blk[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    q = np.zeros((R, blk.shape[1], 256), np.int64)
    for n in range(2):
        for l in range(32):
            lq0, lq1, h = ql[..., 64 * n + l], ql[..., 64 * n + 32 + l], qh[..., 32 * n + l]
            q[..., 128 * n + l] = (lq0 & 15) | (((h >> 0) & 3) << 4)
            q[..., 128 * n + 32 + l] = (lq1 & 15) | (((h >> 2) & 3) << 4)
            q[..., 128 * n + 64 + l] = (lq0 >> 4) | (((h >> 4) & 3) << 4)
            q[..., 128 * n + 96 + l] = (lq1 >> 4) | (((h >> 6) & 3) << 4)
    return (q - 32).reshape(R, -1), sc.reshape(R, -1), d


def chain_ref(raw, rows, q8, xsd, form):
    """y[b, r] float32 of the exact chains (plain): per k32 block i in increasing k, with Ia / Ib the
    integer dots of its two 16-halves and sc_a = sc[2 i], sc_b = sc[2 i + 1] (the super-block's scales):
    form 0 (per-16): acc = fma(fl(Ia d sc_a), dx, acc); acc = fma(fl(Ib d sc_b), dx, acc)
    form 1 (J):      J = sc_a Ia + sc_b Ib (int); acc = fma(fl(float(J) d), dx, acc)"""
    qm, sc, d = q6k_ints(raw, rows)
    R, K = qm.shape
    nb = q8.shape[0]
    I16 = np.einsum("rhk,bhk->rbh", qm.reshape(R, -1, 16), q8.astype(np.int64).reshape(nb, -1, 16))   # [R, nb, K/16]
    dx = xsd.astype(np.float32)
    acc = np.zeros((R, nb), np.float32)
    for i in range(K // 32):
        ds = d[:, i // 8]
        if form == 0:
            for h in range(2):
                dsc = (ds * sc[:, 2 * i + h].astype(np.float32)).astype(np.float32)
                p = (I16[:, :, 2 * i + h].astype(np.float64) * dsc[:, None].astype(np.float64)).astype(np.float32)
                acc = fma32(p, np.broadcast_to(dx[None, :, i], acc.shape), acc)
        else:
            J = sc[:, 2 * i, None] * I16[:, :, 2 * i] + sc[:, 2 * i + 1, None] * I16[:, :, 2 * i + 1]
            assert np.abs(J).max() <= 2 ** 24
            p = (J.astype(np.float64) * ds[:, None].astype(np.float64)).astype(np.float32)
            acc = fma32(p, np.broadcast_to(dx[None, :, i], acc.shape), acc)
    return acc.T


def ref64(raw, rows, q8, xsd):
    """float64 y[b, r] of the dequantized weights and q8 activations (memra's dequant_rows)."""
    from memra.gpu.ops.matvec import dequant_rows
    w = dequant_rows(raw[rows], Q6_K).astype(np.float64)
    nb, K = q8.shape
    xv = (q8.astype(np.float64).reshape(nb, -1, 32) * xsd.astype(np.float64)[..., None]).reshape(nb, K)
    return xv @ w.T
