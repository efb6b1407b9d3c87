# ulysses.hf under mpirun (tests/hf_test.sh: a Python with torch >= 2 and transformers). Every
# rank runs every test in the same order and builds the cp = 1 reference itself: transformers'
# own sdpa attention on the whole, unsharded batch, from the same seed.
import copy

import pytest
import torch
import ulysses
import ulysses.hf
from mpi4py import MPI
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96

torch.set_num_threads(1)  # ranks share 2 cores


@pytest.fixture(scope="session")
def comm():
    return ulysses.Communicator(MPI.COMM_WORLD, threads=1)


def gathered(comm, x):
    """Every rank's x, in rank order."""
    return comm.mpi.allgather(x)


def tiny(kind, heads=4, kv_heads=2, seed=0):
    """A random 2-layer model in float32 with transformers' sdpa attention (no download). Qwen2's
    second layer has a sliding window of 8 tokens, shorter than the test sequences."""
    torch.manual_seed(seed)
    sizes = dict(
        vocab_size=VOCAB,
        hidden_size=8 * heads,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**sizes))
    config = Qwen2Config(**sizes, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    return Qwen2ForCausalLM(config)


def pair(kind, comm):
    """(the cp = 1 reference, the same model attached to a SequenceParallel over comm)."""
    ref = tiny(kind)
    sp = ulysses.hf.SequenceParallel(comm)
    return ref, sp, sp.attach(copy.deepcopy(ref))


def batch(seed=1, rows=2, seq=30):
    return torch.randint(0, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(seed))


def rel(x, ref):
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def worst_grad(model, ref):
    """The largest relative difference of a parameter's gradient from the reference's."""
    theirs = dict(ref.named_parameters())
    return max(rel(p.grad, theirs[name].grad) for name, p in model.named_parameters())


def errors_on_every_rank(comm, fn):
    """fn() must raise ulysses.Error on this rank; returns every rank's message."""
    with pytest.raises(ulysses.Error) as info:
        fn()
    return gathered(comm, str(info.value))
