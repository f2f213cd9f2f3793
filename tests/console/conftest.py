"""Fixtures the console tests share."""

from __future__ import annotations

from tests.live_session import session_dir  # noqa: F401 (a fixture, shared)
