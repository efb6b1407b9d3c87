"""examples/deepspeed_ulysses.py, a DeepSpeed-Ulysses training script with one import changed,
trains to the same losses (1e-6 relative, float32) as the same script with DeepSpeed's algorithm
written over plain torch.distributed (DeepSpeed itself is not installed in CI), under torchrun and
under mpirun; under mpirun also over an MPI communicator."""

import pathlib
import runpy

import torch
import torch.distributed as dist
from conftest import agreed_ok, launcher

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "deepspeed_ulysses.py"


def _a2a(group, x, to_heads):
    """DeepSpeed's even-heads all-to-all on [b, n, h, d]: heads scattered, sequence gathered
    (to_heads), or the way back; one all_to_all_single over a [p, ...] contiguous buffer."""
    p = dist.get_world_size(group)
    b, n, h, d = x.shape
    if to_heads:
        send = x.reshape(b, n, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()
    else:
        send = x.reshape(b, p, n // p, h, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    if to_heads:
        return recv.permute(1, 0, 2, 3, 4).reshape(b, p * n, h // p, d)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, n // p, p * h, d)


class _RefAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, to_heads):
        ctx.group, ctx.to_heads = group, to_heads
        return _a2a(group, x, to_heads)

    @staticmethod
    def backward(ctx, grad):
        return None, _a2a(ctx.group, grad.contiguous(), not ctx.to_heads), None


class ReferenceDistributedAttention(torch.nn.Module):
    """DeepSpeed's DistributedAttention for [b, s/p, h, d] (batch_dim_idx=0): three all-to-alls
    in, the local attention, one out."""

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=1):
        super().__init__()
        self.local_attn, self.group = local_attention, sequence_process_group

    def forward(self, q, k, v, batch_dim_idx):
        assert batch_dim_idx == 0
        q, k, v = (_RefAllToAll.apply(self.group, x, True) for x in (q, k, v))
        return _RefAllToAll.apply(self.group, self.local_attn(q, k, v), False)


def rel_diff(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_one_import_same_losses():
    example = runpy.run_path(str(EXAMPLE))
    ours = example["train"]()
    theirs = example["train"](ReferenceDistributedAttention)
    ok = rel_diff(ours, theirs) <= 1e-6 and ours[-1] < ours[0]  # the same losses, and it learns
    if launcher() == "mpirun":  # the same script over MPI's transport
        import ulysses
        from mpi4py import MPI

        mpi = ulysses.Communicator(MPI.COMM_WORLD)
        over_mpi = lambda attn, group, **kw: example["DistributedAttention"](attn, mpi, **kw)  # noqa: E731
        ok = ok and rel_diff(example["train"](over_mpi), theirs) <= 1e-6
    assert agreed_ok(ok), (ours, theirs)
