"""Where prism-debug finds its own files and puts a run's: the checkout, the
hooks injected into the rank, the default snapshot store, run folders.

What a run leaves is private to its user: the controller works under umask
077, and run folders and the store are made 0700 whatever the umask (a run
folder holds the agent's configuration, its secrets, and the rank's output;
the store holds the rank's whole memory)."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

import prism_debug
from prism_debug.snapshot.store import Store, make_private_dir

PACKAGE_ROOT = Path(prism_debug.__file__).resolve().parent
SOURCE_ROOT = PACKAGE_ROOT.parent
HOOKS_DIR = SOURCE_ROOT / "hooks"
DEFAULT_STORE = SOURCE_ROOT / "snapshots"
PRIVATE_UMASK = 0o077


def _umask_now() -> int:
    mask = os.umask(PRIVATE_UMASK)
    os.umask(mask)
    return mask


# the user's own, read before the controller narrows it: the rank's process
# gets it back, so what the user's script writes is shared as it would be
# without prism-debug
USER_UMASK = _umask_now()

_warned: set[Path] = set()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def open_store(path: Path | None, warn: Callable[[str], None] = _stderr) -> Store:
    """The snapshot store at ``path`` (``--store``), or the default one; a
    store that others can read gets one warning (once per process), staging
    left by dumps that died is swept, and a store that others can write is
    refused (:class:`SnapshotError`) when a snapshot in it is used."""
    store = Store(path or DEFAULT_STORE)
    if path is None:
        _tighten(DEFAULT_STORE)
    refusal, warning = store.problems()
    if warning is not None and store.root not in _warned:
        _warned.add(store.root)
        warn(f"prism-debug: warning: {warning}")
    if refusal is None:
        store.sweep()
    return store


def _tighten(folder: Path) -> None:
    """The default store is prism-debug's own folder (git makes it 0755 with
    the checkout): made 0700 when it is this user's, rather than warned of."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
        os.chmod(folder, 0o700)


def user_cache_dir(env_var: str, name: str) -> Path:
    """``$env_var``, else ``$XDG_CACHE_HOME/prism-debug/name`` (``~/.cache`` when unset):
    where the graph cache and the test snapshots' cache live."""
    named = os.environ.get(env_var)
    if named:
        return Path(named)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prism-debug" / name


def default_run_dir() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "prism-debug" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def make_run_dir(path: Path) -> Path:
    """Make a run folder (and its missing parents) 0700; one that exists,
    named by the user, keeps its mode (its files are made 0600)."""
    make_private_dir(path)
    return path


_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files and folders the controller makes meanwhile are the user's alone
    (the rank's process is started with :data:`USER_UMASK`)."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def private(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` runs under :func:`private_umask`."""
    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with private_umask():
            return function(*args, **kwargs)
    return wrapper
