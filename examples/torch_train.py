"""A small Llama-style model (RMSNorm, RoPE on global positions, GQA, SwiGLU) in plain
PyTorch, trained with context parallelism: every rank holds seq/cp tokens of every sequence
and the full weights; attention is ulysses' ContextParallelAttention.

    mpirun -n 2 python3 examples/torch_train.py [--strategy a2a|p2p|all_gather] [--steps 10]

The loss at cp = 2 (or 4) equals the loss at cp = 1 (tests/python: test_example.py).
"""

import argparse

import torch
import torch.nn.functional as F
import ulysses
import ulysses.torch as ut
from mpi4py import MPI


class RMSNorm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rope(x, pos):  # x [b, s, h, d]; pos [s] global positions
    d = x.shape[-1]
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = pos[:, None].float() * freq[None, :]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, width, heads, kv_heads, head_dim, hidden, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.wq = torch.nn.Linear(width, heads * head_dim, bias=False)
        self.wkv = torch.nn.Linear(width, 2 * kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(heads * head_dim, width, bias=False)
        self.w13 = torch.nn.Linear(width, 2 * hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, width, bias=False)
        self.attention = attention

    def forward(self, x, pos):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = rope(self.wq(h).view(b, s, self.heads, self.head_dim), pos)
        k, v = self.wkv(h).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        x = x + self.wo(self.attention(q, rope(k, pos), v).reshape(b, s, -1))
        gate, up = self.w13(self.norm2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(torch.nn.Module):
    def __init__(self, attention, vocab=64, width=64, layers=2, heads=4, kv_heads=2, head_dim=16, hidden=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            Block(width, heads, kv_heads, head_dim, hidden, attention) for _ in range(layers)
        )
        self.norm, self.head = RMSNorm(width), torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens, pos):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, pos)
        return self.head(self.norm(x))


def train(mpi_comm, steps=10, strategy="a2a", seq=128, batch=2, seed=0, log=None):
    """Losses of `steps` AdamW steps on one fixed synthetic batch, under context parallelism
    over `mpi_comm` (every rank of it gets the same numbers)."""
    comm = ulysses.Communicator(mpi_comm)
    torch.manual_seed(seed)
    model = Llama(ut.ContextParallelAttention(comm, strategy, causal=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(0, 64, (batch, seq + 1), generator=g)
    tokens = ulysses.shard(data[:, :-1], comm, strategy, causal=True)
    labels = ulysses.shard(data[:, 1:], comm, strategy, causal=True)
    pos = ulysses.positions(seq, comm, strategy, causal=True)
    losses = []
    for step in range(steps):
        logits = model(tokens, pos)
        local = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
        opt.zero_grad()
        (local / (batch * seq)).backward()
        for p in model.parameters():  # weights are replicated: gradients add over the ranks' tokens
            mpi_comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
        opt.step()
        losses.append(mpi_comm.allreduce(local.item(), op=MPI.SUM) / (batch * seq))
        if log and mpi_comm.Get_rank() == 0:
            log(f"step {step + 1}: loss {losses[-1]:.6f}")
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="a2a", choices=ulysses.strategy_names())
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    train(MPI.COMM_WORLD, args.steps, args.strategy, args.seq, log=print)
