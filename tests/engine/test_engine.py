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
    start = clock.now()
    deadline = start + 0.01
    waited = clock.wait_until(deadline)
    end = clock.now()
    assert end >= deadline
    # the wait is reported from the call to the deadline, within what passes
    # between reading the clock and the call (up to a millisecond on a busy
    # machine: 175 µs was seen beside a full test suite)
    assert 0.009 <= waited <= end - start
    assert clock.wait_until(deadline) == 0.0


def test_a_send_then_a_recv_with_one_peer_run_in_order_on_the_pairs_stream(engine):
    world = engine.group(range(16), GroupRef("world", 0))
    pair = engine.peer_stream(world, 0, 8)
    cost = engine.cost.time_s("send", 1 << 20, Placement.pair(0, 8, 8))
    assert engine.collective(pair, "send", 1 << 20, 0.0) == pytest.approx(cost)
    assert engine.collective(pair, "recv", 1 << 20, 0.0) == pytest.approx(2 * cost)


def test_a_batch_runs_its_ops_together_and_each_completes_with_the_batch(engine):
    world = engine.group(range(16), GroupRef("world", 0))
    to_next, to_prev = engine.peer_stream(world, 0, 8), engine.peer_stream(world, 0, 15)
    small = engine.cost.time_s("send", 1 << 10, Placement.pair(0, 8, 8))
    large = engine.cost.time_s("recv", 1 << 20, Placement.pair(0, 8, 8))
    send = engine.collective(to_next, "send", 1 << 10, 1.0, batch=1)
    recv = engine.collective(to_next, "recv", 1 << 20, 1.0, batch=1)
    assert send() == recv() == pytest.approx(1.0 + max(small, large))
    # the next batch, to another peer, runs after it on the group's communicator
    later = engine.collective(to_prev, "send", 1 << 10, 1.0, batch=2)
    assert later() == pytest.approx(1.0 + max(small, large) + small)
    # a lone op on a pair's stream does not wait for batches
    assert engine.collective(to_prev, "recv", 1 << 10, 1.0) == pytest.approx(1.0 + small)


def test_a_batch_launches_when_its_last_op_is_issued(engine):
    """NCCL launches a group at its end: an op issued after the first one's
    cost has passed cannot have ended before it began (the replay engine's
    rule too; a trace once showed a recv 15 µs long negative)."""
    world = engine.group(range(16), GroupRef("world", 0))
    to_next = engine.peer_stream(world, 0, 8)
    small = engine.cost.time_s("send", 1 << 10, Placement.pair(0, 8, 8))
    send = engine.collective(to_next, "send", 1 << 10, 1.0, batch=1)
    recv = engine.collective(to_next, "recv", 1 << 10, 1.0 + 10 * small, batch=1)
    assert send() == recv() == pytest.approx(1.0 + 11 * small)
    # the next batch waits for this one's launched end
    later = engine.collective(to_next, "send", 1 << 10, 1.0, batch=2)
    assert later() == pytest.approx(1.0 + 12 * small)
