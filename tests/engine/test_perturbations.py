"""Perturbations as typed, and what they ask of the replay engine."""

from __future__ import annotations

import math

import pytest

from prism_debug.engine.perturbations import parse_perturbation
from prism_debug.errors import ConfigError


class Engine:
    def __init__(self) -> None:
        self.calls = []

    def slow(self, ranks, factor, *, first_iteration, iterations):
        self.calls.append(("slow", ranks, factor, first_iteration, iterations))

    def delay(self, ranks, seconds, *, family, first_iteration, iterations):
        self.calls.append(("delay", ranks, seconds, family, first_iteration, iterations))

    def fail(self, ranks, *, at_iteration):
        self.calls.append(("fail", ranks, at_iteration))

    def link(self, nodes, *, bandwidth_factor, added_latency_s):
        self.calls.append(("link", nodes, bandwidth_factor, added_latency_s))


@pytest.mark.parametrize("text, call", [
    ("slow node:1 1.16 from 3 for 2", ("slow", tuple(range(8, 16)), 1.16, 3, 2)),
    ("slow 4-5 2", ("slow", (4, 5), 2.0, 1, math.inf)),
    ("delay 7 0.005 family dp from 2", ("delay", (7,), 0.005, "dp", 2, math.inf)),
    ("fail 13 at 3", ("fail", (13,), 3)),
    ("fail 1,3", ("fail", (1, 3), 1)),
    ("link 2,3 0.5 20", ("link", (2, 3), 0.5, pytest.approx(20e-6))),
])
def test_each_perturbation_reaches_the_engine(text, call):
    engine = Engine()
    parse_perturbation(text, 64, 8).apply(engine)
    assert engine.calls == [call]


@pytest.mark.parametrize("text, message", [
    ("stall 3", "unknown perturbation 'stall 3': use one of slow RANKS FACTOR [from ITERATION] "
                "[for ITERATIONS]; delay RANKS SECONDS [family FAMILY] [from ITERATION] [for "
                "ITERATIONS]; fail RANKS [at ITERATION]; link NODES BANDWIDTH_FACTOR "
                "[ADDED_LATENCY_US]"),
    ("fail", "fail needs ranks: fail RANKS [at ITERATION]"),
    ("fail 64", "rank 64 is outside the world of 64 ranks"),
    ("slow 3", "slow needs a value: slow RANKS FACTOR [from ITERATION] [for ITERATIONS]"),
    ("slow 3 0", "slow: 0 must be positive: slow RANKS FACTOR [from ITERATION] [for "
                 "ITERATIONS]"),
    ("slow 3 fast", "'fast' is not a number: slow RANKS FACTOR [from ITERATION] [for "
                    "ITERATIONS]"),
    ("fail 3 at soon", "at takes an iteration number, got 'soon': fail RANKS [at ITERATION]"),
    ("fail 3 from 2", "fail does not take from: fail RANKS [at ITERATION]"),
    ("link 8 0.5", "node 8 is outside the world: nodes are 0-7"),
])
def test_a_bad_perturbation_says_what_is_expected(text, message):
    with pytest.raises(ConfigError) as info:
        parse_perturbation(text, 64, 8)
    assert str(info.value) == message
