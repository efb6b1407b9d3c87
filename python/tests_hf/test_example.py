"""examples/hf_llama_ulysses.py: its losses at cp = world size equal cp = 1's, and so do its
greedy tokens."""

import pathlib
import runpy

from conftest import gathered
from mpi4py import MPI

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "hf_llama_ulysses.py"


def test_example_matches_cp1(comm):
    train = runpy.run_path(str(EXAMPLE))["train"]
    alone, alone_text = train(MPI.COMM_SELF, steps=6, seq=64)
    together, text = train(MPI.COMM_WORLD, steps=6, seq=64)
    worst = max(abs(a - b) / abs(a) for a, b in zip(alone, together))
    assert max(gathered(comm, worst)) < 1e-5, (alone, together)
    assert all(gathered(comm, text == alone_text))
    assert together[-1] < together[0]  # it learns
