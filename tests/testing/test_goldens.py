"""Goldens compared: digests and collectives bit for bit, times within the
golden's own tolerance, and a mismatch said as the first difference."""

from __future__ import annotations

import copy
import json

from hypothesis import given
from hypothesis import strategies as st

from prism_debug.testing.goldens import NO_GOLDEN, PrismGoldenExtension, first_difference

GOLDEN = {
    "exit_code": 0, "exception": None, "flight_record": None, "time_rtol": 0.2,
    "iterations": [
        {"iteration": 4, "digest": "aa" * 16, "time_s": 0.5,
         "collectives": ["all_reduce tp[0] 262144 B 1111", "send pp[5] 262144 B 2222"]},
        {"iteration": 5, "digest": "bb" * 16, "time_s": 0.5,
         "collectives": ["all_reduce tp[0] 262144 B 3333"]},
    ],
}


def changed(edit) -> dict:
    got = copy.deepcopy(GOLDEN)
    edit(got)
    return got


def test_the_first_collective_whose_digest_differs_is_named_with_what_the_golden_had():
    def edit(got):
        got["iterations"][0]["collectives"][1] = "send pp[5] 262144 B 9999"
        got["iterations"][0]["digest"] = "cc" * 16
        got["iterations"][1]["digest"] = "dd" * 16
    assert first_difference(changed(edit), GOLDEN) == (
        "iteration 4, collective #2: digest differs: send pp[5] 262144 B 9999; the golden had "
        "send pp[5] 262144 B 2222 (iteration digest cccccccccccccccc, golden aaaaaaaaaaaaaaaa)")


def test_another_op_a_missing_op_and_a_late_digest_are_each_said_so():
    def op(got):
        got["iterations"][1]["collectives"][0] = "all_gather tp[0] 262144 B 3333"
    assert first_difference(changed(op), GOLDEN).startswith(
        "iteration 5, collective #1: op differs: all_gather tp[0] 262144 B 3333; the golden had "
        "all_reduce tp[0] 262144 B 3333")
    assert first_difference(changed(lambda got: got["iterations"][0]["collectives"].pop()),
                            GOLDEN) == ("iteration 4: 1 collectives, the golden had 2; "
                                        "collective #2 send pp[5] 262144 B 2222: this run did "
                                        "not issue it")

    def late(got):
        got["iterations"][1]["digest"] = "ee" * 16
    assert first_difference(changed(late), GOLDEN) == (
        f"iteration 5: digest {'ee' * 16}; the golden had {'bb' * 16} (every collective "
        "agrees: the values changed after the last one)")


def test_times_are_held_to_the_goldens_tolerance_not_the_runs():
    within = changed(lambda got: got["iterations"][0].update(time_s=0.59, ) or
                     got.update(time_rtol=0.0))
    assert first_difference(within, GOLDEN) is None  # 18 % off, the golden allows 20 %
    outside = changed(lambda got: got["iterations"][1].update(time_s=0.61))
    assert first_difference(outside, GOLDEN) == (
        "iteration 5: time 0.61 s is outside ±20% of the golden's 0.5 s")


def test_how_it_ended_comes_first_and_exception_numbers_of_three_digits_are_not_compared():
    def died(got):
        got["exit_code"] = 134
        got["iterations"][0]["digest"] = "ff" * 16
    assert first_difference(changed(died), GOLDEN) == "exit code 134; the golden had 0"
    golden = changed(lambda g: g.update(exception=["DistBackendError", "SeqNum=3 ran for 2003 ms"]))
    same = changed(lambda g: g.update(exception=["DistBackendError", "SeqNum=3 ran for 2011 ms"]))
    other = changed(lambda g: g.update(exception=["DistBackendError", "SeqNum=4 ran for 2003 ms"]))
    assert first_difference(same, golden) is None
    assert first_difference(other, golden) == (
        'exception ["DistBackendError", "SeqNum=4 ran for 2003 ms"]; the golden had '
        '["DistBackendError", "SeqNum=3 ran for 2003 ms"]')


def test_fewer_iterations_than_the_golden_are_a_difference():
    assert first_difference(changed(lambda got: got["iterations"].pop()), GOLDEN) == (
        "1 iterations (4); the golden had 2 (4, 5)")


@given(st.integers(0, 1), st.integers(0, 1), st.sampled_from("0123456789abcdef"))
def test_any_changed_digest_is_found_and_an_equal_result_matches(iteration, which, char):
    assert first_difference(copy.deepcopy(GOLDEN), GOLDEN) is None
    got = copy.deepcopy(GOLDEN)
    ops = got["iterations"][iteration]["collectives"]
    which = min(which, len(ops) - 1)
    line = ops[which]
    ops[which] = line[:-1] + (char if char != line[-1] else "x")
    found = first_difference(got, GOLDEN)
    assert found is not None and found.startswith(
        f"iteration {4 + iteration}, collective #{which + 1}: digest differs")


def test_the_extension_writes_reviewable_json_and_tells_how_to_make_a_missing_golden():
    extension = PrismGoldenExtension()
    text = extension.serialize(GOLDEN)
    assert json.loads(text) == GOLDEN and text.endswith("\n")
    assert '    "send pp[5] 262144 B 2222"\n' in text  # one collective a line
    assert not extension.matches(serialized_data=text, snapshot_data=None)
    assert list(extension.diff_lines(text, None)) == [NO_GOLDEN]
    assert extension.matches(serialized_data=text, snapshot_data=text)
