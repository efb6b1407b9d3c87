#!/usr/bin/env python3
"""The torch.distributed communicator (gloo) against the MPI one: the same attention, the same
ranks, one mpirun. Each repetition runs both in turn (forward + backward of
ContextParallelAttention, or with --distributed of DistributedAttention around torch's SDPA,
after a barrier), per-rank times reduced with MAX; rank 0 prints the
best of N of each and their ratio (interleaved, so load drifts hit both alike).

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=build/python \\
  mpirun -n 2 --oversubscribe --bind-to none VENV/bin/python bench/torch_comm_overhead.py --seq 4096
"""

import argparse
import socket
import time

import torch
import torch.distributed as dist
import ulysses
import ulysses.torch as ut
from mpi4py import MPI

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seq", type=int, default=4096)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--strategy", default="a2a")
p.add_argument("--reps", type=int, default=7)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--transpose", action="store_true", help="only the all-to-all there and back (no attention)")
p.add_argument("--distributed", action="store_true", help="DistributedAttention around torch's SDPA instead")
a = p.parse_args()

world = MPI.COMM_WORLD
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = world.bcast(s.getsockname()[1] if world.rank == 0 else None)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank, world_size=world.size)
comms = {
    "mpi": ulysses.Communicator(world, threads=a.threads),
    "torch": ulysses.Communicator.from_torch(None, a.threads),
}
torch.manual_seed(world.rank)
n = a.seq // world.size
q, k, v, dout = (torch.randn(1, n, a.heads, a.head_dim) for _ in range(4))
mods = {name: ut.ContextParallelAttention(c, a.strategy, causal=True) for name, c in comms.items()}
if a.distributed:
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731  [b, s, h, d]
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    mods = {name: ut.DistributedAttention(sdpa, c, 2, 1) for name, c in comms.items()}
if a.transpose:
    mods = {
        name: lambda q, k, v, c=c: ut.all_to_all(ut.all_to_all(q, 2, 1, 0, c), 1, 2, 0, c) for name, c in comms.items()
    }


def once(mod):
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    world.Barrier()
    t0 = time.perf_counter()
    mod(*x).backward(dout)
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)


times = {name: [] for name in mods}
for name, mod in mods.items():  # warm-up
    once(mod)
for _ in range(a.reps):
    for name, mod in mods.items():
        times[name].append(once(mod))
if world.rank == 0:
    best = {name: min(t) for name, t in times.items()}
    what = "all_to_all there and back, forward + backward" if a.transpose else a.strategy
    what = "DistributedAttention(SDPA)" if a.distributed else what
    print(f"{what}, {world.size} ranks, s={a.seq}, h={a.heads}, d={a.head_dim}, best of {a.reps} interleaved:")
    for name, t in best.items():
        print(f"  {name:5s} {t * 1e3:9.2f} ms   (per run: {' '.join(f'{x * 1e3:.1f}' for x in times[name])})")
    print(f"  torch / mpi = {best['torch'] / best['mpi']:.3f}")
dist.destroy_process_group()
