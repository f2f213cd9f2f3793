"""Snapshot-based regression tests: a pytest plugin (``plugin.py``) and the
calls it makes, usable without pytest::

    from prism_debug.testing import SnapshotCache, job_for, regression_run

    job = job_for(world_size=64, rank=5, iteration=3)   # the bundled example
    result = regression_run(job, iterations=2, run_dir=Path("check"))
    assert result.exit_code == 0 and result.digests[4] == "..."
"""

from prism_debug.testing.cache import Job, SnapshotCache, cache_dir
from prism_debug.testing.regression import job_for, parse_faults, regression_run
from prism_debug.testing.result import Collective, IterationResult, PrismResult

__all__ = ["Collective", "IterationResult", "Job", "PrismResult", "SnapshotCache", "cache_dir",
           "job_for", "parse_faults", "regression_run"]
