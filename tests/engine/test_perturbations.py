"""Perturbations as typed, what they ask of the replay engine, and their
effect on timelines worked out by hand (see test_replay's graphs)."""

from __future__ import annotations

import math

import pytest

from prism_debug.engine.perturbations import (
    Perturbation, Selectors, parse_perturbation, rank_text, select,
)
from prism_debug.engine.replay import ReplayEngine
from prism_debug.errors import ConfigError
from tests.engine.test_replay import constant_cost, pipeline_graph, tp_then_dp_graph


class Engine:
    """Records the calls a perturbation makes."""

    def __init__(self) -> None:
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, *args, *sorted(kwargs.items())))
            return name
        return call


@pytest.mark.parametrize("text, call", [
    ("slow node:1 1.16 from 3 for 2",
     ("slow", tuple(range(8, 16)), 1.16, ("first_iteration", 3), ("iterations", 2))),
    ("slow 4-5 2", ("slow", (4, 5), 2.0, ("first_iteration", 1), ("iterations", math.inf))),
    ("delay 7 0.005 family dp from 2",
     ("delay", (7,), 0.005, ("family", "dp"), ("first_iteration", 2), ("iterations", math.inf))),
    ("fail 13 at 3", ("fail", (13,), ("at_iteration", 3), ("at_op", 0), ("family", None))),
    ("fail 1,3 op 2", ("fail", (1, 3), ("at_iteration", 1), ("at_op", 1), ("family", None))),
    ("hang 9 at 2 op 3", ("fail", (9,), ("at_iteration", 2), ("at_op", 2), ("family", None))),
    ("hang 9 at 2 op 3 for 0.25",
     ("delay", (9,), 0.25, ("first_iteration", 2), ("first_op", 2), ("iterations", 1),
      ("ops", 1))),
    ("desync 9 size family dp at 4",
     ("fail", (9,), ("at_iteration", 4), ("at_op", 0), ("family", "dp"))),
    ("link 2,3 0.5 20",
     ("link", (2, 3), ("added_latency_s", pytest.approx(20e-6)), ("bandwidth_factor", 0.5),
      ("duty", 1.0), ("first_iteration", 1), ("iterations", math.inf), ("period_s", None))),
    ("link 2 0.25 from 2 flap 0.5 0.2",
     ("link", (2,), ("added_latency_s", 0.0), ("bandwidth_factor", 0.25), ("duty", 0.2),
      ("first_iteration", 2), ("iterations", math.inf), ("period_s", 0.5))),
])
def test_each_perturbation_reaches_the_engine(text, call):
    engine = Engine()
    parse_perturbation(text, 64, 8).apply(engine)
    assert engine.calls == [call]


def test_value_perturbations_leave_timing_alone_and_keep_their_window():
    engine = Engine()
    nan = parse_perturbation("nan 6 family tp at 3 op 2 for 2", 64, 8)
    assert nan.apply(engine) is None and engine.calls == []
    assert (nan.family, nan.first_iteration, nan.collective, nan.iterations) == ("tp", 3, 2, 2)
    assert [nan.covers(i, k) for i, k in [(3, 1), (3, 2), (4, 1), (5, 1)]] == \
        [False, True, True, False]
    corrupt = parse_perturbation("corrupt 6 -2.5", 64, 8)
    assert corrupt.value == -2.5 and corrupt.covers(1, 1)


@pytest.mark.parametrize("text, message", [
    ("stall 3", "unknown perturbation 'stall 3': use one of slow RANKS FACTOR [from I] "
                "[for N]; delay RANKS SECONDS [family F] [from I] [for N]; link NODES "
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
                      "[from I] [for N]; delay RANKS SECONDS [family F] [from I] [for N]; link "
                      "NODES BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S "
                      "DUTY]; fail RANKS [at I] [op K]; hang RANKS [at I] [op K] [for SECONDS]; "
                      "nan RANKS [family F] [at I] [op K] [for N]; inf RANKS [family F] [at I] "
                      "[op K] [for N]; corrupt RANKS SCALE [family F] [at I] [op K] [for N]; "
                      "desync RANKS size|dtype|op|skip [family F] [at I] [op K]"),
    ("fail family:dp:0", "family:dp:0: selecting a family's group needs the job's execution "
                         "graph: run with --graph"),
    ("fail class:x", "class:x: write class:C, a rank class's number (class:2)"),
    ("fail fraction:2", "fraction:2: give a share of the world in (0, 1]"),
])
def test_a_bad_perturbation_says_what_is_expected(text, message):
    with pytest.raises(ConfigError) as info:
        parse_perturbation(text, 64, 8)
    assert str(info.value) == message


