"""Fixtures that cost seconds, made once per test session and shared."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]  # the pytest plugin's tests run real pytest sessions


@pytest.fixture(scope="session", autouse=True)
def graph_cache(tmp_path_factory):
    """The graph cache the session's runs share (never the user's): a script
    a test runs without --graph or --lockstep is profiled once per session."""
    path = tmp_path_factory.mktemp("graph-cache")
    before = os.environ.get("PRISM_DEBUG_GRAPH_CACHE")
    os.environ["PRISM_DEBUG_GRAPH_CACHE"] = str(path)
    yield path
    if before is None:
        del os.environ["PRISM_DEBUG_GRAPH_CACHE"]
    else:
        os.environ["PRISM_DEBUG_GRAPH_CACHE"] = before


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
