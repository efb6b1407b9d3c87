#!/usr/bin/env python3
"""External anchor: PyTorch's CPU scaled_dot_product_attention, forward and backward.

Measures torch.nn.functional.scaled_dot_product_attention on the CPU for the given shapes and
prints ONE JSON object on stdout (progress, if any, goes to stderr). Layout [b, h, s, d].
For each (dtype, mask): one untimed warm-up, then the median over --reps of the forward time
and, separately, of the backward time (out.backward(grad)). FLOPs follow FlashAttention's
count: forward 4*b*s*s*h*d (halved when causal), backward 2.5x forward.

Usage:
  python bench/sdpa_anchor.py --seq 4096 --heads 8 --head-dim 64 --dtype f32,bf16 \
      --masks full,causal --threads 1 --reps 3
  python bench/sdpa_anchor.py --seq 4096 --heads 16 --kv-heads 2 --causal --dtype bf16
  python bench/sdpa_anchor.py --gemm-only --threads 1        # GEMM ceiling only (torch.mm)

Requires torch >= 2.0 and numpy; exits with code 3 and a one-line message otherwise.
"""

import argparse
import json
import platform
import sys
import time

try:
    import torch
except ImportError as e:
    print(f"sdpa_anchor: needs torch >= 2.0 ({e})", file=sys.stderr)
    sys.exit(3)


def _torch_major():
    try:
        return int(str(getattr(torch, "__version__", "0")).split("+")[0].split(".")[0])
    except ValueError:
        return 0


if _torch_major() < 2:
    print(f"sdpa_anchor: needs torch >= 2.0, found {getattr(torch, '__version__', '?')}", file=sys.stderr)
    sys.exit(3)

import anchor_common as common  # noqa: E402 - after the version check; exits 3 without numpy or SDPA
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MASKS = ("full", "causal")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch CPU SDPA forward/backward anchor (JSON on stdout)")
    common.add_attention_args(p, 4096, ["f32"])
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA when < heads; default = heads)")
    p.add_argument(
        "--masks",
        action="append",
        default=None,
        help="comma list of full,causal (default: both, unless --full/--causal given)",
    )
    p.add_argument("--causal", dest="mask_flags", action="append_const", const="causal", help="add the causal mask")
    p.add_argument("--full", dest="mask_flags", action="append_const", const="full", help="add the full (no) mask")
    p.add_argument(
        "--gemm", action="store_true", help="also measure a GEMM ceiling (torch.mm, median of --gemm-reps) at --threads"
    )
    p.add_argument("--gemm-only", action="store_true", help="only the GEMM ceiling, no attention")
    p.add_argument("--gemm-reps", type=int, default=5, help="f32 GEMM reps (default 5)")
    p.add_argument(
        "--gemm-bf16-reps",
        type=int,
        default=1,
        help="bf16 2048^3 GEMM reps (default 1: minutes each on AVX2; 0 skips it)",
    )
    a = common.parse_attention_args(p, argv, "sdpa_anchor")
    masks = common.split_list(a.masks, MASKS, "mask", "sdpa_anchor") + common.split_list(
        a.mask_flags, MASKS, "mask", "sdpa_anchor"
    )
    a.mask_list = [m for m in MASKS if m in masks] or ["full", "causal"]
    if a.kv_heads is None:
        a.kv_heads = a.heads
    common.require_positive(p, a, ("seq", "heads", "kv_heads", "head_dim", "batch", "threads", "reps", "gemm_reps"))
    if a.heads % a.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    return a


def sdpa_supports_gqa():
    q = torch.zeros(1, 2, 2, 4)
    k = torch.zeros(1, 1, 2, 4)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def detect_backend(q, k, v, causal, gqa_kw):
    """Backend torch's dispatcher picks for these inputs (private API; None if unavailable)."""
    return common.sdpa_backend(q, k, v, causal, **gqa_kw)


