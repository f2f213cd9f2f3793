"""What-if from the graph alone (``replay --perturb``, issue 15 point 8)
against timelines worked out by hand.

Every op costs COST (0.1 s); gaps are in seconds.  Faults are written as
``run --perturb`` takes them and go through ``faults.resolve`` and
``engine.injection.apply_fault``, the path of a run under ``--graph``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.engine.whatif import Blocked, what_if, what_if_lines
from prism_debug.faults import parse_fault, resolve
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, Mesh, OpSpec
from tests.engine.test_replay import (
    COST,
    constant_cost,
    end,
    issue,
    pipeline_graph,
    tp_then_dp_graph,
    wait,
)

GAP = 1.0


def one_group_graph(world: int = 4) -> ExecutionGraph:
    """One class, one all-reduce over the whole world per iteration: 1 s of
    compute, the all-reduce, 0.2 s after it.  An iteration takes 1.3 s."""
    ops = (OpSpec("all_reduce", "world", 1024),)
    events = (issue(0, GAP), wait(0), end(0.2))
    return ExecutionGraph(mesh=Mesh((world,), ("dp",)), families={"world": ("dp",)},
                          class_axis=None, programs=(ClassProgram(0, ops, (), events),),
                          gpus_per_node=8)


def whatif(graph, texts, iterations, ranks):
    injections = [(t, resolve(parse_fault(t, graph.world_size, graph.gpus_per_node),
                              graph.world_size, graph.gpus_per_node, graph)) for t in texts]
    return what_if(graph, constant_cost, injections, iterations, ranks)


@pytest.mark.parametrize("text", ["hang 2 at 2 op 1 for 0.25", "delay 2 0.25 from 2 for 1"])
def test_a_delay_of_d_on_one_rank_of_one_all_reduce_delays_the_iteration_by_d(text):
    result = whatif(one_group_graph(), [text], 3, [0, 1, 2, 3])
    # unperturbed: 1.0 + 0.1 + 0.2 = 1.3 s; rank 2 reaches iteration 2's
    # all-reduce 0.25 s late, so everyone leaves it 0.25 s late, and the
    # iteration after starts from there: 1.3 + 0.25 = 1.55 s, then 1.3 s again
    for rank in range(4):
        assert result.base[rank] == pytest.approx((1.3, 1.3, 1.3))
        assert result.times[rank] == pytest.approx((1.3, 1.55, 1.3))
        assert result.late[rank] == pytest.approx((0.0, 0.25, 0.25))
    effect = result.world[1]
    assert (effect.delayed, effect.never, effect.failed) == (4, 0, 0)
    assert effect.max_delay_s == pytest.approx(0.25) == effect.min_delay_s
    assert result.world[0].delayed == 0
    assert result.blocked == {}


@settings(max_examples=40, deadline=None)
@given(world=st.integers(2, 16), data=st.data())
def test_any_stall_of_one_rank_at_one_all_reduce_costs_every_rank_exactly_that(world, data):
    rank = data.draw(st.integers(0, world - 1))
    iteration = data.draw(st.integers(1, 3))
    stall = data.draw(st.floats(0.001, 5.0))
    result = whatif(one_group_graph(world), [f"hang {rank} at {iteration} op 1 for {stall!r}"],
                    3, list(range(world)))
    expected = [1.3] * 3
    expected[iteration - 1] += stall
    for r in range(world):
        assert result.times[r] == pytest.approx(tuple(expected), abs=1e-9)


def test_a_failed_peer_blocks_each_rank_where_a_run_would_time_out():
    # (dp=2, tp=2): rank = 2·dp + tp.  Rank 2 fails from iteration 2: rank 3
    # (its TP partner) blocks at op 1, the TP all-reduce; rank 0 (its DP
    # partner) passes its TP all-reduce with rank 1 and blocks at op 2, the DP
    # all-reduce; rank 1 blocks there too, for rank 3, which never gets there.
    result = whatif(tp_then_dp_graph(), ["fail 2 at 2"], 3, [0, 1, 3])
    tp_op, dp_op = tp_then_dp_graph().programs[0].ops
    assert result.blocked == {
        0: Blocked(0, 2, 2, dp_op, False, (2,)),
        2: Blocked(2, 2, 1, tp_op, True, ()),
        1: Blocked(1, 2, 2, dp_op, False, (3,)),
        3: Blocked(3, 2, 1, tp_op, False, (2,)),
    }
    assert [r.times for r in [result]][0][0] == (pytest.approx(2.7), math.inf, math.inf)
    assert [(e.never, e.failed) for e in result.world] == [(0, 0), (4, 1), (4, 1)]
    lines = what_if_lines(result)
    assert lines[0] == "what-if: fail 2 at 2 (hits ranks 2)"
    assert lines[1:4] == [
        "   rank    iter 1 ms    iter 2 ms    iter 3 ms",
        "      0      2700.00        never        never",
        "      Δ        +0.00        never        never"]
    assert "iteration 2: 4 rank(s) never end it (1 failed, 3 blocked)" in lines
    assert ("rank 1 blocks at op 2 of iteration 2: all_reduce of 64 bytes on dp, waiting for "
            "rank(s) 3 (blocked): a run would time out there (NCCL's watchdog, after the "
            "group's timeout)") in lines
    assert ("rank 2 never arrives at op 1 of iteration 2: all_reduce of 64 bytes on tp "
            "(the fault)") in lines


def test_a_failed_stage_blocks_its_sender_and_its_tp_partner_but_not_the_other_sender():
    # pipeline (pp=2, tp=2): stage 0 = ranks 0, 1 sends to stage 1 = ranks 2, 3
    result = whatif(pipeline_graph(), ["fail 2 at 2"], 2, [0, 1, 2, 3])
    assert {r: (b.iteration, b.op, b.spec.kind, b.failed, b.waiting_for)
            for r, b in result.blocked.items()} == {
        0: (2, 2, "send", False, (2,)),  # its send to rank 2 is never received
        2: (2, 1, "recv", True, ()),
        3: (2, 2, "all_reduce", False, (2,)),  # received from 1, then TP with 2
    }
    assert result.times[1] == pytest.approx((1.2, 1.2))  # rank 1's partner is rank 3


def test_slowing_a_rank_says_how_much_later_each_iteration_ends_across_the_world():
    # rank 0 computes twice as long in iteration 1: it ends at 5.2, ranks 1
    # and 3 at 3.7, rank 2 at 4.7 (hand-worked in test_replay.test_a_straggler_
    # delays_its_tp_group_then_its_dp_groups).  Iteration 2: TP {0,1} done
    # 6.3, TP {2,3} 5.8; DP {0,2} and {1,3} both done max(7.3, 6.8) + 0.1 =
    # 7.4; all end at 7.9 — 2.5 s after the unperturbed 5.4
    result = whatif(tp_then_dp_graph(), ["slow 0 2 for 1"], 2, [0, 3])
    assert result.times[0] == pytest.approx((5.2, 2.7))
    assert result.times[3] == pytest.approx((3.7, 4.2))
    assert result.late[3] == pytest.approx((1.0, 2.5))
    effect = result.world[0]
    assert (effect.delayed, effect.latest) == (4, 0)
    assert effect.max_delay_s == pytest.approx(2.5) and effect.min_delay_s == pytest.approx(1.0)
    assert what_if_lines(result)[-2] == ("iteration 1: 4 rank(s) end it later, by 1000.00 to "
                                         "2500.00 ms (rank 0 the most)")


def test_the_json_form_has_no_infinities():
    import json
    result = whatif(tp_then_dp_graph(), ["fail 2 at 2"], 2, [0])
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["times_s"]["0"] == [pytest.approx(2.7), None]
    assert data["blocked"]["0"] == {"iteration": 2, "op": 2, "kind": "all_reduce",
                                    "family": "dp", "nbytes": 64, "failed": False,
                                    "waiting_for": [2]}
    assert data["perturbations"] == [{"text": "fail 2 at 2", "ranks": [2]}]
    assert COST == 0.1


def test_a_value_fault_says_it_changes_no_timing():
    result = whatif(one_group_graph(), ["nan 3 at 2", "hang 2 at 2 op 1 for 0.25"], 2, [0])
    assert result.value_only == ("nan 3 at 2",)
    assert what_if_lines(result)[:2] == [
        "what-if: nan 3 at 2 (hits ranks 3): it changes values, not timing (run it to see them)",
        "what-if: hang 2 at 2 op 1 for 0.25 (hits ranks 2)"]
    assert result.times[0] == pytest.approx((1.3, 1.55))
