"""The public Python API refuses what cannot work before anything starts."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from prism_debug import api
from prism_debug.errors import ConfigError, ScenarioError
from prism_debug.snapshot.store import Store
from tests.cli import cli
from tests.snapshot.test_store import manifest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


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


@pytest.mark.slow
def test_the_api_with_its_defaults_runs_what_prism_debug_run_runs(tmp_path):
    # the same arguments from the shell and from Python: the same graph (the
    # session's cache profiles the job once), hardware, peers and values.
    # Virtual rank 2 arrives 0.2 s late at each op, so the last arrival at every world
    # all-reduce is a peer's, not the real rank's compute noise
    script = [sys.executable, str(SCRIPTS / "train_steps.py"), "--iterations", "4"]
    proc = cli("run", "--world-size", "64", "--rank", "5", "--perturb", "delay 2 0.2",
               "--run-dir", str(tmp_path / "cli"), "--report", str(tmp_path / "cli.json"),
               "--", *script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shell = json.loads((tmp_path / "cli.json").read_text())
    result = api.run(api.RunOptions(command=script, rank=5, world_size=64,
                                    faults=(api.parse_fault("delay 2 0.2"),),
                                    run_dir=tmp_path / "api"))
    assert result.exit_code == 0
    python = result.report

    def last_arrivals(report):  # after the first iteration (the real rank's warm-up)
        return [(it["last_arrival"]["rank"], it["last_arrival"]["op"])
                for it in report["iterations"][1:] if "last_arrival" in it]

    assert [it["digest"] for it in python["iterations"]] == \
        [it["digest"] for it in shell["iterations"]]
    # peers replayed from the job's graph (perturbations need one): the slowed
    # peer is the last arrival in both
    assert last_arrivals(python) == last_arrivals(shell) != []
    assert {rank for rank, _ in last_arrivals(python)} == {2}
    assert (python["hardware"], python["world_size"], python["rank"]) == \
        (shell["hardware"], 64, 5) == ("h100-ib400", 64, 5)
    # the emulated times: the same peers and costs around this machine's compute
    assert [it["time_s"] for it in python["iterations"]][1:] == pytest.approx(
        [it["time_s"] for it in shell["iterations"]][1:], rel=0.5)
