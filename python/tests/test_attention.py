"""ContextParallelAttention from PyTorch: every strategy against float64 textbook attention on
the gathered tensors, autograd contexts (several forwards in flight, checkpointing),
sub-communicators, sharding helpers and collective errors."""

import pytest
import torch
import torch.utils.checkpoint
import ulysses
import ulysses.torch as ut
from conftest import agreed_max, configs, reference, rel, sharded_forward_backward, textbook_attention
from mpi4py import MPI


def run(comm, strategy, cp_sizes, causal, gq, gk, gv, gdout):
    """Shards, our forward and backward, and the gathered out, dq, dk, dv."""
    un = lambda x: ulysses.unshard(x, comm, strategy, causal, cp_sizes=cp_sizes)
    return tuple(un(x) for x in sharded_forward_backward(comm, strategy, cp_sizes, causal, gq, gk, gv, gdout))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_strategy_matches_float64(comm, causal, kv_heads, dtype):
    torch.manual_seed(1)
    b, s, h, d = 2, 16 * comm.size, 4, 16
    gq, gdout = torch.randn(b, s, h, d).to(dtype), torch.randn(b, s, h, d).to(dtype)
    gk, gv = torch.randn(b, s, kv_heads, d).to(dtype), torch.randn(b, s, kv_heads, d).to(dtype)
    want = reference(gq, gk, gv, gdout, causal)
    tol_out, tol_grad = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 2.5e-2)
    for strategy, sizes in configs(comm.size):
        got = run(comm, strategy, sizes, causal, gq, gk, gv, gdout)
        errs = [agreed_max(comm, rel(x, r)) for x, r in zip(got, want)]
        assert errs[0] <= tol_out and max(errs[1:]) <= tol_grad, (strategy, sizes, errs)


def test_strided_inputs_are_read_in_place(comm):
    # [s, b, h, d] storage seen as [b, s, h, d]: no copy, same answer.
    torch.manual_seed(2)
    s, b, h, d = 8 * comm.size, 2, 4, 8
    x = torch.randn(s, b, h, d).transpose(0, 1)
    attn = ut.ContextParallelAttention(comm, "a2a")
    mine = ulysses.shard(x, comm)
    out = attn(mine, mine, mine)
    ref = textbook_attention(x, x, x, False)
    assert agreed_max(comm, rel(ulysses.unshard(out, comm), ref)) < 1e-5


def two_layers(attn, x):
    return attn(attn(x, x, x), x, x)


