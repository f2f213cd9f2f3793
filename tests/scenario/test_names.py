"""A scenario's name becomes part of its run folder's path: it must match a
safe pattern, and a file naming ``../../x`` is refused before anything is
written; its numbers are bounded as the command line's are."""

import subprocess
import sys

import pytest

from prism_debug.errors import ScenarioError
from prism_debug.scenario import lint, parse_scenario

BODY = "world: {size: 64, rank: 5}\nrun: {command: [no-such-program-here]}\n"
PATTERN = ("use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")


@pytest.mark.parametrize("name", ["../../x", "..", ".hidden", "-rf", "a/b", "/etc", "a b",
                                  "x" * 65, "a:b", "ünïcode"])
def test_an_unsafe_name_is_one_problem_at_its_value(name):
    shown = repr(name) if len(repr(name)) <= 40 else repr(name)[:39] + "…"
    assert [str(p) for p in lint(f"name: {name!r}\n" + BODY, "s.yaml")] == [
        f"s.yaml:1:7: name: must be a safe name, got {shown}: {PATTERN}"]


@pytest.mark.parametrize("name", ["t", "dp-peer-fail-stop", "v1.2_final", "A" * 64, "0day"])
def test_safe_names_are_taken_as_written(name):
    assert parse_scenario(f"name: {name}\n" + BODY).name == name


@pytest.mark.parametrize(("line", "message"), [
    ("seed: 18446744073709551616", "seed: must be <= 9223372036854775807, got "
                                   "18446744073709551616"),
    ("world: {size: 4294967296, rank: 0}", "world.size: must be <= 2147483647, got 4294967296"),
    ("run: {command: [a], timeout_s: 1.0e+300}", "run.timeout_s: must be <= 1000000, got 1e+300"),
    ("run: {command: [a], iterations: 10000000000}",
     "run.iterations: must be <= 1000000000, got 10000000000"),
])
def test_numbers_beyond_what_a_run_takes_are_problems(line, message):
    key = line.split(":")[0]
    text = "name: t\n" + "\n".join(
        row for row in BODY.splitlines() if not row.startswith(key + ":")) + "\n" + line + "\n"
    assert [p.message for p in lint(text)] == [message]


def test_a_scenario_named_dot_dot_writes_nothing_outside_its_run_folder(tmp_path):
    base = tmp_path / "a" / "b"
    base.mkdir(parents=True)
    scenario = base / "s.yaml"
    scenario.write_text("name: ../../../escaped\n" + BODY)
    runs = base / "runs"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "scenario", "run",
                          "--run-dir", str(runs), str(scenario)],
                         capture_output=True, text=True, timeout=120)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert (out.returncode, out.stdout) == (2, "")
    # (scenario run checks what lint checks, the command too)
    assert out.stderr == (f"prism-debug: error: {scenario}:1:7: name: must be a safe name, got "
                          f"'../../../escaped': {PATTERN}\n"
                          f"{scenario}:3:17: run.command[0]: command not found: "
                          "no-such-program-here: give a program on PATH or the path to one\n")
    assert after == before  # nothing made: not runs/, not a/escaped


def test_a_scenario_file_larger_than_any_scenario_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\n" + BODY + "#" * (1 << 20) + "\n")
    from prism_debug.scenario import load_scenario

    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value) == (f"cannot read scenario {path}: larger than 1024 KiB, which no "
                                 "scenario is")
