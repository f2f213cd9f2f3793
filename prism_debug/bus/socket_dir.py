"""Where a local bus lives: ``ipc://`` sockets in a directory only its user can enter.

A Unix socket is reached through the file system, so the directory's permissions
are the bus's access control: a 0700 directory owned by the user keeps every other
user out (they cannot even look the socket up), where a loopback TCP port is open to
anyone on the machine.  The directory is checked before each use, because a shared
``/tmp`` lets anybody create the name first: one owned by someone else, reachable by
group or others, or a symbolic link, is refused rather than repaired.

Pure Python (``os`` only): the controller and the tests share the checks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from prism_debug.errors import ConfigError

ENV_VAR = "PRISM_DEBUG_RUNTIME"
# sun_path holds 108 bytes on Linux, the terminating NUL included
MAX_SOCKET_PATH = 107


def runtime_dir() -> Path:
    """$PRISM_DEBUG_RUNTIME, else $XDG_RUNTIME_DIR/prism-debug (per user, on tmpfs,
    short), else /tmp/prism-debug-UID."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "prism-debug"
    return Path("/tmp") / f"prism-debug-{os.geteuid()}"


def private_dir(directory: Path | None = None) -> Path:
    """The runtime directory, made 0700 if missing; :class:`ConfigError` unless it is
    a real directory owned by this user that nobody else can enter."""
    directory = runtime_dir() if directory is None else Path(directory)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot make the bus directory {directory}: {exc.strerror}; set "
                          f"${ENV_VAR} to a private directory") from None
    check_private(directory)
    return directory


def check_private(directory: Path) -> None:
    try:
        info = os.lstat(directory)
    except OSError as exc:
        raise ConfigError(f"cannot check the bus directory {directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the bus directory {directory} is not a directory (a link or a "
                          f"file took its name): remove it or set ${ENV_VAR}")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"the bus directory {directory} belongs to uid {info.st_uid}, not to "
                          f"you (uid {os.geteuid()}): refusing it; set ${ENV_VAR} to a "
                          "directory of your own")
    if info.st_mode & 0o077:
        raise ConfigError(f"the bus directory {directory} is mode "
                          f"{stat.S_IMODE(info.st_mode):04o}: others could reach the bus; "
                          f"chmod 700 {directory}")


def socket_path(directory: Path, name: str) -> str:
    """The ``ipc://`` endpoint of socket ``name`` in ``directory``, whose path must fit
    a Unix socket address."""
    path = str(directory / name)
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(f"the bus socket {path} is {len(path.encode())} bytes long, over "
                          f"the {MAX_SOCKET_PATH} a Unix socket allows: set ${ENV_VAR} to a "
                          "shorter private directory")
    return f"ipc://{path}"


def ipc_path(endpoint: str) -> str | None:
    """The file of an ``ipc://`` endpoint (None for another transport)."""
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
