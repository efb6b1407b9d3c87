# sgemm GFLOP/s of the carried OpenBLAS under OPENBLAS_CORETYPE as set by the caller.
import ctypes
import os
import time

import numpy as np

lib = ctypes.CDLL("/opt/ub/lib/libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
core = lib.openblas_get_corename().decode()
res = {"env": os.environ.get("OPENBLAS_CORETYPE", "-"), "core": core}
for threads, n in ((1, 1024), (16, 2048)):
    lib.openblas_set_num_threads(threads)
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    c = np.zeros((n, n), np.float32)
    P = lambda x: x.ctypes.data_as(ctypes.c_void_p)
    call = lambda: lib.cblas_sgemm(
        101, 111, 111, n, n, n, ctypes.c_float(1.0), P(a), n, P(b), n, ctypes.c_float(0.0), P(c), n
    )
    call()
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    res[f"gflops_{threads}t"] = round(2 * n**3 / sorted(ts)[1] * 1e-9, 1)
    assert np.allclose(c, a @ b, rtol=1e-3, atol=1e-2), "wrong product"
print(res, flush=True)
