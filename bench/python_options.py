#!/usr/bin/env python3
"""The CpConfig options from Python, side by side in one mpirun: ContextParallelAttention
forward + backward with and without a sliding window (p2p: the halo exchange), with
overlap_chunks (a2a) and with k/v of another length (cross-attention, a2a and all_gather).
Each repetition runs every row in turn after a barrier; per-rank times are reduced with MAX
(slowest rank) and rank 0 prints the median over repetitions and the bytes each rank sent.

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=build/python \\
  mpirun -n 2 --oversubscribe --bind-to none PYTHON bench/python_options.py --seq 8192
"""

import argparse
import statistics
import time

import torch
import ulysses
import ulysses.torch as ut
from mpi4py import MPI

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seq", type=int, default=8192)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--window", type=int, default=512)
p.add_argument("--reps", type=int, default=3)
a = p.parse_args()

world = MPI.COMM_WORLD
comm = ulysses.Communicator(world)
torch.set_num_threads(1)
s, h, d = a.seq, a.heads, a.head_dim
# (label, strategy, causal, options, k/v length)
rows = [
    ("p2p causal", "p2p", True, {}, s),
    (f"p2p causal, window_size=({a.window}, 0)", "p2p", True, {"window_size": (a.window, 0)}, s),
    ("a2a causal", "a2a", True, {}, s),
    ("a2a causal, overlap_chunks=2", "a2a", True, {"overlap_chunks": 2}, s),
    ("a2a cross, s_k = 4s, q_offset = 3s", "a2a", True, {"q_offset": 3 * s}, 4 * s),
    ("all_gather cross, s_k = 4s, q_offset = 3s", "all_gather", True, {"q_offset": 3 * s}, 4 * s),
]


def inputs(strategy, causal, sk, q_offset):
    torch.manual_seed(0)
    sh = lambda x: ulysses.shard(x, comm, strategy, causal, q_offset=q_offset)
    q, g = sh(torch.randn(1, s, h, d)), sh(torch.randn(1, s, h, d))
    k, v = sh(torch.randn(1, sk, h, d)), sh(torch.randn(1, sk, h, d))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), g


prepared = []
for label, strategy, causal, opts, sk in rows:
    attn = ut.ContextParallelAttention(comm, strategy, causal, **opts)
    prepared.append((label, attn, inputs(strategy, causal, sk, opts.get("q_offset"))))

times = {label: [] for label, _, _ in prepared}
sent = {}
for rep in range(a.reps + 1):  # the first repetition warms up
    for label, attn, (q, k, v, g) in prepared:
        comm.reset_counters()
        world.Barrier()
        t0 = time.perf_counter()
        attn(q, k, v).backward(g)
        dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        sent[label] = world.allreduce(
            sum(c["bytes_sent"] for op, c in comm.counters().items() if not op.startswith(("validate", "report"))),
            op=MPI.MAX,
        )
        if rep > 0:
            times[label].append(dt)

if world.Get_rank() == 0:
    print(f"cp {world.Get_size()}, s {s}, h {h}, d {d}, f32, fwd+bwd, median of {a.reps}")
    print("| configuration | median s | MB sent per rank |\n|---|---|---|")
    for label, _, _ in prepared:
        print(f"| {label} | {statistics.median(times[label]):.3f} | {sent[label] / 1e6:.1f} |")
