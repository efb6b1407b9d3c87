"""ulysses.balance: the plan for a variable-length step from Python equals the library's rules
(static round-robin, dynamic splitting the long tail), agrees on every rank, and bad input
raises ulysses.Error with the library's message."""

import pytest
import ulysses
from mpi4py import MPI

MODEL = dict(heads=8, head_dim=64, layers=2, gemm_flops_per_token=6.0 * 12 * 512 * 512 * 2)


def test_static_deals_round_robin():
    p = ulysses.balance([1024, 2048, 4096], 4, "static", dp=2, **MODEL)
    assert p.groups == [(0, 2), (2, 2), (0, 2)]
    assert p.sequences_of_rank == [[0, 2], [0, 2], [1], [1]]
    # No waiting under static: the step is the busiest group's sum of sequence times.
    assert p.step_seconds == pytest.approx(p.sequence_seconds[0] + p.sequence_seconds[2], rel=1e-12)
    assert p.rank_busy_seconds == p.rank_seconds


def test_dynamic_splits_the_long_tail_and_beats_both_static_layouts():
    lengths = [16384] + [512] * 32
    d = ulysses.balance(lengths, 2, **MODEL)
    assert d.policy == "dynamic" and d.groups[0] == (0, 2)
    assert all(size == 1 for _, size in d.groups[1:])
    for dp in (1, 2):
        assert d.step_seconds < ulysses.balance(lengths, 2, "static", dp=dp, **MODEL).step_seconds
    assert d.step_seconds <= ulysses.balance(lengths, 2, "pow2", **MODEL).step_seconds
    assert d.step_seconds == pytest.approx(max(d.rank_seconds), rel=1e-12)


def test_every_rank_computes_the_same_plan():
    comm = MPI.COMM_WORLD
    p = ulysses.balance([300, 5000, 700, 12000, 64], comm, **MODEL)
    assert len(p.rank_seconds) == comm.Get_size()
    assert comm.allgather(p.groups) == [p.groups] * comm.Get_size()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lengths=[], world=2), "the step has no sequences"),
        (dict(lengths=[8, 0], world=2), "sequence 1 has length 0"),
        (dict(lengths=[8], world=4, dp=3), "dp 3 does not divide the world size 4"),
        (dict(lengths=[8], world=2, policy="best"), "'best': expected static, pow2 or dynamic"),
    ],
)
def test_bad_input_raises_the_librarys_error(kwargs, message):
    lengths, world = kwargs.pop("lengths"), kwargs.pop("world")
    with pytest.raises(ulysses.Error, match=message):
        ulysses.balance(lengths, world, **{**MODEL, **kwargs})


@pytest.mark.parametrize(
    "lengths, world, kwargs, message",
    [
        ([8], 2.0, {}, "world_or_comm must be a number of ranks or a communicator, got 2.0"),
        ([8], "2", {}, "must be a number of ranks or a communicator"),
        ([8], True, {}, "must be a number of ranks or a communicator"),
        ([8.5], 2, {}, "a length must be an integer"),
        (8, 2, {}, "lengths must be a sequence"),
        ([8], 2, dict(gemm_flops_per_token=float("nan")), "gemm_flops_per_token"),
        ([8], 2, dict(gemm_flops_per_token=float("inf")), "gemm_flops_per_token"),
        ([8], 2, dict(gemm_flops_per_token=-1.0), "gemm_flops_per_token"),
        ([8], 2, dict(tflops=float("nan")), "tflops"),
        ([8], 2, dict(efficiency=1.5), "efficiency in \\(0, 1\\]"),
        ([8], 2, dict(dp=1.0), "dp must be an integer"),
        ([8], 2, dict(policy=None), "policy must be a string"),
    ],
)
def test_bad_argument_types_and_values_are_the_librarys_error(lengths, world, kwargs, message):
    with pytest.raises(ulysses.Error, match=message):
        ulysses.balance(lengths, world, **{**MODEL, **kwargs})
