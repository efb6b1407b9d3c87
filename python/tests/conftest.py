# Run under mpirun: every rank runs every test, in the same order. Tests compute, agree their
# errors across ranks (max), then assert, so a failure fails on every rank and the collectives
# of later tests still line up.
import pytest
import torch
import ulysses
from mpi4py import MPI


@pytest.fixture(scope="session")
def comm():
    return ulysses.Communicator(MPI.COMM_WORLD)


def agreed_max(comm, x):
    return comm.mpi.allreduce(float(x), op=MPI.MAX)


def textbook_attention(q, k, v, causal, scale=None, cu_seqlens=None):
    """float64 attention on [b, s, h, d] tensors (GQA by repeating K/V heads); with
    cu_seqlens, a block-diagonal mask of the documents."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or q.shape[-1] ** -0.5)
    if causal:
        s = q.shape[1]
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    if cu_seqlens is not None:
        doc = torch.bucketize(torch.arange(q.shape[1]), torch.tensor(cu_seqlens[1:]), right=True)
        scores = scores.masked_fill(doc[:, None] != doc[None, :], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def configs(cp):
    """Every registered strategy; a2a+p2p at every factorisation of cp."""
    out = []
    for name in ulysses.strategy_names():
        if name == "a2a+p2p":
            out += [(name, [i, cp // i]) for i in range(1, cp + 1) if cp % i == 0]
        else:
            out.append((name, None))
    return out
