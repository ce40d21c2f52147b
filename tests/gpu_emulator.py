"""A CPU stand-in for memra.gpu.cuda.Gpu that runs each kernel launch through numpy.

It checks the GPU engine's orchestration on a machine without a GPU: which kernels run
in which order, on which buffers, views, offsets, strides and device-side state (token,
position, step), and that a captured graph replays the same launches. Device memory is
one host heap addressed by integer pointers, so views and NULL pointers behave as on the
device. The kernel semantics come from the launch contracts in kernels/*.cu (each written
independently of the engine; the kernels themselves are checked on the GPU by
`memra kernel-check`). Attention follows the kernel's split layout exactly, so a wrong
split or combine index in the engine shows up here too.

Launch geometry (`check_geometry`, before every launch): from the grid, block and dynamic
shared memory a launcher passes, and the module's -D defines, each kernel's launch contract
(the header of its kernels/*.cu) says which output elements each block writes; the launch
raises CudaError when an element is written by no block or by two, when the block size is
not the one the module was compiled for, or when the dynamic shared memory differs from
what the kernel addresses. So a grid that drops a tail (floor instead of ceiling division)
fails here, although the numpy models below compute whole outputs whatever the grid.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from memra.errors import CudaError


class FakeArray:
    __slots__ = ("gpu", "shape", "dtype", "ptr", "nbytes")

    def __init__(self, gpu, ptr, shape, dtype):
        self.gpu, self.ptr = gpu, int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def view(self, dtype=None, shape=None, offset=0):
        dtype = np.dtype(dtype or self.dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dtype.itemsize,)
        v = FakeArray(self.gpu, self.ptr + offset, shape, dtype)
        if offset < 0 or offset + v.nbytes > self.nbytes:
            raise CudaError(f"view [{offset}, {offset + v.nbytes}) outside {self.nbytes} bytes")
        return v

    def _host(self):
        return self.gpu.mem(self.ptr, self.dtype, self.size).reshape(self.shape)

    def upload(self, host):
        host = np.ascontiguousarray(host)
        if host.nbytes != self.nbytes:
            raise CudaError(f"upload of {host.nbytes} bytes into a {self.nbytes}-byte array")
        if self.gpu.capturing:
            raise CudaError("host-to-device copies cannot be captured in a graph")
        self.gpu.mem(self.ptr, np.uint8, self.nbytes)[:] = host.view(np.uint8).reshape(-1)

    def upload_async(self, host):
        # the emulator runs every launch as it is issued, so a copy done now is in stream order
        if not host.flags["C_CONTIGUOUS"]:
            raise CudaError("upload_async: a C-contiguous host array")
        self.upload(host)
        self.gpu.async_uploads += 1

    def numpy(self):
        if self.gpu.capturing:
            raise CudaError("device-to-host copies cannot be captured in a graph")
        return self._host().copy()

    def fill_bytes(self, b):
        self.gpu.record(lambda: self.gpu.mem(self.ptr, np.uint8, self.nbytes).fill(b & 0xFF))

    def poison(self):
        from memra.gpu.cuda import poison_byte

        self.fill_bytes(poison_byte(self.dtype))

    def zero(self):
        self.fill_bytes(0)


@dataclass
class FakeKernel:
    name: str
    defines: dict
    module: object = None


class FakeModule:
    def __init__(self, kernel_file, defines):
        self.kernel_file, self.defines = kernel_file, defines

    def kernel(self, name):
        return FakeKernel(name, dict(self.defines), self)

    __getitem__ = kernel


class FakeGraph:
    def __init__(self, gpu):
        self.gpu, self.ops = gpu, []

    def upload(self):
        pass

    def launch(self):
        for op in self.ops:
            op()

    def close(self):
        self.ops = []


@dataclass
class FakeInfo:
    name: str = "emulated"
    arch: str = "sm_90a"
    sm_count: int = 132
    cc: tuple = (9, 0)  # as sm_90a: the engine picks a tuning table by device name, else by cc


def check_tune_hook(g, case, bits: str, rotate: int) -> None:
    """A tune hook's contract (memra/tune/measure.py) on the emulator: its check passes within
    1e-5 of the float64 reference and says `bits` ("matvec bit for bit", "chain bit for bit"),
    its copies cover half the rotation footprint, and each copy launches once (the emulator
    checks each launch's grid, block and shared memory)."""
    ok, err, detail = case.check()
    assert ok and err is not None and err <= 1e-5 and bits in detail, detail
    assert case.bytes > 0 and case.sets * case.bytes >= rotate * 0.5
    n = g.launches
    for i in range(case.sets):
        case.launch(i)
    assert g.launches == n + case.sets


def drop_launches(monkeypatch, prefix: str) -> None:
    """Launches of kernels named prefix* do nothing (a kernel that writes nothing: a check on
    poisoned outputs must fail)."""
    real = FakeGpu.launch

    def launch(self, k, grid, block, args, **kw):
        if not k.name.startswith(prefix):
            return real(self, k, grid, block, args, **kw)

    monkeypatch.setattr(FakeGpu, "launch", launch)


def install(monkeypatch, g=None):
    """Make memra.gpu.cuda report a GPU and hand out g (default: a FakeGpu of 512 MiB, room
    for a few runners' 512-row step buffers: its heap is never freed) as it, for in-process
    `memra run / bench / kernel-check --device gpu`; returns g."""
    import memra.gpu.cuda as cuda

    g = FakeGpu(1 << 29) if g is None else g
    monkeypatch.setattr(cuda, "has_gpu", lambda: True)
    monkeypatch.setattr(cuda, "gpu", lambda index=0: g)
    return g


class FakeGpu:
    def __init__(self, heap_bytes=1 << 30):
        self.heap = np.zeros(heap_bytes, np.uint8)
        self.top = 256  # pointer 0 stays NULL
        self.info = FakeInfo()
        self.capturing = None
        self.launches = 0
        self.async_uploads = 0
        self.wcache = {}  # dequantized matvec weights by (bulk, meta, type, rows, K)

    def copy_bandwidth(self, refresh=False):
        """The measured copy bandwidth memra bench / run report against (an H200's order)."""
        return 4e12

    # memory
    def mem(self, ptr, dtype, count):
        dtype = np.dtype(dtype)
        return self.heap[ptr:ptr + count * dtype.itemsize].view(dtype)

    def empty(self, shape, dtype=np.uint8):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        ptr = self.top
        self.top = (self.top + max(n, 1) + 255) // 256 * 256
        if self.top > self.heap.size:
            raise CudaError("emulated device out of memory")
        a = FakeArray(self, ptr, shape, dtype)
        self.mem(ptr, np.uint8, n)[:] = 0xA5  # garbage, like fresh device memory
        return a

    def pinned(self, shape, dtype=np.uint8):
        """A host array (the device's page-locked memory; garbage, as cuMemHostAlloc's)."""
        a = np.empty(shape, dtype)
        a.view(np.uint8).reshape(-1)[:] = 0x5A
        return a

    def to_device(self, host):
        host = np.ascontiguousarray(host)
        a = self.empty(host.shape, host.dtype)
        a.upload(host)
        return a

    def module(self, kernel_file, defines=None):
        return FakeModule(kernel_file, dict(defines or {}))

    def copy(self, dst, src, nbytes=None):
        n = min(dst.nbytes, src.nbytes) if nbytes is None else nbytes
        self.record(lambda: self.mem(dst.ptr, np.uint8, n).__setitem__(slice(None), self.mem(src.ptr, np.uint8, n)))

    def sync(self):
        pass

    def record(self, op):
        if self.capturing is not None:
            self.capturing.ops.append(op)
        else:
            op()

    @contextmanager
    def capture(self):
        gr = FakeGraph(self)
        self.capturing = gr
        try:
            yield gr
        finally:
            self.capturing = None

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        vals = []
        for a in args:
            if isinstance(a, FakeArray):
                vals.append(a.ptr)
            elif isinstance(a, np.generic):
                vals.append(a.item())
            else:
                raise TypeError(f"kernel {kernel.name}: argument {a!r} must be a device array or numpy scalar")
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        fn = _mv if kernel.name.startswith(("mv_", "gemm_q8", "mvt_q8")) else _KERNELS.get(kernel.name)
        if fn is None:
            raise CudaError(f"emulator: no model of kernel {kernel.name}")
        check_geometry(kernel, grid, block, shmem, vals)
        self.launches += 1
        self.record(lambda: fn(self, kernel, grid, vals))


# -- launch geometry (the contracts in the headers of kernels/*.cu) ------------------------

def _dims(x):
    t = tuple(int(v) for v in (x if isinstance(x, (tuple, list)) else (x,)))
    return t + (1,) * (3 - len(t))


def _d(k, name, default):
    return int(k.defines.get(name, default))


def _fail(k, grid, block, msg):
    raise CudaError(f"launch geometry: {k.name} grid {grid} block {block}: {msg}")


def _judge(k, grid, block, what, counts):
    zero = np.flatnonzero(counts == 0)
    if zero.size:
        _fail(k, grid, block, f"{zero.size} of {counts.size} elements of {what} are written by no block "
                              f"(the first: {int(zero[0])})")
    two = np.flatnonzero(counts > 1)
    if two.size:
        _fail(k, grid, block, f"{two.size} of {counts.size} elements of {what} are written by two blocks "
                              f"(the first: {int(two[0])})")


def _ranges(k, grid, block, what, n, starts, length):
    """Blocks writing [start, start + length) of n elements each."""
    st = np.asarray(starts, np.int64).reshape(-1)
    lo, hi = np.clip(st, 0, n), np.clip(st + length, 0, n)
    d = np.zeros(n + 1, np.int64)
    np.add.at(d, lo, 1)
    np.add.at(d, hi, -1)
    _judge(k, grid, block, what, np.cumsum(d)[:n])


def _indices(k, grid, block, what, n, idx):
    idx = np.asarray(idx, np.int64).reshape(-1)
    idx = idx[(idx >= 0) & (idx < n)]
    _judge(k, grid, block, what, np.bincount(idx, minlength=n)[:n])


def _block_is(k, grid, block, want, why):
    if block != (want, 1, 1):
        _fail(k, grid, block, f"the block must be ({want},) ({why})")


def _no_dynamic_smem(k, grid, block, shmem):
    if shmem:
        _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel takes none")


def check_geometry(kernel, grid, block, shmem, v):
    k, grid, block, shmem = kernel, _dims(grid), _dims(block), int(shmem or 0)
    name = k.name
    if name.startswith("mv_"):
        # matvec.cu: grid ceil(N / (MV_ROWS * MV_NWARPS / MV_KSPLIT)), block 32 * MV_NWARPS, dynamic
        # shared memory 0 or (MV_XSMEM, q8 family) nb * ceil(K / 2048) * 3072; block i owns
        # output rows [i * rpb, (i + 1) * rpb) of every batch row b < nb <= MV_B
        nw, rows, ks = _d(k, "MV_NWARPS", 4), _d(k, "MV_ROWS", 1), _d(k, "MV_KSPLIT", 1)
        N, K, nb = v[6:9] if name.startswith("mv_q8") else v[5:8]
        _block_is(k, grid, block, 32 * nw, "32 * MV_NWARPS")
        if not 1 <= nb <= _d(k, "MV_B", 1):
            _fail(k, grid, block, f"nb = {nb} outside 1..MV_B = {_d(k, 'MV_B', 1)}")
        want = nb * -(-K // 2048) * 3072 if name.startswith("mv_q8") and _d(k, "MV_XSMEM", 0) else 0
        if shmem != want:
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {want}")
        if grid[1:] != (1, 1):
            _fail(k, grid, block, "a one-dimensional grid")
        rpb = rows * nw // ks
        _ranges(k, grid, block, f"y (rows of {N})", N, np.arange(grid[0]) * rpb, rpb)
    elif name.startswith("gemm_q8"):
        # gemm.cu: BM = GM_WM * GM_TM * 16 weight rows (OBM outputs: BM, or BM / 2 for _glu) by
        # BN = GM_WN * GM_TN * 8 batch columns a block; grid (ceil(N / OBM), ceil(nb / BN)),
        # block 32 * GM_WM * GM_WN * GM_WK, dynamic shared memory max(GM_STAGES * GM_WK * STAGE
        # + max(0, LV - GM_LREG) * GM_TM * GM_TN * 4 * NTHR * 4, GM_WK > 1 ? GM_WK * BM * BN * 4
        # : 0), STAGE = BM * WBS + BN * 80 + BN * SSB + BM * MWS rounded up to 16
        wm, wn, tm, tn = _d(k, "GM_WM", 2), _d(k, "GM_WN", 4), _d(k, "GM_TM", 2), _d(k, "GM_TN", 2)
        wk, stages, lreg = _d(k, "GM_WK", 1), _d(k, "GM_STAGES", 3), _d(k, "GM_LREG", 1)
        N, K, nb = v[6:9]
        bm, bn = wm * tm * 16, wn * tn * 8
        obm = bm // 2 if name.endswith("_glu") else bm
        nthr = 32 * wm * wn * wk
        _block_is(k, grid, block, nthr, "32 * GM_WM * GM_WN * GM_WK")
        wbs, ssb, mws = {2: (48, 16, 4), 3: (48, 16, 8), 6: (48, 16, 12), 7: (48, 16, 16), 8: (80, 16, 4),
                         12: (48, 16, 16), 13: (80, 16, 16), 14: (48, 32, 20), 23: (48, 16, 8)}[_d(k, "MV_TYPE", 0)]
        stage = -(-(bm * wbs + bn * 80 + bn * ssb + bm * mws) // 16) * 16
        lv = 5 - (wk.bit_length() - 1)
        want = max(stages * wk * stage + max(0, lv - lreg) * tm * tn * 4 * nthr * 4, wk * bm * bn * 4 if wk > 1 else 0)
        if shmem != want:
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {want}")
        if grid[2] != 1:
            _fail(k, grid, block, "a two-dimensional grid")
        _ranges(k, grid, block, f"y's rows ({N})", int(N), np.arange(grid[0]) * obm, obm)
        _ranges(k, grid, block, f"y's batch columns ({nb})", int(nb), np.arange(grid[1]) * bn, bn)
    elif name.startswith("mvt_q8"):
        # mvt.cu: a warp owns one m16 tile (OBM = 16 outputs, or 8 for _glu: gate rows and their up
        # rows) and MVT_TN n8 tiles; grid (ceil(N / (OBM * MVT_WM)), ceil(nb / (8 * MVT_TN))), block
        # 32 * MVT_WM * MVT_WK; block (x, y) writes outputs [x * OBM * WM, (x + 1) * OBM * WM) of
        # batch columns [y * 8 TN, (y + 1) * 8 TN). Dynamic shared memory: none in layout 0
        # (MVT_LAYOUT 0, the default); layout 1 MVT_STAGES * STAGE, STAGE = 16 WM (SU BPU + 16) +
        # 16 WM roundup16(MST + 4) + 8 TN (64 SU + 16) + 8 TN 16 SU, SU = WK * MVT_UPW, BPU = 64 BULK
        # / BLK, MST = 64 SU META / BLK (the type's block geometry)
        tn, wk, wm = _d(k, "MVT_TN", 2), _d(k, "MVT_WK", 8), _d(k, "MVT_WM", 1)
        N, K, nb = v[6:9]
        _block_is(k, grid, block, 32 * wm * wk, "32 * MVT_WM * MVT_WK")
        if _d(k, "MVT_LAYOUT", 0) == 1:
            from memra.gpu.ops.matvec import TYPES

            _, blk, bb, _, bulk = TYPES[_d(k, "MV_TYPE", 0)]
            su = wk * _d(k, "MVT_UPW", 1)
            mst = 64 * su // blk * (bb - bulk)
            stage = 16 * wm * (su * (64 * bulk // blk) + 16) + 16 * wm * (-(-(mst + 4) // 16) * 16) + \
                8 * tn * (64 * su + 16) + 8 * tn * 16 * su
            want = _d(k, "MVT_STAGES", 3) * stage
            if shmem != want:
                _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {want}")
        else:
            _no_dynamic_smem(k, grid, block, shmem)
        if grid[2] != 1:
            _fail(k, grid, block, "a two-dimensional grid")
        if K % 64:
            _fail(k, grid, block, f"K = {K} is not a multiple of 64")
        obm = (8 if name.endswith("_glu") else 16) * wm
        _ranges(k, grid, block, f"y's rows ({N})", int(N), np.arange(grid[0]) * obm, obm)
        _ranges(k, grid, block, f"y's batch columns ({nb})", int(nb), np.arange(grid[1]) * 8 * tn, 8 * tn)
    elif name == "quantize_q8":
        # q8.cu: grid ceil(nblocks / Q8_WARPS), block 32 * Q8_WARPS; one warp per block of 32
        w = _d(k, "Q8_WARPS", 8)
        _block_is(k, grid, block, 32 * w, "32 * Q8_WARPS")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, "the q8 blocks", int(v[3]), np.arange(grid[0]) * w, w)
    elif name in ("rmsnorm", "add_rmsnorm"):
        # norm.cu: block NORM_THREADS, one row per blockIdx.x; thread t owns float4s t + j * T,
        # j < NORM_MAXV; rmsnorm's gridDim.y blocks of a row write j in [y * per, (y + 1) * per),
        # per = ceil(NORM_MAXV / gridDim.y)
        T, V = _d(k, "NORM_THREADS", 256), _d(k, "NORM_MAXV", 8)
        n = int(v[3] if name == "rmsnorm" else v[5])
        _block_is(k, grid, block, T, "NORM_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)
        split = grid[1] if name == "rmsnorm" else 1
        if name == "add_rmsnorm" and grid[1:] != (1, 1):
            _fail(k, grid, block, "add_rmsnorm takes one block per row")
        per = -(-V // split)
        js = np.concatenate([np.arange(y * per, min(V, (y + 1) * per)) for y in range(split)])
        idx = np.arange(T)[None, :] + js[:, None] * T
        _indices(k, grid, block, f"a row's float4s ({n // 4})", n // 4, idx)
    elif name == "rope_norm_kv":
        # rope.cu: grid (ceil((n_head + 2 n_kv) / ROPE_WARPS), n_tokens), block 32 * ROPE_WARPS;
        # warp w of block x handles head unit x * ROPE_WARPS + w
        w = _d(k, "ROPE_WARPS", 4)
        n_units = int(v[18]) + 2 * int(v[19])
        _block_is(k, grid, block, 32 * w, "32 * ROPE_WARPS")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, f"the head units ({n_units})", n_units, np.arange(grid[0]) * w, w)
    elif name in ("attn_split", "attn_decode", "attn_decode_rope"):
        # attention.cu: grid (n_head / N_GQA, S, n_tokens), block 32 * ATT_WARPS, static shared
        # memory plus ATT_RING's ring (ATT_RING * 2 * ATT_TILE * HEAD_DIM * 2 bytes, dynamic);
        # block x holds query heads [x * N_GQA, (x + 1) * N_GQA) (n_head = gridDim.x * N_GQA must
        # be the model's n_kv * qpk); attn_decode*: S <= MAX_SPLITS
        G, nw = _d(k, "N_GQA", 1), _d(k, "ATT_WARPS", 4)
        n_kv, qpk = (v[9], v[10]) if name == "attn_split" else (v[13], v[14]) if name == "attn_decode" \
            else (v[26], v[27])
        _block_is(k, grid, block, 32 * nw, "32 * ATT_WARPS")
        ring = _d(k, "ATT_RING", 0) * 2 * _d(k, "ATT_TILE", 64) * _d(k, "HEAD_DIM", 0) * 2
        if shmem != ring:
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, ATT_RING's ring is {ring}")
        if ring and (_d(k, "KV_K_Q8", 0) or _d(k, "KV_V_Q8", 0)):
            _fail(k, grid, block, "ATT_RING with a q8_0 KV cache (attn_ring.cuh refuses it)")
        if _d(k, "HEAD_DIM", 0) > 8 * 32 * nw:
            _fail(k, grid, block, "HEAD_DIM > 8 * 32 * ATT_WARPS")
        if name != "attn_split" and grid[1] > _d(k, "MAX_SPLITS", 256):
            _fail(k, grid, block, f"{grid[1]} splits exceed MAX_SPLITS")
        if qpk % G:
            _fail(k, grid, block, f"N_GQA = {G} does not divide the {qpk} query heads per KV head")
        _ranges(k, grid, block, f"the query heads ({n_kv * qpk})", int(n_kv * qpk), np.arange(grid[0]) * G, G)
    elif name == "attn_combine":
        # attention.cu: grid (n_head, n_tokens), block min(HEAD_DIM, 256): threads stride the head
        if block[0] > 1024 or block[1:] != (1, 1):
            _fail(k, grid, block, "a one-dimensional block of at most 1024 threads")
        _no_dynamic_smem(k, grid, block, shmem)
    elif name == "act_mul":
        # act.cu: grid (ceil(n / ACT_THREADS), rows), block ACT_THREADS
        T = _d(k, "ACT_THREADS", 256)
        _block_is(k, grid, block, T, "ACT_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, f"a row ({int(v[3])})", int(v[3]), np.arange(grid[0]) * T, T)
    elif name == "softcap":
        # act.cu: grid ceil(n / ACT_THREADS), block ACT_THREADS (in place over n values)
        T = _d(k, "ACT_THREADS", 256)
        _block_is(k, grid, block, T, "ACT_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, f"x ({int(v[1])})", int(v[1]), np.arange(grid[0]) * T, T)
    elif name in ("argmax_partial", "argmax_final", "sample"):
        # sample.cu: block SAMPLE_THREADS; argmax_partial grid (NB, B) (block j scans the j-th
        # ceil(n / NB) segment), argmax_final grid (B) with NB <= SAMPLE_THREADS, sample grid (B)
        T = _d(k, "SAMPLE_THREADS", 1024)
        _block_is(k, grid, block, T, "SAMPLE_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)
        if name == "argmax_partial":
            n = int(v[1])
            seg = -(-n // grid[0])
            _ranges(k, grid, block, f"the logits ({n}) scanned", n, np.arange(grid[0]) * seg, seg)
        elif name == "argmax_final" and int(v[2]) > T:
            _fail(k, grid, block, f"NB = {int(v[2])} partials exceed SAMPLE_THREADS")
    elif name == "apply_mask":
        # mask.cu: grid (ceil(words / MASK_THREADS), B), block MASK_THREADS: a thread a mask word
        T = _d(k, "MASK_THREADS", 256)
        _block_is(k, grid, block, T, "MASK_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, f"a row's mask words ({int(v[3])})", int(v[3]), np.arange(grid[0]) * T, T)
    elif name in ("attn_fa", "attn_fa_dec"):
        # attn_fa.cu: grid (ceil(n_tokens / tpb) or n_tokens, n_kv, n_split), block 32 * FA_WARPS,
        # dynamic shared memory FA_SMEM / FA_SMEM_DEC (memra.gpu.ops.attn_fa.smem_bytes)
        from memra.gpu.ops.attn_fa import smem_bytes

        D, nw = _d(k, "HEAD_DIM", 0), _d(k, "FA_WARPS", 4)
        _block_is(k, grid, block, 32 * nw, "32 * FA_WARPS")
        if shmem != smem_bytes(D, name == "attn_fa_dec", nw):
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses "
                                  f"{smem_bytes(D, name == 'attn_fa_dec', nw)}")
        if name == "attn_fa_dec" and nw != 4:
            _fail(k, grid, block, "attn_fa_dec is built with FA_WARPS 4 only")
        n_kv, qpk = (v[11], v[12]) if name == "attn_fa" else (v[27], v[28])
        if grid[1] != n_kv or not 1 <= qpk <= 16:
            _fail(k, grid, block, f"grid y must be the {n_kv} KV heads, qpk {qpk} in 1..16")
        if name == "attn_fa_dec" and D % 64:
            _fail(k, grid, block, "attn_fa_dec needs HEAD_DIM % 64 == 0")
    elif name == "fa_combine":
        # attn_fa.cu: grid (n_head, n_tokens), block HEAD_DIM
        _block_is(k, grid, block, _d(k, "HEAD_DIM", 0), "HEAD_DIM")
        _no_dynamic_smem(k, grid, block, shmem)
    elif name.startswith("gemm_tile"):
        # gemm_tile.cu: BM = 64 GT_WM weight rows (OBM outputs: BM, or BM / 2 for _glu) by BN = 32 GT_WN
        # activation columns a block, grid exactly (N / OBM, ceil(nb / BN), 1) (no partial row tile),
        # block 32 GT_WM GT_WN, dynamic shared memory GT_STAGES (BM WS + BN 272 + BM MS + BN 64) +
        # 2 (RS BM + CS BN) with (WS, MS, RS, CS) per type, RS + 16 with GT_RPAD (default 1) where that
        # fits 227 KiB (a lane's group of 8 row records padded by 16 bytes); K a multiple of 256 (Q6_K 512)
        wm, wn, ns = _d(k, "GT_WM", 2), _d(k, "GT_WN", 4), _d(k, "GT_STAGES", 2)
        t = _d(k, "MV_TYPE", 0)
        ws, ms, rs, cs, kmul = {2: (144, 16, 64, 32, 256), 8: (272, 16, 64, 32, 256), 12: (144, 16, 96, 64, 256),
                                14: (208, 20, 68, 32, 512)}[t]
        N, K, nb = v[6:9]
        bm, bn = 64 * wm, 32 * wn
        stages = ns * (bm * ws + bn * 272 + bm * ms + bn * 64)
        if _d(k, "GT_RPAD", 1) and stages + 2 * ((rs + 16) * bm + cs * bn) <= 232448:
            rs += 16
        obm = bm // 2 if name.endswith("_glu") else bm
        _block_is(k, grid, block, 32 * wm * wn, "32 * GT_WM * GT_WN")
        if N % obm or K % kmul:
            _fail(k, grid, block, f"N = {N} not a multiple of {obm} or K = {K} of {kmul}")
        if grid != (N // obm, -(-nb // bn), 1):
            _fail(k, grid, block, f"the grid must be (N / {obm}, ceil(nb / {bn}), 1)")
        want = stages + 2 * (rs * bm + cs * bn)
        if shmem != want:
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {want}")
    elif name.startswith("gemm_f16"):
        # gemm_f16.cu: BM = 16 GF_TM GF_WM weight rows (OBM outputs: BM, or BM / 2 for _glu) by BN = 8 GF_TN
        # GF_WN activation rows a block, grid exactly (ceil(nb / BN), N / OBM, 1) (no partial row tile), block
        # 32 GF_WM GF_WN, dynamic shared memory 2 (BM + BN) 272 bytes; K a multiple of 128 and of the type's block
        from memra.gpu.ops.matvec import TYPES

        # gemm_f16_wg.cu (the same entries): BM = 128 WG_MT, BN = WG_BN, 384 threads, dynamic shared memory
        # WG_STAGES (BM + BN) 128 + 1024 + 16 WG_STAGES
        glu = name.endswith("_glu")
        N, K, nb = v[4:7] if glu else v[5:8]
        if getattr(k.module, "kernel_file", "") == "gemm_f16_wg.cu":
            st = _d(k, "WG_STAGES", 4)
            bm, bn, nt = 128 * _d(k, "WG_MT", 1), _d(k, "WG_BN", 128), 384
            smem = st * (bm + bn) * 128 + 1024 + 16 * st
            _block_is(k, grid, block, nt, "384 (three warpgroups)")
        else:
            wm, wn, tm, tn = _d(k, "GF_WM", 2), _d(k, "GF_WN", 4), _d(k, "GF_TM", 4), _d(k, "GF_TN", 4)
            bm, bn = 16 * tm * wm, 8 * tn * wn
            smem = 2 * (bm + bn) * 272
            _block_is(k, grid, block, 32 * wm * wn, "32 * GF_WM * GF_WN")
        obm = bm // 2 if glu else bm
        kmul = int(np.lcm(128, TYPES[_d(k, "MV_TYPE", 0)][1]))
        if N % obm or K % kmul or nb < 1:
            _fail(k, grid, block, f"N = {N} not a multiple of {obm}, K = {K} of {kmul} or nb = {nb} < 1")
        if grid != (-(-nb // bn), N // obm, 1):
            _fail(k, grid, block, f"the grid must be (ceil(nb / {bn}), N / {obm}, 1)")
        if shmem != smem:
            _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {smem}")
    elif name.startswith("qf_mv") or name.startswith("qf_gemm"):
        # qf.cu: T = Nw / 16 weight tiles (Nw = N, 2N for _glu). qf_mv: grid (ceil(T QF_CHAINS / QF_WARPS), 1, 1),
        # block 32 QF_WARPS, no dynamic shared memory, nb <= 8; qf_gemm: grid (ceil(T / QF_GWARPS), ceil(nb / (8
        # QF_NT)), QF_KSPLIT ? QF_CHAINS : 1), block 32 QF_GWARPS, dynamic shared memory QF_STAGES 8 QF_NT (2 QF_XROW
        # + 64) + (QF_WSMEM: QF_STAGES QF_GWARPS 16 (QF_WROW + QF_MROW)) + (!QF_KSPLIT, QF_CHAINS > 1: 4 QF_NT 32
        # QF_GWARPS 4) (XROW / WROW / MROW 288 / 160 / 16 for Q4_K, 272 / 208 / 20 for Q6_K); K a multiple of 256
        # QF_CHAINS, QF_WARPS of QF_CHAINS
        glu = name.endswith("_glu")
        gemm = name.startswith("qf_gemm")
        if gemm:
            N, K, nb = (v[7:10] if glu else v[8:11])
        else:
            N, K, nb = (v[5:8] if glu else v[6:9])
        N, K, nb = int(N), int(K), int(nb)
        C, W = _d(k, "QF_CHAINS", 1), _d(k, "QF_WARPS", 4)
        T = (2 * N if glu else N) // 16
        if K % (256 * C) or W % C or (2 * N if glu else N) % 16 or nb < 1:
            _fail(k, grid, block, f"K = {K} not a multiple of {256 * C}, QF_WARPS {W} of QF_CHAINS {C}, or the weight "
                                  f"rows of 16 ({N}), or nb = {nb} < 1")
        if not gemm:
            _block_is(k, grid, block, 32 * W, "32 QF_WARPS")
            _no_dynamic_smem(k, grid, block, shmem)
            if nb > 8:
                _fail(k, grid, block, f"qf_mv takes at most 8 rows, got {nb}")
            if grid != (-(-T * C // W), 1, 1):
                _fail(k, grid, block, f"the grid must be (ceil({T} x {C} / {W}), 1, 1)")
        else:
            gw, nt, st = _d(k, "QF_GWARPS", 4), _d(k, "QF_NT", 8), _d(k, "QF_STAGES", 2)
            ks, wsm = _d(k, "QF_KSPLIT", 0), _d(k, "QF_WSMEM", 0)
            _block_is(k, grid, block, 32 * gw, "32 QF_GWARPS")
            if grid != (-(-T // gw), -(-nb // (8 * nt)), C if ks else 1):
                _fail(k, grid, block, f"the grid must be (ceil({T} / {gw}), ceil({nb} / {8 * nt}), {C if ks else 1})")
            xrow, wrow, mrow = {12: (288, 160, 16), 14: (272, 208, 20)}[_d(k, "QF_TYPE", 12)]
            want = st * 8 * nt * (2 * xrow + 64) + (st * gw * 16 * (wrow + mrow) if wsm else 0) + \
                (4 * nt * 32 * gw * 4 if C > 1 and not ks else 0)
            if shmem != want:
                _fail(k, grid, block, f"{shmem} bytes of dynamic shared memory, the kernel addresses {want}")
            if ks and C > 1 and (not v[6 if glu else 7] or not v[5 if glu else 6]):
                _fail(k, grid, block, "QF_KSPLIT with several chains needs ws and cnt")
    elif name == "to_qf":
        # qf.cu: a warp a superblock of a row, grid ceil(nb K / 2048), block 256, no shared memory
        _block_is(k, grid, block, 256, "to_qf's 256 threads")
        _no_dynamic_smem(k, grid, block, shmem)
        nb, K = int(v[3]), int(v[4])
        if K % 256:
            _fail(k, grid, block, f"K = {K} not a multiple of 256")
        _ranges(k, grid, block, f"superblocks ({nb * K // 256})", nb * K // 256, np.arange(grid[0]) * 8, 8)
    elif name == "to_f16":
        # gemm_f16.cu: grid ceil(n / 512), block 256, two values a thread, no shared memory
        _block_is(k, grid, block, 256, "to_f16's 256 threads")
        _no_dynamic_smem(k, grid, block, shmem)
        _ranges(k, grid, block, f"h ({int(v[2])})", int(v[2]), np.arange(grid[0]) * 512, 512)
    elif name.startswith("embed_"):
        # embed.cu: grid (n_tokens), block EMBED_THREADS (threads stride the row), no shared memory
        _block_is(k, grid, block, _d(k, "EMBED_THREADS", 256), "EMBED_THREADS")
        _no_dynamic_smem(k, grid, block, shmem)


# -- kernel models ------------------------------------------------------------------------

def _f32(g, p, n):
    return g.mem(p, np.float32, n)


def _embed(g, k, grid, v):
    from memra.model import quants as Q
    from memra.gpu.ops.embed import KERNELS

    table, tok, out, n_vocab, n_embd, row_bytes, scale = v
    t_of = {name: t for t, name in KERNELS.items()}[k.name]
    T = grid[0]
    ids = g.mem(tok, np.int32, T)
    o = _f32(g, out, T * n_embd).reshape(T, n_embd)
    for t in range(T):
        raw = g.mem(table + int(ids[t]) * row_bytes, np.uint8, row_bytes)
        o[t] = Q.dequantize(raw.copy(), t_of, (1, n_embd))[0] * np.float32(scale)


def _q8_twin_rows(g, src, T: int, W: int, xq, xs, skip) -> None:
    """The q8 twin of a [T, W] output's rows, leaving the rows in `skip` (a launch writes
    nothing there: padded rows) as they were."""
    if not xq:
        return
    skip = list(skip)
    kept = (g.mem(xq, np.int8, T * W).reshape(T, W)[skip].copy(),
            g.mem(xs, np.uint8, T * W // 32 * 8).reshape(T, -1)[skip].copy())
    _q8_twin(g, src, T * W, xq, xs)
    g.mem(xq, np.int8, T * W).reshape(T, W)[skip] = kept[0]
    g.mem(xs, np.uint8, T * W // 32 * 8).reshape(T, -1)[skip] = kept[1]


def _q8_twin(g, src, n_values, xq, xs):
    """The q8 twin some kernels write next to their f32 output (q8.cuh's rule)."""
    if not xq:
        return
    from memra.gpu.ops import matvec as MV

    q, sc = MV.quantize_q8_ref(_f32(g, src, n_values).reshape(1, -1))
    g.mem(xq, np.int8, n_values)[:] = q.reshape(-1)
    g.mem(xs, MV.Q8_SCALE, n_values // 32)[:] = sc.reshape(-1)


def _rmsnorm(g, k, grid, v):
    from memra.cpu.reference import rms_norm

    x, w, out, n, eps, xq, xs = v
    R = grid[0]
    _f32(g, out, R * n)[:] = rms_norm(_f32(g, x, R * n).reshape(R, n), _f32(g, w, n), eps).reshape(-1)
    _q8_twin(g, out, R * n, xq, xs)


def _add_rmsnorm(g, k, grid, v):
    from memra.cpu.reference import rms_norm

    x, delta, w_post, w, out, n, eps_post, eps, xq, xs = v
    R = grid[0]
    xq_, xs_ = xq, xs
    xs = _f32(g, x, R * n).reshape(R, n)
    d = _f32(g, delta, R * n).reshape(R, n).copy()
    if w_post:
        d = rms_norm(d, _f32(g, w_post, n), eps_post)
    xs += d
    _f32(g, out, R * n)[:] = rms_norm(xs, _f32(g, w, n), eps).reshape(-1)
    _q8_twin(g, out, R * n, xq_, xs_)


def _kv_scales(k, v):
    """A launch's arguments without the q8_0 scale planes and those planes: kernels/kv.cuh's
    KV_SCALE_PARAMS are the last two parameters of a module with KV_K_Q8 or KV_V_Q8."""
    if _d(k, "KV_K_Q8", 0) or _d(k, "KV_V_Q8", 0):
        return tuple(v[:-2]), tuple(v[-2:])
    return tuple(v), (0, 0)


class _Q8Pool:
    """A q8_0 side of the paged cache (kernels/kv.cuh): codes [n_rows, row] int8 and f16
    scales [n_rows, row / 32]. Reading gives d * q (float32, exact); writing a float32 row
    quantizes it by llama.cpp's rule (memra.cpu.llamacpp.q8_0_quantize), as the kernels do."""

    def __init__(self, codes, scales, ignore_scales=False):
        self.q, self.d, self.ignore = codes, scales, ignore_scales

    def __getitem__(self, rows):
        from memra.cpu.llamacpp import q8_0_dequantize

        d = np.ones(self.d[rows].shape, np.float32) if self.ignore else self.d[rows].astype(np.float32)
        return q8_0_dequantize(self.q[rows], d)

    def __setitem__(self, r, x):
        from memra.cpu.llamacpp import q8_0_quantize

        q, d = q8_0_quantize(np.asarray(x, np.float32))
        self.q[r], self.d[r] = q, d.astype(np.float16)


def _rope(g, k, grid, v):
    from memra.cpu.reference import _rotate, rms_norm

    v, scales = _kv_scales(k, v)
    (q, kk, vv, qs, ks, vs, q_out, kc, vc, pos, seq, bias, qn, kn, cs, cs_rows, bt, max_blocks, n_head, n_kv,
     rope_dim, neox, eps) = v
    D = int(k.defines["HEAD_DIM"])
    T = grid[1]
    P = g.mem(pos, np.int32, T)
    S = g.mem(seq, np.int32, T) if seq else np.zeros(T, np.int32)
    table = g.mem(cs, np.float32, cs_rows * rope_dim).reshape(cs_rows, rope_dim // 2, 2)
    b = _f32(g, bias, (n_head + 2 * n_kv) * D).reshape(-1, D) if bias else None
    kpool, vpool, slot = _paged(g, k, kc, vc, bt, max_blocks, S, n_kv * D, scales)
    for t in range(T):
        qh = _f32(g, q + 4 * t * qs, n_head * D).reshape(n_head, D).copy()
        kh = _f32(g, kk + 4 * t * ks, n_kv * D).reshape(n_kv, D).copy()
        vh = _f32(g, vv + 4 * t * vs, n_kv * D).reshape(n_kv, D).copy()
        if b is not None:
            qh, kh, vh = qh + b[:n_head], kh + b[n_head:n_head + n_kv], vh + b[n_head + n_kv:]
        if qn:
            qh = rms_norm(qh, _f32(g, qn, D), eps)
        if kn:
            kh = rms_norm(kh, _f32(g, kn, D), eps)
        c, s = table[min(max(P[t], 0), cs_rows - 1)].T
        qh = _rotate(qh[None], c[None], s[None], bool(neox))[0]
        kh = _rotate(kh[None], c[None], s[None], bool(neox))[0]
        _f32(g, q_out + 4 * t * n_head * D, n_head * D)[:] = qh.reshape(-1)
        r = slot(int(S[t]), int(P[t]), write=True)
        if r is not None:  # a q8_0 side quantizes the float32 row (_Q8Pool)
            kpool[r] = (kh if isinstance(kpool, _Q8Pool) else kh.astype(np.float16)).reshape(-1)
            vpool[r] = (vh if isinstance(vpool, _Q8Pool) else vh.astype(np.float16)).reshape(-1)


def _paged(g, k, kc, vc, bt, max_blocks, seqs, row, scales=(0, 0)):
    """The K and V pools as [n_blocks * KV_BLOCK, row] f16 arrays (a q8_0 side, KV_K_Q8 /
    KV_V_Q8: a _Q8Pool over its codes and scales planes) and slot(s, p, write) -> the pool row
    of position p of block-table row s (kernels/kv.cuh); with write=True, None where the kernel
    drops the append (p outside the table or an unmapped block)."""
    B = int(k.defines.get("KV_BLOCK", 16))
    n_seq = int(np.max(seqs)) + 1 if len(seqs) else 1
    table = g.mem(bt, np.int32, n_seq * max_blocks).reshape(n_seq, max_blocks)
    n_rows = (int(table.max()) + 1) * B if table.size else 0
    pools = []
    for ptr, sc, q8 in ((kc, scales[0], _d(k, "KV_K_Q8", 0)), (vc, scales[1], _d(k, "KV_V_Q8", 0))):
        if q8:
            if row % 32 or not sc:
                raise CudaError(f"{k.name}: a q8_0 KV side needs row % 32 == 0 and its scale plane")
            pools.append(_Q8Pool(g.mem(ptr, np.int8, n_rows * row).reshape(n_rows, row),
                                 g.mem(sc, np.uint16, n_rows * row // 32).view(np.float16).reshape(n_rows, row // 32),
                                 ignore_scales=_d(k, "MEMRA_CANARY", 0) == 4))
        else:
            pools.append(g.mem(ptr, np.uint16, n_rows * row).view(np.float16).reshape(n_rows, row))
    kpool, vpool = pools

    def slot(s, p, write=False):
        if write and not (0 <= p < max_blocks * B and table[s, p // B] >= 0):
            return None
        if not 0 <= p < max_blocks * B or table[s, p // B] < 0:
            raise CudaError(f"attention read position {p} of block-table row {s}, which maps no block there")
        return int(table[s, p // B]) * B + p % B

    return kpool, vpool, slot


def _attn_split(g, k, grid, v):
    v, scales = _kv_scales(k, v)
    q, kc, vc, part_o, part_ml, pos, seq, bt, max_blocks, n_kv, qpk, window, scale, softcap = v
    D, G = int(k.defines["HEAD_DIM"]), int(k.defines["N_GQA"])  # G: query heads per block
    TILE = int(k.defines.get("ATT_TILE", 64))
    MIN_CHUNK = int(k.defines.get("ATT_MIN_CHUNK", 128))
    _, S, T = grid
    nh = grid[0] * G
    assert nh == n_kv * qpk and qpk % G == 0, "attention grid does not cover the heads"
    P = g.mem(pos, np.int32, T)
    SQ = g.mem(seq, np.int32, T) if seq else np.zeros(T, np.int32)
    kpool, vpool, slot = _paged(g, k, kc, vc, bt, max_blocks, SQ, n_kv * D, scales)
    po = _f32(g, part_o, T * nh * S * D).reshape(T, nh, S, D)
    pml = _f32(g, part_ml, T * nh * S * 2).reshape(T, nh, S, 2)
    for t in range(T):
        hi = int(P[t]) + 1
        lo = max(0, hi - window) if window > 0 else 0
        n = hi - lo
        chunk = max(MIN_CHUNK, -(-(-(-n // S)) // TILE) * TILE)
        qt = _f32(g, q + 4 * t * nh * D, nh * D).reshape(n_kv, qpk, D).astype(np.float64)
        for s in range(S):
            k0, k1 = lo + s * chunk, min(hi, lo + (s + 1) * chunk)
            if k0 >= k1:
                po[t, :, s] = 0
                pml[t, :, s, 0], pml[t, :, s, 1] = -np.inf, 0
                continue
            rows = [slot(int(SQ[t]), p) for p in range(k0, k1)]
            K = kpool[rows].reshape(-1, n_kv, D).astype(np.float64)  # [n, n_kv, D]
            V = vpool[rows].reshape(-1, n_kv, D).astype(np.float64)
            sc = np.einsum("hgd,nhd->hgn", qt, K) * scale
            if softcap > 0:
                sc = softcap * np.tanh(sc / softcap)
            m = sc.max(-1, keepdims=True)
            e = np.exp(sc - m)
            po[t, :, s] = np.einsum("hgn,nhd->hgd", e, V).reshape(nh, D)
            pml[t, :, s, 0] = m.reshape(nh)
            pml[t, :, s, 1] = e.sum(-1).reshape(nh)


def _att_rows_pos(g, k, pos, T: int, window: int):
    """attention.cu's row filter (v12; ATT_ROWS 1: only rows of fewer than ATT_SWITCH keys, 2: only the
    others): the positions with another module's rows marked padded (-1: their blocks leave at once, nothing read,
    appended or written), in a scratch; pos itself without ATT_ROWS."""
    mode = _d(k, "ATT_ROWS", 0)
    if not mode:
        return pos
    P, keys = g.mem(pos, np.int32, T).copy(), _d(k, "ATT_SWITCH", 256)
    n = np.minimum(P + 1, window) if window > 0 else P + 1
    P[(P >= 0) & ((n >= keys) if mode == 1 else (n < keys))] = -1
    key = ("att_rows_pos", T)
    if key not in g.wcache:
        g.wcache[key] = g.empty((T,), np.int32)
    g.mem(g.wcache[key].ptr, np.int32, T)[:] = P
    return g.wcache[key].ptr


def _attn_decode(g, k, grid, v):
    """attn_split + the merge of the last block, as attention.cu's attn_decode."""
    v, scales = _kv_scales(k, v)
    q, kc, vc, part_o, part_ml, counters, out, xq, xs, pos, seq, bt, max_blocks, n_kv, qpk, window, scale, softcap = v
    pos = _att_rows_pos(g, k, pos, grid[2], window)
    _attn_split(g, k, grid, (q, kc, vc, part_o, part_ml, pos, seq, bt, max_blocks, n_kv, qpk, window, scale,
                             softcap, *_q8_tail(k, scales)))
    D = int(k.defines["HEAD_DIM"])
    T = grid[2]
    if g.mem(counters, np.int32, T * grid[0]).any():
        raise CudaError("attn_decode: counters not zero at launch")
    # a padded row (position < 0) has no key: its blocks leave at once, writing nothing
    pad = np.flatnonzero(g.mem(pos, np.int32, T) < 0)
    W = n_kv * qpk * D
    o = _f32(g, out, T * W).reshape(T, W)
    kept = o[pad].copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        _attn_combine(g, k, (n_kv * qpk, T), (part_o, part_ml, out, grid[1]))
    o[pad] = kept
    _q8_twin_rows(g, out, T, W, xq, xs, pad)


def _q8_tail(k, scales):
    """The scale planes as trailing arguments again, for a module that takes them."""
    return tuple(scales) if _d(k, "KV_K_Q8", 0) or _d(k, "KV_V_Q8", 0) else ()


def _roped_q(g, k, T: int, n_kv: int, qpk: int, raw, rest, scales=(0, 0)):
    """rope_norm_kv of a fused launch's raw QKV rows (it appends K / V) into a scratch q;
    returns the scratch's address. raw: (q, k, v, q_stride, k_stride, v_stride); rest: (kcache,
    vcache, pos, seq, bias, q_norm, k_norm, cs, cs_rows, block_table, max_blocks, rope_dim, neox,
    eps)."""
    kc, vc, pos, seq, bias, qn, kn, cs, cs_rows, bt, max_blocks, rope_dim, neox, eps = rest
    D, n_head = int(k.defines["HEAD_DIM"]), n_kv * qpk
    key = ("rope_q", T * n_head * D)  # one scratch per size: replays must not grow the heap
    if key not in g.wcache:
        g.wcache[key] = g.empty((T, n_head * D), np.float32)
    qr = g.wcache[key].ptr
    _rope(g, k, (1, T), (*raw, qr, kc, vc, pos, seq, bias, qn, kn, cs, cs_rows, bt, max_blocks, n_head, n_kv,
                         rope_dim, neox, eps, *_q8_tail(k, scales)))
    return qr


def _attn_decode_rope(g, k, grid, v):
    """rope_norm_kv into a scratch q, then attn_decode, as attention.cu's attn_decode_rope."""
    v, scales = _kv_scales(k, v)
    (q, kk, vv, qs, ks, vs, bias, qn, kn, cs, cs_rows, rope_dim, neox, eps, kc, vc, part_o, part_ml, counters,
     out, xq, xs, pos, seq, bt, max_blocks, n_kv, qpk, window, scale, softcap) = v
    pos = _att_rows_pos(g, k, pos, grid[2], window)
    qr = _roped_q(g, k, grid[2], n_kv, qpk, (q, kk, vv, qs, ks, vs), (kc, vc, pos, seq, bias, qn, kn, cs, cs_rows, bt,
                                                                      max_blocks, rope_dim, neox, eps), scales)
    _attn_decode(g, k, grid, (qr, kc, vc, part_o, part_ml, counters, out, xq, xs, pos, seq, bt, max_blocks,
                              n_kv, qpk, window, scale, softcap, *_q8_tail(k, scales)))


def _attn_fa(g, k, grid, v):
    """attn_fa.cu's attn_fa / attn_fa_dec, as the runner sees them: every row with keys gets
    softmax attention over them (float64, q rounded to f16 as the kernel reads it), written to
    out whatever its splits (fa_combine, below, then has nothing left to merge); a row's
    result does not depend on the packing. attn_fa's token groups are checked: at most
    FA_WARPS * 16 / qpk rows each, of one sequence, every row with a position in exactly one."""
    if k.name == "attn_fa":
        q, kc, vc, _, _, out, pos, seq, bt, max_blocks, groups, n_kv, qpk, window, scale, softcap = v
        tab = g.mem(groups, np.int32, 2 * grid[0] + 2).reshape(-1, 2)
        # the step's row count: the runner's (rows, GROUPS_END) after the launched groups, else grid x
        from memra.gpu.ops.attn_fa import GROUPS_END

        T = int(tab[-1, 0]) if tab[-1, 1] == GROUPS_END else grid[0]
        tab = tab[:-1]
        tpb = _d(k, "FA_WARPS", 4) * (16 // qpk)
        P = g.mem(pos, np.int32, T)
        SQ = g.mem(seq, np.int32, T) if seq else np.zeros(T, np.int32)
        seen = np.zeros(T, int)
        for t0, cnt in tab:
            if cnt == 0:
                continue
            if not 1 <= cnt <= tpb or t0 < 0 or t0 + cnt > T:
                raise CudaError(f"attn_fa: token group ({t0}, {cnt}) outside 1..{tpb} rows of {T}")
            live = [int(SQ[t]) for t in range(t0, t0 + cnt) if P[t] >= 0]
            if len(set(live)) > 1:
                raise CudaError(f"attn_fa: a token group mixes sequences {sorted(set(live))}")
            seen[t0:t0 + cnt] += 1
        if np.any(seen[P >= 0] != 1) or np.any(seen > 1):
            raise CudaError("attn_fa: the token groups do not cover each row with a position exactly once")
        rows_of = [t for t in range(T) if seen[t]]
        # grid z: a row's keys [lo, hi) are cut into absolute splits of FA_SPLIT; the blocks of
        # split j compute it, so the grid must reach the deepest row's last split
        split = _d(k, "FA_SPLIT", 256)
        deepest = max((int(P[t]) // split for t in rows_of), default=-1)
        if deepest >= grid[2]:
            raise CudaError(f"attn_fa: a row's keys reach split {deepest}, the grid has {grid[2]}")
    else:
        (q, q_raw, kk, vv, qs, ks, vs, bias, qn, kn, cs, cs_rows, rope_dim, neox, eps, kc, vc, _, _, counters, out,
         xq, xs, pos, seq, bt, max_blocks, n_kv, qpk, window, scale, softcap) = v
        T = grid[0]
        P = g.mem(pos, np.int32, T)
        SQ = g.mem(seq, np.int32, T) if seq else np.zeros(T, np.int32)
        rows_of = [t for t in range(T) if P[t] >= 0]
        if g.mem(counters, np.int32, T * n_kv).any():
            raise CudaError("attn_fa_dec: counters not zero at launch")
        if q_raw:  # RoPE and the KV append fused: rope_norm_kv into a scratch q first
            q = _roped_q(g, k, T, n_kv, qpk, (q_raw, kk, vv, qs, ks, vs), (kc, vc, pos, seq, bias, qn, kn, cs,
                                                                         cs_rows, bt, max_blocks, rope_dim, neox, eps))
    D = int(k.defines["HEAD_DIM"])
    nh = n_kv * qpk
    kpool, vpool, slot = _paged(g, k, kc, vc, bt, max_blocks, SQ, n_kv * D)
    canary = int(k.defines.get("MEMRA_CANARY", 0))
    if canary == 2:  # kv.cuh's canary: the block table ignored (pool rows in position order)
        slot = lambda s, p: p  # noqa: E731
    o = _f32(g, out, T * nh * D).reshape(T, nh, D)
    for t in rows_of:
        hi = int(P[t]) + (0 if canary == 1 else 1)  # canary 1: a token does not see itself
        if canary == 1 and hi <= 0:
            o[t] = 0.0
            continue
        if hi <= 0:
            continue
        lo = max(0, hi - window) if window > 0 else 0
        rows = [slot(int(SQ[t]), p) for p in range(lo, hi)]
        K = kpool[rows].reshape(-1, n_kv, D).astype(np.float64)
        V = vpool[rows].reshape(-1, n_kv, D).astype(np.float64)
        qt = _f32(g, q + 4 * t * nh * D, nh * D).reshape(n_kv, qpk, D).astype(np.float16).astype(np.float64)
        sc = np.einsum("hgd,nhd->hgn", qt, K) * scale
        if softcap > 0:
            sc = softcap * np.tanh(sc / softcap)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        o[t] = (np.einsum("hgn,nhd->hgd", e, V) / e.sum(-1, keepdims=True)).reshape(nh, D)
    if k.name == "attn_fa_dec":  # the q8 twin of the rows it wrote
        _q8_twin_rows(g, out, T, nh * D, xq, xs, sorted(set(range(T)) - set(rows_of)))


def _fa_combine(g, k, grid, v):
    """Nothing to merge: the emulated attn_fa wrote every row's output."""


def _attn_combine(g, k, grid, v):
    part_o, part_ml, out, S = v
    D = int(k.defines["HEAD_DIM"])
    nh, T = grid
    po = _f32(g, part_o, T * nh * S * D).reshape(T, nh, S, D).astype(np.float64)
    pml = _f32(g, part_ml, T * nh * S * 2).reshape(T, nh, S, 2).astype(np.float64)
    m = pml[..., 0]
    M = m.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        w = np.where(np.isneginf(m), 0.0, np.exp(m - M))
    num = np.einsum("ths,thsd->thd", w, np.where(np.isneginf(m)[..., None], 0.0, po))
    den = (w * pml[..., 1]).sum(-1)
    _f32(g, out, T * nh * D)[:] = (num / den[..., None]).reshape(-1)


def _act_mul(g, k, grid, v):
    from memra.gpu.ops.act import reference

    gate, up, out, n, gs, us, os_, act = v
    for r in range(grid[1]):
        _f32(g, out + 4 * r * os_, n)[:] = reference(_f32(g, gate + 4 * r * gs, n), _f32(g, up + 4 * r * us, n),
                                                     "gelu_tanh" if act else "silu")


def _gemm_tile(g, k, grid, v):
    """gemm_tile.cu: every output the chain (memra.gpu.chain) of the q8 activations, then
    act(gate) * up (act.cu's model: act's reference in float32) and + res, one rounding each.
    MEMRA_CANARY=1 stages block 1's dx and S as 0 (the kernel's canary)."""
    from memra.gpu import chain as CH
    from memra.gpu.ops import act as ACT
    from memra.gpu.ops import matvec as MV

    bulk, meta, xq, xs, y, res, N, K, nb, act = v
    t = int(k.defines["MV_TYPE"])
    glu = k.name.endswith("_glu")
    rows = 2 * N if glu else N
    _, blk, bb, bo, bl = MV.TYPES[t]
    nblk = K // blk
    raw = MV.unpack_planes(g.mem(bulk, np.uint8, rows * nblk * bl).reshape(rows, -1),
                           g.mem(meta, np.uint8, rows * nblk * (bb - bl)).reshape(rows, -1), t)
    q = g.mem(xq, np.int8, nb * K).reshape(nb, K)
    sc = g.mem(xs, MV.Q8_SCALE, nb * K // 32).reshape(nb, K // 32).copy()
    if int(k.defines.get("MEMRA_CANARY", 0)) == 1:
        sc["d"][:, 1], sc["s"][:, 1] = 0, 0
    yy = CH.chain(raw, t, q, sc["d"], sc["s"])
    if glu:
        yy = ACT.reference(yy[:, :N], yy[:, N:], "gelu_tanh" if act == 2 else "silu").astype(np.float32)
    if res:
        yy = (yy + _f32(g, res, nb * N).reshape(nb, N)).astype(np.float32)
    _f32(g, y, nb * N)[:] = yy.reshape(-1)


def _gemm_f16(g, k, grid, v):
    """gemm_f16.cu and gemm_f16_wg.cu (the same bits): the f16-rounded weights (memra.model.quants' values astype(float16): the kernel's
    T::deq rounded by cvt.rn) times the f16 activations, each row's products summed in float64 and
    rounded once to float32 (the kernel: one float32 accumulator over its k16 mma steps, within ~1e-6
    of this; the model gives the kernel's operands and epilogue, not its accumulation's bits), a row's
    value from its own activations alone (row by row, as the kernel's chunk- and batch-invariance
    promises); then act(gate) * up (act.cu's model, act's reference in float32, as the kernel's
    epilogue equals act_mul's bits) or fl(res + acc) in float32. MEMRA_CANARY=1 drops k = 16..31."""
    from memra.gpu.ops import act as ACT
    from memra.gpu.ops import matvec as MV

    glu = k.name.endswith("_glu")
    if glu:
        bulk, meta, x, y, N, K, nb, act = v
        res = 0
    else:
        bulk, meta, x, y, res, N, K, nb = v
        act = 0
    t = int(k.defines["MV_TYPE"])
    rows = 2 * N if glu else N
    _, blk, bb, bo, bl = MV.TYPES[t]
    key = ("f16", bulk, meta, t, rows, K)
    wf = g.wcache.get(key)  # weights are uploaded once and never written
    if wf is None:
        nblk = K // blk
        raw = MV.unpack_planes(g.mem(bulk, np.uint8, rows * nblk * bl).reshape(rows, -1),
                               g.mem(meta, np.uint8, rows * nblk * (bb - bl)).reshape(rows, -1), t)
        wf = g.wcache[key] = MV.dequant_rows(raw, t).astype(np.float16).astype(np.float64)
    xv = g.mem(x, np.float16, nb * K).reshape(nb, K).astype(np.float64)
    if int(k.defines.get("MEMRA_CANARY", 0)) == 1:
        xv[:, 16:32] = 0.0
    yy = np.stack([wf @ xv[b] for b in range(nb)]).astype(np.float32)
    if glu:
        yy = ACT.reference(yy[:, :N], yy[:, N:], "gelu_tanh" if act == 2 else "silu").astype(np.float32)
    if res:
        yy = (_f32(g, res, nb * N).reshape(nb, N) + yy).astype(np.float32)
    _f32(g, y, nb * N)[:] = yy.reshape(-1)


def _to_f16(g, k, grid, v):
    """gemm_f16.cu's to_f16: numpy's astype(float16) (round to nearest even, as cvt.rn);
    MEMRA_CANARY=2 rounds toward zero."""
    x, h, n = v
    xv = _f32(g, x, n)
    with np.errstate(over="ignore"):
        hv = xv.astype(np.float16)
    bits = hv.view(np.uint16).copy()
    if int(k.defines.get("MEMRA_CANARY", 0)) == 2:   # one ulp toward zero where rounding went away from it
        away = np.abs(hv.astype(np.float32)) > np.abs(xv)
        bits[away] -= np.uint16(1)
    g.mem(h, np.uint16, n)[:] = bits


def _qf(g, k, grid, v):
    """qf.cu's qf_mv / qf_gemm (the same bits): per output and chain (QF_CHAINS equal runs of superblocks) the float64
    value of the qf arithmetic on what the launch reads — the Q4_K integers with d sc and dmin m (Q6_K: q - 32 with d
    sc a 16-sub-block), the f16 activations of xh (qf order undone), S2 = hi + lo from xs2 — rounded to float32, the
    chains folded left in float32 (the kernel: f32 accumulation inside a superblock's mma chain and fold, within ~1e-6
    of this; the model gives its operands, chains and epilogue, not its accumulation's bits), a row's value from its
    own activations alone; then act(gate) * up (act.cu's model) or fl(res + acc). MEMRA_CANARY=1 drops the second k16
    step of each superblock's first sub-block from S1 (Q6_K: sub-block 1 whole); 2 folds qf_gemm's chains split
    across blocks in reverse order."""
    from memra.gpu.ops import act as ACT
    from memra.gpu.ops import matvec as MV
    from memra.model import quants as Q

    glu, gemm = k.name.endswith("_glu"), k.name.startswith("qf_gemm")
    if gemm:
        if glu:
            bulk, meta, x, xs2, y, _ws, _cnt, N, K, nb, act = v
            res = 0
        else:
            bulk, meta, x, xs2, y, res, _ws, _cnt, N, K, nb = v
            act = 0
    elif glu:
        bulk, meta, x, xs2, y, N, K, nb, act = v
        res = 0
    else:
        bulk, meta, x, xs2, y, res, N, K, nb = v
        act = 0
    N, K, nb = int(N), int(K), int(nb)
    rows, nsb, C, t = 2 * N if glu else N, K // 256, _d(k, "QF_CHAINS", 1), _d(k, "QF_TYPE", 12)
    sub = 16 if t == 14 else 32   # the elements a scale covers
    key = ("qf", bulk, meta, rows, K)
    hit = g.wcache.get(key)  # weights are uploaded once and never written
    if hit is None:
        _, _, bb, _, bl = MV.TYPES[t]
        raw = MV.unpack_planes(g.mem(bulk, np.uint8, rows * nsb * bl).reshape(rows, -1),
                               g.mem(meta, np.uint8, rows * nsb * (bb - bl)).reshape(rows, -1), t)
        q, dsc, mneg = (Q._q6_k if t == 14 else Q._q4_k)(np.ascontiguousarray(raw).reshape(rows * nsb, bb))
        hit = g.wcache[key] = (q.reshape(rows, K // sub, sub).astype(np.float64),
                               dsc.reshape(rows, K // sub).astype(np.float64),
                               None if mneg is None else mneg.reshape(rows, K // 32).astype(np.float64))
    q, dsc, mneg = hit
    canary = _d(k, "MEMRA_CANARY", 0)
    inv = np.argsort([0, 2, 1, 3, 4, 6, 5, 7])
    xv = g.mem(x, np.float16, nb * K).reshape(nb, K // 8, 8)[:, :, inv].reshape(nb, K // sub, sub).astype(np.float64)
    if canary == 1 and t == 14:   # sub-block 1 of each superblock dropped
        xv[:, 1::16, :] = 0.0
    elif canary == 1:   # sub-block 0 of each superblock: elements 8 tig + 4 .. 8 tig + 7 dropped from S1
        drop = (np.arange(32) % 8) >= 4
        xv[:, ::8, drop] = 0.0
    s2 = np.zeros((nb, K // 32))
    if mneg is not None:
        s = g.mem(xs2, np.float32, nb * K // 16).reshape(nb, nsb, 4, 4).astype(np.float64)
        s2 = np.empty((nb, nsb, 8))
        s2[:, :, 0:4], s2[:, :, 4:8] = s[..., 0] + s[..., 2], s[..., 1] + s[..., 3]
        s2 = s2.reshape(nb, K // 32)
    out = np.empty((nb, rows), np.float32)
    for b in range(nb):   # row by row: a row's value from its own activations alone
        per = np.einsum("nsk,sk->ns", q, xv[b]) * dsc
        if mneg is not None:
            per = per + mneg * s2[b][None, :]
        per = per.reshape(rows, C, -1).sum(-1)
        parts = per.astype(np.float32)
        order = range(C - 1, -1, -1) if canary == 2 and gemm and _d(k, "QF_KSPLIT", 0) and C > 1 else range(C)
        acc = None
        for c in order:
            acc = parts[:, c] if acc is None else (acc + parts[:, c]).astype(np.float32)
        out[b] = acc
    if glu:
        out = ACT.reference(out[:, :N], out[:, N:], "gelu_tanh" if act == 2 else "silu").astype(np.float32)
    elif res:
        out = (_f32(g, res, nb * N).reshape(nb, N) + out).astype(np.float32)
    _f32(g, y, nb * N)[:] = out.reshape(-1)


def _to_qf(g, k, grid, v):
    """qf.cu's to_qf: memra.gpu.ops.qf.producer, the host replay kernel-check holds the kernel to bit for bit
    (MEMRA_CANARY=3: its canary's sum order)."""
    from memra.gpu.ops.qf import producer

    x, xh, xs2, nb, K = v
    nb, K = int(nb), int(K)
    h, s, _, _ = producer(_f32(g, x, nb * K).reshape(nb, K), canary=_d(k, "MEMRA_CANARY", 0))
    g.mem(xh, np.uint16, nb * K)[:] = h.reshape(-1)
    g.mem(xs2, np.float32, nb * K // 16)[:] = s.reshape(-1)


def _softcap(g, k, grid, v):
    x, n, cap = v
    a = _f32(g, x, n)
    a[:] = np.tanh(a / np.float32(cap)) * np.float32(cap)


def _commit(g, b, idx, tok, pos, step, hist, hist_len, advance):
    p = g.mem(pos, np.int32, b + 1)
    if p[b] < 0:  # a padded row
        return
    g.mem(tok, np.int32, b + 1)[b] = idx
    st = g.mem(step, np.int32, b + 1)
    if hist and 0 <= st[b] < hist_len:
        g.mem(hist, np.int32, (b + 1) * hist_len)[b * hist_len + st[b]] = idx
    st[b] += 1
    p[b] += advance


def _argmax_partial(g, k, grid, v):
    logits, n, pv, pi = v
    nb, rows = grid[0], grid[1]
    seg = -(-n // nb)
    for b in range(rows):
        l = _f32(g, logits + 4 * b * n, n)
        for j in range(nb):
            s = l[j * seg:min(n, (j + 1) * seg)]
            _f32(g, pv, rows * nb)[b * nb + j] = s.max() if s.size else -np.inf
            g.mem(pi, np.int32, rows * nb)[b * nb + j] = j * seg + int(np.argmax(s)) if s.size else 0x7FFFFFFF


def _argmax_final(g, k, grid, v):
    pv, pi, nb, tok, pos, step, hist, hist_len, advance = v
    for b in range(grid[0]):
        vals = _f32(g, pv, (b + 1) * nb)[b * nb:]
        idxs = g.mem(pi, np.int32, (b + 1) * nb)[b * nb:]
        best = max(range(nb), key=lambda j: (vals[j], -idxs[j]))
        _commit(g, b, int(idxs[best]), tok, pos, step, hist, hist_len, advance)


def _sample(g, k, grid, v):
    from memra.gpu.ops.sample import reference_sample

    logits, n, fp, topk, seeds, tok, pos, step, hist, hist_len, advance = v
    for b in range(grid[0]):
        temp, top_p, min_p = _f32(g, fp, 3 * (b + 1))[3 * b:3 * b + 3]
        p = int(g.mem(pos, np.int32, b + 1)[b])
        idx = reference_sample(_f32(g, logits + 4 * b * n, n), temp, int(g.mem(topk, np.int32, b + 1)[b]),
                               top_p, min_p, int(g.mem(seeds, np.uint64, b + 1)[b]), p + advance)
        _commit(g, b, idx, tok, pos, step, hist, hist_len, advance)


def _apply_mask(g, k, grid, v):
    # mask.cu: live rows (pos >= 0, or every row when pos is NULL) get -inf where bit i % 32
    # of word i / 32 of their mask is clear
    logits, n, mask, words, pos = v
    n, words = int(n), int(words)
    for b in range(grid[1]):
        if pos and int(g.mem(pos, np.int32, b + 1)[b]) < 0:
            continue
        w = g.mem(mask, np.uint32, (b + 1) * words)[b * words:]
        bit = (w[np.arange(n) // 32] >> (np.arange(n) % 32).astype(np.uint32)) & 1
        row = _f32(g, logits + 4 * b * n, n)
        row[bit == 0] = -np.inf


def _mv(g, k, grid, v):
    from memra.gpu.ops import matvec as MV

    t = int(k.defines["MV_TYPE"])
    glu = k.name.endswith("_glu")
    if k.name.startswith(("mv_q8", "gemm_q8", "mvt_q8")):
        bulk, meta, xq, xs, y, res, N, K, nb, act = v
        q = g.mem(xq, np.int8, nb * K).reshape(nb, K // 32, 32).astype(np.float64)
        d = g.mem(xs, MV.Q8_SCALE, nb * K // 32)["d"].reshape(nb, K // 32, 1)
        x = (q * d).reshape(nb, K)
    else:
        bulk, meta, x, y, res, N, K, nb, act = v
        x = _f32(g, x, nb * K).reshape(nb, K).astype(np.float64)
    rows = 2 * N if glu else N
    name, blk, bb, bo, bl = MV.TYPES[t]
    key = (bulk, meta, t, rows, K)
    wf = g.wcache.get(key)  # weights are uploaded once and never written
    if wf is None:
        nblk = K // blk
        bp = g.mem(bulk, np.uint8, rows * nblk * (bl if t not in MV.FLOAT_TYPES else bb)).reshape(rows, -1)
        mp = g.mem(meta, np.uint8, rows * nblk * (bb - bl)).reshape(rows, -1) if t not in MV.FLOAT_TYPES else None
        raw = MV.unpack_planes(bp, mp, t) if mp is not None else bp.copy()
        wf = g.wcache[key] = MV.dequant_rows(raw, t).astype(np.float64)
    # row by row: a BLAS product of several rows may sum a row in another order than one
    # row alone, and the kernels promise each row the same bits at any batch
    yy = np.stack([wf @ x[b] for b in range(nb)])
    if glu:
        gte, up = yy[:, :N], yy[:, N:]
        a = gte / (1 + np.exp(-gte)) if act == 1 else 0.5 * gte * (1 + np.tanh(0.7978845608028654 * (gte + 0.044715 * gte ** 3)))
        yy = a * up
    if res:
        yy = yy + _f32(g, res, nb * N).reshape(nb, N)
    _f32(g, y, nb * N)[:] = yy.reshape(-1)


def _quantize_q8(g, k, grid, v):
    from memra.gpu.ops import matvec as MV

    x, xq, xs, nblocks = v
    xv = _f32(g, x, nblocks * 32).reshape(nblocks, 32)
    q, s = MV.quantize_q8_ref(xv.reshape(1, -1))
    g.mem(xq, np.int8, nblocks * 32)[:] = q.reshape(-1)
    g.mem(xs, MV.Q8_SCALE, nblocks)[:] = s.reshape(-1)


_KERNELS = {
    "rmsnorm": _rmsnorm, "add_rmsnorm": _add_rmsnorm, "rope_norm_kv": _rope,
    "attn_split": _attn_split, "attn_combine": _attn_combine, "attn_decode": _attn_decode,
    "attn_decode_rope": _attn_decode_rope, "attn_fa": _attn_fa, "attn_fa_dec": _attn_fa, "fa_combine": _fa_combine,
    "act_mul": _act_mul, "gemm_tile": _gemm_tile, "gemm_tile_glu": _gemm_tile,
    "gemm_f16": _gemm_f16, "gemm_f16_glu": _gemm_f16, "to_f16": _to_f16,
    "qf_mv": _qf, "qf_mv_glu": _qf, "qf_gemm": _qf, "qf_gemm_glu": _qf, "to_qf": _to_qf,
    "softcap": _softcap, "argmax_partial": _argmax_partial, "argmax_final": _argmax_final,
    "sample": _sample, "quantize_q8": _quantize_q8, "apply_mask": _apply_mask,
}
_KERNELS.update({name: _embed for name in
                 ("embed_f32", "embed_f16", "embed_bf16", "embed_q4_0", "embed_q4_1", "embed_q5_0",
                  "embed_q5_1", "embed_q8_0", "embed_q4_k", "embed_q5_k", "embed_q6_k", "embed_iq4_xs")})


class ModuleLog(FakeGpu):
    """A FakeGpu that records every module loaded: (kernel file, sorted defines)."""

    def __init__(self, mem: int = 1 << 26):
        super().__init__(mem)
        self.loaded = set()

    def module(self, kernel_file, defines=None):
        self.loaded.add((kernel_file, tuple(sorted((k, str(v)) for k, v in (defines or {}).items()))))
        return super().module(kernel_file, defines)
