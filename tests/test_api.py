"""The public Python API refuses what cannot work before anything starts."""

from __future__ import annotations

import dataclasses

import pytest

from prism_debug import api
from prism_debug.errors import ConfigError, ScenarioError
from prism_debug.snapshot.store import Store
from tests.snapshot.test_store import manifest


def test_faults_at_restore_need_a_snapshot_taken_with_a_graph(tmp_path):
    store = Store(tmp_path / "store")
    staging = store.staging("r4097-it2-abcdef")
    (staging / "pages-1.img").write_bytes(b"pages")
    store.commit(staging, dataclasses.replace(manifest("r4097-it2-abcdef"), script_digest=None))
    options = api.RestoreOptions(snapshot_id="r4097-it2-abcdef", store=store.root,
                                 faults=(api.parse_fault("fail 13 at 3"),), bind=None,
                                 run_dir=tmp_path / "run")
    with pytest.raises(ConfigError) as info:
        api.restore(options)
    assert str(info.value) == ("faults act on virtual peers replayed from a graph; snapshot "
                               "r4097-it2-abcdef was taken from a run whose peers arrived in "
                               "lockstep")
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_run_checks_its_faults_against_its_graph_first(tmp_path):
    graph = tmp_path / "missing.prism"
    options = api.RunOptions(command=["true"], rank=0, world_size=4,
                             profile=api.load_profile("zero"), graph_path=graph,
                             faults=(api.parse_fault("fail 1"),), bind=None,
                             run_dir=tmp_path / "run")
    with pytest.raises(api.PrismError, match="no graph file at"):
        api.run(options)
    assert not (tmp_path / "run").exists()


def test_an_incident_imports_through_the_api(tmp_path):
    from tests.incident.shapes import world_job

    dumps = world_job(tmp_path / "dumps", 4, {0: 3, 1: 3, 2: 2, 3: 3})
    found = api.import_incident(api.IncidentOptions(dump_dir=dumps, out=tmp_path / "r.yaml"))
    assert (found.incident.stop.seq, found.incident.stop.culprits) == (3, (2,))
    assert found.summary[2].startswith("stopped: all_reduce of 1024 Float #3 on group 0")
    # no command was given: the scenario says what to add before it runs
    with pytest.raises(ScenarioError, match=r"run: give one of command, example, snapshot"):
        api.load_scenario(found.scenario)
