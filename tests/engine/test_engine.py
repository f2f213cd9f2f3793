import time

import pytest

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.engine import EmulatedClock, LockstepEngine
from prism_debug.graph import GroupRef

REF = GroupRef("tp", 0)


@pytest.fixture
def engine():
    return LockstepEngine(CostModel(load_profile("h100-ib400")), gpus_per_node=8)


def test_an_op_completes_its_cost_after_the_real_rank_arrives(engine):
    stream = engine.group(range(8), REF)
    cost = engine.cost.time_s("all_reduce", 1 << 20, Placement(8, 1, 8))
    assert engine.collective(stream, "all_reduce", 1 << 20, arrival=10.0) == 10.0 + cost


def test_ops_on_one_group_run_in_order_on_its_stream(engine):
    stream = engine.group(range(8), REF)
    cost = engine.cost.time_s("all_reduce", 1 << 30, Placement(8, 1, 8))
    first = engine.collective(stream, "all_reduce", 1 << 30, arrival=0.0)
    second = engine.collective(stream, "all_reduce", 1 << 30, arrival=0.0)
    assert second == pytest.approx(first + cost)


def test_different_groups_and_peers_overlap(engine):
    a, b = engine.group(range(8), REF), engine.group(range(8, 16), GroupRef("tp", 1))
    assert engine.collective(a, "all_reduce", 1 << 30, 0.0) == engine.collective(
        b, "all_reduce", 1 << 30, 0.0)
    world = engine.group(range(16), GroupRef("world", 0))
    to_next = engine.peer_stream(world, 0, 8)
    to_prev = engine.peer_stream(world, 0, 15)
    assert engine.collective(to_next, "send", 1 << 20, 0.0) == engine.collective(
        to_prev, "recv", 1 << 20, 0.0)


def test_the_clock_excludes_harness_time():
    clock = EmulatedClock()
    before = clock.now()
    wall = time.perf_counter()
    time.sleep(0.02)
    clock.exclude_since(wall)
    assert clock.now() - before < 0.005
    assert clock.excluded_s >= 0.02


def test_wait_until_reaches_the_deadline_and_reports_the_wait():
    clock = EmulatedClock()
    deadline = clock.now() + 0.01
    waited = clock.wait_until(deadline)
    assert clock.now() >= deadline
    assert waited >= 0.0099
    assert clock.wait_until(deadline) == 0.0
