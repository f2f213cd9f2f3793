"""Which keys a scenario file accepts where: the table did-you-mean
suggestions and "expected one of" lists come from.

A declared field is not accepted everywhere: a fault's ``at`` declares
``time_s`` yet every fault refuses it, a slow or link fault refuses
``at.collective``, a fail fault refuses ``for``, a run that restores a
snapshot refuses ``env``, ``timeout_s`` and ``hardware``, and one of a set of
exclusive keys rules the others out (a world's ``rank`` or ``ranks``, a
run's command, example or snapshot).  A key written in such a place stays
known, so its writer gets the model's reason for refusing it; but a
suggestion for a misspelt key comes only from :func:`accepted_keys`, so it
never names a key the loader then refuses there.  The rules mirror the
models' own (``faults/model.py``, ``scenario/model.py``); a test writes each
accepted key into its place and checks that nothing refuses it.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from prism_debug.checked import declared_fields
from prism_debug.faults import Action, Duration, Fault, Selector, Trigger
from prism_debug.faults.model import WHOLE_ITERATION_ACTIONS
from prism_debug.scenario.model import ExpectIterationTime, Run, World

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_RUN_CHOICES = frozenset({"command", "example", "snapshot"})
# what a restored snapshot keeps from the run it was taken in
_FIXED_BY_SNAPSHOT = frozenset({"env", "timeout_s", "hardware"})


def known_keys(cls: type[DataclassInstance]) -> list[str]:
    """Every key ``cls`` declares, in order (what is read, and refused with a reason)."""
    return [key for key, _ in declared_fields(cls)]


def accepted_keys(cls: type[DataclassInstance], present: Collection[str] = (),
                  action: Action | None = None) -> list[str]:
    """The keys of ``cls`` the loader accepts in a mapping that already holds
    the keys ``present``, inside a fault of ``action`` (None: not in a fault)."""
    present = set(present)
    drop: AbstractSet[str] = set()
    if cls is Trigger:
        drop = _trigger_refuses(present, action)
    elif cls is Duration:
        # a hang stalls for seconds; every other fault lasts whole iterations
        drop = {"iterations" if action == Action.HANG else "time_s"}
    elif issubclass(cls, Fault):
        if action == Action.FAIL:
            drop = {"for"}  # a failed rank never comes back
    elif cls is Selector:
        drop = _selector_refuses(present, action)
    elif cls is World:
        drop = _exclusive({"rank", "ranks"}, present)  # one real rank, or several
    elif cls is Run:
        drop = _run_refuses(present)
    elif cls is ExpectIterationTime:
        drop = _iteration_time_refuses(present)
    return [key for key in known_keys(cls) if key not in drop]


def _trigger_refuses(present: AbstractSet[str], action: Action | None) -> set[str]:
    """A fault's ``at``: ``collective`` only beside ``iteration``, and not in
    a fault that acts on whole iterations."""
    drop = {"time_s"}  # faults start at iterations, never at times
    if action in WHOLE_ITERATION_ACTIONS or "iteration" not in present:
        drop.add("collective")
    return drop


def _selector_refuses(present: AbstractSet[str], action: Action | None) -> set[str]:
    """A fault's ``select``: one kind (a link fault's: node or nodes), ``group``
    beside ``family``, ``seed`` beside ``fraction``."""
    kinds = set(Selector.KINDS)
    drop: set[str] = set()
    if action == Action.LINK:
        drop |= kinds - {"node", "nodes"}  # a link fault selects nodes
    drop |= _exclusive(kinds, present)
    if "family" not in present:
        drop.add("group")
    if "fraction" not in present:
        drop.add("seed")
    return drop


def _run_refuses(present: AbstractSet[str]) -> set[str]:
    """A run: one of command, example and snapshot; a snapshot keeps what it
    was taken with."""
    drop = set(_exclusive(_RUN_CHOICES, present))
    if "snapshot" in present:
        drop |= _FIXED_BY_SNAPSHOT
    return drop


def _iteration_time_refuses(present: AbstractSet[str]) -> set[str]:
    """An ``iteration_time``: a ratio (relative or predicted, with a tolerance)
    or bounds (min_s, max_s: of an iteration, or of a percentile)."""
    relative, absolute = {"relative", "predicted"}, {"min_s", "max_s"}
    drop: set[str] = set()
    if present & relative:
        drop |= absolute | (relative - present)
    if present & absolute:
        drop |= relative
    if not present & relative:
        drop.add("tolerance")
    # a percentile is over the run's iterations, within absolute bounds
    if "percentile" in present:
        drop |= relative | {"iteration", "tolerance"}
    if present & (relative | {"iteration"}):
        drop.add("percentile")
    return drop


def _exclusive(choices: AbstractSet[str], present: AbstractSet[str]) -> AbstractSet[str]:
    """The keys of a give-one-of set that one already given rules out."""
    chosen = choices & present
    return choices - chosen if chosen else set()
