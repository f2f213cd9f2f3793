"""Scenario faults as typed values, and from observations to verdicts."""

from __future__ import annotations

import dataclasses

import pytest

from prism_debug.faults import fault_from_dict, fault_text, parse_fault, resolve
from prism_debug.scenario import parse_scenario
from prism_debug.scenario.plan import (
    FlightFindings,
    Observed,
    evaluate,
    exception_from_output,
    flight_findings,
    needs_baseline,
    needs_prediction,
    predicted_ratio,
)
from tests.engine.test_replay import constant_cost, pipeline_graph

HEAD = "name: t\nworld: {size: 64, rank: 5}\nrun: {example: {iterations: 4}, graph: g.prism}\n"


def scenario(body: str):
    return parse_scenario(HEAD + body, "s.yaml")


def test_each_fault_is_the_line_the_console_would_take():
    s = scenario(
        "faults:\n"
        "  - {action: fail, select: {ranks: '13'}, at: {iteration: 3}}\n"
        "  - {action: hang, select: {ranks: '8-11'}, at: {iteration: 2, collective: 4},"
        " for: {time_s: 0.5}}\n"
        "  - {action: slow, select: {node: 6}, factor: 1.16, for: {iterations: 2}}\n"
        "  - {action: delay, select: {ranks: '1,3'}, seconds: 0.005, family: dp}\n"
        "  - {action: link, select: {nodes: '1-2'}, latency_us: 20,"
        " intermittent: {period_s: 0.5, duty: 0.2}}\n"
        "  - {action: nan, select: {ranks: '49'}, family: tp}\n"
        "  - {action: corrupt, select: {ranks: '7'}, scale: -2.5}\n"
        "  - {action: desync, select: {ranks: '13'}, kind: skip, family: dp}\n")
    texts = [fault_text(f) for f in s.seeded_faults()]
    assert texts == [
        "fail 13 from 3",
        "hang 8-11 from 2 op 4 for 0.5",
        "slow node:6 1.16 for 2",
        "delay 1,3 0.005 family dp",
        "link 1-2 1 20 flap 0.5 0.2",
        "nan 49 family tp",
        "corrupt 7 -2.5",
        "desync 13 skip family dp",
    ]
    # the file's fault and the typed line are one value
    for text, fault in zip(texts, s.faults, strict=True):
        typed = parse_fault(text, 64, 8)
        if fault.action == "link":  # a latency-only link: the line spells bandwidth x1
            fault = dataclasses.replace(fault, bandwidth_factor=1.0)
        assert typed == fault and fault_text(typed) == text
    assert s.fault_ranks(2) == list(range(48, 56))


def test_family_and_class_selectors_resolve_through_the_graph():
    s = parse_scenario("name: t\nworld: {size: 4, rank: 0}\nrun: {command: [x], graph: g}\n"
                       "faults:\n  - {action: fail, select: {family: tp, group: 1}}\n"
                       "  - {action: fail, select: {class: 1}}\n", "s.yaml")
    assert [s.fault_ranks(i, pipeline_graph()) for i in range(2)] == [[2, 3], [2, 3]]


def test_for_a_live_rank_selectors_stay_words_it_resolves():
    s = scenario("seed: 7\nfaults:\n"
                 "  - {action: fail, select: {family: dp, group: 3}}\n"
                 "  - {action: slow, factor: 2, select: {class: 1}}\n"
                 "  - {action: nan, select: {fraction: 0.1}}\n"
                 "  - {action: hang, select: {nodes: '2-3'}}\n")
    faults = s.seeded_faults()
    assert [fault_text(f) for f in faults] == ["fail family:dp:3", "slow class:1 2",
                                                "nan fraction:0.1:7/2", "hang node:2-3"]
    # the fraction draws the ranks Scenario.fault_ranks draws, wherever it is resolved
    assert list(resolve(fault_from_dict(faults[2].to_dict()), 64, 8).targets) == \
        s.fault_ranks(2)
    assert list(resolve(faults[3], 64, 8).targets) == list(range(16, 32))


def test_the_exception_is_the_last_traceback_or_the_watchdogs_terminate():
    python = ["[rank5]:Traceback (most recent call last):", '[rank5]:  File "t.py", line 3',
              "[rank5]:    work.wait()",
              "[rank5]:torch.distributed.DistBackendError: [Rank 0] Watchdog caught it"]
    assert exception_from_output(python) == ("torch.distributed.DistBackendError",
                                             "[Rank 0] Watchdog caught it")
    aborted = ["terminate called after throwing an instance of 'c10::DistBackendError'",
               "  what():  [PG ID 2 PG GUID 2 Rank 0] Process group watchdog thread terminated"]
    assert exception_from_output(["iter 0 loss 7.0", *aborted]) == \
        ("c10::DistBackendError", "[PG ID 2 PG GUID 2 Rank 0] Process group watchdog thread "
                                  "terminated")
    assert exception_from_output(["iter 0 loss 7.0"]) is None


def test_flight_findings_from_fr_trace_output():
    # only what fr_trace printed: the harness's own list of ranks it did not dump is no finding
    found = flight_findings("Not all ranks joining collective, sequence number: 3\n"
                            "missing ranks: {13, 21}\n"
                            "error msg: Culprit rank 1; Error type: SIZE_OR_SYNTAX_MISMATCH, ..."
                            "\nError type: COLLECTIVE_DTYPE_MISMATCH")
    assert found.missing_ranks == {13, 21} and found.failure is None
    assert found.mismatches == {"size", "dtype"}
    assert flight_findings("because we missed FR dumps from ranks ({13}) so").missing_ranks == {13}
    assert flight_findings("No errors found for this collective entry, ...").failure is None
    assert flight_findings("").failure == "fr_trace printed nothing"
    assert flight_findings("loaded 4 files").failure == "fr_trace printed no finding"
    assert flight_findings("missing ranks: {13}", 1).failure == "fr_trace exited with code 1"
    assert flight_findings("missing ranks: {13}", None).failure == "fr_trace did not finish"


