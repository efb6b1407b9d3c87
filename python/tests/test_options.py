"""The CpConfig options from PyTorch: window_size=(left, right), overlap_chunks and
cross-attention (k/v of another length, q_offset), forward and backward against float64
attention under the same mask, and their bad values raising the library's error on every rank."""
import pytest
import torch
from conftest import agreed_max, configs, rel

import ulysses
import ulysses.torch as ut


def masked_attention(q, k, v, causal, window=(-1, -1), q_offset=0):
    """float64 attention on [b, s, h, d] / [b, s_k, h_kv, d]: query i sits at key position
    q_offset + i and sees key j iff (not causal or j <= q_offset + i) and inside the window."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    i = torch.arange(q.shape[1])[:, None] + q_offset
    j = torch.arange(k.shape[1])[None, :]
    seen = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool)
    if causal:
        seen &= j <= i
    if window[0] >= 0:
        seen &= j >= i - window[0]
    if window[1] >= 0:
        seen &= j <= i + window[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    return torch.einsum("bhqk,bkhd->bqhd", scores.masked_fill(~seen, float("-inf")).softmax(-1), v)


def forward_backward(comm, attn, strategy, sizes, causal, q_offset, gq, gk, gv, gdout):
    """Shards (k/v by their own length), our forward and backward, the gathered out, dq, dk, dv."""
    sh = lambda x: ulysses.shard(x, comm, strategy, causal, cp_sizes=sizes, q_offset=q_offset)
    q, k, v = (sh(x).requires_grad_() for x in (gq, gk, gv))
    out = attn(q, k, v)
    out.backward(sh(gdout))
    un = lambda x: ulysses.unshard(x, comm, strategy, causal, cp_sizes=sizes, q_offset=q_offset)
    return un(out.detach()), un(q.grad), un(k.grad), un(v.grad)


def reference(gq, gk, gv, gdout, **mask):
    q, k, v = (x.detach().double().requires_grad_() for x in (gq, gk, gv))
    out = masked_attention(q, k, v, **mask)
    out.backward(gdout.double())
    return out.detach(), q.grad, k.grad, v.grad


def inputs(seed, b, s, sk, h, kv, d, dtype=torch.float32):
    torch.manual_seed(seed)
    gq, gdout = torch.randn(b, s, h, d).to(dtype), torch.randn(b, s, h, d).to(dtype)
    return gq, torch.randn(b, sk, kv, d).to(dtype), torch.randn(b, sk, kv, d).to(dtype), gdout


def errors(comm, got, want):
    return [agreed_max(comm, rel(x, r)) for x, r in zip(got, want)]


@pytest.mark.parametrize("window", [(3, 0), (2, 5), (-1, 4), (1, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_size_matches_float64(comm, window, causal):
    s = 12 * comm.size + 1
    data = inputs(11, 2, s, s, 4, 2, 16)
    want = reference(*data, causal=causal, window=window)
    for strategy, sizes in configs(comm.size):
        attn = ut.ContextParallelAttention(comm, strategy, causal, cp_sizes=sizes, window_size=window)
        errs = errors(comm, forward_backward(comm, attn, strategy, sizes, causal, None, *data), want)
        assert max(errs) <= 1e-5, (strategy, sizes, window, errs)


@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overlap_chunks_match_float64_with_the_same_bytes(comm, chunks, dtype):
    s, h, kv = 8 * comm.size, 4 * comm.size, 4 * comm.size  # up to 4 KV heads per rank
    data = inputs(12, 1, s, s, h, kv, 16, dtype)
    want = reference(*data, causal=True)
    sent = {}
    for c in (1, chunks):
        comm.reset_counters()
        attn = ut.ContextParallelAttention(comm, "a2a", True, overlap_chunks=c)
        errs = errors(comm, forward_backward(comm, attn, "a2a", None, True, None, *data), want)
        tol_out, tol_grad = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 2.5e-2)
        assert errs[0] <= tol_out and max(errs[1:]) <= tol_grad, (c, errs)
        sent[c] = {op: n["bytes_sent"] for op, n in comm.counters().items() if op in ("seq_to_head", "head_to_seq")}
    assert sent[chunks] == sent[1]
    assert "overlap_chunks=2" in repr(ut.ContextParallelAttention(comm, "a2a", overlap_chunks=2))


def cross_strategies(comm):
    """Every configuration that runs cross-attention (Strategy::supports_cross), found by asking."""
    out = []
    for strategy, sizes in configs(comm.size):
        attn = ut.ContextParallelAttention(comm, strategy, False, cp_sizes=sizes)
        q, kv = torch.zeros(1, 4, 2 * comm.size, 8), torch.zeros(1, 3, 2 * comm.size, 8)
        try:
            attn(q, kv, kv)
            out.append((strategy, sizes))
        except ulysses.Error as e:
            assert "does not support cross-attention" in str(e), str(e)
    return out


@pytest.mark.parametrize("causal,q_offset", [(False, None), (False, 4), (True, 0), (True, 5), (True, "end")])
@pytest.mark.parametrize("sk_per_rank", [20, 3])
def test_cross_attention_matches_float64(comm, causal, q_offset, sk_per_rank):
    s, sk = 8 * comm.size, sk_per_rank * comm.size + 1  # k/v longer and shorter than q
    if q_offset == "end":  # the queries at the end of the keys (a prefix, then the queries)
        if sk < s:
            pytest.skip("the keys are shorter than the queries")
        q_offset = sk - s
    data = inputs(13, 2, s, sk, 4, 2, 16)
    want = reference(*data, causal=causal, q_offset=q_offset or 0)
    found = cross_strategies(comm)
    assert ("a2a", None) in found and ("all_gather", None) in found
    for strategy, sizes in found:
        attn = ut.ContextParallelAttention(comm, strategy, causal, cp_sizes=sizes, q_offset=q_offset)
        errs = errors(comm, forward_backward(comm, attn, strategy, sizes, causal, q_offset, *data), want)
        assert max(errs) <= 1e-5, (strategy, sizes, causal, q_offset, errs)


def raises_everywhere(comm, says, make, sk=None):
    """The first call raises ulysses.Error with `says`, the same message on every rank."""
    q = torch.zeros(1, 4, 2 * comm.size, 8)
    kv = q if sk is None else torch.zeros(1, sk, 2 * comm.size, 8)
    with pytest.raises(ulysses.Error) as info:
        make()(q, kv, kv)
    messages = comm.mpi.allgather(str(info.value))
    assert len(set(messages)) == 1 and says in messages[0], messages


def test_bad_values_raise_the_library_error(comm):
    A = ut.ContextParallelAttention
    raises_everywhere(comm, "window_left must be -1 (unbounded) or >= 0, got -2", lambda: A(comm, window_size=(-2, 0)))
    raises_everywhere(comm, "window_right must be -1 (unbounded) or >= 0, got -7", lambda: A(comm, window_size=(1, -7)))
    raises_everywhere(comm, "overlap_chunks must be 1, or more for cp_comm_type a2a; got 0",
                      lambda: A(comm, overlap_chunks=0))
    raises_everywhere(comm, "overlap_chunks must be 1, or more for cp_comm_type a2a; got 2 for p2p",
                      lambda: A(comm, "p2p", overlap_chunks=2))
    raises_everywhere(comm, "cross-attention with a causal mask needs q_offset", lambda: A(comm, causal=True), sk=3)
    raises_everywhere(comm, "cross-attention does not take a sliding window",
                      lambda: A(comm, window_size=(2, 0), q_offset=0), sk=3)
    for bad in ((1, 2, 3), "wide", (1.5, 0), None):
        with pytest.raises(ulysses.Error, match=r"window_size must be \(left, right\), two integers"):
            A(comm, window_size=bad)
