"""A fault: what happens to which virtual peers, from when, for how long.

One typed, frozen value from where it is written — a scenario file, ``run
--perturb``, the console's ``perturb`` — to where it acts: the replay engine
(timing) and the backend (values, the flight record).  ``to_dict`` gives the
scenario file's form of it (what the agent's configuration and the bus
carry) and :func:`fault_from_dict` reads it back.  Pure Python.

Iterations count from 1, like optimizer steps; ``at.collective`` counts the
selected ranks' collectives within the iteration from 1 (for the real rank's
data-parallel peers, the real rank's count).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prism_debug.checked import (
    Checked,
    FieldErrors,
    at_least,
    declare,
    from_mapping,
    non_negative,
    not_empty,
    one_of,
    positive,
    to_mapping,
    unit_interval,
)
from prism_debug.errors import ConfigError
from prism_debug.graph.selectors import node_spans, rank_spans


class Action(enum.StrEnum):
    DELAY = "delay"
    SLOW = "slow"
    LINK = "link"
    FAIL = "fail"
    HANG = "hang"
    NAN = "nan"
    INF = "inf"
    CORRUPT = "corrupt"
    DESYNC = "desync"


class DesyncKind(enum.StrEnum):
    """How a collective disagrees across ranks (a desync fault, a flight-record mismatch)."""

    SIZE = "size"
    DTYPE = "dtype"
    OP = "op"
    SKIP = "skip"


#: actions that change what the real rank receives (the backend applies them)
VALUE_ACTIONS = frozenset({Action.NAN, Action.INF, Action.CORRUPT})
#: actions after which the peers never arrive (the flight record tells them apart)
MISSING_ACTIONS = frozenset({Action.FAIL, Action.HANG, Action.DESYNC})
#: why a fault's ``at`` refuses ``time_s`` (only a hang's stall is a time)
TIME_TRIGGER_REFUSED = ("faults start at an iteration (and a collective in it); time_s "
                        "triggers are not supported")
#: actions whose window is whole iterations (the others may start at a collective):
#: a compute factor and a link's state hold for an iteration in the engine
WHOLE_ITERATION_ACTIONS = frozenset({Action.SLOW, Action.LINK})


@dataclass(frozen=True, kw_only=True)
class Selector(Checked):
    """Which ranks a fault hits: exactly one of ranks, node, nodes, family (with
    group), class, fraction.  ``seed`` draws a fraction (same seed, same ranks)."""

    ranks_text: str | None = declare("text", key="ranks", default=None, check=not_empty)
    node: int | None = declare("int", default=None, check=at_least(0))
    nodes: str | None = declare("text", default=None, check=not_empty)  # "3,4", "0-7"
    family: str | None = declare("text", default=None, check=not_empty)
    group: int | None = declare("int", default=None, check=at_least(0))  # index in the family
    class_: int | None = declare("int", key="class", default=None, check=at_least(0))
    fraction: float | None = declare("float", default=None, check=unit_interval)
    seed: str | None = declare("text", default=None, check=not_empty)

    KINDS: ClassVar[dict[str, str]] = {
        "ranks": "ranks_text", "node": "node", "nodes": "nodes", "family": "family",
        "class": "class_", "fraction": "fraction"}

    @property
    def kind(self) -> str:
        """The YAML key that chose the ranks (``ranks``, ``node``, ... ``fraction``)."""
        return next(key for key, attr in self.KINDS.items() if getattr(self, attr) is not None)

    @property
    def selects_nodes(self) -> bool:
        return self.node is not None or self.nodes is not None

    @property
    def node_text(self) -> str:
        """The nodes selected, as a node list (``3``, ``0-7``)."""
        return str(self.node) if self.nodes is None else self.nodes

    def word(self) -> str:
        """The selector as one RANKS word of the perturbation grammar."""
        if self.ranks_text is not None:
            words = self.ranks_text.split()
            if len(words) == 2 and words[0] == "node":  # "node 3": the ranks on node 3
                return f"node:{words[1]}"
            return "".join(words)
        if self.selects_nodes:
            return f"node:{self.node_text}"
        if self.family is not None:
            return f"family:{self.family}:{self.group}"
        if self.class_ is not None:
            return f"class:{self.class_}"
        return f"fraction:{self.fraction:g}" + (f":{self.seed}" if self.seed else "")

    def problem(self, world_size: int, gpus_per_node: int) -> str | None:
        """What is wrong with this selector in a world of ``world_size`` ranks,
        or None; cheap for any world (nothing is expanded).  Family and class
        selectors need a graph: None."""
        if world_size < 1 or gpus_per_node < 1:
            return f"no ranks in a world of {world_size} ({gpus_per_node} per node)"
        try:
            if self.ranks_text is not None:
                rank_spans(self.ranks_text, world_size, gpus_per_node)
            elif self.selects_nodes:
                node_spans(self.node_text, -(-world_size // gpus_per_node))
        except ConfigError as exc:
            return str(exc)
        return None

    def _rules(self) -> FieldErrors:
        if all(getattr(self, attr) is None for attr in self.KINDS.values()):
            # (a selector does not know its fault: say which kinds a link takes)
            yield (), f"give one of {', '.join(self.KINDS)} (a link fault: node or nodes)"
        else:
            yield from one_of(self, self.KINDS, ", ".join(self.KINDS))
        if self.family is not None and self.group is None:
            yield (), "family needs group: the group's index in the family"
        if self.group is not None and self.family is None:
            yield ("group",), "group goes with family"
        if self.seed is not None and self.fraction is None:
            yield ("seed",), "seed goes with fraction"


@dataclass(frozen=True, kw_only=True)
class Trigger(Checked):
    """When a fault starts: at an iteration (optionally its K-th collective) or
    at a time on the emulated clock."""

    iteration: int | None = declare("int", default=None, check=at_least(1))
    collective: int | None = declare("int", default=None, check=at_least(1))
    time_s: float | None = declare("float", default=None, check=non_negative)

    def _rules(self) -> FieldErrors:
        # time_s is read so that writing it gets the fault's reason for
        # refusing it (Fault._rules), but it is never what to give
        if self.iteration is None and self.time_s is None:
            yield (), "give iteration: the iteration it starts at, counting from 1"
        if self.collective is not None and self.iteration is None:
            yield ("collective",), "collective counts within an iteration: give iteration too"


@dataclass(frozen=True, kw_only=True)
class Duration(Checked):
    iterations: int | None = declare("int", default=None, check=at_least(1))
    time_s: float | None = declare("float", default=None, check=positive)

    def _rules(self) -> FieldErrors:
        if self.iterations is None and self.time_s is None:
            # which one a fault takes depends on its action (a hang's is time_s)
            yield (), ("give iterations (how many it lasts) or, for a hang, time_s (the "
                       "seconds it stalls)")
        else:
            yield from one_of(self, {"iterations": "iterations", "time_s": "time_s"},
                              "iterations, time_s")


@dataclass(frozen=True, kw_only=True)
class Intermittent(Checked):
    """A link degraded for ``duty`` of every ``period_s``."""

    period_s: float = declare("float", check=positive)
    duty: float = declare("float", check=unit_interval)


@dataclass(frozen=True, kw_only=True)
class Fault(Checked):
    """One fault: the subclass says what, ``select`` to whom, ``at`` from when,
    ``duration`` (YAML ``for``) how long (None: to the end)."""

    action: ClassVar[Action]
    select: Selector = declare("object", of=Selector)
    at: Trigger = declare("object", of=Trigger, default=Trigger(iteration=1))
    duration: Duration | None = declare("object", of=Duration, key="for", default=None)
    line: int = field(default=0, compare=False)  # where a file defines it, for reports

    @property
    def family(self) -> str | None:
        """The one family whose collectives it acts on; None: every family.
        Faults that can keep to one declare a ``family`` field, which stands in
        for this property (a field here would fix the key's place in every
        subclass, and a file's keys are listed in order)."""
        return None

    # -- the window -------------------------------------------------------------------

    @property
    def first_iteration(self) -> int:
        return self.at.iteration or 1

    @property
    def collective(self) -> int | None:
        """``at.collective``: from the K-th collective (from 1) of the first iteration."""
        return self.at.collective

    @property
    def first_op(self) -> int:
        """The first collective, counted from 0 as the engine counts ops."""
        return 0 if self.at.collective is None else self.at.collective - 1

    @property
    def iterations(self) -> float:
        """How many iterations it lasts (inf: to the end; a hang's stall is ``stall_s``)."""
        return self.duration.iterations if self.duration and self.duration.iterations \
            else math.inf

    @property
    def last_iteration(self) -> float:
        return self.first_iteration + self.iterations - 1

    @property
    def stall_s(self) -> float | None:
        """A hang's stall: how long the ranks stop before going on (None: for good)."""
        return self.duration.time_s if self.duration is not None else None

    def covers(self, iteration: int, collective: int) -> bool:
        """Whether it acts at the ``collective``-th collective (from 1) of ``iteration``."""
        return ((iteration, collective) >= (self.first_iteration, self.first_op + 1)
                and iteration <= self.last_iteration)

    # -- forms ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fault as a scenario file writes it (``action`` first)."""
        return {"action": str(self.action), **to_mapping(self)}

    def _rules(self) -> FieldErrors:
        # The replay engine counts iterations and collectives, not seconds:
        # only a hang's stall is a time.
        if self.at.time_s is not None:
            yield ("at", "time_s"), TIME_TRIGGER_REFUSED
        if self.at.collective is not None and self.action in WHOLE_ITERATION_ACTIONS:
            yield ("at", "collective"), (f"a {self.action} fault acts on whole iterations: "
                                         "remove collective (the other actions may start at "
                                         "a collective)")
        if self.duration is not None:
            if self.action == Action.HANG and self.duration.iterations is not None:
                yield ("for", "iterations"), ("a hang stalls for time_s seconds, or lasts "
                                              "for good without for")
            elif self.action != Action.HANG and self.duration.time_s is not None:
                yield ("for", "time_s"), (f"a {self.action} fault lasts whole iterations: "
                                          "for: {iterations: N} (time_s is a hang's stall)")


@dataclass(frozen=True, kw_only=True)
class DelayFault(Fault):
    action = Action.DELAY
    seconds: float = declare("float", check=positive)
    family: str | None = declare("text", default=None, check=not_empty)


@dataclass(frozen=True, kw_only=True)
class SlowFault(Fault):
    action = Action.SLOW
    factor: float = declare("float", check=positive)


@dataclass(frozen=True, kw_only=True)
class LinkFault(Fault):
    action = Action.LINK
    bandwidth_factor: float | None = declare("float", default=None, check=positive)
    latency_us: float | None = declare("float", default=None, check=non_negative)
    intermittent: Intermittent | None = declare("object", of=Intermittent, default=None)

    def _rules(self) -> FieldErrors:
        yield from super()._rules()
        if self.bandwidth_factor is None and self.latency_us is None:
            yield (), "a link fault needs bandwidth_factor, latency_us or both"
        if not self.select.selects_nodes:
            yield ("select",), "a link fault selects nodes (their network links): use node or nodes"


@dataclass(frozen=True, kw_only=True)
class FailFault(Fault):
    action = Action.FAIL

    def _rules(self) -> FieldErrors:
        if self.at.time_s is not None:
            yield from super()._rules()
        if self.duration is not None:
            yield ("for",), "a failed rank does not come back: remove for (hang with for resumes)"


@dataclass(frozen=True, kw_only=True)
class HangFault(Fault):
    action = Action.HANG


@dataclass(frozen=True, kw_only=True)
class NanFault(Fault):
    action = Action.NAN
    family: str | None = declare("text", default=None, check=not_empty)


@dataclass(frozen=True, kw_only=True)
class InfFault(Fault):
    action = Action.INF
    family: str | None = declare("text", default=None, check=not_empty)


@dataclass(frozen=True, kw_only=True)
class CorruptFault(Fault):
    action = Action.CORRUPT
    scale: float = declare("float", check=lambda v: None if math.isfinite(v) and v != 1
                           else f"must be a finite number other than 1, got {v}")
    family: str | None = declare("text", default=None, check=not_empty)


@dataclass(frozen=True, kw_only=True)
class DesyncFault(Fault):
    action = Action.DESYNC
    kind: DesyncKind = declare("enum", of=DesyncKind)
    family: str | None = declare("text", default=None, check=not_empty)


FAULT_TYPES: dict[Action, type[Fault]] = {cls.action: cls for cls in (
    DelayFault, SlowFault, LinkFault, FailFault, HangFault, NanFault, InfFault, CorruptFault,
    DesyncFault)}


def fault_from_dict(data: Any) -> Fault:
    """A fault from its :meth:`Fault.to_dict` form (what a bus message or the
    agent's configuration carries); :class:`ConfigError` saying what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"a fault is a mapping with an action, got {type(data).__name__}")
    action = data.get("action")
    if action is None or action not in Action._value2member_map_:
        raise ConfigError(f"unknown fault action {action!r}: use one of {', '.join(Action)}")
    cls = FAULT_TYPES[Action(action)]
    return from_mapping(cls, {k: v for k, v in data.items() if k != "action"}, str(action))
