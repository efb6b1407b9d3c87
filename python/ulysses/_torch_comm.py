"""A ``torch.distributed`` process group as a ``ulysses.Communicator`` (backend ``"torch"``):
what programs launched by ``torchrun`` (no MPI) run on, and what a DeepSpeed user's
``sequence_process_group`` becomes. The C++ backend (python/src/torch_communicator.cpp) calls
the transport below for every collective; counting, agreement and the watchdog are the
library's, as over MPI.

A torch group is always served by torch.distributed, under ``torchrun`` and under ``mpirun``
alike: its ranks are the group's ranks by construction (no second numbering to reconcile), and
one path serves both launchers. A program that wants MPI's transport passes
``ulysses.Communicator(mpi4py_comm)`` instead (docs/python.md, docs/perf.md: the cost of each)."""

from __future__ import annotations

import concurrent.futures
import datetime
import socket
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import torch

from . import _ulysses
from ._comm import Communicator

_REDUCE = {"sum": "SUM", "min": "MIN", "max": "MAX"}
_COMMUNICATORS: Dict[Any, Communicator] = {}  # one per group: modules of every layer share it


class _Waited:
    """A point-to-point Work whose completion can be polled. Gloo's send and receive Work only
    learns that it is complete inside a blocking wait() (is_completed stays False until then),
    so a pool thread makes that wait (it releases the GIL) and the watchdog polls the thread."""

    _pool = None

    def __init__(self, work: Any) -> None:
        if _Waited._pool is None:
            _Waited._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ulysses-p2p")
        self._done = _Waited._pool.submit(work.wait)

    def is_completed(self) -> bool:
        return self._done.done()

    def done_within(self, seconds: float) -> bool:
        concurrent.futures.wait([self._done], timeout=seconds)
        return self._done.done()

    def wait(self) -> None:
        self._done.result()  # re-raises what the transport met


class _Transport:
    """Posts one operation on ``group`` over this rank's memory (numpy arrays that view it, no
    copy) and returns the ``Work``; the C++ side polls it under the watchdog."""

    def __init__(self, group: Any) -> None:
        dist = torch.distributed
        self.group = group
        self.ranks: List[int] = dist.get_process_group_ranks(group)
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.me = f"rank {self.rank} (torch global rank {dist.get_rank()}, host {socket.gethostname()})"
        self.name = f"the torch group of global ranks {_ranks_text(self.ranks)}"
        # gloo's wait honours a timeout (the slices below); torch's MPI backend ignores it, so its
        # Work is polled, or the watchdog could not fire
        self.blocking = "gloo" in str(dist.get_backend(group))

    def alltoallv(self, send, send_counts, recv, recv_counts):
        return torch.distributed.all_to_all_single(
            torch.from_numpy(recv),
            torch.from_numpy(send),
            list(recv_counts),
            list(send_counts),
            group=self.group,
            async_op=True,
        )

    def allgather(self, send, recv):
        out = list(torch.from_numpy(recv).view(self.size, -1).unbind(0))
        return torch.distributed.all_gather(out, torch.from_numpy(send), group=self.group, async_op=True)

    def allreduce(self, data, how):
        op = getattr(torch.distributed.ReduceOp, _REDUCE[how])
        return torch.distributed.all_reduce(torch.from_numpy(data), op=op, group=self.group, async_op=True)

    def broadcast(self, data, root):
        src = self.ranks[root]
        return torch.distributed.broadcast(torch.from_numpy(data), src, group=self.group, async_op=True)

    def barrier(self):
        return torch.distributed.barrier(group=self.group, async_op=True)

    def isend(self, data, dest, tag):
        return _Waited(torch.distributed.isend(torch.from_numpy(data), self.ranks[dest], group=self.group, tag=tag))

    def irecv(self, data, src, tag):
        return _Waited(torch.distributed.irecv(torch.from_numpy(data), self.ranks[src], group=self.group, tag=tag))

    def done(self, work: Any, seconds: float) -> bool:
        """Whether ``work`` completed, waiting for it up to ``seconds`` (torch releases the GIL).
        A gloo collective's wait that times out leaves the operation running, to be waited
        again; any other error counts as done, so that the caller's wait() raises it."""
        if isinstance(work, _Waited):
            return work.done_within(seconds)
        if not self.blocking:
            return work.is_completed()
        try:
            work.wait(datetime.timedelta(seconds=seconds))
        except RuntimeError as e:
            return "Operation timed out" not in str(e)
        return True

    def subgroup(self, members: List[int]) -> "_Transport":
        """A transport over ``members`` (ranks of this group, in the new group's order); only
        they call it (torch >= 2.1's local synchronisation: the other ranks need not join)."""
        ranks = [self.ranks[r] for r in members]
        return _Transport(torch.distributed.new_group(ranks, use_local_synchronization=True))


def _ranks_text(ranks: List[int]) -> str:
    return f"[{', '.join(map(str, ranks))}]" if len(ranks) <= 16 else f"[{ranks[0]}, ..., {ranks[-1]}] ({len(ranks)})"


