"""Communication between ranks: one small interface, two implementations.

The executor moves array pieces through :class:`Comm` only: point-to-point exchanges
(all of one step's sends and receives posted together, then waited on), and collectives
on groups of ranks fixed when the program is built (``setup_groups``, called once by
every rank with the same list, creates one sub-communicator per group). Groups are
tuples of world ranks in increasing order; a collective's ``root`` and the block order
of ``allgather``/``reduce_scatter`` follow that order.

* :class:`MpiComm` passes numpy buffers with mpi4py's buffer (upper-case) calls.
* :class:`NcclComm` passes cupy arrays with ``cupy.cuda.nccl`` and keeps MPI for setup
  and control (its tests in ``tests/runtime/test_cupy.py`` run only where there are GPUs).

Control messages (a flag, an error line, timings) are small Python objects and go
through MPI's pickle-based calls: they are never on the hot path.
"""
from __future__ import annotations

import fcntl
import os
import stat
import sys
import termios
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

Group = tuple[int, ...]
Array = Any


def mpi() -> Any:
    """The mpi4py ``MPI`` module (imported on first use: it initializes MPI)."""
    from mpi4py import MPI  # noqa: PLC0415  (initializing MPI is a side effect only `run` wants)

    return MPI


class Comm(ABC):
    """What the executor needs from the ranks of a job (see the module docstring)."""

    in_sync = False
    """Set while the gradient sync makes a call among backward's tasks (``TimedComm`` counts its
    time as the sync's; a plain communicator ignores it)."""

    def __init__(self, world: Any):
        self.world = world                 # an mpi4py communicator (control plane)
        self.rank: int = world.Get_rank()
        self.size: int = world.Get_size()

    # -- setup -------------------------------------------------------------------

    @abstractmethod
    def setup_groups(self, groups: Sequence[Group]) -> None:
        """Create a communicator for each group this rank is in; every rank calls it with
        the same list, in the same order."""

    # -- data plane --------------------------------------------------------------

    @abstractmethod
    def exchange(self, sends: Sequence[tuple[int, Array]], recvs: Sequence[tuple[int, Array]], tag: int) -> None:
        """Send each ``(dest, array)`` and receive into each ``(source, array)``; returns
        when all are done. Messages between two ranks match in the order they are listed."""

    @abstractmethod
    def allreduce(self, group: Group, buf: Array) -> None:
        """Sum ``buf`` over the group, in place on every member."""

    @abstractmethod
    def reduce(self, group: Group, buf: Array, root: int) -> None:
        """Sum ``buf`` over the group into ``root``'s ``buf`` (world rank)."""

    @abstractmethod
    def bcast(self, group: Group, buf: Array, root: int) -> None:
        """Copy ``root``'s ``buf`` (world rank) into every member's ``buf``."""

    @abstractmethod
    def allgather(self, group: Group, send: Array, recv: Array) -> None:
        """``recv[j]`` = member ``j``'s ``send`` (``recv`` has a leading axis of the group's size)."""

    @abstractmethod
    def reduce_scatter(self, group: Group, send: Array, recv: Array) -> None:
        """Member ``j`` gets the sum over members of ``send[j]``."""

    # A bucketed gradient sync (``runtime/weights.py``) starts its all-reduces without
    # waiting, on communicators of its own; a communicator that cannot runs them at once
    # (these defaults).

    def setup_sync_groups(self, groups: Sequence[Group]) -> None:  # noqa: B027  (the default needs none)
        """Make the bucketed sync's own communicator for each of ``groups`` this rank is in
        (after :meth:`setup_groups`; every rank calls it with the same list)."""

    def iallreduce(self, group: Group, buf: Array) -> Any:
        """Start summing ``buf`` over the group in place; returns a request for :meth:`wait_all`.
        Every member starts the all-reduces of one group in the same order."""
        self.allreduce(group, buf)
        return None

    def iallgather(self, group: Group, send: Array, recv: Array) -> Any:
        """Start :meth:`allgather` (ZeRO-3's prefetch) on the group's second communicator
        (:meth:`setup_sync_groups`); returns a request for :meth:`wait`. Every member starts
        the gathers of one group in the same order."""
        self.allgather(group, send, recv)
        return None

    def wait(self, requests: Sequence[Any]) -> None:
        """:meth:`wait_all` for requests of the step's own work (a prefetched gather): its time
        is the pass's communication, not the gradient sync's."""
        self.wait_all(requests)

    def test_all(self, requests: Sequence[Any]) -> bool:
        """Let started all-reduces progress (MPI moves a nonblocking collective only inside its
        calls); whether all are done."""
        return True

    def wait_all(self, requests: Sequence[Any]) -> None:  # noqa: B027  (the default's requests are done)
        """Return once every started all-reduce is done (on a GPU: once the work queued after
        this call waits for them)."""

    def sync(self) -> None:  # noqa: B027  (a no-op unless a device queues work)
        """Wait for queued device work (a no-op on CPUs)."""

    # -- control plane -----------------------------------------------------------

    def barrier(self) -> None:
        self.world.Barrier()

    def allgather_obj(self, obj: Any) -> list[Any]:
        return self.world.allgather(obj)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        return self.world.bcast(obj, root=root)

    def sum_host(self, x: float) -> float:
        """The sum over all ranks of a float (the step's loss)."""

        buf = np.array([x], dtype=np.float64)
        self.world.Allreduce(mpi().IN_PLACE, buf)
        return float(buf[0])

    def send_array(self, arr: Any, dest: int, tag: int) -> None:
        """Blocking send of a host (numpy) array, off the hot path (results to rank 0)."""
        self.world.Send(arr, dest=dest, tag=tag)

    def recv_array(self, arr: Any, source: int, tag: int) -> None:
        self.world.Recv(arr, source=source, tag=tag)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (a rank failed mid-step; the others may be waiting).
        Under mpiexec this rank's error line must reach the user before the job is torn down:
        ``_drained`` waits until the launcher has read what was written."""
        sys.stderr.flush()
        sys.stdout.flush()
        _drained(sys.stderr.fileno())
        _drained(sys.stdout.fileno())
        self.world.Abort(code)


def _drained(fd: int, most: float = 5.0) -> None:
    """Wait until the pipe ``fd`` writes into has been read empty (at most ``most`` seconds).
    mpiexec's proxy forwards a rank's output as it reads it; a pipe still holding bytes when
    ``MPI_Abort`` kills the job loses them, and with them the one line saying why. This waits on
    an event (the pipe emptied), not on a guess of how long forwarding takes; ``most`` only
    bounds a reader that stopped reading. Not a pipe (a terminal, a file): nothing to wait for."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        end = time.monotonic() + most
        left = bytearray(4)
        while time.monotonic() < end:
            fcntl.ioctl(fd, termios.FIONREAD, left)       # Linux: bytes unread in the pipe, either end
            if int.from_bytes(left, sys.byteorder) == 0:
                return
            time.sleep(0.01)
    except OSError:
        return


