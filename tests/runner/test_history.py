"""The --history ring's bookkeeping on its own: what it keeps, where back and
reverse-continue go, and that it never removes a snapshot a kept one needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.capture.history import History, Kept, Position
from prism_debug.errors import InvalidState


class Store:
    """The snapshots on disk, as the session's store would hold them."""

    def __init__(self, size: int, incremental: bool) -> None:
        self.history = History(size)
        self.incremental = incremental
        self.on_disk: dict[str, Kept] = {}

    def take(self, iteration: int, history: bool = True) -> Kept:
        parent = self.history.parent() if self.incremental and history else None
        kept = Kept(f"s{len(self.on_disk)}-{iteration}", iteration, parent, history)
        self.on_disk[kept.id] = kept
        self.remove(self.history.taken(kept))
        return kept

    def restore(self, kept: Kept, target: Position | None = None) -> None:
        ancestors, parent = set(), kept.parent
        while parent is not None:
            ancestors.add(parent)
            parent = self.on_disk[parent].parent
        self.remove(self.history.restored(kept, ancestors, target))

    def remove(self, ids: list[str]) -> None:
        for snapshot_id in ids:
            assert self.on_disk.pop(snapshot_id).history  # the user's are never removed

    def ring(self) -> list[int]:
        return sorted(k.iteration for k in self.on_disk.values() if k.history)


def test_the_ring_keeps_the_last_k_iterations_and_the_users_snapshots():
    store = Store(3, incremental=False)
    for iteration in range(1, 9):
        store.take(iteration, history=iteration != 2)
    assert store.ring() == [6, 7, 8]
    assert sorted(k.iteration for k in store.on_disk.values() if not k.history) == [2]
    assert store.history.oldest_reachable() == 3


def test_back_restores_the_newest_snapshot_before_the_stop():
    store = Store(3, incremental=False)
    for iteration in range(1, 8):
        store.take(iteration, history=iteration != 2)
    # paused where iteration 8 starts: snapshots 5, 6, 7 and the user's 2
    plan = store.history.back(Position(8), 2)
    assert (plan.snapshot.iteration, plan.target, plan.replayed, plan.reason) == \
        (5, Position(6), 0, "back")
    plan = store.history.back(Position(8, seq=3), 4)  # mid-iteration: from 8 all the same
    assert (plan.snapshot.iteration, plan.target, plan.replayed) == (2, Position(4), 1)
    with pytest.raises(InvalidState) as info:
        store.history.back(Position(8), 6)
    assert str(info.value) == ("cannot go back 6 iterations from iteration 8: the oldest "
                               "iteration reachable is 3 (--history 3 keeps the last 3 "
                               "iterations)")
    with pytest.raises(InvalidState, match="the history holds no snapshot yet"):
        History(3).back(Position(1), 1)


def test_going_back_drops_the_abandoned_future():
    store = Store(3, incremental=False)
    taken = [store.take(iteration) for iteration in range(1, 6)]
    store.restore(taken[2], Position(4))  # back to where 4 starts
    assert store.ring() == [3]
    assert [k.iteration for k in store.history.timeline] == [3]
    store.take(4)
    assert store.ring() == [3, 4]


def test_reverse_continue_goes_to_the_last_hit_before_the_rank():
    store = Store(4, incremental=False)
    for iteration in range(1, 6):
        store.take(iteration)
        store.history.hit({"iteration": iteration + 1, "at": "iteration", "reason": "next"})
    store.history.hit({"iteration": 3, "at": "collective", "seq": 2, "reason": "break 2"})
    store.history.hit({"iteration": 5, "at": "iteration", "seq": None, "reason": "break 1"})
    plan = store.history.reverse_continue(Position(6))
    assert (plan.snapshot.iteration, plan.target, plan.reason) == (4, Position(5),
                                                                    "reverse-continue, break 1")
    plan = store.history.reverse_continue(Position(5))
    assert (plan.snapshot.iteration, plan.target) == (2, Position(3, 2))
    with pytest.raises(InvalidState) as info:
        store.history.reverse_continue(Position(3, 2))
    assert str(info.value) == ("no breakpoint was hit before collective 2 of iteration 3 in "
                               "this run's history")
    # going back to the hit forgets the hits after it, which the rank will hit again
    store.restore(store.history.timeline[-4], Position(3, 2))
    assert [hit.position for hit in store.history.hits] == [Position(3, 2)]


def test_a_restore_from_another_timeline_starts_the_ring_again():
    store = Store(3, incremental=False)
    other = Kept("elsewhere", 10, None, False)
    store.on_disk[other.id] = other
    for iteration in range(1, 4):
        store.take(iteration)
    store.restore(other)
    assert store.ring() == [] and [k.id for k in store.history.timeline] == ["elsewhere"]
    assert store.history.back(Position(12), 1).snapshot == other


def test_an_incremental_chain_is_cut_at_k():
    store = Store(3, incremental=True)
    taken = [store.take(iteration) for iteration in range(1, 8)]
    assert [k.parent for k in taken] == [None, taken[0].id, taken[1].id, None, taken[3].id,
                                         taken[4].id, None]
    # 4 is out of the ring but stays while 5 and 6, increments on it, are in;
    # the chain 1-2-3 went whole, once none of it was needed
    assert store.ring() == [4, 5, 6, 7]
    store.take(8)
    assert store.ring() == [4, 5, 6, 7, 8]
    store.take(9)
    assert store.ring() == [7, 8, 9]


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5), incremental=st.booleans(),
       steps=st.lists(st.one_of(st.just("take"), st.just("user"),
                                st.integers(0, 20)), max_size=40))
def test_no_kept_snapshot_ever_loses_its_parent(size, incremental, steps):
    """Whatever the run does (snapshots of the ring and the user's, steps back
    to any of the timeline's), the ring never removes a parent a kept
    increment needs, keeps its last K iterations, and holds fewer than 2K."""
    store = Store(size, incremental)
    iteration = 0
    for step in steps:
        if step in ("take", "user"):
            iteration += 1
            store.take(iteration, history=step == "take")
        elif store.history.timeline:
            timeline = store.history.timeline
            kept = timeline[step % len(timeline)]
            store.restore(kept)
            iteration = kept.iteration
        for kept in store.on_disk.values():
            assert kept.parent is None or kept.parent in store.on_disk
        ring = store.ring()
        assert len(ring) <= (2 * size - 1 if incremental else size)
        timeline = store.history.timeline
        recent = sorted({k.iteration for k in timeline})[-size:]
        assert {k.iteration for k in timeline if k.iteration in recent} == set(recent)
        assert all(k.id in store.on_disk for k in timeline)
