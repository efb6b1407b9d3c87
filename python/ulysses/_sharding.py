"""Global tensors ↔ the tokens each rank holds, for a strategy's token layout."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import _ulysses

if TYPE_CHECKING:
    from ._comm import Communicator


def _chunks(comm: Communicator, seq: int, strategy: str, causal: bool, cp_sizes: Optional[Sequence[int]],
            rank: int, q_offset: Optional[int] = None) -> List[Tuple[int, int]]:
    return _ulysses.rank_chunks(strategy, causal, list(cp_sizes or []), comm.size, rank, seq,
                                None if q_offset is None else int(q_offset))


def shard(x: torch.Tensor, comm: Communicator, strategy: str = "a2a", causal: bool = False, dim: int = 1,
          cp_sizes: Optional[Sequence[int]] = None, q_offset: Optional[int] = None) -> torch.Tensor:
    """This rank's tokens of the global tensor ``x`` (sequence along ``dim``), in the order the
    strategy expects: contiguous, or zigzag for p2p / all_gather / a2a+p2p under a causal mask
    (contiguous whenever ``q_offset`` is set: cross-attention; pass the module's ``q_offset``,
    for q and for k/v of their own length alike). Not collective.

    On one rank the shard is the whole tensor:

    >>> import torch, ulysses
    >>> from mpi4py import MPI
    >>> comm = ulysses.Communicator(MPI.COMM_SELF, threads=1)
    >>> x = torch.arange(6.0).view(1, 6, 1, 1)
    >>> ulysses.shard(x, comm, "p2p", causal=True).flatten().tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    """
    chunks = _chunks(comm, x.shape[dim], strategy, causal, cp_sizes, comm.rank, q_offset)
    return torch.cat([x.narrow(dim, begin, length) for begin, length in chunks], dim=dim)


def positions(seq: int, comm: Communicator, strategy: str = "a2a", causal: bool = False,
              cp_sizes: Optional[Sequence[int]] = None, q_offset: Optional[int] = None) -> torch.Tensor:
    """Global position of every local token (int64), e.g. for RoPE. Not collective.

    >>> import ulysses
    >>> from mpi4py import MPI
    >>> ulysses.positions(4, ulysses.Communicator(MPI.COMM_SELF, threads=1)).tolist()
    [0, 1, 2, 3]
    """
    chunks = _chunks(comm, seq, strategy, causal, cp_sizes, comm.rank, q_offset)
    return torch.cat([torch.arange(begin, begin + length) for begin, length in chunks])


def unshard(x: torch.Tensor, comm: Communicator, strategy: str = "a2a", causal: bool = False, dim: int = 1,
            cp_sizes: Optional[Sequence[int]] = None, q_offset: Optional[int] = None) -> torch.Tensor:
    """Collective: the global tensor, on every rank, from each rank's shard ``x`` (the inverse
    of ``shard``).

    >>> import torch, ulysses
    >>> from mpi4py import MPI
    >>> comm = ulysses.Communicator(MPI.COMM_SELF, threads=1)
    >>> x = torch.randn(2, 8, 3, 4)
    >>> bool((ulysses.unshard(ulysses.shard(x, comm, "p2p", causal=True), comm, "p2p", causal=True) == x).all())
    True
    """
    from mpi4py import MPI

    local = x.movedim(dim, 0).contiguous()
    lengths = comm.mpi.allgather(local.shape[0])
    seq = sum(lengths)
    row = int(np.prod(local.shape[1:])) * local.element_size()
    gathered = torch.empty((seq,) + tuple(local.shape[1:]), dtype=x.dtype)
    counts = [n * row for n in lengths]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    comm.mpi.Allgatherv(local.reshape(-1).view(torch.uint8).numpy(),
                        [gathered.reshape(-1).view(torch.uint8).numpy(), counts, displs, MPI.BYTE])
    out = torch.empty_like(gathered)
    start = 0
    for r in range(comm.size):  # rank r's block holds its chunks in local order
        for begin, length in _chunks(comm, seq, strategy, causal, cp_sizes, r, q_offset):
            out[begin:begin + length] = gathered[start:start + length]
            start += length
    return out.movedim(0, dim)
