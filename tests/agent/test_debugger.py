"""The debugger's rules on their own: breakpoints, stepping, pausing with
the emulated clock stopped, work handed to the paused main thread."""

from __future__ import annotations

import threading
import time

import pytest

from prism_debug.agent.debugger import Debugger, DebuggerError
from prism_debug.engine import EmulatedClock


class Rank:
    """A debugger with its events and watch state recorded, and a main
    thread to pause."""

    def __init__(self) -> None:
        self.clock = EmulatedClock()
        self.events: list[tuple[str, dict]] = []
        self.watching = False
        self.debugger = Debugger(self.clock, lambda kind, data: self.events.append((kind, data)),
                                 self._watch)

    def _watch(self, on: bool) -> None:
        self.watching = on

    def in_thread(self, work) -> threading.Thread:
        thread = threading.Thread(target=work)
        thread.start()
        return thread

    def wait_paused(self) -> dict:
        deadline = time.monotonic() + 10
        while self.debugger.paused_at is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        return self.debugger.paused_at


def test_an_unwatched_rank_pays_nothing_per_collective():
    rank = Rank()
    rank.debugger.add_break("iter", iteration=3)
    assert rank.watching is False  # iteration breakpoints need no collective hook
    bp = rank.debugger.add_break("coll", op="allreduce", family="dp")
    assert rank.watching is True
    rank.debugger.delete(bp.id)
    assert rank.watching is False


def test_a_breakpoint_pauses_at_its_iteration_and_continue_resumes():
    rank = Rank()
    bp = rank.debugger.add_break("iter", iteration=2)
    assert rank.debugger.at_iteration_start(1) == 0.0
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(2))
    where = rank.wait_paused()
    assert where == {"iteration": 2, "at": "iteration", "op": None, "family": None,
                     "index": None, "seq": None, "reason": f"break {bp.id}", "number": 1}
    rank.debugger.resume(None)
    thread.join(5)
    assert not thread.is_alive()
    assert [kind for kind, _ in rank.events] == ["paused", "resumed"]
    assert rank.debugger.breakpoints()[0].hits == 1


def test_step_stops_at_the_next_collective_and_next_at_the_next_iteration():
    rank = Rank()
    rank.debugger.pause()
    thread = rank.in_thread(lambda: rank.debugger.at_collective("all_reduce", "tp", 3, 1, 64))
    assert rank.wait_paused()["reason"] == "pause"
    rank.debugger.resume("step")
    thread.join(5)
    thread = rank.in_thread(lambda: rank.debugger.at_collective("all_gather", "dp", 0, 2, 64))
    where = rank.wait_paused()
    assert (where["op"], where["family"], where["seq"], where["reason"]) == \
        ("all_gather", "dp", 2, "step")
    rank.debugger.resume("next")
    thread.join(5)
    assert rank.debugger.at_collective("all_reduce", "tp", 3, 3, 64) == 0.0  # next skips it
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(2))
    assert rank.wait_paused()["reason"] == "next"
    rank.debugger.resume(None)
    thread.join(5)


def test_collective_breakpoints_match_op_family_and_sequence():
    rank = Rank()
    rank.debugger.add_break("coll", op="allreduce", family="dp", seq=2, temporary=True)
    assert rank.debugger.at_collective("all_reduce", "tp", 0, 2, 8) == 0.0
    assert rank.debugger.at_collective("all_reduce", "dp", 0, 1, 8) == 0.0
    thread = rank.in_thread(lambda: rank.debugger.at_collective("all_reduce", "dp", 0, 2, 8))
    assert rank.wait_paused()["reason"] == "break 1"
    assert rank.debugger.breakpoints() == []  # temporary: gone once hit
    rank.debugger.resume(None)
    thread.join(5)


def test_the_emulated_clock_stands_still_while_paused():
    rank = Rank()
    rank.debugger.add_break("iter", iteration=1)
    paused_for: list[float] = []
    thread = rank.in_thread(lambda: paused_for.append(rank.debugger.at_iteration_start(1)))
    rank.wait_paused()
    frozen = rank.clock.now()
    time.sleep(0.2)
    assert rank.clock.now() == frozen
    rank.debugger.resume(None)
    thread.join(5)
    assert paused_for[0] >= 0.2
    assert rank.clock.now() - frozen < 0.05  # the pause never reached the clock


def test_work_handed_to_the_paused_rank_runs_on_its_thread():
    rank = Rank()
    rank.debugger.pause()
    ran_on: list[str] = []
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(4))
    rank.wait_paused()
    rank.debugger.run_paused(lambda: ran_on.append(threading.current_thread().name))
    rank.debugger.resume(None)
    thread.join(5)
    assert ran_on == [thread.name]


