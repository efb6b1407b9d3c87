#!/usr/bin/env python3
"""External anchor: the real DeepSpeed-Ulysses (deepspeed.sequence.layer.DistributedAttention)
with PyTorch SDPA as its local attention, over gloo on the CPU.

Each rank holds a sequence shard [b, s/cp, h, d] of q, k, v (DeepSpeed's batch-first layout:
scatter_idx=2 (heads), gather_idx=1 (sequence), batch_dim_idx=0). DistributedAttention
all-to-alls q, k, v to [b, s, h/cp, d], runs torch.nn.functional.scaled_dot_product_attention
on the full sequence for its heads, and all-to-alls the output back to [b, s/cp, h, d].
Backward runs the transposed all-to-alls. q, k, v and the output gradient are random.

For each dtype: one untimed warm-up, then --reps timed repetitions of the forward and,
separately, of the backward (out.backward(grad)); each repetition starts after a barrier, the
per-rank times are all-reduced with MAX (slowest rank) and the median over repetitions is
reported. FLOPs follow FlashAttention's count with the global s and h: forward 4*b*s*s*h*d
(halved when causal), backward 2.5x forward.

Before timing, a correctness check at a small shape (--check-seq, default 256): the output and
the q/k/v gradients of DistributedAttention, gathered across ranks, against single-process SDPA
on the full sequence in the same dtype (max abs diff, under "check").

Rank 0 prints ONE JSON object on stdout; logs go to stderr.

Launch (2 ranks x 1 thread):
  torchrun --nproc-per-node 2 bench/deepspeed_anchor.py --seq 8192 --heads 8 --head-dim 64 \
      --causal --dtype f32,bf16 --threads 1 --reps 3
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -n 2 --oversubscribe --bind-to none python bench/deepspeed_anchor.py --seq 8192 ...
Under mpirun, RANK/WORLD_SIZE/LOCAL_RANK come from OMPI_COMM_WORLD_*, MASTER_ADDR defaults to
127.0.0.1 and MASTER_PORT to --port (default 29531).

Needs torch >= 2.0, numpy and deepspeed (pip install deepspeed); exits with code 3 otherwise.
"""

import argparse
import contextlib
import importlib
import json
import logging
import os
import platform
import sys
import time

# DeepSpeed picks its accelerator at import time; force the CPU one (no CUDA here, and a CUDA
# build of torch would otherwise make it try).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")


