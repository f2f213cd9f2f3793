"""The prism-debug CLI as the tests run it: this Python, output captured,
no stdin (a test must never wait on a terminal)."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``env``: variables set beside this process's."""
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=None if env is None else {**os.environ, **env})
