"""The rank's side of a snapshot: announce it, idle while CRIU dumps the
process, go on when the controller says so.

The rank is never stopped for a dump: CRIU freezes it (ptrace) for as long
as the dump takes and lets it go after, so a controller that dies mid-dump
leaves no stopped process behind (and takes the rank along: its parent-death
signal).  Meanwhile the rank idles here, reading its control file, which the
controller rewrites in place once the images are written.  A control file
is trusted only when it names this wait's ticket (a file left from an
earlier wait, or a restore's, says nothing about this one), or, once, when
it carries a restore's instructions this process has not followed yet (a
copy CRIU restored wakes up here).  When the controller cannot write the
file (a full disk, the file gone) it sends the release signal the
announcement names: the rank must go on whatever befalls the disk.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from prism_debug.snapshot.control import Control, Go, RestoreControl, decode

# a real-time signal, which nothing torch or a launcher sends
RELEASE_SIGNAL = signal.SIGRTMIN + 6
_POLL_S = 0.001
_releases = 0  # release signals received by this process


def _count_release(signum, frame) -> None:
    global _releases
    _releases += 1


class Handshake:
    def __init__(self, control_path: str | None) -> None:
        # held open: a restore swaps this very descriptor for the new run's file
        self._control = os.open(control_path, os.O_RDONLY) if control_path else None
        self._restored_from: str | None = None  # the restore this process followed

    def wait(self, iteration: int,
             announce: Callable[[dict], None]) -> RestoreControl | None:
        """Announce the snapshot of ``iteration`` (``announce`` gets the fields
        the controller needs) and idle until it is over; a restore's
        instructions when this process is a copy that woke up here, else None."""
        ticket = os.urandom(6).hex()
        released = _releases
        announce({"ticket": ticket, "release_signal": self._release_signal()})
        while not self._lets_go(control := self.read(), iteration, ticket):
            if _releases != released:
                return None  # what the file holds is not this wait's
            time.sleep(_POLL_S)
        if isinstance(control, RestoreControl):
            self._restored_from = control.snapshot
            return control
        return None

    def _lets_go(self, control: Control | None, iteration: int, ticket: str) -> bool:
        """A go for this wait: the release naming its ticket, or a restore's
        instructions this process has not followed yet."""
        if control is None or control.stop_at != iteration:
            return False
        if isinstance(control, Go):
            return control.ticket == ticket
        return control.snapshot != self._restored_from

    def read(self) -> Control | None:
        """What the control file says; None while it is empty or half written."""
        if self._control is None:
            return None
        return decode(os.pread(self._control, 1 << 16, 0))

    def _release_signal(self) -> int | None:
        """The signal that ends a wait (its handler installed on first use);
        None where it cannot be: off the main thread (Python's rule), or when
        the script handles that signal itself."""
        try:
            current = signal.getsignal(RELEASE_SIGNAL)
            if current is not _count_release:
                if current not in (signal.SIG_DFL, None):
                    return None
                signal.signal(RELEASE_SIGNAL, _count_release)
        except ValueError:
            return None
        return int(RELEASE_SIGNAL)
