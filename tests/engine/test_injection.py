"""Faults as typed, what they ask of the replay engine, and their effect on
timelines worked out by hand (see test_replay's graphs)."""

from __future__ import annotations

import math

import pytest

from prism_debug.engine.injection import apply_fault
from prism_debug.engine.replay import ReplayEngine
from prism_debug.faults import parse_fault, resolve
from tests.engine.test_replay import constant_cost, tp_then_dp_graph


class Engine:
    """Records the calls a fault makes."""

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
     ("delay", (7,), 0.005, ("family", "dp"), ("first_iteration", 2), ("first_op", 0),
      ("iterations", math.inf))),
    ("delay 7 0.005 from 2 op 3 for 2",
     ("delay", (7,), 0.005, ("family", None), ("first_iteration", 2), ("first_op", 2),
      ("iterations", 2))),
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
def test_each_fault_reaches_the_engine(text, call):
    engine = Engine()
    apply_fault(engine, inject(text, 64, 8))
    assert engine.calls == [call]


def test_value_faults_leave_timing_alone_and_keep_their_window():
    engine = Engine()
    nan = parse_fault("nan 6 family tp at 3 op 2 for 2", 64, 8)
    assert apply_fault(engine, resolve(nan, 64, 8)) is None and engine.calls == []
    assert (nan.family, nan.first_iteration, nan.collective, nan.iterations) == ("tp", 3, 2, 2)
    assert [nan.covers(i, k) for i, k in [(3, 1), (3, 2), (4, 1), (5, 1)]] == \
        [False, True, True, False]
    corrupt = parse_fault("corrupt 6 -2.5", 64, 8)
    assert corrupt.scale == -2.5 and corrupt.covers(1, 1)


def inject(text, world, gpus_per_node, graph=None):
    """A typed fault, resolved in a world (and graph)."""
    return resolve(parse_fault(text, world, gpus_per_node), world, gpus_per_node, graph)


# ----------------------------------------------------------------- numeric effects
# tp_then_dp_graph: (dp=2, tp=2), 1 s, TP all-reduce, 1 s, DP all-reduce, 0.5 s;
# every op costs 0.1 s, so an unperturbed iteration takes 2.7 s.

def engine_with(text, graph=None, world=4, gpus_per_node=4):
    engine = ReplayEngine(graph or tp_then_dp_graph(gpus_per_node), constant_cost)
    handle = apply_fault(engine, inject(text, world, gpus_per_node))
    return engine, handle


@pytest.mark.parametrize("text, tp_done", [("hang 0 op 2", 1.1), ("hang 0 op 1", math.inf),
                                            ("desync 0 size family dp", 1.1),
                                            ("desync 0 size family tp", math.inf)])
def test_a_hang_from_the_second_collective_spares_the_first(text, tp_done):
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=1)  # TP {0, 1}, DP {1, 3}
    apply_fault(engine, inject(text, 4, 4))
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


def test_a_delay_from_a_collective_spares_the_ones_before():
    engine, _ = engine_with("delay 0 0.25 from 2 op 2 for 1")
    engine.run(3)
    # iteration 2: rank 0 reaches its second collective, the DP all-reduce,
    # 0.25 s late (its TP all-reduce, op 1, on time), as the stall above
    assert engine.iteration_times(0) == pytest.approx([2.7, 2.95, 2.7])
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
    apply_fault(engine, inject("link 0 0.5", 4, 2))
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
    apply_fault(engine, inject("link 0 0.5 flap 1 0.5", 4, 2))
    assert engine.describe(0)["perturbations"] == [
        "never arrives from iteration 2 (op 2 on)",
        "link x0.5 bandwidth +0 us for 0.5 of every 1 s"]

