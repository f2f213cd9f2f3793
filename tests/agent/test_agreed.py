"""A rank's side of a boundary agreed with every real rank: the boundary it
names is one it has not passed, it waits there for the decision, and what
was agreed is done there once."""

from __future__ import annotations

import threading

import pytest

from prism_debug.agent import agreed
from prism_debug.agent.agreed import AgreedBoundaries, Change
from prism_debug.errors import InvalidState


def test_the_boundary_named_is_the_iteration_in_progress_and_never_one_passed():
    in_progress = [3]
    boundaries = AgreedBoundaries(lambda: in_progress[0])
    assert boundaries.hold() == 3
    boundaries.agree(3, None)
    assert boundaries.at_boundary(3) == []
    # the tracker may still say 3 while the main thread is past its check of 3
    assert boundaries.hold() == 4
    boundaries.agree(4, None)


def test_a_held_boundary_waits_for_the_decision_and_does_what_was_agreed_there():
    boundaries = AgreedBoundaries(lambda: 5)
    assert boundaries.hold() == 5
    done: list[list[Change]] = []
    main = threading.Thread(target=lambda: done.append(boundaries.at_boundary(5)))
    main.start()
    main.join(0.3)
    assert main.is_alive() and not done  # held: no decision yet
    snapshot = Change("snapshot")
    boundaries.agree(7, snapshot)  # the latest boundary another rank held
    main.join(5)
    assert done == [[]]  # nothing due at 5: it goes on
    assert boundaries.at_boundary(6) == []
    assert boundaries.at_boundary(7) == [snapshot]
    assert boundaries.at_boundary(7) == []  # done once


def test_a_boundary_passed_cannot_be_agreed():
    boundaries = AgreedBoundaries(lambda: 2)
    boundaries.at_boundary(2)
    with pytest.raises(InvalidState, match=r"^the end of iteration 2 is passed already: the "
                                           r"rank is at iteration 3$"):
        boundaries.agree(2, Change("snapshot"))


def test_a_hold_nobody_decides_is_let_go(monkeypatch, caplog):
    monkeypatch.setattr(agreed, "HOLD_TIMEOUT_S", 0.05)
    boundaries = AgreedBoundaries(lambda: 1)
    boundaries.hold()
    assert boundaries.at_boundary(1) == []
    assert "the controller agreed on no boundary within 0 s: the rank goes on" in caplog.text
