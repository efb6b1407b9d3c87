#!/usr/bin/env python3
"""SequenceParallel.generate's sharded prefill against the whole prompt on every rank.

A random Llama (no download) in float32; a prompt of --seq tokens; both ways generate
--new tokens greedily in the same mpirun, alternated, after a barrier, each rank's seconds
reduced with MAX (the slowest rank), best of --reps:
  sharded: ``sp.generate`` (the prompt but its last token through the ulysses attention on
           s/cp tokens a rank, the keys and values gathered into one cache, decode from it);
  whole:   ``model.generate`` with transformers' sdpa on every rank (what generate ran before).
Rank 0 prints both, their ratio and whether the tokens are equal.

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=build/python \\
  mpirun -n 2 --oversubscribe --bind-to none VENV/bin/python bench/hf_prefill.py --seq 2048
"""

import argparse
import copy
import time

import torch
import ulysses
import ulysses.hf
from mpi4py import MPI
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
# Every option is a whole number: (flag, default, help).
for flag, default, what in (
    ("--seq", 2048, "prompt tokens"),
    ("--new", 1, "tokens generated"),
    ("--hidden", 256, "the model's hidden size"),
    ("--heads", 8, "attention heads (as many KV heads)"),
    ("--layers", 4, "decoder layers"),
    ("--reps", 5, "timed repetitions of each way (best of)"),
    ("--threads", 1, "torch threads per rank"),
):
    p.add_argument(flag, type=int, default=default, help=what)
a = p.parse_args()

world = MPI.COMM_WORLD
torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=1000,
    hidden_size=a.hidden,
    intermediate_size=4 * a.hidden,
    num_hidden_layers=a.layers,
    num_attention_heads=a.heads,
    num_key_value_heads=a.heads,
    max_position_embeddings=a.seq + a.new,
    attn_implementation="sdpa",
)
whole_model = LlamaForCausalLM(config).eval()
sp = ulysses.hf.SequenceParallel(ulysses.Communicator(world, threads=a.threads))
sharded_model = sp.attach(copy.deepcopy(whole_model))
prompt = torch.randint(0, config.vocab_size, (1, a.seq), generator=torch.Generator().manual_seed(1))
args = dict(max_new_tokens=a.new, do_sample=False, pad_token_id=0)
ways = {
    "sharded": lambda: sp.generate(sharded_model, prompt, **args),
    "whole": lambda: whole_model.generate(prompt, **args),
}


def timed(fn):
    world.Barrier()
    t0 = time.perf_counter()
    out = fn()
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX), out


tokens = {name: timed(fn)[1] for name, fn in ways.items()}  # warm-up
best = {name: float("inf") for name in ways}
for _ in range(a.reps):
    for name, fn in ways.items():
        best[name] = min(best[name], timed(fn)[0])
if world.rank == 0:
    print(
        f"{world.size} ranks x {a.threads} thread, Llama h={a.hidden} heads={a.heads} layers={a.layers}, "
        f"prompt {a.seq}, {a.new} new token(s), f32, best of {a.reps}"
    )
    for name, s in best.items():
        print(f"{name:>8}: {s:.3f} s")
    print(f"sharded / whole: {best['sharded'] / best['whole']:.2f}")
    print(f"tokens equal: {torch.equal(tokens['sharded'], tokens['whole'])}")
