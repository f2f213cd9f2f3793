"""Fixtures that cost seconds, made once per test session and shared."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def example_graph(tmp_path_factory):
    """The bundled example profiled at 64 ranks (tp=8 x pp=4 x dp=2), as
    ``prism-debug profile --world-size 64`` writes it."""
    path = tmp_path_factory.mktemp("example-graph") / "example-64.prism"
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile", "--world-size",
                           "64", "--out", str(path)], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path
