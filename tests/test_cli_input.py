"""Bad rank lists end a command with one clear line and exit code 2, not a traceback."""

import json
import subprocess
import sys
import time

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


# -- numbers: every numeric option finite and within its bounds, one line, exit 2 -----------

@pytest.mark.parametrize(("args", "message"), [
    (["--collective-timeout", "nan"], "--collective-timeout must be a finite number, got nan"),
    (["--collective-timeout", "inf"], "--collective-timeout must be a finite number, got inf"),
    (["--collective-timeout", "1e999"], "--collective-timeout must be a finite number, got inf"),
    (["--collective-timeout", "1e7"], "--collective-timeout must be at most 1000000, got "
                                      "10000000.0"),
    (["--collective-timeout", "0"], "--collective-timeout must be positive, got 0.0"),
    (["--collective-timeout", "soon"],
     "--collective-timeout: 'soon' is not a number: give a number in (0, 1000000]"),
    (["--world-size", "0"], "--world-size must be at least 1, got 0"),
    (["--world-size", "1e3"],
     "--world-size: '1e3' is not an integer: give an integer in [1, 2147483647]"),
    (["--rank", "-1"], "--rank must be at least 0, got -1"),
    (["--rank", "9" * 5000], f"--rank: '{'9' * 40}' is not an integer: give an integer in "
                             "[0, 2147483646]"),
    (["--iterations", "0"], "--iterations must be at least 1, got 0"),
    (["--seed", "-1"], "--seed must be at least 0, got -1"),
    (["--seed", str(2**64)], f"--seed must be at most 9223372036854775807, got {2**64}"),
    (["--snapshot-every", "0"], "--snapshot-every must be at least 1, got 0"),
    (["--history", "0"], "--history must be at least 1, got 0"),
    (["--history", "1001"], "--history must be at most 1000, got 1001"),
    (["--history", "3", "--no-bus"], "--history keeps snapshots for the console's back and "
                                     "reverse-continue, which --no-bus rules out"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be at least 1, got 0"),
    (["--snapshot-at", "1-10000000000"],
     "--snapshot-at: iterations go up to 1000000000, not 10000000000"),
    (["--snapshot-at", "1-1000000"],
     "--snapshot-at: 1000000 iterations listed, more than the 65536 a list may hold: list fewer"),
    (["--snapshot-at", "1-" + "9" * 5000],
     f"--snapshot-at: cannot read '1-{'9' * 5000}' as iterations: use N, A-B, or a list of "
     "them separated by commas"),
    (["--world-size", "2000000000", "--trace-ranks", "0-1999999999"],
     "--trace-ranks: 2000000000 ranks listed, more than the 65536 a list may hold: list fewer"),
])
def test_run_refuses_numbers_out_of_bounds_in_one_line(args, message):
    result = invoke("run", *args, "--", "python", "train.py")
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")


@pytest.mark.parametrize(("args", "message"), [
    (["cost", "--op", "all_reduce", "--bytes", "1M", "--ranks", "0"],
     "--ranks must be at least 1, got 0"),
    (["cost", "--op", "all_reduce", "--bytes", "1M", "--ranks", "8", "--gpus-per-node", "0"],
     "--gpus-per-node must be at least 1, got 0"),
    (["cost", "--op", "all_reduce", "--bytes", "9" * 400 + "T", "--ranks", "8"],
     f"--bytes: '{'9' * 40}' is not a size such as 4096, 64K, 1M or 8GiB"),
    (["cost", "--op", "all_reduce", "--bytes", "99999999999999999999T", "--ranks", "8"],
     "--bytes must be at most 1024T (1125899906842624 bytes), got 99999999999999999999T"),
    (["calibrate", "--local", "--processes", "1000", "--out", "x.toml"],
     "--processes must be at most 64, got 1000"),
    (["profile", "--world-size", "-4", "--out", "g.prism"],
     "--world-size must be at least 1, got -4"),
    (["snapshot", "restore", "x", "--iterations", "nan"],
     "--iterations: 'nan' is not an integer: give an integer in [1, 1000000000]"),
])
def test_other_commands_refuse_numbers_out_of_bounds_in_one_line(args, message):
    result = invoke(*args)
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")


def test_replay_refuses_more_iterations_than_a_table_shows(graph_file):
    result = invoke("replay", graph_file, "--iterations", "1000000000")
    assert (result.exit_code, result.stderr) == (
        2, "prism-debug: error: --iterations must be at most 10000, got 1000000000\n")


def test_a_huge_snapshot_range_is_refused_at_once_without_a_traceback():
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "run", "--snapshot-at",
                          "1-10000000000", "--", "python", "train.py"],
                         capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert (out.returncode, out.stdout, out.stderr) == (
        2, "", "prism-debug: error: --snapshot-at: iterations go up to 1000000000, not "
               "10000000000\n")
    assert elapsed < 20  # the interpreter's start; the check itself expands nothing


def test_nan_timeout_from_the_command_line_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "run", "--collective-timeout",
                          "nan", "--", "python", "train.py"],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (
        2, "prism-debug: error: --collective-timeout must be a finite number, got nan\n")
