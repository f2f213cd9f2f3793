"""What the tests' session fixtures make once and share with every
pytest-xdist worker of the session: a folder they all see, and products
made in it once, under a lock (``flock``: the kernel lets it go if a worker
dies)."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from prism_debug.snapshot.store import exclusive_lock

T = TypeVar("T")


# make test's two phases (tools/run_tests.sh) are two pytest sessions: this
# folder, where it names one, is what both share, so the serial phase reads
# the profiled graphs and real torchrun incidents the parallel one made
# instead of making them again (not the graph cache: see conftest.graph_cache)
SHARED_ENV = "PRISM_DEBUG_TESTS_SHARED"


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str, *,
               across_sessions: bool = True) -> Path:
    """A folder of this test session that all its xdist workers share (a
    worker's base temp is a folder of the session's), or, ``across_sessions``,
    of every session given ``$PRISM_DEBUG_TESTS_SHARED``."""
    base = tmp_path_factory.getbasetemp()
    if across_sessions and os.environ.get(SHARED_ENV):
        base = Path(os.environ[SHARED_ENV])
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], T]) -> T:
    """What ``make(folder)`` returns, made once for the whole session (every
    xdist worker's) in a folder they share: the first worker to ask makes it
    under a lock and keeps its pickle; the others wait and read that.  For
    products that are read only (a test that changes one copies it first).
    Each attempt gets an empty folder of its own, so a worker that tries
    again after another's failure finds nothing the failed one left."""
    shared = shared_dir(tmp_path_factory, name)
    made = shared / "made.pickle"
    with exclusive_lock(shared / "lock"):
        if not made.exists():
            product = make(Path(tempfile.mkdtemp(dir=shared, prefix="made-")))
            partial = made.with_suffix(f".{os.getpid()}.partial")
            partial.write_bytes(pickle.dumps(product))
            partial.rename(made)
            return product
    return pickle.loads(made.read_bytes())