def _mpi_env(default_port):
    """Map OpenMPI's environment onto torch.distributed's env:// variables."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "env"
    r = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK"))
    n = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE"))
    if r is None or n is None:
        # Single process: world of one.
        r, n = "0", "1"
        launcher = "single"
    else:
        launcher = "mpirun"
    lr = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", r))
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = r, n, lr
    os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", n))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(default_port))
    return launcher


def _die(msg):
    print(f"deepspeed_anchor: {msg}", file=sys.stderr)
    sys.exit(3)


import anchor_common as common  # noqa: E402 - exits 3 without numpy or torch >= 2.0 with SDPA
import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _import_deepspeed():
    # DeepSpeed logs (accelerator detection, comm init) on stdout; keep stdout for the JSON.
    # Loggers created while stdout is redirected keep writing to stderr afterwards.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            import deepspeed
            import deepspeed.comm as ds_comm
            from deepspeed.sequence.layer import DistributedAttention
        except Exception as e:  # noqa: BLE001 - ImportError, or a failed op/accelerator probe
            _die(
                f"needs deepspeed with deepspeed.sequence.layer.DistributedAttention "
                f"(pip install deepspeed): {type(e).__name__}: {e}"
            )
    try:
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
    except ImportError:
        pass
    return deepspeed, ds_comm, DistributedAttention


def init_deepspeed_comm(ds_comm, build_shm_op):
    """deepspeed.comm over the torch.distributed gloo group already up; returns whether its
    shared-memory op was "built" or "skipped".

    DistributedAttention's all-to-alls go through deepspeed.comm; with torch.distributed
    already up this only wraps it (TorchBackend over the same gloo group). Its TorchBackend
    would also JIT-compile a shared-memory op (minutes, needs a C++ compiler) that only
    inference_all_reduce uses; all_to_all_single is plain torch.distributed, so skip the build
    unless asked.
    """
    shm_op = "built"
    if not build_shm_op:
        try:
            # Not "import deepspeed.comm.torch as ...": the package re-exports the real torch
            # under that attribute name.
            ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
            ds_comm_torch = sys.modules.get("deepspeed.comm.torch", ds_comm_torch)
            if hasattr(ds_comm_torch, "build_shm_op"):
                ds_comm_torch.build_shm_op = lambda: None
                shm_op = "skipped"
        except ImportError:
            pass
    with contextlib.redirect_stdout(sys.stderr):
        ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    return shm_op


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="DeepSpeed-Ulysses DistributedAttention + SDPA anchor over gloo (JSON on stdout)"
    )
    common.add_attention_args(p, 8192, ["f32", "bf16"])
    p.add_argument("--causal", action="store_true", help="causal mask (default: full)")
    p.add_argument(
        "--check-seq", type=int, default=256, help="global s of the correctness check (0 disables; default 256)"
    )
    p.add_argument(
        "--build-shm-op",
        action="store_true",
        help="let deepspeed.comm JIT-build its shared-memory op (only used by "
        "inference_all_reduce, never by the all-to-alls; default: skip it)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=29531,
        help="MASTER_PORT when launched by mpirun and MASTER_PORT is unset (default 29531)",
    )
    a = common.parse_attention_args(p, argv, "deepspeed_anchor")
    common.require_positive(p, a, ("seq", "heads", "head_dim", "batch", "threads", "reps"))
    if a.check_seq < 0:
        p.error("--check-seq must be >= 0")
    return a


class LocalSDPA(torch.nn.Module):
    """DistributedAttention's local attention: [b, s, h_local, d] in and out, SDPA inside."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=self.causal
        )
        return o.transpose(1, 2)


def detect_backend(shape, dtype, causal):
    """SDPA backend torch's dispatcher picks for the local [b, h/cp, s, d] problem (private API)."""
    x = torch.zeros(shape, dtype=dtype).transpose(1, 2)
    return common.sdpa_backend(x, x, x, causal)


def gather_seq(x, world):
    """All-gather [b, s/cp, h, d] shards along the sequence (as float32: gloo + any dtype)."""
    x = x.detach().float().contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    tdist.all_gather(parts, x)
    return torch.cat(parts, dim=1)


def check_case(a, dattn, dtype_name, rank, world):
    """DistributedAttention (fwd + bwd) vs single-process SDPA on the full sequence."""
    dtype = common.DTYPES[dtype_name]
    b, h, d, s = a.batch, a.heads, a.head_dim, a.check_seq
    sl = s // world
    g = torch.Generator().manual_seed(a.seed + 12345)  # same full tensors on every rank
    full = [torch.randn(b, s, h, d, generator=g).to(dtype) for _ in range(4)]
    qf, kf, vf, gf = full
    lo, hi = rank * sl, (rank + 1) * sl
    q, k, v = (t[:, lo:hi].clone().requires_grad_(True) for t in (qf, kf, vf))
    out = dattn(q, k, v, 0)
    out.backward(gf[:, lo:hi].contiguous())

    out_all = gather_seq(out, world)
    dq_all, dk_all, dv_all = (gather_seq(t.grad, world) for t in (q, k, v))

    qr, kr, vr = (t.clone().requires_grad_(True) for t in (qf, kf, vf))
    ref = LocalSDPA(a.causal)(qr, kr, vr)
    ref.backward(gf)

    def diff(x, y):
        return float((x - y.detach().float()).abs().max())

    return {
        "dtype": dtype_name,
        "seq": s,
        "out_shard_shape": list(out.shape),
        "max_abs_diff_out": diff(out_all, ref),
        "max_abs_diff_dq": diff(dq_all, qr.grad),
        "max_abs_diff_dk": diff(dk_all, kr.grad),
        "max_abs_diff_dv": diff(dv_all, vr.grad),
        "max_abs_ref_out": float(ref.detach().float().abs().max()),
    }


