"""One exception hierarchy for prism-debug, the whole tree in this file.

Every error a user can meet derives from :class:`PrismError`; its message says
what went wrong *and what to do about it*.  The CLI turns a ``PrismError`` into
one line on stderr and the error's :class:`ExitCode` in exactly one place
(``cli.main``); the subsystems raise these classes and re-export the ones
their callers catch.  ::

    PrismError
    ├── ConfigError (also ValueError)        bad user input: options, files, ranks
    │   ├── HardwareProfileError             a hardware profile missing or malformed
    │   ├── InvalidFields                    a checked dataclass built with bad values
    │   ├── ScenarioError                    a scenario file with problems (every one listed)
    │   └── IncidentError                    a dump directory that cannot be read as an incident
    ├── LaunchError                          the rank could not be started or never initialised
    │   └── MissingGpu                       the rank called CUDA on a machine without a GPU
    ├── UnsupportedOperation                 a torch.distributed feature the emulation cannot serve
    ├── GraphError                           a graph file malformed, or not the job's
    ├── SnapshotError                        a snapshot missing, damaged or foreign
    │   └── CriuError                        CRIU missing or unusable, a dump or restore failed
    ├── BusError                             the debugger bus (``type`` travels on the wire)
    │   ├── BadMessage, UnknownVerb, BadArguments (also ValueError)
    │   ├── InvalidState, RankUnavailable, SnapshotFailed, BusTimeout, InternalError
    │   ├── Unauthorized, Busy               a peer that did not prove itself; a table full
    │   ├── KeysError                        CURVE keys needed and missing or unreadable
    │   └── SessionNotFound                  no running session matches (or several do)
    └── DebuggerError                        a debugger command the rank's state rules out

Pure Python: the core imports this module.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

#: where a value sits in a file: its keys and list indices, outermost first
#: (``("faults", 0, "select", "ranks")``)
KeyPath = tuple[str | int, ...]


class ExitCode(enum.IntEnum):
    """What the ``prism-debug`` command exits with (a run exits with its rank's code)."""

    OK = 0
    FAILED = 1  # the command ran and found problems: expectations failed, lint, doctor
    ERROR = 2  # a PrismError: bad input, a missing tool, a damaged file (and click's usage)
    LAUNCH = 3  # the rank could not be started, or never reached init_process_group


class PrismError(Exception):
    """Base class of every error prism-debug raises on purpose."""

    #: Exit code the CLI uses when this error ends a command.
    exit_code: ExitCode = ExitCode.ERROR


# -- bad input -----------------------------------------------------------------------------


class ConfigError(PrismError, ValueError):
    """Raised for bad user input: a rank outside the world, an impossible layout,
    an option out of range, a malformed configuration file."""


class HardwareProfileError(ConfigError):
    """Raised when a hardware profile cannot be found or is malformed."""


class InvalidFields(ConfigError):
    """Raised by a checked dataclass (``prism_debug.checked``) built with bad
    values; ``errors`` pairs each key path (YAML keys, relative to the object)
    with what is wrong there."""

    def __init__(self, name: str, errors: list[tuple[KeyPath, str]]) -> None:
        self.errors = errors
        super().__init__(f"{name}: " + "; ".join(
            f"{key_path(path)}: {message}" if path else message for path, message in errors))


class ScenarioError(ConfigError):
    """Raised when a scenario file cannot be read or is invalid; ``problems``
    holds every error found in it (each with its line), one line each in the
    message."""

    def __init__(self, problems: Sequence[object], message: str | None = None) -> None:
        self.problems = list(problems)
        super().__init__(message or "\n".join(map(str, self.problems)))


class VariabilityError(ConfigError):
    """Raised for a variability statement (``--variability``, a variability
    file, a scenario's ``variability``) that cannot be read or does not fit
    the graph it is used with; the message names the term and what to give."""


class IncidentError(ConfigError):
    """Raised for flight-recorder dumps that cannot make an incident: no
    directory, no dump in it, no prefix common to the files, or none that
    reads (each damaged file is named with why)."""


def key_path(path: KeyPath) -> str:
    """A key path as people read it: ``faults[0].select.ranks``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# -- running the rank ------------------------------------------------------------------------


class LaunchError(PrismError):
    """Raised when the real rank's process cannot be started or never reaches
    ``init_process_group``; ``log`` is where its output went, when it ran."""

    exit_code = ExitCode.LAUNCH

    def __init__(self, message: str, *, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


class MissingGpu(LaunchError):
    """Raised when the rank died on a CUDA call this machine cannot serve (no
    GPU, or a torch built without CUDA); ``path`` and ``line`` are the
    script's line that made the call."""

    def __init__(self, message: str, *, path: str, line: int, log: Path | None = None) -> None:
        super().__init__(message, log=log)
        self.path = path
        self.line = line


class UnsupportedOperation(PrismError):
    """Raised inside the real rank when a script uses a torch.distributed feature
    the emulation cannot serve faithfully; the message names the alternative."""


class GraphError(PrismError):
    """Raised for a graph file that is malformed, of another version, or does
    not describe the job it is used with; the message names the first
    mismatch.  ``rank`` and ``iteration`` say where a script left its graph."""

    def __init__(self, message: str, *, rank: int | None = None,
                 iteration: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.iteration = iteration


# -- snapshots ---------------------------------------------------------------------------------


class SnapshotError(PrismError):
    """A snapshot that is missing, damaged, or does not match what it is used
    with; ``snapshot_id`` names it where one is concerned."""

    def __init__(self, message: str, *, snapshot_id: str | None = None) -> None:
        super().__init__(message)
        self.snapshot_id = snapshot_id


class CriuError(SnapshotError):
    """CRIU is missing or unusable, or a dump or restore failed; the message
    quotes CRIU's log and says what to do.  ``log`` is CRIU's log file."""

    def __init__(self, message: str, *, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


# -- the debugger bus ------------------------------------------------------------------------
# Each class's ``type`` is the string that travels in an error reply, so a client re-raises
# exactly the class the controller raised.


class BusError(PrismError):
    """Base of every bus error; ``type`` names it on the wire.

    ``request_id`` is the id of the request the error answers (None when the frame was too
    broken to have one), so the controller can address its error reply and a client can tell
    an answer to its request from a stale one.
    """

    #: An error with no more specific type is, from the wire's point of view, internal.
    type: str = "Internal"

    def __init__(self, message: str = "", *, request_id: str | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        if error_type is not None:  # an error type this prism-debug does not know
            self.type = error_type


class BadMessage(BusError, ValueError):
    """A frame that is not a protocol message: not UTF-8 JSON, not an object, too large, of
    another protocol version, or with a missing or mistyped id or verb."""

    type = "BadMessage"


class UnknownVerb(BusError, ValueError):
    """A well-formed request naming a verb the receiver does not serve."""

    type = "UnknownVerb"


class BadArguments(BusError, ValueError):
    """A request whose arguments do not match its verb's schema: an unknown argument, a
    missing required one, or one of the wrong type or value."""

    type = "BadArguments"


class InvalidState(BusError):
    """A verb the rank cannot serve in its current state (``step`` while running, …)."""

    type = "InvalidState"


class RankUnavailable(BusError):
    """The rank has exited or is being restored."""

    type = "RankUnavailable"


class SnapshotFailed(BusError):
    """A snapshot or restore the controller tried and could not complete."""

    type = "SnapshotFailed"


class BusTimeout(BusError):
    """No answer within the allotted time (a controller gone away, a rank stuck)."""

    type = "Timeout"


class InternalError(BusError):
    """A bug on the answering side; the message carries what it raised."""

    type = "Internal"


class Unauthorized(BusError):
    """A peer that did not prove who it is: an ``agent.hello`` with the wrong
    session secret or from a process that is not the rank the controller runs."""

    type = "Unauthorized"


class Busy(BusError):
    """A bounded table of the controller is full (clients, requests waiting for the
    rank, snapshot waiters): the request is refused rather than kept."""

    type = "Busy"


class KeysError(BusError):
    """Raised when CURVE keys are needed (a bind beyond loopback, a session that uses
    them) and are missing or unreadable."""

    type = "Keys"


class SessionNotFound(BusError):
    """Raised when no running session matches a rank or session id (or several do and the
    user has to choose); the message lists what is running."""

    type = "SessionNotFound"


class DebuggerError(PrismError):
    """A debugger command that cannot be carried out in the rank's state."""
