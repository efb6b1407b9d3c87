"""ulysses.balance: which ranks compute which sequence of a variable-length step (balancer.hpp)."""

from dataclasses import dataclass
from typing import List, Tuple

from . import _ulysses


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
    if isinstance(world_or_comm, int):
        world = world_or_comm
    elif hasattr(world_or_comm, "Get_size"):
        world = world_or_comm.Get_size()
    else:
        world = world_or_comm.size
    d = _ulysses.balance(
        [int(n) for n in lengths],
        int(world),
        int(dp),
        str(policy),
        int(heads),
        int(kv_heads if kv_heads is not None else heads),
        int(head_dim),
        int(layers),
        str(cp_comm_type),
        float(gemm_flops_per_token),
        int(max_tokens_per_rank),
        int(ranks_per_node),
        float(tflops) * 1e12,
        float(efficiency),
        str(dtype),
    )
    return BalancePlan(**d)
