"""The communicator a context-parallel group runs on: made from an mpi4py communicator, from a
torch.distributed group (``Communicator.from_torch``), or a rank of a local group
(``ulysses.local_group``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import _ulysses
from ._agree import agreed, integer, seconds_value

MAX_THREADS = 1024  # the CLI's --threads limit


class Communicator:
    """A context-parallel group: a duplicate of ``mpi_comm`` (collective over it).

    Any mpi4py communicator works, e.g. one CP group of a larger data-parallel world from
    ``MPI.COMM_WORLD.Split(color, key)``. ``threads`` (1 to 1024) sets the kernels' OpenMP
    threads per rank; by default the node's cores divided by the ranks of ``mpi_comm`` on this
    node. A bad ``threads`` on any rank raises the same ``ulysses.Error`` on every rank.

    >>> from mpi4py import MPI
    >>> import ulysses
    >>> comm = ulysses.Communicator(MPI.COMM_SELF, threads=1)
    >>> comm.rank, comm.size
    (0, 1)
    """

    def __init__(self, mpi_comm: Any, threads: Optional[int] = None) -> None:
        from mpi4py import MPI  # noqa: F401  (initialises MPI if the caller has not)

        self.mpi, self.group = mpi_comm, None
        self._impl = _ulysses.Communicator(mpi_comm.py2f())
        self._set_threads(threads)

    @classmethod
    def _of(cls, impl: Any) -> "Communicator":
        """Wraps a communicator the library made (a local group's rank): no MPI, threads as they are."""
        comm = cls.__new__(cls)
        comm.mpi, comm.group, comm._impl = None, None, impl
        return comm

    @classmethod
    def from_torch(cls, group: Any = None, threads: Optional[int] = None) -> "Communicator":
        """The communicator of a ``torch.distributed`` group (None: the default group), backend
        ``"torch"``: how programs launched by ``torchrun`` run without MPI. One per group (modules
        of every layer share it), ``threads`` as for MPI. Every call is collective over the default
        group (one small all-gather), every process passing its own group (as every process
        calls ``new_group``), a group used before too. Raises the same ``ulysses.Error`` on every rank,
        saying what to do, when this process is not in its group, a group cannot move CPU tensors
        (not gloo) or members of a group passed different groups; on this process alone when
        torch.distributed is not initialised."""
        from ._torch_comm import communicator

        comm = communicator(group, "group")
        comm._set_threads(threads)
        return comm

    @classmethod
    def _from_torch(cls, impl: Any, group: Any) -> "Communicator":
        """Wraps a torch-backed communicator (collective: agrees the group's members and threads)."""
        import torch.distributed as dist

        comm = cls._of(impl)
        comm.group = group
        impl.agree_identical("the process group's global ranks", repr(dist.get_process_group_ranks(group)))
        comm._set_threads(None)
        return comm

    def _set_threads(self, threads: Optional[int]) -> None:
        fallback = self._impl.default_threads()  # collective: on every rank, threads given or not
        n = agreed(self, lambda: None if threads is None else integer("threads", threads, 1, MAX_THREADS))
        _ulysses.set_threads(fallback if n is None else n)

    @property
    def backend(self) -> str:
        """ "mpi", "torch" (a torch.distributed group: ``from_torch``) or "local" (ranks as threads:
        ``ulysses.local_group``)."""
        return self._impl.backend

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._impl.rank

    @property
    def size(self) -> int:
        """The number of ranks in the group: the CP size."""
        return self._impl.size

    @property
    def timeout(self) -> float:
        """Seconds any wait of this rank may last (the watchdog's deadline; 0: none): past it the
        group fails with a message naming the operation and the rank. Default 1800.

        >>> from mpi4py import MPI
        >>> import ulysses
        >>> ulysses.Communicator(MPI.COMM_SELF, threads=1).timeout
        1800.0
        """
        return self._impl.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._impl.timeout = seconds_value("timeout", seconds)

    def counters(self) -> Dict[str, Dict[str, int]]:
        """Bytes, messages and calls this rank sent, per operation (since the last reset).

        >>> from mpi4py import MPI
        >>> import ulysses
        >>> ulysses.Communicator(MPI.COMM_SELF, threads=1).counters()
        {}
        """
        return self._impl.counters()

    def reset_counters(self) -> None:
        """Sets every operation's counters back to zero (on this rank only)."""
        self._impl.reset_counters()

    @property
    def collectives(self) -> int:
        """How many collectives this rank has entered since the group was made: the transfers and
        the agreements (a bad argument raised on every rank costs one), never reset. The count a
        latency-bound step pays for.

        >>> from mpi4py import MPI
        >>> import ulysses
        >>> ulysses.Communicator(MPI.COMM_SELF, threads=1).collectives >= 0
        True
        """
        return self._impl.collectives
