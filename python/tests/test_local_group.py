"""ulysses.local_group: every strategy on 1 to 4 ranks that are threads of this one process,
forward and gradients against float64 textbook attention; per-rank arguments; a failing rank
releases the others and its own exception reaches the caller."""

import pytest
import torch
import ulysses
import ulysses.torch as ut
from conftest import configs, reference, rel, sharded_forward_backward
from mpi4py import MPI

# One process is the point: under mpirun only the first rank's run would add anything.
pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="local groups run in one process")


def forward_backward(comm, strategy, sizes, causal, gq, gk, gv, gdout):
    """This rank's out, dq, dk, dv and the global positions of its tokens."""
    pos = ulysses.positions(gq.shape[1], comm, strategy, causal, cp_sizes=sizes)
    return sharded_forward_backward(comm, strategy, sizes, causal, gq, gk, gv, gdout), pos


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_every_strategy_matches_float64(n, causal):
    torch.manual_seed(n)
    b, s, h, hkv, d = 2, 6 * n + 1, 4, 2, 8  # s % n != 0: ranks hold different counts
    gq, gdout = torch.randn(b, s, h, d), torch.randn(b, s, h, d)
    gk, gv = torch.randn(b, s, hkv, d), torch.randn(b, s, hkv, d)
    want = reference(gq, gk, gv, gdout, causal)
    group = ulysses.local_group(n)
    for strategy, sizes in configs(n):
        ranks = group.run(lambda comm: forward_backward(comm, strategy, sizes, causal, gq, gk, gv, gdout))
        for r, (got, pos) in enumerate(ranks):
            errs = [rel(x, ref[:, pos]) for x, ref in zip(got, want)]
            assert errs[0] <= 1e-5 and max(errs[1:]) <= 1e-5, (strategy, sizes, r, errs)


def test_per_rank_arguments_and_counters():
    group = ulysses.local_group(3, threads=1)

    def rank_main(comm, x):
        attn = ut.ContextParallelAttention(comm, "a2a")
        comm.reset_counters()
        attn(x, x, x)
        return comm.backend, comm.rank, x.shape[1], comm.counters()

    gx = torch.randn(1, 9, 3, 4)
    got = group.run(rank_main, [gx[:, 3 * r : 3 * r + 3] for r in range(3)])
    assert [g[:3] for g in got] == [("local", r, 3) for r in range(3)]
    # Ulysses' forward: q, k, v in and the output back, (s/cp)·h·d·(cp-1)/cp elements each.
    sent = [sum(c["bytes_sent"] for op, c in g[3].items() if op != "validate") for g in got]
    assert sent == [4 * 3 * 1 * 4 * 2 * 4] * 3, got


def test_a_failing_rank_releases_the_others_and_raises_its_own_error():
    released = {}

    def rank_main(comm):
        if comm.rank == 1:
            raise ValueError("rank 1 gives up")
        try:
            comm._impl.agree("")  # a collective rank 1 never joins
        except ulysses.Error as e:
            released[comm.rank] = str(e)
            raise

    with pytest.raises(ValueError, match="rank 1 gives up"):
        ulysses.local_group(3).run(rank_main)
    assert sorted(released) == [0, 2]
    assert all("rank 1 of the local world failed: ValueError: rank 1 gives up;" in m for m in released.values()), (
        released
    )


def test_bad_sizes_are_errors():
    with pytest.raises(ulysses.Error, match="local_group size"):
        ulysses.local_group(0)
    with pytest.raises(ulysses.Error, match="2 entries for 3 ranks"):
        ulysses.local_group(3).run(lambda comm, x: x, [1, 2])
    with pytest.raises(ulysses.Error, match="unshard needs an MPI communicator"):
        ulysses.local_group(1).run(lambda comm: ulysses.unshard(torch.zeros(1, 2, 1, 1), comm))


ENDED = "the local group of 2 ranks has ended"


def test_a_communicator_used_after_its_group_ended_raises():
    saved = ulysses.local_group(2).run(lambda comm: comm)
    for comm in saved:
        assert (comm.rank, comm.size) in [(0, 2), (1, 2)]  # still answers what it was
        with pytest.raises(ulysses.Error, match=ENDED):
            comm._impl.agree("")
        with pytest.raises(ulysses.Error, match=ENDED):
            ulysses.positions(8, comm, "a2a", True)


def test_a_module_used_after_its_group_ended_raises():
    x = torch.randn(1, 4, 2, 4)
    modules = ulysses.local_group(2).run(lambda comm: ut.ContextParallelAttention(comm, "a2a"))
    with pytest.raises(ulysses.Error, match=ENDED):
        modules[0](x, x, x)


def test_a_one_rank_group_ends_too():
    [(comm, attn)] = ulysses.local_group(1).run(lambda comm: (comm, ut.ContextParallelAttention(comm, "p2p")))
    x = torch.randn(1, 4, 2, 4)
    with pytest.raises(ulysses.Error, match="the local group of 1 ranks has ended"):
        attn(x, x, x)
    with pytest.raises(ulysses.Error, match="the local group of 1 ranks has ended"):
        comm._impl.agree("")


def test_a_context_used_after_its_group_ended_raises():
    def rank_main(comm):
        attn = ut.ContextParallelAttention(comm, "a2a")
        x = torch.randn(1, 4, 2, 4, requires_grad=True)
        return attn(x, x, x)

    outs = ulysses.local_group(2).run(rank_main)
    with pytest.raises(ulysses.Error, match=ENDED):
        outs[0].sum().backward()  # the backward's all-to-alls need the ended group


@pytest.mark.parametrize("how", ["returns", "raises"])
def test_a_rank_that_leaves_ends_the_group_at_once_naming_it(how):
    def rank_main(comm):
        if comm.rank == 1:
            if how == "raises":
                raise KeyError("rank 1 leaves")
            return "done"
        comm._impl.agree("")  # rank 1 never joins; the default deadline is 1800 s
        return "unreachable"

    expected = "rank 1 gives up" if how == "raises" else "rank 1 of the local world failed: it returned from its"
    with pytest.raises((ulysses.Error, KeyError), match="rank 1") as info:
        ulysses.local_group(2).run(rank_main)
    if how == "returns":
        assert info.type is ulysses.Error and expected in str(info.value), str(info.value)
        assert "local rank 0 of 2 waits for it in allreduce" in str(info.value)


def test_the_watchdog_deadline_is_settable_and_shared():
    def rank_main(comm):
        before = comm.timeout
        comm.timeout = 7.5
        return before, comm.timeout

    assert ulysses.local_group(2).run(rank_main) == [(1800.0, 7.5)] * 2
    assert ulysses.local_group(2, timeout=0).run(lambda comm: comm.timeout) == [0.0, 0.0]
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ulysses.Error, match="timeout"):
            ulysses.local_group(1, timeout=bad)


def test_the_watchdog_fires_on_a_short_deadline():
    def rank_main(comm):
        if comm.rank == 0:
            comm._impl.agree("")  # rank 1 is still in its function, so only the deadline ends this
        else:
            import time

            while not ulysses_released[0]:
                time.sleep(0.01)

    ulysses_released = [False]

    def rank0_then_release(comm):
        try:
            rank_main(comm)
        finally:
            ulysses_released[0] = True

    with pytest.raises(ulysses.Error, match="waited 0.2 s \\(the timeout\\) for allreduce"):
        ulysses.local_group(2, timeout=0.2).run(rank0_then_release)
