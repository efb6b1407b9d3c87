"""The attention kernel on one GPU at the block shapes each context-parallel strategy hands it:
the measurements the planner's GPU kernel model (docs/planner.md, "The kernel model") is checked
against. Measuring only (not a test; CI has no GPU). Needs PyTorch with CUDA.

Four sections, each printed as a table and written as JSON lines to --out:
- ceilings: a bf16 8192^3 matrix product (TFLOP/s) and a device-to-device copy (bytes read +
  written per second), measured in the same run as everything else;
- curve: forward and forward+backward TFLOP/s of square blocks from 512 to 32k tokens, head
  dim 64 and 128, full and causal, batch x length = 16k tokens and 2048 = heads x head dim (the
  FlashAttention papers' setup), per SDPA backend (flash = FlashAttention-2, cudnn);
- ranks: one rank's attention in each strategy at cp = 8, as the libraries the published tables
  measured run it (ring-flash-attention's zigzag and contiguous rings, their out/LSE update in
  float32 after each step; DeepSpeed-Ulysses' one call on h/cp heads; a2a+p2p's ring of cp/a
  members on h/a heads): the whole rank timed as one region, forward and forward+backward;
- decode: one query token per sequence against a cache of T tokens, GQA 32/8 heads, d 128.

usage: gpu_attention_shapes.py [--out FILE] [--quick] [--device cuda|cpu]
"""

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEV = "cuda"
DTYPE = torch.bfloat16
RESULTS = []


def timed(fn, reps=5, warmup=2):
    """Median seconds of fn() over reps runs (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if DEV == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            import time

            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(section, **row):
    row["section"] = section
    RESULTS.append(row)
    print(section, " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


def rand(*shape, grad=False):
    return torch.randn(*shape, device=DEV, dtype=DTYPE, requires_grad=grad)


def ceilings(quick):
    n = 1024 if quick else 8192
    a, b = rand(n, n), rand(n, n)
    t = timed(lambda: a @ b, reps=10, warmup=3)
    emit("ceilings", what="bf16 matmul", n=n, tflops=2 * n**3 / t / 1e12)
    x = torch.empty(2 << (20 if quick else 30), dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), reps=10, warmup=3)
    emit("ceilings", what="d2d copy", bytes=x.numel(), tbps_read_plus_write=2 * x.numel() / t / 1e12)


def attention_flops(b, h, q, k, d, causal):
    """Forward FLOPs: 4 b h q k d, halved for a square causal block (FlashAttention's count)."""
    return 4 * b * h * q * k * d / (2 if causal and q == k else 1)


def backends():
    found = [("flash", SDPBackend.FLASH_ATTENTION)]
    if DEV == "cuda":
        found.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    return found


def curve(quick):
    lengths = [128, 256] if quick else [512, 1024, 2048, 4096, 8192, 16384, 32768]
    total = 512 if quick else 16384
    for name, backend in backends():
        for d in (64, 128):
            for causal in (False, True):
                for L in lengths:
                    b, h = max(1, total // L), 2048 // d
                    q, k, v = rand(b, h, L, d, grad=True), rand(b, h, L, d, grad=True), rand(b, h, L, d, grad=True)
                    flops = attention_flops(b, h, L, L, d, causal)
                    try:
                        with sdpa_kernel(backend):
                            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                            g = torch.ones(b, h, L, d, device=DEV, dtype=DTYPE)
                            fb = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g))
                    except Exception as e:  # noqa: BLE001 (a backend that refuses a shape is a row, not the end of the run)
                        emit("curve", backend=name, d=d, causal=causal, L=L, error=str(e)[:80])
                        continue
                    emit(
                        "curve",
                        backend=name,
                        d=d,
                        causal=causal,
                        L=L,
                        batch=b,
                        heads=h,
                        fwd_tflops=flops / fwd / 1e12,
                        bwd_tflops=2.5 * flops / (fb - fwd) / 1e12,
                        fwd_s=fwd,
                        fwdbwd_s=fb,
                    )


def lse_forward(name, q, k, v, causal):
    """(out, lse) of one call, as ring-flash-attention's flash_attn_forward returns them."""
    if DEV != "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
    elif name == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    return out, lse.reshape(q.shape[0], q.shape[1], q.shape[2], 1).float()


def merge(out, lse, block_out, block_lse):
    """ring-flash-attention's _update_out_and_lse: the running output moves toward the block's by
    sigmoid(block_lse - lse); float32 element-wise passes over the query block."""
    if out is None:
        return block_out.float(), block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out.float())
    return out, lse - F.logsigmoid(lse - block_lse)


def ring_steps(s, cp, zigzag):
    """One rank's calls in a ring of cp over s tokens: (q slice, kv slice, causal) per step, for
    the last rank (every rank does equal work under zigzag; the last does the most without)."""
    n, rank = s // cp, cp - 1
    if not zigzag:
        return [((0, n), (0, n), step == 0) for step in range(rank + 1)]
    half = n // 2
    return [((0, n), (0, n), True)] + [((0, n), (0, half), False) for _ in range(1, cp)]


