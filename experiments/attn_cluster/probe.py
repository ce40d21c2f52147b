#!/usr/bin/env python3
"""The decode attention's split merge through a thread-block cluster (Hopper distributed shared memory).

attn_decode merges a head block's splits through global memory: each split block stores its partial (o, m, l),
fences, bumps a counter, and the last block to count loads every partial back from L2 and merges them. With every
split of a head block in one cluster (grid y = the split count <= 16, cluster (1, y, 1)), each block keeps its
partial in its own shared memory, one cluster barrier makes them visible, the block of split 0 reads them over
DSMEM (mapa + ld.shared::cluster) and merges with decode_body's very operations in its order (the same M, the
same weights, the same fma chain over the splits, the same q8 twin), and a second barrier keeps every block
resident until it has read. So at one split count the cluster kernel's bits are the global merge's (checked
here bit for bit before timing), and what it changes is the tail: no partial round trip through L2, no fence, no
counter. The price is the split count: at most 16 splits a head block (the global merge's plan has 88 on SmolLM2,
33 on the 8B / 1B), so a split walks more keys (320 at 4,096 keys and 16 splits against 128).

ATT_CLUSTER 1 in a generated copy of kernels/attention.cu (build/attention.cu, ignored; anchors checked):
  - file-scope shared cl_o [G x D], cl_ml [2 x G]: the block's partial; split_body stores there instead of
    part_o / part_ml;
  - decode_body: after split_body, cluster barrier; split 0's block merges from the other blocks' cl_* (DSMEM);
    cluster barrier; the counters are not touched;
  - every block of a cluster takes both barriers: an empty split (blockIdx.y >= n_act) and a one-split row
    (the direct path) too, so no barrier waits on a block that left; a row the row filter (ATT_ROWS) gives the
    other module leaves as a whole cluster (one row a cluster), its empty splits included.
The launch (this probe's ArmGpu): grid (head blocks, 1, rows) clusters of (1, y, 1) blocks, y > 8 with the
non-portable cluster size allowed.

Rows (µs a launch, graph of 20 with PDL, copies rotated over 2x L2) for the SmolLM2 / 1B / 8B head shapes at
1,024 / 4,096 / 16,384 keys: `engine` (kernels/ at the engine's plan: 88 or 33 splits), and at plan 16 and 8
splits `global` (kernels/, the global merge) and `cluster` (the build copy), with `exact` (cluster = global bit
for bit: the output row and its q8 twin).

    python3 experiments/attn_cluster/probe.py --compile-only                                    # CPU
    source .whl/setup.sh && python3 experiments/attn_cluster/probe.py > $OUT/attn-cluster.jsonl  # device, ~1 min
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from attn_tail.probe import active, case_at, graph_us, outputs, start  # noqa: E402
from kernel_edit import build_copy, make_variant  # noqa: E402
from memra.gpu.ops import attention as ATT  # noqa: E402


BUILD, ARM_FILE, HEADER0 = build_copy(HERE, "attention.cu")
HEADER = HEADER0 + """// ATT_CLUSTER 1: a head block's splits merged through its cluster's distributed shared memory (see
// experiments/attn_cluster/probe.py); launch with cluster (1, gridDim.y, 1).
#ifndef ATT_CLUSTER
#define ATT_CLUSTER 0
#endif
"""
_CL_DECL = """constexpr int NCH = D / 8;  // 16-byte chunks (8 halves) per K/V row
#if ATT_CLUSTER
static_assert(MAX_SPLITS >= 16, "a cluster holds at most 16 splits");
__shared__ __align__(16) float cl_o[G * D];  // this block's partial: o (a head's D values), then m, l a head
__shared__ float cl_ml[2 * G];
// a cluster barrier: arrive with release, wait with acquire (every thread of every block of the cluster)
MEMRA_DEVICE void cl_sync() {
    asm volatile("barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// *p in the shared memory of the cluster's block `rank`
MEMRA_DEVICE float cl_ld(const float* p, int rank) {
    uint32_t r;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r));
    return v;
}
#define CL_IDLE do { cl_sync(); cl_sync(); } while (0)
#else
#define CL_IDLE do {} while (0)
#endif
"""
# split_body's partial: stored in the block's shared memory instead of part_o / part_ml (two one-line anchors each)
_PO = "        if (i < G * D) part_o[(part0 + (size_t)(i / D) * S) * D + i % D] = tot[o];\n"
_PML = ("        part_ml[(part0 + (size_t)tid * S) * 2] = m_s[tid];\n"
        "        part_ml[(part0 + (size_t)tid * S) * 2 + 1] = l_s[tid];\n")
_PART_EDITS = [
    (_PO, "#if ATT_CLUSTER\n        if (i < G * D) cl_o[i] = tot[o];\n#else\n" + _PO + "#endif\n"),
    (_PML, "#if ATT_CLUSTER\n        cl_ml[2 * tid] = m_s[tid];\n        cl_ml[2 * tid + 1] = l_s[tid];\n#else\n" + _PML
     + "#endif\n"),
]
_DIRECT_OLD = """        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, out, q8, s8, qsm, pre_blk);
    } else {
        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, nullptr, nullptr, nullptr, qsm, pre_blk);