def bench_case(a, dattn, dtype_name, rank, world):
    dtype = common.DTYPES[dtype_name]
    b, h, d, s = a.batch, a.heads, a.head_dim, a.seq
    sl = s // world
    g = torch.Generator().manual_seed(a.seed * 1000 + rank)
    q, k, v, grad = common.random_qkv(g, dtype, (b, sl, h, d), (b, sl, h, d))

    def clear():
        q.grad = k.grad = v.grad = None

    # Warm-up (untimed).
    out = dattn(q, k, v, 0)
    out.backward(grad)
    del out
    clear()

    fwd, bwd = [], []
    for _ in range(a.reps):
        clear()
        tdist.barrier()
        t0 = time.perf_counter()
        out = dattn(q, k, v, 0)
        t1 = time.perf_counter()
        fwd.append(t1 - t0)
        tdist.barrier()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        bwd.append(t2 - t1)
        del out
    clear()

    # Slowest rank per repetition, then median over repetitions.
    local = torch.tensor(fwd + bwd, dtype=torch.float64)
    slowest = local.clone()
    tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
    fwd_max = slowest[: a.reps].tolist()
    bwd_max = slowest[a.reps :].tolist()
    return {
        "dtype": dtype_name,
        **common.timing_fields(fwd_max, bwd_max, b, s, h, d, a.causal),
        "local_sdp_backend": detect_backend((b, s, h // world, d), dtype, a.causal),
    }


def main():
    a = parse_args()
    launcher = _mpi_env(a.port)
    deepspeed, ds_comm, DistributedAttention = _import_deepspeed()
    torch.set_num_threads(a.threads)

    tdist.init_process_group("gloo")
    rank, world = tdist.get_rank(), tdist.get_world_size()
    shm_op = init_deepspeed_comm(ds_comm, a.build_shm_op)

    def fail(msg):
        if rank == 0:
            print(f"deepspeed_anchor: {msg}", file=sys.stderr)
        tdist.destroy_process_group()
        sys.exit(2)

    if a.heads % world:
        fail(f"--heads {a.heads} must be divisible by the world size {world}")
    if a.seq % world:
        fail(f"--seq {a.seq} must be divisible by the world size {world}")
    if a.check_seq and a.check_seq % world:
        fail(f"--check-seq {a.check_seq} must be divisible by the world size {world}")

    group = tdist.new_group(list(range(world)))
    dattn = DistributedAttention(LocalSDPA(a.causal), group, scatter_idx=2, gather_idx=1)

    result = {
        "tool": "deepspeed_anchor",
        "deepspeed_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "ds_accelerator": type(deepspeed.get_accelerator()).__name__,
        "backend": tdist.get_backend(),
        "ds_comm_backend": type(sys.modules["deepspeed.comm.comm"].cdb).__name__,
        "ds_shm_comm_op": shm_op,
        "launcher": launcher,
        "world_size": world,
        "threads": torch.get_num_threads(),
        "cpu_capability": common.cpu_capability(),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "shape": {
            "batch": a.batch,
            "seq": a.seq,
            "heads": a.heads,
            "head_dim": a.head_dim,
            "layout": "bshd, per rank [b, s/cp, h, d]",
            "scatter_idx": 2,
            "gather_idx": 1,
            "batch_dim_idx": 0,
        },
        "causal": a.causal,
        "reps": a.reps,
        "timing": "1 warm-up; per rep barrier then fwd, barrier then bwd; max over ranks; median over reps",
        "flops": "global: fwd 4*b*s*s*h*d (x0.5 causal), bwd 2.5x fwd",
        "check": [],
        "cases": [],
    }
    with torch.inference_mode(False):
        if a.check_seq:
            for dt in a.dtypes:
                result["check"].append(check_case(a, dattn, dt, rank, world))
        for dt in a.dtypes:
            result["cases"].append(bench_case(a, dattn, dt, rank, world))

    tdist.barrier()
    if rank == 0:
        print(json.dumps(result), flush=True)
    tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
