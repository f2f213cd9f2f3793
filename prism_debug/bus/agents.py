"""The agents one controller's bus serves: one per real rank the controller runs.

Each local real rank runs in a process of its own, with its own agent and its own
connection to the controller's ROUTER.  This table says which connection speaks for
which rank, and believes a connection's ``agent.hello`` only when it carries the
session's secret and comes, over the local socket, from that rank's own process (or
one it started): rank 4097's hello from rank 4096's process is refused as a forged
one is.  The server's records of what it owes each rank — requests forwarded and
not answered yet (:class:`Forwarded`), requests waiting for the rank to come back
from a snapshot or a restore (:class:`Queued`) — are typed here too, each naming
its rank: only that rank's agent answers it, and only that rank's leaving fails it.

No ZeroMQ here: the server hands in the sender's identity and the pid the kernel
gave (``SO_PEERCRED``), so the checks read, and are tested, on their own.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prism_debug.errors import ConfigError, Unauthorized


@dataclasses.dataclass(frozen=True)
class Forwarded:
    """A request sent to a rank's agent and not answered yet."""
    on_reply: Callable[[dict], None]
    due: float  # monotonic: it fails then
    frame: bytes  # as sent, id included: sent again as is
    connection: bytes  # the agent connection it was last sent on
    rank: int  # whose agent it went to: only that agent's reply answers it


@dataclasses.dataclass(frozen=True)
class Queued:
    """A request waiting for its rank's agent to (re)connect."""
    verb: str
    args: dict
    on_reply: Callable[[dict], None]
    due: float  # monotonic: it fails then
    rank: int


@dataclasses.dataclass(eq=False)
class AgentConnection:
    """One rank's agent as the bus sees it.  Mutable on purpose: the server's
    single-threaded loop updates it as the agent comes and goes."""
    rank: int
    identity: bytes | None = None  # the connection that proved itself (None: none now)
    pid: int | None = None  # the kernel's word for the last agent that proved itself
    connected: bool = False
    expected: bool = True  # starting, or briefly away (a snapshot): requests wait for it
    seen: float = 0.0  # monotonic: the last frame from it
    lost_reported: bool = False  # agent.lost published, agent.back not yet

    def away(self) -> None:
        """It closed its end for a while (a snapshot): requests wait."""
        self.identity, self.connected, self.expected = None, False, True

    def gone(self) -> None:
        """It exited or is being replaced: requests fail."""
        self.identity, self.connected, self.expected = None, False, False


class AgentTable:
    """rank -> :class:`AgentConnection`, for the ranks the controller runs."""

    def __init__(self, ranks: Iterable[int]) -> None:
        ordered = tuple(sorted(set(ranks)))
        if not ordered or any(type(r) is not int or r < 0 for r in ordered):
            raise ConfigError(f"a bus serves one or more ranks >= 0, got {ordered}")
        self.ranks = ordered
        self._by_rank = {rank: AgentConnection(rank) for rank in ordered}
        #: the process of each rank as the controller knows it (Popen, restore); set by
        #: the session.  None: no process is that rank now, and no hello is believed.
        self.pid_of: Callable[[int], int | None] = lambda rank: None

    @property
    def several(self) -> bool:
        return len(self.ranks) > 1

    @property
    def lowest(self) -> AgentConnection:
        return self._by_rank[self.ranks[0]]

    def __getitem__(self, rank: int) -> AgentConnection:
        return self._by_rank[rank]

    def __contains__(self, rank: object) -> bool:
        return rank in self._by_rank

    def __iter__(self) -> Iterator[AgentConnection]:
        return iter(self._by_rank.values())

    def speaking_as(self, identity: bytes) -> AgentConnection | None:
        """The rank whose agent speaks on connection ``identity``, if one does."""
        for agent in self._by_rank.values():
            if agent.identity == identity:
                return agent
        return None

    def name(self, rank: int) -> str:
        """How a message names a rank: "the rank" when there is only one (the words a
        single-rank session has always used), else "rank 4097"."""
        return f"rank {rank}" if self.several else "the rank"

    def admit(self, identity: bytes, args: dict, secret: str, pid: int | None) -> AgentConnection:
        """The agent an ``agent.hello`` (``args``: rank, pid, secret) proves itself to be,
        or :class:`Unauthorized` saying why not.  ``pid`` is the sender's process from the
        kernel (None over TCP or for another user's process)."""
        if not hmac.compare_digest(args["secret"].encode(), secret.encode()):
            raise Unauthorized("agent.hello refused: wrong session secret")
        if pid is None:
            raise Unauthorized("agent.hello refused: the rank says hello over the "
                               "controller's local socket only")
        rank = args["rank"]
        if rank not in self._by_rank:
            raise Unauthorized(f"agent.hello refused: rank {rank} is not a rank this "
                               f"controller runs (it runs {_listed(self.ranks)})")
        speaking = self.speaking_as(identity)
        if speaking is not None and speaking.rank != rank:
            raise Unauthorized(f"agent.hello refused: this connection speaks for rank "
                               f"{speaking.rank} already, not rank {rank}")
        expected = self.pid_of(rank)
        if expected is None or not descends(pid, expected):
            whose = f"rank {rank}" if self.several else "the rank this controller runs"
            raise Unauthorized(f"agent.hello refused: pid {pid} is not {whose} "
                               f"(pid {expected})")
        return self._by_rank[rank]


def _listed(ranks: tuple[int, ...]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else \
        f"{len(ranks)} ranks from {ranks[0]} to {ranks[-1]}"


def peer_pid(peer: str | None) -> int | None:
    """The sender's pid from ZeroMQ's ``Peer-Address`` of an ipc connection
    (``host:uid:gid:pid``, from SO_PEERCRED); None for TCP or another user's process."""
    if not peer:
        return None
    fields = peer.rsplit(":", 3)
    if len(fields) != 4 or not all(f.isdigit() for f in fields[1:]):
        return None
    uid, pid = int(fields[1]), int(fields[3])
    return pid if uid == os.geteuid() and pid > 0 else None


def descends(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (the rank may be
    started by a shell the command names).  Init adopts every orphan: it is no
    rank's ancestor here."""
    if ancestor <= 1:
        return pid == ancestor
    for _ in range(depth):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat_line.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False
