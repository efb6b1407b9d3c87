"""ulysses.balance: which ranks compute which sequence of a variable-length step (balancer.hpp)."""

import math
from dataclasses import dataclass
from typing import List, Tuple

from . import _ulysses
from ._agree import INT64_MAX, integer, real


@dataclass(frozen=True)
class BalancePlan:
    """groups[i] = (first_rank, size): the contiguous CP group of sequence i. Every rank runs its
    sequences (sequences_of_rank[r]) in increasing index; predicted times in seconds."""

    policy: str
    groups: List[Tuple[int, int]]
    sequences_of_rank: List[List[int]]
    step_seconds: float
    rank_seconds: List[float]
    rank_busy_seconds: List[float]
    rank_bytes: List[float]
    sequence_seconds: List[float]


def _world_of(world_or_comm):
    """A number of ranks, or a ulysses / mpi4py communicator's size."""
    if isinstance(world_or_comm, int) and not isinstance(world_or_comm, bool):
        return world_or_comm
    if hasattr(world_or_comm, "Get_size"):
        return world_or_comm.Get_size()
    if hasattr(world_or_comm, "size") and hasattr(world_or_comm, "rank"):
        return world_or_comm.size
    raise _ulysses.Error(f"balance: world_or_comm must be a number of ranks or a communicator, got {world_or_comm!r}")


def balance(
    lengths,
    world_or_comm,
    policy="dynamic",
    *,
    heads,
    head_dim,
    kv_heads=None,
    layers=1,
    dp=1,
    cp_comm_type="a2a",
    gemm_flops_per_token=0.0,
    max_tokens_per_rank=0,
    ranks_per_node=8,
    tflops=989.0,
    efficiency=0.5,
    dtype="bf16",
):
    """Not collective: a pure function of its arguments, so every rank computes the same plan.

    ``world_or_comm``: the number of ranks, or a ``ulysses.Communicator`` / mpi4py communicator
    (its size). ``policy``: "static" (groups of world / dp ranks, round-robin), "pow2" (Megatron's
    hybrid CP) or "dynamic" (the least predicted step time). The cost model is the planner's for
    the attention (``heads``, ``head_dim``, ``layers``, ``cp_comm_type``, the cluster's compute
    rate ``tflops`` x ``efficiency``) plus ``gemm_flops_per_token`` (forward + backward, all
    layers) run sequence-sharded. Bad input raises ``ulysses.Error``."""
    world = _world_of(world_or_comm)
    i32 = 2**31 - 1
    try:
        lengths = list(lengths)
    except TypeError:
        raise _ulysses.Error(f"balance: lengths must be a sequence of integers, got {lengths!r}") from None
    for name, value in (("policy", policy), ("cp_comm_type", cp_comm_type), ("dtype", dtype)):
        if not isinstance(value, str):
            raise _ulysses.Error(f"balance: {name} must be a string, got {value!r}")
    # Types and integer ranges here (no AttributeError, no silent int(2.5) or NaN); every value's
    # meaning is the library's check, with its message.
    i64, inf = (-INT64_MAX, INT64_MAX), math.inf
    d = _ulysses.balance(
        [integer("balance: a length", n, *i64) for n in lengths],
        integer("balance: world", world, -i32, i32),
        integer("balance: dp", dp, -i32, i32),
        policy,
        integer("balance: heads", heads, *i64),
        integer("balance: kv_heads", kv_heads if kv_heads is not None else heads, *i64),
        integer("balance: head_dim", head_dim, *i64),
        integer("balance: layers", layers, *i64),
        cp_comm_type,
        real("balance: gemm_flops_per_token", gemm_flops_per_token, -inf),
        integer("balance: max_tokens_per_rank", max_tokens_per_rank, *i64),
        integer("balance: ranks_per_node", ranks_per_node, -i32, i32),
        real("balance: tflops", tflops, -inf) * 1e12,
        real("balance: efficiency", efficiency, -inf),
        dtype,
    )
    return BalancePlan(**d)
