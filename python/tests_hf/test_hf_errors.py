"""Bad input to ulysses.hf: one clear ulysses.Error, the same on every rank, never a hang."""

import copy

import torch
import ulysses
import ulysses.hf
from conftest import batch, errors_on_every_rank, pair, tiny
from test_hf_training import padded


def test_heads_that_do_not_fit_the_group(comm):
    heads = comm.size - 1  # one rank would hold no query head
    sp = ulysses.hf.SequenceParallel(comm)
    messages = errors_on_every_rank(comm, lambda: sp.attach(tiny("llama", heads=heads, kv_heads=heads)))
    assert len(set(messages)) == 1
    expected = f"LlamaForCausalLM: num_attention_heads ({heads}) must be at least the group's size ({comm.size})"
    assert expected in messages[0]


def test_parameters_that_differ_between_ranks(comm):
    sp = ulysses.hf.SequenceParallel(comm)
    messages = errors_on_every_rank(comm, lambda: sp.attach(tiny("llama", seed=comm.rank)))
    assert len(set(messages)) == 1 and "the model's parameters (sha256) differ between ranks" in messages[0]


def test_padding_that_differs_between_ranks(comm):
    ref, sp, model = pair("llama", comm)
    ids, mask = padded(batch(), [30, 21 - comm.rank], "left")  # rank r pads r tokens more
    messages = errors_on_every_rank(comm, lambda: sp.shard_batch(ids, attention_mask=mask, labels=ids))
    assert len(set(messages)) == 1
    assert "shard_batch's batches (input_ids, attention_mask, labels, position_ids) differ between ranks" in messages[0]
    assert "rank 0 has valid tokens per row [30, 21]" in messages[0]
    assert "rank 1 has valid tokens per row [30, 20]" in messages[0]

    # The same masks given to the model directly: its first attention stops every rank.
    inputs = sp.shard_batch(batch()).inputs
    messages = errors_on_every_rank(comm, lambda: model(**inputs, attention_mask=mask))
    assert len(set(messages)) == 1 and "attention masks differ between ranks" in messages[0]


def test_a_sharded_attention_mask(comm):
    _, sp, model = pair("llama", comm)
    ids, mask = padded(batch(), [30, 21], "left")
    inputs = sp.shard_batch(ids, attention_mask=mask).inputs
    inputs["attention_mask"] = ulysses.shard(mask, comm, "a2a", causal=True, dim=1)  # this rank's part only
    messages = errors_on_every_rank(comm, lambda: model(**inputs))
    assert len(set(messages)) == 1
    assert "attention_mask must be the global padding mask [b, s] = [2, 30] of the whole sequence" in messages[0]


def test_float16(comm):
    _, sp, model = pair("llama", comm)
    inputs = sp.shard_batch(batch()).inputs
    messages = errors_on_every_rank(comm, lambda: model.to(torch.float16)(**inputs))
    assert len(set(messages)) == 1 and "query has dtype torch.float16" in messages[0]


def test_generate_through_the_ulysses_attention(comm):
    _, sp, model = pair("llama", comm)
    messages = errors_on_every_rank(comm, lambda: model.generate(batch(), max_new_tokens=2, do_sample=False))
    assert len(set(messages)) == 1 and "the ulysses attention keeps no KV cache" in messages[0]


def test_packed_position_ids(comm):
    sp = ulysses.hf.SequenceParallel(comm)
    packed = torch.cat([torch.arange(20), torch.arange(10)]).expand(2, 30)
    messages = errors_on_every_rank(comm, lambda: sp.shard_batch(batch(), position_ids=packed))
    assert len(set(messages)) == 1 and "position_ids restart or jump inside a row (packed sequences)" in messages[0]


def test_a_model_no_group_attached(comm):
    model = copy.deepcopy(tiny("llama"))
    model.set_attn_implementation("ulysses")
    messages = errors_on_every_rank(comm, lambda: model(input_ids=batch()))
    assert len(set(messages)) == 1 and "no SequenceParallel attached: call sp.attach(model)" in messages[0]


def test_not_a_group(comm):
    messages = errors_on_every_rank(comm, lambda: ulysses.hf.SequenceParallel("world"))
    assert "SequenceParallel's group must be a torch.distributed ProcessGroup" in messages[0]
