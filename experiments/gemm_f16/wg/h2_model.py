"""The half2 dequant's rounding against today's, on random Q4_K values (numpy, CPU, ~2 s): today the kernel
rounds ggml's f32 value (d*sc)*q - dmin*m to f16 once; a half2 dequant would round d*sc and dmin*m to f16 first,
then take q * a - b in one fused HFMA2. Prints how often the two agree and each one's error against float64.

    python3 experiments/gemm_f16/wg/h2_model.py
"""
import numpy as np
rng = np.random.default_rng(0)
n = 2_000_000
d = (rng.uniform(2e-4, 2e-2, n)).astype(np.float16).astype(np.float32)
dmin = (rng.uniform(2e-4, 2e-2, n)).astype(np.float16).astype(np.float32)
sc = rng.integers(0, 64, n).astype(np.float32)
m = rng.integers(0, 64, n).astype(np.float32)
q = rng.integers(0, 16, n).astype(np.float32)
d1 = (d * sc).astype(np.float32); m1 = (dmin * m).astype(np.float32)
f32 = (d1 * q).astype(np.float32) - m1           # ggml's f32 value
cur = f32.astype(np.float16)                      # the kernel's operand today: rounded once
exact = d.astype(np.float64) * sc * q - dmin.astype(np.float64) * m
a = d1.astype(np.float16).astype(np.float64); b = m1.astype(np.float16).astype(np.float64)
h2 = (q * a - b).astype(np.float16)               # HFMA2: q * f16(d1) - f16(m1), one rounding
def ulps(x, y):
    xi = x.view(np.int16).astype(np.int32); yi = y.view(np.int16).astype(np.int32)
    xi = np.where(xi < 0, -32768 - xi, xi); yi = np.where(yi < 0, -32768 - yi, yi)
    return np.abs(xi - yi)
u = ulps(cur, h2)
print("h2 vs today: identical %.1f %%, max %d ulp, >1 ulp %.3f %%" % (100 * np.mean(u == 0), u.max(), 100 * np.mean(u > 1)))
scale = np.maximum(np.abs(exact), 1e-30)
for name, v in (("today", cur), ("h2", h2)):
    e = np.abs(v.astype(np.float64) - exact)
    big = np.abs(exact) > 1e-3
    print(f"{name}: median rel err {np.median(e[big] / scale[big]):.2e}, p99 {np.percentile(e[big] / scale[big], 99):.2e}, max abs err / max |w| {e.max() / np.abs(exact).max():.2e}")
