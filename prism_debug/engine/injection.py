"""Faults in force on the replay engine: each fault action as the engine's
timing primitives (slow, delay, fail, link).  Pure core.

Value faults (nan, inf, corrupt) change no timing: the backend applies them to
what the real rank receives, so they ask nothing of the engine here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from prism_debug.faults import (
    MISSING_ACTIONS,
    Action,
    DelayFault,
    Injection,
    LinkFault,
    SlowFault,
)


class TimingPrimitives(Protocol):
    """What faults ask of the replay engine (``ReplayEngine`` serves it)."""

    def slow(self, ranks: Iterable[int], factor: float, *, first_iteration: int = 1,
             iterations: float = ...) -> object: ...

    def delay(self, ranks: Iterable[int], seconds: float, *, family: str | None = None,
              first_iteration: int = 1, iterations: float = ..., first_op: int = 0,
              ops: float = ...) -> object: ...

    def fail(self, ranks: Iterable[int], *, at_iteration: int = 1, at_op: int = 0,
             family: str | None = None) -> object: ...

    def link(self, nodes: Collection[int], *, bandwidth_factor: float = 1.0,
             added_latency_s: float = 0.0, first_iteration: int = 1, iterations: float = ...,
             period_s: float | None = None, duty: float = 1.0) -> object: ...


def apply_fault(engine: TimingPrimitives, injection: Injection) -> object | None:
    """Put ``injection`` in force on ``engine``: the handle ``engine.remove``
    takes back, or None for a fault that changes values only."""
    fault, targets = injection.fault, injection.targets
    action = fault.action
    # (each action is one fault class: the isinstance checks tell its fields)
    if isinstance(fault, SlowFault):
        return engine.slow(targets, fault.factor, first_iteration=fault.first_iteration,
                           iterations=fault.iterations)
    if isinstance(fault, DelayFault):
        return engine.delay(targets, fault.seconds, family=fault.family,
                            first_iteration=fault.first_iteration, iterations=fault.iterations,
                            first_op=fault.first_op)
    if isinstance(fault, LinkFault):
        intermittent = fault.intermittent
        return engine.link(
            targets, bandwidth_factor=1.0 if fault.bandwidth_factor is None
            else fault.bandwidth_factor, added_latency_s=(fault.latency_us or 0.0) * 1e-6,
            first_iteration=fault.first_iteration, iterations=fault.iterations,
            period_s=intermittent.period_s if intermittent else None,
            duty=intermittent.duty if intermittent else 1.0)
    if action == Action.HANG and fault.stall_s is not None:
        return engine.delay(targets, fault.stall_s, first_iteration=fault.first_iteration,
                            iterations=1, first_op=fault.first_op, ops=1)
    if action in MISSING_ACTIONS:
        return engine.fail(targets, at_iteration=fault.first_iteration, at_op=fault.first_op,
                           family=fault.family if action == Action.DESYNC else None)
    return None
