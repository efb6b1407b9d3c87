"""The CpConfig options from PyTorch: window_size=(left, right), overlap_chunks and
cross-attention (k/v of another length, q_offset), forward and backward against float64
attention under the same mask, and their bad values raising the library's error on every rank."""

import inspect

import pytest
import torch
import ulysses
import ulysses.torch as ut
from conftest import agreed_max, configs, rel
from mpi4py import MPI


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
    raises_everywhere(comm, "overlap_chunks: 0 is out of range [1, 1024]", lambda: A(comm, overlap_chunks=0))
    raises_everywhere(
        comm,
        "overlap_chunks must be 1 for cp_comm_type p2p (an option of a2a), got 2",
        lambda: A(comm, "p2p", overlap_chunks=2),
    )
    raises_everywhere(
        comm, "cp_comm_type p2p has no option toy-max-cp", lambda: A(comm, "p2p", options={"toy-max-cp": [2]})
    )
    raises_everywhere(comm, "cross-attention with a causal mask needs q_offset", lambda: A(comm, causal=True), sk=3)
    raises_everywhere(
        comm, "cross-attention does not take a sliding window", lambda: A(comm, window_size=(2, 0), q_offset=0), sk=3
    )
    for bad in ((1, 2, 3), "wide", (1.5, 0), None):
        with pytest.raises(ulysses.Error, match=r"window_size must be \(left, right\), two integers"):
            A(comm, window_size=bad)


def raised_everywhere(comm, says, call):
    """call() raises ulysses.Error with `says`, the same message on every rank."""
    with pytest.raises(ulysses.Error) as info:
        call()
    messages = comm.mpi.allgather(str(info.value))
    assert len(set(messages)) == 1 and says in messages[0], messages


