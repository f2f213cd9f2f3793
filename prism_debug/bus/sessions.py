"""Discovery: how ``prism-debug attach`` finds the controller that holds a rank.

Every running controller publishes one small JSON file (its endpoints, ranks and pid)
in a per-user sessions directory and withdraws it on exit.  A controller that died
without withdrawing leaves a stale file behind; readers recognise it by its dead pid
and clean it up, so no daemon or registry has to stay alive.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Any

from prism_debug.errors import ConfigError, PrismError, SessionNotFound

log = logging.getLogger(__name__)

ENV_VAR = "PRISM_DEBUG_SESSIONS"
_SUFFIX = ".json"
# Session ids name files and are typed after --session: keep them plain.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionInfo:
    session: str
    pid: int  # the controller's pid: a session whose pid is gone is stale
    commands: str  # ROUTER endpoint, e.g. ipc:///run/user/1000/prism-debug/0f3a9c2b7d1e.c
    events: str  # PUB endpoint
    world_size: int
    ranks: tuple[int, ...]  # the real ranks this controller runs
    started: str  # ISO 8601
    curve_public: str | None  # the server's CURVE public key (Z85) when bound with CURVE
    # the TCP command endpoint for remote clients (attach --connect), with CURVE; the
    # local endpoints above are ipc sockets in a private directory
    remote_commands: str | None = None
    # a run of several real ranks: all of them (every host's), and this host's place
    # among the hosts (torchrun's node rank of nnodes); None for a single-rank run,
    # whose file then reads as it always did
    all_ranks: tuple[int, ...] | None = None
    node_rank: int | None = None
    nnodes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if self.all_ranks is not None:
            object.__setattr__(self, "all_ranks", tuple(self.all_ranks))
        if not _SESSION_ID.fullmatch(self.session):
            raise ConfigError(f"session id {self.session!r} must be 1..64 letters, digits, "
                              "'.', '_' or '-', starting with a letter or digit")
        if self.pid <= 0:
            raise ConfigError(f"session {self.session}: pid must be positive, got {self.pid}")
        outside = [r for r in self.ranks if not 0 <= r < self.world_size]
        if outside:
            raise ConfigError(f"session {self.session}: ranks {outside} lie outside the world "
                              f"of {self.world_size}")
        if self.all_ranks is not None:
            missing = [r for r in self.ranks if r not in self.all_ranks]
            outside = [r for r in self.all_ranks if not 0 <= r < self.world_size]
            if missing or outside:
                raise ConfigError(f"session {self.session}: all_ranks {list(self.all_ranks)} "
                                  f"must hold its ranks {list(self.ranks)} and lie inside "
                                  f"the world of {self.world_size}")
        if (self.node_rank is None) != (self.nnodes is None) or (
                self.node_rank is not None and self.nnodes is not None
                and not 0 <= self.node_rank < self.nnodes):
            raise ConfigError(f"session {self.session}: node_rank {self.node_rank} of nnodes "
                              f"{self.nnodes}: both or neither, 0 <= node_rank < nnodes")

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["ranks"] = list(self.ranks)
        for name in _MULTI_RANK_FIELDS:  # absent, not null: a single-rank file is unchanged
            if data[name] is None:
                del data[name]
        if self.all_ranks is not None:
            data["all_ranks"] = list(self.all_ranks)
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> SessionInfo:
        """The session a file describes; ValueError when it does not describe one."""
        if type(data) is not dict:
            raise ValueError("not a JSON object")
        expected = {"session": (str,), "pid": (int,), "commands": (str,), "events": (str,),
                    "world_size": (int,), "ranks": (list,), "started": (str,),
                    "curve_public": (str, type(None))}
        for name, types in expected.items():
            if type(data.get(name)) not in types:
                raise ValueError(f"field {name!r} is missing or mistyped")
        if any(type(r) is not int for r in data["ranks"]):
            raise ValueError("field 'ranks' must hold ints")
        remote = data.get("remote_commands")
        if type(remote) not in (str, type(None)):
            raise ValueError("field 'remote_commands' is mistyped")
        multi: dict[str, Any] = {name: data.get(name) for name in _MULTI_RANK_FIELDS}
        if multi["all_ranks"] is not None and (type(multi["all_ranks"]) is not list or any(
                type(r) is not int for r in multi["all_ranks"])):
            raise ValueError("field 'all_ranks' must be a list of ints")
        if any(type(multi[name]) not in (int, type(None)) for name in ("node_rank", "nnodes")):
            raise ValueError("fields 'node_rank' and 'nnodes' must be ints")
        # unknown fields are a newer prism-debug's additions: ignore them
        return cls(**{name: data[name] for name in expected}, remote_commands=remote, **multi)


_MULTI_RANK_FIELDS = ("all_ranks", "node_rank", "nnodes")


def new_session_id() -> str:
    return secrets.token_hex(4)


def sessions_dir() -> Path:
    """Where session files live: $PRISM_DEBUG_SESSIONS, else the per-user runtime
    directory (cleared at logout, like the sessions), else ~/.local/state."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "prism-debug" / "sessions"
    return Path.home() / ".local" / "state" / "prism-debug" / "sessions"


