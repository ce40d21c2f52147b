#!/usr/bin/env python3
"""gemm_ws selftest (CPU, no GPU): the producer / consumer protocol of experiments/gemm_ws/gemm_ws.cu, modelled
statement for statement under random interleavings, and each group's staged sequence against gemm.cu's order.

What it checks, for many (nu, tiles, grid, WS_STAGES, consumer warps a group, WS_WK groups, WS_PW producers)
and random schedules (producers, consumer warps and the copies' landing interleaved at random):
  - no deadlock: every actor finishes;
  - every consumer step reads the stage holding exactly the (tile, unit) it folds, after the copies of that
    stage landed (the LANDED mbarrier) and after the scalar pass wrote it (FULL);
  - no stage is refilled while a consumer warp may still read it, or before its pass (write after read);
  - each mbarrier wait is at most one phase behind (test_wait / try_wait.parity cannot alias a phase);
  - every group's units are consumed in gemm.cu's leaf order over its subtree (WK 1: the GM_STATIC pair
    loop's order), each unit once across the groups: the order whose float sums equal mv_q8's.
The mbarrier model: a phase completes when `count` arrivals have come; a parity wait (test or try) is true
when the current phase's parity differs from the one asked for. Mutations it catches (checked by hand,
session 35): the producer not waiting on EMPTY, the pass not waiting on LANDED, a leaf order off by 8 slots;
the first, round-based producer (one blocking EMPTY wait a group in turn) deadlocked at WK 2 with uneven
groups (nu = 3), which is why the kernel's producer polls.

    python3 experiments/gemm_ws/selftest.py [--cases 600] [--seed 1]
"""
from __future__ import annotations

import argparse
import random
import sys


def brev(i: int, bits: int) -> int:
    return int(f"{i:0{bits}b}"[::-1], 2) if bits else 0


def brev4(i: int) -> int:
    return brev(i, 4)


def pair_slot(k: int, i: int, WK: int) -> int:
    LV = 5 - (WK.bit_length() - 1)
    return k + WK * brev(i, LV - 1)


def static_order(nu: int, k: int = 0, WK: int = 1) -> list[int]:
    """gemm.cu's consumer order of group k's units (WK 1: the GM_STATIC loop; WK > 1: the leaf order of the
    slot walk over the group's subtree, leaf j = slot k + WK brev_LV(j))."""
    LV = 5 - (WK.bit_length() - 1)
    out = []
    for j in range(1 << LV):
        sl = k + WK * brev(j, LV)
        out += list(range(sl, nu, 32))
    return out


class Walk:   # gemm_ws.cu's struct Walk, line for line
    def __init__(self, WK):
        self.WK = WK
        self.npair = 1 << (5 - (WK.bit_length() - 1) - 1)

    def start(self, k, nu):
        self.k, self.i, self.h, self.u, self.wrapped = k, 0, 0, k, False
        self.settle(nu)

    def settle(self, nu):
        while self.u >= nu:
            if self.h == 0:
                self.h, self.u = 1, pair_slot(self.k, self.i, self.WK) + 16
            else:
                self.i += 1
                if self.i < self.npair:
                    self.h, self.u = 0, pair_slot(self.k, self.i, self.WK)
                else:
                    self.i, self.h, self.u, self.wrapped = 0, 0, self.k, True
                    return

    def next(self, nu):
        self.u += 32
        self.settle(nu)


class Bar:
    def __init__(self, count):
        self.count, self.arrived, self.phase = count, 0, 0

    def arrive(self):
        self.arrived += 1
        assert self.arrived <= self.count
        if self.arrived == self.count:
            self.arrived, self.phase = 0, self.phase + 1

    def done(self, parity: int, want_phase: int) -> bool:
        # completed phases must be want_phase (not yet) or want_phase + 1 (done): anything else aliases
        assert want_phase <= self.phase <= want_phase + 1, f"{self.phase} phases completed, waiter wants {want_phase}"
        return (self.phase & 1) != parity


class Fail(Exception):
    pass


