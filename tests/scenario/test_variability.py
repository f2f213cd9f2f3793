"""A scenario's ``variability:`` (run --variability's rules as a list) and the
percentile expectation: read with every error at its line, judged on known
iteration times."""

from __future__ import annotations

import numpy as np
import pytest

from prism_debug.scenario import lint, parse_scenario
from prism_debug.scenario.model import ExpectIterationTime, Scenario
from prism_debug.scenario.plan import Observed, evaluate
from prism_debug.variability import parse_variability

HEAD = "name: t\nworld: {size: 64, rank: 5}\nrun: {command: [python, train.py], graph: g}\n"


def problems(text: str) -> list[str]:
    return [str(p) for p in lint(text, "s.yaml")]


def test_variability_reads_as_the_cli_terms_it_spells():
    scenario = parse_scenario(HEAD + "variability:\n  - {cv: 0.05}\n"
                                     "  - {rank_cv: 0.02, class: 0}\n"
                                     "expect:\n  - iteration_time: {percentile: 99, max_s: 0.3}\n")
    assert scenario.variability == parse_variability(["cv=0.05", "rank-cv=0.02 class=0"])
    assert scenario.expect == (ExpectIterationTime(percentile=99.0, max_s=0.3, line=8),)


def test_variability_errors_name_the_item_and_its_line():
    assert problems(HEAD + "variability:\n  - {cvv: 0.05}\n  - {cv: 0.1, colour: red}\n") == [
        "s.yaml:5:6: variability[0]: unknown key 'cvv': did you mean 'cv'?",
        "s.yaml:6:15: variability[1]: unknown key 'colour': expected one of cv, dist, class, "
        "op, rank_cv",
    ]
    assert problems(HEAD + "variability: {cv: 0.05}\n") == [
        "s.yaml:4:1: variability: expected a list, got a mapping"]
    assert problems(HEAD + "variability: []\n") == [
        "s.yaml:4:1: variability: give at least one rule, or leave variability out"]
    assert problems(HEAD + "variability:\n  - {}\n") == [
        "s.yaml:5:5: variability[0]: an empty rule: give cv, dist, class, op, rank_cv"]


def test_a_rule_the_variability_language_refuses_is_reported_at_its_item():
    found = problems(HEAD + "variability:\n  - {cv: 0.05}\n  - {cv: lots}\n")
    assert len(found) == 1 and found[0].startswith("s.yaml:6:5: variability[1]: ")


@pytest.mark.parametrize("expectation, message", [
    ("{percentile: 150, max_s: 1}",
     "s.yaml:5:34: expect[0].iteration_time.percentile: must be in 0..100, got 150"),
    ("{percentile: 99}",
     "s.yaml:5:34: expect[0].iteration_time.percentile: a percentile takes min_s or max_s"),
    ("{percentile: 99, predicted: true}",
     "s.yaml:5:34: expect[0].iteration_time.percentile: a percentile takes min_s or max_s"),
    ("{percentile: 99, predicted: true, max_s: 1, tolerance: 0.1}",
     "s.yaml:5:76: expect[0].iteration_time.tolerance: tolerance goes with relative or "
     "predicted (a ratio), not with bounds"),
    ("{percentile: 99, iteration: 3, max_s: 1}",
     "s.yaml:5:34: expect[0].iteration_time.percentile: a percentile is over the run's "
     "iterations: give percentile or iteration, not both"),
    ("{percentile: 99, relative: 1.1}",
     "s.yaml:5:34: expect[0].iteration_time.percentile: a percentile takes min_s or max_s"),
])
def test_percentile_expectation_errors(expectation, message):
    assert problems(HEAD + f"expect:\n  - iteration_time: {expectation}\n") == [message]


def judged(expectation: ExpectIterationTime, times: dict[int, float]):
    scenario = Scenario(name="t", world=parse_scenario(HEAD).world, run=parse_scenario(HEAD).run,
                        expect=(expectation,))
    observed = Observed(exit_code=0, exception=None, iteration_times=times, digests={})
    (verdict,) = evaluate(scenario, observed)
    return verdict


# iteration 1 (the warm-up) is left out: 9 s would fail every bound below
TIMES = {1: 9.0, 2: 0.100, 3: 0.120, 4: 0.110, 5: 0.300, 6: 0.130}


def test_percentile_of_the_iterations_after_the_warm_up():
    # the sorted steady times 100, 110, 120, 130, 300 ms: p50 is the middle one,
    # p90 interpolates 90 % of the way between ranks 3 and 4: 130 + 0.6 x 170
    verdict = judged(ExpectIterationTime(percentile=50, max_s=0.121), TIMES)
    assert verdict.passed
    assert verdict.detail == "p50 of iteration times <= 121.0 ms: got 120.0 ms over 5 iterations"
    verdict = judged(ExpectIterationTime(percentile=90, max_s=0.2, line=7), TIMES)
    assert not verdict.passed
    assert np.percentile([0.1, 0.11, 0.12, 0.13, 0.3], 90) == pytest.approx(0.232)
    assert verdict.detail == "p90 of iteration times <= 200.0 ms: got 232.0 ms over 5 iterations"
    verdict = judged(ExpectIterationTime(percentile=0, min_s=0.1, max_s=0.2), TIMES)
    assert verdict.passed and verdict.detail.startswith(
        "p0 of iteration times >= 100.0 ms and <= 200.0 ms: got 100.0 ms")


def test_a_run_with_no_iteration_after_the_warm_up_fails_the_percentile():
    verdict = judged(ExpectIterationTime(percentile=99, max_s=1), {1: 0.5})
    assert not verdict.passed
    assert verdict.detail == ("p99 of iteration times <= 1000.0 ms: the run finished no "
                              "iteration after the first")


def test_a_percentile_of_the_prediction_is_judged_on_predicts_times_not_the_runs():
    from prism_debug.scenario.plan import needs_baseline, needs_distribution, needs_prediction
    scenario = parse_scenario(HEAD + "expect:\n"
                                     "  - iteration_time: {percentile: 95, predicted: true,"
                                     " max_s: 0.13}\n")
    (expectation,) = scenario.expect
    assert expectation.is_predicted_percentile
    # predict's distribution, not a baseline run or the engine's ratio
    assert (needs_distribution(scenario), needs_baseline(scenario),
            needs_prediction(scenario)) == (True, False, False)
    observed = Observed(exit_code=0, exception=None, iteration_times=TIMES, digests={})
    predicted = np.array([[0.100, 0.110], [0.120, 0.130], [0.105, 0.115]])
    (verdict,) = evaluate(scenario, observed, predicted_times=predicted)
    # numpy's linear p95 of the six: 0.120 + 0.75 x 0.010 (the run's times, with
    # its 300 ms iteration, would fail the bound)
    assert verdict.passed
    assert verdict.detail == ("p95 of predicted iteration times <= 130.0 ms: got 127.5 ms over 6 "
                              "predicted iterations")
    (verdict,) = evaluate(scenario, observed)
    assert not verdict.passed
    assert verdict.detail == "p95 of predicted iteration times <= 130.0 ms: no prediction was made"
