# Run under mpirun: every rank runs every test, in the same order. Tests compute, agree their
# errors across ranks (max), then assert, so a failure fails on every rank and the collectives
# of later tests still line up.
import pytest
import torch
import ulysses
import ulysses.torch as ut
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


def reference(gq, gk, gv, gdout, causal):
    """float64 textbook out, dq, dk, dv of the global tensors."""
    q, k, v = (x.detach().double().requires_grad_() for x in (gq, gk, gv))
    out = textbook_attention(q, k, v, causal)
    out.backward(gdout.double())
    return out.detach(), q.grad, k.grad, v.grad


def sharded_forward_backward(comm, strategy, cp_sizes, causal, gq, gk, gv, gdout):
    """This rank's shards of out, dq, dk, dv from our forward and backward."""
    attn = ut.ContextParallelAttention(comm, strategy, causal, cp_sizes=cp_sizes)
    sh = lambda x: ulysses.shard(x, comm, strategy, causal, cp_sizes=cp_sizes)
    q, k, v = (sh(x).requires_grad_() for x in (gq, gk, gv))
    out = attn(q, k, v)
    out.backward(sh(gdout))
    return out.detach(), q.grad, k.grad, v.grad
