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
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Sequence

import torch.distributed as dist

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

    @classmethod
    def from_dict(cls, data: dict) -> "SideStore":
        return cls(host=str(data["host"]), port=int(data["port"]), prefix=str(data["prefix"]))


@dataclasses.dataclass(eq=False)
class RealGroup:
    """One group's real members and their gloo communicator.

    ``members``: the real members' global ranks in group order; ``positions``:
    their ranks in the group; ``index``: this process's place among them.
    ``pg`` is None once closed: the communicator is destroyed then, not
    whenever the interpreter's teardown reaches it."""

    pg: dist.ProcessGroup | None
    members: tuple[int, ...]
    positions: tuple[int, ...]
    index: int
    size: int  # the whole group's, real and virtual

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
        self._store = dist.PrefixStore(side.prefix, dist.TCPStore(
            side.host, side.port, is_master=False, timeout=timeout))
        self._groups: list[RealGroup] = []

    def meet(self) -> None:
        """Wait until every real rank is here (a barrier on the store): where
        their clocks start counting job time together."""
        self._store.set(f"meet/{self.me}", b"1")
        self._store.wait([f"meet/{rank}" for rank in self.real_ranks])

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
        index = members.index(self.me)
        # one namespace per group: a family's groups are numbered alike on every rank
        store = dist.PrefixStore(f"pg/{ref.family}/{ref.index}/", self._store)
        pg = dist.ProcessGroupGloo(store, index, len(members), timeout or self._timeout)
        group = RealGroup(pg=pg, members=members, positions=positions, index=index,
                          size=len(global_ranks))
        self._groups.append(group)
        return group

    def close(self) -> None:
        """Shut every communicator down and destroy it, with its connections
        (``shutdown`` alone leaves them open; a gloo group left to the
        interpreter's teardown may abort the process on its way out)."""
        for group in self._groups:
            if group.pg is not None:
                group.pg.shutdown()
                group.pg = None  # the last reference: gloo's destructor runs now
        self._groups.clear()