def test_integer_arguments_are_range_checked(comm):
    A, x = ut.ContextParallelAttention, torch.zeros(1, 4 * comm.size, 2, 8)
    raised_everywhere(
        comm, "overlap_chunks: 1099511627776 is out of range [1, 1024]", lambda: A(comm, overlap_chunks=2**40)
    )
    raised_everywhere(comm, "q_offset: 9223372036854775808 is out of range", lambda: A(comm, q_offset=2**63))
    raised_everywhere(comm, "cp_sizes must be an integer, got 'x'", lambda: A(comm, "a2a+p2p", cp_sizes=["x", 1]))
    raised_everywhere(
        comm, "window_size[0]: 18446744073709551616 is out of range", lambda: A(comm, window_size=(2**64, 0))
    )
    raised_everywhere(comm, "cu_seqlens: 18446744073709551616 is out of range", lambda: A(comm)(x, x, x, [0, 2**64]))
    for bad, says in (
        (10**6, "threads: 1000000 is out of range [1, 1024]"),
        (-3, "threads: -3 is out of range"),
        (2.5, "threads must be an integer, got 2.5"),
    ):
        raised_everywhere(comm, says, lambda: ulysses.Communicator(MPI.COMM_WORLD, threads=bad))
    raised_everywhere(comm, "dim: 7 is out of range [-4, 3]", lambda: ulysses.shard(x, comm, dim=7))
    raised_everywhere(comm, "dim: -5 is out of range [-4, 3]", lambda: ulysses.unshard(x, comm, dim=-5))
    raised_everywhere(comm, "seq: -1 is out of range", lambda: ulysses.positions(-1, comm))
    raised_everywhere(comm, "unknown cp_comm_type 'ring'", lambda: ulysses.shard(x, comm, "ring"))
    assert ulysses.Communicator(MPI.COMM_WORLD, threads=1).size == comm.size  # in range: accepted


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() == 1, reason="needs a second rank to disagree with")
def test_an_argument_on_one_rank_is_one_error_everywhere(comm):
    """Every entry point's arguments, changed on the last rank only: one agreed ulysses.Error on
    every rank, never a hang, a crash or a wrong answer (then the ranks go on in step)."""
    A, D = ut.ContextParallelAttention, ut.DistributedAttention
    last = comm.rank == comm.size - 1
    s, h = 4 * comm.size, 2 * comm.size
    x = torch.zeros(1, s, h, 8)
    odd = lambda good, bad: bad if last else good  # noqa: E731
    local_attention = lambda q, k, v: q  # noqa: E731
    cases = [
        ("differ between ranks", lambda: A(comm, odd("a2a", "p2p"))),
        ("differ between ranks", lambda: A(comm, causal=odd(False, True))),
        ("differ between ranks", lambda: A(comm, overlap_chunks=odd(1, 2))),
        ("differ between ranks", lambda: A(comm, window_size=odd((-1, -1), (2, 0)))),
        ("differ between ranks", lambda: A(comm, q_offset=odd(None, 0))),
        ("differ between ranks", lambda: A(comm, "a2a+p2p", cp_sizes=odd([comm.size, 1], [1, comm.size]))),
        ("overlap_chunks: 0 is out of range", lambda: A(comm, overlap_chunks=odd(1, 0))),
        ("unknown cp_comm_type 'ring'", lambda: A(comm, odd("a2a", "ring"))),
        ("torch.float32 or torch.bfloat16", lambda: A(comm)(x, x, odd(x, x.double()))),
        ("ulysses runs on CPU tensors", lambda: A(comm)(odd(x, torch.zeros(1, s, h, 8, device="meta")), x, x)),
        ("must be a torch.Tensor", lambda: A(comm)(x, odd(x, [1, 2]), x)),
        ("differ between ranks", lambda: A(comm)(odd(x, x.bfloat16()), *(odd(x, x.bfloat16()),) * 2)),
        ("differ between ranks", lambda: A(comm)(x, x, x, odd(None, [0, s]))),
        ("cu_seqlens must be an integer", lambda: A(comm)(x, x, x, odd([0, s], [0, 1.5]))),
        ("threads: 0 is out of range", lambda: ulysses.Communicator(MPI.COMM_WORLD, threads=odd(1, 0))),
        ("ulysses.shard arguments differ", lambda: ulysses.shard(x, comm, dim=odd(1, 2))),
        ("ulysses.shard arguments differ", lambda: ulysses.shard(x, comm, "p2p", causal=odd(False, True))),
        ("ulysses.shard arguments differ", lambda: ulysses.shard(odd(x, x.bfloat16()), comm)),
        ("dim: 7 is out of range", lambda: ulysses.shard(x, comm, dim=odd(1, 7))),
        ("ulysses.positions arguments differ", lambda: ulysses.positions(odd(s, 2 * s), comm)),
        ("ulysses.unshard shards and arguments differ", lambda: ulysses.unshard(odd(x, x.bfloat16()), comm)),
        (
            "ulysses.unshard shards and arguments differ",
            lambda: ulysses.unshard(odd(x, torch.zeros(1, s, h + 1, 8)), comm),
        ),
        ("unshard: rank", lambda: ulysses.unshard(odd(x, torch.zeros(1, s + 1, h, 8)), comm)),
        ("DistributedAttention arguments differ", lambda: D(local_attention, comm, 2, odd(0, 1))),
        ("DistributedAttention arguments differ", lambda: D(local_attention, comm, 2, 1, num_kv_heads=odd(None, h))),
        ("num_kv_heads=", lambda: D(local_attention, comm, 2, 1, num_kv_heads=h)(x, *(odd(x, x[:, :, :1]),) * 2)),
        ("rotary_pos_emb", lambda: D(local_attention, comm, 2, 1)(x, x, x, 0, odd(None, (x, x)))),
    ]
    for says, call in cases:
        raised_everywhere(comm, says, call)
    assert ulysses.unshard(ulysses.shard(x, comm), comm).shape == x.shape  # still in step


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() == 1, reason="needs a second rank to disagree with")
def test_every_keyword_argument_differing_on_one_rank_is_one_error(comm):
    """Each keyword argument of each entry point, as inspect finds them (a new argument fails
    here until it has a differing value below), changed on the last rank alone."""
    last = comm.rank == comm.size - 1
    x = torch.zeros(1, 4 * comm.size, 2 * comm.size, 8)
    # (default-rank value, last-rank value) of every keyword argument
    values = {
        "strategy": ("a2a", "p2p"),
        "causal": (False, True),
        "dim": (1, 2),
        "cp_sizes": (None, [1, comm.size]),
        "q_offset": (None, 0),
        "scale": (None, 0.5),
        "window_size": ((-1, -1), (1, 0)),
        "overlap_chunks": (1, 2),
        "options": (None, {"toy-max-cp": [2]}),
        "cu_seqlens": (None, [0, 1, 4 * comm.size]),
    }
    calls = {
        ulysses.shard: lambda **kw: ulysses.shard(x, comm, **kw),
        ulysses.positions: lambda **kw: ulysses.positions(x.shape[1], comm, **kw),
        ulysses.unshard: lambda **kw: ulysses.unshard(x, comm, **kw),
        ut.ContextParallelAttention.__init__: lambda **kw: ut.ContextParallelAttention(comm, **kw),
    }
    for fn, call in calls.items():
        keywords = [p for p in inspect.signature(fn).parameters.values() if p.default is not inspect.Parameter.empty]
        for p in keywords:
            assert p.name in values, f"{fn.__qualname__}: no differing value for {p.name}"
            good, bad = values[p.name]
            raised_everywhere(comm, "differ between ranks", lambda: call(**{p.name: bad if last else good}))
