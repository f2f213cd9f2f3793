"""``pytest examples/scenarios/``: every example scenario is a test item of the
plugin, run by the scenario runner, and passes; what each showed is in the
JUnit report.  (This replaced tests/examples/test_scenarios.py's run of the
same scenarios through ``prism-debug scenario run``: one run of them a suite.)"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree

import pytest

from prism_debug.process.paths import SOURCE_ROOT

SCENARIOS = SOURCE_ROOT / "examples" / "scenarios"
PLUGIN = ("-p", "prism_debug.testing.plugin", "-p", "no:cacheprovider")


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SOURCE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


EVERY_SCENARIO = ["degraded_link", "desync_peer", "dp_peer_fail_stop", "late_peer_of_a_pair",
                  "nan_peer", "slow_node_other_stage", "stochastic_stragglers"]
# The scenarios whose verdicts compare a faulted run's measured times with
# a baseline run's: alone on the machine (``serial``), as another test's
# load would stretch one run and not the other.  The others' bounds hold on
# a busy machine.
TIMED_AGAINST_A_BASELINE = ("degraded_link", "slow_node_other_stage")


def run_items(pytester, *args: str) -> tuple[pytest.RunResult, dict[str, set[str]]]:
    """``pytest *args`` with the plugin; its result, and each case's
    verdicts and properties from the JUnit report (every verdict a PASS)."""
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(*PLUGIN, *args, "-v", "--junitxml", str(junit),
                                           timeout=1800)
    cases = {case.get("name"): {p.get("name") + ":" + p.get("value") if p.get("name") != "expect"
                                else p.get("value") for p in case.iter("property")}
             for case in ElementTree.parse(junit).getroot().iter("testcase")}
    verdicts = [v for props in cases.values() for v in props if v.startswith(("PASS", "FAIL"))]
    assert all(v.startswith("PASS  ") for v in verdicts), verdicts
    return result, cases


def test_the_serial_ones_are_those_a_baseline_run_times():
    from prism_debug.scenario import load_scenario
    from prism_debug.scenario.plan import needs_baseline

    assert sorted(p.stem for p in SCENARIOS.glob("*.yaml")) == EVERY_SCENARIO
    assert tuple(n for n in EVERY_SCENARIO
                 if needs_baseline(load_scenario(SCENARIOS / f"{n}.yaml"))) \
        == TIMED_AGAINST_A_BASELINE


@pytest.mark.slow
def test_pytest_runs_the_example_scenarios_and_each_passes(pytester, env):
    """The folder, less the scenarios timed against a baseline (the next test's)."""
    result, cases = run_items(pytester, str(SCENARIOS), "-k", " and ".join(
        f"not {name}" for name in TIMED_AGAINST_A_BASELINE))
    result.assert_outcomes(passed=5, deselected=2)
    result.stdout.fnmatch_lines(["*nan_peer.yaml::nan_peer PASSED*"])
    assert sorted(cases) == [n for n in EVERY_SCENARIO if n not in TIMED_AGAINST_A_BASELINE]
    assert sum(v.startswith("PASS  ") for props in cases.values() for v in props) == 14
    assert any(v.startswith("PASS  p95 of iteration times >= 100.0 ms and <= 400.0 ms: got ")
               for v in cases["stochastic_stragglers"])
    assert any(v.startswith("PASS  p95 of predicted iteration times >= 100.0 ms and <= 160.0 "
                            "ms: got ") for v in cases["stochastic_stragglers"])
    # what each one showed, beyond passing
    assert ("PASS  flight record shows missing ranks [13]: got missing [13], mismatches none"
            in cases["dp_peer_fail_stop"])
    assert ("PASS  flight record shows a size mismatch: got missing [], mismatches ['size']"
            in cases["desync_peer"])
    assert "PASS  first NaN/inf the rank sends at iteration 3: got iteration 3" \
        in cases["nan_peer"]
    # two real ranks, each judged on its own iterations
    assert any(v.startswith("PASS  rank 0: p100 of iteration times >= 600.0 ms and <= 1500.0 "
                            "ms: got ") and "; rank 1: p100 of iteration times" in v
               for v in cases["late_peer_of_a_pair"])
    # the NaN reached the loss the script prints, at that iteration (0-based there)
    (run_dir,) = [p.split(":", 1)[1] for p in cases["nan_peer"] if p.startswith("run_dir:")]
    log = (pytester.path / run_dir / "run" / "rank.log").read_text()
    assert "iter 1 loss nan" not in log and "iter 2 loss nan" in log


@pytest.mark.slow
@pytest.mark.serial  # relative expectations: a faulted run's times against a baseline's
def test_pytest_runs_the_scenarios_timed_against_a_baseline_and_each_passes(pytester, env):
    result, cases = run_items(pytester, *(str(SCENARIOS / f"{name}.yaml")
                                          for name in TIMED_AGAINST_A_BASELINE))
    result.assert_outcomes(passed=2)
    assert sorted(cases) == list(TIMED_AGAINST_A_BASELINE)
    assert sum(v.startswith("PASS  ") for props in cases.values() for v in props) == 4
    for name in TIMED_AGAINST_A_BASELINE:
        (ratio,) = [p for p in cases[name] if p.startswith("predicted_ratio:")]
        assert float(ratio.split(":")[1]) > 1.05


def test_a_file_pattern_picks_the_scenarios_and_other_yaml_is_left_alone(pytester, env):
    for name in ("nan_peer", "desync_peer"):
        (pytester.path / f"{name}.yaml").write_text((SCENARIOS / f"{name}.yaml").read_text())
    (pytester.path / "config.yaml").write_text("name: not a scenario\nvalues: [1, 2]\n")
    collected = pytester.runpytest_subprocess(*PLUGIN, "--co", "-q", "--prism-scenarios",
                                              "nan_*.yaml")
    collected.stdout.fnmatch_lines(["nan_peer.yaml::nan_peer", "1 test collected*"])
    everything = pytester.runpytest_subprocess(*PLUGIN, "--co", "-q")
    everything.stdout.fnmatch_lines(["desync_peer.yaml::desync_peer", "nan_peer.yaml::nan_peer",
                                     "2 tests collected*"])


def test_a_broken_scenario_fails_its_item_naming_its_lines(pytester, env):
    (pytester.path / "broken.yaml").write_text(
        "name: broken\nworld: {size: 64, rank: 5}\nrun:\n  example: {iterations: 4, tp: 3}\n"
        "  graph: profile\nexpect:\n  - exit_code: 0\n")
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*broken.yaml:4:32: run.example.tp: heads 8 is not divisible "
                                 "by tp 3*"])


def test_the_clis_junit_report_has_a_case_per_expectation(tmp_path):
    """(``scenario run --junit``; its end-to-end run was the test this file replaced.)"""
    from prism_debug.scenario import load_scenario
    from prism_debug.scenario.plan import Verdict
    from prism_debug.workflows.scenario_run import ScenarioResult, junit_xml

    scenario = load_scenario(SCENARIOS / "nan_peer.yaml")
    verdicts = [Verdict(scenario.expect[0], True, "exit code 0: got 0"),
                Verdict(scenario.expect[1], False, "first NaN/inf at iteration 3: got none")]
    suite = ElementTree.fromstring(junit_xml([ScenarioResult(scenario, verdicts, tmp_path, 2.5)]))
    assert (suite.get("tests"), suite.get("failures"), suite.get("time")) == ("2", "1", "2.500")
    cases = [(c.get("classname"), c.get("name"), [f.get("message") for f in c.iter("failure")])
             for c in suite.iter("testcase")]
    assert cases == [("scenario.nan-peer", "exit_code (line 18)", []),
                     ("scenario.nan-peer", "nan_at (line 19)",
                      ["first NaN/inf at iteration 3: got none"])]
