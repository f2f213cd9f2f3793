"""One exception hierarchy for prism-debug.

Every error a user can meet derives from :class:`PrismError`; its message says
what went wrong *and what to do about it*.  The CLI turns a ``PrismError`` into
one line on stderr and a non-zero exit in exactly one place (``cli.main``).
"""

from __future__ import annotations


class PrismError(Exception):
    """Base class of every error prism-debug raises on purpose."""

    #: Exit code the CLI uses when this error ends a command.
    exit_code: int = 2


class ConfigError(PrismError, ValueError):
    """Raised for bad user input: a rank outside the world, an impossible layout,
    an option out of range, a malformed configuration file."""


class HardwareProfileError(ConfigError):
    """Raised when a hardware profile cannot be found or is malformed."""


class LaunchError(PrismError):
    """Raised when the real rank's process cannot be started or never reaches
    ``init_process_group``."""

    exit_code = 3


class UnsupportedOperation(PrismError):
    """Raised inside the real rank when a script uses a torch.distributed feature
    the emulation cannot serve faithfully; the message names the alternative."""