def test_two_forwards_in_flight_and_checkpointing(comm):
    torch.manual_seed(3)
    b, s, h, d = 1, 8 * comm.size, 4, 8
    gx = torch.randn(b, s, h, d)
    for strategy, sizes in configs(comm.size):
        attn = ut.ContextParallelAttention(comm, strategy, True, cp_sizes=sizes)
        sh = lambda t: ulysses.shard(t, comm, strategy, True, cp_sizes=sizes)
        x1 = sh(gx).requires_grad_()
        two_layers(attn, x1).sum().backward()  # the second forward runs before the first's backward
        x2 = sh(gx).requires_grad_()
        torch.utils.checkpoint.checkpoint(two_layers, attn, x2, use_reentrant=False).sum().backward()
        ref_x = gx.double().requires_grad_()
        ref = lambda t: textbook_attention(t, ref_x, ref_x, True)
        ref(ref(ref_x)).sum().backward()
        un = lambda t: ulysses.unshard(t, comm, strategy, True, cp_sizes=sizes)
        errs = [agreed_max(comm, rel(un(x.grad), ref_x.grad)) for x in (x1, x2)]
        assert max(errs) < 1e-5, (strategy, sizes, errs)


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 4, reason="needs 4 ranks: 2 CP groups of 2")
def test_sub_communicators_are_independent_groups():
    world = MPI.COMM_WORLD
    group = world.Split(world.Get_rank() // 2, world.Get_rank())
    comm = ulysses.Communicator(group)
    torch.manual_seed(10 + world.Get_rank() // 2)  # each group its own data
    b, s, h, d = 1, 16, 4, 8
    gq, gk, gv, gdout = (torch.randn(b, s, h, d) for _ in range(4))
    got = run(comm, "a2a", None, True, gq, gk, gv, gdout)
    want = reference(gq, gk, gv, gdout, True)
    assert agreed_max(comm, max(rel(x, r) for x, r in zip(got, want))) < 1e-5
    assert comm.counters()["seq_to_head"]["bytes_sent"] > 0


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() == 1, reason="needs a second rank to disagree with")
def test_bad_shape_on_one_rank_raises_the_same_error_everywhere(comm):
    attn = ut.ContextParallelAttention(comm, "a2a")
    for s, d, says in ((8, 16, "differ between ranks"), (9, 8, "tokens but cp_comm_type a2a")):
        last = comm.rank == comm.size - 1  # only the last rank's tensor is wrong
        q = torch.zeros(1, s if last else 8, 2 * comm.size, d if last else 8)
        with pytest.raises(ulysses.Error) as info:
            attn(q, q, q)
        messages = comm.mpi.allgather(str(info.value))
        assert len(set(messages)) == 1 and says in messages[0], messages


def test_bad_python_inputs_are_named(comm):
    attn = ut.ContextParallelAttention(comm, "p2p")
    with pytest.raises(ulysses.Error, match="torch.float32 or torch.bfloat16"):
        attn(*(torch.zeros(1, 4, 2, 8, dtype=torch.float64),) * 3)
    with pytest.raises(ulysses.Error, match="4-D"):
        attn(*(torch.zeros(4, 2, 8),) * 3)
    with pytest.raises(ulysses.Error, match="unknown cp_comm_type 'ring'"):
        ut.ContextParallelAttention(comm, "ring")


@pytest.mark.parametrize("strategy,causal", [("a2a", True), ("p2p", True), ("p2p", False), ("all_gather", True)])
def test_shard_unshard_positions(comm, strategy, causal):
    s = 4 * comm.size
    x = torch.arange(2 * s * 3, dtype=torch.float32).reshape(2, s, 3)
    mine = ulysses.shard(x, comm, strategy, causal)
    pos = ulysses.positions(s, comm, strategy, causal)
    assert torch.equal(mine, x[:, pos])
    assert torch.equal(ulysses.unshard(mine, comm, strategy, causal), x)
    if strategy == "p2p" and causal and comm.size == 2:  # zigzag: chunks r and 2cp-1-r
        assert pos.tolist() == ([0, 1, 6, 7] if comm.rank == 0 else [2, 3, 4, 5])


def test_packed_documents(comm):
    # cu_seqlens per call: a 1-token document, an empty one, one across the rank boundaries.
    torch.manual_seed(6)
    s, h, kv, d = 10 * comm.size + 5, 4, 2, 16
    cu = [0, 1, 1, 7, s // 2, s]
    gq, gdout = torch.randn(1, s, h, d), torch.randn(1, s, h, d)
    gk, gv = torch.randn(1, s, kv, d), torch.randn(1, s, kv, d)
    for causal in (False, True):
        q, k, v = (x.detach().double().requires_grad_() for x in (gq, gk, gv))
        out = textbook_attention(q, k, v, causal, cu_seqlens=cu)
        out.backward(gdout.double())
        want = out.detach(), q.grad, k.grad, v.grad
        for strategy, sizes in configs(comm.size):
            attn = ut.ContextParallelAttention(comm, strategy, causal, cp_sizes=sizes)
            sh = lambda x: ulysses.shard(x, comm, strategy, causal, cp_sizes=sizes, cu_seqlens=cu)
            lq, lk, lv = (sh(x).requires_grad_() for x in (gq, gk, gv))
            o = attn(lq, lk, lv, cu_seqlens=torch.tensor(cu))
            o.backward(sh(gdout))
            un = lambda x: ulysses.unshard(x, comm, strategy, causal, cp_sizes=sizes, cu_seqlens=cu)
            got = un(o.detach()), un(lq.grad), un(lk.grad), un(lv.grad)
            errs = [agreed_max(comm, rel(x, r)) for x, r in zip(got, want)]
            assert max(errs) <= 1e-5, (strategy, sizes, causal, errs)


@pytest.mark.parametrize("options", [None, {"per-document": [1]}, {"per-document": [0]}])
def test_per_document_zigzag(comm, options):
    # p2p with documents: every document zigzagged on its own (the default, and per-document 1),
    # or the whole sequence (per-document 0); documents shorter than 2*cp spread one token per
    # rank. shard, positions and unshard follow the module's layout; against float64.
    torch.manual_seed(7)
    cp = comm.size
    lengths = [1, 2 * cp - 1, 3, 6 * cp + 2, 2 * cp + 1, 5]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    s, h, kv, d = cu[-1], 4, 2, 8
    gq, gdout = torch.randn(1, s, h, d), torch.randn(1, s, h, d)
    gk, gv = torch.randn(1, s, kv, d), torch.randn(1, s, kv, d)
    q, k, v = (x.detach().double().requires_grad_() for x in (gq, gk, gv))
    out = textbook_attention(q, k, v, True, cu_seqlens=cu)
    out.backward(gdout.double())
    want = out.detach(), q.grad, k.grad, v.grad
    layout = dict(cu_seqlens=cu, options=options)
    pos = ulysses.positions(s, comm, "p2p", True, **layout)
    plain = ulysses.positions(s, comm, "p2p", True)
    per_document = cp > 1 and options != {"per-document": [0]}
    assert bool(agreed_max(comm, not torch.equal(pos, plain))) == per_document  # some rank's tokens moved
    attn = ut.ContextParallelAttention(comm, "p2p", True, options=options)
    lq, lk, lv = (ulysses.shard(x, comm, "p2p", True, **layout).requires_grad_() for x in (gq, gk, gv))
    assert torch.equal(lq, gq[:, pos])
    o = attn(lq, lk, lv, cu_seqlens=cu)
    o.backward(ulysses.shard(gdout, comm, "p2p", True, **layout))
    got = [ulysses.unshard(x, comm, "p2p", True, **layout) for x in (o.detach(), lq.grad, lk.grad, lv.grad)]
    errs = [agreed_max(comm, rel(x, r)) for x, r in zip(got, want)]
    assert max(errs) <= 1e-5, (options, errs)


def test_per_document_option_refused_elsewhere(comm):
    x = torch.zeros(1, 4 * comm.size, 2 * comm.size, 8)
    with pytest.raises(ulysses.Error, match=r"per_document must be 0\|1 \(an integer in \[0, 1\]\), got \[2\]"):
        ut.ContextParallelAttention(comm, "p2p", True, options={"per-document": [2]})
    attn = ut.ContextParallelAttention(comm, "a2a", True, options={"per-document": [0]})
    with pytest.raises(ulysses.Error, match="per_document must be 1 for cp_comm_type a2a"):
        attn(*(ulysses.shard(x, comm, "a2a", True),) * 3, cu_seqlens=[0, 1, x.shape[1]])


def test_uneven_sequence_and_heads(comm):
    # s % cp != 0 and h % cp != 0: shards differ by at most one token, GQA groups stay whole.
    torch.manual_seed(5)
    b, s, h, kv, d = 1, 8 * comm.size + 3, 6, 3, 16
    gq, gdout = torch.randn(b, s, h, d), torch.randn(b, s, h, d)
    gk, gv = torch.randn(b, s, kv, d), torch.randn(b, s, kv, d)
    want = reference(gq, gk, gv, gdout, True)
    for strategy, sizes in configs(comm.size):
        got = run(comm, strategy, sizes, True, gq, gk, gv, gdout)
        errs = [agreed_max(comm, rel(x, r)) for x, r in zip(got, want)]
        assert max(errs) <= 1e-5, (strategy, sizes, errs)
