#!/usr/bin/env python3
"""ulysses from Python, side by side in one mpirun: ContextParallelAttention (a2a, our kernels),
ulysses.torch.DistributedAttention around SDPA (torch >= 2), and DeepSpeed's
DistributedAttention around the same SDPA (with --deepspeed; over gloo). Each repetition runs
every candidate in turn (forward, then backward), after a barrier; per-rank times are reduced
with MAX (slowest rank) and the median over repetitions is printed by rank 0.

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=build/python \\
  mpirun -n 2 --oversubscribe --bind-to none PYTHON bench/python_anchor.py --seq 16384 --causal [--deepspeed]

The C++ number to hold the first row against (the binding's overhead) is
`mpirun -n 2 build/ulysses attention --seq S --heads H --head-dim D --causal --backward --repeat R --threads 1`.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import ulysses
import ulysses.torch as ut
from mpi4py import MPI
from ulysses._tensors import spec

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seq", type=int, default=16384)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
p.add_argument("--causal", action="store_true")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--deepspeed", action="store_true", help="also DeepSpeed's DistributedAttention (gloo)")
p.add_argument("--only-cp", action="store_true", help="only ContextParallelAttention (bench/python_overhead.sh)")
a = p.parse_args()

world = MPI.COMM_WORLD
comm = ulysses.Communicator(world, threads=a.threads)
torch.set_num_threads(a.threads)
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
s, h, d, cp = a.seq, a.heads, a.head_dim, comm.size


def sdpa(q, k, v):  # DistributedAttention's local attention: [b, s, h/p, d]
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=a.causal
    ).transpose(1, 2)


candidates = {"ulysses ContextParallelAttention a2a": ut.ContextParallelAttention(comm, "a2a", a.causal)}
if hasattr(F, "scaled_dot_product_attention") and not a.only_cp:
    candidates["ulysses DistributedAttention + SDPA"] = ut.DistributedAttention(sdpa, comm, 2, 1)
if a.deepspeed:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import deepspeed_anchor as dsa  # the environment mapping and DeepSpeed import of the e2e anchor

    dsa._mpi_env(29533)
    _, ds_comm, DsAttention = dsa._import_deepspeed()
    torch.distributed.init_process_group("gloo")
    ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    group = torch.distributed.new_group(list(range(cp)))
    candidates["DeepSpeed DistributedAttention + SDPA"] = DsAttention(sdpa, group, scatter_idx=2, gather_idx=1)

torch.manual_seed(world.Get_rank())
q, k, v, g = (torch.randn(1, s // cp, h, d).to(dtype) for _ in range(4))


def timed(fn):
    world.Barrier()
    t0 = time.perf_counter()
    fn()
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)


class Direct:
    """The library call itself, on preallocated tensors, no autograd: what C++ pays."""

    def __init__(self, impl):
        self.impl, self.out = impl, torch.empty(q.shape, dtype=dtype)
        self.grads = [torch.empty(q.shape, dtype=dtype) for _ in range(3)]

    def run(self, x):
        ctx = self.impl.forward(spec(self.out), *(spec(t) for t in x))
        return lambda: self.impl.backward(ctx, *(spec(t) for t in self.grads), spec(g))


def autograd_step(layer, name):
    extra = (0,) if "DistributedAttention" in name else ()  # batch_dim_idx: [b, s, h, d]

    def run(x):
        x = [t.clone().requires_grad_() for t in x]
        out = layer(*x, *extra)
        return lambda: out.backward(g)

    return run


steps = {name: autograd_step(layer, name) for name, layer in candidates.items()}
if not a.deepspeed:  # (the DeepSpeed comparison is long enough)
    steps["ulysses library call, no autograd"] = Direct(candidates["ulysses ContextParallelAttention a2a"]._impl).run
times = {name: ([], []) for name in steps}
for rep in range(a.reps + 1):  # the first round warms up
    for name, step in steps.items():
        backward = []
        tf = timed(lambda: backward.append(step((q, k, v))))
        tb = timed(backward[0])
        if rep:
            times[name][0].append(tf)
            times[name][1].append(tb)

if world.Get_rank() == 0:
    print(
        f"python_anchor: s = {s}, h = {h}, d = {d}, {a.dtype}{', causal' if a.causal else ''}, "
        f"{cp} ranks x {a.threads} thread(s), torch {torch.__version__}, median of {a.reps}"
    )
    base = None
    for name, (f, b) in times.items():
        total = statistics.median(f) + statistics.median(b)
        base = base or total
        print(
            f"  {name:40s} fwd {statistics.median(f) * 1e3:9.1f} ms  bwd {statistics.median(b) * 1e3:9.1f} ms"
            f"  total {total * 1e3:9.1f} ms  ({total / base:.2f}x the first)"
        )
