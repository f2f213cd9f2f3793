"""The seams of the runtime's hooks: what the backend calls on each.

``Runtime.recorder``, ``watch``, ``watchdog``, ``peer_faults`` and ``flight``
are typed by these protocols; production passes the agent's objects (named in
each docstring), tests may pass fakes.  Pure: imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any, Protocol

from prism_debug.backend.tracker import Completion
from prism_debug.backend.watchdog import TimedOutOp
from prism_debug.faults import Injection
from prism_debug.graph import GroupRef

# The PrismProcessGroup that issued an op: not named here, as process_group.py
# imports the runtime, which imports these protocols.
Group = Any


class RecorderHook(Protocol):
    """Records the rank's program while profiling a slice (agent/program.py's ProgramRecorder)."""

    def issue(self, now: float, kind: str, family: str, nbytes: int, dtype: str,
              peer_delta: int = 0, batch: int = 0) -> tuple[int, int]:
        """An op issued at ``now`` (by the runtime's ``batch``-th batch_isend_irecv
        call, or alone: 0); the token its Work hands back."""

    def wait(self, now: float, token: tuple[int, int]) -> None:
        """The script waited for the op of ``token`` until ``now``."""

    def future_requested(self, token: tuple[int, int]) -> None:
        """The op's future was asked for: it is awaited out of sight (DDP's reducer)."""

    def step(self, now: float) -> None:
        """An optimizer step begins (the agent's hook)."""

    def end(self, now: float) -> list[list]:
        """Close the iteration at ``now``; its events (the agent's boundary)."""


class WatchHook(Protocol):
    """Watches collectives for the debugger (the Agent, while it has breakpoints or events)."""

    def enter(self, op: str, ref: GroupRef, seq: int, nbytes: int) -> float:
        """The rank enters the iteration's collective ``seq``; the wall seconds it paused."""

    def exit(self, op: str, ref: GroupRef, seq: int, done: Completion) -> None:
        """The collective ``seq`` is issued; it completes at ``done``."""


class WatchdogHook(Protocol):
    """NCCL's watchdog at an op's deadline (backend/watchdog.py's Watchdog)."""

    def expired(self, op: TimedOutOp) -> Exception | None:
        """``op`` timed out: the error ``wait()`` raises, or None (it hangs on); may end
        the process."""


class PeerFaultsHook(Protocol):
    """What faulty virtual peers hand the real rank (backend/peer_faults.py's PeerFaults)."""

    @property
    def active(self) -> Sized:
        """The faults in force: while empty, the hot path skips ``apply``."""

    def set(self, injections: Iterable[Injection]) -> None:
        """The faults in force, of all kinds (the agent's, as they change)."""

    def apply(self, pg: Group, op: str, result: list, iteration: int, collective: int,
              source: int | None = None) -> bool:
        """Change ``result`` as the faulty peers would; whether anything changed
        (reductions excepted: their values take :meth:`reduction`)."""

    def reduction(self, pg: Group, iteration: int, collective: int) -> tuple:
        """The faulty peers of a reduction: (group rank, "nan" | "inf" | "corrupt", scale)."""


class FlightHook(Protocol):
    """The flight recorder's ring of issued ops and its dump
    (``backend/fr_recorder.py``'s FlightLog)."""

    def note(self, pg: Group, call: str, outputs: list, inputs: list | None, peer: int | None,
             done: Completion, iteration: int) -> None:
        """One op issued, ``call`` as backend/fr_nccl_names.py names it (its sizes,
        never its tensors)."""

    def dump(self, pg_id: int, seq: int,
             faults: Iterable[Injection]) -> tuple[Path, list[int]] | None:
        """Write the dumps of group ``pg_id`` timed out at its op ``seq``; where the
        real rank's went and the ranks with no file (the agent's watchdog callback)."""
