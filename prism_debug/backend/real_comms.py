"""The communicators among several real ranks: real gloo groups that carry
real data between the processes of one run (or of one run's hosts).

A run of several real ranks (``prism-debug run --ranks``) gives every rank's
agent the same :class:`SideStore`: a c10d ``TCPStore`` outside every rank
(the controller's, or torchrun's agent store) under a per-run secret
prefix.  For every group the script makes, the members that are real build
one ``ProcessGroupGloo`` among themselves on that store — inside the
script's own ``new_group``, which every rank calls in the same order, so the
rendezvous is the one a real gloo job makes.  torch never sees these groups:
it keeps talking to the prism groups, which hand the real members' part of
an op to them.

A group with one real member has no real communicator: its virtual peers
act as they do in a run of one real rank.

A snapshot of several real ranks is a consistent cut: every rank stops at
the same iteration boundary, where no real op is in flight, and drops its
connections before CRIU dumps it (CRIU cannot dump half of a TCP
connection, and the other half would not be there at a restore anyway).
:meth:`RealComms.disconnect` destroys every communicator and the store
client; :meth:`RealComms.reconnect` makes them again, in the order the
script made them, under a namespace of the store no earlier connection
used — the original goes on under its run's prefix and the cut's
iteration, a restored copy under the prefix of the controller that
restored it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Protocol, cast

import torch.distributed as dist
from torch import Tensor

from prism_debug.graph import GroupRef


@dataclasses.dataclass(frozen=True)
class SideStore:
    """Where the real ranks meet: a TCPStore's address, and the secret prefix
    of this run's keys (TCPStore has no access control: the prefix is the
    run's, unguessable, and travels only in owner-only files)."""

    host: str
    port: int
    prefix: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def after_cut(self, iteration: int) -> SideStore:
        """Where the original run's ranks meet again after the cut at
        ``iteration`` (each iteration is cut once: the namespace is new)."""
        return dataclasses.replace(self, prefix=f"{self.prefix}after-{iteration}/")

    @classmethod
    def from_dict(cls, data: dict) -> SideStore:
        return cls(host=str(data["host"]), port=int(data["port"]), prefix=str(data["prefix"]))


class Communicator(Protocol):
    """What the real ops (backend/real_ops.py) use of a group's gloo
    communicator, a ``ProcessGroupGloo`` (torch's stubs leave a backend's ops out)."""

    def allreduce(self, tensors: list[Tensor], opts: dist.AllreduceOptions, /) -> dist.Work: ...

    def reduce(self, tensors: list[Tensor], opts: dist.ReduceOptions, /) -> dist.Work: ...

    def allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor], /) -> dist.Work: ...

    def broadcast(self, tensors: list[Tensor], opts: dist.BroadcastOptions, /) -> dist.Work: ...

    def gather(self, outputs: list[list[Tensor]], inputs: list[Tensor],
               opts: dist.GatherOptions, /) -> dist.Work: ...

    def scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]],
                opts: dist.ScatterOptions, /) -> dist.Work: ...

    def send(self, tensors: list[Tensor], dst: int, tag: int, /) -> dist.Work: ...

    def recv(self, tensors: list[Tensor], src: int, tag: int, /) -> dist.Work: ...

    def barrier(self) -> dist.Work: ...

    def shutdown(self) -> None: ...


@dataclasses.dataclass(eq=False)
class RealGroup:
    """One group's real members and their gloo communicator.

    ``members``: the real members' global ranks in group order; ``positions``:
    their ranks in the group; ``index``: this process's place among them.
    ``pg`` is None once closed: the communicator is destroyed then, not
    whenever the interpreter's teardown reaches it."""

    pg: Communicator | None
    members: tuple[int, ...]
    positions: tuple[int, ...]
    index: int
    size: int  # the whole group's, real and virtual
    # what makes the communicator again after a cut: its store namespace and timeout
    namespace: str = ""
    timeout: datetime.timedelta = datetime.timedelta(minutes=10)

    @property
    def all_real(self) -> bool:
        return len(self.members) == self.size

    def real_rank_of(self, group_rank: int) -> int | None:
        """The gloo rank of the group's member ``group_rank``, None if virtual."""
        try:
            return self.positions.index(group_rank)
        except ValueError:
            return None


class RealComms:
    """One rank's connection to the other real ranks."""

    def __init__(self, side: SideStore, real_ranks: Sequence[int], me: int,
                 timeout: datetime.timedelta) -> None:
        if me not in real_ranks:
            raise ValueError(f"rank {me} is not one of the real ranks {list(real_ranks)}")
        self.real_ranks = tuple(sorted(real_ranks))
        self.me = me
        self._timeout = timeout
        self.side = side
        self._store: dist.Store | None = self._connect(side)
        self._groups: list[RealGroup] = []  # in the order the script made them

    def _connect(self, side: SideStore) -> dist.Store:
        return dist.PrefixStore(side.prefix, dist.TCPStore(
            side.host, side.port, is_master=False, timeout=self._timeout))

    @property
    def _connected(self) -> dist.Store:
        # (disconnected only at a cut, where the script makes no group, until it reconnects)
        assert self._store is not None, "the real ranks' store is disconnected"
        return self._store

    def meet(self) -> None:
        """Wait until every real rank is here (a barrier on the store): where
        their clocks start counting job time together."""
        store = self._connected
        store.set(f"meet/{self.me}", "1")
        store.wait([f"meet/{rank}" for rank in self.real_ranks])

    def group(self, global_ranks: Sequence[int], ref: GroupRef,
              timeout: datetime.timedelta | None = None) -> RealGroup | None:
        """The real communicator of the group ``ref`` (made now: every real
        member calls this for the group at the same point of its program),
        or None when this rank is its only real member."""
        real = set(self.real_ranks)
        positions = tuple(i for i, r in enumerate(global_ranks) if r in real)
        if len(positions) < 2:
            return None
        members = tuple(global_ranks[i] for i in positions)
        # one namespace per group: a family's groups are numbered alike on every rank
        group = RealGroup(pg=None, members=members, positions=positions,
                          index=members.index(self.me), size=len(global_ranks),
                          namespace=f"pg/{ref.family}/{ref.index}/",
                          timeout=timeout or self._timeout)
        self._make(group)
        self._groups.append(group)
        return group

    def _make(self, group: RealGroup) -> None:
        store = dist.PrefixStore(group.namespace, self._connected)
        gloo = dist.ProcessGroupGloo(store, group.index, len(group.members), group.timeout)
        group.pg = cast(Communicator, gloo)  # (it has the ops; its stub does not say so)

    def disconnect(self) -> None:
        """Destroy every communicator and the store client, with their
        connections (``shutdown`` alone leaves them open; a gloo group left to
        the interpreter's teardown may abort the process on its way out).
        The groups keep what makes them again (:meth:`reconnect`)."""
        for group in self._groups:
            if group.pg is not None:
                group.pg.shutdown()
                group.pg = None  # the last reference: gloo's destructor runs now
        self._store = None  # (its connection closes with it)

    def reconnect(self, side: SideStore) -> None:
        """Connect to ``side`` and make every group's communicator again, in
        the order the script made them (every real rank does, at the same
        boundary: each is a rendezvous of its members, as the first was)."""
        self.side = side
        self._store = self._connect(side)
        for group in self._groups:
            self._make(group)

    def close(self) -> None:
        """At the rank's exit: every connection closed, nothing kept."""
        self.disconnect()
        self._groups.clear()
