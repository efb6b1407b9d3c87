"""examples/torch_train.py: the loss at cp = world size equals the loss at cp = 1."""

import pathlib
import runpy

import pytest
from conftest import agreed_max
from mpi4py import MPI

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch_train.py"


@pytest.mark.parametrize("strategy", ["a2a", "p2p"])
def test_cp_loss_equals_single_rank_loss(comm, strategy):
    train = runpy.run_path(str(EXAMPLE))["train"]
    alone = train(MPI.COMM_SELF, steps=10, strategy=strategy)
    together = train(MPI.COMM_WORLD, steps=10, strategy=strategy)
    worst = agreed_max(comm, max(abs(a - b) / abs(a) for a, b in zip(alone, together)))
    assert worst < 1e-5, (alone, together)
    assert together[-1] < together[0]  # it learns