EXPECTATIONS = ("expect:\n"
                "  - exit_code: 134\n"
                "  - exception: {type: DistBackendError, match: 'Watchdog caught'}\n"
                "  - iteration_time: {iteration: 2, max_s: 0.2}\n"
                "  - iteration_time: {relative: 1.5, tolerance: 0.1}\n"
                "  - iteration_time: {predicted: true}\n"
                "  - flight_record: {missing_ranks: [13], mismatch: size}\n"
                "  - nan_at: {iteration: 3}\n"
                "  - digests: {1: 6d86199f}\n")


def observed(**changes):
    fields = dict(exit_code=134, exception=("c10::DistBackendError", "[Rank 0] Watchdog caught "
                                                                     "collective operation"),
                  iteration_times={1: 1.5, 2: 0.15, 3: 0.15, 4: 0.16},
                  digests={1: "6d86199fb54262f3"}, nonfinite_iteration=3,
                  flight=FlightFindings(frozenset({13}), frozenset({"size"}), ""))
    fields.update(changes)
    return Observed(**fields)


def test_every_expectation_passes_on_what_it_asks_for():
    s = scenario(EXPECTATIONS)
    assert needs_baseline(s) and needs_prediction(s)
    baseline = observed(iteration_times={1: 1.5, 2: 0.1, 3: 0.1, 4: 0.1})
    verdicts = evaluate(s, observed(), baseline, predicted_ratio=1.51)
    assert [v.line() for v in verdicts] == [
        "PASS  exit code 134: got 134",
        "PASS  exception DistBackendError matching 'Watchdog caught': got "
        "c10::DistBackendError: [Rank 0] Watchdog caught collective operation",
        "PASS  iteration 2 time in [0.0 ms, 200.0 ms]: got 150.0 ms",
        "PASS  median iteration time x1.5 ±0.1 of the baseline's: got x1.500 (150.0 vs 100.0 ms)",
        "PASS  median iteration time x1.510 (predicted) ±0.02 of the baseline's: got x1.500 "
        "(150.0 vs 100.0 ms)",
        "PASS  flight record shows missing ranks [13] and a size mismatch: got missing [13], "
        "mismatches ['size']",
        "PASS  first NaN/inf the rank sends at iteration 3: got iteration 3",
        "PASS  digests of iterations 1: equal",
    ]


def test_every_expectation_fails_with_what_was_seen_instead():
    s = scenario(EXPECTATIONS)
    seen = observed(exit_code=0, exception=None, iteration_times={1: 1.5, 2: 0.3},
                    digests={1: "00aa"}, nonfinite_iteration=None, flight=None)
    baseline = observed(iteration_times={1: 1.5})
    assert [v.line() for v in evaluate(s, seen, baseline, predicted_ratio=1.0)] == [
        "FAIL  exit code 134: got 0",
        "FAIL  exception DistBackendError matching 'Watchdog caught': the rank raised none "
        "(exit code 0)",
        "FAIL  iteration 2 time in [0.0 ms, 200.0 ms]: got 300.0 ms",
        "FAIL  median iteration time: the baseline run never finished that iteration",
        "FAIL  median iteration time: the baseline run never finished that iteration",
        "FAIL  flight record shows missing ranks [13] and a size mismatch: no flight record was "
        "dumped (no collective timed out)",
        "FAIL  first NaN/inf the rank sends at iteration 3: got none",
        "FAIL  digests of iterations 1: differ (1: 00aa)",
    ]


def test_an_exception_of_another_type_or_message_fails():
    s = scenario("expect:\n  - exception: {type: torch.distributed.DistBackendError}\n"
                 "  - exception: {type: RuntimeError}\n"
                 "  - exception: {type: DistBackendError, match: 'NaN'}\n")
    assert [v.passed for v in evaluate(s, observed())] == [False, False, False]
    python = observed(exception=("torch.distributed.DistBackendError", "x"))
    assert [v.passed for v in evaluate(s, python)] == [True, False, False]


def test_the_engine_predicts_a_straggler_stage_stretches_every_stage():
    # pipeline_graph: stage 0 computes 1 s, all-reduces (0.1 s) and sends
    # (0.1 s, paired with stage 1's receive); in steady state each stage's
    # iteration takes 1.2 s.  Stage 0 computing x1.5 makes it 1.7 s for stage
    # 1 (rank 2) too: it waits on the late sends.
    ratio = predicted_ratio(pipeline_graph(), constant_cost, 2, [parse_fault("slow 0-1 1.5")], 3)
    assert ratio == pytest.approx(1.7 / 1.2)


def test_a_prediction_looks_at_the_iterations_a_run_observes():
    # stage 0 slowed in iteration 3 only: rank 2's iterations 2-5 take 1.2,
    # 1.7, 1.2, 1.2 s; a run from the start sees the median of 2-5 (unchanged),
    # one restored after iteration 2 and run for one more sees iteration 3
    slow = [parse_fault("slow 0-1 1.5 from 3 for 1")]
    assert predicted_ratio(pipeline_graph(), constant_cost, 2, slow, 5) == pytest.approx(1.0)
    assert predicted_ratio(pipeline_graph(), constant_cost, 2, slow, 3,
                           first_iteration=3) == pytest.approx(1.7 / 1.2)
