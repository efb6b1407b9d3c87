"""DeepSpeed's own Ulysses unit tests that apply to us, ported to ulysses.torch (the module a
DeepSpeed user switches to by changing one import). Origin: deepspeedai/DeepSpeed,
tests/unit/sequence_parallelism/test_ulysses.py — TestUlyssesAll2All (all-to-all round trip
over layouts), TestUlyssesAll2All_odd (odd head counts, hash tensors), TestUlyssesLossBackward
(the loss over a sequence-parallel group smaller than the world). Rewritten here, not copied:
their mesh of data x sequence parallel groups is torch.distributed.new_group pairs, their
engine is absent, and equalities are exact where DeepSpeed used allclose."""

import pytest
import torch
import torch.distributed as dist
import ulysses
from conftest import agreed_ok, sdpa
from ulysses.torch import DistributedAttention, _SeqAllToAll, all_to_all

RANK, WORLD = dist.get_rank(), dist.get_world_size()
SP = 2 if WORLD % 2 == 0 else WORLD  # DeepSpeed's mesh: sequence groups of 2, data parallel across
_GROUPS = {}


def sp_group():
    """This rank's sequence-parallel group (every rank makes every group, once)."""
    if not _GROUPS:
        for first in range(0, WORLD, SP):
            _GROUPS[first] = dist.new_group(list(range(first, first + SP)))
    return _GROUPS[RANK - RANK % SP]


def sp_rank():
    return RANK % SP


@pytest.mark.parametrize("d0", [2, 4])
@pytest.mark.parametrize("d1", [4, 8])
@pytest.mark.parametrize("num_heads", [4, 8])
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("batch_dim_idx", [0, 1])
def test_all_to_all_round_trip(d0, d1, num_heads, head_dim, batch_dim_idx):
    """Sequence → heads → sequence gives the input back, in both layouts (DeepSpeed tests only
    the sequence-first one, its batch-first layout having been broken, its issue 5808)."""
    torch.manual_seed(RANK)
    x = torch.randn(d0, d1, num_heads, head_dim)
    seq_dim = 1 - batch_dim_idx
    heads = _SeqAllToAll.apply(sp_group(), x, 2, seq_dim, batch_dim_idx)
    assert heads.shape[seq_dim] == x.shape[seq_dim] * SP and heads.shape[2] == num_heads // SP
    back = _SeqAllToAll.apply(sp_group(), heads, seq_dim, 2, batch_dim_idx)
    assert agreed_ok(torch.equal(back, x))


def code(batch, pos, head):
    """DeepSpeed's hash idea, exact in float32: every element says where it came from."""
    return batch * 10000.0 + pos * 100.0 + head


@pytest.mark.parametrize("d0", [2, 4])
@pytest.mark.parametrize("d1", [4, 8])
@pytest.mark.parametrize("num_heads", [3, 7])
@pytest.mark.parametrize("batch_dim_idx", [0, 1])
def test_odd_heads_hash(d0, d1, num_heads, batch_dim_idx):
    """Heads that do not divide by the group: each rank gets the heads the library's rule gives it
    (``ulysses.head_split``: DeepSpeed's shard sizes), every element where its hash says."""
    head_dim, seq_dim = 16, 1 - batch_dim_idx
    b, n = (d0, d1) if batch_dim_idx == 0 else (d1, d0)
    bi = torch.arange(b).view(-1, 1, 1, 1)
    hi = torch.arange(num_heads).view(1, 1, -1, 1)
    mine = code(bi, torch.arange(n).view(1, -1, 1, 1) + n * sp_rank(), hi).expand(b, n, num_heads, head_dim)
    x = (mine if batch_dim_idx == 0 else mine.transpose(0, 1)).contiguous()
    heads = all_to_all(x, 2, seq_dim, batch_dim_idx, sp_group())
    first, count = ulysses._ulysses.head_split(SP, num_heads, num_heads)[0][sp_rank()]
    want = code(bi, torch.arange(n * SP).view(1, -1, 1, 1), hi[:, :, first : first + count])
    want = want.expand(b, n * SP, count, head_dim)
    ok = torch.equal(heads, want if batch_dim_idx == 0 else want.transpose(0, 1))
    back = all_to_all(heads, seq_dim, 2, batch_dim_idx, sp_group())
    assert agreed_ok(ok and torch.equal(back, x))


def test_backward_is_the_swapped_all_to_all():
    """_SeqAllToAll's contract: the gradient of sequence → heads is heads → sequence."""
    torch.manual_seed(7 + RANK)
    x = torch.randn(2, 4, 2 * SP, 8, requires_grad=True)
    y = all_to_all(x, 2, 1, 0, sp_group())
    g = torch.randn(y.shape)
    y.backward(g)
    assert agreed_ok(torch.equal(x.grad, all_to_all(g, 1, 2, 0, sp_group())))


class TinyAttentionModel(torch.nn.Module):
    """Embedding-free: projections, Ulysses attention, a linear head; [b, s, h*d] in, a scalar
    loss per token out (the SimpleModel of DeepSpeed's test, with attention in it)."""

    def __init__(self, attention, heads=4, head_dim=8):
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank
        width = heads * head_dim
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, 1)
        self.attention, self.heads = attention, heads

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).unbind(2)
        return self.out(self.attention(q, k, v).reshape(b, n, -1)).squeeze(-1)


def test_sequence_parallel_loss():
    """The loss of a small model over its sequence-parallel group equals the loss without
    sequence parallelism, and its gradients too; each rank's share of the loss gets the
    gradient weight / total weight (DeepSpeed's regression test for sp < world, its issue 7672)."""
    torch.manual_seed(100 + RANK // SP)  # one sequence per sequence-parallel group
    tokens = torch.randn(2, 8 * SP, 32)
    full = TinyAttentionModel(sdpa)
    full(tokens).pow(2).mean().backward()
    model = TinyAttentionModel(DistributedAttention(sdpa, sp_group(), 2, 1))
    n = tokens.shape[1] // SP
    local = model(tokens[:, sp_rank() * n : (sp_rank() + 1) * n]).pow(2).sum()
    weight = torch.tensor(float(tokens.shape[0] * n))  # this rank's tokens
    local_loss = local.detach().requires_grad_()
    summed, total = local.detach().clone(), weight.clone()
    dist.all_reduce(summed, group=sp_group())  # DeepSpeed's aggregation: sum of losses / sum of weights
    dist.all_reduce(total, group=sp_group())
    (local_loss / total).backward()
    (local / total).backward()
    # Every rank's share of the gradients, summed over the group, is the unsharded model's.
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads, group=sp_group())
    want = torch.cat([p.grad.flatten() for p in full.parameters()])
    with torch.no_grad():
        loss, want_loss = float(summed / total), float(full(tokens).pow(2).mean())
    loss_ok = abs(loss - want_loss) <= 1e-6 * want_loss
    grad_ok = float((grads - want).abs().max()) < 1e-5 * float(want.abs().max())
    weight_ok = torch.equal(local_loss.grad, 1.0 / total)
    assert agreed_ok(loss_ok and grad_ok and weight_ok), (loss_ok, grad_ok, weight_ok)
