"""Real incidents, made once per test session: torchrun jobs of the
device-time workload (8 processes) in which one rank hangs, dies, or
all-reduces a bucket of the wrong size, and the flight-recorder dumps that
torch itself wrote in them (tools/incident_jobs.py).  A job takes seconds
(start-up, and the 5 s timeout for the hang); tests that use one are slow.
Each job runs once for the session, whichever xdist worker asks first, and
its dumps are read only (a test that repairs one copies it)."""

import pytest

from tests.shared import made_once
from tools.incident_jobs import run_real_incident

CULPRIT = 2  # dp rank 1 of pipeline stage 0 in either layout below


@pytest.fixture(scope="session")
def real_hang(tmp_path_factory):
    """pp 2 x tp 2 x dp 2: rank 2 stops before iteration 3's first dp bucket."""
    return made_once(tmp_path_factory, "real-hang",
                     lambda folder: run_real_incident("hang", folder, culprit=CULPRIT))


@pytest.fixture(scope="session")
def real_die(tmp_path_factory):
    """pp 2 x tp 2 x dp 2: rank 2 SIGKILLs itself before iteration 3's first dp bucket."""
    return made_once(tmp_path_factory, "real-die",
                     lambda folder: run_real_incident("die", folder, culprit=CULPRIT))


@pytest.fixture(scope="session")
def real_size(tmp_path_factory):
    """pp 2 x dp 4 (no tp: 8 processes have no room for dp > 2 beside it):
    rank 2 all-reduces twice iteration 3's first bucket.  gloo aborts a peer
    that receives too many bytes (SIGABRT: no dump); with dp 2 that is the
    culprit's only peer, and nothing is left to compare the culprit with."""
    return made_once(tmp_path_factory, "real-size",
                     lambda folder: run_real_incident("size", folder, culprit=CULPRIT, tp=1))
