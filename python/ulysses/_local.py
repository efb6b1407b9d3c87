"""Ranks as threads of this process: the library without mpirun (tests, notebooks, learning)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from . import _ulysses
from ._agree import integer, seconds_value
from ._comm import MAX_THREADS, Communicator

MAX_RANKS = 1024


class LocalGroup:
    """``size`` ranks, each a thread of this process with its own ``ulysses.Communicator``
    (backend ``"local"``): everything that runs over MPI runs here, byte counters included.

    ``run(fn, *per_rank)`` calls ``fn(comm, *args)`` on every rank at once, ``args`` being
    element ``comm.rank`` of each list in ``per_rank`` (e.g. each rank's tensors), and returns
    the results in rank order. The ranks' C++ work runs in parallel (the library releases the
    GIL while it computes or waits). An exception on a rank releases the ranks waiting on it
    (with ``ulysses.Error``) and is raised by ``run`` once every rank has ended. ``threads``
    sets each rank's kernel threads; by default this process's threads shared out. ``timeout``
    sets the watchdog's deadline in seconds (default 1800; 0: none): a rank waiting longer fails
    the group with a message naming the operation. A rank whose ``fn`` returns while another
    still waits for it in a collective fails the group at once, naming that rank. A rank's
    ``comm`` (and what is built on it) works while ``fn`` runs; used after ``run`` returns it
    raises ``ulysses.Error`` saying the group has ended: return results, not modules.

    >>> import ulysses
    >>> ulysses.local_group(3).run(lambda comm: (comm.rank, comm.size))
    [(0, 3), (1, 3), (2, 3)]
    """

    def __init__(self, size: int, threads: Optional[int] = None, timeout: Optional[float] = None) -> None:
        self.size = integer("local_group size", size, 1, MAX_RANKS)
        self.threads = None if threads is None else integer("threads", threads, 1, MAX_THREADS)
        self.timeout = None if timeout is None else seconds_value("timeout", timeout)

    def run(self, fn: Callable[..., Any], *per_rank: Sequence[Any]) -> List[Any]:
        """``fn(comm, *args)`` on every rank at once; the results in rank order (see the class)."""
        for i, values in enumerate(per_rank):
            if len(values) != self.size:
                raise _ulysses.Error(f"run: argument {i + 1} has {len(values)} entries for {self.size} ranks")

        def rank_main(impl: Any) -> Any:
            if self.threads is not None:
                _ulysses.set_threads(self.threads)
            comm = Communicator._of(impl)
            if self.timeout is not None:
                comm.timeout = self.timeout
            return fn(comm, *(values[comm.rank] for values in per_rank))

        return _ulysses.run_local(self.size, rank_main)


def local_group(size: int, threads: Optional[int] = None, timeout: Optional[float] = None) -> LocalGroup:
    """A group of ``size`` ranks as threads of this process (see ``LocalGroup``)."""
    return LocalGroup(size, threads, timeout)