def _returning(comm: Any) -> Any:
    """``comm`` with MPI errors raised as exceptions, not fatal inside MPI: a rank whose peer
    died then says so in its own words (``runtime/train.py``) before the job ends."""
    comm.Set_errhandler(mpi().ERRORS_RETURN)
    return comm


class MpiComm(Comm):
    """mpi4py with numpy buffers (CPUs)."""

    def __init__(self, world: Any):
        super().__init__(world)
        self.data = _returning(world.Dup())           # data traffic never mixes with control messages
        self.groups: dict[Group, Any] = {}
        self.sync_groups: dict[Group, Any] = {}      # the bucketed gradient sync's, apart from the step's

    def setup_groups(self, groups: Sequence[Group]) -> None:
        base = self.data.Get_group()
        for tag, g in enumerate(groups):
            if self.rank not in g or g in self.groups:
                continue
            if len(g) == self.size:
                self.groups[g] = _returning(self.data.Dup())
            else:
                sub = base.Incl(list(g))
                self.groups[g] = _returning(self.data.Create_group(sub, tag))
                sub.Free()
        base.Free()

    def setup_sync_groups(self, groups):
        for g in groups:
            if self.rank in g and g not in self.sync_groups:
                self.sync_groups[g] = _returning(self.groups[g].Dup())

    def exchange(self, sends, recvs, tag):
        if not sends and not recvs:
            return
        MPI = mpi()
        reqs = [self.data.Irecv(buf, source=src, tag=tag) for src, buf in recvs]
        reqs += [self.data.Isend(buf, dest=dst, tag=tag) for dst, buf in sends]
        MPI.Request.Waitall(reqs)

    def allreduce(self, group, buf):
        self.groups[group].Allreduce(mpi().IN_PLACE, buf)

    def iallreduce(self, group, buf):
        return self.sync_groups[group].Iallreduce(mpi().IN_PLACE, buf)

    def iallgather(self, group, send, recv):
        return self.sync_groups[group].Iallgather(send, recv)

    def test_all(self, requests):
        return bool(mpi().Request.Testall(list(requests)))

    def wait_all(self, requests):
        mpi().Request.Waitall(list(requests))

    def reduce(self, group, buf, root):
        c = self.groups[group]
        r = group.index(root)
        if c.Get_rank() == r:
            c.Reduce(mpi().IN_PLACE, buf, root=r)
        else:
            c.Reduce(buf, None, root=r)

    def bcast(self, group, buf, root):
        self.groups[group].Bcast(buf, root=group.index(root))

    def allgather(self, group, send, recv):
        self.groups[group].Allgather(send, recv)

    def reduce_scatter(self, group, send, recv):
        self.groups[group].Reduce_scatter_block(send, recv)


