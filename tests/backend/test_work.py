import math
import types

import torch

from prism_debug.backend.work import FutureCompleter, PrismWork
from prism_debug.engine import EmulatedClock


def test_futures_complete_at_their_time_and_close_joins_the_thread():
    clock = EmulatedClock()
    blocked = []
    completer = FutureCompleter(clock, lambda done, waiting: blocked.append(waiting))
    soon, never = torch.futures.Future(), torch.futures.Future()
    completer.complete_at(soon, clock.now() + 0.01, ["soon"])
    completer.complete_at(never, clock.now() + 3600, ["never"])
    assert soon.wait() == ["soon"]
    assert blocked == [True]  # the main thread was blocked in soon.wait()
    completer.close()
    assert not completer._thread.is_alive()
    assert not never.done()


def test_an_op_already_complete_resolves_its_future_at_once():
    clock = EmulatedClock()
    completer = FutureCompleter(clock, lambda done, waiting: None)
    future = torch.futures.Future()
    completer.complete_at(future, clock.now() - 1, [1])
    assert future.done() and completer._thread is None


def test_a_completion_not_known_yet_is_asked_again():
    # the graph engine answers inf until the peers' side of the op is known
    answers = iter([math.inf, 5.0])
    runtime = types.SimpleNamespace(clock=EmulatedClock())
    work = PrismWork(runtime, lambda: next(answers), [])
    assert work.done == math.inf
    assert work.done == 5.0
    assert work.done == 5.0  # known now: kept
