"""Where prism-debug finds its own files and puts a run's: the checkout, the
hooks injected into the rank, the default snapshot store, run folders."""

from __future__ import annotations

import os
import time
from pathlib import Path

import prism_debug
from prism_debug.snapshot.store import Store

PACKAGE_ROOT = Path(prism_debug.__file__).resolve().parent
SOURCE_ROOT = PACKAGE_ROOT.parent
HOOKS_DIR = SOURCE_ROOT / "hooks"
DEFAULT_STORE = SOURCE_ROOT / "snapshots"


def open_store(path: Path | None) -> Store:
    """The snapshot store at ``path`` (``--store``), or the default one."""
    return Store(path or DEFAULT_STORE)


def default_run_dir() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "prism-debug" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
