"""Training and generation through attn_implementation="ulysses" equal cp = 1: the losses and
gradients of a few SGD steps, a padded batch against its sequences unpadded, greedy tokens."""

import pytest
import torch
import torch.nn.functional as F
from conftest import batch, errors_on_every_rank, gathered, pair, rel, worst_grad

TOLERANCE = 1e-5  # relative, float32


def train_both(kind, comm, ids, steps):
    """`steps` SGD steps of the reference (transformers' own loss) and of the sharded model;
    returns both models, the sharded losses and the worst relative difference of any loss or
    gradient."""
    ref, sp, model = pair(kind, comm)
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in (ref, model)]
    losses, worst = [], 0.0
    for _ in range(steps):
        for opt in opts:
            opt.zero_grad()
        want = ref(input_ids=ids, labels=ids).loss
        want.backward()
        sharded = sp.shard_batch(ids, labels=ids)
        loss = sp.loss(model(**sharded.inputs).logits, sharded)
        loss.backward()
        sp.reduce_gradients(model)
        worst = max(worst, rel(loss.detach(), want.detach()), worst_grad(model, ref))
        losses.append(loss.item())
        for opt in opts:
            opt.step()
    return ref, sp, model, losses, worst


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_training_matches_cp1(comm, kind):
    # 30 tokens: uneven shards at cp = 4 (8, 8, 7, 7); 4 heads over 2 KV heads: at cp = 4 each
    # rank holds one query head and a KV head shared with its neighbour.
    _, _, _, losses, worst = train_both(kind, comm, batch(), steps=3)
    assert max(gathered(comm, worst)) < TOLERANCE
    assert losses[-1] < losses[0]  # it learns
    assert len(set(gathered(comm, tuple(losses)))) == 1  # every rank reports the whole batch's loss


def padded(ids, lengths, side):
    """ids with each row cut to its length and padded (token 0) on `side`; the 0/1 mask."""
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        first = ids.shape[1] - n if side == "left" else 0
        mask[row, first : first + n] = 1
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_unpadded(comm, side):
    ref, sp, model = pair("llama", comm)
    ids, mask = padded(batch(), [30, 21], side)
    sharded = sp.shard_batch(ids, attention_mask=mask, labels=ids)
    logits = model(**sharded.inputs).logits
    loss = sp.loss(logits, sharded)
    loss.backward()
    sp.reduce_gradients(model)
    whole = torch.cat(gathered(comm, logits.detach()), dim=1)  # a2a shards are contiguous, in rank order

    total, count, worst = 0.0, 0, 0.0
    for row in range(ids.shape[0]):
        alone = ids[row][mask[row] == 1][None]  # the sequence without its padding, alone
        want = ref(input_ids=alone).logits
        worst = max(worst, rel(whole[row][mask[row] == 1], want[0].detach()))
        total = total + F.cross_entropy(want[0, :-1], alone[0, 1:], reduction="sum")
        count += alone.shape[1] - 1
    (total / count).backward()
    worst = max(worst, rel(loss.detach(), (total / count).detach()), worst_grad(model, ref))
    assert max(gathered(comm, worst)) < TOLERANCE


@pytest.mark.parametrize("kind,length", [("llama", 12), ("qwen2", 14), ("llama", 3)])
def test_greedy_generation_matches_cp1(comm, kind, length):
    """sp.generate's prefill runs sharded (each rank's tokens through the ulysses attention, the
    keys and values gathered into one cache), then decodes on every rank: the tokens of cp = 1's
    model.generate, every step's logits within 1e-5. Qwen2's 14-token prompt overflows its
    sliding window of 8; 3 tokens leave fewer than cp = 4 to prefill sharded (then unsharded)."""
    ref, sp, model, _, worst = train_both(kind, comm, batch(), steps=2)
    prompt, mask = padded(batch(seed=2, seq=length), [length, length - 2], "left")
    args = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    args.update(return_dict_in_generate=True, output_logits=True)
    want = ref.generate(prompt, **args)
    sp.comm.reset_counters()
    got = sp.generate(model, prompt, **args)
    sharded = length - 1 >= sp.size
    layers = model.config.num_hidden_layers
    prefills = sp.comm.counters().get("seq_to_head", {}).get("calls", 0)
    assert prefills == (layers + 1 if sharded else 0)  # one all-to-all a layer, one gathers the cache
    worst = max([worst] + [rel(a, b) for a, b in zip(got.logits, want.logits)])
    assert max(gathered(comm, worst)) < 1e-5
    assert all(gathered(comm, torch.equal(got.sequences, want.sequences)))
    assert model.config._attn_implementation == "ulysses"  # restored after generate


def test_generate_fills_its_own_cache(comm):
    ref, sp, model = pair("llama", comm)
    messages = errors_on_every_rank(comm, lambda: sp.generate(model, batch(), past_key_values=object()))
    assert "SequenceParallel.generate fills the KV cache itself: pass no past_key_values" in messages[0]


def test_gradient_checkpointing_matches_cp1(comm):
    # The backward recomputes each layer's forward, all-to-alls and mask included.
    ref, sp, model = pair("llama", comm)
    for m in (ref, model):
        m.gradient_checkpointing_enable()
        m.train()
    ids = batch()
    want = ref(input_ids=ids, labels=ids, use_cache=False).loss
    want.backward()
    sharded = sp.shard_batch(ids, labels=ids)
    loss = sp.loss(model(**sharded.inputs).logits, sharded)
    loss.backward()
    sp.reduce_gradients(model)
    worst = max(rel(loss.detach(), want.detach()), worst_grad(model, ref))
    assert max(gathered(comm, worst)) < TOLERANCE
