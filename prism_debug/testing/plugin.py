"""prism-debug's pytest plugin (entry point ``pytest11``; ``-p
prism_debug.testing.plugin`` where plugins are not autoloaded).

* ``prism`` fixture: ``prism(world_size=64, rank=5, iteration=3,
  iterations=2, faults=[...])`` restores the job's snapshot at that iteration
  (recorded on first use, cached: ``cache.py``), puts the faults in force,
  runs the iterations, and returns a :class:`PrismResult`;
* ``@pytest.mark.prism(...)`` with the same arguments, and the
  ``prism_result`` fixture that runs it;
* ``prism_golden``: the result against a golden beside the test (syrupy;
  ``--prism-update`` writes or refreshes it: ``goldens.py``);
* scenario YAML files collected as test items (``collect.py``).

State lives in ``config.stash``, as pytest's own plugins keep theirs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prism_debug.testing.cache import SnapshotCache, cache_dir
from prism_debug.testing.collect import ScenarioFile, is_scenario_file
from prism_debug.testing.regression import job_for, regression_run
from prism_debug.testing.result import DEFAULT_TIME_RTOL, PrismResult

CACHE_KEY = pytest.StashKey[SnapshotCache]()
MARKER = ("prism(world_size, rank, iteration, iterations=1, command=None, example=None, "
          "faults=(), reload=False, time_rtol=1.0): restore the job's snapshot at iteration, "
          "run iterations more with faults; the prism_result fixture holds what it showed")
JOB_ARGUMENTS = ("world_size", "rank", "iteration", "command", "example", "hardware",
                 "gpus_per_node", "seed", "env", "collective_timeout_s")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prism-debug", "prism-debug regression tests")
    group.addoption("--prism-update", action="store_true", default=False,
                    help="write or refresh the goldens of prism tests (syrupy's "
                         "--snapshot-update)")
    group.addoption("--prism-cache", default=None, metavar="DIR",
                    help="the test snapshots' cache (default $PRISM_DEBUG_TEST_CACHE, else "
                         "$XDG_CACHE_HOME/prism-debug/test-snapshots)")
    group.addoption("--prism-scenarios", action="append", default=None, metavar="GLOB",
                    help="which YAML files are collected as scenarios (default *.yaml, "
                         "*.yml: those with world: and run: at their top level)")
    group.addoption("--prism-store", default=None, type=Path, metavar="DIR",
                    help="the snapshot store scenarios with run.snapshot name")
    parser.addini("prism_scenarios", "file patterns of scenario YAML files",
                  type="args", default=["*.yaml", "*.yml"])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    if config.getoption("prism_update"):
        # syrupy's own switch (--snapshot-update's dest): the golden workflow is its
        config.option.update_snapshots = True
    named = config.getoption("prism_cache")
    config.stash[CACHE_KEY] = SnapshotCache(Path(named).resolve() if named else cache_dir())


def pytest_report_header(config: pytest.Config) -> str:
    return f"prism-debug: test snapshots in {config.stash[CACHE_KEY].root}"


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    patterns = parent.config.getoption("prism_scenarios") or parent.config.getini(
        "prism_scenarios")
    if is_scenario_file(file_path, patterns):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class Prism:
    """The ``prism`` fixture: call it to run one regression check."""

    def __init__(self, cache: SnapshotCache, tmp_path: Path, base: Path) -> None:
        self.cache, self._tmp, self._base, self._runs = cache, tmp_path, base, 0

    def __call__(self, *, world_size: int, rank: int, iteration: int, iterations: int = 1,
                 faults=(), reload: bool = False, time_rtol: float = DEFAULT_TIME_RTOL,
                 **job: Any) -> PrismResult:
        unknown = set(job) - set(JOB_ARGUMENTS)
        if unknown:
            raise TypeError(f"prism(): unknown argument {sorted(unknown)[0]!r}")
        spec = job_for(world_size=world_size, rank=rank, iteration=iteration,
                       cwd=self._base, **job)
        self._runs += 1
        return regression_run(spec, iterations=iterations, faults=faults, reload=reload,
                              time_rtol=time_rtol, cache=self.cache,
                              run_dir=self._tmp / f"prism-{self._runs}")


@pytest.fixture(scope="session")
def prism_cache(pytestconfig: pytest.Config) -> SnapshotCache:
    """The test snapshots' cache this session (and its xdist workers) share."""
    return pytestconfig.stash[CACHE_KEY]


@pytest.fixture
def prism(prism_cache: SnapshotCache, tmp_path: Path, request: pytest.FixtureRequest) -> Prism:
    """Restore a job's snapshot at an iteration and run it: ``prism(world_size=,
    rank=, iteration=, iterations=, command= | example=, faults=, reload=)``."""
    return Prism(prism_cache, tmp_path, request.path.parent)


@pytest.fixture
def prism_result(prism: Prism, request: pytest.FixtureRequest) -> PrismResult:
    """What the test's ``@pytest.mark.prism(...)`` run showed."""
    marker = request.node.get_closest_marker("prism")
    if marker is None:
        raise pytest.UsageError("prism_result needs @pytest.mark.prism(world_size=, rank=, "
                                "iteration=, ...) on the test")
    return prism(*marker.args, **marker.kwargs)


@pytest.fixture
def prism_golden(request: pytest.FixtureRequest):
    """A result's golden: ``assert prism_golden == result`` (written by --prism-update)."""
    try:
        from prism_debug.testing.goldens import PrismGoldenExtension  # syrupy, when used
    except ImportError as exc:
        raise pytest.UsageError(f"prism_golden needs syrupy ({exc}): pip install "
                                "'prism-debug[pytest]'") from exc
    return request.getfixturevalue("snapshot").use_extension(PrismGoldenExtension)
