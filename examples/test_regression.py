"""Regression tests of the bundled example, from a snapshot (the documentation's
"Regression tests" guide): ``pytest examples/test_regression.py``.

Each test restores rank 5 of a 64-rank job (tp=8 x pp=4 x dp=2) after
iteration 3 — recorded the first time a test asks for it, then taken from
the cache under a key of everything it depends on — puts the test's faults
in force, and runs on from there.  ``prism_golden`` compares a result with
the golden file beside this one (``__snapshots__/test_regression/``),
written or refreshed by ``pytest examples/test_regression.py --prism-update``.
(The plugin is autoloaded once prism-debug is installed; otherwise add
``-p prism_debug.testing.plugin``.)
"""

import pytest

# the job as a test names it: the bundled example (no command=), the rank,
# the iteration its snapshot is taken after, the groups' timeout (fixed in
# the snapshot: a dead peer's test waits for it)
JOB = dict(world_size=64, rank=5, iteration=3, collective_timeout_s=2)


def test_iterations_4_and_5_match_the_golden(prism, prism_golden):
    result = prism(**JOB, iterations=2, time_rtol=0.5)
    assert result.exit_code == 0 and result.exception is None
    # digests and the collective sequence bit for bit, times within ±50 %
    assert prism_golden == result


def test_a_late_data_parallel_peer_changes_no_value(prism):
    clean = prism(**JOB, iterations=2)
    late = prism(**JOB, iterations=2, faults=["delay 13 0.3 family dp from 4 for 1"])
    assert late.exit_code == 0
    assert late.digests == clean.digests  # {4: '2b20…', 5: '29a0…'}
    assert [op.line() for op in late.collectives] == [op.line() for op in clean.collectives]


@pytest.mark.prism(**JOB, iterations=2, faults=["fail 13 at 4"])
def test_a_dead_data_parallel_peer_brings_the_watchdog_down(prism_result):
    kind, message = prism_result.exception
    assert kind.endswith("DistBackendError")
    assert "Watchdog caught collective operation timeout" in message
    assert prism_result.iterations == ()  # iteration 4 never completed
    assert prism_result.exit_code != 0


def test_nan_from_a_tensor_parallel_peer_shows_in_its_first_all_reduce(prism):
    clean = prism(**JOB, iterations=1)
    nan = prism(**JOB, iterations=1, faults=["nan 4 family tp at 4"])
    assert nan.digests[4] != clean.digests[4]
    # the per-collective digests name the first op whose values differ
    first = next(i for i, (a, b) in enumerate(zip(nan.collectives, clean.collectives, strict=True))
                 if a.digest != b.digest)
    assert (first, nan.collectives[first].op, nan.collectives[first].family) == (
        0, "all_reduce", "tp")