def _check_initialised(name: str) -> None:
    """Error unless torch.distributed (torch >= 2) is up: without it there is no world to agree in."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise _ulysses.Error(
            f"{name}: torch.distributed is not initialised; call torch.distributed.init_process_group('gloo') "
            "first (torchrun sets its environment), or pass a ulysses.Communicator (mpirun, or ulysses.local_group)"
        )
    if int(torch.__version__.split(".")[0]) < 2:
        raise _ulysses.Error(f"{name}: a torch.distributed group needs torch >= 2 (this is torch {torch.__version__})")


def _check_kind(group: Any, name: str) -> None:
    """Error unless ``group`` is None or a torch.distributed ProcessGroup."""
    if group is not None and not (
        torch.distributed.is_available() and isinstance(group, torch.distributed.ProcessGroup)
    ):
        raise _ulysses.Error(
            f"{name} must be a torch.distributed ProcessGroup (None: the default group), a ulysses.Communicator or "
            f"an mpi4py communicator, got {type(group).__name__}"
        )


def _check_group(group: Any, name: str) -> None:
    """Error saying what to do unless ``group`` is a gloo (or MPI) ProcessGroup holding this process."""
    dist = torch.distributed
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise _ulysses.Error(
            f"{name} does not hold this process (global rank {dist.get_rank()}): torch.distributed.new_group "
            "returns GroupMember.NON_GROUP_MEMBER outside the group; pass the group this rank's tensors belong to"
        )
    _check_kind(group, name)
    ranks = dist.get_process_group_ranks(group)
    if dist.get_rank(group) < 0:
        raise _ulysses.Error(
            f"{name} holds global ranks {_ranks_text(ranks)}, not this process (global rank {dist.get_rank()}): "
            "pass the group this rank's tensors belong to"
        )
    backend = str(dist.get_backend(group))
    if "gloo" not in backend and "mpi" not in backend:
        raise _ulysses.Error(
            f"{name} uses the {backend} backend, which does not move CPU tensors; ulysses runs on CPU: "
            f"make a gloo group of the same ranks, torch.distributed.new_group({ranks}, backend='gloo')"
        )


def _first_problem(choices: List[Any], name: str) -> str:
    """What is wrong with every process's (error, ranks, group name), "" when nothing: the lowest
    global rank's own error, else the first member that passed another group than its group's."""
    for rank, (error, _, _) in enumerate(choices):
        if error:
            return f"global rank {rank}: {error}"
    for rank, (_, ranks, group_name) in enumerate(choices):
        for member in ranks:
            _, theirs, their_name = choices[member]
            if (theirs, their_name) == (ranks, group_name):
                continue
            other = _ranks_text(theirs)
            if theirs == ranks:
                other = f"another group of the same ranks (group names {group_name} and {their_name})"
            return (
                f"{name} differs between ranks: global rank {rank} passed the group of global ranks "
                f"{_ranks_text(ranks)}, its member global rank {member} passed {other}; every member of a group "
                "must pass that same group (the object new_group returned to it), at the same point"
            )
    return ""


def _group_record(group: Any, name: str) -> torch.Tensor:
    """This process's choice as fixed-size integers, so that one all-gather carries every
    process's: [failed, the group name's checksum, its global ranks as a bit mask]."""
    dist = torch.distributed
    words = (dist.get_world_size() + 62) // 63
    record = torch.zeros(2 + words, dtype=torch.int64)
    try:
        _check_group(group, name)
    except _ulysses.Error:
        record[0] = 1
        return record
    record[1] = zlib.crc32(group.group_name.encode())
    for r in dist.get_process_group_ranks(group):
        record[2 + r // 63] |= 1 << (r % 63)
    return record


def _record_problem(records: List[torch.Tensor], rank: int) -> bool:
    """Whether process ``rank`` failed, or a member of its group passed another group."""
    mine = records[rank]
    if mine[0]:
        return True
    members = [r for r in range(len(records)) if int(mine[2 + r // 63]) >> (r % 63) & 1]
    return any(not torch.equal(records[m], mine) for m in members)


def _agree_on_groups(group: Any, name: str) -> None:
    """Collective over the default group (every process, each with its own group, as every
    process calls new_group), at every use of a group, a cached one too: the same Error on every
    rank when a group is bad on any rank or its members passed different groups, which would
    otherwise leave a rank waiting for a peer that is busy in another group (a peer reusing a
    group while this rank passes a new one included). One all-gather of a few integers when all
    is well; the texts travel only to name a problem."""
    dist = torch.distributed
    mine = _group_record(group, name)
    records = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(records, mine)
    if not any(_record_problem(records, r) for r in range(len(records))):
        return
    try:
        _check_group(group, name)
        choice = ("", dist.get_process_group_ranks(group), group.group_name)
    except _ulysses.Error as e:
        choice = (str(e), [], "")
    choices: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(choices, choice)
    raise _ulysses.Error(_first_problem(choices, name) or f"{name}: the processes' groups disagree")


def communicator(group: Any, name: str = "sequence_process_group") -> Communicator:
    """A ``ulysses.Communicator`` for what a caller passed as its group: a Communicator as it is,
    an mpi4py communicator wrapped, a torch ProcessGroup (or None: the default group) through
    torch.distributed. Every time a process passes a torch group (or anything else where a group
    goes) is collective over the default group: every process passes its own group then
    (``_agree_on_groups``: one small all-gather); the same group is the same Communicator."""
    if isinstance(group, Communicator):
        return group
    if type(group).__module__.startswith("mpi4py"):
        return Communicator(group)
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        _check_kind(group, name)  # what is not a group is said first: no world is needed to tell
    _check_initialised(name)
    group = dist.group.WORLD if group is None else group
    _agree_on_groups(group, name)  # a cached group too: a peer passing a new one would wait for it otherwise
    if group in _COMMUNICATORS:
        return _COMMUNICATORS[group]
    _COMMUNICATORS[group] = Communicator._from_torch(_ulysses.torch_communicator(_Transport(group)), group)
    return _COMMUNICATORS[group]