def test_release_lets_a_paused_rank_go_and_forgets_breakpoints():
    rank = Rank()
    rank.debugger.add_break("iter", iteration=1)
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(1))
    rank.wait_paused()
    rank.debugger.release()
    thread.join(5)
    assert not thread.is_alive() and rank.debugger.breakpoints() == []


def test_commands_that_need_a_paused_rank_say_so():
    rank = Rank()
    with pytest.raises(DebuggerError, match="^the rank is running$"):
        rank.debugger.run_paused(lambda: None)
    with pytest.raises(DebuggerError, match=r"^no breakpoint 7 \(info breaks lists them\)$"):
        rank.debugger.delete(7)


def test_run_to_passes_breakpoints_and_stops_where_it_was_asked():
    # a copy restored to step back replays to its stop and nowhere else
    rank = Rank()
    rank.debugger.add_break("iter", iteration=3)
    rank.debugger.add_break("coll", op="allreduce")
    assert rank.debugger.run_to(4, 2, "back") == 0
    assert rank.watching is True  # the stop is a collective: they are reported
    assert rank.debugger.at_iteration_start(3) == 0.0  # break 1 passed
    assert rank.debugger.at_collective("all_reduce", "dp", 0, 1, 8) == 0.0  # break 2 passed
    assert rank.debugger.at_iteration_start(4) == 0.0
    assert rank.debugger.at_collective("all_reduce", "dp", 0, 1, 8) == 0.0
    thread = rank.in_thread(lambda: rank.debugger.at_collective("all_reduce", "dp", 0, 2, 8))
    assert rank.wait_paused() == {"iteration": 4, "at": "collective", "op": "all_reduce",
                                  "family": "dp", "index": 0, "seq": 2, "reason": "back",
                                  "number": 1}
    assert [bp.hits for bp in rank.debugger.breakpoints()] == [0, 0]
    rank.debugger.resume(None)
    thread.join(5)
    # the stop reached, breakpoints act again
    thread = rank.in_thread(lambda: rank.debugger.at_collective("all_reduce", "dp", 0, 3, 8))
    assert rank.wait_paused()["reason"] == "break 2"
    rank.debugger.resume(None)
    thread.join(5)


def test_run_to_where_the_rank_is_paused_announces_that_pause_anew():
    rank = Rank()
    rank.debugger.pause_again("restore")  # a restored copy: paused where its snapshot was
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(4))
    assert rank.wait_paused()["reason"] == "restore"
    assert rank.debugger.run_to(4, None, "back") == 1
    assert rank.debugger.paused_at["reason"] == "back"
    assert rank.events[-1] == ("paused", {**rank.debugger.paused_at, "number": 2})
    with pytest.raises(DebuggerError, match="past iteration 3 already"):
        rank.debugger.run_to(3, None, "back")
    rank.debugger.resume(None)
    thread.join(5)


def test_run_to_before_the_restore_pause_replaces_it():
    # the controller's run_to may arrive before the restored copy pauses
    rank = Rank()
    rank.debugger.pause_again("restore")
    assert rank.debugger.run_to(5, None, "reverse-continue, break 1") == 0
    assert rank.debugger.at_iteration_start(4) == 0.0
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(5))
    assert rank.wait_paused()["reason"] == "reverse-continue, break 1"
    rank.debugger.resume(None)
    thread.join(5)


def test_a_pause_during_a_replay_ends_it():
    rank = Rank()
    rank.debugger.run_to(9, None, "back")
    rank.debugger.pause()
    thread = rank.in_thread(lambda: rank.debugger.at_iteration_start(4))
    assert rank.wait_paused()["reason"] == "pause"
    rank.debugger.resume(None)
    thread.join(5)
    assert rank.debugger.at_iteration_start(9) == 0.0  # the replay's stop is forgotten


def test_a_restored_copy_takes_the_breakpoints_the_rank_had():
    rank = Rank()
    rank.debugger.add_break("iter", iteration=2)  # the snapshot's time
    table = [{"id": 1, "kind": "iter", "iteration": 2, "hits": 1, "description": "iteration 2"},
             {"id": 4, "kind": "coll", "op": "allreduce", "family": "dp", "seq": None,
              "temporary": True, "hits": 0}]
    rank.debugger.set_breakpoints(table)
    assert [(bp.id, bp.kind, bp.hits, bp.temporary) for bp in rank.debugger.breakpoints()] == \
        [(1, "iter", 1, False), (4, "coll", 0, True)]
    assert rank.watching is True
    assert rank.debugger.add_break("iter", iteration=9).id == 5  # numbers go on from there
    with pytest.raises(ValueError, match="needs an id >= 1 and a kind"):
        rank.debugger.set_breakpoints([{"id": "1", "kind": "iter"}])