def profiled_ops(fn):
    """Names of the aten attention kernels (or math fallback ops) run by fn, forward and
    backward, seen by a dispatch mode (no profiler: kineto logs to stderr). None if unavailable."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None
    keep = ("attention", "softmax", "bmm", "baddbmm")

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = getattr(getattr(func, "overloadpacket", None), "__name__", str(func))
            if any(w in name for w in keep):
                self.ops.add("aten::" + name)
            return func(*args, **(kwargs or {}))

    rec = Recorder()
    try:
        with rec:
            fn()
    except Exception:  # noqa: BLE001 - private API
        return None
    return sorted(rec.ops)


def bench_case(a, dtype_name, causal, gqa_native):
    dtype = common.DTYPES[dtype_name]
    b, h, hk, s, d = a.batch, a.heads, a.kv_heads, a.seq, a.head_dim
    g = torch.Generator().manual_seed(a.seed)
    q, k, v, grad = common.random_qkv(g, dtype, (b, h, s, d), (b, hk, s, d))

    gqa = hk < h
    gqa_kw = {"enable_gqa": True} if (gqa and gqa_native) else {}

    def forward():
        kk, vv = k, v
        if gqa and not gqa_native:  # repeat inside the timed region: part of the cost
            kk = k.repeat_interleave(h // hk, dim=1)
            vv = v.repeat_interleave(h // hk, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **gqa_kw)

    def clear():
        q.grad = k.grad = v.grad = None

    # Warm-up (untimed), under a dispatch recorder to see which kernels actually ran.
    def warm():
        out = forward()
        out.backward(grad)

    ops = profiled_ops(warm)
    clear()
    if ops is None:  # recorder unavailable: plain warm-up
        warm()
        clear()
    kd, vd = k.detach(), v.detach()
    if gqa and not gqa_native:
        kd, vd = kd.repeat_interleave(h // hk, dim=1), vd.repeat_interleave(h // hk, dim=1)
    backend = detect_backend(q.detach(), kd, vd, causal, gqa_kw)

    fwd, bwd = [], []
    for _ in range(a.reps):
        clear()
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        del out
    clear()
    return {
        "dtype": dtype_name,
        "causal": causal,
        **common.timing_fields(fwd, bwd, b, s, h, d, causal),
        "sdp_backend": backend,
        "aten_ops": ops,
    }


def bench_gemm(reps, bf16_reps):
    """torch.mm GFLOP/s, median of reps after one warm-up. bf16 2048^3 takes minutes per call
    on AVX2-only CPUs (no native bf16 GEMM), so it has its own rep count and a small warm-up."""
    shapes = [
        ("f32", 4096, 64, 4096, reps),
        ("f32", 4096, 4096, 64, reps),
        ("f32", 2048, 2048, 2048, reps),
        ("bf16", 2048, 2048, 2048, bf16_reps),
    ]
    res = []
    g = torch.Generator().manual_seed(1)
    for dt, m, kdim, n, nrep in shapes:
        if nrep < 1:
            continue
        A = torch.randn(m, kdim, generator=g).to(common.DTYPES[dt])
        B = torch.randn(kdim, n, generator=g).to(common.DTYPES[dt])
        if dt == "f32":
            torch.mm(A, B)
        else:
            torch.mm(A[:64, :64], B[:64, :64])
        ts = []
        for _ in range(nrep):
            t0 = time.perf_counter()
            torch.mm(A, B)
            ts.append(time.perf_counter() - t0)
        t = float(np.median(ts))
        res.append(
            {
                "dtype": dt,
                "m": m,
                "k": kdim,
                "n": n,
                "s": round(t, 6),
                "gflops": round(2.0 * m * kdim * n / t / 1e9, 3),
                "s_all": [round(x, 6) for x in ts],
            }
        )
    return res


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    gqa = a.kv_heads < a.heads
    gqa_native = sdpa_supports_gqa()
    result = {
        "tool": "sdpa_anchor",
        "torch_version": torch.__version__,
        "cpu_capability": common.cpu_capability(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    if not a.gemm_only:
        result.update(
            {
                "shape": {
                    "batch": a.batch,
                    "heads": a.heads,
                    "kv_heads": a.kv_heads,
                    "seq": a.seq,
                    "head_dim": a.head_dim,
                    "layout": "bhsd",
                },
                "gqa": (("enable_gqa" if gqa_native else "repeat_interleave") if gqa else "none"),
                "reps": a.reps,
                "flops": "fwd 4*b*s*s*h*d (x0.5 causal), bwd 2.5x fwd",
                "cases": [],
            }
        )
        with torch.inference_mode(False):
            for dt in a.dtypes:
                for m in a.mask_list:
                    result["cases"].append(bench_case(a, dt, m == "causal", gqa_native))
    if a.gemm or a.gemm_only:
        result["gemm"] = bench_gemm(a.gemm_reps, a.gemm_bf16_reps)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
