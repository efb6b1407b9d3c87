#!/usr/bin/env python3
"""A DeepSpeed-Ulysses training script with one import changed, against the real DeepSpeed.

examples/deepspeed_ulysses.py is run as it is (its ``train()``: two pre-norm blocks, SDPA as the
local attention, SGD, f32, the loss summed over the group's tokens), once with
``deepspeed.sequence.layer.DistributedAttention`` and once with ``ulysses.torch.DistributedAttention``
(and under mpirun a third time with ours over ``ulysses.Communicator(MPI.COMM_WORLD)``), the same
seed, the same gloo group. ``torch.optim.SGD.step`` is wrapped to record every step's gradients
(after the example's all-reduce), so the script itself is untouched. Rank 0 prints, per step and
per run against DeepSpeed's: the relative loss difference, the largest gradient difference and
that divided by the largest gradient; then the maxima, the wall time of each run's whole loop
(after one warm-up step of each) and whether the losses agree to --tolerance (relative); with
--reps N, each run's best loop time over N rounds, alternated. Exit 1 when the losses do not
agree.

DeepSpeed is for measuring only (never in CI or scripts/setup); a CPU install without its ops:

  DS_BUILD_OPS=0 VENV/bin/pip install --target /tmp/ds --no-deps deepspeed
  VENV/bin/pip install --target /tmp/ds hjson einops msgpack   # what its sequence layer imports

  PYTHONPATH=build/python:/tmp/ds VENV/bin/torchrun --standalone --nproc-per-node 2 bench/deepspeed_compare.py
  PYTHONPATH=build/python:/tmp/ds OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
      mpirun -n 2 --oversubscribe --bind-to none VENV/bin/python bench/deepspeed_compare.py
"""

import argparse
import os
import pathlib
import runpy
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import deepspeed_anchor as dsa  # noqa: E402 - the DeepSpeed import and its CPU comm set-up (exit 3 without)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import ulysses.torch as ut  # noqa: E402

EXAMPLE = HERE.parent / "examples" / "deepspeed_ulysses.py"


def recorded_run(train, attention_class, group, steps, seq):
    """The example's train() with this attention class: its losses, every step's all-reduced
    gradients (one flat tensor a step) and the loop's seconds (slowest rank)."""
    grads, step = [], torch.optim.SGD.step

    def recording_step(self, *args, **kwargs):
        grads.append(torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]]).clone())
        return step(self, *args, **kwargs)

    torch.optim.SGD.step = recording_step
    try:
        dist.barrier()
        t0 = time.perf_counter()
        losses = train(attention_class, group, steps=steps, seq=seq)
        seconds = torch.tensor([time.perf_counter() - t0])
    finally:
        torch.optim.SGD.step = step
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return losses, grads, float(seconds)


def timed_loops(train, classes, group, a):
    """Each class's best loop seconds over a.reps rounds, the classes alternated in each round."""
    best = {name: float("inf") for name in classes}
    for _ in range(a.reps):
        for name, attention_class in classes.items():
            best[name] = min(best[name], recorded_run(train, attention_class, group, a.steps, a.seq)[2])
    return best


def compare(name, run, ref):
    """Rows per step of ``run`` against ``ref`` (DeepSpeed's): loss relative difference, largest
    gradient difference, and that over the largest gradient."""
    rows = []
    for i, (la, lb, ga, gb) in enumerate(zip(run[0], ref[0], run[1], ref[1])):
        diff = float((ga - gb).abs().max())
        rows.append((name, i, la, lb, abs(la - lb) / abs(lb), diff, diff / float(gb.abs().max())))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq", type=int, default=64, help="global sequence length (a multiple of the ranks)")
    p.add_argument("--tolerance", type=float, default=1e-6, help="largest relative loss difference allowed")
    p.add_argument("--reps", type=int, default=0, help="then time each run's loop this many times, alternated (best)")
    a = p.parse_args()
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "mpirun"
    example = runpy.run_path(str(EXAMPLE))
    deepspeed, ds_comm, DsAttention = dsa._import_deepspeed()
    example["init_distributed"]()  # the example's: torchrun's environment, or mpirun's mapped onto it
    dsa.init_deepspeed_comm(ds_comm, build_shm_op=False)
    group, train = dist.group.WORLD, example["train"]
    for attention_class in (DsAttention, ut.DistributedAttention):  # warm-up: the loop times compare
        train(attention_class, group, steps=1, seq=a.seq)
    ref = recorded_run(train, DsAttention, group, a.steps, a.seq)
    classes = {"ulysses.torch": ut.DistributedAttention}
    if launcher == "mpirun":
        import ulysses
        from mpi4py import MPI

        mpi = ulysses.Communicator(MPI.COMM_WORLD)
        classes["ulysses.torch over MPI"] = lambda attn, _group, **kw: ut.DistributedAttention(attn, mpi, **kw)
    runs = {name: recorded_run(train, c, group, a.steps, a.seq) for name, c in classes.items()}
    rows = [row for name, run in runs.items() for row in compare(name, run, ref)]
    if dist.get_rank() == 0:
        report(rows, runs, ref, a, launcher, deepspeed.__version__)
    if a.reps:
        best = timed_loops(train, {"DeepSpeed": DsAttention, **classes}, group, a)
        for name, seconds in best.items() if dist.get_rank() == 0 else ():
            print(f"best of {a.reps} alternated loops, {name}: {seconds:.3f} s")
    worst = max(r[4] for r in rows)
    dist.destroy_process_group()
    sys.exit(0 if worst <= a.tolerance else 1)


def report(rows, runs, ref, a, launcher, ds_version):
    print(
        f"{launcher}, {dist.get_world_size()} ranks, gloo; torch {torch.__version__}, deepspeed {ds_version}; "
        f"examples/deepspeed_ulysses.py train(steps={a.steps}, seq={a.seq}), f32"
    )
    print(
        f"{'run':<24} {'step':>4} {'loss':>12} {'DeepSpeed loss':>14} {'rel diff':>9} {'max |dg|':>9} {'/max |g|':>9}"
    )
    for name, i, la, lb, rel, diff, scaled in rows:
        print(f"{name:<24} {i:>4} {la:>12.8f} {lb:>14.8f} {rel:>9.2e} {diff:>9.2e} {scaled:>9.2e}")
    print(f"DeepSpeed DistributedAttention: {ref[2]:.3f} s for the loop")
    for name, run in runs.items():
        mine = [r for r in rows if r[0] == name]
        print(
            f"{name}: {run[2]:.3f} s for the loop; max loss rel diff {max(r[4] for r in mine):.2e}, "
            f"max gradient diff {max(r[5] for r in mine):.2e} ({max(r[6] for r in mine):.2e} of the largest)"
        )
    worst = max(r[4] for r in rows)
    print(f"losses within {a.tolerance:g} relative: {'yes' if worst <= a.tolerance else 'NO'}")


if __name__ == "__main__":
    main()
