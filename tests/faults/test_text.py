"""The fault grammar people type: every action read into its typed value,
every mistake named with the usage, and lines and dicts that round-trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism_debug.errors import ConfigError
from prism_debug.faults import (
    USAGE,
    USAGE_TEXT,
    Action,
    DelayFault,
    DesyncKind,
    Duration,
    FailFault,
    HangFault,
    Intermittent,
    LinkFault,
    NanFault,
    Selector,
    SlowFault,
    Trigger,
    fault_from_dict,
    fault_text,
    parse_fault,
)


@pytest.mark.parametrize("text, fault", [
    ("slow node:1 1.16 from 3 for 2",
     SlowFault(select=Selector(node=1), factor=1.16, at=Trigger(iteration=3),
               duration=Duration(iterations=2))),
    ("delay 7 0.005 family dp from 2",
     DelayFault(select=Selector(ranks_text="7"), seconds=0.005, family="dp",
                at=Trigger(iteration=2))),
    ("fail 1,3 op 2", FailFault(select=Selector(ranks_text="1,3"),
                                at=Trigger(iteration=1, collective=2))),
    ("hang 9 at 2 op 3 for 0.25",
     HangFault(select=Selector(ranks_text="9"), at=Trigger(iteration=2, collective=3),
               duration=Duration(time_s=0.25))),
    ("link 2 0.25 from 2 flap 0.5 0.2",
     LinkFault(select=Selector(node=2), bandwidth_factor=0.25, at=Trigger(iteration=2),
               intermittent=Intermittent(period_s=0.5, duty=0.2))),
    ("nan fraction:0.1:7/2 family tp",
     NanFault(select=Selector(fraction=0.1, seed="7/2"), family="tp")),
])
def test_a_line_reads_as_its_typed_fault(text, fault):
    assert parse_fault(text, 64, 8) == fault


def test_the_window_of_a_fault():
    hang = parse_fault("hang 9 at 2 op 3 for 0.25")
    assert (hang.first_iteration, hang.first_op, hang.iterations, hang.stall_s) == \
        (2, 2, math.inf, 0.25)
    slow = parse_fault("slow 9 2 from 3 for 2")
    assert (slow.first_iteration, slow.last_iteration, slow.stall_s) == (3, 4, None)
    assert [slow.covers(i, 1) for i in (2, 3, 4, 5)] == [False, True, True, False]
    assert parse_fault("desync 9 op family dp").kind == DesyncKind.OP  # a kind, not a keyword


@pytest.mark.parametrize("text, message", [
    ("stall 3", "unknown perturbation 'stall 3': use one of slow RANKS FACTOR [from I] "
                "[for N]; delay RANKS SECONDS [family F] [from I] [op K] [for N]; link NODES "
                "BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]; fail "
                "RANKS [at I] [op K]; hang RANKS [at I] [op K] [for SECONDS]; nan RANKS "
                "[family F] [at I] [op K] [for N]; inf RANKS [family F] [at I] [op K] [for "
                "N]; corrupt RANKS SCALE [family F] [at I] [op K] [for N]; desync RANKS "
                "size|dtype|op|skip [family F] [at I] [op K]"),
    ("fail", "fail needs ranks: fail RANKS [at I] [op K]"),
    ("fail 64", "rank 64 is outside the world of 64 ranks"),
    ("slow 3", "slow takes a value after the ranks: slow RANKS FACTOR [from I] [for N]"),
    ("fail 3 2", "fail takes no value after the ranks: fail RANKS [at I] [op K]"),
    ("slow 3 0", "slow: 0 must be positive: slow RANKS FACTOR [from I] [for N]"),
    ("slow 3 fast", "'fast' is not a number: slow RANKS FACTOR [from I] [for N]"),
    ("fail 3 at soon", "from takes a whole number >= 1, got 'soon': fail RANKS [at I] [op K]"),
    ("fail 3 op 0", "op takes a whole number >= 1, got '0': fail RANKS [at I] [op K]"),
    ("fail 3 for 2", "fail does not take for: fail RANKS [at I] [op K]"),
    ("hang 3 for -1", "hang: for takes seconds > 0: hang RANKS [at I] [op K] [for SECONDS]"),
    ("corrupt 3 1", "corrupt: the scale must be a finite number other than 1, got 1: corrupt "
                    "RANKS SCALE [family F] [at I] [op K] [for N]"),
    ("desync 3 shape", "desync 'shape': the kind is one of size, dtype, op, skip: desync RANKS "
                       "size|dtype|op|skip [family F] [at I] [op K]"),
    ("link 8 0.5", "node 8 is outside the world: nodes are 0-7"),
    ("link 2 0.5 flap 0 1", "link: flap takes a period > 0 s and a duty in (0, 1]: link NODES "
                            "BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]"),
    ("nan 3 at 2 at 3", "at is given twice: nan RANKS [family F] [at I] [op K] [for N]"),
    ("nan 3 family", "family needs a value: nan RANKS [family F] [at I] [op K] [for N]"),
    ("family:dp:0 x", "unknown perturbation 'family:dp:0 x': use one of slow RANKS FACTOR "
                      "[from I] [for N]; delay RANKS SECONDS [family F] [from I] [op K] [for N]; "
                      "link NODES BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S "
                      "DUTY]; fail RANKS [at I] [op K]; hang RANKS [at I] [op K] [for SECONDS]; "
                      "nan RANKS [family F] [at I] [op K] [for N]; inf RANKS [family F] [at I] "
                      "[op K] [for N]; corrupt RANKS SCALE [family F] [at I] [op K] [for N]; "
                      "desync RANKS size|dtype|op|skip [family F] [at I] [op K]"),
    ("fail class:x", "class:x: write class:C, a rank class's number (class:2)"),
    ("fail fraction:2", "fraction:2: give a share of the world in (0, 1]"),
])
def test_a_bad_line_says_what_is_expected(text, message):
    with pytest.raises(ConfigError) as info:
        parse_fault(text, 64, 8)
    assert str(info.value) == message




def test_family_and_class_words_are_checked_when_read():
    with pytest.raises(ConfigError, match=r"^family:dp: write family:FAMILY:GROUP"):
        parse_fault("fail family:dp")
    # family, class and fraction selectors need the graph or a draw: checked when resolved
    assert parse_fault("fail family:dp:99", 64, 8).select == Selector(family="dp", group=99)


def test_the_usage_text_is_one_line_per_action():
    assert USAGE_TEXT.splitlines() == list(USAGE.values())
    assert sorted(USAGE) == sorted(Action)


# -- round trips ------------------------------------------------------------------------

_RANKS = st.sampled_from(["0", "3-5", "1,7", "node:2", "node:1-2", "family:dp:3", "class:1",
                          "fraction:0.25", "fraction:0.5:9"])
_COUNT = st.integers(1, 50).map(str)
_WINDOW = st.tuples(st.one_of(st.none(), _COUNT), st.one_of(st.none(), _COUNT))


@st.composite
def lines(draw) -> str:
    action = draw(st.sampled_from(sorted(USAGE)))
    start, op = draw(_WINDOW)
    words = [action]
    if action == "link":
        words += [draw(st.sampled_from(["0", "1-2", "3,5"])),
                  draw(st.sampled_from(["0.5", "2", "0.125"]))]
        if draw(st.booleans()):
            words.append(draw(st.sampled_from(["0", "20", "1.5"])))
    else:
        words.append(draw(_RANKS))
        value = {"slow": ["1.16", "2"], "delay": ["0.005", "1"], "corrupt": ["-2.5", "3"],
                 "desync": ["size", "dtype", "op", "skip"]}.get(action)
        if value:
            words.append(draw(st.sampled_from(value)))
    if "family" in USAGE[action] and draw(st.booleans()):
        words += ["family", draw(st.sampled_from(["dp", "tp"]))]
    if start is not None:
        words += ["from", start]
    if op is not None and "op K" in USAGE[action]:
        words += ["op", op]
    if "[for" in USAGE[action] and draw(st.booleans()):
        words += ["for", "0.5" if action == "hang" else draw(_COUNT)]
    if action == "link" and draw(st.booleans()):
        words += ["flap", "0.5", "0.25"]
    return " ".join(words)


@given(lines())
def test_a_fault_written_back_reads_as_the_same_fault(text):
    fault = parse_fault(text)
    assert parse_fault(fault_text(fault)) == fault
    assert fault_from_dict(fault.to_dict()) == fault


def test_the_dict_form_is_the_scenario_files():
    fault = parse_fault("hang 8-11 at 2 op 4 for 0.5")
    assert fault.to_dict() == {"action": "hang", "select": {"ranks": "8-11"},
                               "at": {"iteration": 2, "collective": 4}, "for": {"time_s": 0.5}}


@pytest.mark.parametrize("data, message", [
    ("fail", "a fault is a mapping with an action, got str"),
    ({"action": "explode"}, "unknown fault action 'explode': use one of delay, slow, link, "
                            "fail, hang, nan, inf, corrupt, desync"),
    ({"action": "slow", "select": {"ranks": "1"}}, "slow: missing required key 'factor'"),
    ({"action": "slow", "select": {"ranks": "1"}, "factor": "2"},
     "slow.factor: expected float, got '2'"),
    ({"action": "slow", "select": {"ranks": "1"}, "factor": 2, "colour": "red"},
     "slow: unknown key 'colour': use select, at, for, factor"),
    ({"action": "slow", "select": {"ranks": "1", "node": 2}, "factor": 2},
     "slow.select: Selector: node: give one of ranks, node, nodes, family, class, fraction, "
     "not both ranks and node"),
    ({"action": "fail", "select": {"ranks": "1"}, "for": {"iterations": 2}},
     "fail: FailFault: for: a failed rank does not come back: remove for (hang with for "
     "resumes)"),
])
def test_a_damaged_dict_is_refused_with_what_is_wrong(data, message):
    with pytest.raises(ConfigError) as info:
        fault_from_dict(data)
    assert str(info.value) == message
