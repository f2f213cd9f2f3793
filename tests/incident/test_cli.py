"""``prism-debug incident`` as users meet it: one error line and exit 2 for
a folder that makes no incident; the summary, the skeleton and the scenario
for one that does."""

from prism_debug.graph import ExecutionGraph
from tests.cli import cli
from tests.incident.shapes import world_job


def test_a_folder_that_makes_no_incident_is_one_line_and_exit_2(tmp_path):
    gone = cli("incident", str(tmp_path / "gone"))
    assert (gone.returncode, gone.stdout) == (2, "")
    assert gone.stderr == (f"prism-debug: error: {tmp_path / 'gone'}: no such directory: give "
                           "the folder the job's flight-recorder dumps were written to\n")
    world_job(tmp_path, 4, {0: 2})
    (tmp_path / "out").mkdir()
    refused = cli("incident", str(tmp_path), "--out", str(tmp_path / "out"))
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"Error: Invalid value for '--out': File '{tmp_path / 'out'}' is a directory.")


def test_without_the_code_the_dumps_skeleton_places_the_fault(tmp_path):
    dumps = world_job(tmp_path / "dumps", 4, {0: 5, 1: 5, 2: 4, 3: 5})
    out = tmp_path / "repro.yaml"
    done = cli("incident", str(dumps), "--out", str(out), "--timeout-s", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"incident: 4 dumps in {dumps} (prefix 'nccl_trace_rank_'), world of 4 ranks"
    assert lines[1:4] == [
        "groups: default_pg (4 ranks)",
        "stopped: all_reduce of 1024 Float #5 on group 0 (default_pg, 4 ranks): rank 2 never "
        "arrived; ranks 0-1, 3 waited",
        "last completed: default_pg #4"]
    assert "placed: rank 2's fault at iteration 5, its op 1 (all_reduce on world)" in lines
    assert lines[-1] == f"wrote {out}: reproduce it with prism-debug scenario run {out}"
    skeleton = ExecutionGraph.load(tmp_path / "repro.prism")
    assert skeleton.world_size == 4
    text = out.read_text()
    assert 'graph: "repro.prism"' in text and "timeout_s: 2  # the job's was 5 s" in text
    assert out.stat().st_mode & 0o077 == 0  # the user's alone


def test_dumps_where_nothing_stopped_write_no_scenario(tmp_path):
    dumps = world_job(tmp_path / "dumps", 2, {0: 3, 1: 3})
    done = cli("incident", str(dumps), "--out", str(tmp_path / "repro.yaml"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2:] == [
        "stopped: nowhere the dumps show: every group's members recorded the same collectives "
        "(a hang outside collectives, or dumps written before it)",
        "last completed: default_pg #3",
        "timeout: 5 s (the process group's, from the entries)",
        # torch's analyzer prints nothing of a healthy set
        "fr_trace: no verdict (fr_trace printed no finding) (on copies whose pg_config names "
        "the entries' groups: as written, these dumps stop it)",
        f"no scenario written to {tmp_path / 'repro.yaml'}: the dumps show nothing to reproduce"]
    assert not (tmp_path / "repro.yaml").exists()