def test_selectors_by_family_group_class_and_seeded_fraction():
    graph = pipeline_graph()  # (pp=2, tp=2): classes are the stages
    selectors = Selectors.of_graph(graph)
    assert select("family:tp:1", 4, 8, selectors) == [2, 3]
    assert select("family:pp:0", 4, 8, selectors) == [0, 2]
    assert select("class:1", 4, 8, selectors) == [2, 3]
    with pytest.raises(ConfigError, match="family:tp:2: family tp has groups 0-1, not 2"):
        select("family:tp:2", 4, 8, selectors)
    with pytest.raises(ConfigError, match="class:5: class 5 does not exist"):
        select("class:5", 4, 8, selectors)
    drawn = select("fraction:0.01:7", 8192, 8)
    assert len(drawn) == 82 and drawn == select("fraction:0.01:7", 8192, 8)
    assert drawn != select("fraction:0.01:8", 8192, 8)
    assert rank_text([9, 1, 2, 3, 7]) == "1-3,7,9"


# ----------------------------------------------------------------- numeric effects
# tp_then_dp_graph: (dp=2, tp=2), 1 s, TP all-reduce, 1 s, DP all-reduce, 0.5 s;
# every op costs 0.1 s, so an unperturbed iteration takes 2.7 s.

def engine_with(text, graph=None, world=4, gpus_per_node=4):
    engine = ReplayEngine(graph or tp_then_dp_graph(gpus_per_node), constant_cost)
    handle = parse_perturbation(text, world, gpus_per_node).apply(engine)
    return engine, handle


@pytest.mark.parametrize("text, tp_done", [("hang 0 op 2", 1.1), ("hang 0 op 1", math.inf),
                                            ("desync 0 size family dp", 1.1),
                                            ("desync 0 size family tp", math.inf)])
def test_a_hang_from_the_second_collective_spares_the_first(text, tp_done):
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=1)  # TP {0, 1}, DP {1, 3}
    parse_perturbation(text, 4, 4).apply(engine)
    tp = engine.real_issue(graph.programs[0].ops[0], arrival=1.0)
    assert engine.real_completion(tp) == pytest.approx(tp_done)


def test_a_stall_delays_one_collective_once():
    engine, _ = engine_with("hang 0 at 2 op 2 for 0.25")
    engine.run(3)
    # iteration 2: rank 0 reaches the DP all-reduce 0.25 s late; its DP group
    # {0, 2} ends 0.25 s later, the other DP group is untouched ...
    assert engine.iteration_times(0) == pytest.approx([2.7, 2.95, 2.7])
    assert engine.iteration_times(2) == pytest.approx([2.7, 2.95, 2.7])
    # ... until iteration 3's TP all-reduces pair ranks 1 and 3 with the late ones
    assert engine.iteration_times(1) == pytest.approx([2.7, 2.7, 2.95])


def test_removing_a_slowdown_restores_the_pace_from_then_on():
    engine, handle = engine_with("slow 0 2")
    engine.run(1)
    assert engine.iteration_times(0) == pytest.approx([5.2])
    engine.remove(handle)
    engine.run(2)
    assert engine.iteration_times(0) == pytest.approx([5.2, 2.7])
    with pytest.raises(ValueError, match="no such perturbation"):
        engine.remove(handle)


def test_clear_takes_back_every_perturbation():
    engine, _ = engine_with("delay 3 0.5")
    parse_perturbation("link 0 0.5", 4, 2).apply(engine)
    engine.clear()
    engine.run(2)
    assert engine.iteration_times(3) == pytest.approx([2.7, 2.7])
    assert engine.describe(3)["perturbations"] == []


def test_a_link_degraded_for_some_iterations_only():
    # two nodes of 2: DP groups {0, 2} and {1, 3} span them, TP groups do not
    engine, _ = engine_with("link 0 0.5 from 2 for 1", gpus_per_node=2)
    engine.run(3)
    # iteration 2's DP all-reduce costs 0.2 s instead of 0.1
    assert engine.iteration_times(0) == pytest.approx([2.7, 2.8, 2.7])


def test_a_flapping_link_is_degraded_only_within_its_duty():
    # degraded during the first 0.5 s of every 2.7 s: iteration k's DP
    # all-reduce starts at 2.7(k-1) + 2.1, outside it, so nothing changes;
    # with a period of 2.7 and a duty of 0.9 it starts inside
    engine, _ = engine_with("link 0 0.5 flap 2.7 0.5", gpus_per_node=2)
    engine.run(2)
    assert engine.iteration_times(0) == pytest.approx([2.7, 2.7])
    engine, _ = engine_with("link 0 0.5 flap 2.7 0.9", gpus_per_node=2)
    engine.run(1)
    assert engine.iteration_times(0) == pytest.approx([2.8])


def test_describe_lists_hangs_and_flapping_links():
    engine, _ = engine_with("hang 0 at 2 op 2", gpus_per_node=2)
    parse_perturbation("link 0 0.5 flap 1 0.5", 4, 2).apply(engine)
    assert engine.describe(0)["perturbations"] == [
        "never arrives from iteration 2 (op 2 on)",
        "link x0.5 bandwidth +0 us for 0.5 of every 1 s"]


def test_summary_names_the_ranks():
    p = parse_perturbation("slow 0-5 2", 64, 8)
    assert p.summary() == "slow 0-5 2  (6 ranks: 0,1,2,3,…)"
    assert isinstance(p, Perturbation)
