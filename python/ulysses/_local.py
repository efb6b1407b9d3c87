"""Ranks as threads of this process: the library without mpirun (tests, notebooks, learning)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from . import _ulysses
from ._agree import integer
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
    sets each rank's kernel threads; by default this process's threads shared out. A rank's
    ``comm`` (and what is built on it) is valid while ``fn`` runs: return results, not modules.

    >>> import ulysses
    >>> ulysses.local_group(3).run(lambda comm: (comm.rank, comm.size))
    [(0, 3), (1, 3), (2, 3)]
    """

    def __init__(self, size: int, threads: Optional[int] = None) -> None:
        self.size = integer("local_group size", size, 1, MAX_RANKS)
        self.threads = None if threads is None else integer("threads", threads, 1, MAX_THREADS)

    def run(self, fn: Callable[..., Any], *per_rank: Sequence[Any]) -> List[Any]:
        """``fn(comm, *args)`` on every rank at once; the results in rank order (see the class)."""
        for i, values in enumerate(per_rank):
            if len(values) != self.size:
                raise _ulysses.Error(f"run: argument {i + 1} has {len(values)} entries for {self.size} ranks")

        def rank_main(impl: Any) -> Any:
            if self.threads is not None:
                _ulysses.set_threads(self.threads)
            comm = Communicator._of(impl)
            return fn(comm, *(values[comm.rank] for values in per_rank))

        return _ulysses.run_local(self.size, rank_main)


def local_group(size: int, threads: Optional[int] = None) -> LocalGroup:
    """A group of ``size`` ranks as threads of this process (see ``LocalGroup``)."""
    return LocalGroup(size, threads)
