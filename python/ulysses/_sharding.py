"""Global tensors ↔ the tokens each rank holds, for a strategy's token layout."""
import numpy as np
import torch

from . import _ulysses


def _chunks(comm, seq, strategy, causal, cp_sizes, rank, q_offset=None):
    return _ulysses.rank_chunks(strategy, causal, list(cp_sizes or []), comm.size, rank, seq,
                                None if q_offset is None else int(q_offset))


def shard(x, comm, strategy="a2a", causal=False, dim=1, cp_sizes=None, q_offset=None):
    """This rank's tokens of the global tensor ``x`` (sequence along ``dim``), in the order the
    strategy expects: contiguous, or zigzag for p2p / all_gather / a2a+p2p under a causal mask
    (contiguous whenever ``q_offset`` is set: cross-attention; pass the module's ``q_offset``,
    for q and for k/v of their own length alike). Not collective."""
    chunks = _chunks(comm, x.shape[dim], strategy, causal, cp_sizes, comm.rank, q_offset)
    return torch.cat([x.narrow(dim, begin, length) for begin, length in chunks], dim=dim)


def positions(seq, comm, strategy="a2a", causal=False, cp_sizes=None, q_offset=None):
    """Global position of every local token (int64), e.g. for RoPE. Not collective."""
    chunks = _chunks(comm, seq, strategy, causal, cp_sizes, comm.rank, q_offset)
    return torch.cat([torch.arange(begin, begin + length) for begin, length in chunks])


def unshard(x, comm, strategy="a2a", causal=False, dim=1, cp_sizes=None, q_offset=None):
    """Collective: the global tensor, on every rank, from each rank's shard ``x`` (the inverse
    of ``shard``)."""
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