"""
_DIRECT_NEW = """        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, out, q8, s8, qsm, pre_blk);
        CL_IDLE;
    } else {
        split_body(q, kcache, vcache KV_SA, part_o, part_ml, pos, seq, block_table, max_blocks, n_kv, qpk, window, scale,
                   softcap, nullptr, nullptr, nullptr, qsm, pre_blk);
#if ATT_CLUSTER
        cl_sync();  // every split's partial in its block's shared memory
        if (blockIdx.y == 0) {  // split 0 merges: decode_body's operations in its order, the partials over DSMEM
            for (int g = warp; g < G; g += ATT_WARPS) {
                float M = NEG_INF;
                for (int j = lane; j < n_act; j += 32) M = fmaxf(M, cl_ld(cl_ml + 2 * g, j));
                M = warp_max(M);
                float den = 0.f;
                for (int j = lane; j < n_act; j += 32) {
                    float w = expf(cl_ld(cl_ml + 2 * g, j) - M);
                    w_s[g][j] = w;
                    den += w * cl_ld(cl_ml + 2 * g + 1, j);
                }
                den = warp_sum(den);
                if (lane == 0) inv_den[g] = 1.0f / den;
            }
            __syncthreads();
            constexpr int MO = (G * D + NT - 1) / NT;  // outputs a thread: i = tid + o * NT
            float num[MO], v[MO][16];
#pragma unroll
            for (int o = 0; o < MO; o++) {
                num[o] = 0.f;
                const int i = min(tid + o * NT, G * D - 1);
#pragma unroll
                for (int jj = 0; jj < 16; jj++) v[o][jj] = cl_ld(cl_o + i, min(jj, n_act - 1));
            }
#pragma unroll
            for (int o = 0; o < MO; o++) {
                const int i = tid + o * NT;
#pragma unroll
                for (int jj = 0; jj < 16; jj++)
                    if (i < G * D && jj < n_act) num[o] += w_s[i / D][jj] * v[o][jj];
                if (i < G * D) {
                    orow[i] = num[o] * inv_den[i / D];
                    ob[i] = num[o] * inv_den[i / D];
                }
            }
            if (q8) {  // decode_body's twin from the staged row
                __syncthreads();
                for (int i0 = 0; i0 < G * D / 4; i0 += NT) {
                    const int i4 = i0 + tid;
                    const bool act = i4 < G * D / 4;
                    q8_store4(act ? reinterpret_cast<const float4*>(ob)[i4] : make_float4(0.f, 0.f, 0.f, 0.f),
                              act, i4, q8, s8);
                }
            }
        }
        cl_sync();  // split 0 has read every block's partial
        return;
#endif
"""
EDITS = [
    ("constexpr int NCH = D / 8;  // 16-byte chunks (8 halves) per K/V row\n", _CL_DECL),
    # attn_split (the two-launch path) would store its partial in shared memory, not for attn_combine: refused
    ("               int qpk, int window, float scale, float softcap KV_SCALE_PARAMS) {\n    MEMRA_PDL_WAIT();\n"
     "    MEMRA_PDL_LAUNCH();\n    split_body(q, kcache, vcache KV_SA, part_o, part_ml,",
     "               int qpk, int window, float scale, float softcap KV_SCALE_PARAMS) {\n#if ATT_CLUSTER\n"
     "    __trap();  // ATT_CLUSTER: split_body keeps its partial in shared memory (attn_decode / attn_decode_rope only)\n"
     "#endif\n    MEMRA_PDL_WAIT();\n    MEMRA_PDL_LAUNCH();\n    split_body(q, kcache, vcache KV_SA, part_o, part_ml,"),
    *_PART_EDITS,
    (_DIRECT_OLD, _DIRECT_NEW),
    # an empty split's block takes the barriers too, unless its row is one the row filter leaves (ATT_ROWS: the
    # row's whole cluster leaves, none waits)
    ("    const int n_act = key_range(pos[t], window, S).n_active;\n    if ((int)blockIdx.y >= n_act) return;\n",
     "    const int n_act = key_range(pos[t], window, S).n_active;\n    if ((int)blockIdx.y >= n_act) {\n"
     "        if (!ATT_ROWS || (ATT_ROWS == 1) != (key_range(pos[t], window, S).n >= ATT_SWITCH)) CL_IDLE;\n"
     "        return;\n    }\n"),
    ("    const int n_act = key_range(p, window, S).n_active;\n    if ((int)blockIdx.y >= n_act) return;\n",
     "    const int n_act = key_range(p, window, S).n_active;\n    if ((int)blockIdx.y >= n_act) {\n"
     "        if (!ATT_ROWS || (ATT_ROWS == 1) != (key_range(p, window, S).n >= ATT_SWITCH)) CL_IDLE;\n"
     "        return;\n    }\n"),
]
PLANS = (16, 8)
CTX = (1024, 4096, 16384)


def generate() -> None:
    if make_variant(ROOT / "kernels" / "attention.cu", BUILD, EDITS, HEADER):
        raise SystemExit("attention.cu's anchors moved: update EDITS")


def cluster_launch(g, kernel, grid, block, args, shmem: int, allowed: set, pdl: bool = True) -> None:
    """attn_decode_rope / attn_decode of the build copy on g's stream (or the graph being captured), as clusters of
    (1, grid y, 1) blocks; a cluster above 8 blocks needs the non-portable size allowed (once a kernel: `allowed`)."""
    from cuda.core import LaunchConfig, launch
    from memra.gpu.cuda import DeviceArray

    if shmem:
        kernel.allow_shared(shmem)
    if grid[1] > 8 and id(kernel) not in allowed:
        kernel.allow_nonportable_cluster()
        allowed.add(id(kernel))
    cargs = [np.uint64(a.ptr) if isinstance(a, DeviceArray) else a for a in args]
    cfg = LaunchConfig(grid=(grid[0], 1, grid[2]), cluster=(1, grid[1], 1), block=block,
                       shmem_size=int(shmem), programmatic_stream_serialization=bool(pdl))
    launch(g._target, cfg, kernel._k, *cargs)


def is_cluster_launch(kernel, grid) -> bool:
    """A launch that must go as clusters: the build copy's attn_decode_rope or attn_decode (the unfused entry a
    prefill-path step launches for generated rows) over more than one split."""
    return kernel.name in ("attn_decode_rope", "attn_decode") and kernel.module.kernel_file == ARM_FILE and grid[1] > 1


class ArmGpu:
    """The device; with `cluster` on, attention.cu's modules come from the build copy (ATT_CLUSTER 1) and its
    attn_decode_rope launches as clusters of (1, grid y, 1) blocks. Every launch with PDL."""

    def __init__(self, g):
        self._g, self.cluster = g, False
        self._allowed = set()

    def module(self, kernel_file, defines=None):
        if kernel_file == ATT.KERNEL_FILE and self.cluster:
            return self._g.module(ARM_FILE, {**(defines or {}), "ATT_CLUSTER": 1})
        return self._g.module(kernel_file, defines)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        if is_cluster_launch(kernel, grid):
            return cluster_launch(self._g, kernel, grid, block, args, shmem, self._allowed)
        return self._g.launch(kernel, grid, block, args, shmem, True)

    def __getattr__(self, name):
        return getattr(self._g, name)


def main() -> int:
    rc, dev = start(generate, ARM_FILE, {"cluster": {"ATT_CLUSTER": 1}}, ArmGpu)
    if dev is None:
        return rc
    g, ag, rng, rotate, shapes = dev
    for name, s in shapes:
        for ctx in CTX:
            ag.cluster = False
            case, y, hpb = case_at(ag, s, ctx, rng, rotate)
            row = {"shape": name, "ctx": ctx, "device": g.info.name, "engine_splits": y, "engine_hpb": hpb,
                   "engine_active": active(ctx, y), "engine": round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)}
            for plan in PLANS:
                ag.cluster = False
                case, y, hpb = case_at(ag, s, ctx, rng, rotate, plan)
                pre = f"s{plan}_"
                row.update({pre + "splits": y, pre + "hpb": hpb, pre + "active": active(ctx, y)})
                ok, err, detail = case.check()
                if not ok:
                    row[pre + "error"] = f"global: {detail}"
                    continue
                ref = outputs(g, ag, case)
                row[pre + "global"] = round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)
                ag.cluster = True
                try:
                    row[pre + "exact"] = outputs(g, ag, case) == ref
                    row[pre + "cluster"] = round(graph_us(g, lambda i: case.launch(i % case.sets)), 3)
                except Exception as e:   # a launch the device refuses (cluster size, resources)
                    row[pre + "error"] = f"cluster: {type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
