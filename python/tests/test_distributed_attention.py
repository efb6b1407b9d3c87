"""DistributedAttention: DeepSpeed's signature around any local attention, our fused all-to-all."""

import pytest
import torch
import torch.nn.functional as F
import ulysses
import ulysses.torch as ut
from conftest import agreed_max, rel, textbook_attention


def local_attention(q, k, v):  # [b, s, h, d]; SDPA where torch has it (>= 2.0)
    if hasattr(F, "scaled_dot_product_attention"):
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)
    return textbook_attention(q, k, v, True).to(q.dtype)


@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("gather_idx", [1, 0])
def test_equals_single_process_attention(comm, kv_heads, gather_idx):
    torch.manual_seed(4)
    b, s, h, d = 2, 8 * comm.size, 4, 16
    gq = torch.randn(b, s, h, d, dtype=torch.float64)
    gk, gv = torch.randn(b, s, kv_heads, d, dtype=torch.float64), torch.randn(b, s, kv_heads, d, dtype=torch.float64)
    gdout = torch.randn(b, s, h, d, dtype=torch.float64)
    # DeepSpeed hands the local attention the caller's layout: [s, b, h/p, d] when gather_idx is 0.
    seq_first = lambda q, k, v: local_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    layer = ut.DistributedAttention(seq_first if gather_idx == 0 else local_attention, comm, 2, gather_idx)
    # Each rank's contiguous tokens, in the layout the user gives DeepSpeed.
    sh = lambda x: ulysses.shard(x, comm).float()
    to_layout = (lambda x: x.transpose(0, 1).contiguous()) if gather_idx == 0 else (lambda x: x)
    q, k, v = (to_layout(sh(x)).requires_grad_() for x in (gq, gk, gv))
    out = layer(q, k, v) if gather_idx == 1 else layer(q, k, v, 1)  # DeepSpeed >= 0.15 passes batch_dim_idx
    out.backward(to_layout(sh(gdout)))
    back = (lambda x: x.transpose(0, 1)) if gather_idx == 0 else (lambda x: x)
    rq, rk, rv = (x.clone().requires_grad_() for x in (gq, gk, gv))
    ref = textbook_attention(rq, rk, rv, True)
    ref.backward(gdout)
    got = [ulysses.unshard(back(x), comm) for x in (out.detach(), q.grad, k.grad, v.grad)]
    errs = [agreed_max(comm, rel(x, r)) for x, r in zip(got, (ref, rq.grad, rk.grad, rv.grad))]
    assert max(errs) < 1e-5, errs
    counters = comm.counters()
    assert comm.size == 1 or counters["seq_to_head"]["calls"] >= 2  # Q, K and V travel together


def test_refuses_what_it_cannot_do(comm):
    with pytest.raises(ulysses.Error, match="scatter_idx=2"):
        ut.DistributedAttention(local_attention, comm, scatter_idx=1, gather_idx=2)
    x = torch.zeros(1, 4, comm.size, 8)
    with pytest.raises(ulysses.Error, match="rotary_pos_emb"):
        ut.DistributedAttention(local_attention, comm, 2, 1)(x, x, x, 0, (x, x))


def test_uneven_heads_keep_gqa_groups(comm):
    torch.manual_seed(6)
    b, s, h, kv, d = 1, 8 * comm.size, 6, 3, 16
    gq, gk, gv = torch.randn(b, s, h, d), torch.randn(b, s, kv, d), torch.randn(b, s, kv, d)
    layer = ut.DistributedAttention(local_attention, comm, 2, 1)
    out = layer(*(ulysses.shard(x, comm) for x in (gq, gk, gv)))
    ref = textbook_attention(gq, gk, gv, True)
    assert agreed_max(comm, rel(ulysses.unshard(out.detach(), comm), ref)) < 1e-5
