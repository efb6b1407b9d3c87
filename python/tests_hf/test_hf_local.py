"""ulysses.hf over ranks that are threads of one process (ulysses.local_group): a training step
equals cp = 1's, as under mpirun."""

import copy

import ulysses
import ulysses.hf
from conftest import batch, rel, tiny, worst_grad


def test_local_group_step_matches_cp1():
    ref, ids = tiny("qwen2"), batch()
    want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    models = [copy.deepcopy(ref) for _ in range(2)]  # built here: the ranks' threads share torch's RNG

    def rank_main(comm, model):
        sp = ulysses.hf.SequenceParallel(comm)
        sp.attach(model)
        sharded = sp.shard_batch(ids, labels=ids)
        loss = sp.loss(model(**sharded.inputs).logits, sharded)
        loss.backward()
        sp.reduce_gradients(model)
        return loss.detach(), worst_grad(model, ref)

    for loss, worst in ulysses.local_group(2).run(rank_main, models):
        assert rel(loss, want.detach()) < 1e-5 and worst < 1e-5