def simulate(nu, ntiles, grid_x, bx, NS, NGW, WK, PW, rng) -> None:
    """One block: PW producer warps, WK groups of NGW consumer warps, as gemm_ws.cu's ws_body."""
    full = [[Bar(32) for _ in range(NS)] for _ in range(WK)]
    empty = [[Bar(NGW) for _ in range(NS)] for _ in range(WK)]
    stage = [[None] * NS for _ in range(WK)]           # [tile, u, landed, passed]
    readers = [[set() for _ in range(NS)] for _ in range(WK)]
    consumed = {}
    LV = 5 - (WK.bit_length() - 1)
    sync = {"n": 0, "gen": 0}    # the consumers' named barrier (bar.sync 1, NC)
    NCW = NGW * WK

    landed = [[Bar(32) for _ in range(NS)] for _ in range(WK)]
    inflight = []                 # (group, stage) whose copies have not landed yet

    def producer(p):
        MG = WK // PW
        w = [Walk(WK) for _ in range(MG)]
        pw = [Walk(WK) for _ in range(MG)]
        tile, iss, tp, gdone = [0] * MG, [0] * MG, [0] * MG, [False] * MG
        for j in range(MG):
            k = p + PW * j
            w[j].start(k, nu)
            pw[j].start(k, nu)
            tile[j] = bx
            gdone[j] = tile[j] >= ntiles or k >= nu
        while True:
            busy = False
            for j in range(MG):
                k = p + PW * j
                if tp[j] < iss[j]:
                    busy = True
                    s = tp[j] % NS
                    if landed[k][s].done((tp[j] // NS) & 1, tp[j] // NS):
                        st = stage[k][s]
                        if not st[2]:
                            raise Fail(f"pass of group {k} position {tp[j]} before its copies landed")
                        if st[1] != pw[j].u:
                            raise Fail(f"pass walk {pw[j].u} != staged unit {st[1]}")
                        st[3] = True
                        for _ in range(32):
                            full[k][s].arrive()
                        tp[j] += 1
                        pw[j].next(nu)
                if not gdone[j]:
                    busy = True
                    t = iss[j]
                    s = t % NS
                    if t < NS or empty[k][s].done((t // NS - 1) & 1, t // NS - 1):
                        if readers[k][s]:
                            raise Fail(f"group {k} stage {s} refilled while warps {readers[k][s]} read it")
                        if stage[k][s] is not None and not stage[k][s][3]:
                            raise Fail(f"group {k} stage {s} refilled before its pass")
                        stage[k][s] = [tile[j], w[j].u, False, False]
                        inflight.append((k, s))
                        iss[j] += 1
                        w[j].next(nu)
                        if w[j].wrapped:
                            w[j].wrapped = False
                            tile[j] += grid_x
                            gdone[j] = tile[j] >= ntiles
            if not busy:
                return
            yield

    def copies():   # the copy engine: an in-flight stage lands at some time, then LANDED gets its 32 arrivals
        while True:
            if inflight and rng.random() < 0.5:
                k, s = inflight.pop(rng.randrange(len(inflight)))
                stage[k][s][2] = True
                for _ in range(32):
                    landed[k][s].arrive()
            yield

    def barrier():
        gen = sync["gen"]
        sync["n"] += 1
        if sync["n"] == NCW:
            sync["n"], sync["gen"] = 0, gen + 1
        while sync["gen"] == gen:
            yield

    def consumer(wi):
        gk = wi // NGW
        t = 0
        for tile in range(bx, ntiles, grid_x):
            for i in range(1 << (LV - 1)):
                sa = pair_slot(gk, i, WK)
                for u in list(range(sa, nu, 32)) + list(range(sa + 16, nu, 32)):
                    s = t % NS
                    while not full[gk][s].done((t // NS) & 1, t // NS):
                        yield
                    st = stage[gk][s]
                    if st is None or st[0] != tile or st[1] != u or not st[2] or not st[3]:
                        raise Fail(f"warp {wi} position {t}: stage {s} holds {st}, wants tile {tile} unit {u}")
                    readers[gk][s].add(wi)
                    yield   # the reads take time; the producers may run meanwhile
                    st = stage[gk][s]
                    if st[0] != tile or st[1] != u:
                        raise Fail(f"warp {wi}: stage {s} overwritten during its reads")
                    readers[gk][s].discard(wi)
                    consumed.setdefault((tile, wi), []).append(u)
                    empty[gk][s].arrive()
                    t += 1
            if WK > 1:
                yield from barrier()
                yield from barrier()

    actors = [producer(p) for p in range(PW)] + [consumer(i) for i in range(NCW)]
    live = list(range(len(actors)))
    cp = copies()
    steps = 0
    while live:
        next(cp)
        k = rng.choice(live)
        try:
            next(actors[k])
        except StopIteration:
            live.remove(k)
        steps += 1
        if steps > 400000:
            raise Fail("deadlock (no progress in 400000 steps)")
    for tile in range(bx, ntiles, grid_x):
        for wi in range(NCW):
            want = static_order(nu, wi // NGW, WK)
            got = consumed.get((tile, wi), [])
            if got != want:
                raise Fail(f"tile {tile} warp {wi}: consumed {got[:8]}.. ({len(got)}) != gemm.cu's order {want[:8]}..")
    allu = sorted(u for k in range(WK) for u in static_order(nu, k, WK))
    if allu != list(range(nu)):
        raise Fail("the groups' units are not each unit once")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # the walk alone: gemm.cu's order, every unit once, for nu = 1..300
    for WK in (1, 2, 4, 8, 16):
        for nu in range(1, 301):
            for k in range(min(WK, nu)):
                w = Walk(WK)
                w.start(k, nu)
                want = static_order(nu, k, WK)
                seq = []
                for _ in range(len(want)):
                    assert not w.wrapped
                    seq.append(w.u)
                    w.next(nu)
                assert w.wrapped and w.u == k, (WK, nu, k)
                assert seq == want, (WK, nu, k, seq[:6], want[:6])
            assert sorted(u for k in range(WK) for u in static_order(nu, k, WK)) == list(range(nu))
    # WK 1's leaf order is the GM_STATIC pair loop's (pair i: slot brev4(i), then brev4(i) + 16)
    for nu in range(1, 301):
        assert static_order(nu) == [u for i in range(16) for sl in (brev4(i), brev4(i) + 16) for u in range(sl, nu, 32)]
    print("walk: gemm.cu's leaf order for WK 1..16, every unit once, nu = 1..300")
    n = 0
    for _ in range(a.cases):
        NS = rng.choice((2, 3, 4, 5, 6))
        NGW = rng.choice((1, 2, 4))
        WK = rng.choice((1, 1, 2, 4, 8, 16))
        PW = rng.choice([d for d in (1, 2, 4) if WK % d == 0])
        nu = rng.choice((1, 2, 3, 4, 12, 16, 17, 40, 64, 65))
        ntiles = rng.randint(1, 6)
        grid_x = rng.randint(1, ntiles)
        bx = rng.randrange(grid_x)
        try:
            simulate(nu, ntiles, grid_x, bx, NS, NGW, WK, PW, rng)
        except (Fail, AssertionError) as e:
            print(f"FAIL nu={nu} tiles={ntiles} grid={grid_x} block={bx} NS={NS} NGW={NGW} WK={WK} "
                  f"PW={PW}: {e}")
            return 1
        n += 1
    print(f"protocol: {n} random cases, no deadlock, no stale or overwritten stage, gemm.cu's order in every warp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