class NcclComm(Comm):
    """NCCL (through ``cupy.cuda.nccl``) for cupy arrays; MPI for setup and control.

    Each group gets its own NCCL communicator, bootstrapped by an id that the group's
    first member makes and sends to the others over MPI.
    """

    def __init__(self, world: Any):
        super().__init__(world)
        import cupy  # noqa: PLC0415
        from cupy.cuda import nccl  # noqa: PLC0415

        self.cupy, self.nccl = cupy, nccl
        self.stream = cupy.cuda.get_current_stream()
        self.side = cupy.cuda.Stream(non_blocking=True)   # the bucketed gradient sync's all-reduces
        self.groups: dict[Group, Any] = {}
        # The bucketed sync's communicators, apart from the step's: NCCL orders the launches
        # of one communicator whatever their streams, so a bucket on the step's would hold
        # back every later exchange or collective of its group until it is done.
        self.sync_groups: dict[Group, Any] = {}
        self.world_nccl = self._make(tuple(range(self.size)), 0)

    def _make(self, group: Group, tag: int) -> Any:
        leader = group[0]
        uid = self.nccl.get_unique_id() if self.rank == leader else None
        if self.rank == leader:
            for r in group[1:]:
                self.world.send(uid, dest=r, tag=31000)
        else:
            uid = self.world.recv(source=leader, tag=31000)
        return self.nccl.NcclCommunicator(len(group), uid, group.index(self.rank))

    def setup_groups(self, groups):
        for tag, g in enumerate(groups):
            if self.rank in g and g not in self.groups:
                self.groups[g] = self.world_nccl if len(g) == self.size else self._make(g, tag + 1)

    def setup_sync_groups(self, groups):
        for g in groups:
            if self.rank in g and g not in self.sync_groups:
                self.sync_groups[g] = self._make(g, 0)

    def _dtype(self, arr: Array) -> int:
        n = self.nccl
        table = {"float32": n.NCCL_FLOAT32, "float64": n.NCCL_FLOAT64, "float16": n.NCCL_FLOAT16,
                 "int64": n.NCCL_INT64, "int32": n.NCCL_INT32, "int8": n.NCCL_INT8, "uint8": n.NCCL_UINT8,
                 "bool": n.NCCL_UINT8}
        return table[str(arr.dtype)]

    def exchange(self, sends, recvs, tag):
        if not sends and not recvs:
            return
        s = self.stream.ptr
        self.nccl.groupStart()
        for src, buf in recvs:
            self.world_nccl.recv(buf.data.ptr, buf.size, self._dtype(buf), src, s)
        for dst, buf in sends:
            self.world_nccl.send(buf.data.ptr, buf.size, self._dtype(buf), dst, s)
        self.nccl.groupEnd()

    def allreduce(self, group, buf):
        self.groups[group].allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf),
                                     self.nccl.NCCL_SUM, self.stream.ptr)

    def iallreduce(self, group, buf):
        # on the side stream, after the work queued so far (the gradients it sums); the
        # request is an event that the work queued after wait_all waits for
        ready = self.cupy.cuda.Event(disable_timing=True)
        ready.record(self.stream)
        self.side.wait_event(ready)
        self.sync_groups[group].allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf),
                                          self.nccl.NCCL_SUM, self.side.ptr)
        done = self.cupy.cuda.Event(disable_timing=True)
        done.record(self.side)
        return done

    def iallgather(self, group, send, recv):
        ready = self.cupy.cuda.Event(disable_timing=True)     # as iallreduce: after the queued work
        ready.record(self.stream)
        self.side.wait_event(ready)
        self.sync_groups[group].allGather(send.data.ptr, recv.data.ptr, send.size, self._dtype(send), self.side.ptr)
        done = self.cupy.cuda.Event(disable_timing=True)
        done.record(self.side)
        return done

    def test_all(self, requests):
        return all(e.done for e in requests)      # NCCL moves them on its own

    def wait_all(self, requests):
        for e in requests:
            self.stream.wait_event(e)

    def reduce(self, group, buf, root):
        self.groups[group].reduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf), self.nccl.NCCL_SUM,
                                  group.index(root), self.stream.ptr)

    def bcast(self, group, buf, root):
        self.groups[group].bcast(buf.data.ptr, buf.size, self._dtype(buf), group.index(root), self.stream.ptr)

    def allgather(self, group, send, recv):
        self.groups[group].allGather(send.data.ptr, recv.data.ptr, send.size, self._dtype(send), self.stream.ptr)

    def reduce_scatter(self, group, send, recv):
        self.groups[group].reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self._dtype(recv),
                                         self.nccl.NCCL_SUM, self.stream.ptr)

    def sync(self) -> None:
        self.stream.synchronize()


def make_comm(backend: str, world: Any | None = None) -> Comm:
    """The communicator for an array backend (``numpy`` or ``cupy``) over ``world``
    (default: every rank of the job)."""
    w = world if world is not None else mpi().COMM_WORLD
    return NcclComm(w) if backend == "cupy" else MpiComm(w)