def ring_forward(name, q, k, v, steps):
    """Every step's (out, lse) merged into the running one, as the ring's forward does."""
    out = lse = None
    for (q0, q1), (k0, k1), causal in steps:
        bo, bl = lse_forward(name, q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], causal)
        out, lse = merge(out, lse, bo, bl)
    return out


def ring_blocks(steps, q, k, v, backward):
    """Every step's block through SDPA; with backward, its backward too, and its dq/dk/dv added
    into float32 accumulators as the ring's backward does."""
    acc = [torch.zeros(t.shape, device=DEV, dtype=torch.float32) for t in (q, k, v)] if backward else None
    for (q0, q1), (k0, k1), causal in steps:
        blocks = [t.detach().requires_grad_(backward) for t in (q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1])]
        o = F.scaled_dot_product_attention(*blocks, is_causal=causal)
        if backward:
            o.backward(torch.ones_like(o))
            for a, t, (lo, hi) in zip(acc, blocks, [(q0, q1), (k0, k1), (k0, k1)]):
                a[:, :, lo:hi] += t.grad


def time_rank(name, q, k, v, steps, train):
    """One rank's seconds: the forward with its merges; with train, plus each step's backward
    (SDPA forward+backward less its forward, measured alike) and the gradient accumulation."""
    t = timed(lambda: ring_forward(name, q, k, v, steps), reps=3, warmup=1)
    if train:
        t += timed(lambda: ring_blocks(steps, q, k, v, True), reps=3, warmup=1)
        t -= timed(lambda: ring_blocks(steps, q, k, v, False), reps=3, warmup=1)
    return t


def ranks(quick):
    cp, h, d = (4, 4, 32) if quick else (8, 32, 128)
    seqs = [256, 1024] if quick else [8192, 32768, 131072]
    for name, backend in backends():
        for s in seqs:
            for train in (False, True):
                rows = {"a2a": (h // cp, [((0, s), (0, s), True)], s)}
                rows["p2p"] = (h, ring_steps(s, cp, True), s // cp)
                rows["p2p --no-zigzag"] = (h, ring_steps(s, cp, False), s // cp)
                for a in (2, 4):
                    rows[f"a2a+p2p [{a},{cp // a}]"] = (h // a, ring_steps(s, cp // a, True), s // (cp // a))
                for strategy, (heads, steps, local) in rows.items():
                    q, k, v = rand(1, heads, local, d), rand(1, heads, local, d), rand(1, heads, local, d)
                    try:
                        with sdpa_kernel(backend):
                            t = time_rank(name, q, k, v, steps, train)
                    except Exception as e:  # noqa: BLE001 (a backend that refuses a shape is a row, not the end of the run)
                        emit("ranks", backend=name, s=s, train=train, strategy=strategy, error=str(e)[:80])
                        continue
                    flops = sum(attention_flops(1, heads, q1 - q0, k1 - k0, d, c) for (q0, q1), (k0, k1), c in steps)
                    emit(
                        "ranks",
                        backend=name,
                        s=s,
                        heads=h,
                        head_dim=d,
                        cp=cp,
                        train=train,
                        strategy=strategy,
                        calls=len(steps),
                        seconds=t,
                        tflops=flops * (3.5 if train else 1) / t / 1e12,
                    )


def decode(quick):
    h, hkv, d = (8, 2, 32) if quick else (32, 8, 128)
    for T in [512, 2048] if quick else [8192, 32768, 131072]:
        for batch in (1, 16):
            k, v = rand(batch, hkv, T, d), rand(batch, hkv, T, d)
            q = rand(batch, h, 1, d)
            cache = 2 * k.numel() * k.element_size()
            t = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), reps=10, warmup=3)
            emit("decode", way="sdpa enable_gqa", T=T, batch=batch, seconds=t, tbps=cache / t / 1e12)
            # FlashDecoding's view: the group's query heads as query rows of one K/V head.
            qg = q.reshape(batch, hkv, h // hkv, d)
            for name, backend in backends():
                try:
                    with sdpa_kernel(backend):
                        t = timed(lambda: F.scaled_dot_product_attention(qg, k, v), reps=10, warmup=3)
                except Exception as e:  # noqa: BLE001 (a backend that refuses a shape is a row, not the end of the run)
                    emit("decode", way=f"{name} grouped", T=T, batch=batch, error=str(e)[:80])
                    continue
                emit("decode", way=f"{name} grouped", T=T, batch=batch, seconds=t, tbps=cache / t / 1e12)


def main():
    global DEV
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_attention_shapes.jsonl")
    p.add_argument("--quick", action="store_true", help="tiny shapes, to check the script")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sections", default="ceilings,curve,ranks,decode")
    a = p.parse_args()
    DEV = a.device
    if DEV == "cuda":
        print(
            torch.__version__,
            torch.cuda.get_device_name(),
            f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs",
            "cudnn",
            torch.backends.cudnn.version(),
        )
    for section in a.sections.split(","):
        globals()[section](a.quick)
        with open(a.out, "w") as f:
            for row in RESULTS:
                f.write(json.dumps(row) + "\n")
    assert all(math.isfinite(r.get("seconds", 0)) for r in RESULTS)


if __name__ == "__main__":
    main()
