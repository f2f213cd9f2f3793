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
    ("x", "--ranks: cannot read 'x' as ranks: use R, A-B, a list of them separated by commas, "
          "or node N"),
    ("0,99999999", "--ranks: rank 99999999 is outside the world of 4 ranks"),
    ("2-4", "--ranks: rank 4 is outside the world of 4 ranks"),
    ("3-1", "--ranks: the range 3-1 runs backwards"),
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
    ("a", "--slice-ranks: cannot read 'a' as ranks: use R, A-B, a list of them separated by "
          "commas, or node N"),
    ("0,64", "--slice-ranks: rank 64 is outside the world of 64 ranks"),
])
def test_profile_refuses_bad_slice_ranks(tmp_path, ranks, message):
    result = invoke("profile", "--world-size", "64", "--slice-ranks", ranks,
                    "--out", str(tmp_path / "g.json.gz"), "--", "python", "train.py")
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--snapshot-at", "3,x"],
     "--snapshot-at: cannot read 'x' as iterations: use N, A-B, or a list of them separated "
     "by commas"),
    (["--trace-ranks", "0,8192"], "--trace-ranks: rank 8192 is outside the world of 8192 ranks"),
])
def test_run_refuses_bad_iteration_and_rank_lists(args, message):
    result = invoke("run", *args, "--", "python", "train.py")
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")
