"""The control file: what the controller tells a rank idling at a snapshot
boundary — go on (the original, once its images are written), or go on as a
restored copy, with that restore's instructions.

One versioned, frozen value each way, written and read here only, as the bus
protocol's messages are: the controller writes :class:`Go` or
:class:`RestoreControl` with :func:`encode`, the rank's handshake reads them
with :func:`decode`.  The rank reads the file while the controller rewrites it
in place, so a half-written file decodes as nothing (and is read again), and
a file of another version, or not of this form, as nothing too: the rank
never acts on instructions it cannot read whole.  Pure: no torch, no CRIU.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

CONTROL_VERSION = 1
GO = "go"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Go:
    """Go on after the snapshot of ``stop_at``: the wait that announced
    ``ticket`` is over (the original rank, once CRIU has its images)."""

    stop_at: int
    ticket: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestoreControl:
    """A copy of the rank restored from ``snapshot`` (taken after iteration
    ``stop_at``) goes on under a new run: its limits, its bus, what it puts
    in force, where a rank of a cut meets the others again."""

    snapshot: str
    stop_at: int
    iterations: int | None = None  # the last iteration it runs (None: to the end)
    record_ops: bool = False
    bus: str | None = None  # the restoring controller's bus (None: none)
    bus_curve: dict[str, str] | None = None
    bus_secret: str | None = None
    pause: bool = False  # it stays paused where the snapshot was taken
    history: bool = False  # it goes on stopping after every iteration (--history)
    faults: tuple[dict[str, Any], ...] = ()  # Fault.to_dict() of each, put in force at once
    watch_nonfinite: bool = False
    side_store: dict[str, Any] | None = None  # SideStore.to_dict(): a cut's other ranks
    # the changed functions to patch in, their new texts staged beside the file
    reload: list[dict[str, Any]] | None = None


Control = Go | RestoreControl


def encode(control: Control) -> str:
    """The file's text for ``control``."""
    fields = dataclasses.asdict(control)
    kind = "restore" if isinstance(control, RestoreControl) else "release"
    return json.dumps({"version": CONTROL_VERSION, "kind": kind, "phase": GO, **fields})


def decode(raw: bytes) -> Control | None:
    """What the file says, or None: empty, half written, of another version,
    or not of this form (the rank then reads it again, or waits for its
    release signal)."""
    try:
        content = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return None
    if type(content) is not dict or content.get("version") != CONTROL_VERSION \
            or content.get("phase") != GO:
        return None
    kind = content.get("kind")
    try:
        if kind == "release":
            return _release(content)
        if kind == "restore":
            return _restore(content)
    except (KeyError, TypeError, ValueError):  # a field missing, or of another type
        return None
    return None


def _release(content: dict[str, Any]) -> Go:
    ticket = content.get("ticket")
    return Go(stop_at=_int(content["stop_at"]),
                   ticket=_optional(ticket, str))


def _restore(content: dict[str, Any]) -> RestoreControl:
    faults = content.get("faults", [])
    reload = content.get("reload")
    if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
        raise TypeError("faults")
    if reload is not None and not (isinstance(reload, list)
                                   and all(isinstance(r, dict) for r in reload)):
        raise TypeError("reload")
    return RestoreControl(
        snapshot=_str(content["snapshot"]),
        stop_at=_int(content["stop_at"]),
        iterations=_optional(content.get("iterations"), int),
        record_ops=bool(content.get("record_ops")),
        bus=_optional(content.get("bus"), str),
        bus_curve=_optional(content.get("bus_curve"), dict),
        bus_secret=_optional(content.get("bus_secret"), str),
        pause=bool(content.get("pause")), history=bool(content.get("history")),
        faults=tuple(faults), watch_nonfinite=bool(content.get("watch_nonfinite")),
        side_store=_optional(content.get("side_store"), dict), reload=reload)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {value!r}")
    return value


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"not an integer: {value!r}")
    return value


def _optional(value: Any, kind: type) -> Any:
    if value is None:
        return None
    if kind is int:
        return _int(value)
    if not isinstance(value, kind):
        raise TypeError(f"not a {kind.__name__}: {value!r}")
    return value
