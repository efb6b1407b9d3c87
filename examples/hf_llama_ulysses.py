"""A Hugging Face Llama trained with Ulysses context parallelism: attn_implementation="ulysses"
(ulysses.hf). Every rank holds the whole model and s/cp tokens of each sequence; each attention
runs between two all-to-alls. The model is tiny and random (no download) and learns a sentence.

    mpirun -n 2 python examples/hf_llama_ulysses.py [--steps 100] [--seq 128]

Needs torch >= 2 and transformers (pip install torch transformers). The losses are cp = 1's
(python/tests_hf: test_example.py); the greedy continuation is decoded on rank 0.
"""

import argparse

import torch
import ulysses
import ulysses.hf
from mpi4py import MPI
from transformers import LlamaConfig, LlamaForCausalLM

TEXT = b"Ulysses splits the heads, the ring splits the keys; both see the whole sequence. "


def train(mpi_comm, steps=100, seq=128):
    """Trains on `seq` bytes of TEXT over the ranks of `mpi_comm`; (losses, greedy bytes)."""
    sp = ulysses.hf.SequenceParallel(ulysses.Communicator(mpi_comm))
    torch.manual_seed(0)  # the same weights on every rank (attach checks that they are)
    config = LlamaConfig(
        vocab_size=256,  # bytes
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=seq,
    )
    model = sp.attach(LlamaForCausalLM(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.tensor(list((TEXT * (seq // len(TEXT) + 1))[:seq]))[None]  # the whole batch, on every rank
    losses = []
    for _ in range(steps):
        batch = sp.shard_batch(ids, labels=ids)  # this rank's tokens, global positions, shifted labels
        loss = sp.loss(model(**batch.inputs).logits, batch)  # over the valid tokens of all ranks
        optimizer.zero_grad()
        loss.backward()
        sp.reduce_gradients(model)  # the sum over the ranks: cp = 1's gradient
        optimizer.step()
        losses.append(loss.item())
    prompt = ids[:, :24]
    tokens = sp.generate(model, prompt, max_new_tokens=40, do_sample=False)  # every rank, not sharded
    return losses, bytes(tokens[0, prompt.shape[1] :].tolist())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    losses, text = train(MPI.COMM_WORLD, args.steps, args.seq)
    if MPI.COMM_WORLD.rank == 0:
        print(f"cp = {MPI.COMM_WORLD.size}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
        print(f"greedy continuation: {text.decode(errors='replace')!r}")


if __name__ == "__main__":
    main()
