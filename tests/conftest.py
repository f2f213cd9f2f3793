"""Fixtures that cost seconds, made once per test session and shared — with
every pytest-xdist worker of the session too: what they make lives in a
folder the workers share, each product made once under a lock (``flock``:
the kernel lets it go if a worker dies) and read by all."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.shared import made_once, shared_dir

pytest_plugins = ["pytester"]  # the pytest plugin's tests run real pytest sessions

# Every process the tests start runs torch on one thread, as torchrun runs
# several processes on one host (unless the environment sets it): two xdist
# workers share two cores, and torch's OpenMP threads spin while they wait,
# so ranks of two threads each measured each other's spinning
# (tests/runner/test_graph_run.py: 101 s on two threads, 72 s on one).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def graph_cache(tmp_path_factory):
    """The graph cache the session's runs share (never the user's): a script
    a test runs without --graph or --lockstep is profiled once per session,
    by whichever worker asks first (the cache locks each job's key).  Not
    shared with make test's serial phase: its timing checks replay graphs
    profiled on the quiet machine they run on, not under the first phase's
    load (against such a graph a late peer stretched a real rank's iteration
    to 205.8 ms, where the check asks for 250)."""
    path = shared_dir(tmp_path_factory, "graph-cache", across_sessions=False)
    before = os.environ.get("PRISM_DEBUG_GRAPH_CACHE")
    os.environ["PRISM_DEBUG_GRAPH_CACHE"] = str(path)
    yield path
    if before is None:
        del os.environ["PRISM_DEBUG_GRAPH_CACHE"]
    else:
        os.environ["PRISM_DEBUG_GRAPH_CACHE"] = before


@pytest.fixture(scope="session")
def profiled_graph(tmp_path_factory) -> Callable[..., Path]:
    """``profiled_graph(*args)``: the graph ``prism-debug profile --out FILE
    *args`` writes, profiled once per session for each ``args`` (and shared by
    the workers). Read-only: a test that changes a graph copies it first."""

    def get(*args: object) -> Path:
        words = [str(a) for a in args]
        key = hashlib.sha256("\0".join(words).encode()).hexdigest()[:16]
        return made_once(tmp_path_factory, f"profiled-{key}",
                         lambda folder: _profiled(folder / "graph.prism", words))

    return get


def _profiled(graph: Path, words: list[str]) -> Path:
    """``graph`` as ``prism-debug profile`` writes it, what it printed beside it."""
    # (--out first: the words may end with "--" and the command)
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile",
                           "--out", str(graph), *words],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    graph.with_suffix(".out").write_text(proc.stdout + proc.stderr)
    return graph


def profile_output(graph: Path) -> str:
    """What ``prism-debug profile`` printed when it wrote ``graph`` (a graph
    of :func:`profiled_graph`)."""
    return graph.with_suffix(".out").read_text()


@pytest.fixture(scope="session")
def example_graph(profiled_graph):
    """The bundled example profiled at 64 ranks (tp=8 x pp=4 x dp=2), as
    ``prism-debug profile --world-size 64`` writes it."""
    return profiled_graph("--world-size", "64")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs a profiled graph runs real ranks to get it: slow
    (``make test-fast`` leaves it out)."""
    for item in items:
        if {"example_graph", "profiled_graph"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
