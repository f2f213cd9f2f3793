"""Bad rank lists end a command with one clear line and exit code 2, not a traceback."""

import json

import pytest
from click.testing import CliRunner

from prism_debug.cli import main
from tests.engine.test_replay import pipeline_graph


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "g.json.gz"
    pipeline_graph().save(path)  # world of 4: (pp 2, tp 2)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(("ranks", "message"), [
    ("x", "'x' is not a rank or a range of ranks such as 4096-4103"),
    ("0,99999999", "rank 99999999 is outside the graph's world of 4"),
    ("2-4", "rank 4 is outside the graph's world of 4"),
])
def test_replay_refuses_bad_ranks(graph_file, ranks, message):
    result = invoke("replay", graph_file, "--ranks", ranks)
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")


def test_replay_reports_the_ranks_it_is_given_or_one_per_class(graph_file):
    result = invoke("replay", graph_file, "--ranks", "1,3", "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    # 1 s of compute a stage, ops of 64 bytes (microseconds); stage 1 first waits for stage 0
    assert json.loads(result.stdout)["times_s"] == {
        "1": pytest.approx([1.0, 1.0], abs=1e-3), "3": pytest.approx([2.0, 1.0], abs=1e-3)}
    result = invoke("replay", graph_file, "--iterations", "1", "--json")
    assert json.loads(result.stdout)["times_s"].keys() == {"0", "2"}


@pytest.mark.parametrize(("ranks", "message"), [
    ("a", "'a' is not a rank or a range of ranks such as 4096-4103"),
    ("0,64", "slice rank 64 is outside the world of 64"),
])
def test_profile_refuses_bad_slice_ranks(tmp_path, ranks, message):
    result = invoke("profile", "--world-size", "64", "--slice-ranks", ranks,
                    "--out", str(tmp_path / "g.json.gz"), "--", "python", "train.py")
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")
