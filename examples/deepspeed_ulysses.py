"""A DeepSpeed-Ulysses training script with one import changed:

    # from deepspeed.sequence.layer import DistributedAttention
    from ulysses.torch import DistributedAttention

Everything else is what a DeepSpeed user writes: a torch.distributed process group (gloo on CPU),
``DistributedAttention(local_attention, sequence_process_group, scatter_idx, gather_idx)`` around
any local attention, this rank's slice of the sequence ``[b, s/p, h, d]``, the loss summed over
the group's tokens. Run it either way:

    torchrun --nproc-per-node 2 examples/deepspeed_ulysses.py
    mpirun -n 2 python3 examples/deepspeed_ulysses.py      # torch >= 2 in both cases

It prints the loss of every step; python/torch_tests/test_drop_in.py checks them against the
same script with a plain torch.distributed all-to-all (DeepSpeed's algorithm) in place of ours,
and bench/deepspeed_compare.py against DeepSpeed itself (bit for bit the same losses and gradients).
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ulysses.torch import DistributedAttention


def init_distributed():
    """torchrun's environment, or mpirun's mapped onto it (what deepspeed.init_distributed does)."""
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def local_attention(q, k, v):
    """The local attention DeepSpeed users plug in: SDPA over the whole sequence, heads h/p."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


class Block(torch.nn.Module):
    """Pre-norm attention + MLP on [b, s/p, width]: attention sees the whole sequence."""

    def __init__(self, width, heads, attention_class, group):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )
        bshd = lambda q, k, v: local_attention(q, k, v).transpose(1, 2)  # noqa: E731  [b, s, h/p, d] back
        self.attn = attention_class(bshd, group, scatter_idx=2, gather_idx=1)

    def forward(self, x):
        b, n, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, width // self.heads).unbind(2)
        x = x + self.proj(self.attn(q, k, v, 0).reshape(b, n, width))  # batch_dim_idx=0
        return x + self.mlp(self.norm2(x))


def train(attention_class=DistributedAttention, group=None, steps=8, seq=64, width=64, heads=8):
    """Trains a 2-block model on one fixed random sequence; returns every step's loss."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(0)  # the same weights and data on every rank
    model = torch.nn.Sequential(*(Block(width, heads, attention_class, group) for _ in range(2)))
    head = torch.nn.Linear(width, 1)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    x, y = torch.randn(2, seq, width), torch.randn(2, seq)
    n = seq // p
    x, y = x[:, r * n : (r + 1) * n], y[:, r * n : (r + 1) * n]  # this rank's slice of the sequence
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        local = (head(model(x)).squeeze(-1) - y).pow(2).sum() / y.numel() / p  # this rank's share of the mean
        local.backward()
        loss = local.detach().clone()
        for t in [loss] + [q.grad for q in params]:  # sums over the group's tokens
            dist.all_reduce(t, group=group)
        opt.step()
        losses.append(float(loss))
    return losses


if __name__ == "__main__":
    init_distributed()
    losses = train()
    if dist.get_rank() == 0:
        print("losses:", " ".join(f"{x:.6f}" for x in losses))
    dist.destroy_process_group()
