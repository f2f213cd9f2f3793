"""Fixtures the bus tests share."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.live_session import session_dir  # noqa: F401 (a fixture, shared)


@pytest.fixture
def short_dir():
    """A short directory for sockets (tmp_path can pass a Unix socket's length)."""
    path = Path(tempfile.mkdtemp(prefix="pd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
