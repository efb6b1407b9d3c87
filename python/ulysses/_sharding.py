"""Global tensors ↔ the tokens each rank holds, for a strategy's token layout. Every function
is collective: the ranks agree on their arguments (and unshard on the shards' dtype and shapes)
before any data moves, so a rank that differs raises the same ``ulysses.Error`` everywhere.
``comm`` is a ``ulysses.Communicator``, or a ``torch.distributed`` group (None: the default
group) as the modules of ``ulysses.torch`` take it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import numpy as np
import torch

from . import _ulysses
from ._agree import INT64_MAX, agree_identical, agreed, integer
from ._torch_comm import communicator

if TYPE_CHECKING:
    from ._comm import Communicator


def _layout(strategy, causal, cp_sizes, q_offset, cu_seqlens, options):
    """The arguments every function shares, checked and normalised (not collective)."""
    if strategy not in _ulysses.strategy_names():
        raise _ulysses.Error(f"unknown cp_comm_type {strategy!r}; one of {', '.join(_ulysses.strategy_names())}")
    sizes = [integer("cp_sizes", n, 1, 2**31 - 1) for n in (cp_sizes or [])]
    offset = None if q_offset is None else integer("q_offset", q_offset, -INT64_MAX - 1, INT64_MAX)
    cu = [integer("cu_seqlens", x, -INT64_MAX - 1, INT64_MAX) for x in (cu_seqlens if cu_seqlens is not None else [])]
    own = {str(f): [integer(str(f), n, 0, INT64_MAX) for n in v] for f, v in sorted((options or {}).items())}
    return strategy, bool(causal), sizes, offset, cu, own


def _tensor_dim(x, dim):
    """``dim`` of tensor ``x`` as a non-negative index (not collective)."""
    if not isinstance(x, torch.Tensor):
        raise _ulysses.Error(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise _ulysses.Error(f"x is on {x.device}; ulysses runs on CPU tensors")
    n = max(x.dim(), 1)
    return integer("dim", dim, -n, n - 1) % n


def _chunks(comm, seq, layout, rank):
    strategy, causal, sizes, offset, cu, own = layout
    return _ulysses.rank_chunks(strategy, causal, sizes, comm.size, rank, seq, offset, cu, own)


def shard(
    x: torch.Tensor,
    comm: Communicator,
    strategy: str = "a2a",
    causal: bool = False,
    dim: int = 1,
    cp_sizes: Optional[Sequence[int]] = None,
    q_offset: Optional[int] = None,
    cu_seqlens: Optional[Sequence[int]] = None,
    options: Optional[Mapping[str, Sequence[int]]] = None,
) -> torch.Tensor:
    """This rank's tokens of the global tensor ``x`` (sequence along ``dim``), in the order the
    strategy expects: contiguous, or zigzag for p2p / all_gather / a2a+p2p under a causal mask
    (contiguous whenever ``q_offset`` is set: cross-attention; pass the module's ``q_offset``,
    for q and for k/v of their own length alike). With packed documents pass the forward's
    ``cu_seqlens``: p2p and a2a+p2p then zigzag every document on its own (per-document zigzag;
    ``options={"per-document": [0]}``, as given to the module, keeps plain zigzag). Collective:
    the ranks agree on the arguments and on x's shape and dtype. On one rank the shard is the
    whole tensor:

    >>> import torch, ulysses
    >>> from mpi4py import MPI
    >>> comm = ulysses.Communicator(MPI.COMM_SELF, threads=1)
    >>> x = torch.arange(6.0).view(1, 6, 1, 1)
    >>> ulysses.shard(x, comm, "p2p", causal=True).flatten().tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    """

    comm = communicator(comm, "comm")

    def local():
        d, layout = _tensor_dim(x, dim), _layout(strategy, causal, cp_sizes, q_offset, cu_seqlens, options)
        return d, layout, _chunks(comm, x.shape[d], layout, comm.rank)

    d, layout, chunks = agreed(comm, local)
    agree_identical(comm, "ulysses.shard arguments", tuple(x.shape), str(x.dtype), d, layout)
    return torch.cat([x.narrow(d, begin, length) for begin, length in chunks], dim=d)


def positions(
    seq: int,
    comm: Communicator,
    strategy: str = "a2a",
    causal: bool = False,
    cp_sizes: Optional[Sequence[int]] = None,
    q_offset: Optional[int] = None,
    cu_seqlens: Optional[Sequence[int]] = None,
    options: Optional[Mapping[str, Sequence[int]]] = None,
) -> torch.Tensor:
    """Global position of every local token (int64), e.g. for RoPE. Collective: the ranks agree
    on the arguments.

    >>> import ulysses
    >>> from mpi4py import MPI
    >>> ulysses.positions(4, ulysses.Communicator(MPI.COMM_SELF, threads=1)).tolist()
    [0, 1, 2, 3]
    """

    comm = communicator(comm, "comm")

    def local():
        n, layout = (
            integer("seq", seq, 0, INT64_MAX),
            _layout(strategy, causal, cp_sizes, q_offset, cu_seqlens, options),
        )
        return n, layout, _chunks(comm, n, layout, comm.rank)

    n, layout, chunks = agreed(comm, local)
    agree_identical(comm, "ulysses.positions arguments", n, layout)
    return torch.cat([torch.arange(begin, begin + length) for begin, length in chunks])


def _in_sequence_order(gathered, chunks):
    """The ranks' blocks back to back (rank r's holding its chunks in local order), reordered
    into the global sequence."""
    out = torch.empty_like(gathered)
    start = 0
    for rank_chunks in chunks:
        for begin, length in rank_chunks:
            out[begin : begin + length] = gathered[start : start + length]
            start += length
    return out


def unshard(
    x: torch.Tensor,
    comm: Communicator,
    strategy: str = "a2a",
    causal: bool = False,
    dim: int = 1,
    cp_sizes: Optional[Sequence[int]] = None,
    q_offset: Optional[int] = None,
    cu_seqlens: Optional[Sequence[int]] = None,
    options: Optional[Mapping[str, Sequence[int]]] = None,
) -> torch.Tensor:
    """Collective: the global tensor, on every rank, from each rank's shard ``x`` (the inverse
    of ``shard``). The ranks agree on the arguments, on x's dtype and on its shape but along
    ``dim``, where each rank must hold the tokens ``shard`` gives it.

    >>> import torch, ulysses
    >>> from mpi4py import MPI
    >>> comm = ulysses.Communicator(MPI.COMM_SELF, threads=1)
    >>> x = torch.randn(2, 8, 3, 4)
    >>> bool((ulysses.unshard(ulysses.shard(x, comm, "p2p", causal=True), comm, "p2p", causal=True) == x).all())
    True
    """
    comm = communicator(comm, "comm")
    if comm.mpi is None and comm.group is None:  # the same on every rank of a local group: nothing has moved yet
        raise _ulysses.Error(
            "unshard needs an MPI communicator or a torch group; on a local group, return each rank's shard from "
            "run() and place its rows with ulysses.positions"
        )
    d, layout = agreed(
        comm, lambda: (_tensor_dim(x, dim), _layout(strategy, causal, cp_sizes, q_offset, cu_seqlens, options))
    )
    shape = list(x.shape)
    shape[d] = "*"
    agree_identical(comm, "ulysses.unshard shards and arguments", shape, str(x.dtype), d, layout)
    local = x.movedim(d, 0).contiguous()
    lengths = comm._impl.agree_all("", "unshard", "", [local.shape[0]])
    seq = sum(lengths)
    chunks = agreed(comm, lambda: [_chunks(comm, seq, layout, r) for r in range(comm.size)])
    for r, held in enumerate(lengths):  # every rank sees every length: the same error everywhere
        want = sum(length for _, length in chunks[r])
        if held != want:
            raise _ulysses.Error(
                f"unshard: rank {r} holds {held} tokens along dim {d} but cp_comm_type {layout[0]} "
                f"with s = {seq} gives it {want} (ulysses.shard)"
            )
    return _in_sequence_order(_gather_rows(comm, local, lengths), chunks).movedim(0, d)


def _gather_rows(comm, local, lengths):
    """Every rank's rows (dim 0) back to back in rank order, on every rank (collective)."""
    if comm.group is not None:  # torch.distributed: equal blocks, so pad to the longest
        padded = torch.zeros((max(lengths),) + tuple(local.shape[1:]), dtype=local.dtype)
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in lengths]
        torch.distributed.all_gather(parts, padded, group=comm.group)
        return torch.cat([part[:n] for part, n in zip(parts, lengths)])
    from mpi4py import MPI

    row = int(np.prod(local.shape[1:])) * local.element_size()
    gathered = torch.empty((sum(lengths),) + tuple(local.shape[1:]), dtype=local.dtype)
    counts = [n * row for n in lengths]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    comm.mpi.Allgatherv(
        local.reshape(-1).view(torch.uint8).numpy(),
        [gathered.reshape(-1).view(torch.uint8).numpy(), counts, displs, MPI.BYTE],
    )
    return gathered
