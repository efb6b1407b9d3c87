"""ulysses: context-parallel attention over MPI — DeepSpeed-Ulysses (``a2a``), ring attention
(``p2p``), ``all_gather`` and hierarchical ``a2a+p2p`` — as a C++ library with a PyTorch front.

    from mpi4py import MPI
    import ulysses, ulysses.torch
    comm = ulysses.Communicator(MPI.COMM_WORLD)          # or any sub-communicator
    attn = ulysses.torch.ContextParallelAttention(comm, strategy="a2a", causal=True)
    out = attn(q, k, v)                                   # this rank's [b, s/cp, h, d] shards

Without mpirun, ``ulysses.local_group(n).run(fn)`` runs ``fn(comm)`` on n ranks that are
threads of this process (tests, notebooks), with the same strategies, counters and errors.

``shard`` / ``unshard`` / ``positions`` move between global tensors and the tokens each rank
holds for a strategy (zigzag for the ring under a causal mask).

``ContextParallelAttention`` also takes ``window_size=(left, right)`` (FlashAttention's sliding
window, -1 unbounded), ``overlap_chunks`` (``a2a``: pipelined all-to-alls) and ``q_offset`` with
k/v of another length than q (cross-attention; shard them with the same ``q_offset``).

The strategies are Megatron's ``cp_comm_type`` names, from the library's registry:

>>> import ulysses
>>> ulysses.strategy_names()
['a2a', 'p2p', 'all_gather', 'a2a+p2p']

Each declares the options it adds (``ContextParallelAttention(..., options=...)``; a2a+p2p's
sizes and a2a's overlap chunks also have keywords of their own):

>>> [flag for flag, values, help in ulysses.strategy_options("a2a+p2p")]
['cp-sizes', 'per-document']
"""

from ._balance import BalancePlan, balance
from ._comm import Communicator
from ._local import LocalGroup, local_group
from ._sharding import positions, shard, unshard
from ._ulysses import Error, __version__, strategy_names, strategy_options

__all__ = [
    "BalancePlan",
    "Communicator",
    "Error",
    "LocalGroup",
    "__version__",
    "balance",
    "local_group",
    "positions",
    "shard",
    "strategy_names",
    "strategy_options",
    "unshard",
]
