"""CPU dry run of check.py's Python path (no GPU): a fake Gpu that records launches and returns
zeros and unit timings; exercises the configs, the module / launch proxy, the views and the
records. python3 experiments/attn_ring/fake_gpu.py --ctx 64,1024"""
import sys, contextlib, types
from pathlib import Path
import numpy as np
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1])); sys.path.insert(0, str(HERE))
from memra.gpu import cuda
import memra.gpu.compile as C

class FA:
    def __init__(s, shape, dtype, host=None):
        s.dtype = np.dtype(dtype); s.shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        s.size = int(np.prod(s.shape)); s.nbytes = s.size * s.dtype.itemsize; s.ptr = 0
    def view(s, dtype=None, shape=None, offset=0):
        dt = np.dtype(dtype or s.dtype)
        if shape is None: shape = ((s.nbytes - offset)//dt.itemsize,)
        v = FA(shape, dt)
        assert offset + v.nbytes <= s.nbytes, (offset, v.nbytes, s.nbytes)
        return v
    def poison(s): pass
    def fill_bytes(s, b): pass
    def numpy(s): return np.zeros(s.shape, s.dtype)
class FK:
    num_regs = local_bytes = 0
    def allow_shared(s, n): s.optin = n
    def __init__(s, m, n): s.module, s.name = m, n
class FM:
    def __init__(s, kf, d): s.kernel_file, s.defines = kf, d
    def kernel(s, n): return FK(s, n)
class FG:
    info = types.SimpleNamespace(sm_count=132, l2_bytes=60<<20, arch="sm_90a", name="fake")
    n = 0
    def module(s, kf, d=None): return FM(kf, dict(d or {}))
    def launch(s, k, grid, block, args, shmem=0, pdl=False):
        s.n += 1
        if s.n < 40: print("launch", k.module.kernel_file, k.module.defines.get("ATT_RING"), k.module.defines.get("ATT_WARPS"), grid, block, shmem, file=sys.stderr)
    def empty(s, shape, dtype): return FA(shape, dtype)
    def to_device(s, a): return FA(a.shape, a.dtype)
    def sync(s): pass
    @contextlib.contextmanager
    def capture(s):
        yield types.SimpleNamespace(upload=lambda: None, launch=lambda: None, close=lambda: None)
    def time_ms(s, fn, reps=50, warmup=5): return np.ones(reps)
g = FG()
cuda.gpu = lambda index=0: g
C.compile_many = lambda jobs, workers=None: [(j, None, 0.0) for j in jobs]
import check
sys.argv = ["check.py"] + sys.argv[1:]
sys.exit(check.main())