def _path(session: str) -> Path:
    return sessions_dir() / f"{session}{_SUFFIX}"


def publish(info: SessionInfo) -> Path:
    """Write the session file atomically (a reader sees the whole file or none)."""
    directory = sessions_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = directory / f"{info.session}{_SUFFIX}"
    # a dot name: live_sessions skips it, so a half-written file is never read
    staging = directory / f".{info.session}{_SUFFIX}.{os.getpid()}"
    try:
        with open(staging, "w", encoding="utf-8") as f:
            f.write(info.to_json())
        os.replace(staging, final)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return final


def withdraw(info: SessionInfo) -> None:
    """Remove the session file; removing one already gone is fine (a cleaner got there)."""
    _path(info.session).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, …) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def live_sessions(clean: bool = True) -> list[SessionInfo]:
    """Sessions whose controller is alive, oldest first.  A file that cannot be read, or
    whose pid is gone, is stale: removed when ``clean``.  (A recycled pid can make a stale
    session look alive; its endpoints then fail to answer and the client says so.)"""
    directory = sessions_dir()
    if not directory.is_dir():
        return []
    live = []
    for path in directory.iterdir():
        if path.name.startswith(".") or not path.name.endswith(_SUFFIX):
            continue
        try:
            info = SessionInfo.from_dict(json.loads(path.read_text(encoding="utf-8")))
            if path.name != f"{info.session}{_SUFFIX}":
                raise ValueError(f"it describes session {info.session!r}")
        except (OSError, ValueError, PrismError) as exc:
            reason = f"unreadable ({exc})"
        else:
            if pid_alive(info.pid):
                live.append(info)
                continue
            reason = f"controller pid {info.pid} is gone"
        if clean:
            log.info("removing stale session file %s: %s", path, reason)
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # someone else's file in a shared directory
                log.warning("cannot remove stale session file %s: %s", path, exc)
    return sorted(live, key=lambda s: (s.started, s.session))


def ranks_text(ranks: tuple[int, ...]) -> str:
    """``rank 3`` or ``ranks 0-3, 8``: runs of consecutive ranks collapsed."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "no ranks"
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank {text}" if len(ordered) == 1 else f"ranks {text}"


def session_ranks_text(info: SessionInfo) -> str:
    """What ``ps`` says a session holds: ``rank 4097``, or for a run of several real
    ranks ``ranks 0-1 (node 0 of 2; job ranks 0-3)`` (the parts it knows)."""
    held = ranks_text(info.ranks)
    where = []
    if info.nnodes is not None:
        where.append(f"node {info.node_rank} of {info.nnodes}")
    if info.all_ranks is not None and set(info.all_ranks) != set(info.ranks):
        where.append(f"job {ranks_text(info.all_ranks)}")
    return f"{held} ({'; '.join(where)})" if where else held


def _ids(sessions: list[SessionInfo]) -> str:
    return ", ".join(s.session for s in sessions)


def find(rank: int | None = None, session: str | None = None) -> SessionInfo:
    """The one live session that matches; :class:`SessionNotFound` otherwise, with a
    message that lists what is running and what to pass."""
    live = live_sessions()
    if not live:
        raise SessionNotFound("no prism-debug session is running: start one with "
                              "prism-debug run")
    if session is not None:
        chosen = [s for s in live if s.session == session]
        if not chosen:
            raise SessionNotFound(f"no running session {session!r}; running: {_ids(live)} "
                                  "(prism-debug ps lists them)")
        if rank is not None and rank not in chosen[0].ranks:
            raise SessionNotFound(f"session {session} does not hold rank {rank}: it holds "
                                  f"{ranks_text(chosen[0].ranks)}")
        return chosen[0]
    if rank is None:
        if len(live) == 1:
            return live[0]
        raise SessionNotFound(f"{len(live)} sessions are running: pass --session ID with "
                              f"one of {_ids(live)}")
    holders = [s for s in live if rank in s.ranks]
    if not holders:
        held = "; ".join(f"session {s.session} holds {session_ranks_text(s)}" for s in live)
        elsewhere = [s for s in live if s.all_ranks is not None and rank in s.all_ranks]
        hint = (f" (rank {rank} belongs to session {elsewhere[0].session}'s job: its "
                "controller on another host holds it; attach there)") if elsewhere else ""
        raise SessionNotFound(f"no running session holds rank {rank}: {held}{hint}")
    if len(holders) > 1:
        raise SessionNotFound(f"{len(holders)} sessions hold rank {rank}: pass --session ID "
                              f"with one of {_ids(holders)}")
    return holders[0]
